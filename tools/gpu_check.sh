#!/usr/bin/env bash
# The GPU validation batch: the whole test suite on the real GPU and compute-sanitizer's
# memcheck, racecheck and synccheck over every device algorithm, all at once (the suite
# compiles on 12 CPU workers while the three sanitizer processes share the GPU).
# Usage on the GPU machine, repo root, with .whl carried: bash tools/gpu_check.sh
# PART=1 and PART=2 run halves of the test files (PART=all, the default, runs every file);
# PART=files FILES="tests/test_a.py ..." runs the files named.
# Results are logged with -v, so failures are named as they happen even if the time limit
# cuts the run; the 25 slowest tests close the log.
set -u
OUT=${OUT:-/tmp/cufold-out}; mkdir -p "$OUT"
# (installed once: two halves may run side by side on a machine of two GPUs)
[ -d .site/numpy ] || python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1
# The library's disk cache of kernels (on by default): the workers share what one compiled,
# and the suite exercises both compiling and loading. CUFOLD_CACHE=0 for neither.
export CUFOLD_CACHE_DIR=${CUFOLD_CACHE_DIR:-/tmp/cufold-cache}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
TOOLS=$([ "${SANITIZE:-1}" = 1 ] && echo "memcheck racecheck synccheck")   # SANITIZE=0: tests only
for tool in $TOOLS; do
  compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_targets.py > "$OUT/sanitize-$tool.log" 2>&1 &
done
# Since session 14 the whole suite (2200+ tests) no longer fits one command on an H100 (cut at
# 77% after 520 s with 14 workers): run PART=1 and PART=2 in two commands. PART 1 is the
# layers and the oldest device families; PART 2 the rest (by key, axes, new families).
PART1="warp|block|thread|ops_values|device_reduce|device_scan|launch|device_arrays|simulator|fingerprint|demo|readme"
case "${PART:-all}" in
  1) FILES=$(ls tests/test_*.py | grep -E "test_($PART1).py") ;;
  2) FILES=$(ls tests/test_*.py | grep -vE "test_($PART1).py") ;;
  files) ;;                       # FILES given by the caller: the test files a change touched
  *) FILES=tests ;;
esac
timeout ${TEST_TIMEOUT:-480} python3 -m pytest -n ${WORKERS:-12} -v -rf -p no:cacheprovider --durations=25 \
  ${PYTEST_ARGS:-} $FILES > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"
wait
grep -E "FAILED|ERROR" "$OUT/pytest.log" | sort -u | head -40
echo "passed: $(grep -c PASSED "$OUT/pytest.log")"
tail -1 "$OUT/pytest.log"
for tool in $TOOLS; do
  echo "$tool: $(grep -E 'ERROR SUMMARY|FAILURES' "$OUT/sanitize-$tool.log" | tr '\n' ' ')"
done
