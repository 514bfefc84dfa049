"""Occupancy against loads in flight for the axis kernels: one configuration per process.

    CUFOLD_CACHE=0 python tools/axis_tune.py MIN_BLOCKS UNROLL_SMALL

``MIN_BLOCKS`` (the launch bound: blocks of 256 an SM, so 64 registers at 4, 40 at 6, 32 at
8) and ``UNROLL_SMALL`` (loads of 4-byte items issued before their combines) are set before
any kernel compiles; prints the GPU time of outer-axis reductions next to torch's.
"""
import sys

from axis_cases import array, case
from cufold.device import axis as A
from gpu_timing import gpu_us

A.MIN_BLOCKS, A.UNROLL_SMALL = int(sys.argv[1]), int(sys.argv[2])
x, z = array("x"), array("z")
CASES = [case("z.sum(0)", "sum", z, 0), case("z.max(0)", "max", z, 0), case("x.sum(0)", "sum", x, 0),
         case("x.mean(0)", "mean", x, 0), case("x.max(0)", "max", x, 0),
         case("x[::2].mean(0)", "mean", x[::2], 0), case("x.argmax(0)", "argmax", x, 0)]


cells = []
for name, mine, theirs in CASES:
    c, t = gpu_us(mine), gpu_us(theirs)
    cells.append("%s %.1f/%.1f" % (name, c, t))
print("blocks %d unroll %2d | %s" % (A.MIN_BLOCKS, A.UNROLL_SMALL, " | ".join(cells)), flush=True)
