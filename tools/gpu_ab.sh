#!/usr/bin/env bash
# A/B benchmarks in one GPU call: each suite on the working tree ("new"), then on a base tree
# ("base": HEAD's src, ignored, carried), the same machine; the axes suite side by side closes
# the log. gpu_trees.sh with these two trees. Here, before the call:
#   rm -rf .basesrc && mkdir .basesrc && git archive HEAD src | tar x -C .basesrc
#   grep -qx /.basesrc/ .git/info/exclude || echo /.basesrc/ >> .git/info/exclude
# On the GPU machine (carry .whl and .basesrc), a suite per argument, its options after a colon:
#   bash tools/gpu_ab.sh "axes:--layouts A,z" "reduce:--sizes 24,28 --dtypes float32,int32"
# Results under $OUT/new/<suite> and $OUT/base/<suite> (tar them: the device tool returns 8 files).
TREES=". .basesrc" NAMES="new base" exec bash "$(dirname "$0")/gpu_trees.sh" run "$@"
