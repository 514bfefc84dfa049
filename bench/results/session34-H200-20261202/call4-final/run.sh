#!/usr/bin/env bash
# Session 34 call 4: the final narrow columns (4 x 32 tiles for accumulators of <= 8 bytes, every
# state layout): the C <= 4 probes, then the scan tests and the sanitizers on this tree.
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
OUT=$OUT PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=150 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; (cd $OUT && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
P=$OUT/probe.txt; : > $P
timeout 25 python3 tools/scan_probe.py 4194304x4,0 5592405x3,0 8388608x2,0 >> $P 2>&1
timeout 25 python3 tools/scan_probe.py --dtype int32 4194304x4,0 >> $P 2>&1
cat $P
echo "== check"; cat $OUT/check.txt
