#!/usr/bin/env bash
# The benchmark batch for the GPU machine (repo root, .whl carried for numpy<2.5):
#   bash tools/gpu_bench.sh reduce scan bykey hist segmented calls
# Each suite's default run takes under 4 minutes (its --dry-run prints the estimate);
# BENCH_ARGS=--full sweeps every size and algorithm (tens of minutes a suite).
# Each suite writes its table, JSON and plots under $OUT/<suite>; copy them into bench/results/.
set -u
OUT=${OUT:-/tmp/cufold-out}
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1
for suite in "$@"; do
  mkdir -p "$OUT/$suite"
  python3 -m cufold bench "$suite" --no-raw --no-progress --out "$OUT/$suite" ${BENCH_ARGS:-} 2>"$OUT/$suite/stderr.txt" \
    | tail -40
done
