#!/usr/bin/env bash
# session 32 call 3 (H200): the segments kernel's aligned rows (2..32 items) and the columns
# kernel's loads in flight: tests, scan_probe A/B, ncu of every cumsum case of bench scan-axes
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
OUT=$OUT PART=files FILES="tests/test_scan_axis.py tests/test_scan_transform.py tests/test_device_scan.py" WORKERS=14 TEST_TIMEOUT=200 bash tools/gpu_check.sh > $OUT/check.txt 2>&1 &
export PYTHONPATH=$PYTHONPATH:$PWD/tools
timeout 100 python3 tools/scan_probe.py > $OUT/probe.txt 2>&1
echo "== ALIGNED_SEGMENTS=0" >> $OUT/probe.txt
CUFOLD_ALIGNED_SEGMENTS=0 timeout 60 python3 tools/scan_probe.py 1048576x16,1 >> $OUT/probe.txt 2>&1
for u in 4 16; do echo "== COLUMN_UNROLL=$u" >> $OUT/probe.txt
CUFOLD_COLUMN_UNROLL=$u timeout 60 python3 tools/scan_probe.py 16x1048576,0 >> $OUT/probe.txt 2>&1; done
timeout 150 ncu --profile-from-start off --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
  python3 tools/scan_probe.py --once > $OUT/ncu.txt 2>&1
wait
gzip -f $OUT/pytest.log; (cd $OUT && tar czf sanitize.tar.gz sanitize-*.log && rm -f sanitize-*.log)
echo "== check"; cat $OUT/check.txt
echo "== probe"; cat $OUT/probe.txt
echo "== ncu"; grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Issued Ipc|No Eligible|Warp Cycles Per Issued" $OUT/ncu.txt | head -150
