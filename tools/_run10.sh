#!/usr/bin/env bash
set -u
OUT=${OUT:-/tmp/cufold-out}; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl
(cd tools && PYTHONPATH=$PWD/../.site:$PWD/../src timeout 200 python3 colscan_probe.py 2>&1 | tee $OUT/probe.txt)
