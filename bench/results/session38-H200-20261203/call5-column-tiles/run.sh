#!/usr/bin/env bash
# Session 38, call 5: the column tiles take the overlap ids under auto (packed states):
# test_scan_axis and the sanitizers on that tree; the probe once more.
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
timeout 40 python3 tools/scan_probe.py 1048576x16,0 524288x32,0 > $OUT/scan.txt 2>&1; cat $OUT/scan.txt
mkdir -p $OUT/check
OUT=$OUT/check PART=files FILES="tests/test_scan_axis.py" WORKERS=14 TEST_TIMEOUT=150 \
  bash tools/gpu_check.sh > $OUT/check/check.txt 2>&1
tail -7 $OUT/check/check.txt
