#!/usr/bin/env bash
# session 28 call 2: where the cold compile's extra threads come from; per-call A/B in reverse order;
# the deterministic feature rows' kernels under ncu
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl || exit 1
S=$PWD/.site; R=$OUT/r; mkdir -p $R; export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for i in 1 2 3; do for mode in default omp1; do
  E=$([ $mode = omp1 ] && echo "OMP_NUM_THREADS=1" || echo "X=1")
  env $E PYTHONPATH=$S:src python3 tools/cold_compile.py --op lambda --cache-dir /tmp/cc-$mode-$i > $R/cold-$mode-$i.txt 2>&1
  echo "cold $mode $i: $(head -1 $R/cold-$mode-$i.txt | sed 's/.*GPU: //') glue: $(grep 'numba glue' $R/cold-$mode-$i.txt)"
done; done
for t in main cand; do
  T=$([ $t = main ] && echo .trees/main || echo .)
  PYTHONPATH=$S:$T/src python3 $T/tools/cold_compile.py --op commutative --cache-dir /tmp/cc-$t-c > $R/cold-$t-commutative.txt 2>&1
  echo "cold $t commutative: $(head -1 $R/cold-$t-commutative.txt | sed 's/.*GPU: //')"
done
grep -A3 "thread-pool" $R/cold-default-1.txt; grep -A6 "^threads" $R/cold-default-1.txt
for t in cand main cand main; do
  T=$([ $t = main ] && echo .trees/main || echo .)
  echo "== reduce $t"
  CUFOLD_CACHE_DIR=/tmp/br-$t PYTHONPATH=$S:$T/src timeout 80 python3 -m cufold bench reduce --only cufold \
    --sizes 10,16 --dtypes float32 --no-plot --no-progress --no-raw --out $R/reduce-$t-$RANDOM 2>&1 | grep -E "^2\^|^=="
done
for F in 64 256; do
  PYTHONPATH=$S:src timeout 150 ncu --clock-control none --nvtx --nvtx-include "measured/" --metrics gpu__time_duration.sum \
    python3 tools/_probe_det.py $F > $R/ncu-det-F$F.txt 2>&1
  echo "== ncu det F=$F"; grep -E "Context|gpu__time_duration" $R/ncu-det-F$F.txt | cut -c1-90 | head -40; tail -3 $R/ncu-det-F$F.txt
done
cd $OUT && tar czf r.tgz r
