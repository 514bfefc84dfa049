#!/usr/bin/env bash
# session 33 call 6 (H200): what slows the wide column tiles: the tile's width (8 or 16 columns) apart
# from the look-back's form (one for all columns, or a warp a column)
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
CASES="1048576x16,0 2097152x8,0 524288x32,0"
echo "== each, 8 wide (main)" >> $P; CUFOLD_COLUMN_LOOK_BACK=each timeout 60 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== each, 16 wide" >> $P; CUFOLD_COLUMN_LOOK_BACK=each CUFOLD_COLUMN_TILE_WIDTH=16 timeout 60 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== one, 8 wide" >> $P; CUFOLD_COLUMN_ONE_WIDTH=8 timeout 60 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== one, 8 wide, 5 blocks" >> $P; CUFOLD_COLUMN_ONE_WIDTH=8 CUFOLD_COLUMN_TILE_BLOCKS=5 timeout 60 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== one, 16 wide, 5 blocks" >> $P; CUFOLD_COLUMN_ONE_WIDTH=16 CUFOLD_COLUMN_TILE_BLOCKS=5 timeout 60 python3 tools/scan_probe.py $CASES >> $P 2>&1
cat $P
