#!/usr/bin/env bash
# session 27 call 4: line-walk unroll A/B (full argmax of views), test_axis under the candidate, cold compiles
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 1
S=$PWD/.site; export PYTHONUNBUFFERED=1; R=$OUT/r4; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for u in 0 16 12 0 16 12; do
  CUFOLD_WALK_UNROLL=$u PYTHONPATH=$S:src timeout 90 python3 tools/_walk_probe.py 2>&1 | tail -2
done
t=$(date +%s)
CUFOLD_WALK_UNROLL=16 PYTHONPATH=$S:src timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_axis.py > $R/pytest-walk16.log 2>&1
echo "== pytest walk16 rc=$? $(( $(date +%s) - t )) s: $(tail -1 $R/pytest-walk16.log)"
grep -E "FAILED|ERROR" $R/pytest-walk16.log | head
for i in 1 2 3; do
  PYTHONPATH=$S:src python3 tools/cold_compile.py --op lambda --cache-dir /tmp/cc4-$i > $R/cold-$i.txt 2>&1
  echo "cold $i: $(head -1 $R/cold-$i.txt | cut -c1-140)"
done
cd $OUT && tar czf r4.tgz r4 && rm -rf r4
