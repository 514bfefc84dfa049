#!/usr/bin/env bash
# The benchmark batch for the GPU machine (repo root, .whl carried for numpy<2.5):
#   bash tools/gpu_bench.sh reduce scan bykey hist segmented
# Each suite writes its table, JSON and plots under $OUT/<suite>; copy them into bench/results/.
set -u
OUT=${OUT:-/tmp/cufold-out}
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1
for suite in "$@"; do
  mkdir -p "$OUT/$suite"
  extra=$([ "$suite" = hist ] && echo "--sizes 20,26")   # 84 candidates: the two sizes the issue names
  python3 -m cufold bench "$suite" $extra --no-raw --no-progress --out "$OUT/$suite" ${BENCH_ARGS:-} 2>"$OUT/$suite/stderr.txt" \
    | tail -40
done
