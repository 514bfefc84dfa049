#!/usr/bin/env bash
# session 32 call 2 (H200): main after call 1 landed. bench scan-axes (its same-shape copy
# column, first GPU run), bench calls (first since session 20), host_costs with profiles
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 130 python3 -m cufold bench scan-axes --no-progress --out $OUT/scan-axes > $OUT/scan-axes.txt 2>&1
timeout 240 python3 -m cufold bench calls --no-progress --out $OUT/calls > $OUT/calls.txt 2>&1
PYTHONPATH=$PYTHONPATH:tools timeout 120 python3 tools/host_costs.py --calls 4000 --profile "cufold.reduce_by_key_into check=False" "cufold.argmax(axis=1) 1024x1024" "cufold.sum" > $OUT/host_costs.txt 2>&1
(cd $OUT && tar czf benches.tar.gz scan-axes calls && rm -rf scan-axes calls)
echo "== scan-axes"; grep -vE "^\s*$" $OUT/scan-axes.txt | tail -45
echo "== calls"; grep -E "PASS|MISS" $OUT/calls.txt
echo "== host"; head -60 $OUT/host_costs.txt
