"""Scans down few or many long columns (``cumsum(axis=0)`` of C-order float32): the planner's
choice (the column strips where strips fill the GPU, ``strips``), the column tiles with the
planner's tile and with forced ones (columns a tile x rows a thread), the
3-launch ``reduce_then_scan`` form and torch.cumsum (64 columns or more) beside; GPU time over rotated inputs and
the percentage of the floor (read + write at ``--copy`` GB/s).

    PYTHONPATH=src python tools/colscan_probe.py [--copy 4147] [--once]   # --once: one call each, for ncu
    PYTHONPATH=src python tools/colscan_probe.py --strips    # the strips' widths and bytes a thread, in turns

``--strips``: only the shapes with 4096+ columns, the column strips of each width (32, 16, 8)
and each STRIP_BYTES (32, 48: accumulator bytes a thread holds a chunk), float32 and float64,
each setting twice in turns (drift shows as a difference between the two rounds).
"""
import sys

import torch

from cufold.device import scan as S, scan_axis as SA
import cufold
from gpu_timing import rotating_us

SHAPES = [(1 << 20, 16), (4096, 4096), (2048, 8192), (1 << 22, 4), (1 << 18, 64)]
# (columns a tile, rows a thread[, threads a block]); None: the planner's
TILES = [None, (16, 16), (8, 32), (16, 16, 512)]
once = "--once" in sys.argv
copy = float(sys.argv[sys.argv.index("--copy") + 1]) if "--copy" in sys.argv else 4147.0
planned = SA._column_tiles


def forced(tile):
    def column_tiles(lay, in_vt, acc_vt):
        if tile is None:
            return planned(lay, in_vt, acc_vt)
        tc = min(tile[0], 1 << max(0, (lay.C - 1).bit_length()))
        return SA.column_tile_grid(lay, tc, (tile[2] if len(tile) > 2 else SA._threads()) // tc, tile[1])
    return column_tiles


def fresh():
    S._programs_of_scans.clear()


def strips_only():
    """Each (width, bytes) setting of the column strips, twice in turns, float32 and float64."""
    settings = [(w, nb) for w in (32, 16, 8) for nb in (32, 48)]
    widths, nbytes = SA.STRIP_WIDTHS, SA.STRIP_BYTES
    for shape in [s for s in SHAPES if s[1] >= 4096]:
        for dtype in (torch.float32, torch.float64):
            n = shape[0] * shape[1]
            size = torch.tensor([], dtype=dtype).element_size()
            xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(max(2, -(-(256 << 20) // (size * n))))]
            floor_us = 2 * size * n / copy / 1e3
            want = torch.cumsum(xs[0].double(), 0)
            times = {}
            for _ in range(2):
                for w, nb in settings:
                    SA.STRIP_WIDTHS, SA.STRIP_BYTES = (w,), nb
                    fresh()
                    got = cufold.cumsum(xs[0], axis=0)
                    err = ((got.double() - want).abs().max() / want.abs().max()).item()
                    assert err < 1e-5, (shape, w, nb, err)
                    times.setdefault((w, nb), []).append(rotating_us(lambda x: cufold.cumsum(x, axis=0), xs))
            for (w, nb), us in times.items():
                print("%-14s %-8s strips %2d wide, %2d B   %7.1f %7.1f us  %4.0f%%" % (
                    "x".join(map(str, shape)), str(dtype)[6:], w, nb, us[0], us[1], 100 * floor_us / min(us)), flush=True)
    SA.STRIP_WIDTHS, SA.STRIP_BYTES = widths, nbytes
    fresh()


if "--strips" in sys.argv:
    strips_only()
    sys.exit(0)

print("%-14s %-22s %9s %7s" % ("shape", "variant", "us", "%floor"))
for shape in SHAPES:
    n = shape[0] * shape[1]
    count = max(2, -(-(256 << 20) // (4 * n)))               # inputs past the L2, rotated
    xs = [torch.randn(shape, device="cuda") for _ in range(count)]
    floor_us = 8 * n / copy / 1e3
    runs = [] if shape[1] < 64 else [("torch", lambda x: torch.cumsum(x, 0))]   # (torch: 0.37 s for 16 columns)
    runs.append(("reduce_then_scan", lambda x: cufold.cumsum(x, axis=0, algorithm="reduce_then_scan")))
    runs.append(("planner (strips?)", "planner"))
    for tile in TILES:
        runs.append(("tiles %s" % ("planner" if tile is None else "x".join(map(str, tile))), tile))
    for name, how in runs:
        if how == "planner":
            SA.COLUMN_STRIPS = True
            fresh()
            fn = lambda x: cufold.cumsum(x, axis=0)
        elif not callable(how):
            SA.COLUMN_STRIPS = False            # the column tiles, whatever the strips
            SA._column_tiles = forced(how)
            fresh()
            fn = lambda x: cufold.cumsum(x, axis=0)
        else:
            fn = how
        want = torch.cumsum(xs[0].double(), 0)
        got = fn(xs[0])
        err = ((got.double() - want).abs().max() / want.abs().max()).item()
        if once:
            torch.cuda.synchronize()
            print("%-14s %-22s err %.1e" % ("x".join(map(str, shape)), name, err))
            continue
        us = rotating_us(fn, xs)
        print("%-14s %-22s %9.1f %6.0f%%  err %.1e" % ("x".join(map(str, shape)), name, us, 100 * floor_us / us, err),
              flush=True)
    SA._column_tiles = planned
    SA.COLUMN_STRIPS = True
    fresh()
