"""Schedules of the outer-axis (columns) kernels against each other and torch, one process,
on a GPU: for each case of ``bench axes`` that misses torch, the planner's schedule and
variants of it (threads along the reduced axis ``ty``, outputs a thread ``per``, a grid
cap), each timed on inputs rotated through more memory than L2.

    PYTHONPATH=src python tools/axis_variants.py            # every case
    PYTHONPATH=src python tools/axis_variants.py z y.sum    # cases whose name starts so
"""
import sys

import numpy as np

import cufold.device as D
from axis_cases import REDUCTIONS, array
from gpu_timing import rotating_us
from cufold.device import axis as A
from cufold.host import programs as P

_schedule = A.schedule
FORCE = {}                       # field -> value, applied to the planner's columns schedules


def forced(layout, lim, indexed=False):
    """The planner's schedule under FORCE's ``long_row`` (rows: a block a row from there), its
    columns ones with FORCE's ``ty``, ``per``, ``nt`` (threads a block), ``split`` (kept as
    given with ``"fit": False``, else cut to one round of blocks as the planner does) and
    ``grid``."""
    if "long_row" in FORCE:
        lim = lim._replace(long_row=FORCE["long_row"])
        if layout.kind == "rows":
            return _schedule(layout, lim, indexed)
    s = _schedule(layout, lim, indexed)
    if s.kernel != "columns" or not FORCE:
        return s
    lim = lim._replace(nt=FORCE.get("nt", lim.nt))
    m = int(np.prod([d[0] for d in layout.keep], dtype=np.int64))
    k = int(np.prod([d[0] for d in layout.red], dtype=np.int64))
    ty = FORCE.get("ty", s.ty)
    f = A.columns_schedule(m, k, ty, FORCE.get("per", 1 if ty > 1 else s.per), lim)
    if "split" in FORCE:
        chunk = -(-k // FORCE["split"])
        split = -(-k // chunk)
        f = f._replace(split=split, chunk=chunk, grid=min(-(-m // f.tx) * split, lim.blocks * 32))
    return f._replace(grid=min(f.grid, FORCE.get("grid", f.grid)))


_one_round = A.one_round
A.schedule = forced
A.one_round = lambda sched, m, k, slots: sched if FORCE.get("fit", True) is False else _one_round(sched, m, k, slots)


def fresh():
    """Forget planned Programs (a module setting changes what the planner makes)."""
    for r in vars(D).values():
        if isinstance(r, D._Reduction):
            r.programs = P.Programs(r._plan, "cufold." + r.name, 1024)
    D._by_op.clear()


def copies(name, nbytes_total=400 << 20):
    """Tensors of base ``name`` filling ``nbytes_total`` (at least 2): more than L2."""
    x = array(name)
    n = max(2, -(-nbytes_total // (x.numel() * x.element_size())))
    return [x] + [array(name) for _ in range(n - 1)]


y, z, x = copies("y"), copies("z"), copies("x")
SUM, MAX, MEAN, ARGMAX = (REDUCTIONS[r] for r in ("sum", "max", "mean", "argmax"))
xh = [a[:, ::2] for a in x]
ROWS = [{}, {"long_row": 8192}, {"long_row": 16384}]
CASES = [
    ("x[:,::2].argmax(1)", xh, 1, ARGMAX, ROWS),
    ("x[:,::2].sum(1)", xh, 1, SUM, ROWS),
    ("x.argmax(1)", x, 1, ARGMAX, ROWS),
    ("x.sum(1)", x, 1, SUM, ROWS),
    ("x.max(1)", x, 1, MAX, ROWS),
    ("z.sum(0)", z, 0, SUM, [{}, {"ty": 128}]),
    ("z.max(0)", z, 0, MAX, [{}]),
    ("x.sum(0)", x, 0, SUM, [{}]),
    ("x.max(0)", x, 0, MAX, [{}]),
    ("y.sum(0)", y, 0, SUM, [{}, {"ty": 1}, {"ty": 2}, {"ty": 8}, {"grid": 528}, {"per": 2}, {"split": 2, "fit": False},
                             {"nt": 128}, {"nt": 64}]),
    ("y.max(0)", y, 0, MAX, [{}, {"ty": 1}, {"ty": 2}, {"ty": 8}, {"per": 2}, {"grid": 528}, {"split": 2, "fit": False},
                             {"split": 3, "fit": False}, {"nt": 128}, {"nt": 128, "split": 2, "fit": False}, {"nt": 64}]),
    ("y.mean(0)", y, 0, MEAN, [{}, {"ty": 1}, {"ty": 2}]),
    ("y.mean(1)", y, 1, MEAN, [{}, {"per": 1}, {"per": 2}]),
    ("y.sum(1)", y, 1, SUM, [{}, {"per": 1}, {"per": 2}, {"grid": 528}, {"grid": 1056}]),
    ("y.max(1)", y, 1, MAX, [{}, {"per": 1}, {"per": 2}]),
    ("y.argmax(1)", y, 1, ARGMAX, [{}, {"per": 1}, {"per": 2}]),
    ("y.sum((0,1))", y, (0, 1), SUM, [{}, {"ty": 1}, {"ty": 2}, {"ty": 4}, {"ty": 16}]),
    ("y.max((0,1))", y, (0, 1), MAX, [{}, {"ty": 2}, {"ty": 4}]),
]

only = sys.argv[1:]
print("%-14s %-22s %9s %9s %6s" % ("case", "variant", "cufold", "torch", "xtorch"), flush=True)
for name, xs, ax, (mine, theirs), variants in CASES:
    if only and not any(name.startswith(o) for o in only):
        continue
    t = rotating_us(lambda a: theirs(a, ax), xs)
    for v in variants:
        FORCE.clear()
        FORCE.update(v)
        fresh()
        c = rotating_us(lambda a: mine(a, axis=ax), xs)
        print("%-14s %-22s %9.1f %9.1f %6.2f" % (name, v or "planner", c, t, t / c), flush=True)
