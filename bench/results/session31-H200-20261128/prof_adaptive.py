"""Per-kernel GPU time (torch.profiler/CUPTI) of reduce_by_key_into at bench pyg's shapes,
F = 64 sum (CUFOLD_ROWS_ADAPTIVE_HW_F set by the caller), sorted and shuffled keys, and F = 64 max."""
import sys
import numpy as np
import torch
from torch.profiler import profile, ProfilerActivity
import cufold
from cufold.bench.bykey_tuple import power_law_keys

E, N, F = 4_000_000, 200_000, 64
dev = torch.device("cuda")
x = torch.rand((E, F), device=dev) * 2 - 1
out = torch.zeros((N, F), device=dev)
for order in ("sorted", "shuffled"):
    keys = torch.from_numpy(power_law_keys(E, N, order, 1)).to(dev)
    for name, op in (("sum", cufold.plus), ("max", cufold.maximum)):
        for _ in range(3):
            cufold.reduce_by_key_into(keys, x, out, op, check=False)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                cufold.reduce_by_key_into(keys, x, out, op, check=False)
            torch.cuda.synchronize()
        print("==== %s %s (5 calls)" % (order, name))
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
