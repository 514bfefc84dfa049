#!/usr/bin/env bash
# session 28 call 1 (2 x H200): cold compiles main vs cand (quiet machine first), then the suite
# on cand (PART 1 + sanitizers on GPU0, then measurements there; PART 2 on GPU1)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl || exit 1
S=$PWD/.site; R=$OUT/r; mkdir -p $R; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for i in 1 2; do for op in lambda commutative; do for t in main cand; do
  T=$([ $t = main ] && echo .trees/main || echo .)
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$S:$T/src python3 $T/tools/cold_compile.py --op $op --cache-dir /tmp/cc-$t-$op-$i > $R/cold-$t-$op-$i.txt 2>&1
  echo "cold $t $op $i: $(head -1 $R/cold-$t-$op-$i.txt | sed 's/.*GPU: //')"
done; done; done
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$S:src python3 tools/cold_compile.py --op lambda --cache-dir /tmp/cc-cand-lambda-1 > $R/second-cand.txt 2>&1
echo "second process: $(head -1 $R/second-cand.txt | sed 's/.*GPU: //')"
(CUDA_VISIBLE_DEVICES=1 OUT=$R/p2 PART=2 SANITIZE=0 TEST_TIMEOUT=430 bash tools/gpu_check.sh > $R/p2.txt 2>&1) &
(
  CUDA_VISIBLE_DEVICES=0 OUT=$R/p1 PART=1 TEST_TIMEOUT=300 bash tools/gpu_check.sh > $R/p1.txt 2>&1
  export CUDA_VISIBLE_DEVICES=0
  for t in main cand main cand; do
    T=$([ $t = main ] && echo .trees/main || echo .)
    echo "== pyg $t"
    PYTHONPATH=$S:$T/src timeout 100 python3 -m cufold bench pyg --features 16,64,256 --orders shuffled \
      --only "deterministic,PyG" --no-progress --no-raw --out $R/pyg-$t-$RANDOM 2>&1 | grep -E "deterministic|PyG"
  done
  for t in main cand; do
    T=$([ $t = main ] && echo .trees/main || echo .)
    echo "== reduce $t"
    CUFOLD_CACHE_DIR=/tmp/br-$t PYTHONPATH=$S:$T/src timeout 100 python3 -m cufold bench reduce --only cufold \
      --sizes 10,16,20,24,28 --dtypes float32,int32 --no-plot --no-progress --no-raw --out $R/reduce-$t 2>&1 | tail -40
  done
) > $R/gpu0.log 2>&1
wait
cd $OUT && tar czf r.tgz r
echo "== PART 1"; cat r/p1.txt; echo "== PART 2"; cat r/p2.txt
echo "== GPU0"; cat r/gpu0.log | head -120
rm -rf r/p1 r/p2
