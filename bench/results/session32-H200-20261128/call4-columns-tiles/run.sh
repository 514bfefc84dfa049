#!/usr/bin/env bash
# session 32 call 4 (H200): timings first, alone on the GPU: the columns kernel through
# _column_rows (this tree) against the tree before it (.basesrc: HEAD 45c0bd5), the segments'
# aligned form on/off, scan tiles (CUFOLD_TILE) for the look-back scans; then the tests
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
NEW=$PWD/.site:$PWD/src:$PWD/tools; BASE=$PWD/.site:$PWD/.basesrc/src:$PWD/tools
P=$OUT/probe.txt
echo "== new tree" > $P; PYTHONPATH=$NEW timeout 90 python3 tools/scan_probe.py >> $P 2>&1
echo "== base tree (45c0bd5)" >> $P; PYTHONPATH=$BASE timeout 60 python3 tools/scan_probe.py 16x1048576,0 4096x4096,0 1048576x16,1 >> $P 2>&1
echo "== new tree, ALIGNED_SEGMENTS=0" >> $P; CUFOLD_ALIGNED_SEGMENTS=0 PYTHONPATH=$NEW timeout 60 python3 tools/scan_probe.py 1048576x16,1 >> $P 2>&1
for t in 256x24 256x32 512x16 128x32; do echo "== new tree, CUFOLD_TILE=$t" >> $P
CUFOLD_TILE=$t PYTHONPATH=$NEW timeout 60 python3 tools/scan_probe.py 16777216,0 16x1048576,1 1048576x16,0 >> $P 2>&1; done
echo "== new tree again" >> $P; PYTHONPATH=$NEW timeout 60 python3 tools/scan_probe.py 16x1048576,0 16777216,0 16x1048576,1 1048576x16,0 >> $P 2>&1
OUT=$OUT PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; (cd $OUT && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
echo "== check"; cat $OUT/check.txt
echo "== probe"; cat $P
