"""Reductions by key into an array: ``out[key] = op(out[key], value)`` for every pair.

What ``torch.Tensor.index_add_``, ``torch.Tensor.scatter_reduce_`` and
``cupyx.scatter_add`` do, with any cufold operator, keys of any integer
width, and a choice of algorithms (``ALGORITHMS``; seed 001):

==========  ===========================================================================
name        how values meet their key's slot of ``out``
==========  ===========================================================================
``atomic``  one atomic per element (the baseline; what the peers do)
``warp``    seed 001's warp aggregation: each warp finds its lanes holding the same key
            (``cufold.warp.peers``: ``match_any_sync``), reduces every group of peers
            (``cufold.warp.reduce_peers``), and the group's first lane does one atomic:
            one atomic per key per 32 elements
``block``   the same, one level up: the group totals of all warps of a block go to a
            per-block shared-memory hash table (open addressing, CAS on the key slot,
            a shared-memory update of the value); the table is flushed with one global
            update per entry when it is half full and at the end. Each block owns a
            contiguous range of tiles, so keys that repeat across warps and tiles
            (sorted or nearly sorted keys) meet in shared memory. A full neighbourhood
            (after a few probes) falls back to the global update. Needs an operator
            with an identity (the table's empty value).
``sorted``  deterministic: a segmented reduction over the runs of equal keys, folded in
            sequence order (a block-wide segmented scan per tile; the runs that cross
            tiles are reduced again, recursively, one level per factor ~1000), then
            **one** update per run. With grouped keys (every key one run, e.g. sorted
            keys) every key of ``out`` is updated exactly once, so floating-point
            results have the same bits every run, and non-commutative operators give
            the sequential fold. Keys that are not grouped still give a correct result
            (each run is one atomic update), only not bitwise reproducible.
==========  ===========================================================================

**The automatic choice is made inside the kernels, per warp, with no host round
trip.** Seed 001 shows aggregation pays only when keys correlate with position and
loses on random keys. A sampled host-side estimate (the fraction of equal
neighbours) would need a synchronisation (~10 us) and would also misjudge seed 001's
"shifted" order: only 12% of its neighbours are equal, yet warp aggregation halves
its atomics. Instead the ``warp`` and ``block`` kernels ask each warp, for every 32
elements, one ``match_any_sync``: when all 32 keys are distinct (random keys over a
large range) the warp takes the plain-atomic path at once (a warp-uniform branch, no
peer reduction, no shared memory); otherwise it aggregates. The default
(``algorithm=None``) is ``AUTO`` (``block``) for operators with an identity, ``warp``
for the others, and ``sorted`` for non-commutative operators and for
``deterministic=True`` on floating point.

Operators and dtypes. ``out`` must have a 32- or 64-bit dtype (int32, uint32, int64,
uint64, float32, float64). ``plus`` uses the hardware atomic add on all six,
``minimum``/``maximum`` the hardware atomic min/max on the integer ones and
``bit_and``/``bit_or``/``bit_xor`` theirs. Every other case (``minimum``/``maximum``
on floats, ``multiplies``, ``logical_*``, your own ``cufold.Op``) runs a
compare-and-swap loop on the output word (a float's bits): load, combine, and
``cuda.atomic.cas``, retried when another thread changed the word in between; when
the operator leaves the word unchanged (a value below the current maximum) there is
no CAS at all. Without contention that is a load plus a CAS, about twice a hardware
atomic (Numba's own ``cuda.atomic.max`` on floats is such a loop too). Under
contention it degrades: with ``k`` threads on one word each success costs up to ``k``
attempts, so ``algorithm='atomic'`` on a single hot key is quadratic in the resident
threads; ``warp`` (one contender per warp), ``block`` (one per block and flush) and
``sorted`` (one per run) bound the contenders.

NaN: ``minimum``/``maximum`` propagate NaN as ``np.minimum.at``/``np.maximum.at``: a
NaN value makes ``out[key]`` NaN, and a NaN already in ``out`` stays. (Numba's
``cuda.atomic.max`` on floats ignores a NaN operand, hence the loop above.)

Keys outside ``[0, len(out))`` are never written. They are detected on the device
(one compare per element): with ``check=True`` (default) the call synchronises the
stream and raises ``IndexError`` naming the first bad position and its key (the
call's valid keys have been applied by then); with
``check=False`` there is no synchronisation and bad keys are skipped silently (so a
negative key can serve as "drop this element").

Tuning: ``CUFOLD_BYKEY_TILE=NTxVT[xSLOTS]`` overrides threads per block, items per
thread and shared-table slots (a power of two).
"""

