#!/usr/bin/env bash
# Session 38, call 1: probes only (tests in call 2, for whatever wins).
# (a) session 37's opt-in knobs: CUFOLD_AXIS_RETILE=every (A[::2] argmax), CUFOLD_REDUCE_LOAD=l2_128|l2_256;
# (b) the scans' new ids variant "overlap" (tile = blockIdx.x; the epoch's draw issued before the tile's
#     loads, settled after them: the draw's round trip off the block's critical path), and the flat
#     single-pass kernel bounded to 2048 threads an SM for every ids (int64/float64 39 -> 32 registers).
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
probe() { echo "== $1" >> $P; shift; env "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
S=$OUT/scan.txt; : > $S
sprobe() { echo "== $1" >> $S; shift; env "$@" >> $S 2>&1; echo "rc=$?" >> $S; }
# scans first (the new variant), every default case + 2^28
for v in ticket overlap; do
  sprobe "float32 $v" CUFOLD_SCAN_VARIANT=$v timeout 75 python3 tools/scan_probe.py 4096x4096,1 1048576x16,0 16x1048576,1 16777216,0 268435456,0
done
probe "default" timeout 60 python3 tools/runs_probe.py
probe "CUFOLD_AXIS_RETILE=every" CUFOLD_AXIS_RETILE=every timeout 40 python3 tools/runs_probe.py argmax
for h in l2_128 l2_256; do
  probe "CUFOLD_REDUCE_LOAD=$h" CUFOLD_REDUCE_LOAD=$h timeout 50 python3 tools/runs_probe.py sum max mean
done
for h in plain l2_256; do probe "read ceiling, CUFOLD_REDUCE_LOAD=$h" CUFOLD_REDUCE_LOAD=$h timeout 60 python3 tools/read_ceiling.py; done
for v in ticket overlap; do
  sprobe "int32->int64 $v" CUFOLD_SCAN_VARIANT=$v timeout 60 python3 tools/scan_probe.py --dtype int32 --out-dtype int64 16777216,0 268435456,0
  sprobe "float64 $v" CUFOLD_SCAN_VARIANT=$v timeout 60 python3 tools/scan_probe.py --dtype float64 16777216,0 16x1048576,1
done
sprobe "int32->int64 ticket bounded 2048" CUFOLD_SINGLE_PASS_THREADS=2048 timeout 60 python3 tools/scan_probe.py --dtype int32 --out-dtype int64 16777216,0 268435456,0
sprobe "float64 ticket bounded 2048" CUFOLD_SINGLE_PASS_THREADS=2048 timeout 60 python3 tools/scan_probe.py --dtype float64 16777216,0
cat $S
cat $P
