#!/usr/bin/env bash
# Session 34 call 2: narrow columns restricted to packed look-back states (NARROW_STATES); probes:
# int32 -> int32 at C = 4, 2 (narrow vs tiles); float64 and int32 -> int64 at C = 4 with the narrow
# columns forced for every state layout and larger tiles (CUFOLD_NARROW_TILE); the batched affine
# recurrence under scan tiles (CUFOLD_TILE) next to Triton; then the scan tests and the sanitizers.
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
probe() { echo "== $1" >> $P; shift; env "$@" >> $P 2>&1; }
ALL=CUFOLD_NARROW_STATES=packed,pair,wide
probe "int32->int32 narrow" timeout 40 python3 tools/scan_probe.py --dtype int32 --out-dtype int32 4194304x4,0 8388608x2,0
probe "int32->int32 tiles" CUFOLD_NARROW_COLUMNS=0 timeout 40 python3 tools/scan_probe.py --dtype int32 --out-dtype int32 4194304x4,0 8388608x2,0
for t in 8x8 8x16 4x32; do
  probe "float64 narrow forced $t" $ALL CUFOLD_NARROW_TILE=$t timeout 40 python3 tools/scan_probe.py --dtype float64 4194304x4,0
done
probe "float64 tiles" timeout 40 python3 tools/scan_probe.py --dtype float64 4194304x4,0
for t in 8x8 8x16; do
  probe "int32->int64 narrow forced $t" $ALL CUFOLD_NARROW_TILE=$t timeout 40 python3 tools/scan_probe.py --dtype int32 4194304x4,0
done
probe "int32->int64 tiles" timeout 40 python3 tools/scan_probe.py --dtype int32 4194304x4,0
probe "affine default" timeout 60 python3 tools/scan_probe.py affine:4096x2048,1
for t in 128x16 512x4 64x32 128x8; do
  probe "affine CUFOLD_TILE=$t" CUFOLD_TILE=$t timeout 60 python3 tools/scan_probe.py affine:4096x2048,1
done
cat $P
OUT=$OUT PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; (cd $OUT && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
echo "== check"; cat $OUT/check.txt
