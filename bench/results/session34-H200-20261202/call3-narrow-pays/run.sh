#!/usr/bin/env bash
# Session 34 call 3: the narrow columns where narrow_pays (packed and wide states, accumulators
# of <= 8 bytes; 8-byte values in 4 x 32 tiles). Probes: float32 tiles of the narrow columns
# (8x16 default, 4x32, 8x32) at C = 4, 3, 2; int32 -> int32 narrow vs column tiles; float64
# narrow (4x32 default, 8x32) vs column tiles at C = 4, 2; int32 -> int64 (pair) forced at 4x32.
# Then the scan tests and the sanitizers on this tree.
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
probe() { echo "== $1" >> $P; shift; env "$@" >> $P 2>&1; }
F32="4194304x4,0 5592405x3,0 8388608x2,0"
probe "float32 narrow 8x16 (default)" timeout 40 python3 tools/scan_probe.py $F32
for t in 4x32 8x32; do probe "float32 narrow $t" CUFOLD_NARROW_TILE=$t timeout 40 python3 tools/scan_probe.py $F32; done
probe "int32->int32 narrow" timeout 40 python3 tools/scan_probe.py --dtype int32 --out-dtype int32 4194304x4,0 8388608x2,0
probe "int32->int32 tiles" CUFOLD_NARROW_COLUMNS=0 timeout 40 python3 tools/scan_probe.py --dtype int32 --out-dtype int32 4194304x4,0 8388608x2,0
F64="4194304x4,0 8388608x2,0"
probe "float64 narrow 4x32 (default)" timeout 40 python3 tools/scan_probe.py --dtype float64 $F64
probe "float64 narrow 8x32" CUFOLD_NARROW_TILE=8x32 timeout 40 python3 tools/scan_probe.py --dtype float64 $F64
probe "float64 tiles" CUFOLD_NARROW_COLUMNS=0 timeout 40 python3 tools/scan_probe.py --dtype float64 $F64
probe "int32->int64 narrow forced (pair) 4x32" CUFOLD_NARROW_STATES=pair timeout 40 python3 tools/scan_probe.py --dtype int32 4194304x4,0
cat $P
OUT=$OUT PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; (cd $OUT && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
echo "== check"; cat $OUT/check.txt
