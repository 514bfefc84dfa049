#!/usr/bin/env bash
# A/B benchmarks in one GPU call: each suite run on the working tree, then on a base tree, the
# same machine, one after the other; a case-by-case table of the axes suite closes the log.
# Here, before the call (the base: HEAD's src, ignored, carried):
#   rm -rf .basesrc && mkdir .basesrc && git archive HEAD src | tar x -C .basesrc
#   grep -qx /.basesrc/ .git/info/exclude || echo /.basesrc/ >> .git/info/exclude
# On the GPU machine (carry .whl and .basesrc), a suite per argument, its options after a colon:
#   bash tools/gpu_ab.sh "axes:--layouts A,z" "reduce:--sizes 24,28 --dtypes float32,int32"
# Results under $OUT/<suite>-new and $OUT/<suite>-base (tar them: the device tool returns 8 files).
set -u
OUT=${OUT:-/tmp/cufold-out}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .site .whl/*.whl 2>/dev/null || exit 1
export PYTHONUNBUFFERED=1
for tree in new base; do
  src=$PWD/src; [ $tree = base ] && src=$PWD/${BASE:-.basesrc/src}
  for arg in "$@"; do
    suite=${arg%%:*}; opts=""; [ "$arg" != "$suite" ] && opts=${arg#*:}
    mkdir -p "$OUT/$suite-$tree"; t=$(date +%s)
    PYTHONPATH=$PWD/.site:$src timeout ${SUITE_TIMEOUT:-240} python3 -m cufold bench $suite $opts --out "$OUT/$suite-$tree" \
      > "$OUT/$suite-$tree/stdout.txt" 2> "$OUT/$suite-$tree/stderr.txt"
    echo "== $suite $tree rc=$? $(( $(date +%s) - t )) s"
    grep -E "PASS|MISS" "$OUT/$suite-$tree/stdout.txt" | cut -c1-200
  done
done
if [ -f "$OUT/axes-new/results.json" ] && [ -f "$OUT/axes-base/results.json" ]; then
  PYTHONPATH=$PWD/.site:$PWD/src python3 - "$OUT" <<'PY'
import json, sys
new, base = (json.load(open("%s/axes-%s/results.json" % (sys.argv[1], t))) for t in ("new", "base"))
old = {(r["layout"], str(r["axis"]), r["reduction"]): r for r in base["records"]}
print("%-20s %-8s %-7s %-22s %8s %8s %8s %6s" % ("layout", "axis", "op", "launched (new)", "new", "base", "torch", "xtorch"))
for r in new["records"]:
    k = (r["layout"], str(r["axis"]), r["reduction"])
    if k in old:
        c, t = r["cufold"]["gpu_us"], r["torch"]["gpu_us"]
        plan = r.get("launched") or r["plan"]
        print("%-20s %-8s %-7s %-22s %8.1f %8.1f %8.1f %6.2f" % (k + (plan, c, old[k]["cufold"]["gpu_us"], t, t / c)))
PY
fi
