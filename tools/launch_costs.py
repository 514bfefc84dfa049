"""Host cost of each step of cufold.sum's Program, and of ways to call cuLaunchKernel.

    PYTHONPATH=src python tools/launch_costs.py [--calls 20000]

Each row is host time per call, in us: the median of bursts of 200 calls
(short enough never to wait for the GPU), on a 2^10-element float32 torch
tensor; "gpu per call" rows are GPU time per call, calls run back to back.
The launch rows launch cufold.sum's own kernel (31 parameters, its CUfunction)
or a one-parameter kernel, through:
  bindings      cuda.bindings.driver.cuLaunchKernel, kernelParams (what Bound does)
  bindings/x    the same with the parameters packed in one buffer (the `extra` argument)
  v2            cuda.bindings._v2.driver.launch_kernel (typed arguments), where it exists
  ctypes        libcuda's cuLaunchKernel through ctypes, every argument pre-converted
  compiled      cufold.host.native's built-in function (what Bound uses by default)
  cupy          cupy.cuda.driver.launchKernel (plain integers), where cupy is installed
"""
import argparse
import ctypes
import importlib
import os
import sys
import time

os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
import torch  # noqa: E402
from numba import types as nbtypes  # noqa: E402

import cufold  # noqa: E402
from cufold.host import arrays as _arrays, launch as _launch  # noqa: E402

D = importlib.import_module("cufold.device")
R = importlib.import_module("cufold.device.reduce")


