#!/usr/bin/env bash
# session 30 call 2: the compare-and-swap rows' 16-byte word reads (cas4) tested and timed;
# the ordered rows' quad loads and the grouped F = 16 maximum timed
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src CUFOLD_CACHE_DIR=/tmp/cufold-cache
mkdir -p $OUT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
CUFOLD_ROWS_QUADS_CAS=1 timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_feature_rows.py tests/test_quads.py > $OUT/tests_cas.txt 2>&1
tail -3 $OUT/tests_cas.txt
timeout 330 python3 tools/rows_probe.py --features 16,64,256 --reps 10 --env CUFOLD_ROWS_QUADS_CAS=1 --env CUFOLD_ROWS_QUADS_ORDERED=1 --env CUFOLD_ROWS_ADAPTIVE_F=16 > $OUT/rows.txt 2>&1
tail -22 $OUT/rows.txt
