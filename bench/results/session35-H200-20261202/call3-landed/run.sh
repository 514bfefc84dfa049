#!/usr/bin/env bash
# Session 35 call 3: the landed tree (runs restricted to commutative operators with rising
# indices; float64 narrow tiles 8 x 32): test_axis and test_scan_axis on the GPU, the runs probe.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
SANITIZE=0 OUT=$OUT PART=files FILES="tests/test_axis.py tests/test_scan_axis.py" WORKERS=15 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
P=$OUT/probe.txt
timeout 60 python3 tools/runs_probe.py > $P 2>&1
timeout 40 python3 tools/scan_probe.py --dtype float64 4194304x4,0 8388608x2,0 >> $P 2>&1
cat $P; echo "== check"; cat $OUT/check.txt; gzip -f $OUT/pytest.log
