#!/usr/bin/env python
"""GPU smoke test and host-overhead timings for cufold's direct launch path.

Run on a machine with a GPU (no simulator):

    PYTHONPATH=src python tools/gpu_launch_smoke.py [--calls 2000] [--n 1024]

Checks (one ``PASS``/``FAIL``/``SKIP`` line each): the direct path on Numba,
PyTorch, CuPy (and JAX) arrays against NumPy and against Numba's dispatcher,
1-d / strided / tuple / 0-d arguments, a side stream, a launch from a fresh
thread, the CUDA context Numba loads into vs the one PyTorch makes current,
launch errors, and the disk cache (a new process loads the cubin instead of
compiling). Then it times per-call host overhead: the median of ``--calls``
calls, each timed alone, with one synchronisation at the end only.

Exit status: 0 when nothing failed.
"""

import argparse
import ctypes
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # let JAX share the GPU
os.environ.pop("NUMBA_ENABLE_CUDASIM", None)

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402
from numba import types as nt  # noqa: E402

from cufold.host import arrays as A  # noqa: E402
from cufold.host import launch as L  # noqa: E402

RESULTS = []


def report(name, status, detail=""):
    RESULTS.append((name, status))
    print("%-4s %s%s" % (status, name, ("  -- " + detail) if detail else ""), flush=True)


def check(name):
    def deco(fn):
        def run(*a, **k):
            try:
                out = fn(*a, **k)
            except _Skip as e:
                report(name, "SKIP", str(e))
                return None
            except Exception as e:  # noqa: BLE001
                report(name, "FAIL", "%s: %s" % (type(e).__name__, e))
                traceback.print_exc()
                return None
            report(name, "PASS", out if isinstance(out, str) else "")
            return out
        return run
    return deco


class _Skip(Exception):
    pass


def _need(mod):
    try:
        return __import__(mod)
    except Exception as e:  # noqa: BLE001
        raise _Skip("%s not importable (%s)" % (mod, e))


# --- kernels -------------------------------------------------------------------------

F32 = nt.Array(nt.float32, 1, "A")
F32_0D = nt.Array(nt.float32, 0, "A")


