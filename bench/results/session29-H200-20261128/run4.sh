#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl || exit 1
S=$PWD/.site; R=$OUT/r; mkdir -p $R; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
PYTHONPATH=$S:src timeout 180 python3 tools/rows_probe.py --features 16,64,256 --reps 10 \
  --env CUFOLD_ROWS_QUADS_ORDERED=0 --env CUFOLD_ROWS_ADAPTIVE_F=16 > $R/probe.txt 2>&1
cat $R/probe.txt
OUT=$R/check PART=files FILES="tests/test_feature_rows.py tests/test_segmented.py tests/test_bykey.py" \
  SANITIZE=1 TEST_TIMEOUT=170 bash tools/gpu_check.sh > $R/check.txt 2>&1
grep -E "feature rows|WRONG|ERROR SUMMARY" $R/check/sanitize-*.log | head -30
tail -8 $R/check.txt
cd $OUT && tar czf r.tgz r && rm -rf r/check
