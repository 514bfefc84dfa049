"""Quick GPU check + timing of cufold's reduce vs torch/cupy (a development aid;
the full benchmark is `python -m cufold bench reduce`)."""
import os, sys, time
import numpy as np
import torch, cupy
import cufold
from numba import cuda

def timeit(fn, reps=50):
    fn(); torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record(); fn(); b.record()
    torch.cuda.synchronize()
    gpu = np.median([a.elapsed_time(b) for a, b in ev]) * 1e3
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    call = (time.perf_counter() - t) / reps * 1e6
    return gpu, call

algs = sys.argv[1].split(",") if len(sys.argv) > 1 else [None]
print("%-12s %-10s %10s %10s %10s %10s  %s" % ("n", "alg", "cufold_gpu", "cufold_call", "torch_gpu", "torch_call", "check"))
for logn in (10, 16, 20, 24, 28):
    n = 1 << logn
    x = torch.rand(n, device="cuda") - 0.5
    ref = x.double().sum().item()
    for alg in algs:
        r = cufold.sum(x, algorithm=alg)
        got = float(r.item())
        ok = abs(got - ref) <= 1e-4 * x.abs().sum().item() + 1e-6
        cg, cc = timeit(lambda: cufold.sum(x, algorithm=alg))
        tg, tc = timeit(lambda: torch.sum(x))
        print("%-12s %-10s %10.1f %10.1f %10.1f %10.1f  %s bw=%.0f GB/s" % ("2^%d" % logn, alg, cg, cc, tg, tc, "OK" if ok else "BAD %r vs %r" % (got, ref), n * 4 / cg / 1e3))
