"""Block layer: cooperative reductions and scans over the threads of a block.

Each function here is a *factory*, as in :mod:`cufold.warp`: called on the
host with an operator, a value type and the block's shape, it returns a Numba
device function to call inside your own ``@cuda.jit`` kernel (CUB's
``BlockReduce`` / ``BlockScan``). Factories are cached. Every thread of the
block must call a block primitive (it contains ``cuda.syncthreads()``), from
the same place, with a block launched with exactly ``block_threads`` threads.

Threads are ranked by their linear id ``x + y*Dx + z*Dx*Dy`` (``block_threads``
may be an int or an ``(x, y, z)`` shape of 1..1024 threads, any size, not
necessarily a multiple of 32). With ``items_per_thread=k`` each thread holds
``k`` consecutive items (*blocked arrangement*: thread ``t`` holds items
``t*k .. t*k+k-1``). Operands are always combined in that order, so an
associative operator is enough; none of the algorithms needs commutativity
and none needs an identity except where said (an exclusive scan without
``initial``).

Algorithms (``N`` threads, ``W = ceil(N/32)`` warps; every one first folds a
thread's own items sequentially, in registers):

=================  ===========================================================
reduce ``warp``    seed 000's blockReduceSum: a shfl_down reduction in every
                   warp (the partial last warp guarded), one partial per warp
                   in shared memory, the first warp reduces the partials.
                   1 barrier, ``5 + log2(W)`` shuffle steps, ``W`` elements.
                   ``N <= 32``: one warp reduction, no barrier, no shared memory.
reduce ``raking``  CUB's BLOCK_REDUCE_RAKING: every thread stores its value,
                   the first warp rakes ``ceil(N/32)`` values each serially,
                   then warp-reduces the (at most 32) segment totals.
                   1 barrier, at most 5 shuffle steps, ``N`` (padded)
                   elements; ``N <= 32``: as ``warp``.
reduce ``tree``    seed 002's CTAReduce: a shared-memory fold, each pass half
                   the threads combine the other half. Values are stored at
                   bit-reversed positions so that this halving fold combines
                   in sequence order. ``ceil(log2 N)`` barriers, no shuffles,
                   ``2^ceil(log2 N)`` (padded) elements.
all_reduce         as reduce, then one more barrier to broadcast the total
                   (one shuffle when the block is a single warp).
scan ``warp``      seed 002's shfl CTAScan: Kogge-Stone warp scans, the first
                   warp scans the warp totals, every thread adds its warp's
                   prefix. 2 barriers, ``5 + log2(W)`` shuffle steps + 3,
                   ``W + 1`` elements; ``N <= 32``: no barrier, no shared memory.
scan ``kogge_stone``  seed 002's double-buffered CTAScan in shared memory:
                   ``ceil(log2 N)`` passes of one barrier each (+1 to store,
                   +1 with a ``prefix`` callback), no shuffles, ``2N`` elements,
                   ``N log N`` operator calls.
scan ``raking``    CUB's BLOCK_SCAN_RAKING: store, the first warp rakes serial
                   segments of ``ceil(N/32)`` values (upsweep), warp-scans the
                   segment totals, rakes again writing exclusive prefixes
                   (downsweep). 2 barriers, ``2 ceil(N/32)`` serial operator
                   calls per raking lane, ``N + 1`` (padded) elements;
                   ``N <= 32``: as ``warp``.
=================  ===========================================================

With its own shared memory (the default) a primitive also starts with one
``cuda.syncthreads()``, so that it may be called again and again (in a loop,
say) without a race on its storage; with ``storage=True`` that barrier is
yours to place (see :func:`temp_storage`). Primitives needing no shared
memory (``temp_items == 0``) have neither.

Registers: values (and a thread's items) stay in registers, so a big block
of wide values (a 4-tuple of int64 in a block of 640+ threads, say) can fail
to launch with ``CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES``; compile such kernels
with ``@cuda.jit(launch_bounds=block_threads)`` to cap the registers.

Temporary storage (seed 004 / CUB's ``TempStorage``): every primitive has the
attribute ``temp_items``, the number of value elements of shared memory it
uses (per field for a tuple value type). By default it allocates them itself
(static ``cuda.shared.array``). With ``storage=True`` its device function takes
a last argument ``temp``, shared memory you provide, typically from
:func:`temp_storage`; one buffer can serve several primitives in turn, with a
``cuda.syncthreads()`` between one's last use and the next one's first::

    red = cufold.block.reduce(cufold.plus, np.int32, 128, storage=True)
    scan = cufold.block.inclusive_scan(cufold.plus, np.int32, 128, storage=True)
    shared = cufold.block.temp_storage(np.int32, max(red.temp_items, scan.temp_items))

    @cuda.jit
    def kernel(x, out, total):
        temp = shared()
        i = cuda.grid(1)
        t = red(x[i], temp)
        cuda.syncthreads()          # before the buffer is used again
        out[i] = scan(x[i], temp)
        if cuda.threadIdx.x == 0:
            total[cuda.blockIdx.x] = t
"""

