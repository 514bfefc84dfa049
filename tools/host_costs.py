"""Per-call host costs of cufold's device calls and of their parts, on a GPU.

    PYTHONPATH=src python tools/host_costs.py [--calls 20000] [--profile ROW ...]

Each row is host time per call in us: the median of bursts of 200 calls
(``launch_costs.per_call``; ``--calls`` in all). ``tools/launch_costs.py``
breaks a reduce's launch down step by step. Run it once per launch API
to compare them:

    CUFOLD_LAUNCH_API=bindings ...   /   CUFOLD_LAUNCH_API=ctypes ...
"""
import argparse
import cProfile
import os
import pstats
import sys

os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
import numpy as np  # noqa: E402
import torch  # noqa: E402

import cufold  # noqa: E402
from cufold.host import arrays as _arrays, launch as _launch, programs as _programs  # noqa: E402


from launch_costs import per_call  # noqa: E402  (this folder: host time of 200-call bursts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--profile", nargs="*", metavar="ROW",
                    help="cProfile these rows (by name; none given: cufold.sum)")
    a = ap.parse_args()
    x = torch.rand(1 << 10, device="cuda")
    xi = torch.randint(0, 9, (1 << 10,), device="cuda", dtype=torch.int32)
    dev = torch.device("cuda", 0)
    y, o, s = torch.empty_like(x), torch.empty((), device=dev), torch.cuda.current_stream()
    offsets = torch.linspace(0, x.numel(), 101, device=dev).to(torch.int64)
    arr = _arrays.describe(x)
    m2 = torch.rand(32, 32, device=dev)
    m20 = torch.rand(1024, 1024, device=dev)
    keys = torch.randint(0, 100, (1 << 10,), device=dev).sort().values
    vals = torch.rand(1 << 10, device=dev, dtype=torch.float64)
    acc = torch.zeros(100, device=dev, dtype=torch.float64)
    rows = [
        ("torch.sum", lambda: torch.sum(x)),
        ("cufold.sum", lambda: cufold.sum(x)),
        ("torch.cumsum", lambda: torch.cumsum(x, 0)),
        ("cufold.cumsum", lambda: cufold.cumsum(x)),
        ("torch.cumsum int32", lambda: torch.cumsum(xi, 0)),
        ("cufold.cumsum int32", lambda: cufold.cumsum(xi)),
        ("cufold.cumsum out=", lambda: cufold.cumsum(x, out=y)),
        ("cufold.cumsum stream= (general)", lambda: cufold.cumsum(x, stream=s)),
        ("cufold.sum out= (general)", lambda: cufold.sum(x, out=o)),
        ("cufold.mean_var", lambda: cufold.mean_var(x)),
        ("torch.var_mean", lambda: torch.var_mean(x)),
        ("cufold.segmented_reduce 100", lambda: cufold.segmented_reduce(x, offsets)),
        ("torch.segment_reduce 100", lambda: torch.segment_reduce(x, "sum", offsets=offsets)),
        ("torch.sum(dim=1) 32x32", lambda: torch.sum(m2, 1)),
        ("cufold.sum(axis=1) 32x32", lambda: cufold.sum(m2, axis=1)),
        ("torch.sum(dim=1) 1024x1024", lambda: torch.sum(m20, 1)),
        ("cufold.sum(axis=1) 1024x1024", lambda: cufold.sum(m20, axis=1)),
        ("torch.argmax(dim=1) 1024x1024", lambda: torch.argmax(m20, 1)),
        ("cufold.argmax(axis=1) 1024x1024", lambda: cufold.argmax(m20, axis=1)),
        ("torch.argmax(dim=0) 32x32", lambda: torch.argmax(m2, 0)),
        ("cufold.argmax(axis=0) 32x32", lambda: cufold.argmax(m2, axis=0)),
        ("torch.index_add_", lambda: acc.index_add_(0, keys, vals)),
        ("cufold.reduce_by_key_into check=False", lambda: cufold.reduce_by_key_into(keys, vals, acc, check=False)),
        ("cufold.reduce_by_key_into", lambda: cufold.reduce_by_key_into(keys, vals, acc)),
        ("torch.histc 64", lambda: torch.histc(x, 64, 0, 1)),
        ("cufold.histogram 64", lambda: cufold.histogram(x, 64, (0, 1))),
        ("torch.bincount", lambda: torch.bincount(xi, minlength=64)),
        ("cufold.bincount", lambda: cufold.bincount(xi, minlength=64)),
        ("describe(torch)", lambda: _arrays.describe(x)),
        ("stream_handle", lambda: _arrays.stream_handle(arr)),
        ("programs.signature", lambda: _programs.signature(arr)),
        ("empty 0-d (cufold)", lambda: _arrays.empty(arr, (), np.float32)),
        ("torch.empty((), device=)", lambda: torch.empty((), dtype=torch.float32, device=dev)),
        ("x.new_empty(())", lambda: x.new_empty(())),
        ("torch.empty(1024, device=)", lambda: torch.empty(1024, dtype=torch.float32, device=dev)),
        ("x.new_empty((1024,), dtype=)", lambda: x.new_empty((1024,), dtype=torch.float32)),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("empty 1024 (cufold)", lambda: _arrays.empty(arr, (1024,), np.float32)),
    ]
    print("launch api:", _launch._driver().api)
    for name, fn in rows:
        try:
            print("%-32s %7.2f us" % (name, per_call(fn, a.calls)), flush=True)
        except Exception as e:                    # a peer's API that this version lacks
            print("%-32s failed: %s" % (name, str(e).splitlines()[0][:90]), flush=True)
    # cufold.sum taken apart: each step alone (what the call adds around its Program is the rest).
    import importlib
    D = importlib.import_module("cufold.device")
    programs = getattr(D._SUM, "programs", None)
    if programs:
        key, prog = next(iter(programs.items()))
        h = _arrays.stream_handle(arr)
        sig = _programs.signature
        steps = [
            ("  sum: describe", lambda: _arrays.describe(x)),
            ("  sum: stream_handle", lambda: _arrays.stream_handle(arr)),
            ("  sum: key", lambda: ((sig(arr),), h, None, None, None, False, None, True, False, (), False,
                                    D._reduce_mod.tile_override())),
            ("  sum: Programs.get", lambda: programs.get(key)),
            ("  sum: Program (alloc + launch)", lambda: prog.call(arr)),
            ("  sum: whole call", lambda: cufold.sum(x)),
        ]
        for name, fn in steps:
            print("%-32s %7.2f us" % (name, per_call(fn, a.calls)), flush=True)
    for name in ([] if a.profile is None else a.profile or ["cufold.sum"]):
        fn = dict(rows)[name]
        print("\n== profile of %s" % name)
        cProfile.runctx("for _ in range(5000): fn()", globals(), {"fn": fn}, "/tmp/p")
        pstats.Stats("/tmp/p").sort_stats("tottime").print_stats(14)
    return 0


if __name__ == "__main__":
    sys.exit(main())
