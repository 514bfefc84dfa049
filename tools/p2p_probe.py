"""What ``cufold.distributed``'s ``"p2p"`` all-reduce is built of, measured bare on a machine
of two GPUs: CUDA IPC between two ranks (``cuIpcOpenMemHandle``), a kernel reading the other
GPU's memory over NVLink (alone, and folding it with a local array), the copy into a staging
buffer, and NCCL's all-reduce of the same 192 MiB beside them. Each row is the slowest
rank's median of CUDA-event times after a barrier (so the ranks' skew leaving it is in).

2 x H200 (session 25, two calls): NCCL all-reduce 725-759 us; a kernel pulling 192 MiB from
the other GPU 640-719 (4-byte or 8-byte loads alike: 688-693); the fold 654-707; a copy
engine (``cuMemcpyDtoDAsync``, or torch's ``copy_``, which uses one) 546-559: why the
library's "p2p" sends by copies and folds in local memory.

Usage on the GPU machine (repo root, PYTHONPATH with numba-cuda): python3 tools/p2p_probe.py
"""
import ctypes, subprocess, sys, tempfile, time
import numpy as np

def rank_main(rank, world, store):
    import torch, torch.distributed as dist
    from numba import cuda
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + store, rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    torch.zeros(1, device="cuda")
    from cufold.host.peers import _CudaMemory, _Interface     # the library's own IPC buffers
    n = 3 << 24
    nbytes = n * 4
    memory = _CudaMemory(nbytes, rank)
    lib = memory.lib
    hs = [None] * world
    dist.all_gather_object(hs, memory.handle)
    peers = {}
    for r in range(world):
        if r == rank: continue
        t = time.perf_counter()
        peers[r] = memory.open(hs[r])
        print("rank", rank, "open", r, "%.0f us" % ((time.perf_counter() - t) * 1e6), flush=True)

    def CAI(p, n):
        return _Interface(p, n, "<f4")
    mine = torch.as_tensor(CAI(memory.ptr, n), device="cuda")
    print("rank", rank, "mine device", mine.device, flush=True)
    mine.fill_(rank + 1.0)
    other = (rank + 1) % world
    peer_nb = cuda.as_cuda_array(CAI(peers[other], n))
    x = torch.full((n,), 10.0 * (rank + 1), device="cuda")
    out = torch.empty(n, device="cuda")
    torch.cuda.synchronize(); dist.barrier()
    NT, IT = 256, 4
    @cuda.jit
    def fold(a, b, o, n):
        base = cuda.blockIdx.x * (NT * IT) + cuda.threadIdx.x
        if base + (IT - 1) * NT < n:
            va = cuda.local.array(IT, np.float32); vb = cuda.local.array(IT, np.float32)
            for k in range(IT):
                va[k] = a[base + k * NT]; vb[k] = b[base + k * NT]
            for k in range(IT):
                o[base + k * NT] = va[k] + vb[k]
        else:
            for k in range(IT):
                i = base + k * NT
                if i < n: o[i] = a[i] + b[i]
    def pull_kernel(items, word):
        """Kernel ``(b, o, n)``: ``o = b`` (n counts ``word`` items), ``items`` loads a thread
        issued before its first store; float32 words (4 bytes) or uint64 (8 bytes)."""
        @cuda.jit
        def pull(b, o, n):
            base = cuda.blockIdx.x * (NT * items) + cuda.threadIdx.x
            bw = b.view(word)
            ow = o.view(word)
            if base + (items - 1) * NT < n:
                vb = cuda.local.array(items, word)
                for k in range(items):
                    vb[k] = bw[base + k * NT]
                for k in range(items):
                    ow[base + k * NT] = vb[k]
        return pull
    pull, pull8, pull8x8 = pull_kernel(IT, np.float32), pull_kernel(IT, np.uint64), pull_kernel(8, np.uint64)
    grid = (n + NT * IT - 1) // (NT * IT)
    xn, on = cuda.as_cuda_array(x), cuda.as_cuda_array(out)
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    fold[grid, NT, stream](xn, peer_nb, on, n)
    torch.cuda.synchronize(); dist.barrier()
    want = 10.0 * (rank + 1) + other + 1.0
    print("rank", rank, "fold ok", bool((out == want).all()), flush=True)
    tiny = torch.zeros(1, device="cuda")
    def timed(label, fn, reps=15):
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize(); dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); fn(); e.record(); e.synchronize()
            ts.append(s.elapsed_time(e) * 1e3)
        med = float(np.median(ts))
        allm = [None] * world
        dist.all_gather_object(allm, med)
        if rank == 0:
            print("%-50s %9.1f us  (ranks %s)" % (label, max(allm), " ".join("%.1f" % v for v in allm)), flush=True)
    buf = torch.empty(n, device="cuda")
    timed("NCCL all_reduce 192 MiB", lambda: dist.all_reduce(buf))
    timed("NCCL all_reduce 1 item (barrier)", lambda: dist.all_reduce(tiny))
    timed("local copy 192 MiB (torch)", lambda: out.copy_(x))
    timed("copy x -> staging (torch)", lambda: mine.copy_(x))
    timed("kernel pull peer 192 MiB", lambda: pull[grid, NT, stream](peer_nb, on, n))
    timed("kernel fold x + peer 192 MiB", lambda: fold[grid, NT, stream](xn, peer_nb, on, n))
    timed("kernel pull peer, 8-byte loads, 4 a thread", lambda: pull8[grid // 2, NT, stream](peer_nb, on, n // 2))
    timed("kernel pull peer, 8-byte loads, 8 a thread", lambda: pull8x8[grid // 4, NT, stream](peer_nb, on, n // 2))
    lib.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    raw = torch.cuda.current_stream().cuda_stream
    timed("copy engine: cuMemcpyDtoDAsync peer -> local",
          lambda: lib.cuMemcpyDtoDAsync_v2(out.data_ptr(), peers[other], nbytes, raw))
    def whole():
        mine.copy_(x); dist.all_reduce(tiny); fold[grid, NT, stream](xn, peer_nb, on, n)
    timed("copy + barrier + fold", whole)
    try:
        pt = torch.as_tensor(CAI(peers[other], n), device="cuda")
        print("rank", rank, "peer tensor device", pt.device, flush=True)
        timed("torch copy_ from peer tensor", lambda: out.copy_(pt))
    except Exception as exc:
        print("rank", rank, "torch peer tensor failed:", exc, flush=True)
    torch.cuda.synchronize(); dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    if len(sys.argv) > 2:
        rank_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]); sys.exit(0)
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    store = tempfile.mktemp()
    ps = [subprocess.Popen([sys.executable, __file__, str(r), str(world), store]) for r in range(world)]
    sys.exit(max(p.wait(timeout=300) for p in ps))