def scale(out, x, a, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = x[i] * a


def axpy_pair(out, xs, a, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = xs[0][i] * a + xs[1][i]


def block_sum(out, x, n):
    # one block folds x into out[()] (the shape of a small reduce)
    sm = cuda.shared.array(256, nt.float32)
    t = cuda.threadIdx.x
    acc = nt.float32(0)
    for i in range(t, n, 256):
        acc += x[i]
    sm[t] = acc
    cuda.syncthreads()
    s = 128
    while s > 0:
        if t < s:
            sm[t] += sm[t + s]
        cuda.syncthreads()
        s //= 2
    if t == 0:
        out[()] = sm[0]


def dyn_smem(out, n):
    sm = cuda.shared.array(0, nt.float32)
    t = cuda.threadIdx.x
    for i in range(t, n, cuda.blockDim.x):
        sm[i] = i
    cuda.syncthreads()
    if t == 0:
        acc = nt.float32(0)
        for i in range(n):
            acc = max(acc, sm[i])
        out[()] = acc


SCALE = L.Kernel(scale, (F32, F32, nt.float32, nt.int64))
DSMEM = L.Kernel(dyn_smem, (F32_0D, nt.int64))
PAIR = L.Kernel(axpy_pair, (F32, nt.UniTuple(F32, 2), nt.float32, nt.int64))
BSUM = L.Kernel(block_sum, (F32_0D, F32, nt.int64))


def grid_for(n, b=128):
    return max(1, (n + b - 1) // b)


# --- correctness ------------------------------------------------------------------------


@check("environment")
def env_info():
    import importlib.metadata as md
    vers = []
    for p in ("numba", "numba-cuda", "cuda-bindings", "cuda-core", "numpy", "torch", "cupy-cuda13x",
              "cupy-cuda12x", "jax", "nvtx"):
        try:
            vers.append("%s %s" % (p, md.version(p)))
        except Exception:  # noqa: BLE001
            pass
    dev = cuda.get_current_device()
    return "%s cc=%s; %s; DIRECT=%s NVTX=%s" % (dev.name.decode() if isinstance(dev.name, bytes)
                                                else dev.name, dev.compute_capability,
                                                ", ".join(vers), L.DIRECT, L.NVTX)


@check("numba arrays: direct == numpy == dispatcher (1-d, strided, tuple, 0-d)")
def numba_arrays():
    rng = np.random.default_rng(1)
    n = 1000
    h = rng.standard_normal(2 * n).astype(np.float32)
    d = cuda.to_device(h)
    for direct in (True, False):
        L.DIRECT = direct
        try:
            x = A.describe(d[::2])
            obj, out = A.empty(x, (n,), np.float32)
            SCALE.launch(grid_for(n), 128, 0, 0, out, x, 3.0, n)
            np.testing.assert_array_equal(obj.copy_to_host(), h[::2] * np.float32(3))
            y = A.describe(d[1::2])
            xs = A.describe_many((x, y))
            obj, out = A.empty(x, (n,), np.float32)
            PAIR.launch(grid_for(n), 128, 0, 0, out, xs, -2.0, n)
            np.testing.assert_allclose(obj.copy_to_host(), h[::2] * -2 + h[1::2], rtol=1e-6)
            obj, out = A.empty(x, (), np.float32)
            BSUM.launch(1, 256, 0, 0, out, x, n)
            np.testing.assert_allclose(obj.copy_to_host()[()], h[::2].sum(), rtol=1e-4)
        finally:
            L.DIRECT = True
    if not (SCALE.direct and PAIR.direct and BSUM.direct):
        raise AssertionError("direct path disabled: %s" % (SCALE._direct_reason or PAIR._direct_reason
                                                           or BSUM._direct_reason))


@check("context: Numba's primary context is the one torch makes current")
def contexts():
    torch = _need("torch")
    torch.zeros(1, device="cuda")
    lib = ctypes.CDLL("libcuda.so.1")
    cur = ctypes.c_void_p()
    lib.cuCtxGetCurrent(ctypes.byref(cur))
    mine = L._primary_context(torch.cuda.current_device())
    if cur.value != mine:
        raise AssertionError("current %#x != numba primary %#x" % (cur.value or 0, mine))
    return "ctx %#x" % mine


@check("torch: direct path (1-d, strided, tuple, 0-d, side stream)")
def torch_arrays():
    torch = _need("torch")
    n = 1000
    xt = torch.randn(n, device="cuda")
    x = A.describe(xt)
    obj, out = A.empty(x, (n,), np.float32)
    SCALE.launch(grid_for(n), 128, A.stream_handle(x), 0, out, x, 0.5, n)
    torch.testing.assert_close(obj, xt * 0.5)
    yt = torch.randn(3 * n, device="cuda")[::3]
    xs = A.describe_many((xt, yt))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        obj, out = A.empty(xs[0], (n,), np.float32)
        PAIR.launch(grid_for(n), 128, A.stream_handle(xs), 0, out, xs, 2.0, n)
    s.synchronize()
    torch.testing.assert_close(obj, xt * 2 + yt)
    obj, out = A.empty(x, (), np.float32)
    BSUM.launch(1, 256, A.stream_handle(x), 0, out, x, n)
    torch.testing.assert_close(obj, xt.sum(), rtol=1e-4, atol=1e-4)
    assert isinstance(obj, torch.Tensor) and obj.shape == ()


@check("cupy: direct path (negative stride, 0-d)")
def cupy_arrays():
    cp = _need("cupy")
    n = 1000
    xc = cp.random.standard_normal(n, dtype=cp.float32)
    x = A.describe(xc[::-1])
    obj, out = A.empty(x, (n,), np.float32)
    SCALE.launch(grid_for(n), 128, A.stream_handle(x), 0, out, x, -1.0, n)
    cp.testing.assert_allclose(obj, -xc[::-1])
    obj, out = A.empty(x, (), np.float32)
    BSUM.launch(1, 256, A.stream_handle(x), 0, out, x, n)
    cp.testing.assert_allclose(obj, xc.sum(), rtol=1e-4, atol=1e-4)
    assert isinstance(obj, cp.ndarray)


@check("jax: describe via DLPack, output handed back as a jax.Array")
def jax_arrays():
    jax = _need("jax")
    import jax.numpy as jnp
    try:
        gpu = jax.devices("gpu")[0]
    except Exception as e:  # noqa: BLE001
        raise _Skip("no JAX GPU backend (%s)" % e)
    n = 1000
    xj = jax.device_put(jnp.arange(n, dtype=jnp.float32), gpu)
    x = A.describe(xj)
    obj, out = A.empty(x, (), np.float32)
    BSUM.launch(1, 256, A.stream_handle(x), 0, out, x, n)
    res = A.to_library(obj, out)
    assert isinstance(res, jax.Array), type(res)
    assert float(res) == float(n * (n - 1) / 2), float(res)


@check("a launch from a fresh thread (no current context there)")
def fresh_thread():
    n = 256
    h = np.arange(n, dtype=np.float32)
    d = cuda.to_device(h)
    x = A.describe(d)
    obj, out = A.empty(x, (n,), np.float32)
    err = []

    def body():
        try:
            SCALE.launch(grid_for(n), 128, 0, 0, out, x, 2.0, n)
        except Exception as e:  # noqa: BLE001
            err.append(e)

    drv = L._driver()
    saved = drv.check_ctx
    try:
        for check_ctx in (False, True):  # lazy (retry on CUDA_ERROR_INVALID_CONTEXT) and eager
            drv.check_ctx = check_ctx
            obj, out = A.empty(x, (n,), np.float32)
            th = threading.Thread(target=body)
            th.start()
            th.join()
            if err:
                raise err[0]
            np.testing.assert_array_equal(obj.copy_to_host(), h * 2)
    finally:
        drv.check_ctx = saved
    return "devices=%d, context check by default: %s" % (drv.device_count, saved)


@check("launch errors raise LaunchError with the driver's name")
def launch_error():
    x = A.describe(cuda.to_device(np.zeros(4, np.float32)))
    try:
        SCALE.launch(1, 4096, 0, 0, x, x, 1.0, 4)
    except L.LaunchError as e:
        return str(e)[:110]
    raise AssertionError("no error for 4096 threads per block")


@check("dynamic shared memory above 48 KiB (opt-in attribute), direct and dispatcher")
def big_smem():
    n = 24 * 1024  # 96 KiB of float32
    x = A.describe(cuda.to_device(np.zeros(1, np.float32)))
    for direct in (True, False):
        L.DIRECT = direct
        try:
            obj, out = A.empty(x, (), np.float32)
            DSMEM.launch(1, 256, 0, n * 4, out, n)
            got = obj.copy_to_host()[()]
            assert got == n - 1, (direct, got)
        finally:
            L.DIRECT = True


@check("workspace: cached per (device, stream), zeroed, grows")
def workspace():
    p1, w1 = L.workspace(0, 0, 1000)
    p2, w2 = L.workspace(0, 0, 10)
    assert p1 == p2 and w1 is w2
    host = A.as_numba(w1).copy_to_host()
    assert not host.any()
    p3, w3 = L.workspace(0, 0, w1.size * 3)
    assert w3.size >= w1.size * 3 and not A.as_numba(w3).copy_to_host().any()


_CHILD = textwrap.dedent(r"""
    import sys, time
    t0 = time.perf_counter()
    sys.path.insert(0, %(src)r)
    import numpy as np
    from numba import cuda, types as nt
    from cufold.host import arrays as A, launch as L
    def scale(out, x, a, n):
        i = cuda.grid(1)
        if i < n:
            out[i] = x[i] * a
    F32 = nt.Array(nt.float32, 1, "A")
    k = L.Kernel(scale, (F32, F32, nt.float32, nt.int64), disk_key="smoke scale v1")
    x = A.describe(cuda.to_device(np.arange(100, dtype=np.float32)))
    obj, out = A.empty(x, (100,), np.float32)
    t1 = time.perf_counter()
    k.launch(1, 128, 0, 0, out, x, 2.0, 100)
    r = obj.copy_to_host()
    t2 = time.perf_counter()
    assert (r == np.arange(100) * 2).all()
    print("RESULT", k.loaded_from_disk[x.device_id], k._dispatcher is None, "%%.1f" %% ((t2 - t1) * 1e3))
""")


@check("disk cache: a new process launches from the cached cubin")
def disk_cache():
    with tempfile.TemporaryDirectory() as tmp:
        envv = dict(os.environ, CUFOLD_CACHE_DIR=tmp)
        outs = []
        for _ in range(2):
            p = subprocess.run([sys.executable, "-c", _CHILD % {"src": SRC}], env=envv,
                               capture_output=True, text=True, timeout=300)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
            if p.returncode or not line:
                raise AssertionError(p.stderr[-2000:])
            outs.append(line[0].split()[1:])
        cubins = [f for _, _, fs in os.walk(tmp) for f in fs if f.endswith(".cubin")]
    (d1, nc1, ms1), (d2, nc2, ms2) = outs
    if not (d1 == "False" and d2 == "True" and nc2 == "True" and len(cubins) == 1):
        raise AssertionError("cold=%s warm=%s uncompiled=%s files=%d" % (d1, d2, nc2, len(cubins)))
    return "first launch: compile %s ms, from disk %s ms" % (ms1, ms2)


# --- timings ---------------------------------------------------------------------------------


def bench(fn, calls, sync):
    for _ in range(min(200, calls)):
        fn()
    sync()
    pc = time.perf_counter_ns
    ts = [0] * calls
    gc_was = gc.isenabled()
    gc.disable()
    try:
        t_all = pc()
        for i in range(calls):
            t0 = pc()
            fn()
            ts[i] = pc() - t0
        t_end = pc()
        sync()
    finally:
        if gc_was:
            gc.enable()
    ts.sort()
    return (statistics.median(ts) / 1e3, ts[int(0.9 * calls)] / 1e3, (t_end - t_all) / calls / 1e3)


def timings(calls, n):
    rows = []
    torch = cp = None
    try:
        import torch
    except Exception:  # noqa: BLE001
        pass
    try:
        import cupy as cp
    except Exception:  # noqa: BLE001
        pass

    def sync():
        cuda.synchronize()
        if torch is not None:
            torch.cuda.synchronize()

    def add(name, fn):
        try:
            med, p90, mean = bench(fn, calls, sync)
            rows.append((name, med, p90, mean))
        except Exception as e:  # noqa: BLE001
            rows.append((name + " [FAILED: %s]" % e, float("nan"), float("nan"), float("nan")))

    h = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    dn = cuda.to_device(h)
    nb_out = cuda.device_array((), np.float32)
    disp = BSUM.dispatcher()
    add("numba dispatcher, numba arrays", lambda: disp[1, 256](nb_out, dn, n))
    xa = A.describe(dn)
    oa = A.describe(nb_out)
    add("cufold Kernel.launch only (described args, default API %s)" % L._driver().api,
        lambda: BSUM.launch(1, 256, 0, 0, oa, xa, n))
    add("cufold pack only (no launch)", lambda: BSUM._pack(oa, xa, n))

    # --- the launch call itself, per binding (each verified once before timing) ---
    func_obj, _ctx = BSUM._funcs[xa.device_id]
    handle = int(func_obj)
    params = BSUM._params
    try:
        from cuda.bindings import driver as cbd
        cf, cs = cbd.CUfunction(handle), cbd.CUstream(0)
        ok = cbd.CUresult.CUDA_SUCCESS

        def b_obj():
            return cbd.cuLaunchKernel(cf, 1, 1, 1, 256, 1, 1, 0, cs, params, 0)

        def b_int():
            return cbd.cuLaunchKernel(cf, 1, 1, 1, 256, 1, 1, 0, 0, params, 0)
        for nm, fn in (("driver call: cuda.bindings cuLaunchKernel (CUfunction, CUstream objects)", b_obj),
                       ("driver call: cuda.bindings cuLaunchKernel (int stream)", b_int)):
            r = fn()
            if r[0] != ok:
                rows.append((nm + " [returned %s]" % r[0], float("nan"), float("nan"), float("nan")))
            else:
                add(nm, fn)
        try:
            from cuda.bindings._v2 import driver as v2
            r = v2.launch_kernel(handle, 1, 1, 1, 256, 1, 1, 0, 0, params, 0)
            add("driver call: cuda.bindings._v2 launch_kernel (ints)",
                lambda: v2.launch_kernel(handle, 1, 1, 1, 256, 1, 1, 0, 0, params, 0))
        except Exception as e:  # noqa: BLE001
            print("(cuda.bindings._v2 launch_kernel n/a: %s)" % e)
    except Exception as e:  # noqa: BLE001
        print("(cuda.bindings timing n/a: %s)" % e)
    ct = L._Driver("ctypes")
    if ct.launch(handle, 1, 1, 1, 256, 1, 1, 0, 0, params, 0) == 0:
        add("driver call: ctypes cuLaunchKernel", lambda: ct.launch(handle, 1, 1, 1, 256, 1, 1, 0, 0, params, 0))
    add("context check (ctypes cuCtxGetCurrent)", lambda: ct.ctx_get(BSUM._ctx_addr))

    d0 = L._driver()
    saved_check = d0.check_ctx
    for check_ctx in (True, False):
        d0.check_ctx = check_ctx
        add("Kernel.launch only, %s API, context check %s" % (d0.api, "on" if check_ctx else "lazy"),
            lambda: BSUM.launch(1, 256, 0, 0, oa, xa, n))
    d0.check_ctx = saved_check
    saved = L._drv
    for api in ("bindings", "ctypes"):
        try:
            L._drv = L._Driver(api)
            k = L.Kernel(block_sum, BSUM.signature)
            k.launch(1, 256, 0, 0, oa, xa, n)
            add("Kernel.launch only, %s API" % api, lambda: k.launch(1, 256, 0, 0, oa, xa, n))
        except Exception as e:  # noqa: BLE001
            rows.append(("Kernel.launch %s [FAILED: %s]" % (api, e), float("nan"), float("nan"), float("nan")))
        finally:
            L._drv = saved

    def full_numba():
        x = A.describe(dn)
        obj, out = A.empty(x, (), np.float32)
        BSUM.launch(1, 256, A.stream_handle(x), 0, out, x, n)
        return obj
    add("cufold full path, numba arrays (describe+empty+stream+launch)", full_numba)

    if torch is not None:
        xt = torch.from_numpy(h).cuda()
        ot = torch.empty((), device="cuda")
        add("numba dispatcher, torch tensors", lambda: disp[1, 256](ot, xt, n))
        add("cufold describe(torch)", lambda: A.describe(xt))
        xd = A.describe(xt)
        add("cufold empty(torch, ())", lambda: A.empty(xd, (), np.float32))
        add("cufold stream_handle(torch)", lambda: A.stream_handle(xd))
        add("torch.empty((), device='cuda')", lambda: torch.empty((), device="cuda"))
        tdev = torch.device("cuda", 0)
        add("torch.empty((), dtype=, device=torch.device)",
            lambda: torch.empty((), dtype=torch.float32, device=tdev))
        add("x.new_empty(())", lambda: xt.new_empty(()))
        add("x.new_empty((), dtype=torch.float64)", lambda: xt.new_empty((), dtype=torch.float64))

        def full_torch():
            x = A.describe(xt)
            obj, out = A.empty(x, (), np.float32)
            BSUM.launch(1, 256, A.stream_handle(x), 0, out, x, n)
            return obj
        add("cufold full path, torch (describe+empty+stream+launch)", full_torch)
        add("torch.sum(x)  [%d elements]" % n, lambda: torch.sum(xt))
    if cp is not None:
        xc = cp.asarray(h)

        def full_cupy():
            x = A.describe(xc)
            obj, out = A.empty(x, (), np.float32)
            BSUM.launch(1, 256, A.stream_handle(x), 0, out, x, n)
            return obj
        add("cufold full path, cupy", full_cupy)
        add("cupy.sum(x)", lambda: cp.sum(xc))
    def nvtx_once():
        with L.nvtx_range("cufold.sum"):
            pass
    add("nvtx_range enter/exit (%s)" % ("nvtx" if L.NVTX else "no-op"), nvtx_once)

    print()
    print("per-call host time, %d calls, n=%d (microseconds)" % (calls, n))
    w = max(len(r[0]) for r in rows)
    print("%-*s  %8s  %8s  %8s" % (w, "case", "median", "p90", "mean"))
    for name, med, p90, mean in rows:
        print("%-*s  %8.2f  %8.2f  %8.2f" % (w, name, med, p90, mean))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--no-timings", action="store_true")
    args = ap.parse_args()
    if not cuda.is_available():
        print("FAIL no CUDA GPU visible to Numba")
        return 1
    env_info()
    numba_arrays()
    contexts()
    torch_arrays()
    cupy_arrays()
    fresh_thread()
    launch_error()
    big_smem()
    workspace()
    disk_cache()
    jax_arrays()
    if not args.no_timings:
        timings(args.calls, args.n)
    failed = [n for n, s in RESULTS if s == "FAIL"]
    print()
    print("SUMMARY: %d passed, %d failed, %d skipped" % (
        sum(s == "PASS" for _, s in RESULTS), len(failed), sum(s == "SKIP" for _, s in RESULTS)))
    for n in failed:
        print("FAILED:", n)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
