#!/usr/bin/env bash
# session 31 call 2 (H200): the landing tree (main + float red + column strips): their test files
# and the sanitizers, bench pyg, bench scan-axes, the adaptive rows' kernels (profiler)
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
mkdir -p $OUT
FILES="tests/test_scan_axis.py tests/test_feature_rows.py tests/test_quads.py tests/test_segmented.py tests/test_bykey.py"
OUT=$OUT PART=files FILES="$FILES" WORKERS=14 TEST_TIMEOUT=220 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log; cat $OUT/sanitize-*.log > $OUT/sanitize.log; rm -f $OUT/sanitize-*.log
timeout 230 python3 -m cufold bench pyg --features 1,16,64,256 --no-progress --out $OUT/pyg > $OUT/pyg.txt 2>&1
timeout 120 python3 -m cufold bench scan-axes --no-progress --out $OUT/scan-axes > $OUT/scan-axes.txt 2>&1
CUFOLD_ROWS_ADAPTIVE_HW_F=32 timeout 60 python3 tools/_prof_adaptive.py > $OUT/prof.txt 2>&1
(cd $OUT && tar czf benches.tar.gz pyg scan-axes && rm -rf pyg scan-axes)
cat $OUT/check.txt
grep -E "PASS|MISS" $OUT/pyg.txt
tail -25 $OUT/scan-axes.txt
cut -c1-180 $OUT/prof.txt | grep -v "^-" | head -100
