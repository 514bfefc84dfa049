#!/usr/bin/env bash
# Session 34 call 1: with
# narrow-v1-four-columns.patch applied (git am), call 1's narrow columns (v1) for 4 columns or fewer
# against the column tiles (CUFOLD_NARROW_COLUMNS=0): float32 C = 2, 3, 4; float64 and int32 -> int64
# at C = 4; then the scan tests and the sanitizers (tools/sanitize_targets.py has the narrow targets).
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
CASES="4194304x4,0 5592405x3,0 8388608x2,0 1048576x16,0 16777216x1,0"
echo "== narrow (default)" >> $P; timeout 50 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== column tiles" >> $P; CUFOLD_NARROW_COLUMNS=0 timeout 50 python3 tools/scan_probe.py $CASES >> $P 2>&1
for d in float64 int32; do
  echo "== narrow $d" >> $P; timeout 30 python3 tools/scan_probe.py --dtype $d 4194304x4,0 >> $P 2>&1
  echo "== column tiles $d" >> $P; CUFOLD_NARROW_COLUMNS=0 timeout 30 python3 tools/scan_probe.py --dtype $d 4194304x4,0 >> $P 2>&1
done
cat $P
OUT=$OUT PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; (cd $OUT && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
echo "== check"; cat $OUT/check.txt
