#!/usr/bin/env bash
# session 33 call 2 (H200): the narrow columns with one flag a tile and a 32-tile window for every
# column (items held in shared memory through the look-back) against the column tiles
# (CUFOLD_NARROW_COLUMNS=0); items in registers; launch bounds of 5 blocks; tile shapes
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
CASES="1048576x16,0 2097152x8,0 4194304x4,0 524288x32,0 1398101x12,0 16777216x1,0"
echo "== narrow (default)" >> $P; timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== column tiles" >> $P; CUFOLD_NARROW_COLUMNS=0 timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== narrow, registers" >> $P; CUFOLD_NARROW_HELD=registers timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== narrow, 5 blocks" >> $P; CUFOLD_NARROW_BLOCKS=5 timeout 60 python3 tools/scan_probe.py 1048576x16,0 1398101x12,0 >> $P 2>&1
for t in 4x16 4x32 8x8 16x8 16x16; do
  echo "== narrow $t" >> $P; CUFOLD_NARROW_TILE=$t timeout 40 python3 tools/scan_probe.py 1048576x16,0 2097152x8,0 >> $P 2>&1
done
echo "== narrow float64" >> $P; timeout 60 python3 tools/scan_probe.py --dtype float64 1048576x16,0 2097152x8,0 >> $P 2>&1
echo "== column tiles float64" >> $P; CUFOLD_NARROW_COLUMNS=0 timeout 60 python3 tools/scan_probe.py --dtype float64 1048576x16,0 2097152x8,0 >> $P 2>&1
echo "== narrow again" >> $P; timeout 40 python3 tools/scan_probe.py 1048576x16,0 >> $P 2>&1
cat $P
