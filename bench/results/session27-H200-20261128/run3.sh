#!/usr/bin/env bash
# session 27 call 3: the cold compile on the defaults against CUFOLD_LTO=1; thin-row pairs A/B (bench axes z); test_axis with pairs on
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 1
S=$PWD/.site; export PYTHONUNBUFFERED=1; R=$OUT/r3; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 1 2; do for lto in default 1; do
  if [ $lto = default ]; then E=""; else E="CUFOLD_LTO=1"; fi
  env $E PYTHONPATH=$S:src python3 tools/cold_compile.py --op lambda --cache-dir /tmp/cc-$lto-$i > $R/cold-$lto-$i.txt 2>&1
  echo "cold $lto $i: $(head -1 $R/cold-$lto-$i.txt | cut -c1-140)"
  grep -E "NVVM|ptxas" $R/cold-$lto-$i.txt
done; done
for p in 0 1 0 1; do
  t=$(date +%s)
  CUFOLD_THIN_ROW_PAIRS=$p PYTHONPATH=$S:src timeout 150 python3 -m cufold bench axes --layouts z --reductions sum,max,argmax,mean \
    --no-progress --no-raw --out $R/axes-pairs$p-$t > $R/axes-pairs$p-$t.txt 2>&1
  echo "== pairs=$p rc=$? $(( $(date +%s) - t )) s"
  grep -E "^z " $R/axes-pairs$p-$t/table.txt | grep -E " 1  " | cut -c1-110
done
t=$(date +%s)
CUFOLD_THIN_ROW_PAIRS=1 PYTHONPATH=$S:src timeout 200 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_axis.py tests/test_occupancy.py > $R/pytest-pairs.log 2>&1
echo "== pytest pairs rc=$? $(( $(date +%s) - t )) s: $(tail -1 $R/pytest-pairs.log)"
grep -E "FAILED|ERROR" $R/pytest-pairs.log | head
cd $OUT && tar czf r3.tgz r3 && rm -rf r3
