#!/usr/bin/env bash
# For the next GPU run (session 37's review: two opt-in knobs, default off, unmeasured; the
# default kernels' PTX is unchanged, tools/ptx_check.py's 480 kernels):
#   CUFOLD_AXIS_RETILE=every: A[::2]'s argmax through the retiled runs at 4 blocks an SM (now the
#     rising runs at 3: 39.1 us, its contiguous copy 37.4, A.T's retiled argmax at the copy's pace);
#   CUFOLD_REDUCE_LOAD=l2_128|l2_256: the device reduce's 8-byte loads asking L2 for 128/256-byte
#     DRAM fetches (A[::2]'s sums DRAM-bound at 74-76% of peak, 0.84-0.88 of the floor; y's 48 MiB).
# Then the reduce/axis tests + sanitizers with both knobs on, so either can land as a default.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
probe() { echo "== $1" >> $P; shift; env "$@" >> $P 2>&1; }
probe "default" timeout 60 python3 tools/runs_probe.py
probe "CUFOLD_AXIS_RETILE=every" CUFOLD_AXIS_RETILE=every timeout 40 python3 tools/runs_probe.py argmax
for h in l2_128 l2_256; do
  probe "CUFOLD_REDUCE_LOAD=$h" CUFOLD_REDUCE_LOAD=$h timeout 50 python3 tools/runs_probe.py sum max mean
done
for h in plain l2_256; do probe "read ceiling, CUFOLD_REDUCE_LOAD=$h" CUFOLD_REDUCE_LOAD=$h timeout 60 python3 tools/read_ceiling.py; done
cat $P
mkdir -p $OUT/check
CUFOLD_AXIS_RETILE=every CUFOLD_REDUCE_LOAD=l2_256 OUT=$OUT/check PART=files \
  FILES="tests/test_axis.py tests/test_device_reduce.py" WORKERS=14 TEST_TIMEOUT=170 bash tools/gpu_check.sh > $OUT/check/check.txt 2>&1
tail -8 $OUT/check/check.txt
