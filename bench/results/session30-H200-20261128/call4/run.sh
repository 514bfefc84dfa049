#!/usr/bin/env bash
# session 30 call 4: the final tree (quads on in the ordered and compare-and-swap rows by
# default): the rows, by-key and segmented test files and the sanitizers, then bench pyg
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl
export PYTHONPATH=$PWD/.site:$PWD/src CUFOLD_CACHE_DIR=/tmp/cufold-cache PYTHONUNBUFFERED=1
mkdir -p $OUT
FILES="tests/test_feature_rows.py tests/test_quads.py tests/test_segmented.py tests/test_bykey.py tests/test_bykey_tuple.py tests/test_graphs.py tests/test_transform.py"
OUT=$OUT PART=files FILES="$FILES" WORKERS=14 TEST_TIMEOUT=260 bash tools/gpu_check.sh > $OUT/check.txt 2>&1
gzip -f $OUT/pytest.log
timeout 230 python3 -m cufold bench pyg --features 1,16,64,256 --no-progress --out $OUT/pyg > $OUT/pyg.txt 2>&1
cat $OUT/check.txt
grep -E "PASS|MISS" $OUT/pyg.txt