import functools

import numpy as np
from numba import cuda

from . import _codegen, thread, warp
from .ops import as_op
from .values import ValueType

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF
MAX_THREADS = 1024

#: Algorithm names accepted by the factories, per kind of primitive.
ALGORITHMS = {"reduce": ("warp", "raking", "tree"), "scan": ("warp", "kogge_stone", "raking")}


# --- host-side checks and helpers ------------------------------------------------

def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _shape(block_threads):
    """Normalise ``block_threads`` to ``((dx, dy, dz), n)``."""
    dims = tuple(block_threads) if isinstance(block_threads, (tuple, list)) else (block_threads,)
    if not 1 <= len(dims) <= 3 or not all(_is_int(d) and d >= 1 for d in dims):
        raise ValueError(
            "cufold: block_threads must be a positive int or an (x, y, z) shape of positive "
            "ints, got %r" % (block_threads,))
    dims = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    n = dims[0] * dims[1] * dims[2]
    if n > MAX_THREADS:
        raise ValueError(
            "cufold: a block has 1..%d threads; block_threads=%r has %d"
            % (MAX_THREADS, block_threads, n))
    return dims, n


def _items(items_per_thread):
    if not _is_int(items_per_thread) or items_per_thread < 1:
        raise ValueError(
            "cufold: items_per_thread must be a positive integer, got %r" % (items_per_thread,))
    return int(items_per_thread)


def _algorithm(kind, algorithm):
    names = ALGORITHMS[kind]
    if algorithm not in names:
        raise ValueError(
            "cufold: unknown block %s algorithm %r; valid names are %s"
            % (kind, algorithm, ", ".join(repr(a) for a in names)))
    return algorithm


def _next_pow2(n):
    p = 1
    while p < n:
        p *= 2
    return p


def _log2(p):
    return p.bit_length() - 1


def _pad(i):
    """Shared-memory index with one padding element per 32 (no bank conflicts
    when lanes stride by a multiple of 32)."""
    return i + (i >> 5)


def _bitrev(i, bits):
    return int(format(i, "0%db" % bits)[::-1], 2) if bits else 0


# --- shared memory -----------------------------------------------------------------

def temp_storage(dtype, items):
    """Return a device function ``() -> storage`` allocating shared memory for
    ``items`` values of ``dtype``: one array, or a tuple of arrays (one per
    field) for a tuple value type.

    Pass the storage as the last argument of primitives created with
    ``storage=True`` whose ``temp_items`` is at most ``items``. Each call of
    ``temp_storage`` makes a distinct buffer (it is not cached). The returned
    function is inlined where it is called (Numba returns no array from an
    ordinary device function that did not receive it) and each call site in a
    kernel is its own allocation on the GPU: call it once per kernel and pass
    the storage to every primitive that shares it. A buffer serves one
    primitive at a time: put a ``cuda.syncthreads()`` between the last use by
    one primitive and the first use by the next (or by your own code).

    Example::

        scan = cufold.block.exclusive_scan(cufold.plus, np.int32, 64, storage=True)
        shared = cufold.block.temp_storage(np.int32, scan.temp_items)

        @cuda.jit
        def kernel(x, out):
            temp = shared()
            out[cuda.grid(1)] = scan(x[cuda.grid(1)], temp)
    """
    vt = ValueType.of(dtype)
    if not _is_int(items) or items < 0:
        raise ValueError("cufold: temp_storage needs a number of items >= 0, got %r" % (items,))
    n = max(1, int(items))
    lines = ["    a%d = cuda.shared.array(%d, T%d)" % (i, n, i) for i in range(vt.arity)]
    src = "def temp_storage():\n%s\n    return %s\n" % (
        "\n".join(lines), vt._pack(["a%d" % i for i in range(vt.arity)]))
    # Numba returns no array from a device function that it did not receive,
    # unless the function is inlined into its caller at the IR level.
    fn = cuda.jit(device=True, inline="always")(
        _codegen.build(src, "temp_storage", vt._env(), device=False))
    fn.temp_items = int(items)
    fn.value_type = vt
    return fn


