#!/usr/bin/env bash
# Session 38, call 3: the candidate (ids "auto": overlap for packed states) on the GPU.
# (1) call 1's failed 2^28 float32 check: cufold (auto, ticket) and torch against float64;
# (2) the scan test files, segmented/segscan/graphs/sync (they draw tickets too) + sanitizers;
# (3) scan_probe auto vs ticket, tiles under auto, the column tiles under overlap (+ their tests).
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.site:$PWD/src:$PWD/tools
for v in default ticket; do echo "== $v"; CUFOLD_SCAN_VARIANT=$v timeout 60 python3 tools/_check28.py; done > $OUT/check28.txt 2>&1
cat $OUT/check28.txt
mkdir -p $OUT/check
OUT=$OUT/check PART=files FILES="tests/test_device_scan.py tests/test_scan_axis.py tests/test_scan_transform.py tests/test_segmented.py tests/test_segscan.py tests/test_graphs.py tests/test_sync.py" \
  WORKERS=14 TEST_TIMEOUT=220 bash tools/gpu_check.sh > $OUT/check/check.txt 2>&1
tail -8 $OUT/check/check.txt
S=$OUT/scan.txt
for v in default ticket; do echo "== float32 $v" >> $S; CUFOLD_SCAN_VARIANT=$v timeout 45 python3 tools/scan_probe.py 4096x4096,1 16x1048576,1 16777216,0 >> $S 2>&1; done
for t in 128x32 256x16 128x16 512x16; do echo "== float32 default CUFOLD_TILE=$t" >> $S; CUFOLD_TILE=$t timeout 30 python3 tools/scan_probe.py 16x1048576,1 16777216,0 >> $S 2>&1; done
cat $S
echo "== column tiles: overlap" >> $S; CUFOLD_SCAN_VARIANT=overlap timeout 40 python3 tools/scan_probe.py 1048576x16,0 524288x32,0 >> $S 2>&1
echo "== column tiles: default" >> $S; timeout 40 python3 tools/scan_probe.py 1048576x16,0 524288x32,0 >> $S 2>&1
tail -4 $S
CUFOLD_SCAN_VARIANT=overlap timeout 120 python3 -m pytest -q -n 14 -p no:cacheprovider tests/test_scan_axis.py -k "column or tiles or narrow" > $OUT/overlap-columns-tests.txt 2>&1
tail -3 $OUT/overlap-columns-tests.txt
