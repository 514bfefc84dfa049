"""A prototype for #19's few long columns (``cumsum(axis=0)`` of (2^20, 16) float32, at 62% of the
clone with the column tiles): *chunks folded, then scanned again from L2*, one look-back a chunk for
all its columns. Standalone (float32 sum only, C = 8, 16 or 32 columns of a C-contiguous (L, C)
array): it measures whether the design pays before it becomes a kernel factory.

Block of 256 threads; a row is C floats, read as C/4 16-byte loads by C/4 neighbouring threads,
so a warp's load covers 8 whole rows of 64 B (C = 16). Thread ``(y, q)`` owns ``S*K`` consecutive
rows of its chunk (columns ``4q .. 4q+3``):

1. fold: its rows, ``S`` loads in flight at a time (plain loads: the data stay in L2);
2. the block's exclusive scan of the threads' folds, per column (shuffles inside a warp, the
   warps' totals in shared memory), and the chunk's total; warp 0 publishes it (a packed word a
   column: status and value in one 64-bit word, no fence) and looks back over a window of 32
   chunks, each lane one chunk's C words, then publishes the inclusive prefix;
3. scan: the thread reads its rows again (``ld.global.cs``: from L2 if they stayed), scans them
   after its carry and stores them (``st.global.cs.v4``).

Nothing but the fold's per-thread totals and the carries live across the look-back, so many
blocks fit an SM; the chunk's data wait in L2 (blocks in flight x chunk bytes must fit it).
``--hold`` keeps a thread's one batch in registers instead (``K = 1``: no second read).

    PYTHONPATH=src:tools python bench/results/session37-H200-20261203/branches/chunkscan_probe.py
    (... --sk 8x1,8x1h,8x1r64 1048576x16: batches SxK, h held in registers, rN a register cap)
"""
import sys

import numpy as np
import torch
from llvmlite import ir
from numba import config, cuda, types
from numba.cuda.extending import intrinsic

import cufold
from gpu_timing import rotating_us

NT = 256
FULL = 0xFFFFFFFF
AGG, PRE = 1, 2


SIM = bool(config.ENABLE_CUDASIM)


def _vec(text, side_effect):
    if SIM:
        @cuda.jit(device=True)
        def plain(array, i):
            return array[i], array[i + 1], array[i + 2], array[i + 3]
        return plain

    def load(typingctx, array, index):
        sig = types.UniTuple(types.float32, 4)(array, types.int64)

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
            ptr = builder.gep(data, [args[1]])
            f = ir.FloatType()
            fn = ir.FunctionType(ir.LiteralStructType([f] * 4), [ptr.type])
            asm = ir.InlineAsm(fn, text + " {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l" +
                               (",~{memory}" if side_effect else ""), side_effect=side_effect)
            got = builder.call(asm, [ptr])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(got, j) for j in range(4)])
        return sig, codegen
    return intrinsic(load)


load_keep = _vec("ld.global.v4.f32", False)       # the fold's read: the line stays in L2
load_last = _vec("ld.global.cs.v4.f32", False)    # the scan's read: evict first


def _store4(typingctx, array, index, a, b, c, d):
    sig = types.void(array, types.int64, types.float32, types.float32, types.float32, types.float32)

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
        ptr = builder.gep(data, [args[1]])
        f = ir.FloatType()
        fn = ir.FunctionType(ir.VoidType(), [ptr.type, f, f, f, f])
        builder.call(ir.InlineAsm(fn, "st.global.cs.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f,~{memory}",
                                  side_effect=True), [ptr] + list(args[2:]))
        return context.get_dummy_value()
    return sig, codegen


if SIM:
    @cuda.jit(device=True)
    def store4(array, i, a, b, c, d):
        array[i] = a
        array[i + 1] = b
        array[i + 2] = c
        array[i + 3] = d
else:
    store4 = intrinsic(_store4)


_kernels = {}