import collections
import contextlib
import functools
import os

import numpy as np
from numba import config, cuda

from .. import _codegen, block, warp
from ..ops import Op, as_op, plus
from ..values import ValueType
from . import _arrays, _launch
from .reduce import launch

__all__ = ["reduce_by_key_into", "ALGORITHMS", "AUTO", "plan", "tile_for"]

ALGORITHMS = ("atomic", "warp", "block", "sorted")
#: What ``algorithm=None`` runs for commutative operators with an identity (see the module doc).
AUTO = "block"

SIMULATOR = bool(config.ENABLE_CUDASIM)
FULL_MASK = 0xFFFFFFFF
OUT_DTYPES = tuple(np.dtype(t) for t in (np.int32, np.uint32, np.int64, np.uint64, np.float32, np.float64))
_BITS = {4: np.dtype(np.int32), 8: np.dtype(np.int64)}
_HW_OPS = {"add": "iuf", "min": "iu", "max": "iu", "and_": "iu", "or_": "iu", "xor": "iu"}

# Bad keys are reported through two int64 words per (device, stream): [0] the first
# out-of-range position, [1] the first position where keys decrease (deterministic
# mode). Each holds (epoch << POS_BITS) | (POS_MASK - position), updated with an
# atomic max: the newest checked call wins, and in it the smallest position. Calls
# with check=False pass epoch 0 and record nothing, so nothing ever needs clearing.
POS_BITS = 40
POS_MASK = (1 << POS_BITS) - 1
EPOCH_LIMIT = (1 << (63 - POS_BITS)) - 1
MAX_PROBES_GPU = 8
MAX_PROBES_SIM = 4

Tile = collections.namedtuple("Tile", "nt vt slots")
Spec = collections.namedtuple("Spec", "algorithm op key_dt val_dt out_dt wide mode tile check_order")


# --- sizes -------------------------------------------------------------------------------

def tile_for(algorithm):
    """Threads per block, items per thread and shared-table slots.

    The simulator uses tiny tiles (64 x 2 items, 64 slots, 4 probes) so that small
    test inputs cross tiles, fill the table and take the fallback path.
    ``CUFOLD_BYKEY_TILE=NTxVT[xSLOTS]`` overrides (for study and tests).
    """
    forced = os.environ.get("CUFOLD_BYKEY_TILE")
    if forced:
        parts = [int(v) for v in forced.lower().split("x")]
        nt, vt = parts[0], parts[1]
        slots = parts[2] if len(parts) > 2 else (64 if SIMULATOR else 2048)
    elif SIMULATOR:
        nt, vt, slots = 64, 2, 64
    else:
        nt, vt, slots = 256, 8, 2048
    if nt % 32 or not 32 <= nt <= 1024 or vt < 1 or slots < 32 or slots & (slots - 1):
        raise ValueError("cufold: bad CUFOLD_BYKEY_TILE %r: threads a multiple of 32 in 32..1024, "
                         "items >= 1, slots a power of two >= 32" % forced)
    return Tile(nt, vt, slots if algorithm == "block" else 0)


def _smem_bytes(spec):
    if spec.algorithm != "block":
        return 0
    key_bytes = 8 if spec.wide else 4
    return spec.tile.slots * (key_bytes + spec.out_dt.itemsize) + 16


