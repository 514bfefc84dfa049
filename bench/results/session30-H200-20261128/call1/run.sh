#!/usr/bin/env bash
# session 30 call 1: whole suite on 2 GPUs; after PART 1 on GPU 0, rows_probe of the CAS-quads knob
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src
mkdir -p $OUT/p1 $OUT/p2 $OUT/probe
( CUDA_VISIBLE_DEVICES=1 OUT=$OUT/p2 PART=2 SANITIZE=0 TEST_TIMEOUT=470 bash tools/gpu_check.sh > $OUT/p2/summary.txt 2>&1 ) &
CUDA_VISIBLE_DEVICES=0 OUT=$OUT/p1 PART=1 TEST_TIMEOUT=300 bash tools/gpu_check.sh > $OUT/p1/summary.txt 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_quads.py > $OUT/probe/quads.txt 2>&1
tail -3 $OUT/probe/quads.txt
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 tools/rows_probe.py --features 16,64 --reps 10 --env CUFOLD_ROWS_QUADS_CAS=0 --env CUFOLD_ROWS_QUADS_CAS=1 > $OUT/probe/rows.txt 2>&1
wait
echo "== PART 1"; cat $OUT/p1/summary.txt
echo "== PART 2"; cat $OUT/p2/summary.txt
echo "== probe"; tail -30 $OUT/probe/rows.txt
