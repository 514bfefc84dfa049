#!/usr/bin/env bash
# The GPU validation batch: the whole test suite on the real GPU and compute-sanitizer's
# memcheck, racecheck and synccheck over every device algorithm, all at once (the suite
# compiles on 12 CPU workers while the three sanitizer processes share the GPU).
# Usage on the GPU machine, repo root, with .whl carried: bash tools/gpu_check.sh
set -u
OUT=${OUT:-/tmp/cufold-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for tool in memcheck racecheck synccheck; do
  compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_targets.py > "$OUT/sanitize-$tool.log" 2>&1 &
done
timeout ${TEST_TIMEOUT:-480} python3 -m pytest -n ${WORKERS:-12} -q -p no:cacheprovider ${PYTEST_ARGS:-} tests > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"
wait
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -40
tail -3 "$OUT/pytest.log"
for tool in memcheck racecheck synccheck; do
  echo "$tool: $(grep -E 'ERROR SUMMARY|FAILURES' "$OUT/sanitize-$tool.log" | tr '\n' ' ')"
done
