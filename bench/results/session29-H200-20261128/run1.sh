#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl || exit 1
S=$PWD/.site; R=$OUT/r; mkdir -p $R; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
(CUDA_VISIBLE_DEVICES=1 OUT=$R/p2 PART=2 SANITIZE=0 TEST_TIMEOUT=430 bash tools/gpu_check.sh > $R/p2.txt 2>&1) &
(
  CUDA_VISIBLE_DEVICES=0 OUT=$R/p1 PART=1 TEST_TIMEOUT=300 bash tools/gpu_check.sh > $R/p1.txt 2>&1
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$S:src timeout 150 python3 tools/_probe_v4.py
) > $R/gpu0.log 2>&1
wait
cd $OUT && tar czf r.tgz r
echo "== PART 1"; tail -n 8 r/p1.txt; echo "== PART 2"; tail -n 8 r/p2.txt
echo "== GPU0"; cat r/gpu0.log | tail -40
rm -rf r/p1 r/p2
