#!/usr/bin/env bash
# session 32 call 1 (2 x H200): candidate = main + rows-path-hint + column-rows-helper.
# GPU1: the suite's PART 2; GPU0: PART 1 with the sanitizers, then rows_probe (hints on with
# HW_F 32, against main's setting) and colscan_probe (the column tiles through _column_rows)
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
mkdir -p $OUT/p1 $OUT/p2
(CUDA_VISIBLE_DEVICES=1 OUT=$OUT/p2 PART=2 SANITIZE=0 WORKERS=14 TEST_TIMEOUT=470 bash tools/gpu_check.sh > $OUT/p2/check.txt 2>&1) &
CUDA_VISIBLE_DEVICES=0 OUT=$OUT/p1 PART=1 WORKERS=12 TEST_TIMEOUT=230 bash tools/gpu_check.sh > $OUT/p1/check.txt 2>&1
export CUDA_VISIBLE_DEVICES=0
timeout 200 python3 tools/rows_probe.py --features 16,64,256 --reps 10 --env "CUFOLD_ROWS_PATH_HINTS=0 CUFOLD_ROWS_ADAPTIVE_HW_F=0" > $OUT/rows_probe.txt 2>&1
PYTHONPATH=$PYTHONPATH:tools timeout 70 python3 tools/colscan_probe.py > $OUT/colscan.txt 2>&1
wait
gzip -f $OUT/p1/pytest.log $OUT/p2/pytest.log
(cd $OUT/p1 && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
echo "== PART 1"; cat $OUT/p1/check.txt
echo "== PART 2"; cat $OUT/p2/check.txt
echo "== rows"; tail -24 $OUT/rows_probe.txt
echo "== colscan"; tail -30 $OUT/colscan.txt
