"""Where the time of two issue-21 cases goes, on a machine of two or more GPUs.

1. The Welford merge's elementwise kernels (``distributed._merge_kernels``) on one GPU
   (``gpu_timing.gpu_us``: batches queued behind a sleep, so no host time is counted)
   against a plain copy (the bandwidth they should reach) and against variants: one
   launch per block of contiguous items instead of a grid-stride loop, 1-D rows instead
   of the 2-D ``sums`` buffer. (Since session 24 the library's kernels are the tiled ones:
   the variants stay as the measurement that chose them.)
2. Under ``torch.profiler`` on every rank: ``all_reduce(welford)`` (kernel and NCCL
   times, and the idle GPU between them) and ``all_reduce(x)`` with ``check=True``
   (where its extra ~360 us goes), plus the host time of the agreement alone.

Usage on the GPU machine (repo root, PYTHONPATH set): python3 tools/dist_probe.py OUT_DIR
"""

import json
import os
import sys
import time

import numpy as np


def kernels_alone(out):
    """Part 1, on GPU 0."""
    import torch
    from numba import cuda
    from cufold import distributed as cd
    from gpu_timing import gpu_us

    n = 1 << 24
    dev = torch.device("cuda", 0)
    c = torch.full((n,), 4.0, device=dev)
    m = torch.randn(n, device=dev)
    m2 = torch.rand(n, device=dev)
    sums = torch.empty((2, n), device=dev)
    fields, key = cd._merge_args((c, m, m2), sums)
    rows = {}
    mib = n * 4 / 1e6
    rows["copy 1 field (2 passes)"] = gpu_us(lambda: sums[0].copy_(c))
    rows["library prepare (4 passes)"] = gpu_us(lambda: cd._MERGE.run(("prepare",) + key, *fields))
    rows["library finish (8 passes)"] = gpu_us(lambda: cd._MERGE.run(("finish",) + key, *fields))
    rows["torch prepare: copy + mul (4 passes)"] = gpu_us(
        lambda: (sums[0].copy_(c), torch.mul(c, m, out=sums[1])))

    items = 4
    nt = 256

    @cuda.jit
    def prepare_tiles(c, m, s0, s1, n):
        base = cuda.blockIdx.x * (nt * items) + cuda.threadIdx.x
        if base + (items - 1) * nt < n:
            a0 = c[base]
            a1 = c[base + nt]
            a2 = c[base + 2 * nt]
            a3 = c[base + 3 * nt]
            b0 = m[base]
            b1 = m[base + nt]
            b2 = m[base + 2 * nt]
            b3 = m[base + 3 * nt]
            s0[base] = a0
            s0[base + nt] = a1
            s0[base + 2 * nt] = a2
            s0[base + 3 * nt] = a3
            s1[base] = a0 * b0
            s1[base + nt] = a1 * b1
            s1[base + 2 * nt] = a2 * b2
            s1[base + 3 * nt] = a3 * b3
        else:
            for k in range(items):
                i = base + k * nt
                if i < n:
                    s0[i] = c[i]
                    s1[i] = c[i] * m[i]

    @cuda.jit
    def finish_tiles(c, m, m2, s0, s1, n):
        base = cuda.blockIdx.x * (nt * items) + cuda.threadIdx.x
        for k in range(items):
            i = base + k * nt
            if i < n:
                total = s0[i]
                mu = s1[i] / total if total > 0 else np.float32(0)
                d = m[i] - mu
                m2[i] = m2[i] + c[i] * d * d
                c[i] = total
                m[i] = mu

    @cuda.jit
    def prepare_stride(c, m, s0, s1, n):
        i = cuda.grid(1)
        while i < n:
            ci = c[i]
            s0[i] = ci
            s1[i] = ci * m[i]
            i += cuda.gridsize(1)

    s0, s1 = sums[0], sums[1]
    grid_tiles = -(-n // (nt * items))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows["tiles prepare, 1-D rows"] = gpu_us(lambda: prepare_tiles[grid_tiles, nt](c, m, s0, s1, n))
    rows["tiles finish, 1-D rows"] = gpu_us(lambda: finish_tiles[grid_tiles, nt](c, m, m2, s0, s1, n))
    rows["stride prepare, 1-D rows"] = gpu_us(lambda: prepare_stride[8 * sms, nt](c, m, s0, s1, n))
    rows["one item/thread prepare"] = gpu_us(lambda: prepare_stride[-(-n // nt), nt](c, m, s0, s1, n))
    passes = {"copy 1 field (2 passes)": 2, "library prepare (4 passes)": 4, "library finish (8 passes)": 8,
              "torch prepare: copy + mul (4 passes)": 4, "tiles prepare, 1-D rows": 4,
              "tiles finish, 1-D rows": 8, "stride prepare, 1-D rows": 4, "one item/thread prepare": 4}
    lines = ["%-40s %9.1f us  %6.0f GB/s" % (k, v, passes[k] * mib * 1e6 / v / 1e3) for k, v in rows.items()]
    with open(os.path.join(out, "kernels.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def _rank(rank, world, store, out):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + store, rank=rank, world_size=world)
    import cufold
    import cufold.distributed as cd
    dev = torch.device("cuda", rank)
    n = 1 << 24
    state = (torch.full((n,), 4.0, device=dev), torch.randn(n, device=dev), torch.rand(n, device=dev))
    x = torch.rand(1 << 28, device=dev)
    small = torch.rand(1024, device=dev)

    def welford():
        cd.all_reduce(state, cufold.welford, check=False)

    for _ in range(3):
        welford()
        cd.all_reduce(x)
    torch.cuda.synchronize()
    # host time of one call on an idle GPU (the agreement's wait included), small input
    host = {}
    for label, fn in (("all_reduce 1024 check=False", lambda: cd.all_reduce(small, check=False)),
                      ("all_reduce 1024 check=True", lambda: cd.all_reduce(small)),
                      ("torch all_reduce 1024", lambda: dist.all_reduce(small)),
                      ("welford 2^24 host (no sync)", welford)):
        ts = []
        for _ in range(20):
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        host[label] = float(np.median(ts))
    from torch.profiler import profile, ProfilerActivity, record_function
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            torch.cuda.synchronize()
            dist.barrier()
            with record_function("welford"):
                welford()
            torch.cuda.synchronize()
        for _ in range(3):
            torch.cuda.synchronize()
            dist.barrier()
            with record_function("check_true"):
                cd.all_reduce(x)
            torch.cuda.synchronize()
        for _ in range(3):
            torch.cuda.synchronize()
            dist.barrier()
            with record_function("check_false"):
                cd.all_reduce(x, check=False)
            torch.cuda.synchronize()
    prof.export_chrome_trace(os.path.join(out, "trace-rank%d.json" % rank))
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    with open(os.path.join(out, "profile-rank%d.txt" % rank), "w") as f:
        f.write(json.dumps(host, indent=1) + "\n" + table)
    if rank == 0:
        print(json.dumps(host, indent=1))
        print(table)
    dist.barrier()
    dist.destroy_process_group()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/dist-probe"
    os.makedirs(out, exist_ok=True)
    kernels_alone(out)
    import torch
    import torch.multiprocessing as mp
    world = torch.cuda.device_count()
    if world < 2:
        print("one GPU: no distributed part")
        return
    store = os.path.join(out, "store")
    if os.path.exists(store):
        os.remove(store)
    mp.spawn(_rank, args=(world, store, out), nprocs=world)


if __name__ == "__main__":
    main()
