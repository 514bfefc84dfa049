#!/usr/bin/env bash
# Several source trees (branches, commits, the working tree) in one GPU call: each tree's tests
# and benchmark suites in turn, on the same machine, then the axes suite side by side
# (trees_table.py). Here, before the call (each ref's src archived under .trees/<ref>, ignored,
# carried):
#   bash tools/gpu_trees.sh prepare main argmax-rising fill-slots
# On the GPU machine (carry .whl and .trees), a suite per argument, its options after a colon:
#   bash tools/gpu_trees.sh run "axes:--layouts y --reductions sum,max,argmax --quick --no-raw"
# TREES="dir ..." (each holding a src/; default .trees/*) and NAMES="name ..." (default: the
# dirs' names) choose the trees (gpu_ab.sh: the working tree and .basesrc). TESTS="tests/..."
# first runs those test files on every tree (TEST_TIMEOUT seconds each, 12 workers). Results
# under $OUT/<name>/<suite> and $OUT/<name>/pytest.log (tar them: the device tool returns 8 files).
set -u
case "${1:-}" in
  prepare)
    shift
    grep -qx /.trees/ .git/info/exclude 2>/dev/null || echo /.trees/ >> .git/info/exclude
    rm -rf .trees && mkdir .trees
    for ref in "$@"; do
      dir=.trees/$(echo "$ref" | tr '/' '_')
      mkdir -p "$dir" && git archive "$ref" src | tar x -C "$dir" || exit 1
      echo "$dir: $(git log --oneline -1 "$ref" | cut -c1-100)"
    done
    exit 0 ;;
  run) shift ;;
  *) echo "usage: $0 prepare REF... | run SUITE[:OPTIONS]..." >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/cufold-out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl 2>/dev/null || exit 1
export PYTHONUNBUFFERED=1
read -r -a trees <<< "${TREES:-$(echo .trees/*/)}"
read -r -a names <<< "${NAMES:-}"
ran=()
for i in "${!trees[@]}"; do
  dir=${trees[$i]%/}; name=${names[$i]:-$(basename "$dir")}; mkdir -p "$OUT/$name"; ran+=("$name")
  if [ -n "${TESTS:-}" ]; then
    t=$(date +%s)
    PYTHONPATH=$PWD/.site:$PWD/$dir/src timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -n 12 -p no:cacheprovider \
      $TESTS > "$OUT/$name/pytest.log" 2>&1
    echo "== $name tests rc=$? $(( $(date +%s) - t )) s: $(tail -1 "$OUT/$name/pytest.log")"
  fi
  for arg in "$@"; do
    suite=${arg%%:*}; opts=""; [ "$arg" != "$suite" ] && opts=${arg#*:}
    mkdir -p "$OUT/$name/$suite"; t=$(date +%s)
    PYTHONPATH=$PWD/.site:$PWD/$dir/src timeout ${SUITE_TIMEOUT:-240} python3 -m cufold bench $suite $opts \
      --out "$OUT/$name/$suite" > "$OUT/$name/$suite/stdout.txt" 2> "$OUT/$name/$suite/stderr.txt"
    echo "== $name $suite rc=$? $(( $(date +%s) - t )) s"
    grep -E "PASS|MISS" "$OUT/$name/$suite/stdout.txt" | cut -c1-160
  done
done
PYTHONPATH=$PWD/.site:$PWD/src python3 "$(dirname "$0")/trees_table.py" "$OUT" "${ran[@]}"
