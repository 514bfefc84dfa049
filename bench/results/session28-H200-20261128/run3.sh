#!/usr/bin/env bash
# session 28 call 3: piece levels of 16 rows (feature rows in order): tests, bench main vs cand, ncu
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl || exit 1
S=$PWD/.site; R=$OUT/r; mkdir -p $R; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
t0=$(date +%s)
PYTHONPATH=$S:src timeout 200 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_feature_rows.py tests/test_segmented.py \
  tests/test_bykey.py tests/test_sync.py tests/test_graphs.py > $R/pytest.log 2>&1
echo "pytest rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 $R/pytest.log)"; grep -E "FAILED|ERROR" $R/pytest.log | head
for t in main cand main cand; do
  T=$([ $t = main ] && echo .trees/main || echo .)
  echo "== pyg $t"
  PYTHONPATH=$S:$T/src timeout 120 python3 -m cufold bench pyg --features 16,64,256 --orders sorted,shuffled \
    --only "deterministic,segmented,PyG scatter sum" --no-progress --no-raw --out $R/pyg-$t-$RANDOM 2>&1 | grep -E "^==|deterministic|segmented|PyG"
done
PYTHONPATH=$S:src timeout 100 ncu --clock-control none --nvtx --nvtx-include "measured/" --metrics gpu__time_duration.sum \
  python3 tools/_probe_det.py 64 > $R/ncu-det-F64.txt 2>&1
echo "== ncu det F=64"; grep -E "Context|gpu__time_duration" $R/ncu-det-F64.txt | grep -A1 rows_kernel | cut -c1-60
cd $OUT && tar czf r.tgz r
