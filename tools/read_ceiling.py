"""How close to ``bench axes``' floor (the bytes read at copy bandwidth) any single read of
the data can come, by size: a whole-array float32 sum (and argmax) of y's 48 MiB
(64 x 3 x 65536) and of A's 256 MiB (2^26 items) by cufold, torch, CuPy and CUB
(``cuda.compute.reduce_into``), and a device-to-device copy of the same bytes; inputs
rotated through more than L2. GPU only:

    PYTHONPATH=.site:src python3 tools/read_ceiling.py [N ...]   (items; default y's and A's)
"""
import os
import sys
import numpy as np
import torch
import cupy
sys.path.insert(0, os.path.dirname(__file__))
import cufold
import cuda.compute as cc
from gpu_timing import rotating_us
COPY_BW = 4.19e6   # bytes per us: bench axes' copy bandwidth on an H200 (its floor)
for n in [int(a) for a in sys.argv[1:]] or (64 * 3 * 65536, 1 << 26):
    k = max(4, (400 << 20) // (4 * n))
    xs = [torch.rand(n, device="cuda") for _ in range(k)]
    cps = [cupy.asarray(x) for x in xs]
    out = torch.empty(1, device="cuda")
    made = cc.make_reduce_into(d_in=cps[0], d_out=cupy.asarray(out), op=cc.OpKind.PLUS, h_init=np.zeros(1, np.float32))
    nb = made(temp_storage=None, d_in=cps[0], d_out=cupy.asarray(out), num_items=n, op=cc.OpKind.PLUS, h_init=np.zeros(1, np.float32))
    temp = cupy.zeros(max(1, int(nb)), np.uint8); o = cupy.asarray(out)
    dst = torch.empty(n, device="cuda")
    floor = 4 * n / COPY_BW
    rows = [("cufold.sum", rotating_us(lambda a: cufold.sum(a), xs)),
            ("torch.sum", rotating_us(lambda a: a.sum(), xs)),
            ("cupy.sum", rotating_us(lambda a: a.sum(), cps)),
            ("CUB reduce_into", rotating_us(lambda a: made(temp_storage=temp, d_in=a, d_out=o, num_items=n, op=cc.OpKind.PLUS, h_init=np.zeros(1, np.float32)), cps)),
            ("cufold.argmax", rotating_us(lambda a: cufold.argmax(a), xs)),
            ("torch.argmax", rotating_us(lambda a: a.argmax(), xs)),
            ("copy (read+write)", rotating_us(lambda a: dst.copy_(a), xs))]
    print("n = %d (%.1f MiB), floor (read at copy bandwidth) %.1f us" % (n, 4 * n / 2**20, floor))
    for name, t in rows:
        gbs = (8 if name.startswith("copy") else 4) * n / t / 1e3
        print("  %-18s %7.1f us  %6.0f GB/s  %.2f of the floor" % (name, t, gbs, (2 if name.startswith("copy") else 1) * floor / t))
