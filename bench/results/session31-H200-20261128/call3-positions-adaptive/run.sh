#!/usr/bin/env bash
# session 31 call 3 (H200): radix Positions (no iota) and the adaptive rows' atomic path first:
# their test files (+ the strips' test fix) and the sanitizers; rows_probe default vs ADAPTIVE_HW_F=32
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
mkdir -p $OUT
FILES="tests/test_radix.py tests/test_feature_rows.py tests/test_bykey_tuple.py tests/test_scan_axis.py"
OUT=$OUT PART=files FILES="$FILES" WORKERS=14 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; cat $OUT/sanitize-*.log > $OUT/sanitize.log; rm -f $OUT/sanitize-*.log
timeout 200 python3 tools/rows_probe.py --features 16,64,256 --reps 10 --env CUFOLD_ROWS_ADAPTIVE_HW_F=32 > $OUT/rows_probe.txt 2>&1
CUFOLD_ROWS_ADAPTIVE_HW_F=32 timeout 50 python3 tools/_prof_adaptive.py > $OUT/prof.txt 2>&1
cat $OUT/check.txt
tail -22 $OUT/rows_probe.txt
grep -E "^====|^[a-z]" $OUT/prof.txt | cut -c1-45,105-140 | head -70
