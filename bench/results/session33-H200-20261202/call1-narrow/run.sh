#!/usr/bin/env bash
# session 33 call 1 (H200): the narrow columns (a row across the lanes, one look-back for every
# column) against the column tiles (CUFOLD_NARROW_COLUMNS=0), float32 / float64, C = 4..32; tile
# shapes (CUFOLD_NARROW_TILE=WxS); then the scan tests and the sanitizers
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
P=$OUT/probe.txt; : > $P
CASES="1048576x16,0 2097152x8,0 4194304x4,0 524288x32,0 1398101x12,0"
echo "== narrow (default)" >> $P; timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== column tiles" >> $P; CUFOLD_NARROW_COLUMNS=0 timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
for t in 4x16 4x32 8x8 16x8 8x24; do
  echo "== narrow $t" >> $P; CUFOLD_NARROW_TILE=$t timeout 40 python3 tools/scan_probe.py 1048576x16,0 2097152x8,0 >> $P 2>&1
done
for d in float64; do
  echo "== narrow $d" >> $P; timeout 60 python3 tools/scan_probe.py --dtype $d 1048576x16,0 2097152x8,0 >> $P 2>&1
  echo "== column tiles $d" >> $P; CUFOLD_NARROW_COLUMNS=0 timeout 60 python3 tools/scan_probe.py --dtype $d 1048576x16,0 2097152x8,0 >> $P 2>&1
done
echo "== narrow again" >> $P; timeout 40 python3 tools/scan_probe.py 1048576x16,0 >> $P 2>&1
cat $P
OUT=$OUT PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; (cd $OUT && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
echo "== check"; cat $OUT/check.txt