def per_call(fn, calls, burst=200):
    """Host time per call: the median of bursts of ``burst`` calls, each timed
    from its first issue to its last (fewer than the launch queue holds, so a
    burst never waits for the GPU), the GPU drained between bursts."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(max(calls // burst, 5)):
        t = time.perf_counter()
        for _ in range(burst):
            fn()
        times.append((time.perf_counter() - t) / burst * 1e6)
        torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2]


def gpu_per_call(fn, calls=2000):
    """GPU time per call: events around ``calls`` calls queued behind a sleep
    long enough to issue them all, so the GPU runs them back to back."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(calls * 30e-6 * 2e9))
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def packed_extra(kernel, slots):
    """The parameters of ``slots`` (one 8-byte slot each) laid out as the kernel's
    parameter space has them (each at its own alignment), and the `extra` array."""
    sizes = kernel.plan.sizes
    raw = bytes(slots)
    out, off = bytearray(), 0
    for i, sz in enumerate(sizes):
        off = -(-off // sz) * sz
        out += b"\0" * (off - len(out))
        out += raw[8 * i:8 * i + sz]
        off += sz
    buf = ctypes.create_string_buffer(bytes(out), len(out))
    size = ctypes.c_size_t(len(out))
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 0)
    return buf, size, extra


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args()
    x = torch.rand(1 << 10, device="cuda")
    cufold.sum(x)
    cufold.sum(x)          # the first call planned cufold.sum's Program for x's signature
    torch.cuda.synchronize()
    print("nvtx ranges:", _launch.NVTX)
    prog = next(iter(D._SUM.programs.values()))
    go = prog.call.__globals__["_go0"]     # the Program's one bound launch
    g = go.__globals__
    cfg, kernel = g["_cfg"], g["_kernel"]
    drv = _launch._driver()
    from cuda.bindings import driver as cbd
    import cuda.bindings
    print("cuda.bindings", cuda.bindings.__version__, "launch api", drv.api, "params", kernel._nparams,
          "sizes", kernel.plan.sizes)
    ptr = x.data_ptr()
    take = prog.call.__globals__["_alloc1"]      # the result's allocator (its argument is unused)
    obj, optr = take(x)
    func, stream = cfg[0], cfg[8]
    fint, sint = int(func), int(stream)
    dims = cfg[1:8]
    params = cfg[9]
    go(ptr, optr)          # the slots now hold this input and result
    buf, size, extra = packed_extra(kernel, g["_s"])
    xaddr = ctypes.addressof(extra)
    lib = drv.lib
    raw = lib["cuLaunchKernel"]
    raw.restype = ctypes.c_int
    u, vp = ctypes.c_uint, ctypes.c_void_p
    craw = (vp(fint),) + tuple(u(d) for d in dims) + (vp(sint or None), vp(params), vp(None))
    crawx = (vp(fint),) + tuple(u(d) for d in dims) + (vp(sint or None), vp(None), vp(xaddr))

    # a one-parameter kernel, for the per-parameter share of the launch
    def tiny(v):
        pass
    k1 = _launch.Kernel(tiny, (nbtypes.int64,), name="tiny")
    go1 = k1.bind(1, 32, sint, 0, (5,), (0,))
    g1 = go1.__globals__

    rows = [
        ("(empty loop)", lambda: None),
        ("torch.sum", lambda: torch.sum(x)),
        ("cufold.sum", lambda: cufold.sum(x)),
        ("torch.var_mean", lambda: torch.var_mean(x)),
        ("cufold.mean_var", lambda: cufold.mean_var(x)),
        ("torch.aminmax", lambda: torch.aminmax(x)),
        ("cufold.minmax", lambda: cufold.minmax(x)),
        ("x.get_device()", lambda: x.get_device()),
        ("x.is_contiguous()", lambda: x.is_contiguous()),
        ("x.numel()", lambda: x.numel()),
        ("x.data_ptr()", lambda: x.data_ptr()),
        ("_torch_raw_stream(0)", lambda: _arrays._torch_raw_stream(0)),
        ("tile_override()", R.tile_override),
        ("take a 0-d result", lambda: take(x)),
        ("the whole Program", lambda: prog.call(_arrays.describe(x))),
        ("bound go(ptr, out)", lambda: go(ptr, optr)),
        ("bindings cuLaunchKernel", lambda: g["_launch"](*cfg)),
        ("bindings/x (extra)", lambda: cbd.cuLaunchKernel(func, *dims, stream, 0, xaddr)),
        ("ctypes (params)", lambda: raw(*craw)),
        ("ctypes/x (extra)", lambda: raw(*crawx)),
        ("tiny: bound go", lambda: go1(7)),
        ("tiny: bindings", lambda: g1["_launch"](*g1["_cfg"])),
    ]
    # cufold's compiled launcher (host/native.py): a built-in function calling the driver by address.
    from cufold.host import native
    compiled = native.launcher(ctypes.cast(raw, ctypes.c_void_p).value)
    nat = (fint,) + tuple(int(d) for d in dims) + (sint, int(params), 0)
    rows.append(("compiled launcher", lambda: compiled(*nat)))
    try:
        import cupy
        lkc = cupy.cuda.driver.launchKernel
        rows.append(("cupy launchKernel", lambda: lkc(fint, *dims, sint, params, 0)))
    except Exception as e:
        print("no cupy launchKernel:", type(e).__name__, e)
    s64 = g["_s"]
    mv = memoryview(g["_buf"] if "_buf" in g else s64).cast("B").cast("q")
    rows.append(("2 ctypes slot writes", lambda: (s64.__setitem__(4, ptr), s64.__setitem__(26, optr))))
    rows.append(("2 memoryview slot writes", lambda: (mv.__setitem__(4, ptr), mv.__setitem__(26, optr))))
    try:
        from cuda.bindings._v2 import driver as d2
        lk = d2.launch_kernel
        rows.append(("v2 launch_kernel (params)", lambda: lk(fint, *dims, sint, params, 0)))
        rows.append(("v2 launch_kernel (extra)", lambda: lk(fint, *dims, sint, 0, xaddr)))
    except Exception as e:
        print("no cuda.bindings._v2:", type(e).__name__, e)
    batch = torch.empty(256, device="cuda")
    rows += [
        ("unbind(0) of 256, per view", lambda: batch.unbind(0)),
        ("x.new_empty(())", lambda: x.new_empty(())),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
    ]
    for name, fn in rows:
        try:
            t = per_call(fn, a.calls)
            print("%-28s %7.2f us" % (name, t / (256 if name.startswith("unbind") else 1)), flush=True)
        except Exception as e:
            print("%-28s failed: %s" % (name, str(e).splitlines()[0][:100]), flush=True)
    for name, fn in (("torch.sum", lambda: torch.sum(x)), ("cufold.sum", lambda: cufold.sum(x)),
                     ("tiny", lambda: go1(7))):
        print("gpu per call %-14s %6.2f us" % (name, gpu_per_call(fn)))
    # the extra-buffer launch computed the same sum?
    ref = float(torch.sum(x.double()))
    for name, fn in (("bindings/x", lambda: cbd.cuLaunchKernel(func, *dims, stream, 0, xaddr)),
                     ("ctypes/x", lambda: raw(*crawx))):
        torch.cuda.synchronize()
        fn()
        torch.cuda.synchronize()
        print("%s result %.6f vs %.6f" % (name, float(obj), ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
