"""Per-call host costs of cufold's device calls and of their parts, on a GPU.

    PYTHONPATH=src python tools/host_costs.py [--calls 20000]

Each row is the best of 5 loops of ``--calls`` back-to-back calls, in us per
call (the GPU work of these tiny calls is shorter than their host time, so this
is host time). Run it once per launch API to compare them:

    CUFOLD_LAUNCH_API=bindings ...   /   CUFOLD_LAUNCH_API=ctypes ...
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
import numpy as np  # noqa: E402
import torch  # noqa: E402

import cufold  # noqa: E402
from cufold.device import _arrays, _launch  # noqa: E402


def per_call(fn, calls):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    x = torch.rand(1 << 10, device="cuda")
    xi = torch.randint(0, 9, (1 << 10,), device="cuda", dtype=torch.int32)
    dev = torch.device("cuda", 0)
    arr = _arrays.describe(x)
    rows = [
        ("torch.sum", lambda: torch.sum(x)),
        ("cufold.sum", lambda: cufold.sum(x)),
        ("torch.cumsum", lambda: torch.cumsum(x, 0)),
        ("cufold.cumsum", lambda: cufold.cumsum(x)),
        ("torch.cumsum int32", lambda: torch.cumsum(xi, 0)),
        ("cufold.cumsum int32", lambda: cufold.cumsum(xi)),
        ("describe(torch)", lambda: _arrays.describe(x)),
        ("stream_handle", lambda: _arrays.stream_handle(arr)),
        ("empty 0-d (cufold)", lambda: _arrays.empty(arr, (), np.float32)),
        ("torch.empty((), device=)", lambda: torch.empty((), dtype=torch.float32, device=dev)),
        ("x.new_empty(())", lambda: x.new_empty(())),
        ("torch.empty(1024, device=)", lambda: torch.empty(1024, dtype=torch.float32, device=dev)),
    ]
    # The launch alone: the same kernel cufold.sum launches, arguments bound.
    import importlib
    R = importlib.import_module("cufold.device.reduce")
    runner = next(iter(R._runners.values()), None)
    print("launch api:", _launch._driver().api)
    for name, fn in rows:
        print("%-28s %7.2f us" % (name, per_call(fn, a.calls)), flush=True)
    if runner is not None:
        outs = _arrays.empty(arr, (1,), np.float32)[1]
        print("%-28s %7.2f us" % ("reduce runner (launch only)", per_call(lambda: runner(arr, 1024, outs), a.calls)))
    if a.profile:
        cProfile.runctx("for _ in range(20000): cufold.sum(x)", globals(), {"cufold": cufold, "x": x}, "/tmp/p")
        pstats.Stats("/tmp/p").sort_stats("tottime").print_stats(14)
    return 0


if __name__ == "__main__":
    sys.exit(main())
