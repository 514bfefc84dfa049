#!/usr/bin/env bash
# session 33 call 7 (H200): the column tiles 16 columns wide with a warp for each column's
# look-back (512 threads a block: CUFOLD_COLUMN_TILE_THREADS, knobs not kept on main) against
# 8 wide (main) and 16 wide with 256 threads (2 look-backs a warp)
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
CASES="1048576x16,0 524288x32,0 1398101x12,0"
echo "== 8 wide, 256 threads (main)" >> $P; timeout 60 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== 16 wide, 512 threads" >> $P; CUFOLD_COLUMN_TILE_WIDTH=16 CUFOLD_COLUMN_TILE_THREADS=512 timeout 60 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== 16 wide, 256 threads" >> $P; CUFOLD_COLUMN_TILE_WIDTH=16 timeout 60 python3 tools/scan_probe.py $CASES >> $P 2>&1
cat $P
