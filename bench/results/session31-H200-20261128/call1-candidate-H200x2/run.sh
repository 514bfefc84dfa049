#!/usr/bin/env bash
# session 31 call 1 (2 x H200): the candidate tree (main + rows-float-red + column-strips):
# GPU1 the suite's PART 2; GPU0 PART 1 with the sanitizers, then the probes of both branches
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
mkdir -p $OUT/p1 $OUT/p2
git log --oneline -1 2>/dev/null
(CUDA_VISIBLE_DEVICES=1 OUT=$OUT/p2 PART=2 SANITIZE=0 WORKERS=14 TEST_TIMEOUT=420 bash tools/gpu_check.sh > $OUT/p2/check.txt 2>&1) &
CUDA_VISIBLE_DEVICES=0 OUT=$OUT/p1 PART=1 WORKERS=12 TEST_TIMEOUT=240 bash tools/gpu_check.sh > $OUT/p1/check.txt 2>&1
export CUDA_VISIBLE_DEVICES=0
timeout 240 python3 tools/rows_probe.py --features 16,64,256 --reps 10 --env CUFOLD_ROWS_FLOAT_RED=0 --env CUFOLD_ROWS_WORDS_AHEAD=0 --env CUFOLD_ROWS_ADAPTIVE_HW_F=32 > $OUT/rows_probe.txt 2>&1
PYTHONPATH=$PYTHONPATH:tools timeout 80 python3 tools/colscan_probe.py > $OUT/colscan.txt 2>&1
timeout 40 python3 tools/cold_compile.py --op lambda > $OUT/cold.txt 2>&1
wait
gzip -f $OUT/p1/pytest.log $OUT/p2/pytest.log
echo "== PART 1"; cat $OUT/p1/check.txt
echo "== PART 2"; cat $OUT/p2/check.txt
echo "== rows"; tail -22 $OUT/rows_probe.txt
echo "== colscan"; cat $OUT/colscan.txt | tail -40
echo "== cold"; tail -15 $OUT/cold.txt