# --- device helpers shared by the algorithms ------------------------------------------

@functools.lru_cache(maxsize=None)
def _linear_tid(dims):
    dx, dy, dz = dims
    one_d = dy == 1 and dz == 1
    dxy = dx * dy

    @cuda.jit(device=True)
    def linear_tid():
        if one_d:
            return cuda.threadIdx.x
        return cuda.threadIdx.x + cuda.threadIdx.y * dx + cuda.threadIdx.z * dxy

    return linear_tid


def _mask(n):
    """Mask of the lanes of the first warp of an ``n``-thread block."""
    return FULL_MASK if n >= WARP_SIZE else (1 << n) - 1


@cuda.jit(device=True)
def _no_prefix(aggregate, state):
    return aggregate


@functools.lru_cache(maxsize=None)
def _seed(vt, prefix, init):
    """``seed(total, state, mask) -> block prefix``, called by the lanes of the
    first warp (``mask``): lane 0's callback result, or the constant ``init``."""
    cast = vt.cast
    shfl_idx = vt.shuffle("idx")
    callback = prefix is not None
    fn = _codegen.device(prefix) if callback else _no_prefix

    @cuda.jit(device=True)
    def seed(total, state, mask):
        if callback:
            return shfl_idx(mask, cast(fn(total, state)), 0)
        return cast(init)

    return seed


# --- reductions: core(x, n_valid_threads, temp) -> total ---------------------------------

