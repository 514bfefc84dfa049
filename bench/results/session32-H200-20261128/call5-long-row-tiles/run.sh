#!/usr/bin/env bash
# session 32 call 5 (H200): rows of several tiles in tiles of 128 x 2VT (this tree) against
# 256 x VT (.basesrc: HEAD 5th commit of the session), float32 and float64; bench scan-axes
# on this tree; then the scan tests and the sanitizers
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
NEW=$PWD/.site:$PWD/src:$PWD/tools; BASE=$PWD/.site:$PWD/.basesrc/src:$PWD/tools
P=$OUT/probe.txt; : > $P
for d in float32 float64; do
  echo "== new tree" >> $P; PYTHONPATH=$NEW timeout 60 python3 tools/scan_probe.py --dtype $d 16x1048576,1 4096x4096,1 16777216,0 >> $P 2>&1
  echo "== base tree" >> $P; PYTHONPATH=$BASE timeout 60 python3 tools/scan_probe.py --dtype $d 16x1048576,1 4096x4096,1 16777216,0 >> $P 2>&1
done
echo "== new tree again" >> $P; PYTHONPATH=$NEW timeout 60 python3 tools/scan_probe.py 16x1048576,1 >> $P 2>&1
PYTHONPATH=$NEW timeout 150 python3 -m cufold bench scan-axes --no-progress --out $OUT/scan-axes > $OUT/scan-axes.txt 2>&1
(cd $OUT && tar czf scan-axes.tar.gz scan-axes && rm -rf scan-axes)
OUT=$OUT PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; (cd $OUT && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
echo "== check"; cat $OUT/check.txt
echo "== probe"; cat $P
echo "== scan-axes"; grep -vE "^\s*$" $OUT/scan-axes.txt | tail -34
