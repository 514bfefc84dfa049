#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYTHONPATH=$PWD/.site:src timeout 200 python3 -m cufold bench axes --layouts A,A.T,z,z.T --reductions sum,max,argmax,mean \
  --quick --no-progress --no-raw --out $OUT/axes > $OUT/axes-stdout.txt 2>&1
echo "rc=$?"; grep -A5 "^targets" $OUT/axes/table.txt | cut -c1-400
