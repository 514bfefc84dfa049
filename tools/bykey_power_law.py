"""reduce_by_key_into's algorithms (and ``deterministic=True``) on ``bench pyg``'s keys at
F = 1: 4M int64 keys into 200k slots, a power law sorted and shuffled, and uniform keys;
float32 sums and maxima, GPU time a call (``gpu_timing.gpu_us``), PyG's scatter beside them
where it imports. Each sum is checked against NumPy first.

H200 (session 26), us: shuffled power law: default 360.1, atomic 552.8, warp 207.8, block
67.1, table 362.6, deterministic 217.3, PyG 555.4; sorted: default 15.3, block 35.7;
uniform: every algorithm 50-55 (block 55.2).

Usage on the GPU machine (repo root): PYTHONPATH=src python3 tools/bykey_power_law.py [ALGS]
(ALGS: a comma-separated subset, ``none`` for the default; every algorithm by default)
"""
import sys
import numpy as np, torch
sys.path.insert(0, "tools")
from gpu_timing import gpu_us
import cufold
from cufold.bench.bykey_tuple import power_law_keys

E, N = 4_000_000, 200_000
ALGS = (None, "atomic", "warp", "block", "table", "runs2", "adaptive", "det")
if len(sys.argv) > 1:
    ALGS = tuple(None if a == "none" else a for a in sys.argv[1].split(","))
rng = np.random.default_rng(3)
cases = {"pl-sorted": power_law_keys(E, N, "sorted"), "pl-shuffled": power_law_keys(E, N, "shuffled"),
         "uniform": rng.integers(0, N, E)}
x = torch.as_tensor(rng.normal(size=E).astype(np.float32), device="cuda")
try:
    from torch_geometric.utils import scatter
except Exception:
    scatter = None
for name, kh in cases.items():
    k = torch.as_tensor(kh, device="cuda")
    want = np.zeros(N); np.add.at(want, kh, x.cpu().numpy().astype(np.float64))
    row = []
    for op, opname in ((cufold.plus, "sum"), (cufold.maximum, "max")):
        for alg in ALGS:
            out = torch.zeros(N, device="cuda") if opname == "sum" else torch.full((N,), -np.inf, device="cuda")
            kw = dict(deterministic=True) if alg == "det" else dict(algorithm=alg)
            if opname == "max" and alg not in (None, "warp", "table", "atomic"):
                continue                 # the maximum's paths: the default, and three to compare
            try:
                if opname == "sum":
                    o = torch.zeros(N, device="cuda")
                    cufold.reduce_by_key_into(k, x, o, op, check=False, **kw)
                    err = np.abs(o.cpu().numpy() - want).max()
                    assert err < 1e-2, err
                us = gpu_us(lambda: cufold.reduce_by_key_into(k, x, out, op, check=False, **kw))
                row.append("%s %s %.1f" % (opname, alg, us))
            except Exception as e:
                row.append("%s %s ERR %s" % (opname, alg, str(e)[:60]))
    if scatter is not None:
        row.append("PyG sum %.1f" % gpu_us(lambda: scatter(x, k, 0, dim_size=N, reduce="sum")))
        row.append("PyG max %.1f" % gpu_us(lambda: scatter(x, k, 0, dim_size=N, reduce="max")))
    print("%-12s " % name + " | ".join(row), flush=True)
