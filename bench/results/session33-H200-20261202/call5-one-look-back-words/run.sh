#!/usr/bin/env bash
# session 33 call 5 (H200): the column tiles' one look-back for all their columns with a state word
# a column (packed / pair: no fence), against a look-back a column (CUFOLD_COLUMN_LOOK_BACK=each, main's);
# launch bounds of 5 blocks
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
CASES="1048576x16,0 2097152x8,0 4194304x4,0 524288x32,0 1398101x12,0"
echo "== one look-back, words (default)" >> $P; timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== one look-back, words, 5 blocks" >> $P; CUFOLD_COLUMN_TILE_BLOCKS=5 timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== a look-back a column (main)" >> $P; CUFOLD_COLUMN_LOOK_BACK=each timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== one, 5 blocks, strips off: groups of 1 and 64 tiles" >> $P; CUFOLD_COLUMN_TILE_BLOCKS=5 CUFOLD_COLUMN_STRIPS=0 timeout 60 python3 tools/scan_probe.py 4096x256x16,1 64x16384x16,1 >> $P 2>&1
echo "== one, 5 blocks, int32 -> int64 (pair words)" >> $P; CUFOLD_COLUMN_TILE_BLOCKS=5 timeout 60 python3 tools/scan_probe.py --dtype int32 1048576x16,0 >> $P 2>&1
cat $P
