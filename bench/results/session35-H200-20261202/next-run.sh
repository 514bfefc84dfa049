#!/usr/bin/env bash
# For the next GPU run (not run in session 35: no machine could be started): the review commit 92081e0 (host code only: the runs plan, launched_plan text)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
timeout 150 python3 -m pytest -q -n 15 -p no:cacheprovider tests/test_axis.py tests/test_bench.py::test_axes_launched_plan 2>&1 | tail -3
timeout 40 python3 tools/runs_probe.py 2>&1 | head -4
