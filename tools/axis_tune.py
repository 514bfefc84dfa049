"""Occupancy against loads in flight for the axis kernels: one configuration per process.

    CUFOLD_CACHE=0 python tools/axis_tune.py MIN_BLOCKS UNROLL_SMALL

``MIN_BLOCKS`` (the launch bound: blocks of 256 an SM, so 64 registers at 4, 40 at 6, 32 at
8) and ``UNROLL_SMALL`` (loads of 4-byte items issued before their combines) are set before
any kernel compiles; prints the GPU time of outer-axis reductions next to torch's.
"""
import sys

import torch

import cufold
from cufold.device import axis as A
from gpu_timing import gpu_us

A.MIN_BLOCKS, A.UNROLL_SMALL = int(sys.argv[1]), int(sys.argv[2])
x = torch.rand(8192, 8192, device="cuda")
z = torch.rand(1 << 24, 4, device="cuda")
CASES = [("z.sum(0)", lambda: cufold.sum(z, axis=0), lambda: z.sum(0)),
         ("z.max(0)", lambda: cufold.max(z, axis=0), lambda: z.amax(0)),
         ("x.sum(0)", lambda: cufold.sum(x, axis=0), lambda: x.sum(0)),
         ("x.mean(0)", lambda: cufold.mean(x, axis=0), lambda: x.mean(0)),
         ("x.max(0)", lambda: cufold.max(x, axis=0), lambda: x.amax(0)),
         ("x[::2].mean(0)", lambda: cufold.mean(x[::2], axis=0), lambda: x[::2].mean(0)),
         ("x.argmax(0)", lambda: cufold.argmax(x, axis=0), lambda: x.argmax(0))]


cells = []
for name, mine, theirs in CASES:
    c, t = gpu_us(mine), gpu_us(theirs)
    cells.append("%s %.1f/%.1f" % (name, c, t))
print("blocks %d unroll %2d | %s" % (A.MIN_BLOCKS, A.UNROLL_SMALL, " | ".join(cells)), flush=True)
