"""Prototype: reduce by key through a partition by key range (session 11 experiment).

Pass 1 (``split``): each block takes a tile, counts its keys per bucket of ``2^shift``
consecutive keys in shared memory, reserves room in each bucket's slab of the workspace
(one global atomic per bucket per tile), stages the tile in shared memory by bucket and
writes it out as runs: per element a uint16 offset in the bucket and the value. A bucket
slab that is full sends the rest straight to ``out`` by atomics (still correct).
Pass 2 (``merge``): a block per bucket adds its slab into a shared window of ``2^shift``
float64 and adds the window to ``out`` (consecutive lanes, consecutive cells), then
zeroes the bucket's cursor for the next call.

``--chunk C`` runs the pair of passes per chunk of C elements so the workspace can stay
in L2. Configs starting ``c:`` (``c:NTxVT:shift:merge_threads``) replace the cursors by a
count pass and a scan of the per-tile bucket counts (``count``, ``split2``, ``merge2``:
the workspace is exactly n, no global atomics in the split). Prints us per call against
cupyx.scatter_add in the same run, and the passes apart.

H200 results (session 11, docs/performance.md): random keys take 530 us with cursors (the
cursor atomics alone ~250 us) and 224 us counted (count 33, scan 12, split 127, merge 49),
against cupyx's 112 us. Not in the library.

    PYTHONPATH=$PWD/.site:$PWD/src python3 tools/partition_proto.py --orders random \
        --configs c:256x8:12:1024
"""

import argparse
import statistics
import sys

import numpy as np
from numba import cuda, float64, int32, uint16

NB_MAX = 1024


def make_split(NT, VT, hint, mode=0):
    """mode (ablation): 0 all; 1 no cursor atomics; 2 and no write-out; 3 and no staging."""
    T = NT * VT

    @cuda.jit
    def split(keys, values, start, stop, shift, nb, cap, cursor, ws_off, ws_val, out):
        s_count = cuda.shared.array(NB_MAX, int32)
        s_base = cuda.shared.array(NB_MAX, int32)
        s_glob = cuda.shared.array(NB_MAX, int32)
        s_key = cuda.shared.array(T, int32)
        s_val = cuda.shared.array(T, float64)
        tid = cuda.threadIdx.x
        for b in range(tid, nb, NT):
            s_count[b] = 0
        cuda.syncthreads()
        base = start + cuda.blockIdx.x * T
        ks = cuda.local.array(VT, int32)
        vs = cuda.local.array(VT, float64)
        rs = cuda.local.array(VT, int32)
        for j in range(VT):
            i = base + j * NT + tid
            if i < stop:
                if hint:
                    k = cuda.ldcs(keys, i)
                    v = cuda.ldcs(values, i)
                else:
                    k = keys[i]
                    v = values[i]
                ks[j] = k
                vs[j] = v
        for j in range(VT):
            i = base + j * NT + tid
            if i < stop:
                rs[j] = cuda.atomic.add(s_count, ks[j] >> shift, 1)
        cuda.syncthreads()
        # exclusive scan of the counts by warp 0; reserve each bucket's run
        if tid < 32:
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
                if c > 0:
                    if mode == 0:
                        s_glob[b] = cuda.atomic.add(cursor, b, c)
                    else:
                        s_glob[b] = (cuda.blockIdx.x * 16) % (cap - T)
                run += c
        cuda.syncthreads()
        if mode == 3:
            return
        for j in range(VT):
            i = base + j * NT + tid
            if i < stop:
                p = s_base[ks[j] >> shift] + rs[j]
                s_key[p] = ks[j]
                s_val[p] = vs[j]
        cuda.syncthreads()
        if mode == 2:
            return
        total = min(T, stop - base)
        mask = (1 << shift) - 1
        for j in range(VT):
            p = j * NT + tid
            if p < total:
                k = s_key[p]
                b = k >> shift
                g = s_glob[b] + (p - s_base[b])
                if g < cap:
                    ws_off[b * cap + g] = uint16(k & mask)
                    ws_val[b * cap + g] = s_val[p]
                else:
                    cuda.atomic.add(out, k, s_val[p])
    return split


def make_merge(NT, W):
    @cuda.jit
    def merge(cursor, cap, ws_off, ws_val, out, m):
        win = cuda.shared.array(W, float64)
        tid = cuda.threadIdx.x
        b = cuda.blockIdx.x
        cnt = min(cursor[b], cap)
        if cnt == 0:
            return
        for s in range(tid, W, NT):
            win[s] = -0.0
        cuda.syncthreads()
        if tid == 0:
            cursor[b] = 0
        row = b * cap
        for i in range(tid, cnt, NT):
            cuda.atomic.add(win, int32(ws_off[row + i]), ws_val[row + i])
        cuda.syncthreads()
        for s in range(tid, W, NT):
            c = b * W + s
            v = win[s]
            if c < m and v != 0.0:
                cuda.atomic.add(out, c, v)
    return merge


