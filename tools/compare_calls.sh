#!/usr/bin/env bash
# Per-call host time of the same calls from two source trees, on a GPU: host_costs.py
# rows taken in turn from each tree (alternating runs, to see the noise).
#   bash tools/compare_calls.sh OLD_SRC NEW_SRC [host_costs.py options]
set -u
old=$1; new=$2; shift 2
for round in 1 2; do
  for tree in "$old" "$new"; do
    echo "== $tree (round $round)"
    PYTHONPATH=$tree:$PWD/tools:${PYTHONPATH:-} python3 tools/host_costs.py "$@" | grep -E "^(torch|cufold)"
  done
done
