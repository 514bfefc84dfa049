#!/usr/bin/env bash
# Session 35 call 2: the device reduce over runs (7a3af26, #24) against the rows kernel
# (tools/runs_probe.py, CUFOLD_AXIS_RUNS=0/1); the scan knobs call 1 pointed at, again
# (narrow tile 8x32 for 8-byte accumulators: int32 -> int64 untimed; COLUMN_UNROLL 16);
# then the reduce/axis tests + sanitizers at the defaults, and the scan tests + sanitizers
# with CUFOLD_NARROW_TILE=8x32 CUFOLD_COLUMN_UNROLL=16 (the settings a change would land).
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
probe() { echo "== $1" >> $P; shift; env "$@" >> $P 2>&1; }
probe "runs (default)" timeout 60 python3 tools/runs_probe.py
probe "rows kernel (CUFOLD_AXIS_RUNS=0)" CUFOLD_AXIS_RUNS=0 timeout 60 python3 tools/runs_probe.py
for t in 4x32 8x32; do
  probe "int32->int64 narrow $t" CUFOLD_NARROW_TILE=$t timeout 40 python3 tools/scan_probe.py --dtype int32 4194304x4,0 8388608x2,0
  probe "float64 narrow $t" CUFOLD_NARROW_TILE=$t timeout 40 python3 tools/scan_probe.py --dtype float64 4194304x4,0 8388608x2,0
done
for u in 8 16; do probe "column unroll $u" CUFOLD_COLUMN_UNROLL=$u timeout 40 python3 tools/scan_probe.py 16x1048576,0 4096x4096,0; done
cat $P
mkdir -p $OUT/a $OUT/b
OUT=$OUT/a PART=files FILES="tests/test_axis.py tests/test_device_reduce.py tests/test_transform.py tests/test_occupancy.py tests/test_histogram.py tests/test_sync.py tests/test_graphs.py" WORKERS=14 TEST_TIMEOUT=240 bash tools/gpu_check.sh > $OUT/a/check.txt 2>&1
echo "== check a (reduce/axis, defaults)"; cat $OUT/a/check.txt
CUFOLD_NARROW_TILE=8x32 CUFOLD_COLUMN_UNROLL=16 OUT=$OUT/b PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=150 bash tools/gpu_check.sh > $OUT/b/check.txt 2>&1
echo "== check b (scans, narrow 8x32, unroll 16)"; cat $OUT/b/check.txt
for d in a b; do gzip -f $OUT/$d/pytest.log; (cd $OUT/$d && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log); done
