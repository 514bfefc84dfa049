"""Time cufold's device scans on a GPU against a copy, torch.cumsum and CUB, per
single-pass variant and tile, then hunt for look-back races. One short run
(about two minutes, most of it compiling):

    PYTHONPATH=src python3 tools/tune_scan.py           # everything below
    PYTHONPATH=src python3 tools/tune_scan.py --quick   # the defaults only, 2^28

For int32 and float32 inclusive scans at 2^28 (and 2^24): a device-to-device
copy of the same bytes (``dst.copy_(src)``: the floor), ``torch.cumsum``,
``cuda.compute.inclusive_scan`` (CUB's single-pass scan, when importable),
and cufold's ``single_pass`` per ``CUFOLD_SCAN_VARIANT`` / ``CUFOLD_TILE``,
and ``reduce_then_scan``. CUDA events, median of 20 after warm-ups, input
buffers rotated (each far larger than the 60 MiB L2), a ~100 us sleep queued
before each timed call so that the events time the GPU, not the launch.
Every result is checked against a reference (int32 exactly; float32 to a
relative 1e-4 of a float64 scan). Then the single-pass scan runs 50 times on
one 2^24 int32 input and each result is compared exactly: a race in the
look-back would show as an error that moves from run to run.
"""
import os
import sys
import time

import numpy as np
import torch

import cufold
from cufold.device import scan
from cufold.values import ValueType

REPS, WARMUP = 20, 3
SLEEP_CYCLES = 200_000          # ~100 us at H200 clocks: the GPU is busy when the events start

# (label, algorithm, CUFOLD_SCAN_VARIANT, CUFOLD_TILE); "" = the library's default.
DEFAULTS = [("single_pass", "single_pass", "", ""),
            ("reduce_then_scan", "reduce_then_scan", "", "")]
VARIANTS = [("single_pass", "single_pass", v, "") for v in
            ("blockid", "plain", "wide", "atomic", "blockid,plain")]
TILES = [("single_pass", "single_pass", "", t) for t in
         ("128x16", "512x16", "256x15", "128x24", "128x31", "256x24")]

PLAN = [  # (dtype, log2 n, cases)
    ("int32", 28, DEFAULTS + VARIANTS + TILES),
    ("float32", 28, DEFAULTS + VARIANTS[:1] + TILES[:2]),
    ("int32", 24, DEFAULTS + VARIANTS[:1] + TILES[:1]),
    ("float32", 24, DEFAULTS),
]
QUICK = [("int32", 28, DEFAULTS), ("float32", 28, DEFAULTS)]


def gpu_us(fn, pairs):
    """Median GPU time (us) of ``fn(x, y)`` over rotating (input, output) pairs."""
    for x, y in pairs[:WARMUP]:
        fn(x, y)
    torch.cuda.synchronize()
    times = []
    for i in range(REPS):
        x, y = pairs[i % len(pairs)]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        a.record()
        fn(x, y)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return float(np.median(times))


def check(dtype, got, ref):
    """'ok', or what is wrong."""
    if dtype == "int32":
        if torch.equal(got, ref):
            return "ok"
        bad = torch.nonzero(got != ref)
        return "WRONG at %d items, first %d" % (bad.numel(), int(bad[0]))
    err = ((got.double() - ref).abs() / ref.abs().clamp(min=1.0)).max().item()
    return "ok" if err < 1e-4 else "WRONG (rel. error %.2g)" % err


def env(variant, tile):
    for key, value in (("CUFOLD_SCAN_VARIANT", variant), ("CUFOLD_TILE", tile)):
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)


def cub_scan():
    """``fn(x, y)``: CUB's inclusive sum through cuda.compute, or None."""
    try:
        import cuda.compute as cc
    except Exception as e:  # noqa: BLE001
        print("# cuda.compute not importable: %s" % str(e).splitlines()[0][:80])
        return None
    kind = getattr(cc, "OpKind", None)
    op = kind.PLUS if kind is not None and hasattr(kind, "PLUS") else (lambda a, b: a + b)

    def fn(x, y):
        h_init = np.zeros(1, dtype=np.dtype(str(x.dtype).replace("torch.", "")))
        cc.inclusive_scan(x, d_out=y, op=op, init_value=h_init, num_items=x.numel())

    return fn


def row(dtype, logn, what, tile, us, copy_us, status):
    nbytes = 2 * (1 << logn) * 4
    print("%-8s 2^%-3d %-34s %-7s %9.1f %7.1f%% %7.0f  %s" % (
        dtype, logn, what, tile, us, 100.0 * copy_us / us, nbytes / us / 1e3, status), flush=True)


