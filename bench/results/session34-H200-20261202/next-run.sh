#!/usr/bin/env bash
# For the next GPU run (not run in session 34: the device budget was spent): the narrow columns'
# untimed tiles (int32 -> int32 at the landed 4 x 32 against 8 x 16 and the column tiles; float64 at
# 8 x 32, 9% faster than 4 x 32 at 4 columns in call 3), and the knobs of the three #19 cases at
# 84-89% of the clone: the column strips' bytes a thread (4096^2 axis 0), the columns kernel's
# unroll ((16, 2^20) axis 0), the long rows' tile ((16, 2^20) axis 1). Then the scan tests and the
# sanitizers with CUFOLD_NARROW_TILE=8x32 (the tile a change to float64's default would land).
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
probe() { echo "== $1" >> $P; shift; env "$@" >> $P 2>&1; }
I32="--dtype int32 --out-dtype int32 4194304x4,0 8388608x2,0"
probe "int32->int32 narrow 4x32 (default)" timeout 40 python3 tools/scan_probe.py $I32
probe "int32->int32 narrow 8x16" CUFOLD_NARROW_TILE=8x16 timeout 40 python3 tools/scan_probe.py $I32
probe "int32->int32 tiles" CUFOLD_NARROW_COLUMNS=0 timeout 40 python3 tools/scan_probe.py $I32
for t in 4x32 8x32 4x64; do
  probe "float64 narrow $t" CUFOLD_NARROW_TILE=$t timeout 40 python3 tools/scan_probe.py --dtype float64 4194304x4,0 8388608x2,0
done
probe "main" timeout 40 python3 tools/scan_probe.py 4096x4096,0 16x1048576,0 16x1048576,1
for b in 16 48; do probe "strip bytes $b" CUFOLD_COLUMN_STRIP_BYTES=$b timeout 40 python3 tools/scan_probe.py 4096x4096,0; done
for u in 4 16; do probe "column unroll $u" CUFOLD_COLUMN_UNROLL=$u timeout 40 python3 tools/scan_probe.py 16x1048576,0; done
for t in 64x64 128x16; do probe "tile $t" CUFOLD_TILE=$t timeout 40 python3 tools/scan_probe.py 16x1048576,1; done
cat $P
CUFOLD_NARROW_TILE=8x32 OUT=$OUT PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=150 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; (cd $OUT && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
echo "== check"; cat $OUT/check.txt
