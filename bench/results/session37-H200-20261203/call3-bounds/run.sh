#!/usr/bin/env bash
# Session 37 call 3: argmin/argmax over runs compiled for 4 blocks of 256 an SM
# (reduce.RUNS_INDEX_THREADS_PER_SM, launch bounds), the retiled runs again: runs_probe's argmax
# rows under three settings, bench axes' argmax over every layout, then test_axis +
# test_device_reduce with the sanitizers at the defaults.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
probe() { echo "== $1" >> $P; shift; env "$@" >> $P 2>&1; }
probe "bounds 1024, retile all (default)" timeout 60 python3 tools/runs_probe.py argmax
probe "no bounds (CUFOLD_RUNS_INDEX_THREADS=0), retile all" CUFOLD_RUNS_INDEX_THREADS=0 timeout 60 python3 tools/runs_probe.py argmax
probe "bounds 1024, rows kernel (CUFOLD_AXIS_RETILE=0)" CUFOLD_AXIS_RETILE=0 timeout 60 python3 tools/runs_probe.py argmax
cat $P
echo "== bench axes argmax"
timeout 150 python3 -m cufold bench axes --reductions argmax --quick --no-progress --no-raw --out $OUT/axes > $OUT/axes-stdout.txt 2>&1
echo "rc=$?"; grep -E "None +argmax" $OUT/axes/table.txt | cut -c1-140; grep -A5 "^targets" $OUT/axes/table.txt | cut -c1-400
echo "== check"
mkdir -p $OUT/check
OUT=$OUT/check PART=files FILES="tests/test_axis.py tests/test_device_reduce.py" WORKERS=14 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check/check.txt 2>&1
cat $OUT/check/check.txt | tail -12
gzip -f $OUT/check/pytest.log; (cd $OUT/check && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
