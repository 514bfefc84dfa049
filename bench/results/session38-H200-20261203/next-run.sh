#!/usr/bin/env bash
# For the next GPU run: the column tiles take the overlap ids under auto (packed states; 6% faster in
# session 38 call 3, 56 tests passed, no sanitizer run). Apply the one-line change in scan_axis.py
# (ids = S.tile_ids(var.ids, states, acc_vt) mapped to ticket/overlap), then run:
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
mkdir -p $OUT/check
OUT=$OUT/check PART=files FILES="tests/test_scan_axis.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=200 \
  bash tools/gpu_check.sh > $OUT/check/check.txt 2>&1
tail -7 $OUT/check/check.txt
timeout 40 python3 tools/scan_probe.py 1048576x16,0 524288x32,0 16777216,0 > $OUT/scan.txt 2>&1; cat $OUT/scan.txt
