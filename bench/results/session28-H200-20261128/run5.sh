#!/usr/bin/env bash
# session 28 call 5: the grouping gated too (sorted keys skip the radix passes): tests, memcheck, bench
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl || exit 1
S=$PWD/.site; R=$OUT/r; mkdir -p $R; export PYTHONUNBUFFERED=1 PYTHONPATH=$S:src CUFOLD_CACHE_DIR=/tmp/cufold-cache
(timeout 170 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_targets.py > $R/memcheck.log 2>&1; echo "memcheck rc=$?" >> $R/memcheck.log) &
timeout 130 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_feature_rows.py tests/test_radix.py \
  tests/test_bykey_tuple.py > $R/pytest.log 2>&1
echo "pytest rc=$?: $(tail -1 $R/pytest.log)"; grep -E "FAILED|ERROR" $R/pytest.log | head
timeout 110 python3 -m cufold bench pyg --features 64,256 --only "cufold sum,cufold max" --no-progress --no-raw \
  --out $R/pyg 2>&1 | grep -E "^==|cufold"
wait
grep -E "adaptive|WRONG|ERROR SUMMARY|rc=" $R/memcheck.log
cd $OUT && tar czf r.tgz r
