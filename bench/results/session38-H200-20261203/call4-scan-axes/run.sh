#!/usr/bin/env bash
# Session 38, call 4: bench scan-axes on the candidate (ids auto), the #19 table.
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl 2>/dev/null
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
timeout 280 python3 -m cufold bench scan-axes --no-progress --out $OUT/scan-axes > $OUT/scan-axes.txt 2>&1; echo "bench rc=$?"
tail -32 $OUT/scan-axes.txt
