#!/usr/bin/env bash
# session 27 call 2: the whole suite on the candidate (two halves, one per GPU; sanitizers with PART 1),
# the cold compile on its defaults, host costs with profiles
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 1
S=$PWD/.site; export PYTHONUNBUFFERED=1
for i in 1 2; do
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$S:src python3 tools/cold_compile.py --op lambda --cache-dir /tmp/cc-$i 2>&1 | head -3
done
O=$OUT
(CUDA_VISIBLE_DEVICES=0 OUT=$O/p1 PART=1 TEST_TIMEOUT=420 bash tools/gpu_check.sh > $O/p1.txt 2>&1) &
sleep 1
(CUDA_VISIBLE_DEVICES=1 OUT=$O/p2 PART=2 SANITIZE=0 TEST_TIMEOUT=420 bash tools/gpu_check.sh > $O/p2.txt 2>&1) &
wait
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$S:src:tools timeout 60 python3 tools/host_costs.py --calls 4000 \
  --profile "cufold.reduce_by_key_into check=False" "cufold.sum(axis=1) 32x32" > $O/host_costs.txt 2>&1
cd $O && tar czf r2.tgz p1 p2 host_costs.txt && rm -rf p1 p2
echo "== PART 1"; cat p1.txt; echo "== PART 2"; cat p2.txt
grep -E " us$" host_costs.txt | head -45
