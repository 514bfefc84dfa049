#!/usr/bin/env bash
# Session 37 call 4: the landed tree (retiled runs for one outer dimension, bounded to 4 blocks
# of 256 an SM; rising runs unbounded): test_axis + test_device_reduce with the sanitizers,
# runs_probe's argmax rows, bench axes over A, A.T, A[::2], z.T.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
mkdir -p $OUT/check
OUT=$OUT/check PART=files FILES="tests/test_axis.py tests/test_device_reduce.py" WORKERS=14 TEST_TIMEOUT=170 bash tools/gpu_check.sh > $OUT/check/check.txt 2>&1
tail -8 $OUT/check/check.txt
gzip -f $OUT/check/pytest.log; (cd $OUT/check && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
echo "== runs_probe argmax"
timeout 50 python3 tools/runs_probe.py argmax 2>&1 | tee $OUT/probe.txt
echo "== bench axes"
timeout 100 python3 -m cufold bench axes --layouts A,A.T,A[::2],z.T --reductions sum,argmax --quick --no-progress --no-raw --out $OUT/axes > $OUT/axes-stdout.txt 2>&1
echo "rc=$?"; grep -E "None +" $OUT/axes/table.txt | cut -c1-140; grep -A5 "^targets" $OUT/axes/table.txt | cut -c1-400
