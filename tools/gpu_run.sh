#!/usr/bin/env bash
# One batched GPU session: environment, the test suite on the real GPU, compute-sanitizer
# over each device algorithm, and the benchmarks. Usage (on the GPU machine, repo root):
#   bash tools/gpu_run.sh [tests] [sanitize] [bench-reduce] [bench-scan] [extra pytest args via PYTEST_ARGS]
# Needs .whl/ (../shared/tools/gpu-wheels.sh) for numpy<2.5. Writes logs under $OUT.
set -u
OUT=${OUT:-/tmp/cufold-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1
export CUFOLD_CACHE_DIR=${CUFOLD_CACHE_DIR:-/tmp/cufold-cache}
summary=()
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import numba, numba_cuda, numpy, torch, cupy; print('numba-cuda', numba_cuda.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/gpu.txt"
for phase in "$@"; do
  start=$(date +%s)
  case $phase in
    tests)
      python3 -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} tests 2>&1 | tee "$OUT/pytest.log" | tail -40
      summary+=("tests: $(grep -E '[0-9]+ (passed|failed)' "$OUT/pytest.log" | tail -1)") ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_targets.py > "$OUT/sanitize-$tool.log" 2>&1
        rc=$?; summary+=("sanitize $tool: rc=$rc $(grep -c 'ERROR SUMMARY: 0' "$OUT/sanitize-$tool.log") clean summaries; $(tail -1 "$OUT/sanitize-$tool.log")")
      done ;;
    bench-reduce|bench-scan)
      suite=${phase#bench-}
      python3 -m cufold bench "$suite" --out "$OUT/bench-$suite" ${BENCH_ARGS:-} 2>"$OUT/bench-$suite.err" | tee "$OUT/bench-$suite.txt" | tail -60
      summary+=("bench $suite: rc=${PIPESTATUS[0]}") ;;
    *) python3 - <<<"$phase" ;;
  esac
  summary+=("  ($phase took $(( $(date +%s) - start )) s)")
done
echo "==================== summary"
printf '%s\n' "${summary[@]}"