def make_count(NT, VT):
    T = NT * VT

    @cuda.jit
    def count(keys, n, shift, nb, ntiles, counts):
        s_count = cuda.shared.array(NB_MAX, int32)
        tid = cuda.threadIdx.x
        t = cuda.blockIdx.x
        for b in range(tid, nb, NT):
            s_count[b] = 0
        cuda.syncthreads()
        base = t * T
        for j in range(VT):
            i = base + j * NT + tid
            if i < n:
                cuda.atomic.add(s_count, cuda.ldcs(keys, i) >> shift, 1)
        cuda.syncthreads()
        for b in range(tid, nb, NT):
            counts[b * ntiles + t] = s_count[b]
    return count


def make_split2(NT, VT):
    """split at offsets from a scan of the counts: no cursors, the workspace exactly n."""
    T = NT * VT

    @cuda.jit
    def split2(keys, values, n, shift, nb, ntiles, offsets, ws_off, ws_val):
        s_count = cuda.shared.array(NB_MAX, int32)
        s_base = cuda.shared.array(NB_MAX, int32)
        s_glob = cuda.shared.array(NB_MAX, int32)
        s_key = cuda.shared.array(T, int32)
        s_val = cuda.shared.array(T, float64)
        tid = cuda.threadIdx.x
        t = cuda.blockIdx.x
        for b in range(tid, nb, NT):
            s_count[b] = 0
            s_glob[b] = offsets[b * ntiles + t]
        cuda.syncthreads()
        base = t * T
        ks = cuda.local.array(VT, int32)
        vs = cuda.local.array(VT, float64)
        rs = cuda.local.array(VT, int32)
        for j in range(VT):
            i = base + j * NT + tid
            if i < n:
                ks[j] = cuda.ldcs(keys, i)
                vs[j] = cuda.ldcs(values, i)
        for j in range(VT):
            i = base + j * NT + tid
            if i < n:
                rs[j] = cuda.atomic.add(s_count, ks[j] >> shift, 1)
        cuda.syncthreads()
        if tid < 32:
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
                s_base[b] = run
                run += s_count[b]
        cuda.syncthreads()
        for j in range(VT):
            i = base + j * NT + tid
            if i < n:
                p = s_base[ks[j] >> shift] + rs[j]
                s_key[p] = ks[j]
                s_val[p] = vs[j]
        cuda.syncthreads()
        total = min(T, n - base)
        mask = (1 << shift) - 1
        for j in range(VT):
            p = j * NT + tid
            if p < total:
                k = s_key[p]
                b = k >> shift
                g = s_glob[b] + (p - s_base[b])
                ws_off[g] = uint16(k & mask)
                ws_val[g] = s_val[p]
    return split2


def make_merge2(NT, W):
    @cuda.jit
    def merge2(offsets, ntiles, n, ws_off, ws_val, out, m):
        win = cuda.shared.array(W, float64)
        tid = cuda.threadIdx.x
        b = cuda.blockIdx.x
        lo = offsets[b * ntiles]
        hi = offsets[(b + 1) * ntiles] if (b + 1) * ntiles < offsets.size else n
        if lo == hi:
            return
        for s in range(tid, W, NT):
            win[s] = -0.0
        cuda.syncthreads()
        for i in range(lo + tid, hi, NT):
            cuda.atomic.add(win, int32(ws_off[i]), cuda.ldcs(ws_val, i))
        cuda.syncthreads()
        for s in range(tid, W, NT):
            c = b * W + s
            v = win[s]
            if c < m and v != 0.0:
                cuda.atomic.add(out, c, v)
    return merge2


def gpu_time(torch, call, reps, batches=3):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(batches):
        torch.cuda._sleep(20_000_000)
        start.record()
        for _ in range(reps):
            call()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(out)


