"""What bounds cufold's histograms on the GPU: kernel rates by algorithm and data, and host cost.

On the GPU machine::

    PYTHONPATH=$PWD/.site:$PWD/src python3 tools/hist_rates.py [--log2n 26]

1. Floors for 2^n int32 items into 64 bins: ``read`` (the loads only), ``atoms`` (one shared
   ``atomic.add`` per item, per-block bins), ``private`` (per-thread uint16 counters in shared
   memory laid out ``[bin][thread]``: plain conflict-free load-add-store, no atomics).
2. cufold's counting kernel alone (``histogram._count``: the fill and the kernel, no min/max,
   no edges) for every algorithm, on int bins (bincount's path) and float32 uniform bins
   (histogram's), 64 / 1024 / 65536 bins, data ``uniform``, ``skewed`` (``u**5``: a quarter
   of the items in the middle 1/1000 of the range) and ``constant`` (every item one bin).
3. Host time per call of ``cufold.histogram`` (``range=`` given: no synchronisation) and
   ``cufold.bincount`` (one synchronisation) on 2^20 items, next to torch's.

Times are CUDA-event medians of back-to-back calls (GPU time), checked against NumPy.
"""
import argparse
import importlib
import time

import numpy as np
import torch
from numba import cuda, int32, uint16

import cufold
from cufold.host import arrays as _arrays
from gpu_timing import gpu_us

H = importlib.import_module("cufold.device.histogram")
NT, VT = 256, 8


def floor_kernel(kind, bins):
    """``kind``: 0 read, 1 atoms, 2 private."""
    pbins = bins if kind == 2 else 1            # the private array only where used

    @cuda.jit
    def k(x, n, out):
        tid = cuda.threadIdx.x
        sh = cuda.shared.array(bins, int32)
        priv = cuda.shared.array((pbins, NT), uint16)
        for b in range(tid, bins, NT):
            sh[b] = 0
        if kind == 2:
            for b in range(bins):
                priv[b, tid] = 0
        cuda.syncthreads()
        base = cuda.blockIdx.x * NT * VT
        stride = cuda.gridDim.x * NT * VT
        acc = 0
        while base < n:
            for j in range(VT):
                i = base + j * NT + tid
                if i < n:
                    v = cuda.ldcs(x, i)
                    if kind == 0:
                        acc += v
                    elif kind == 1:
                        cuda.atomic.add(sh, v, 1)
                    else:
                        priv[v, tid] += uint16(1)
            base += stride
        cuda.syncthreads()
        if kind == 2:
            for b in range(tid, bins, NT):
                s = 0
                for t in range(NT):
                    s += priv[b, t]
                cuda.atomic.add(out, b, s)
        elif kind == 1:
            for b in range(tid, bins, NT):
                cuda.atomic.add(out, b, sh[b])
        elif acc == -1:
            out[0] = acc
    return k


def host_time(call, calls=300):
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def data(dist, n, rng):
    u = rng.random(n)
    if dist == "skewed":
        u = 0.5 + 0.5 * np.sign(u - 0.5) * np.abs(2 * u - 1) ** 5
    elif dist == "constant":
        u = np.full(n, 0.3)
    return u


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, default=26)
    a = ap.parse_args()
    n = 1 << a.log2n
    rng = np.random.default_rng(1)
    st = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    print("%s, 2^%d items; us per call (GPU time)" % (torch.cuda.get_device_name(), a.log2n))

    xh = rng.integers(0, 64, n).astype(np.int32)
    x = torch.as_tensor(xh, device="cuda")
    out = torch.zeros(64, dtype=torch.int32, device="cuda")
    ref = np.bincount(xh, minlength=64)
    for kind, name in ((0, "read"), (1, "atoms"), (2, "private")):
        k = floor_kernel(kind, 64)
        for grid in (132 * 4, 132 * 8):
            f = lambda: k[grid, NT, st](cuda.as_cuda_array(x), n, cuda.as_cuda_array(out))
            out.zero_(); f(); torch.cuda.synchronize()
            ok = kind == 0 or np.array_equal(out.cpu().numpy(), ref)
            print("floor %-8s 64 bins, grid %4d   %8.1f %s" % (name, grid, gpu_us(f), "" if ok else "WRONG"))

    print("%-26s" % "cufold._count" + "".join("%14s" % alg for alg in H.ALGORITHMS))
    for mode in ("int", "uniform"):
        for bins in (64, 1024, 65536):
            for dist in ("uniform", "skewed", "constant"):
                u = data(dist, n, rng)
                if mode == "int":
                    xh = np.minimum((u * bins).astype(np.int32), bins - 1)
                    ref = np.bincount(xh, minlength=bins)
                    edges, first, norm, last = H._dummy(0), 0.0, 0.0, 0.0
                else:
                    xh = (2 * u - 1).astype(np.float32)
                    ref, host_edges = np.histogram(xh, bins, range=(-1.0, 1.0))
                    edges = _arrays.describe(torch.as_tensor(host_edges.astype(np.float32), device="cuda"))
                    first, last, norm = -1.0, 1.0, bins / 2.0
                xa = _arrays.describe(torch.as_tensor(xh, device="cuda"))
                o = torch.zeros(bins, dtype=torch.int64, device="cuda")
                oa = _arrays.describe(o)
                h = _arrays.stream_handle(xa)
                cells = []
                for alg in H.ALGORITHMS:
                    if alg.startswith("shared") and not H._fits(bins, False):
                        cells.append("%14s" % "-")
                        continue
                    f = lambda: H._count(mode, xa, None, n, oa, bins, edges, first, norm, first, last, alg, h, 0)
                    f(); torch.cuda.synchronize()
                    ok = np.array_equal(o.cpu().numpy(), ref)
                    cells.append("%12.1f%s" % (gpu_us(f, 10), "  " if ok else " !"))
                print("%-26s" % ("%s %d %s" % (mode, bins, dist)) + "".join(cells), flush=True)

    xf = torch.rand(1 << 20, device="cuda") * 2 - 1
    xi = torch.randint(0, 64, (1 << 20,), device="cuda", dtype=torch.int32)
    calls = {"cufold.histogram range=": lambda: cufold.histogram(xf, 64, range=(-1.0, 1.0)),
             "torch.histc min=,max=": lambda: torch.histc(xf, 64, -1.0, 1.0),
             "cufold.bincount": lambda: cufold.bincount(xi, minlength=64),
             "torch.bincount": lambda: torch.bincount(xi, minlength=64)}
    for name, f in calls.items():
        print("host %-26s %8.1f us per call (2^20 items)" % (name, host_time(f)))


if __name__ == "__main__":
    main()
