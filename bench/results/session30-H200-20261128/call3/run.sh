#!/usr/bin/env bash
# session 30 call 3: the compare-and-swap rows' reads a run ahead (cas4 + CAS_AHEAD), tested and timed
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src CUFOLD_CACHE_DIR=/tmp/cufold-cache CUFOLD_ROWS_QUADS_CAS=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 200 python3 -m pytest -q -n 14 -p no:cacheprovider tests/test_feature_rows.py tests/test_quads.py tests/test_segmented.py > $OUT/tests_cas_ahead.txt 2>&1
tail -3 $OUT/tests_cas_ahead.txt
timeout 260 python3 tools/rows_probe.py --features 16,64 --reps 10 --env CUFOLD_ROWS_QUADS_CAS=0 --env CUFOLD_ROWS_CAS_AHEAD=0 --env CUFOLD_ROWS_MIN_BLOCKS=6 > $OUT/rows.txt 2>&1
tail -14 $OUT/rows.txt
