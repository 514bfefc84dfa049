"""Prototype: reduce by key through a partition by key range (session 11 experiment).

Buckets are ``2^shift`` consecutive keys. Pass 1 (``split``): each block takes a tile,
ranks its keys per bucket with shared-memory counts, stages the tile in shared memory by
bucket and writes it out as runs, per element a uint16 offset in the bucket and the
value. Pass 2 (``merge``): a block per bucket adds its pairs into a shared window of
``2^shift`` float64 and adds the window to ``out`` (consecutive lanes, consecutive cells).

Where a tile's runs go, two ways (``--configs``, comma-separated):

- ``cursor:NTxVT:shift:merge_threads[:chunk]``: each bucket has a slab of ``cap`` slots
  and a cursor; a tile reserves its run by one global atomic per bucket, a full slab
  sends the rest straight to ``out`` (still correct), and the merge zeroes the cursors
  for the next call. ``chunk`` > 0 runs both passes per chunk of that many elements, so
  the workspace could stay in L2.
- ``counted:NTxVT:shift:merge_threads``: a count pass writes the per-tile bucket counts
  (bucket-major) and a scan of them gives every run its place: the workspace is exactly
  n, no atomics in the split.

Prints us per call against cupyx.scatter_add in the same run, and the passes apart.
H200 results (session 11, docs/performance.md): random keys take 328 us with cursors and
221-224 us counted (count 33, scan 12, split 123-127, merge 49), against cupyx's 112 us.
Not in the library.

    PYTHONPATH=$PWD/.site:$PWD/src python3 tools/partition_proto.py --orders random \\
        --configs counted:256x8:12:1024
"""

import argparse
import sys

import numpy as np
from numba import cuda, float64, int32, uint16

NB_MAX = 1024


def make_count(NT, VT):
    """``count(keys, n, shift, nb, ntiles, counts)``: ``counts[b * ntiles + tile]``."""
    T = NT * VT

    @cuda.jit
    def count(keys, n, shift, nb, ntiles, counts):
        s_count = cuda.shared.array(NB_MAX, int32)
        tid = cuda.threadIdx.x
        t = cuda.blockIdx.x
        for b in range(tid, nb, NT):
            s_count[b] = 0
        cuda.syncthreads()
        for j in range(VT):
            i = t * T + j * NT + tid
            if i < n:
                cuda.atomic.add(s_count, cuda.ldcs(keys, i) >> shift, 1)
        cuda.syncthreads()
        for b in range(tid, nb, NT):
            counts[b * ntiles + t] = s_count[b]
    return count


def make_split(NT, VT, counted):
    """``split(keys, values, start, stop, shift, nb, ntiles, cap, places, ws_off, ws_val,
    out)``; ``places``: the scanned counts (``counted``) or the buckets' cursors."""
    T = NT * VT

    @cuda.jit
    def split(keys, values, start, stop, shift, nb, ntiles, cap, places, ws_off, ws_val, out):
        s_count = cuda.shared.array(NB_MAX, int32)
        s_base = cuda.shared.array(NB_MAX, int32)      # the bucket's run within the tile
        s_glob = cuda.shared.array(NB_MAX, int32)      # ... and in the workspace
        s_key = cuda.shared.array(T, int32)
        s_val = cuda.shared.array(T, float64)
        tid = cuda.threadIdx.x
        t = cuda.blockIdx.x
        for b in range(tid, nb, NT):
            s_count[b] = 0
            if counted:
                s_glob[b] = places[b * ntiles + t]
        cuda.syncthreads()
        base = start + t * T
        ks = cuda.local.array(VT, int32)
        vs = cuda.local.array(VT, float64)
        rs = cuda.local.array(VT, int32)
        for j in range(VT):
            i = base + j * NT + tid
            if i < stop:
                ks[j] = cuda.ldcs(keys, i)
                vs[j] = cuda.ldcs(values, i)
        for j in range(VT):
            if base + j * NT + tid < stop:
                rs[j] = cuda.atomic.add(s_count, ks[j] >> shift, 1)
        cuda.syncthreads()
        if tid < 32:                                   # exclusive scan of the counts, warp 0
            per = (nb + 31) // 32
            lo = tid * per
            hi = min(lo + per, nb)
            s = 0
            for b in range(lo, hi):
                s += s_count[b]
            incl = s
            for d in (1, 2, 4, 8, 16):
                o = cuda.shfl_up_sync(0xFFFFFFFF, incl, d)
                if tid >= d:
                    incl += o
            run = incl - s
            for b in range(lo, hi):
                c = s_count[b]
                s_base[b] = run
                if not counted and c > 0:
                    s_glob[b] = b * cap + cuda.atomic.add(places, b, c)
                run += c
        cuda.syncthreads()
        for j in range(VT):
            if base + j * NT + tid < stop:
                p = s_base[ks[j] >> shift] + rs[j]
                s_key[p] = ks[j]
                s_val[p] = vs[j]
        cuda.syncthreads()
        mask = (1 << shift) - 1
        for j in range(VT):
            p = j * NT + tid
            if p < min(T, stop - base):
                k = s_key[p]
                b = k >> shift
                g = s_glob[b] + (p - s_base[b])
                if counted or g < (b + 1) * cap:
                    ws_off[g] = uint16(k & mask)
                    ws_val[g] = s_val[p]
                else:                                  # the bucket's slab is full
                    cuda.atomic.add(out, k, s_val[p])
    return split


