#!/usr/bin/env bash
# session 27 call 1: branch measurements on 2 GPUs (GPU0 bykey, GPU1 LTO + column look-back)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl || exit 1
S=$PWD/.site; R=$OUT/r; mkdir -p $R; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
(
  export CUDA_VISIBLE_DEVICES=1
  for i in 1 2; do for lto in 1 0; do
    CUFOLD_LTO=$lto PYTHONPATH=$S:.trees/cand/src python3 .trees/cand/tools/cold_compile.py --op lambda --cache-dir /tmp/cc-$lto-$i > $R/cold-lto$lto-$i.txt 2>&1
  done; done
  for lto in 1 0; do
    CUFOLD_LTO=$lto PYTHONPATH=$S:.trees/cand/src python3 .trees/cand/tools/cold_compile.py --op lambda --cache-dir /tmp/cc-$lto-1 > $R/second-lto$lto.txt 2>&1
  done
  touch /tmp/cold.done
  for mode in columns warp columns warp; do
    echo "== colscan $mode"
    CUFOLD_COLUMN_LOOKBACK=$mode PYTHONPATH=$S:.trees/cand/src:tools timeout 100 python3 tools/colscan_probe.py
  done
  for lto in 1 0; do for suite in reduce scan; do
    echo "== bench $suite lto=$lto"
    CUFOLD_LTO=$lto CUFOLD_CACHE_DIR=/tmp/bc-$lto PYTHONPATH=$S:.trees/cand/src timeout 120 python3 -m cufold bench $suite \
      --only cufold --sizes 16,20,24,28 --dtypes float32,int32 --no-plot --no-progress --no-raw --out $R/$suite-lto$lto | tail -25
  done; done
) > $R/gpu1.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=0
  for t in main cand main cand; do
    echo "== bykey $t"
    PYTHONPATH=$S:.trees/$t/src timeout 120 python3 tools/bykey_power_law.py none,warp
  done
  while [ ! -e /tmp/cold.done ]; do sleep 2; done
  t=$(date +%s)
  PYTHONPATH=$S:.trees/cand/src timeout 300 python3 -m pytest -q -n 12 -p no:cacheprovider .trees/cand/tests/test_bykey.py .trees/cand/tests/test_scan_axis.py > $R/pytest-cand.log 2>&1
  echo "== pytest rc=$? $(( $(date +%s) - t )) s: $(tail -1 $R/pytest-cand.log)"
  grep -E "FAILED|ERROR" $R/pytest-cand.log | head -20
) > $R/gpu0.log 2>&1 &
wait
cd $OUT && tar czf r.tgz r && rm -rf r
echo "===== GPU0"; tar xzf r.tgz -O r/gpu0.log
echo "===== GPU1"; tar xzf r.tgz -O r/gpu1.log | grep -v "^\s*$" | head -150
for f in cold-lto1-1 cold-lto0-1 cold-lto1-2 cold-lto0-2 second-lto1 second-lto0; do echo "== $f"; tar xzf r.tgz -O r/$f.txt | tail -16; done
