#!/usr/bin/env bash
# session 32 call 6 (H200): the review's segments kernel (aligned rows through warp.inclusive_scan)
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
timeout 40 python3 tools/scan_probe.py 1048576x16,1 > $OUT/probe.txt 2>&1
OUT=$OUT PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py" WORKERS=14 TEST_TIMEOUT=110 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; (cd $OUT && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
cat $OUT/check.txt $OUT/probe.txt
