"""The axes suite of several trees side by side (``gpu_trees.sh``'s last step):

    python tools/trees_table.py OUT [TREE ...]

reads ``OUT/<tree>/axes/results.json`` for the trees named (default: every one, by name) and
prints, per case, each tree's cufold time (us), torch's (from the first tree) and what the
first tree launched, then each tree's count of cases below torch."""
import json
import os
import sys


def load(out, names=None):
    trees = {}
    for name in names or sorted(os.listdir(out)):
        path = os.path.join(out, name, "axes", "results.json")
        if os.path.isfile(path):
            with open(path) as f:
                trees[name] = {(r["layout"], str(r["axis"]), r["reduction"]): r for r in json.load(f)["records"]}
    return trees


def us(record, lib):
    rec = (record or {}).get(lib) or {}
    return rec.get("gpu_us") if rec.get("status") == "ok" else None


def table(trees):
    names = list(trees)
    if not names:
        return "no axes results"
    first = trees[names[0]]
    lines = ["%-20s %-8s %-7s " % ("layout", "axis", "op") + " ".join("%14s" % n[:14] for n in names)
             + " %8s  %s" % ("torch", "launched (%s)" % names[0])]
    below = dict.fromkeys(names, 0)
    for key, rec in first.items():
        cells = []
        for n in names:
            t, c = us(trees[n].get(key), "torch"), us(trees[n].get(key), "cufold")
            cells.append("%14s" % ("%.1f" % c if c else "-"))
            below[n] += bool(c and t and t / c < 1.0)
        torch_us = us(rec, "torch")
        lines.append("%-20s %-8s %-7s " % key + " ".join(cells) + " %8s  %s" % (
            "%.1f" % torch_us if torch_us else "-", rec.get("launched") or rec.get("plan", "")))
    lines.append("cases below torch: " + ", ".join("%s %d" % (n, below[n]) for n in names))
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(load(sys.argv[1], sys.argv[2:])))
