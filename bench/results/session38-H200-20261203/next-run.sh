#!/usr/bin/env bash
# For the next GPU run (session 38 left, not run on a GPU): the overlap ids (tile = blockIdx.x, the
# epoch's draw settled after the loads) where auto still takes tickets, forced by
# CUFOLD_SCAN_VARIANT=overlap: the narrow columns (4 columns or fewer; named only since session 38),
# wide states (float64 +4% in session 38 call 1; tuples unmeasured), pair states (int32 -> int64 lost
# 7%), the 1-D affine scan (pair32). Then the axis scan tests and sanitizers under overlap, so that
# auto can take it where it wins.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
S=$OUT/scan.txt; : > $S
sprobe() { echo "== $1" >> $S; shift; env "$@" >> $S 2>&1; echo "rc=$?" >> $S; }
for v in default overlap; do
  sprobe "float32 narrow $v" CUFOLD_SCAN_VARIANT=$v timeout 40 python3 tools/scan_probe.py 4194304x4,0 8388608x2,0 5592405x3,0
  sprobe "float64 $v" CUFOLD_SCAN_VARIANT=$v timeout 40 python3 tools/scan_probe.py --dtype float64 16777216,0 16x1048576,1 4194304x4,0
  sprobe "affine $v" CUFOLD_SCAN_VARIANT=$v timeout 40 python3 tools/scan_probe.py affine:16x4194304,1 affine:4096x2048,1
done
sprobe "float32 narrow overlap, bounded to 1024 threads an SM (64 registers)" CUFOLD_SCAN_VARIANT=overlap \
  CUFOLD_NARROW_OVERLAP_THREADS=1024 timeout 40 python3 tools/scan_probe.py 4194304x4,0 8388608x2,0 5592405x3,0
# (16, 2^20) axis 0, the columns kernel at 85% of the clone (36 of 64 warps an SM, session 32's ncu):
# bounded to 6 blocks of 256 (ptxas: 48 -> 40 registers, no spills; 2048 threads spill)
for t in 0 1536; do
  sprobe "float32 columns CUFOLD_COLUMN_THREADS=$t" CUFOLD_COLUMN_THREADS=$t timeout 40 python3 tools/scan_probe.py 16x1048576,0 64x262144,0 4096x4096,0
done
cat $S
mkdir -p $OUT/check
CUFOLD_SCAN_VARIANT=overlap OUT=$OUT/check PART=files FILES="tests/test_scan_axis.py tests/test_device_scan.py" \
  WORKERS=14 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check/check.txt 2>&1
tail -7 $OUT/check/check.txt
