#!/usr/bin/env bash
# Session 35 call 1: main (a68f6af, the tile-state carver: not yet run on a GPU) through the scan tests and sanitizers
# at the default settings, and session 34 next-run.sh probes (int32 and float64 narrow tiles, knobs of the 84-89% cases).
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
probe() { echo "== $1" >> $P; shift; env "$@" >> $P 2>&1; }
I32="--dtype int32 --out-dtype int32 4194304x4,0 8388608x2,0"
probe "int32->int32 narrow 4x32 (default)" timeout 40 python3 tools/scan_probe.py $I32
probe "int32->int32 narrow 8x16" CUFOLD_NARROW_TILE=8x16 timeout 40 python3 tools/scan_probe.py $I32

for t in 4x32 8x32 4x64; do
  probe "float64 narrow $t" CUFOLD_NARROW_TILE=$t timeout 40 python3 tools/scan_probe.py --dtype float64 4194304x4,0 8388608x2,0
done
probe "main" timeout 40 python3 tools/scan_probe.py 4096x4096,0 16x1048576,0 16x1048576,1
for b in 16 48; do probe "strip bytes $b" CUFOLD_COLUMN_STRIP_BYTES=$b timeout 40 python3 tools/scan_probe.py 4096x4096,0; done
for u in 4 16; do probe "column unroll $u" CUFOLD_COLUMN_UNROLL=$u timeout 40 python3 tools/scan_probe.py 16x1048576,0; done
for t in 64x64 128x16; do probe "tile $t" CUFOLD_TILE=$t timeout 40 python3 tools/scan_probe.py 16x1048576,1; done
cat $P
OUT=$OUT PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=150 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; (cd $OUT && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
echo "== check"; cat $OUT/check.txt