def kernel(C, S, K, hold, regs=0):
    """The kernel for C columns, batches of S rows, K batches a thread (``hold``: K = 1, the
    batch kept in registers across the look-back); ``regs``: ptxas's register cap (0: none)."""
    key = (C, S, K, hold, regs)
    if key in _kernels:
        return _kernels[key]
    Q = C // 4                 # threads a row
    W = NT // 32
    ROWS = S * K               # a thread's rows
    CHUNK = (NT // Q) * ROWS   # a chunk's rows
    nan = np.float64(np.nan)
    ALL = (1 << C) - 1

    @cuda.jit(device=True, inline="always")
    def word_of(tag, status, v):
        return (np.uint64(tag | np.uint32(status)) << np.uint64(32)) | np.uint64(v.view(np.uint32))

    jit = cuda.jit(max_registers=regs) if regs else cuda.jit

    @jit
    def scan_chunks(x, out, length, counter, launch, words, wordsf):
        tid = cuda.threadIdx.x
        lane = cuda.laneid
        w = tid >> 5
        q = tid % Q
        y = tid // Q
        tick = cuda.shared.array(1, np.int64)
        wt = cuda.shared.array((W, C), np.float32)      # the warps' totals
        pre = cuda.shared.array(C, np.float32)          # the chunk's exclusive prefix
        if tid == 0:
            tick[0] = np.int64(cuda.atomic.add(counter, launch, np.uint64(1)))
        cuda.syncthreads()
        t = tick[0]
        tag = np.uint32(launch + 1) << np.uint32(2)
        row0 = t * CHUNK + y * ROWS
        col = 4 * q
        # 1. the fold of the thread's rows
        a0 = np.float32(0)
        a1 = np.float32(0)
        a2 = np.float32(0)
        a3 = np.float32(0)
        held = cuda.local.array((S, 4), np.float32)
        for k in range(K):
            base = row0 + k * S
            for s in range(S):
                r = base + s
                if r < length:
                    v0, v1, v2, v3 = load_keep(x, r * C + col)
                    if hold:
                        held[s, 0] = v0
                        held[s, 1] = v1
                        held[s, 2] = v2
                        held[s, 3] = v3
                    a0 += v0
                    a1 += v1
                    a2 += v2
                    a3 += v3
        # 2. the scan of the folds down each column: inside the warp (lanes Q apart), then the warps
        i0, i1, i2, i3 = a0, a1, a2, a3
        d = Q
        while d < 32:
            u0 = cuda.shfl_up_sync(FULL, i0, d)
            u1 = cuda.shfl_up_sync(FULL, i1, d)
            u2 = cuda.shfl_up_sync(FULL, i2, d)
            u3 = cuda.shfl_up_sync(FULL, i3, d)
            if lane >= d:
                i0 += u0
                i1 += u1
                i2 += u2
                i3 += u3
            d *= 2
        if lane >= 32 - Q:
            wt[w, col] = i0
            wt[w, col + 1] = i1
            wt[w, col + 2] = i2
            wt[w, col + 3] = i3
        cuda.syncthreads()
        if w == 0:
            c = lane % C
            total = np.float32(0)
            for j in range(W):
                total += wt[j, c]
            if t == 0:
                if lane < C:
                    cuda.atomic.exch(words, c, word_of(tag, PRE, total))
                    pre[c] = np.float32(0)
            else:
                if lane < C:
                    cuda.atomic.exch(words, t * C + c, word_of(tag, AGG, total))
                vals = cuda.local.array(C, np.float32)
                stat = cuda.local.array(C, np.uint32)
                excl = cuda.local.array(C, np.float32)
                for cc in range(C):
                    excl[cc] = np.float32(0)
                open_ = np.uint32(ALL)
                top = t - 1
                while open_ != 0:
                    j = top - 31 + lane
                    while True:
                        ok = True
                        for cc in range(C):
                            stat[cc] = np.uint32(3)        # before chunk 0: a prefix of nothing
                            vals[cc] = np.float32(0)
                            if j >= 0 and (open_ >> np.uint32(cc)) & np.uint32(1):
                                wd = cuda.atomic.nanmax(wordsf, j * C + cc, nan).view(np.uint64)
                                hi = np.uint32(wd >> np.uint64(32))
                                st = np.uint32(0)
                                if (hi >> np.uint32(2)) == (tag >> np.uint32(2)):
                                    st = hi & np.uint32(3)
                                stat[cc] = st
                                vals[cc] = np.uint32(wd & np.uint64(0xFFFFFFFF)).view(np.float32)
                                if st == 0:
                                    ok = False
                        if cuda.all_sync(FULL, ok):
                            break
                    for cc in range(C):
                        if (open_ >> np.uint32(cc)) & np.uint32(1):
                            prefixes = cuda.ballot_sync(FULL, stat[cc] >= 2)
                            start = 31 - cuda.clz(prefixes) if prefixes != 0 else 0
                            v = vals[cc] if lane >= start else np.float32(0)
                            for off in (16, 8, 4, 2, 1):
                                v += cuda.shfl_xor_sync(FULL, v, off)
                            excl[cc] += v
                            if prefixes != 0:
                                open_ &= ~(np.uint32(1) << np.uint32(cc))
                    top -= 32
                for cc in range(C):
                    if lane == cc:
                        pre[cc] = excl[cc]
                        cuda.atomic.exch(words, t * C + cc, word_of(tag, PRE, excl[cc] + total))
        cuda.syncthreads()
        # 3. the rows again, scanned after the carry: the chunks before, the warps before, the lanes before
        c0 = pre[col] + (i0 - a0)
        c1 = pre[col + 1] + (i1 - a1)
        c2 = pre[col + 2] + (i2 - a2)
        c3 = pre[col + 3] + (i3 - a3)
        for j in range(W):
            if j < w:
                c0 += wt[j, col]
                c1 += wt[j, col + 1]
                c2 += wt[j, col + 2]
                c3 += wt[j, col + 3]
        for k in range(K):
            base = row0 + k * S
            for s in range(S):
                r = base + s
                if r < length:
                    if hold:
                        v0 = held[s, 0]
                        v1 = held[s, 1]
                        v2 = held[s, 2]
                        v3 = held[s, 3]
                    else:
                        v0, v1, v2, v3 = load_last(x, r * C + col)
                    c0 += v0
                    c1 += v1
                    c2 += v2
                    c3 += v3
                    store4(out, r * C + col, c0, c1, c2, c3)

    _kernels[key] = (scan_chunks, CHUNK)
    return _kernels[key]


class ChunkScan:
    """cumsum(axis=0) of (L, C) float32 tensors by the prototype; launches numbered for the tags."""

    def __init__(self, shape, S, K, hold, regs=0):
        self.L, self.C = shape
        self.k, chunk = kernel(self.C, S, K, hold, regs)
        self.chunks = -(-self.L // chunk)
        self.words = cuda.to_device(np.zeros(self.chunks * self.C, np.uint64))
        self.wordsf = self.words.view(np.float64)
        self.counter = cuda.to_device(np.zeros(1 << 16, np.uint64))
        self.launch = 0

    def __call__(self, x, out):
        self.launch += 1
        if SIM:
            self.k[self.chunks, NT](x.reshape(-1), out.reshape(-1), self.L, self.counter, self.launch,
                                    self.words, self.wordsf)
            return out
        xs, os_ = cuda.as_cuda_array(x.view(-1)), cuda.as_cuda_array(out.view(-1))
        self.k[self.chunks, NT, cuda.external_stream(torch.cuda.current_stream().cuda_stream)](
            xs, os_, self.L, self.counter, self.launch, self.words, self.wordsf)
        return out


def simulate(L=2100, C=16, S=2, K=2, hold=False):
    """The prototype in Numba's simulator against NumPy (NUMBA_ENABLE_CUDASIM=1)."""
    x = np.random.default_rng(0).integers(-8, 8, (L, C)).astype(np.float32)
    out = np.full_like(x, np.nan)
    p = ChunkScan((L, C), S, K, hold)
    for _ in range(2):
        p(x, out)
        assert np.array_equal(out, np.cumsum(x, axis=0)), np.abs(out - np.cumsum(x, axis=0)).max()
        out[:] = np.nan
    print("simulated ok", L, C, S, K, hold, "chunks", p.chunks)


def main(argv):
    sks = [(8, 1, False, 0), (8, 1, True, 0), (8, 2, False, 0), (4, 2, False, 0), (16, 1, False, 0),
           (8, 1, False, 64), (8, 2, False, 64), (8, 1, False, 40), (8, 1, False, 32)]
    shapes = []
    spec = argv[argv.index("--sk") + 1] if "--sk" in argv else None
    for a in argv:
        if a != "--sk" and a != spec:
            shapes.append(tuple(int(v) for v in a.split("x")))
    if spec:
        sks = []
        for part in spec.split(","):            # SxK[h][rN]: h holds the batch, rN caps registers
            a, b = part.split("x")
            b, _, r = b.partition("r")
            sks.append((int(a), int(b.rstrip("h")), b.endswith("h"), int(r or 0)))
    shapes = shapes or [(1 << 20, 16), (1 << 19, 32), (1 << 21, 8)]
    g = torch.Generator(device="cuda").manual_seed(1)
    for shape in shapes:
        xs = [torch.randint(-8, 8, shape, device="cuda", generator=g).float() for _ in range(3)]
        outs = [torch.full_like(xs[0], np.nan) for _ in range(3)]
        want = torch.cumsum(xs[0].double(), dim=0)
        clone = rotating_us(lambda x: x.clone(), xs)
        ours = rotating_us(lambda x: cufold.cumsum(x, axis=0), xs)
        tor = rotating_us(lambda x: torch.cumsum(x, dim=0), xs)
        print("%-14s clone %6.1f  cufold %6.1f (%3.0f%%)  torch %6.1f" % (
            "x".join(map(str, shape)), clone, ours, 100 * clone / ours, tor))
        for S, K, hold, regs in sks:
            if hold and K != 1:
                continue
            p = ChunkScan(shape, S, K, hold, regs)
            got = p(xs[0], outs[0]).double()
            ok = torch.equal(got, want)
            it = iter(range(1 << 30))
            us = rotating_us(lambda x: p(x, outs[next(it) % 3]), xs)
            bad = 0
            for _ in range(10):                 # look-back races: exact integers, or a wrong carry
                outs[0].fill_(np.nan)
                bad += not torch.equal(p(xs[0], outs[0]).double(), want)
            ok = ok and not bad
            print("   chunks S=%-2d K=%d%s r%-3d %6.1f (%3.0f%% of clone) chunk %5d rows  %s" % (
                S, K, " hold" if hold else "     ", regs, us, 100 * clone / us, kernel(shape[1], S, K, hold, regs)[1],
                "ok" if ok else "WRONG (max err %g, %d of 10 repeats wrong)" % (
                    (got - want).abs().max().item(), bad)))


if __name__ == "__main__":
    if SIM:
        simulate(2100, 16, 2, 2, False)
        simulate(700, 8, 2, 1, True)
        simulate(300, 32, 1, 2, False)
    else:
        main(sys.argv[1:])
