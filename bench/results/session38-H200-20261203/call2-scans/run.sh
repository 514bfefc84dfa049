#!/usr/bin/env bash
# Session 38, call 2: call 1's float32 scans again (its 2^28 case failed the probe's exact check:
# float32 sums past 2^24 round), and l2_128 on the read ceiling.
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
S=$OUT/scan.txt; : > $S
sprobe() { echo "== $1" >> $S; shift; env "$@" >> $S 2>&1; echo "rc=$?" >> $S; }
for v in ticket overlap ticket overlap; do
  sprobe "float32 $v" CUFOLD_SCAN_VARIANT=$v timeout 60 python3 tools/scan_probe.py 4096x4096,1 1048576x16,0 16x1048576,1 16777216,0
done
sprobe "int32 ticket" CUFOLD_SCAN_VARIANT=ticket timeout 40 python3 tools/scan_probe.py --dtype int32 --out-dtype int32 16777216,0 16x1048576,1
sprobe "int32 overlap" CUFOLD_SCAN_VARIANT=overlap timeout 40 python3 tools/scan_probe.py --dtype int32 --out-dtype int32 16777216,0 16x1048576,1
sprobe "int32->int64 overlap unbounded" CUFOLD_SCAN_VARIANT=overlap CUFOLD_SINGLE_PASS_THREADS=0 timeout 40 python3 tools/scan_probe.py --dtype int32 --out-dtype int64 16777216,0
echo "== read ceiling l2_128" >> $S; CUFOLD_REDUCE_LOAD=l2_128 timeout 60 python3 tools/read_ceiling.py >> $S 2>&1
cat $S
