"""Schedules of the outer-axis (columns) kernels against each other and torch, one process,
on a GPU: for each case of ``bench axes`` that misses torch, the planner's schedule and
variants of it (threads along the reduced axis ``ty``, outputs a thread ``per``, a grid
cap), each timed on inputs rotated through more memory than L2.

    PYTHONPATH=src python tools/axis_variants.py            # every case
    PYTHONPATH=src python tools/axis_variants.py z y.sum    # cases whose name starts so
"""
import statistics
import sys

import torch

import cufold
import cufold.device as D
from cufold.device import axis as A
from cufold.host import programs as P

_schedule = A.schedule
FORCE = {}                       # field -> value, applied to the planner's columns schedules


def forced(layout, lim):
    s = _schedule(layout, lim)
    if s.kernel != "columns" or not FORCE:
        return s
    ty = FORCE.get("ty", s.ty)
    tx = s.nt // ty
    per = FORCE.get("per", 1 if ty > 1 else s.per)
    m = 1
    for d in layout.keep:
        m *= d[0]
    k = 1
    for d in layout.red:
        k *= d[0]
    tiles = -(-m // (tx * per))
    split = 1
    if tiles < lim.blocks:
        split = min(-(-lim.blocks // tiles), max(1, k // (ty * lim.min_items)), lim.max_split)
    chunk = -(-k // split)
    split = -(-k // chunk)
    grid = max(1, min(tiles * split, lim.blocks * 32))
    if "grid" in FORCE:
        grid = min(grid, FORCE["grid"])
    return s._replace(tx=tx, ty=ty, per=per, split=split, chunk=chunk, grid=grid)


A.schedule = forced


def fresh():
    """Forget planned Programs (a module setting changes what the planner makes)."""
    for r in vars(D).values():
        if isinstance(r, D._Reduction):
            r.programs = P.Programs(r._plan, "cufold." + r.name, 1024)
    D._by_op.__init__(256)


def rotating_us(fn, inputs, reps=24, batches=5):
    """GPU time per call of ``fn(x)`` over ``inputs`` in turn (queued behind a sleep)."""
    fn(inputs[0])
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(batches):
        torch.cuda._sleep(20_000_000)
        s.record()
        for i in range(reps):
            fn(inputs[i % len(inputs)])
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / reps)
    return statistics.median(times)


def copies(make, nbytes_total=400 << 20):
    x = make()
    n = max(2, -(-nbytes_total // (x.numel() * x.element_size())))
    return [x] + [make() for _ in range(n - 1)]


y = copies(lambda: torch.rand(64, 3, 65536, device="cuda"))
z = copies(lambda: torch.rand(1 << 24, 4, device="cuda"))
x = copies(lambda: torch.rand(8192, 8192, device="cuda"))
SUM = (cufold.sum, lambda a, ax: a.sum(ax))
MAX = (cufold.max, lambda a, ax: a.amax(ax))
MEAN = (cufold.mean, lambda a, ax: a.mean(ax))
ARGMAX = (cufold.argmax, lambda a, ax: a.argmax(ax))
CASES = [
    ("z.sum(0)", z, 0, SUM, [{}, {"ty": 128}]),
    ("z.max(0)", z, 0, MAX, [{}]),
    ("x.sum(0)", x, 0, SUM, [{}]),
    ("x.max(0)", x, 0, MAX, [{}]),
    ("y.sum(0)", y, 0, SUM, [{}, {"ty": 1}, {"ty": 2}, {"ty": 8}, {"grid": 528}]),
    ("y.max(0)", y, 0, MAX, [{}, {"ty": 1}, {"ty": 2}, {"ty": 8}]),
    ("y.mean(0)", y, 0, MEAN, [{}, {"ty": 1}, {"ty": 2}]),
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
