"""Full reductions of views in contiguous runs (``A[::2]``, a permuted ``y``'s argmax), cufold
against torch and against the same reduction of a contiguous copy, GPU time per call over
three rotating inputs (``gpu_timing.rotating_us``), with the route cufold's planner took.
Run it twice to compare the device reduce over runs with the rows kernel:

    PYTHONPATH=src:tools python tools/runs_probe.py
    CUFOLD_AXIS_RUNS=0 PYTHONPATH=src:tools python tools/runs_probe.py
    CUFOLD_AXIS_RETILE=0 PYTHONPATH=src:tools python tools/runs_probe.py   # argmaxes of A.T, y's perms: rows
"""
import sys

import torch

from cufold.bench.axes import launched_plan
from axis_cases import REDUCTIONS, SHAPES
from gpu_timing import rotating_us


ONLY = sys.argv[1:]          # reductions to time (all where none is named)


def row(label, views, copies, reduction):
    if ONLY and reduction not in ONLY:
        return
    mine, theirs = REDUCTIONS[reduction]
    first = []
    path = launched_plan(lambda: first.append(mine(views[0])))      # (the call that plans)
    got, want = float(first[0].item()), float(theirs(views[0], None).item())
    ok = abs(got - want) <= 1e-3 * max(1.0, abs(want))
    us = rotating_us(lambda v: mine(v), views)
    them = rotating_us(lambda v: theirs(v, None), views)
    copy = rotating_us(lambda v: mine(v), copies)
    floor_us = views[0].numel() * 4 / 4.17e6       # the touched bytes at ~4.17 TB/s (H200 copy)
    print("%-26s %-30s cufold %7.1f  torch %7.1f  x%.2f  copy %7.1f (%.2f)  floor %.0f%%  %s"
          % (label, path, us, them, them / us, copy, us / copy, 100 * floor_us / us, "ok" if ok else "WRONG"))


A = [torch.rand(*SHAPES["x"], device="cuda") for _ in range(3)]
halves = [a[::2] for a in A]
half_copies = [h.contiguous() for h in halves]
for red in ("sum", "max", "argmax", "mean"):
    row("A[::2] %s" % red, halves, half_copies, red)
del half_copies
for red in ("argmax",):
    row("A.T %s" % red, [a.T for a in A], A, red)          # (retiled runs; the copy is A itself)
del halves
y = [torch.rand(*SHAPES["y"], device="cuda") for _ in range(3)]
for perm in ((1, 0, 2), (0, 2, 1), (2, 1, 0), (0, 1, 2)):
    views = [t.permute(*perm) for t in y]
    row("y.permute%s argmax" % (perm,), views, [v.contiguous() for v in views], "argmax")
