#!/usr/bin/env bash
set -u
OUT=${OUT:-/tmp/cufold-out}; mkdir -p $OUT
PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" SANITIZE=0 TEST_TIMEOUT=200 bash tools/gpu_check.sh 2>&1 | tail -5
export PYTHONPATH=$PWD/.site:$PWD/src
t=$(date +%s); timeout 330 python3 -m cufold bench calls --no-progress --out $OUT/calls > $OUT/calls-stdout.txt 2> $OUT/calls-stderr.txt; echo "calls rc=$? $(( $(date +%s) - t )) s"
grep -E "PASS|MISS" $OUT/calls-stdout.txt | cut -c1-220
tail -5 $OUT/calls-stderr.txt
cd $OUT && tar czf /tmp/results.tgz . && mv /tmp/results.tgz $OUT/