def run_counted(cfg, torch, cupy, dk_all, n, m, ref, tp, order, reps, nstream):
    keys, values, out = dk_all
    _, tile, shift, NT2 = cfg.split(":")
    NT, VT = map(int, tile.split("x"))
    shift, NT2 = int(shift), int(NT2)
    W = 1 << shift
    nb = (m + W - 1) // W
    T = NT * VT
    ntiles = (n + T - 1) // T
    count, split2, merge2 = make_count(NT, VT), make_split2(NT, VT), make_merge2(NT2, W)
    counts_t = torch.zeros(nb * ntiles, dtype=torch.int32, device="cuda")
    offs_t = torch.zeros(nb * ntiles, dtype=torch.int32, device="cuda")
    ws_off = cuda.device_array(n, np.uint16, stream=nstream)
    ws_val = cuda.device_array(n, np.float64, stream=nstream)
    dk, dv, do = cuda.as_cuda_array(keys), cuda.as_cuda_array(values), cuda.as_cuda_array(out)
    dc, dof = cuda.as_cuda_array(counts_t), cuda.as_cuda_array(offs_t)

    def k1():
        count[ntiles, NT, nstream](dk, n, shift, nb, ntiles, dc)

    def k2():
        torch.cumsum(counts_t, 0, out=offs_t)
        offs_t.sub_(counts_t)

    def k3():
        split2[ntiles, NT, nstream](dk, dv, n, shift, nb, ntiles, dof, ws_off, ws_val)

    def k4():
        merge2[nb, NT2, nstream](dof, ntiles, n, ws_off, ws_val, do, m)

    def call():
        k1(); k2(); k3(); k4()
    out.zero_(); call(); torch.cuda.synchronize()
    ok = np.allclose(out.cpu().numpy(), ref)
    t = gpu_time(torch, call, reps)
    parts = [gpu_time(torch, f, reps) for f in (k1, k2, k3, k4)]
    print("%-8s counted %-30s %8.1f us  %.2fx %s  [count %.1f, scan %.1f, split %.1f, merge %.1f]"
          % (order, cfg, t, tp / t, "" if ok else "WRONG", *parts))


def main():
    import torch
    from cufold.bench.bykey import box_keys, box_values
    import cupy
    import cupyx
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="256x8:12:1024:0,256x8:12:1024:2000000,256x8:11:512:0,512x4:12:1024:0")
    p.add_argument("--orders", default="random,shifted,ordered")
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    side, m = 100, 100 ** 3
    nstream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    print(torch.cuda.get_device_name())
    for order in a.orders.split(","):
        kh = box_keys(side, 10, order, 12345).astype(np.int32)
        vh = box_values(kh.size, 12345)
        ref = np.bincount(kh, weights=vh, minlength=m)
        n = kh.size
        keys = torch.as_tensor(kh, device="cuda")
        values = torch.as_tensor(vh, device="cuda")
        out = torch.zeros(m, dtype=torch.float64, device="cuda")
        ck, cv, co = cupy.asarray(keys), cupy.asarray(values), cupy.asarray(out)
        peer = lambda: cupyx.scatter_add(co, ck, cv)
        out.zero_(); peer(); torch.cuda.synchronize()
        okp = np.allclose(out.cpu().numpy(), ref)
        tp = gpu_time(torch, peer, a.reps)
        print("%-8s cupyx.scatter_add %8.1f us %s" % (order, tp, "" if okp else "WRONG"))
        for cfg in a.configs.split(","):
            if cfg.startswith("c"):
                run_counted(cfg, torch, cupy, dk_all=(keys, values, out), n=n, m=m, ref=ref, tp=tp,
                            order=order, reps=a.reps, nstream=nstream)
                continue
            tile, shift, NT2, chunk = cfg.split(":")
            NT, VT = map(int, tile.split("m")[0].split("x"))
            shift, NT2, chunk = int(shift), int(NT2), int(chunk) or n
            W = 1 << shift
            nb = (m + W - 1) // W
            assert nb <= NB_MAX
            cap = int(min(chunk, n) / nb * 1.15) + 4096
            mode = int(tile.split("m")[1]) if "m" in tile else 0
            tile = tile.split("m")[0]
            split = make_split(NT, VT, True, mode)
            merge = make_merge(NT2, W)
            cursor_t = torch.zeros(nb, dtype=torch.int32, device="cuda")
            cursor = cuda.as_cuda_array(cursor_t)
            ws_off = cuda.device_array(nb * cap, np.uint16, stream=nstream)
            ws_val = cuda.device_array(nb * cap, np.float64, stream=nstream)
            dk, dv, do = cuda.as_cuda_array(keys), cuda.as_cuda_array(values), cuda.as_cuda_array(out)
            T = NT * VT

            def call(split_only=False):
                for s0 in range(0, n, chunk):
                    s1 = min(s0 + chunk, n)
                    split[(s1 - s0 + T - 1) // T, NT, nstream](dk, dv, s0, s1, shift, nb, cap, cursor,
                                                               ws_off, ws_val, do)
                    if not split_only:
                        merge[nb, NT2, nstream](cursor, cap, ws_off, ws_val, do, m)
            out.zero_(); call(); torch.cuda.synchronize()
            ok = np.allclose(out.cpu().numpy(), ref)
            t = gpu_time(torch, call, a.reps)
            ts = gpu_time(torch, lambda: (call(True), cursor_t.zero_()), a.reps)
            print("%-8s   split only + cursor memset %8.1f us" % (order, ts))
            print("%-8s partition %-28s %8.1f us  %.2fx %s" % (order, cfg, t, tp / t, "" if ok else "WRONG"))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
