#!/usr/bin/env bash
# session 33 call 4 (H200): the column tiles with one look-back for all their columns (tiles up to 32
# columns wide: CUFOLD_COLUMN_LOOK_BACK=one, the new default) against a look-back a column (each, 8
# columns a tile: main's), with 5 blocks' launch bounds, and the narrow columns (a row across the lanes)
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
CASES="1048576x16,0 2097152x8,0 4194304x4,0 524288x32,0 1398101x12,0 16x1048576,0"
echo "== one look-back (default)" >> $P; timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== one look-back, 5 blocks" >> $P; CUFOLD_COLUMN_TILE_BLOCKS=5 timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== a look-back a column (main)" >> $P; CUFOLD_COLUMN_LOOK_BACK=each timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== narrow columns" >> $P; CUFOLD_NARROW_COLUMNS=1 CUFOLD_NARROW_BLOCKS=5 timeout 60 python3 tools/scan_probe.py 1048576x16,0 524288x32,0 >> $P 2>&1
CHAINS="4096x256x16,1 512x2048x16,1 64x16384x16,1"
echo "== one look-back, strips off" >> $P; CUFOLD_COLUMN_STRIPS=0 timeout 60 python3 tools/scan_probe.py $CHAINS >> $P 2>&1
echo "== each, strips off" >> $P; CUFOLD_COLUMN_STRIPS=0 CUFOLD_COLUMN_LOOK_BACK=each timeout 60 python3 tools/scan_probe.py $CHAINS >> $P 2>&1
for d in float64; do
  echo "== one $d" >> $P; timeout 60 python3 tools/scan_probe.py --dtype $d 1048576x16,0 2097152x8,0 >> $P 2>&1
  echo "== each $d" >> $P; CUFOLD_COLUMN_LOOK_BACK=each timeout 60 python3 tools/scan_probe.py --dtype $d 1048576x16,0 2097152x8,0 >> $P 2>&1
done
cat $P
