#!/usr/bin/env bash
# Session 37 call 1: session 35's next run (test_axis, the launched-plan test, runs_probe on the
# review commit 92081e0); ncu of #24's misses (A[::2], A.T's argmax) against contiguous reads of
# the same bytes; the chunked column-scan prototype (tools/chunkscan_probe.py, #19).
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
echo "== chunkscan probe"
timeout 150 python3 tools/chunkscan_probe.py 2>&1 | tee $OUT/chunkscan.txt | tail -40
echo "== tests"
timeout 170 python3 -m pytest -q -n 15 -p no:cacheprovider tests/test_axis.py tests/test_bench.py::test_axes_launched_plan > $OUT/pytest.log 2>&1; tail -3 $OUT/pytest.log
echo "== runs_probe"
timeout 50 python3 tools/runs_probe.py 2>&1 | tee $OUT/runs_probe.txt | head -8
echo "== ncu runs"
timeout 150 ncu --profile-from-start off --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct python3 tools/ncu_floor.py runs > $OUT/ncu-runs.csv 2>$OUT/ncu-runs.err
python3 tools/ncu_floor.py --table $OUT/ncu-runs.csv | tee $OUT/ncu-runs.txt
tail -3 $OUT/ncu-runs.err
