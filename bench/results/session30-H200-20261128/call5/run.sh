#!/usr/bin/env bash
# session 30 call 5: the F = 16 compare-and-swap rows (float maximum) without the peers'
# windows and with four rows in flight a group
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 100 python3 tools/rows_probe.py --features 16 --reps 10 --env CUFOLD_ROWS_PEERS=0 --env CUFOLD_ROWS_UNROLL=8 > $OUT/rows_a.txt 2>&1
CUFOLD_ROWS_UNROLL=8 timeout 70 python3 tools/rows_probe.py --features 16 --reps 10 --env CUFOLD_ROWS_PEERS=0 > $OUT/rows_b.txt 2>&1
tail -8 $OUT/rows_a.txt; echo "(base CUFOLD_ROWS_UNROLL=8)"; tail -8 $OUT/rows_b.txt
