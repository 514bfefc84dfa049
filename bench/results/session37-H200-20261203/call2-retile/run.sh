#!/usr/bin/env bash
# Session 37 call 2: the retiled runs (argmin/argmax of x.T and permuted views through the device
# reduce over runs, reduce.Spec.retile): runs_probe A/B (CUFOLD_AXIS_RETILE=0/1), ncu of the
# strided read (copy kernels) and the retiled argmaxes, bench axes' argmax over every layout,
# then test_axis + test_device_reduce + test_transform with the sanitizers.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
probe() { echo "== $1" >> $P; shift; env "$@" >> $P 2>&1; }
probe "retile (default)" timeout 70 python3 tools/runs_probe.py
probe "rows kernel (CUFOLD_AXIS_RETILE=0)" CUFOLD_AXIS_RETILE=0 timeout 70 python3 tools/runs_probe.py
cat $P
echo "== ncu runs"
timeout 120 ncu --profile-from-start off --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed python3 tools/ncu_floor.py runs > $OUT/ncu-runs.csv 2>$OUT/ncu-runs.err
python3 tools/ncu_floor.py --table $OUT/ncu-runs.csv | sed 's/\[abi[^ ]*//' | cut -c1-230 | tee $OUT/ncu-runs.txt
echo "== bench axes argmax"
timeout 150 python3 -m cufold bench axes --reductions argmax --quick --no-progress --no-raw --out $OUT/axes > $OUT/axes-stdout.txt 2>&1
echo "rc=$?"; grep -E "argmax" $OUT/axes/table.txt | cut -c1-140; grep -A5 "^targets" $OUT/axes/table.txt | cut -c1-500
echo "== check"
mkdir -p $OUT/check
OUT=$OUT/check PART=files FILES="tests/test_axis.py tests/test_device_reduce.py tests/test_transform.py" WORKERS=14 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check/check.txt 2>&1
cat $OUT/check/check.txt | tail -25
gzip -f $OUT/check/pytest.log; (cd $OUT/check && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