def run_plan(plan):
    cub = cub_scan()
    print("%-8s %-5s %-34s %-7s %9s %8s %7s  %s" % ("dtype", "n", "what", "tile", "us", "%copy",
                                                   "GB/s", "check"))
    for dtype, logn, cases in plan:
        n = 1 << logn
        tdt = getattr(torch, dtype)
        nb = 3 if logn >= 26 else 8                  # each input far larger than L2 at 2^28
        gen = torch.Generator(device="cuda").manual_seed(logn)
        if dtype == "int32":                         # |sums| < 2^31: no wrap-around to agree on
            xs = [torch.randint(-3, 4, (n,), device="cuda", dtype=tdt, generator=gen)
                  for _ in range(nb)]
            ref = torch.cumsum(xs[0], 0, dtype=torch.int32)
        else:
            xs = [torch.rand(n, device="cuda", dtype=tdt, generator=gen) for _ in range(nb)]
            ref = torch.cumsum(xs[0].double(), 0)
        ys = [torch.empty_like(xs[0]) for _ in range(2)]
        pairs = [(x, ys[i % 2]) for i, x in enumerate(xs)]
        copy_us = gpu_us(lambda x, y: y.copy_(x), pairs)
        row(dtype, logn, "copy", "-", copy_us, copy_us, "-")
        us = gpu_us(lambda x, y: torch.cumsum(x, 0, dtype=tdt, out=y), pairs)
        torch.cumsum(xs[0], 0, dtype=tdt, out=ys[0])
        row(dtype, logn, "torch.cumsum", "-", us, copy_us, check(dtype, ys[0], ref))
        if cub is not None:
            try:
                us = gpu_us(cub, pairs)
                cub(xs[0], ys[0])
                row(dtype, logn, "CUB (cuda.compute.inclusive_scan)", "-", us, copy_us,
                    check(dtype, ys[0], ref))
            except Exception as e:  # noqa: BLE001
                print("# CUB failed: %s" % str(e).splitlines()[0][:100])
                cub = None
        for label, alg, variant, tile in cases:
            env(variant, tile)
            vt = ValueType.of(np.dtype(dtype))
            shown = "%dx%d" % tuple(scan.tile_for(vt, vt))
            what = "%s [%s]" % (label, variant or "default")
            try:
                t0 = time.time()
                fn = lambda x, y: cufold.inclusive_scan(x, out=y, algorithm=alg)  # noqa: E731
                fn(xs[0], ys[0])
                torch.cuda.synchronize()
                compile_s = time.time() - t0
                us = gpu_us(fn, pairs)
                ys[0].zero_()
                fn(xs[0], ys[0])
                row(dtype, logn, what, shown, us, copy_us,
                    check(dtype, ys[0], ref) + "  (first call %.1f s)" % compile_s)
            except Exception as e:  # noqa: BLE001
                print("%-8s 2^%-3d %-34s %-7s FAILED: %s" % (dtype, logn, what, shown,
                                                            str(e).splitlines()[0][:100]))
        env("", "")
        del xs, ys, pairs, ref
        torch.cuda.empty_cache()


def race_check(runs=50, logn=24, variants=("", "blockid")):
    """``runs`` single-pass scans of one input per variant, each compared exactly."""
    n = 1 << logn
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randint(-1000, 1000, (n,), device="cuda", dtype=torch.int32, generator=gen)
    ref = torch.cumsum(x, 0, dtype=torch.int32)
    y = torch.empty_like(x)
    for variant in variants:
        env(variant, "")
        bad = []
        for r in range(runs):
            y.fill_(-7)
            cufold.inclusive_scan(x, out=y, algorithm="single_pass")
            if not torch.equal(y, ref):
                wrong = torch.nonzero(y != ref)
                bad.append("run %d: %d items, first %d" % (r, wrong.numel(), int(wrong[0])))
        print("race check [%s]: %d single-pass scans of 2^%d int32: %s" % (
            variant or "default", runs, logn, "all exact" if not bad else "; ".join(bad[:5])),
            flush=True)
    env("", "")


def main(argv):
    t0 = time.time()
    print("# %s, torch %s, cufold scan default variant %s" % (
        torch.cuda.get_device_name(), torch.__version__, scan.DEFAULT_VARIANT))
    run_plan(QUICK if "--quick" in argv else PLAN)
    race_check(variants=("",) if "--quick" in argv else ("", "blockid"))
    print("# %.0f s" % (time.time() - t0))


if __name__ == "__main__":
    main(sys.argv[1:])
