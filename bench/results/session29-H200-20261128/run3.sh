#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl || exit 1
S=$PWD/.site; R=$OUT/r; mkdir -p $R; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
PYTHONPATH=$S:src timeout 200 python3 tools/rows_probe.py --features 16,64,256 --reps 15 \
  --src src,$PWD/.trees/main/src > $R/probe.txt 2>&1
cat $R/probe.txt
PYTHONPATH=$S:src timeout 200 python3 -m cufold bench pyg --features 1,16,64,256 --no-progress --out $R/pyg > $R/pyg.txt 2>&1
grep -E "PASS|MISS" $R/pyg.txt
OUT=$R/check PART=files FILES="tests/test_feature_rows.py tests/test_bykey.py tests/test_bykey_tuple.py" \
  SANITIZE=1 TEST_TIMEOUT=170 bash tools/gpu_check.sh > $R/check.txt 2>&1
grep -E "quads|adaptive|WRONG|ERROR SUMMARY" $R/check/sanitize-*.log | head -20
tail -8 $R/check.txt
cd $OUT && tar czf r.tgz r && rm -rf r/check