def make_merge(NT, W, counted):
    """``merge(places, ntiles, n, cap, ws_off, ws_val, out, m)``: bucket ``blockIdx.x``."""
    @cuda.jit
    def merge(places, ntiles, n, cap, ws_off, ws_val, out, m):
        win = cuda.shared.array(W, float64)
        tid = cuda.threadIdx.x
        b = cuda.blockIdx.x
        if counted:
            lo = places[b * ntiles]
            hi = places[(b + 1) * ntiles] if (b + 1) * ntiles < places.size else n
        else:
            lo = b * cap
            hi = lo + min(places[b], cap)
        if lo == hi:
            return
        for s in range(tid, W, NT):
            win[s] = -0.0                              # x + -0.0 == x for every x
        cuda.syncthreads()
        if not counted and tid == 0:
            places[b] = 0                              # the cursor, for the next call
        for i in range(lo + tid, hi, NT):
            cuda.atomic.add(win, int32(ws_off[i]), cuda.ldcs(ws_val, i))
        cuda.syncthreads()
        for s in range(tid, W, NT):
            c = b * W + s
            v = win[s]
            if c < m and v != 0.0:
                cuda.atomic.add(out, c, v)
    return merge


def partition(cfg, torch, n, m):
    """``passes(keys, values, out) -> {pass name: call}`` of one config (int32 keys,
    float64 values and out, torch tensors); calling them in order adds into ``out``."""
    fields = cfg.split(":")
    kind, (NT, VT), shift, NT2 = fields[0], map(int, fields[1].split("x")), int(fields[2]), int(fields[3])
    counted = kind == "counted"
    chunk = n if counted or len(fields) < 5 or int(fields[4]) == 0 else int(fields[4])
    W, T = 1 << shift, NT * VT
    nb = -(-m // W)
    assert nb <= NB_MAX
    cap = n if counted else int(min(chunk, n) / nb * 1.15) + 4096
    count_k, split, merge = make_count(NT, VT), make_split(NT, VT, counted), make_merge(NT2, W, counted)
    ws_off = torch.empty(n if counted else nb * cap, dtype=torch.int16, device="cuda")
    ws_val = torch.empty(ws_off.numel(), dtype=torch.float64, device="cuda")
    ntiles = -(-n // T)
    counts = torch.zeros(nb * ntiles if counted else 1, dtype=torch.int32, device="cuda")
    places = torch.zeros(nb * ntiles if counted else nb, dtype=torch.int32, device="cuda")
    st = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    wo, wv, dp = cuda.as_cuda_array(ws_off).view(np.uint16), cuda.as_cuda_array(ws_val), cuda.as_cuda_array(places)

    def passes(keys, values, out):
        dk, dv, do = cuda.as_cuda_array(keys), cuda.as_cuda_array(values), cuda.as_cuda_array(out)

        def count():
            count_k[ntiles, NT, st](dk, n, shift, nb, ntiles, cuda.as_cuda_array(counts))

        def scan():
            torch.cumsum(counts, 0, out=places)
            places.sub_(counts)

        def split_all():
            for s0 in range(0, n, chunk):
                s1 = min(s0 + chunk, n)
                split[-(-(s1 - s0) // T), NT, st](dk, dv, s0, s1, shift, nb, ntiles, cap, dp, wo, wv, do)
                if not counted and s1 < n:
                    merge[nb, NT2, st](dp, ntiles, n, cap, wo, wv, do, m)

        def merge_last():
            merge[nb, NT2, st](dp, ntiles, n, cap, wo, wv, do, m)
        steps = {"count": count, "scan": scan} if counted else {}
        steps.update(split=split_all, merge=merge_last)
        return steps
    return passes


def main():
    import torch
    import cupy
    import cupyx
    from cufold.bench.bykey import box_keys, box_values
    from gpu_timing import gpu_us
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="cursor:256x8:12:1024,cursor:256x8:12:1024:2000000,counted:256x8:12:1024,"
                                        "counted:128x16:12:1024")
    p.add_argument("--orders", default="random,shifted,ordered")
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    side, m = 100, 100 ** 3
    print(torch.cuda.get_device_name())
    for order in a.orders.split(","):
        kh = box_keys(side, 10, order, 12345).astype(np.int32)
        vh = box_values(kh.size, 12345)
        ref = np.bincount(kh, weights=vh, minlength=m)
        n = kh.size
        keys = torch.as_tensor(kh, device="cuda")
        values = torch.as_tensor(vh, device="cuda")
        out = torch.zeros(m, dtype=torch.float64, device="cuda")

        def checked(call):
            out.zero_()
            call()
            torch.cuda.synchronize()
            return np.allclose(out.cpu().numpy(), ref)
        ck, cv, co = cupy.asarray(keys), cupy.asarray(values), cupy.asarray(out)
        peer = lambda: cupyx.scatter_add(co, ck, cv)
        ok = checked(peer)
        tp = gpu_us(peer, a.reps)
        print("%-8s cupyx.scatter_add %8.1f us %s" % (order, tp, "" if ok else "WRONG"))
        for cfg in a.configs.split(","):
            steps = partition(cfg, torch, n, m)(keys, values, out)

            def call():
                for step in steps.values():
                    step()
            ok = checked(call)
            t = gpu_us(call, a.reps)
            # The counted passes alone (a cursor split without its merge would leave the
            # cursors full: timed as the pair only).
            parts = ", ".join("%s %.1f" % (name, gpu_us(step, a.reps)) for name, step in steps.items()
                              if "count" in steps)
            print("%-8s %-36s %8.1f us  %.2fx %s  [%s]" % (order, cfg, t, tp / t, "" if ok else "WRONG", parts))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
