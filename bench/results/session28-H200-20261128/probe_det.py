"""Kernels of one deterministic feature-row reduce_by_key_into (power-law shuffled keys)."""
import sys
import numpy as np
import torch
import cufold
from cufold.bench.bykey_tuple import power_law_keys
E, N = 4_000_000, 200_000
F = int(sys.argv[1]) if len(sys.argv) > 1 else 64
keys = torch.from_numpy(power_law_keys(E, N, "shuffled")).cuda()
vals = torch.rand(E, F, device="cuda")
out = torch.zeros(N, F, device="cuda")
for _ in range(3):
    cufold.reduce_by_key_into(keys, vals, out, deterministic=True)
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("measured")
cufold.reduce_by_key_into(keys, vals, out, deterministic=True)
torch.cuda.synchronize()
torch.cuda.nvtx.range_pop()
