"""Temporary probe: scattered row updates, scalar atomics vs one red.global.add.v4.f32 a quad."""
import sys, numpy as np
sys.path.insert(0, "src")
import torch
from numba import cuda
import cufold
from cufold.atomics import add4, load4
from cufold.bench.bykey_tuple import power_law_keys

E, N = 4_000_000, 200_000

@cuda.jit
def k_read(keys, x, out, F):
    t = cuda.grid(1); Q = F // 4; r = t // Q; q = t % Q
    if r < keys.size:
        k = keys[r]; b = r * F + q * 4
        s = cuda.ldcs(x, b) + cuda.ldcs(x, b + 1) + cuda.ldcs(x, b + 2) + cuda.ldcs(x, b + 3)
        if s == 12345.5 and k == 7:
            out[0] = s

@cuda.jit
def k_scalar(keys, x, out, F):
    t = cuda.grid(1); Q = F // 4; r = t // Q; q = t % Q
    if r < keys.size:
        k = keys[r]; b = r * F + q * 4; o = k * F + q * 4
        for j in range(4):
            cuda.atomic.add(out, o + j, cuda.ldcs(x, b + j))

@cuda.jit
def k_vec(keys, x, out, F):
    t = cuda.grid(1); Q = F // 4; r = t // Q; q = t % Q
    if r < keys.size:
        k = keys[r]; b = r * F + q * 4
        add4(out, k * F + q * 4, cuda.ldcs(x, b), cuda.ldcs(x, b + 1), cuda.ldcs(x, b + 2), cuda.ldcs(x, b + 3))

@cuda.jit
def k_vecld(keys, x, out, F):
    t = cuda.grid(1); Q = F // 4; r = t // Q; q = t % Q
    if r < keys.size:
        k = keys[r]
        a, b, c, d = load4(x, r * F + q * 4)
        add4(out, k * F + q * 4, a, b, c, d)

@cuda.jit
def k_imax(keys, x, out_i, out_u, F):
    # float max by integer atomics: >= 0 as int32 max, < 0 as uint32 min
    t = cuda.grid(1); Q = F // 4; r = t // Q; q = t % Q
    if r < keys.size:
        k = keys[r]; b = r * F + q * 4; o = k * F + q * 4
        for j in range(4):
            v = cuda.ldcs(x, b + j)
            w = v.view(np.int32)
            if w >= 0:
                cuda.atomic.max(out_i, o + j, w)
            else:
                cuda.atomic.min(out_u, o + j, v.view(np.uint32))

def med(fn, reps=30):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e) * 1e3)
    return float(np.median(ts))

dev = torch.device("cuda")
keys_h = {o: power_law_keys(E, N, o, 1) for o in ("sorted", "shuffled")}
rows = []
for F in (16, 64, 256):
    x = torch.rand((E, F), device=dev) * 2 - 1
    xf = cuda.as_cuda_array(x.view(-1))
    for order in ("shuffled", "sorted"):
        kt = torch.from_numpy(keys_h[order]).to(dev)
        kd = cuda.as_cuda_array(kt)
        out = torch.zeros((N, F), device=dev)
        of = cuda.as_cuda_array(out.view(-1))
        oi = cuda.as_cuda_array(out.view(-1).view(torch.int32))
        ou = cuda.as_cuda_array(out.view(-1).view(torch.int32)).view(np.uint32)
        nt = 256; grid = -(-E * (F // 4) // nt)
        res = {}
        for name, kern in (("read", k_read), ("scalar", k_scalar), ("vec", k_vec), ("vecld", k_vecld)):
            res[name] = med(lambda: kern[grid, nt](kd, xf, of, F))
        # correctness of vec on feature 0..3
        out.zero_(); k_vecld[grid, nt](kd, xf, of, F); torch.cuda.synchronize()
        ref = np.bincount(keys_h[order], weights=x[:, 5].double().cpu().numpy(), minlength=N)
        ok = np.allclose(out[:, 5].double().cpu().numpy(), ref, rtol=1e-4, atol=1e-3)
        res["cufold sum"] = med(lambda: cufold.reduce_by_key_into(kt, x, out, check=False))
        def imax():
            out.fill_(-np.inf); k_imax[grid, nt](kd, xf, oi, ou, F)
        res["imax"] = med(imax)
        out.fill_(-np.inf); k_imax[grid, nt](kd, xf, oi, ou, F); torch.cuda.synchronize()
        refm = np.full(N, -np.inf); np.maximum.at(refm, keys_h[order], x[:, 3].double().cpu().numpy())
        okm = np.array_equal(out[:, 3].double().cpu().numpy(), refm)
        def cmax():
            out.fill_(-np.inf); cufold.reduce_by_key_into(kt, x, out, cufold.maximum, check=False)
        res["cufold max"] = med(cmax)
        res["fill"] = med(lambda: out.fill_(-np.inf))
        line = "F=%-3d %-8s " % (F, order) + " ".join("%s %.1f" % kv for kv in res.items()) + " ok=%s okmax=%s" % (ok, okm)
        print(line, flush=True)
    del x, xf
    torch.cuda.empty_cache()