@functools.lru_cache(maxsize=None)
def _resident_blocks(device_id, nt, smem):
    if SIMULATOR:
        return 4
    gpu = cuda.gpus[device_id]
    per_sm = max(1, 2048 // nt)
    if smem:
        try:
            sm_bytes = int(gpu.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
        except Exception:  # pragma: no cover - attribute missing: assume sm_90's 228 KiB
            sm_bytes = 228 << 10
        per_sm = max(1, min(per_sm, sm_bytes // (smem + 1024)))
    return gpu.MULTIPROCESSOR_COUNT * per_sm


# --- atomic updates -----------------------------------------------------------------------

def _atomic_mode(op, dt):
    """'hw' (a ``cuda.atomic`` function) or 'cas' (a compare-and-swap loop)."""
    kinds = _HW_OPS.get(op.atomic)
    return "hw" if kinds is not None and dt.kind in kinds else "cas"


def _bits_dtype(mode, dt):
    """The dtype the compare-and-swap loop works on (floats: their bits)."""
    return _BITS[dt.itemsize] if mode == "cas" and dt.kind == "f" else dt


@functools.lru_cache(maxsize=None)
def _updater(op, out_dt, mode):
    """Device function ``update(out, bits, idx, v)``: ``out[idx] = op(out[idx], v)``,
    atomically. ``bits`` is ``out`` itself, or (a float operator without a hardware
    atomic) an integer view of the same memory, for the compare-and-swap loop, which
    skips the CAS when the operator leaves the word unchanged (``max`` below the
    current value: a load only)."""
    env = {"T": out_dt.type, "I": _BITS[out_dt.itemsize].type}
    if mode == "hw":
        src = ("def update(out, bits, idx, v):\n"
               "    cuda.atomic.%s(out, np.uint64(idx), v)\n" % op.atomic)
        return _codegen.build(src, "update", env)
    env["combine"] = op.combine(ValueType.of(out_dt))
    if out_dt.kind == "f":
        # Floats: combine the value, compare and swap the bits (NaN-safe: the loop
        # ends on equal bits, and the operator decides what a NaN does).
        word, step = "bits", "combine(old.view(T), v).view(I)"
    else:
        word, step = "out", "combine(old, v)"
    src = ("def update(out, bits, idx, v):\n"
           "    u = np.uint64(idx)\n"
           "    old = {w}[u]\n"
           "    while True:\n"
           "        new = {s}\n"
           "        if new == old:\n"
           "            break\n"
           "        seen = cuda.atomic.cas({w}, u, old, new)\n"
           "        if seen == old:\n"
           "            break\n"
           "        old = seen\n").format(w=word, s=step)
    return _codegen.build(src, "update", env)


@cuda.jit(device=True)
def _record(status, slot, epoch, i):
    cuda.atomic.max(status, slot, (epoch << POS_BITS) | (POS_MASK - i))


@functools.lru_cache(maxsize=None)
def _loader(key_dt, val_dt, out_dt, wide):
    """Device function ``load(keys, values, n, m, i) -> (idx, value, ok, bad)``:
    ``idx`` the key as the index type (int32, int64 when ``wide``), -1 unless ``ok``
    (``i < n`` and the key in ``[0, m)``); ``bad``: ``i < n`` and the key out of range."""
    env = {"IT": np.int64 if wide else np.int32, "T": out_dt.type}
    if key_dt.kind == "u":
        test = "k < np.uint64(m)"
    else:
        test = "k >= 0 and k < m"
    src = ("def load(keys, values, n, m, i):\n"
           "    if i < n:\n"
           "        u = np.uint64(i)\n"
           "        k = keys[u]\n"
           "        ok = %s\n"
           "        return (IT(k) if ok else IT(-1)), T(values[u]), ok, not ok\n"
           "    return IT(-1), T(0), False, False\n" % test)
    return _codegen.build(src, "load", env)


# --- atomic / warp / block kernels --------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _slot(spec):
    """Device function processing one element per lane of a warp (32 consecutive
    elements): ``slot(out, bits, idx, v, ok[, table...])``."""
    out_vt = ValueType.of(spec.out_dt)
    update = _updater(spec.op, spec.out_dt, spec.mode)
    if spec.algorithm == "atomic":
        @cuda.jit(device=True)
        def atomic_slot(out, bits, idx, v, ok):
            if ok:
                update(out, bits, idx, v)
        return atomic_slot

    find_peers = warp.peers(np.int64 if spec.wide else np.int32)
    group_total = warp.reduce_peers(spec.op, out_vt)

    if spec.algorithm == "warp":
        @cuda.jit(device=True)
        def warp_slot(out, bits, idx, v, ok):
            p = find_peers(idx)   # lanes without a valid key hold -1: they match no real key
            lane = cuda.laneid
            if cuda.all_sync(FULL_MASK, p == (1 << lane)):
                # every key distinct in this warp (random keys): plain atomics
                if ok:
                    update(out, bits, idx, v)
            else:
                s = group_total(p, v)
                if ok and cuda.ffs(p) - 1 == lane:
                    update(out, bits, idx, s)
        return warp_slot

    slots = spec.tile.slots
    mask = slots - 1
    log2 = slots.bit_length() - 1
    probes = MAX_PROBES_SIM if SIMULATOR else MAX_PROBES_GPU
    empty = -1
    # The table holds values as ``out`` does, or their bits for a float CAS loop:
    # either way the same update works on it (``update(table, table, slot, v)``).
    table_update = update

    @cuda.jit(device=True)
    def insert(out, bits, idx, v, tkeys, tvals, count):
        s = (idx ^ (idx >> log2)) & mask
        done = False
        for _ in range(probes):
            cur = tkeys[s]
            if cur == empty:
                cur = cuda.atomic.cas(tkeys, s, empty, idx)
                if cur == empty:    # claimed: count it (the flush decision)
                    cuda.atomic.add(count, 0, 1)
                    cur = idx
            if cur == idx:
                table_update(tvals, tvals, s, v)
                done = True
                break
            s = (s + 1) & mask
        if not done:                # the neighbourhood is full: straight to global memory
            update(out, bits, idx, v)

    @cuda.jit(device=True)
    def block_slot(out, bits, idx, v, ok, tkeys, tvals, count):
        p = find_peers(idx)
        lane = cuda.laneid
        if cuda.all_sync(FULL_MASK, p == (1 << lane)):
            if ok:
                update(out, bits, idx, v)
        else:
            s = group_total(p, v)
            if ok and cuda.ffs(p) - 1 == lane:
                insert(out, bits, idx, s, tkeys, tvals, count)

    return block_slot


@functools.lru_cache(maxsize=None)
def _tile_body(spec):
    """Device function: one warp's share of a tile, ``32 x VT`` consecutive elements,
    lane ``l`` holding elements ``first + 32 j`` (coalesced). All loads are issued
    before the first element is processed (generated, unrolled code)."""
    vt = spec.tile.vt
    table = spec.algorithm == "block"
    extra = ", tkeys, tvals, count" if table else ""
    lines = ["def body(keys, values, out, bits, n, m, status, epoch, first%s):" % extra]
    for j in range(vt):
        lines.append("    k%d, v%d, ok%d, bad%d = load(keys, values, n, m, first + %d)" % (j, j, j, j, 32 * j))
    for j in range(vt):
        lines.append("    if bad%d and epoch > 0:" % j)
        lines.append("        record(status, 0, epoch, first + %d)" % (32 * j))
        lines.append("    slot(out, bits, k%d, v%d, ok%d%s)" % (j, j, j, extra))
    env = {"load": _loader(spec.key_dt, spec.val_dt, spec.out_dt, spec.wide), "record": _record,
           "slot": _slot(spec)}
    return _codegen.build("\n".join(lines) + "\n", "body", env)


@functools.lru_cache(maxsize=None)
def scatter_kernel(spec):
    """The kernel of ``atomic``/``warp``/``block``:
    ``(keys, values, out, bits, n, m, status, epoch)``. Block ``b`` owns a contiguous
    range of tiles; every lane of a warp runs the same iterations (collectives)."""
    nt, vt, slots = spec.tile
    tile = nt * vt
    span = 32 * vt
    body = _tile_body(spec)

    if spec.algorithm != "block":
        def scatter(keys, values, out, bits, n, m, status, epoch):
            tid = cuda.threadIdx.x
            tiles = (n + tile - 1) // tile
            per = (tiles + cuda.gridDim.x - 1) // cuda.gridDim.x
            t0 = cuda.blockIdx.x * per
            t1 = min(tiles, t0 + per)
            offset = (tid // 32) * span + cuda.laneid
            for t in range(t0, t1):
                body(keys, values, out, bits, n, m, status, epoch, t * tile + offset)

        return scatter

    kt = np.int64 if spec.wide else np.int32
    out_vt = ValueType.of(spec.out_dt)
    table_dt = _bits_dtype(spec.mode, spec.out_dt)
    ttype = table_dt.type
    identity = out_vt.make(spec.op.identity_for(out_vt))
    if table_dt != spec.out_dt:
        identity = identity.view(table_dt)     # the identity's bits
        value_of = _codegen.build("def value_of(w):\n    return w.view(T)\n", "value_of",
                                  {"T": spec.out_dt.type})
    else:
        value_of = _codegen.build("def value_of(w):\n    return w\n", "value_of")
    update = _updater(spec.op, spec.out_dt, spec.mode)
    flush_at = slots // 2
    empty = -1

    def scatter_block(keys, values, out, bits, n, m, status, epoch):
        tkeys = cuda.shared.array(slots, kt)
        tvals = cuda.shared.array(slots, ttype)
        count = cuda.shared.array(1, np.int32)
        tid = cuda.threadIdx.x
        for s in range(tid, slots, nt):
            tkeys[s] = empty
            tvals[s] = identity
        if tid == 0:
            count[0] = 0
        cuda.syncthreads()
        tiles = (n + tile - 1) // tile
        per = (tiles + cuda.gridDim.x - 1) // cuda.gridDim.x
        t0 = cuda.blockIdx.x * per
        t1 = min(tiles, t0 + per)
        offset = (tid // 32) * span + cuda.laneid
        for t in range(t0, t1):
            body(keys, values, out, bits, n, m, status, epoch, t * tile + offset, tkeys, tvals, count)
            # A barrier for the tile's inserts, and one block-wide decision: flush when
            # the table is half full, and after the block's last tile.
            if cuda.syncthreads_or(1 if (count[0] > flush_at or t == t1 - 1) else 0):
                for s in range(tid, slots, nt):
                    k = tkeys[s]
                    if k != empty:
                        update(out, bits, k, value_of(tvals[s]))
                        tkeys[s] = empty
                        tvals[s] = identity
                cuda.syncthreads()
                if tid == 0:
                    count[0] = 0
                cuda.syncthreads()

    return scatter_block


# --- sorted: segmented reduction over runs ------------------------------------------------

@functools.lru_cache(maxsize=None)
def _maybe(op, out_dt):
    """Device function ``maybe(has_a, a, has_b, b) -> (has, value)``: the operator
    extended with "no value" (an identity for any operator)."""
    combine = op.combine(ValueType.of(out_dt))

    @cuda.jit(device=True)
    def maybe(ha, a, hb, b):
        if ha and hb:
            return True, combine(a, b)
        if ha:
            return True, a
        return hb, b

    return maybe


@functools.lru_cache(maxsize=None)
def _segment_op(op, out_dt):
    """The segmented-scan operator on ``(head, has, value)``: a later element with a
    head flag restarts the segment (associative, not commutative)."""
    maybe = _maybe(op, out_dt)

    def segmented(a, b):
        if b[0]:
            return (True, b[1], b[2])
        h, v = maybe(a[1], a[2], b[1], b[2])
        return (a[0], h, v)

    return Op(segmented, identity=lambda vt: (False, False, 0), name="segmented_" + op.name)


@functools.lru_cache(maxsize=None)
def sorted_kernel(spec, level0):
    """One level of the ``sorted`` algorithm, one tile per block:
    ``(keys, values, has, out, bits, n, m, status, epoch, pk, pv, ph, last)``.

    Thread ``t`` holds the tile's items ``t*VT .. t*VT+VT-1``. A block-wide exclusive
    segmented scan gives each thread the running total of the run it starts in; each
    thread then walks its items and finishes the runs ending there. Runs inside the
    tile are written (one update each). The tile's first and last runs may continue
    in the neighbouring tiles: they become the pieces ``2*tile`` (first) and
    ``2*tile + 1`` (last; "no value" when the tile is a single run) of the next
    level's input, whose keys stay in order. With ``last`` (a single tile) they are
    written too. Level 0 reads the caller's keys and values; the next levels read
    pieces: int64 keys (-1: none), values of ``out``'s dtype, uint8 has-flags.
    """
    nt, vt, _ = spec.tile
    tile = nt * vt
    out_dt = spec.out_dt
    T = out_dt.type
    update = _updater(spec.op, out_dt, spec.mode)
    maybe = _maybe(spec.op, out_dt)
    scan = block.exclusive_scan(_segment_op(spec.op, out_dt), (np.bool_, np.bool_, out_dt), nt)
    check_order = bool(spec.check_order and level0)
    load = _loader(spec.key_dt, spec.val_dt, out_dt, True)
    if level0:

        @cuda.jit(device=True)
        def item(keys, values, has, n, m, status, epoch, i):
            k, v, ok, bad = load(keys, values, n, m, i)
            if bad and epoch > 0:
                _record(status, 0, epoch, i)
            return k, ok, v
    else:
        @cuda.jit(device=True)
        def item(keys, values, has, n, m, status, epoch, i):
            u = np.uint64(i)
            return keys[u], has[u] != 0, values[u]

    @cuda.jit(device=True)
    def key_at(keys, values, has, n, m, i):
        if level0:
            return load(keys, values, n, m, i)[0]
        return keys[np.uint64(i)]

    @cuda.jit(device=True)
    def put(pk, pv, ph, j, k, h, v):
        u = np.uint64(j)
        pk[u] = k
        pv[u] = v
        ph[u] = 1 if h else 0

    @cuda.jit(device=True)
    def write(out, bits, k, h, v):
        if h and k >= 0:
            update(out, bits, k, v)

    def segments(keys, values, has, out, bits, n, m, status, epoch, pk, pv, ph, last):
        tid = cuda.threadIdx.x
        t = cuda.blockIdx.x
        base = t * tile
        count = min(tile, n - base)
        tile_last = count - 1
        p0 = tid * vt
        ks = cuda.local.array(vt, np.int64)
        vs = cuda.local.array(vt, T)
        hs = cuda.local.array(vt, np.bool_)
        # the key before this thread's first item (for heads and the order check)
        prev0 = np.int64(-1)
        if p0 < count and (p0 > 0 or (check_order and base > 0)):
            prev0 = key_at(keys, values, has, n, m, base + p0 - 1)
        following = np.int64(-1)
        if p0 + vt < count:
            following = key_at(keys, values, has, n, m, base + p0 + vt)
        # pass 1: load, and this thread's (head seen, has, value since the last head)
        head = False
        agg_has = False
        agg = T(0)
        prev = prev0
        for j in range(vt):
            p = p0 + j
            if p < count:
                k, h, v = item(keys, values, has, n, m, status, epoch, base + p)
                ks[j] = k
                hs[j] = h
                vs[j] = v
                if p > 0 and k != prev:
                    head = True
                    agg_has = False
                agg_has, agg = maybe(agg_has, agg, h, v)
                if check_order and epoch > 0 and (p > 0 or base > 0) and k >= 0 and k < prev:
                    _record(status, 1, epoch, base + p)
                prev = k
        carry = scan((head, agg_has, agg))
        # pass 2: finish the runs that end in this thread's items
        first_run = not carry[0]        # no head between the tile's start and here
        run_has = carry[1]
        run = carry[2]
        prev = prev0
        for j in range(vt):
            p = p0 + j
            if p < count:
                k = ks[j]
                if p > 0 and k != prev:
                    first_run = False
                    run_has = False
                run_has, run = maybe(run_has, run, hs[j], vs[j])
                if p == tile_last:
                    end = True
                else:
                    nk = ks[j + 1] if j + 1 < vt else following
                    end = nk != k
                if end:
                    if first_run or p == tile_last:
                        if last:
                            write(out, bits, k, run_has, run)
                        elif first_run and p == tile_last:      # the tile is one run
                            put(pk, pv, ph, 2 * t, k, run_has, run)
                            put(pk, pv, ph, 2 * t + 1, k, False, run)
                        elif first_run:
                            put(pk, pv, ph, 2 * t, k, run_has, run)
                        else:
                            put(pk, pv, ph, 2 * t + 1, k, run_has, run)
                    else:
                        write(out, bits, k, run_has, run)
                prev = k

    return segments


# --- host side -----------------------------------------------------------------------------

Plan = collections.namedtuple("Plan", "spec grid")


@functools.lru_cache(maxsize=4096)
def plan(op, key_dt, val_dt, out_dt, m, n, device_id, algorithm, deterministic, check):
    """Check the operator against the output dtype, choose and size the algorithm."""
    vt_out = ValueType.of(out_dt)
    op.check(vt_out)
    mode = _atomic_mode(op, out_dt)
    if algorithm is None:
        if deterministic and not (mode == "hw" and out_dt.kind in "iu"):
            algorithm = "sorted"
        elif not op.commutative:
            algorithm = "sorted"
        else:
            algorithm = AUTO if op.identity_for(vt_out) is not None else "warp"
    elif algorithm not in ALGORITHMS:
        raise ValueError("cufold: unknown reduce_by_key algorithm %r; choose from %s"
                         % (algorithm, ", ".join(ALGORITHMS)))
    if algorithm != "sorted":
        if deterministic and not (mode == "hw" and out_dt.kind in "iu"):
            raise ValueError(
                "cufold: algorithm %r updates out in a varying order, so %s results are not "
                "reproducible bit for bit; deterministic=True needs algorithm='sorted' (or None)"
                % (algorithm, out_dt))
        if not op.commutative:
            raise ValueError(
                "cufold: algorithm %r combines values in a varying order and needs a commutative "
                "operator; %s is not declared commutative (cufold.Op(fn, commutative=True)), or use "
                "algorithm='sorted' with keys grouped into runs (e.g. sorted)" % (algorithm, op.name))
    if algorithm == "block" and op.identity_for(vt_out) is None:
        raise ValueError(
            "cufold: algorithm 'block' starts its shared table at the operator's identity; %s has "
            "none (cufold.Op(fn, identity=...)): use 'warp'" % op.name)
    wide = m > np.iinfo(np.int32).max
    spec = Spec(algorithm, op, key_dt, val_dt, out_dt, wide or algorithm == "sorted", mode,
                tile_for(algorithm), bool(deterministic and check))
    if _smem_bytes(spec) > 48 << 10:
        raise ValueError("cufold: a %d-slot shared table of %s needs %d bytes of shared memory, more "
                         "than the 48 KiB a kernel may declare (CUFOLD_BYKEY_TILE)"
                         % (spec.tile.slots, out_dt, _smem_bytes(spec)))
    nt, vt, _ = spec.tile
    tiles = -(-n // (nt * vt))
    if algorithm == "sorted":
        grid = tiles
    else:
        grid = max(1, min(tiles, _resident_blocks(device_id, nt, _smem_bytes(spec))))
    return Plan(spec, grid)


class _Status:
    """The two status words of a (device, stream), zeroed once, and its epoch."""

    __slots__ = ("words", "epoch")

    def __init__(self, device_id):
        self.epoch = 0
        with _device_ctx(device_id):
            self.words = _arrays.describe(cuda.to_device(np.zeros(2, np.int64)), "status")


_statuses = {}


def _status(device_id, stream, check):
    """(status words, epoch): epoch 0 (record nothing) unless ``check``."""
    key = (device_id, stream)
    st = _statuses.get(key)
    if st is None or (check and st.epoch >= EPOCH_LIMIT):
        st = _statuses[key] = _Status(device_id)
    if not check:
        return st.words, 0
    st.epoch += 1
    return st.words, st.epoch


def _bits_view(a):
    """An integer Arr over the same memory as float Arr ``a`` (same shape, strides)."""
    dt = _BITS[a.itemsize]
    v = _arrays.Arr(a.ptr, a.shape, a.strides, dt, a.size, "cai", None, a.device_id, a.stream)
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        v._nb = FakeCUDAArray(_arrays.as_numba(a)._ary.view(dt))
    else:
        v.obj = a.obj if a.obj is not None else a._base
    return v


def _device_ctx(device_id):
    if SIMULATOR:
        return contextlib.nullcontext()
    return _arrays._numba_ctx(device_id) or contextlib.nullcontext()


def _synchronize(stream, device_id):
    if SIMULATOR:
        return
    with _device_ctx(device_id):
        s = cuda.external_stream(stream) if stream else cuda.legacy_default_stream()
        s.synchronize()


def _element(a, i):
    with _device_ctx(a.device_id):
        return _arrays.as_numba(a)[int(i)]


def _raise_errors(words, epoch, keys, m, stream, device_id):
    _synchronize(stream, device_id)
    with _device_ctx(device_id):
        got = _arrays.as_numba(words).copy_to_host()
    for slot in (0, 1):
        w = int(got[slot])
        if w >> POS_BITS != epoch:
            continue
        pos = POS_MASK - (w & POS_MASK)
        if slot == 0:
            raise IndexError("cufold: key %d at position %d is out of range for out of length %d"
                             % (int(_element(keys, pos)), pos, m))
        raise ValueError(
            "cufold: deterministic=True needs keys sorted (grouped into runs); keys[%d] = %d follows "
            "keys[%d] = %d. Sort keys and values by key first (a stable sort), or pass "
            "deterministic=False" % (pos, int(_element(keys, pos)), pos - 1, int(_element(keys, pos - 1))))


def _describe_1d(x, name):
    a = _arrays.describe(x, name)
    if a.ndim != 1:
        raise ValueError("cufold: reduce_by_key_into takes 1-D arrays; %s has shape %s" % (name, a.shape))
    return a


_checked_types = {}


def _check_types(key_dt, val_dt, out_dt):
    k = (key_dt, val_dt, out_dt)
    if k in _checked_types:
        return
    if key_dt.kind not in "iu":
        raise TypeError("cufold: keys must have an integer dtype (signed or unsigned, any width); got %s"
                        % key_dt)
    if out_dt not in OUT_DTYPES:
        raise TypeError("cufold: out must have a 32- or 64-bit dtype with atomics (%s); got %s"
                        % (", ".join(str(d) for d in OUT_DTYPES), out_dt))
    if val_dt.kind not in "biuf" or not np.can_cast(val_dt, out_dt, casting="same_kind"):
        raise TypeError("cufold: values of dtype %s cannot be accumulated into out of dtype %s "
                        "(NumPy's same_kind casting rule)" % (val_dt, out_dt))
    _checked_types[k] = True


def reduce_by_key_into(keys, values, out, op=plus, *, algorithm=None, deterministic=False,
                       check=True, stream=None):
    """For every ``i``: ``out[keys[i]] = op(out[keys[i]], values[i])``; returns ``out``.

    ``torch.Tensor.index_add_(0, keys, values)`` / ``scatter_reduce_`` and
    ``cupyx.scatter_add(out, keys, values)`` with any cufold operator. ``out`` is
    updated in place, on the stream of ``out``'s library (or ``stream=``).

    Parameters
    ----------
    keys : 1-D CUDA array of any integer dtype (signed or not, 8..64 bits)
    values : 1-D CUDA array as long as ``keys``, of a dtype that casts to ``out``'s
        under NumPy's ``same_kind`` rule (it is cast, then accumulated in ``out``'s dtype)
    out : 1-D CUDA array of int32, uint32, int64, uint64, float32 or float64
    op : cufold.Op or function; must be associative, and commutative except with
        ``algorithm='sorted'``. ``plus``, ``minimum`` and ``maximum`` (NaN propagates as
        in ``np.maximum.at``) use hardware atomics; others a compare-and-swap loop.
    algorithm : one of ``ALGORITHMS`` (``cufold.algorithms("reduce_by_key")``), or None:
        adaptive per warp (see the module doc).
    deterministic : True: the same bits every run for floating point (the ``sorted``
        algorithm); requires keys sorted (grouped into runs), checked with ``check=True``.
    check : True: synchronise and raise ``IndexError`` for a key outside
        ``[0, len(out))`` (and ``ValueError`` for unsorted keys in deterministic mode).
        False: no synchronisation; bad keys are skipped. Never a write out of bounds.

    Example::

        >>> cells = cupy.asarray([2, 0, 2, 1, 2], dtype=cupy.int32)
        >>> mass = cupy.asarray([1., 2., 3., 4., 5.])
        >>> total = cupy.zeros(3)
        >>> cufold.reduce_by_key_into(cells, mass, total)
        array([2., 4., 9.])
        >>> cufold.reduce_by_key_into(cells, mass, cupy.full(3, -cupy.inf), cufold.maximum)
        array([2., 4., 5.])
    """
    with _launch.nvtx_range("reduce_by_key_into"):
        o = _describe_1d(out, "out")
        k = _describe_1d(keys, "keys")
        v = _describe_1d(values, "values")
        if k.size != v.size:
            raise ValueError("cufold: keys and values must be equally long; got %d and %d" % (k.size, v.size))
        _arrays.same_device((o, k, v), "reduce_by_key_into's arrays")
        _check_types(k.dtype, v.dtype, o.dtype)
        op = as_op(op)
        n, m = k.size, o.size
        handle = _arrays.stream_handle((o, k, v), stream)
        p = plan(op, k.dtype, v.dtype, o.dtype, m, n, o.device_id, algorithm, bool(deterministic),
                 bool(check))
        if n == 0:
            return out
        words, epoch = _status(o.device_id, handle, bool(check))
        run(p, k, v, o, n, m, words, epoch, handle)
        if check:
            _raise_errors(words, epoch, k, m, handle, o.device_id)
        return out


def run(p, keys, values, out, n, m, words, epoch, stream):
    """Launch plan ``p`` on Arr descriptors (no checks)."""
    spec = p.spec
    bits = _bits_view(out) if spec.mode == "cas" and spec.out_dt.kind == "f" else out
    nt = spec.tile.nt
    n64, m64, e64 = np.int64(n), np.int64(m), np.int64(epoch)
    if spec.algorithm != "sorted":
        launch(scatter_kernel(spec), ("bykey", spec), p.grid, nt, stream,
               (keys, values, out, bits, n64, m64, words, e64))
        return
    tile = nt * spec.tile.vt
    tiles = p.grid
    # Two ping-pong piece buffers of 2 * tiles entries each (int64 keys, values, uint8 flags).
    count = 2 * tiles
    per = [8, spec.out_dt.itemsize, 1]
    sizes = [-(-count * b // 256) * 256 for b in per]
    _, ws = _launch.workspace(out.device_id, stream, 2 * sum(sizes) if tiles > 1 else 256)
    bufs = []
    offset = 0
    for _ in range(2 if tiles > 1 else 1):
        views = []
        for dt, size in zip((np.int64, spec.out_dt, np.uint8), sizes):
            views.append(ws.view(dt, (max(count, 1),), offset) if tiles > 1 else ws.view(dt, (1,), 0))
            offset += size if tiles > 1 else 0
        bufs.append(views)
    pk, pv, ph = bufs[0]
    launch(sorted_kernel(spec, True), ("bykey-sorted0", spec), tiles, nt, stream,
           (keys, values, ph, out, bits, n64, m64, words, e64, pk, pv, ph, np.bool_(tiles == 1)))
    level = 0
    length = count
    while tiles > 1:
        src = bufs[level % 2]
        dst = bufs[(level + 1) % 2]
        tiles = -(-length // tile)
        launch(sorted_kernel(spec, False), ("bykey-sorted", spec), tiles, nt, stream,
               (src[0], src[1], src[2], out, bits, np.int64(length), m64, words, np.int64(0),
                dst[0], dst[1], dst[2], np.bool_(tiles == 1)))
        length = 2 * tiles
        level += 1
