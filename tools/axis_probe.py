"""A few axis reductions once each (after a warm-up), for ncu: which kernel and schedule the
planner picks, and the GPU time of each next to torch's (``gpu_timing.gpu_us``).

    PYTHONPATH=src python tools/axis_probe.py            # times
    ncu --set full -k regex:axis python tools/axis_probe.py --once
"""
import sys

import torch

from cufold.device import axis as A
from axis_cases import array, case
from gpu_timing import gpu_us

once = "--once" in sys.argv
x, y, z = array("x"), array("y"), array("z")
CASES = [case("z.sum(axis=0)", "sum", z, 0), case("z.max(axis=0)", "max", z, 0),
         case("x.mean(axis=0)", "mean", x, 0), case("x.sum(axis=0)", "sum", x, 0),
         case("y.mean(axis=1)", "mean", y, 1), case("y.max(axis=1)", "max", y, 1)]


for name, mine, theirs in CASES:
    if once:
        mine()
        torch.cuda.synchronize()
        continue
    print("%-16s cufold %8.1f us  torch %8.1f us" % (name, gpu_us(mine), gpu_us(theirs)))
lim = A.limits(0)
print(lim)
for name, shape, strides, axes in [("z.sum(axis=0)", (1 << 24, 4), (4, 1), (0,)),
                                   ("x.sum(axis=0)", (8192, 8192), (8192, 1), (0,)),
                                   ("y.sum(axis=1)", (64, 3, 65536), (196608, 65536, 1), (1,))]:
    layout = A.plan_layout(shape, strides, axes, True, False)
    print(name, layout.kind, A.schedule(layout, lim) if layout.kind != "contiguous" else "")
