#!/usr/bin/env bash
# session 33 call 3 (H200): the narrow columns' look-back folding only the tiles from the window's
# last prefix on (a run of them a lane); launch bounds of 5 blocks; the look-back's cost against
# chain length (row groups of 1, 2, 8, 64 tiles, strips off) next to the column tiles; ncu of
# (2^20, 16) along axis 0
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
P=$OUT/probe.txt; : > $P
CASES="1048576x16,0 2097152x8,0 4194304x4,0 524288x32,0 1398101x12,0 16777216,0"
echo "== narrow (default)" >> $P; timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
echo "== narrow, 5 blocks" >> $P; CUFOLD_NARROW_BLOCKS=5 timeout 90 python3 tools/scan_probe.py $CASES >> $P 2>&1
CHAINS="4096x256x16,1 2048x512x16,1 512x2048x16,1 64x16384x16,1"
echo "== narrow, strips off: groups of 1, 2, 8, 64 tiles" >> $P; CUFOLD_COLUMN_STRIPS=0 timeout 90 python3 tools/scan_probe.py $CHAINS >> $P 2>&1
echo "== column tiles, strips off" >> $P; CUFOLD_COLUMN_STRIPS=0 CUFOLD_NARROW_COLUMNS=0 timeout 90 python3 tools/scan_probe.py $CHAINS >> $P 2>&1
cat $P
timeout 150 ncu --profile-from-start off --clock-control none --kernel-name regex:narrow --section SpeedOfLight \
  --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
  python3 tools/scan_probe.py --once 1048576x16,0 > $OUT/ncu.txt 2>&1
echo "== ncu"; grep -vE "^==PROF==|^\s*$|----" $OUT/ncu.txt | grep -E "Duration|Throughput|Registers|Achieved|Theoretical Occ|Stall|Issued|Eligible|Warp Cycles|Block Limit|One or More|No Eligible|smsp__pcsamp" | head -60