@functools.lru_cache(maxsize=None)
def _reduce_core(op, vt, dims, n, algorithm, broadcast):
    """Return (core, temp_items). ``core(x, nvalid, temp)`` reduces the values
    ``x`` of threads ``0..nvalid-1``; result on thread 0 (every thread with
    ``broadcast``)."""
    combine, load, store = op.combine(vt), vt.load, vt.store
    tid_fn = _linear_tid(dims)

    if algorithm in ("warp", "raking") and n <= WARP_SIZE:
        # One warp: a shuffle reduction over the n lanes, no shared memory.
        partial = warp.partial_reduce(op, vt, n)
        shfl_idx = vt.shuffle("idx")
        mask = _mask(n)

        @cuda.jit(device=True)
        def single_warp_reduce(x, nvalid, temp):
            total = partial(x, nvalid)
            if broadcast:
                total = shfl_idx(mask, total, 0)
            return total

        return single_warp_reduce, 0

    if algorithm == "warp":
        nwarps = (n + WARP_SIZE - 1) // WARP_SIZE
        width = _next_pow2(nwarps)
        warp_partial = warp.partial_reduce(op, vt, WARP_SIZE)
        partials_reduce = warp.partial_reduce(op, vt, width)

        @cuda.jit(device=True)
        def warp_reduce(x, nvalid, temp):
            tid = tid_fn()
            w = tid // WARP_SIZE
            lane = tid % WARP_SIZE
            limit = nvalid - w * WARP_SIZE      # valid lanes of my warp (may be <= 0)
            r = warp_partial(x, limit)
            if lane == 0 and limit > 0:
                store(temp, w, r)
            cuda.syncthreads()
            valid_warps = (nvalid + WARP_SIZE - 1) // WARP_SIZE
            if tid < width:                     # lanes of the first warp
                p = load(temp, tid) if tid < valid_warps else r
                r = partials_reduce(p, valid_warps)
                if broadcast and tid == 0:
                    store(temp, 0, r)           # only lane 0 read slot 0
            if broadcast:
                cuda.syncthreads()
                r = load(temp, 0)
            return r

        return warp_reduce, nwarps

    if algorithm == "raking":
        seg = (n + WARP_SIZE - 1) // WARP_SIZE   # values raked by each lane
        rakers = (n + seg - 1) // seg
        width = _next_pow2(rakers)
        rakers_reduce = warp.partial_reduce(op, vt, width)

        @cuda.jit(device=True)
        def raking_reduce(x, nvalid, temp):
            tid = tid_fn()
            if tid < nvalid:
                store(temp, tid + (tid >> 5), x)
            cuda.syncthreads()
            r = x
            if tid < width:                     # raking lanes of the first warp
                start = tid * seg
                if start < nvalid:
                    r = load(temp, start + (start >> 5))
                    for k in range(1, seg):
                        i = start + k
                        if i < nvalid:
                            r = combine(r, load(temp, i + (i >> 5)))
                r = rakers_reduce(r, (nvalid + seg - 1) // seg)
                if broadcast and tid == 0:
                    store(temp, 0, r)           # only lane 0 read slot 0
            if broadcast:
                cuda.syncthreads()
                r = load(temp, 0)
            return r

        return raking_reduce, _pad(n - 1) + 1

    # tree: position p holds thread bitrev(p); the halving fold then combines
    # in thread order, and position p always starts with thread bitrev(p).
    size = _next_pow2(n)
    bits = _log2(size)
    top = max(_pad(_bitrev(t, bits)) for t in range(n)) + 1
    shift = 32 - bits

    @cuda.jit(device=True)
    def rev(i):
        if bits == 0:
            return 0
        return cuda.brev(np.uint32(i)) >> shift

    @cuda.jit(device=True)
    def tree_reduce(x, nvalid, temp):
        tid = tid_fn()
        if bits == 0:
            return x
        if tid < nvalid:
            p = rev(tid)
            store(temp, p + (p >> 5), x)
        cuda.syncthreads()
        acc = x
        if tid > 0 and tid < size // 2 and rev(tid) < nvalid:
            acc = load(temp, tid + (tid >> 5))
        for j in range(1, bits + 1):
            half = size >> j
            if tid < half:
                other = tid + half
                if rev(other) < nvalid:
                    acc = combine(acc, load(temp, other + (other >> 5)))
                if tid >= half // 2 and half > 1:
                    store(temp, tid + (tid >> 5), acc)   # read by the next pass
            if half > 1:
                cuda.syncthreads()
        if broadcast:
            if tid == 0:
                store(temp, 0, acc)
            cuda.syncthreads()
            acc = load(temp, 0)
        return acc

    return tree_reduce, top


def _reduce_factory(name, op, dtype, block_threads, items_per_thread, algorithm, partial, storage):
    op = as_op(op)
    vt = ValueType.of(dtype)
    op.check(vt)
    dims, _ = _shape(block_threads)
    return _make_reduce(name, op, vt, dims, _items(items_per_thread),
                        _algorithm("reduce", algorithm), bool(partial), bool(storage))


@functools.lru_cache(maxsize=None)
def _make_reduce(name, op, vt, dims, ipt, algorithm, partial, storage):
    n = dims[0] * dims[1] * dims[2]
    core, temp_items = _reduce_core(op, vt, dims, n, algorithm, name == "all_reduce")
    combine, load, cast = op.combine(vt), vt.load, vt.cast
    tid_fn = _linear_tid(dims)

    @cuda.jit(device=True)
    def partial_items(items, valid_items):
        base = tid_fn() * ipt
        x = cast(load(items, 0))
        for k in range(1, ipt):
            if base + k < valid_items:
                x = combine(x, load(items, k))
        return x

    env = {"core": core, "cast": cast, "N": n, "IPT": ipt, "partial_items": partial_items,
           "thread_reduce": thread.reduce(op, vt, ipt)}
    params = ["items" if ipt > 1 else "value"]
    if partial:
        params.append("valid_items")
    body = _storage_prologue(env, vt, temp_items, storage, params)
    if ipt == 1:
        body.append("x = cast(value)")
        body.append("nvalid = min(valid_items, N)" if partial else "nvalid = N")
    elif partial:
        body.append("x = partial_items(items, valid_items)")
        body.append("nvalid = min((valid_items + IPT - 1) // IPT, N)")
    else:
        body.append("x = cast(thread_reduce(items))")
        body.append("nvalid = N")
    body.append("return core(x, nvalid, temp)")
    fn = _build("block_" + name, params, body, env)
    return _annotate(fn, vt, n, ipt, algorithm, temp_items)


def _storage_prologue(env, vt, temp_items, storage, params):
    if storage:
        params.append("temp")
        return []
    if temp_items == 0:
        return ["temp = 0"]
    env["alloc"] = temp_storage(vt, temp_items)
    # The barrier lets the primitive be called again right away: no thread
    # writes the storage before every thread has finished the previous call.
    return ["temp = alloc()", "cuda.syncthreads()"]


def _build(name, params, body, env):
    src = "def %s(%s):\n%s\n" % (name, ", ".join(params), "\n".join("    " + b for b in body))
    return _codegen.build(src, name, env)


def _annotate(fn, vt, n, ipt, algorithm, temp_items):
    fn.temp_items = temp_items
    fn.value_type = vt
    fn.block_threads = n
    fn.items_per_thread = ipt
    fn.algorithm = algorithm
    return fn


def reduce(op, dtype, block_threads, *, items_per_thread=1, algorithm="warp", partial=False,
           storage=False):
    """Reduce the block's values in thread (blocked) order.

    Returns a device function ``f(value)``; with ``items_per_thread=k > 1``,
    ``f(items)`` where ``items`` holds the thread's ``k`` items (an array, or
    a tuple of arrays for a tuple value type); with ``partial=True`` an extra
    argument ``valid_items``: only the first ``valid_items`` items of the
    block (in blocked order; ``valid_items >= 1``) count; with
    ``storage=True`` a last argument ``temp`` (see :func:`temp_storage`).

    Result valid on: thread 0 (linear id) only; other threads get an
    unspecified value. Operators without an identity work: nothing is padded.
    ``algorithm`` is one of ``ALGORITHMS['reduce']`` (see the module doc).

    Example::

        block_sum = cufold.block.reduce(cufold.plus, np.float32, 128)

        @cuda.jit
        def kernel(x, out):
            i = cuda.grid(1)
            s = block_sum(x[i] if i < x.size else np.float32(0))
            if cuda.threadIdx.x == 0:
                out[cuda.blockIdx.x] = s

        # a partial last tile instead: f = reduce(..., partial=True);
        # s = f(x[min(i, x.size - 1)], x.size - cuda.blockIdx.x * 128)
    """
    return _reduce_factory("reduce", op, dtype, block_threads, items_per_thread, algorithm,
                           partial, storage)


def all_reduce(op, dtype, block_threads, *, items_per_thread=1, algorithm="warp", partial=False,
               storage=False):
    """As :func:`reduce`, with the result on every thread of the block.

    Result valid on: every thread (one more barrier than :func:`reduce`, or a
    shuffle when the block is a single warp).

    Example::

        block_max = cufold.block.all_reduce(cufold.maximum, np.float32, (8, 8))

        @cuda.jit
        def normalise(x):          # one 8x8 tile per block
            i = cuda.blockIdx.x * 64 + cuda.threadIdx.y * 8 + cuda.threadIdx.x
            x[i] = x[i] / block_max(x[i])
    """
    return _reduce_factory("all_reduce", op, dtype, block_threads, items_per_thread, algorithm,
                           partial, storage)


# --- scans: core(x, state, temp) -> (exclusive, has_exclusive, inclusive, total) -----------

@functools.lru_cache(maxsize=None)
def _scan_core(op, vt, dims, n, algorithm, prefix, init, seeded):
    """Return (core, temp_items). ``core(x, state, temp)`` scans the threads'
    values and returns, on every thread, ``(exclusive, has_exclusive,
    inclusive, total)``: with ``seeded`` the block prefix (the ``prefix``
    callback's result, else the constant ``init``) comes in front of both
    scans; ``has_exclusive`` is false only on thread 0 when not seeded.
    ``total`` is the block's values alone."""
    combine, load, store = op.combine(vt), vt.load, vt.store
    shfl_idx, shfl_up = vt.shuffle("idx"), vt.shuffle("up")
    seed = _seed(vt, prefix, init)
    tid_fn = _linear_tid(dims)
    mask0 = _mask(n)
    callback = prefix is not None

    if algorithm in ("warp", "raking") and n <= WARP_SIZE:
        scan = warp.inclusive_scan(op, vt, n)
        last = n - 1

        @cuda.jit(device=True)
        def single_warp_scan(x, state, temp):
            tid = tid_fn()
            incl = scan(x)
            total = shfl_idx(mask0, incl, last)
            prev = shfl_up(mask0, incl, 1)
            if seeded:
                bp = seed(total, state, mask0)
                excl = bp if tid == 0 else combine(bp, prev)
                return excl, True, combine(bp, incl), total
            return prev, tid > 0, incl, total

        return single_warp_scan, 0

    if algorithm == "warp":
        nwarps = (n + WARP_SIZE - 1) // WARP_SIZE
        width = _next_pow2(nwarps)
        warp_scan = warp.inclusive_scan(op, vt, WARP_SIZE)
        totals_scan = warp.inclusive_scan(op, vt, width)

        @cuda.jit(device=True)
        def warp_scans(x, state, temp):
            tid = tid_fn()
            w = tid // WARP_SIZE
            lane = tid % WARP_SIZE
            incl = warp_scan(x)
            last = n - 1 - w * WARP_SIZE        # last lane of my warp
            if last > WARP_SIZE - 1:
                last = WARP_SIZE - 1
            if lane == last:
                store(temp, w, incl)            # warp total
            prev = shfl_up(FULL_MASK, incl, 1)
            cuda.syncthreads()
            if w == 0:
                t = load(temp, lane) if lane < nwarps else x
                ti = totals_scan(t)             # logical warps of `width` lanes
                total = shfl_idx(FULL_MASK, ti, nwarps - 1)
                tprev = shfl_up(FULL_MASK, ti, 1)
                wpre = tprev
                if seeded:
                    bp = seed(total, state, FULL_MASK)
                    wpre = bp if lane == 0 else combine(bp, tprev)
                if lane < nwarps:
                    store(temp, lane, wpre)     # the prefix of warp `lane`
                if lane == 0:
                    store(temp, nwarps, total)
            cuda.syncthreads()
            total = load(temp, nwarps)
            if seeded or w > 0:
                wp = load(temp, w)
                excl = wp if lane == 0 else combine(wp, prev)
                return excl, True, combine(wp, incl), total
            return prev, lane > 0, incl, total

        return warp_scans, nwarps + 1

    if algorithm == "kogge_stone":
        passes = _log2(_next_pow2(n))

        @cuda.jit(device=True)
        def kogge_stone_scan(x, state, temp):
            tid = tid_fn()
            store(temp, tid, x)
            cuda.syncthreads()
            incl = x
            src = 0
            for j in range(passes):
                offset = 1 << j
                if tid >= offset:
                    incl = combine(load(temp, src + tid - offset), incl)
                dst = n - src
                store(temp, dst + tid, incl)
                cuda.syncthreads()
                src = dst
            total = load(temp, src + n - 1)
            prev = load(temp, src + tid - 1) if tid > 0 else incl
            if seeded:
                if callback:
                    # The other buffer is free: its last reads preceded the barrier.
                    if tid < WARP_SIZE:
                        bp = seed(total, state, mask0)
                        if tid == 0:
                            store(temp, n - src, bp)
                    cuda.syncthreads()
                    bp = load(temp, n - src)
                else:
                    bp = seed(total, state, mask0)
                excl = bp if tid == 0 else combine(bp, prev)
                return excl, True, combine(bp, incl), total
            return prev, tid > 0, incl, total

        return kogge_stone_scan, 2 * n

    # raking
    seg = (n + WARP_SIZE - 1) // WARP_SIZE
    rakers = (n + seg - 1) // seg
    width = _next_pow2(rakers)
    rakers_scan = warp.inclusive_scan(op, vt, width)
    slot = _pad(n - 1) + 1                      # the block total

    @cuda.jit(device=True)
    def raking_scan(x, state, temp):
        tid = tid_fn()
        store(temp, tid + (tid >> 5), x)
        cuda.syncthreads()
        if tid < WARP_SIZE:
            start = tid * seg
            acc = x
            if start < n:                       # upsweep: my segment's total
                acc = load(temp, start + (start >> 5))
                for k in range(1, seg):
                    i = start + k
                    if i < n:
                        acc = combine(acc, load(temp, i + (i >> 5)))
            si = rakers_scan(acc)
            total = shfl_idx(FULL_MASK, si, rakers - 1)
            run = shfl_up(FULL_MASK, si, 1)
            has_run = tid > 0
            if seeded:
                bp = seed(total, state, FULL_MASK)
                run = bp if tid == 0 else combine(bp, run)
                has_run = True
            if start < n:                       # downsweep: exclusive prefixes in place
                for k in range(seg):
                    i = start + k
                    if i < n:
                        item = load(temp, i + (i >> 5))
                        store(temp, i + (i >> 5), run)
                        run = combine(run, item) if has_run else item
                        has_run = True
            if tid == 0:
                store(temp, slot, total)
        cuda.syncthreads()
        total = load(temp, slot)
        if seeded or tid > 0:
            excl = load(temp, tid + (tid >> 5))
            return excl, True, combine(excl, x), total
        return x, False, x, total

    return raking_scan, slot + 1


def _scan_factory(kind, op, dtype, block_threads, items_per_thread, algorithm, aggregate,
                  prefix, storage, initial=None):
    op = as_op(op)
    vt = ValueType.of(dtype)
    op.check(vt)
    dims, _ = _shape(block_threads)
    ipt = _items(items_per_thread)
    algorithm = _algorithm("scan", algorithm)
    if prefix is not None and not callable(prefix):
        raise TypeError("cufold: prefix must be a device function (block_aggregate, state) -> "
                        "block_prefix, got %r" % (prefix,))
    identity = op.identity_for(vt)
    ident_const = vt.constant(identity if identity is not None else vt.sample())
    mode = "none"
    init = ident_const
    if kind == "exclusive":
        if prefix is not None:
            if initial is not None:
                raise ValueError(
                    "cufold: exclusive_scan takes initial= or prefix=, not both (the prefix "
                    "callback supplies the value in front of the block)")
        elif initial is None:
            if identity is None:
                raise ValueError(
                    "cufold: operator %s has no identity; pass initial= (or prefix=) to "
                    "exclusive_scan" % op.name)
            mode = "identity"
        else:
            init = vt.constant(vt.make(initial))
            mode = "identity" if identity is not None and warp._same(vt.make(initial), identity) \
                else "const"
    if mode == "identity":
        init = ident_const
    return _make_scan(kind, op, vt, dims, ipt, algorithm, bool(aggregate), prefix, bool(storage),
                      mode, init)


@functools.lru_cache(maxsize=None)
def _make_scan(kind, op, vt, dims, ipt, algorithm, aggregate, prefix, storage, mode, init):
    n = dims[0] * dims[1] * dims[2]
    seeded = prefix is not None or mode == "const"
    core, temp_items = _scan_core(op, vt, dims, n, algorithm, prefix,
                                  init, seeded)
    env = {"core": core, "cast": vt.cast, "INIT": init,
           "thread_reduce": thread.reduce(op, vt, ipt),
           "thread_inclusive": thread.inclusive_scan(op, vt, ipt),
           "thread_exclusive": thread.exclusive_scan(op, vt, ipt)}
    params = ["items", "out"] if ipt > 1 else ["value"]
    if prefix is not None:
        params.append("state")
    body = _storage_prologue(env, vt, temp_items, storage, params)
    if prefix is None:
        body.append("state = 0")
    body.append("x = cast(value)" if ipt == 1 else "x = cast(thread_reduce(items))")
    body.append("excl, has_excl, incl, total = core(x, state, temp)")
    if kind == "exclusive" and mode == "identity":
        body.append("excl = excl if has_excl else cast(INIT)")
    if ipt == 1:
        result = "incl" if kind == "inclusive" else "excl"
        body.append("return (%s, total)" % result if aggregate else "return " + result)
    else:
        if kind == "inclusive":
            body.append("thread_inclusive(items, out, excl, has_excl)")
        else:
            body.append("thread_exclusive(items, out, excl)")
        if aggregate:
            body.append("return total")
    fn = _build("block_%s_scan" % kind, params, body, env)
    return _annotate(fn, vt, n, ipt, algorithm, temp_items)


_SCAN_DOC = """

    Returns a device function ``f(value) -> scan``; with ``aggregate=True``
    ``f(value) -> (scan, block_total)``. With ``items_per_thread=k > 1`` it is
    ``f(items, out)``: the thread's ``k`` items (an array, or a tuple of arrays
    for a tuple value type) are scanned into ``out`` (``out`` may be
    ``items``), returning ``block_total`` only with ``aggregate=True``. With
    ``prefix`` an extra argument ``state`` follows; with ``storage=True`` a
    last argument ``temp`` (see :func:`temp_storage`).

    ``prefix``: a running-prefix callback (CUB's BlockPrefixCallbackOp), a
    device function ``prefix(block_aggregate, state) -> block_prefix``. Every
    lane of the block's first warp calls it with the block's aggregate (of
    this call's values) and its own ``state``; lane 0's result is combined in
    front of every thread's scan: ``op(block_prefix, scan)``. The simplest
    state is a per-thread ``cuda.local.array(1, dtype)`` holding the running
    total, which lets a loop scan a long array tile by tile (the first warp's
    lanes all update their own copy alike; with a *shared* state let only lane
    ``cuda.laneid == 0`` write it)::

        @cuda.jit(device=True)
        def running(aggregate, state):
            before = state[0]
            state[0] = before + aggregate
            return before

        scan = cufold.block.inclusive_scan(cufold.plus, np.int64, 128, prefix=running)

        @cuda.jit
        def cumsum(x, out):                 # one block, any length
            state = cuda.local.array(1, np.int64)
            state[0] = 0
            for base in range(0, x.size, 128):
                i = base + cuda.threadIdx.x
                s = scan(x[i] if i < x.size else np.int64(0), state)
                if i < x.size:
                    out[i] = s

    ``block_total`` is the aggregate of this call's values (without the
    prefix). Result valid on: every thread. ``algorithm`` is one of
    ``ALGORITHMS['scan']`` (see the module doc).
"""


def inclusive_scan(op, dtype, block_threads, *, items_per_thread=1, algorithm="warp",
                   aggregate=False, prefix=None, storage=False):
    """Inclusive scan over the block in blocked order: thread ``t``'s value
    (item ``j``) becomes ``x0 op x1 op ... op`` itself.

    Example::

        cumsum = cufold.block.inclusive_scan(cufold.plus, np.int32, 96)

        @cuda.jit
        def kernel(x, out):
            i = cuda.grid(1)
            out[i] = cumsum(x[i])       # per-block running sum
    """
    return _scan_factory("inclusive", op, dtype, block_threads, items_per_thread, algorithm,
                         aggregate, prefix, storage)


def exclusive_scan(op, dtype, block_threads, *, items_per_thread=1, algorithm="warp",
                   initial=None, aggregate=False, prefix=None, storage=False):
    """Exclusive scan over the block in blocked order: item ``j`` becomes
    ``initial op x0 op ... op x(j-1)`` (the first item gets ``initial``).

    ``initial`` defaults to the operator's identity; an operator without one
    needs ``initial`` or ``prefix`` (whose result then takes the place of
    ``initial``; the two cannot be combined).

    Example::

        offsets = cufold.block.exclusive_scan(cufold.plus, np.int32, 64, aggregate=True)

        @cuda.jit
        def compact(x, out, count):
            i = cuda.grid(1)
            keep = x[i] > 0
            where, kept = offsets(np.int32(1 if keep else 0))
            if keep:
                out[cuda.blockIdx.x * 64 + where] = x[i]
            if cuda.threadIdx.x == 0:
                count[cuda.blockIdx.x] = kept
    """
    return _scan_factory("exclusive", op, dtype, block_threads, items_per_thread, algorithm,
                         aggregate, prefix, storage, initial)


inclusive_scan.__doc__ += _SCAN_DOC
exclusive_scan.__doc__ += _SCAN_DOC

__all__ = ["ALGORITHMS", "reduce", "all_reduce", "inclusive_scan", "exclusive_scan",
           "temp_storage"]
