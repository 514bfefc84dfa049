#!/usr/bin/env bash
# session 31 call 4 (H200): the final tree: the test files touched since the candidate's run
# (rows, by key, graphs, reproducible, sync, transforms, segments); the strips' widths and
# bytes a thread (colscan_probe --strips); test_scan_axis with 48-byte strips
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
mkdir -p $OUT
FILES="tests/test_bykey.py tests/test_graphs.py tests/test_reproducible.py tests/test_sync.py tests/test_transform.py tests/test_segmented.py tests/test_quads.py tests/test_histogram.py tests/test_segscan.py tests/test_scan_transform.py"
OUT=$OUT PART=files FILES="$FILES" SANITIZE=0 WORKERS=14 TEST_TIMEOUT=250 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log
PYTHONPATH=$PYTHONPATH:tools timeout 90 python3 tools/colscan_probe.py --strips > $OUT/strips.txt 2>&1
CUFOLD_COLUMN_STRIP_BYTES=48 timeout 80 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_scan_axis.py > $OUT/scan_axis48.txt 2>&1
cat $OUT/check.txt
tail -3 $OUT/scan_axis48.txt
cat $OUT/strips.txt | tail -30
