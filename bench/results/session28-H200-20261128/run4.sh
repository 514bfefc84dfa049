#!/usr/bin/env bash
# session 28 call 4: adaptive feature rows (GPU-chosen path): tests + sanitizers, bench pyg main vs cand
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl || exit 1
S=$PWD/.site; R=$OUT/r; mkdir -p $R; export PYTHONUNBUFFERED=1
t0=$(date +%s)
OUT=$R/check PART=files TEST_TIMEOUT=260 FILES="tests/test_feature_rows.py tests/test_bykey.py tests/test_bykey_tuple.py tests/test_sync.py tests/test_graphs.py tests/test_segmented.py tests/test_transform.py" \
  bash tools/gpu_check.sh > $R/check.txt 2>&1
echo "check $(( $(date +%s) - t0 )) s"; cat $R/check.txt
grep -E "adaptive|WRONG" $R/check/sanitize-memcheck.log | head -5
for t in main cand; do
  T=$([ $t = main ] && echo .trees/main || echo .)
  echo "== pyg $t"
  PYTHONPATH=$S:$T/src timeout 150 python3 -m cufold bench pyg --features 16,64,256 \
    --only "cufold sum,cufold max,PyG" --no-progress --no-raw --out $R/pyg-$t 2>&1 | grep -E "^==|cufold|PyG|PASS|MISS"
done
cd $OUT && tar czf r.tgz r
