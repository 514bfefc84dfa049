"""Stable grouping of (key, value) pairs by key, on the device: a least-significant-digit
radix sort of keys known to lie in ``[0, m)``.

What ``reduce_by_key_into`` runs before its ``sorted`` algorithm when keys come in any
order and the result must not depend on it (``deterministic=True`` on floating point,
non-commutative operators): after a *stable* sort every key is one run whose values keep
their input order, so each key's total is the sequential fold, the same bits every run.

A key outside ``[0, m)`` (negative, or too large) sorts as ``m``: after every valid key,
where the reduction skips it; the first pass reports its position through ``on_bad``.
Keys travel as ``uint32`` (``uint64`` when ``m >= 2**32 - 1``), values in their own dtype.

Each pass orders by one digit of ``digit_bits`` bits (7 on a GPU, 4 in the simulator so
that small tests take several passes), in three launches:

1. ``count_kernel``: the digits of each tile, counted in shared memory (a shared atomic
   per element), written digit-major: ``counts[digit * tiles + tile]``;
2. an exclusive scan of ``counts`` (cufold's device scan): the first output slot of each
   (digit, tile), since every smaller digit and the same digit of every earlier tile go
   before it;
3. ``scatter_kernel``: each element's rank among the tile's earlier elements of its digit,
   and the move to ``counts[digit * tiles + tile] + rank``. Warp ``w`` owns the tile's
   ``w``-th run of ``32 * VT`` elements and walks it row by row: a row's equal digits are
   ``match_any`` peers, ranked by the lanes below, after what the warp's earlier rows
   counted (a per-warp counter per digit in shared memory); the warps' counters are then
   turned into offsets per digit (warp order is input order), the tile is reordered by
   digit in shared memory, and written from there (consecutive threads, consecutive
   addresses within a digit's run).

Host side: :func:`group` adds every pass's launches to a Program builder
(:mod:`cufold.host.programs`; ``reduce_by_key_into`` runs the grouping and its reduction
as one Program), with the counts and the scan's scratch carved from the per-stream workspace (their size is
fixed by the signature) and the ping-pong buffers new arrays of the caller's library each
call (:func:`group_buffers`: its allocator reuses them; cufold keeps no n-sized memory);
no synchronisation. :func:`group_by_key` is the grouping alone, into new arrays.

Passes: ``ceil(bits(m) / digit_bits)``, at least one (seed 001's 10^6 cells: 3). Cost
per pass: the keys read twice, the values once, both written once; a 10^7-pair sort of
int32 keys and float64 values moves ~0.28 GB a pass, 67 us at the H200's 4.2 TB/s.

Measured (H200, seed 001's box, 10^7 int32 keys and float64 values, three passes):
470-590 us for the grouping, ~2.5x that floor. Per pass, the count takes ~38 us (a
quarter of it reading, the rest shared atomics), the scan of 128 x 4883 counts ~25 us
and the scatter 150-220 us (the ranking loop: ``match_any`` on sm_90 costs more the more
distinct digits a row holds; one ballot per digit bit measured slower still, and so did
counting with ``match_any`` peers). A onesweep-style sort (CUB's: look-back instead of
the count and scan launches) is what would come next; see docs/performance.md.
"""

import collections
import functools

import numpy as np
from numba import config, cuda

from .. import block, warp
from ..ops import plus
from ..values import ValueType
from ..host import arrays as _arrays, launch as _launch, programs as _programs
from . import scan
from ..host.launch import Tile, gated_off

__all__ = ["group", "group_by_key", "sort_key_dtype", "passes", "pair_count", "Positions", "DIGIT_BITS", "TILE"]

SIMULATOR = bool(config.ENABLE_CUDASIM)


class Positions(collections.namedtuple("Positions", "dtype")):
    """:func:`group`'s ``values`` when they are each pair's input position ``0 .. n-1``
    in ``dtype`` (a permutation to gather by): the first pass makes them as it moves the
    keys, so no array of positions is written and read back first.

    Example: ``group(b, keys, Positions(np.dtype(np.uint32)), m)``."""


#: Bits sorted per pass.
DIGIT_BITS = 4 if SIMULATOR else 7
#: Threads per block and elements per thread (every warp keeps ``VT`` rows in registers
#: between its ranking and its scatter).
TILE = Tile(64, 2) if SIMULATOR else Tile(256, 8)


def sort_key_dtype(m):
    """The dtype the keys travel in: room for every valid key and for ``m`` itself."""
    return np.dtype(np.uint32 if m < (1 << 32) - 1 else np.uint64)


def passes(m, digit_bits=DIGIT_BITS):
    """Digit passes that order keys in ``[0, m]`` (``m``: the bad keys)."""
    return max(1, -(-int(m).bit_length() // digit_bits))


@functools.lru_cache(maxsize=None)
def _sort_key(key_dt, sk_dt, first):
    """Device function ``sort_key(keys, i, m)``: the first pass maps the caller's key to
    ``sk_dt`` (``m`` for a key outside ``[0, m)``: one unsigned compare, a negative key
    wraps to a huge one); later passes read sorted keys."""
    SK = sk_dt.type
    if not first:
        @cuda.jit(device=True)
        def sorted_key(keys, i, m):
            return keys[i]
        return sorted_key
    CT = np.uint64 if key_dt.itemsize == 8 or sk_dt.itemsize == 8 else np.uint32

    @cuda.jit(device=True)
    def caller_key(keys, i, m):
        u = CT(keys[i])
        return SK(u) if u < CT(m) else SK(m)
    return caller_key


@cuda.jit(device=True)
def _no_report(status, epoch, i):
    pass


def _name(fn):
    """What a kernel's cache key says of its ``on_bad`` device function."""
    py = getattr(fn, "py_func", fn)
    return "%s.%s" % (py.__module__, py.__qualname__)


@functools.lru_cache(maxsize=None)
def count_kernel(key_dt, sk_dt, first, digit_bits, tile, on_bad):
    """Kernel ``(keys, n, m, shift, counts, tiles, status, epoch, gate, gate_on)``: the
    digit counts of tile ``blockIdx.x``, digit-major in ``counts``; the first pass calls
    ``on_bad(status, epoch, i)`` for a key outside ``[0, m)`` when ``epoch > 0``.
    ``gate``, ``gate_on``: see ``launch.gated_off`` (:func:`group`'s ``gate``)."""
    nt, vt = tile
    radix = 1 << digit_bits
    sort_key = _sort_key(key_dt, sk_dt, first)
    SK = sk_dt.type
    report = on_bad if on_bad is not None else _no_report

    def count(keys, n, m, shift, counts, tiles, status, epoch, gate, gate_on):
        if gated_off(gate, gate_on):
            return
        hist = cuda.shared.array(radix, np.int32)
        tid = cuda.threadIdx.x
        t = cuda.blockIdx.x
        for j in range(tid, radix, nt):
            hist[j] = 0
        cuda.syncthreads()
        base = np.int64(t) * (nt * vt) + tid
        # every load first: a report (an atomic) between two loads would order them
        ks = cuda.local.array(vt, SK)
        for r in range(vt):
            i = base + r * nt
            if i < n:
                ks[r] = sort_key(keys, i, m)
        for r in range(vt):
            i = base + r * nt
            if i < n:
                s = ks[r]
                if first and epoch > 0 and s == SK(m):     # a bad key (sorts as m)
                    report(status, epoch, i)
                cuda.atomic.add(hist, np.int32((s >> SK(shift)) & SK(radix - 1)), 1)
        cuda.syncthreads()
        for d in range(tid, radix, nt):
            counts[np.int64(d) * tiles + t] = hist[d]

    return count


@functools.lru_cache(maxsize=None)
def scatter_kernel(key_dt, sk_dt, val_dt, count_dt, first, digit_bits, tile, positions=False):
    """Kernel ``(keys, values, n, m, shift, offsets, tiles, out_keys, out_values, gate,
    gate_on)``: tile ``blockIdx.x``'s pairs moved, stably, to their digit's slots
    (``offsets``: the exclusive scan of ``count_kernel``'s counts); gated as ``count_kernel``.
    ``positions``: each pair's value is its position ``i`` (``values`` is not read).

    The tile is first ordered by digit in shared memory, then written slot by slot, so
    that consecutive threads write consecutive addresses within each digit's run (a
    direct scatter from registers writes 32 scattered words per warp store; on an H200
    that made a pass 3-6x slower)."""
    nt, vt = tile
    size = nt * vt
    warps = nt // 32
    radix = 1 << digit_bits
    bins = radix + 1                  # the last bin: lanes past n
    shape = (warps, bins)
    per_thread = -(-radix // nt)      # digits each thread turns into offsets
    sort_key = _sort_key(key_dt, sk_dt, first)
    peers = warp.peers(np.int32)
    offsets_of = block.exclusive_scan(plus, count_dt, nt)
    SK, V, C = sk_dt.type, val_dt.type, count_dt.type

    if positions:
        @cuda.jit(device=True)
        def value_at(values, i):
            return V(i)
    else:
        @cuda.jit(device=True)
        def value_at(values, i):
            return values[i]

    def scatter(keys, values, n, m, shift, offsets, tiles, out_keys, out_values, gate, gate_on):
        if gated_off(gate, gate_on):
            return
        # seen[w, d]: elements of digit d in warp w's rows so far; then their first slot
        # in the tile ordered by digit
        seen = cuda.shared.array(shape, C)
        moved_keys = cuda.shared.array(size, SK)
        moved_values = cuda.shared.array(size, V)
        # delta[d]: output position of digit d's elements = delta[d] + slot in the tile
        delta = cuda.shared.array(radix, np.int64)
        tid = cuda.threadIdx.x
        t = cuda.blockIdx.x
        w = tid >> 5
        for j in range(tid, warps * bins, nt):
            seen[j // bins, j % bins] = 0
        cuda.syncthreads()
        first_item = np.int64(t) * size
        base = first_item + w * (32 * vt) + (tid & 31)
        below = cuda.lanemask_lt()
        ks = cuda.local.array(vt, SK)
        vs = cuda.local.array(vt, V)
        digits = cuda.local.array(vt, np.int32)
        ranks = cuda.local.array(vt, np.int32)
        for r in range(vt):                       # every load first, then the ranking
            i = base + r * 32
            if i < n:
                ks[r] = sort_key(keys, i, m)
                vs[r] = value_at(values, i)
        for r in range(vt):
            d = np.int32(radix)
            if base + r * 32 < n:
                d = np.int32((ks[r] >> SK(shift)) & SK(radix - 1))
            group = peers(d)
            earlier = seen[w, d]
            cuda.syncwarp()
            lower = group & below
            if lower == 0:                        # the group's first lane counts it
                seen[w, d] = earlier + cuda.popc(group)
            cuda.syncwarp()
            digits[r] = d
            ranks[r] = np.int32(earlier) + cuda.popc(lower)
        cuda.syncthreads()
        # per digit: the warps' counts become their first slots (warp order is input
        # order), after the smaller digits of the tile (a block scan of digit totals)
        totals = cuda.local.array(per_thread, C)
        total = C(0)
        for j in range(per_thread):
            d = tid * per_thread + j
            running = C(0)
            if d < radix:
                for v in range(warps):
                    c = seen[v, d]
                    seen[v, d] = running
                    running += c
            totals[j] = running
            total += running
        start = offsets_of(total)
        for j in range(per_thread):
            d = tid * per_thread + j
            if d < radix:
                delta[d] = np.int64(offsets[np.int64(d) * tiles + t]) - start
                for v in range(warps):
                    seen[v, d] += start
            start += totals[j]
        cuda.syncthreads()
        for r in range(vt):
            d = digits[r]
            if d < radix:
                slot = seen[w, d] + ranks[r]
                moved_keys[slot] = ks[r]
                moved_values[slot] = vs[r]
        cuda.syncthreads()
        count = min(np.int64(size), n - first_item)
        for slot in range(tid, count, nt):
            k = moved_keys[slot]
            d = np.int32((k >> SK(shift)) & SK(radix - 1))
            where = delta[d] + slot
            out_keys[where] = k
            out_values[where] = moved_values[slot]

    return scatter


def pair_count(m, digit_bits=DIGIT_BITS):
    """Ping-pong (keys, values) buffers the passes write: one for one pass, else two."""
    return min(passes(m, digit_bits), 2)


def _align(nbytes):
    return -(-nbytes // 256) * 256


def group(b, keys, values, m, offset=0, buffers=None, status=None, epoch=np.int64(0), on_bad=None,
          digit_bits=DIGIT_BITS, tile=TILE, gate=None):
    """Add the stable grouping of ``(keys, values)`` by key (1-D placeholders of Program
    builder ``b``, ``n >= 1`` pairs) to ``b``; returns ``(sorted keys, sorted values,
    end)``: keys as :func:`sort_key_dtype` of ``m`` (``m`` for every key outside
    ``[0, m)``: they come last), values in their own dtype.

    Scratch is carved from the per-(device, stream) workspace from byte ``offset`` (a
    multiple of 256) on, up to byte ``end``: the digit counts, their scan's scratch,
    and the ping-pong pairs unless ``buffers`` gives them (:func:`pair_count` pairs,
    e.g. outputs of ``b``). Their size is fixed by the signature, so every call of the
    Program reuses them, with no allocation.

    ``on_bad(status, epoch, i)`` (a device function; None: no report) is called by the
    first pass for every bad key's input position ``i`` when ``epoch > 0`` (an
    ``np.int64``, or a per-call value of ``b``).

    ``values``: a placeholder, or :class:`Positions` (each pair's input position, made by
    the first pass).

    ``gate``: None, or ``(flag, value)``: the counting and moving kernels run only where
    ``flag[0] == value`` on the GPU (elsewhere the results are not written; the digit
    counts' scans still run, on whatever the counts hold).

    Example (keys in [0, 4)): keys ``[2, 0, 2, 1]``, values ``[a, b, c, d]`` ->
    ``[0, 1, 2, 2]``, ``[b, d, a, c]``.
    """
    n = keys.size
    sk_dt = sort_key_dtype(m)
    count_dt = np.dtype(np.int32 if n < (1 << 31) else np.int64)
    nt, vt = tile
    tiles = -(-n // (nt * vt))
    radix = 1 << digit_bits
    slots = radix * tiles
    n_passes = passes(m, digit_bits)
    cvt = ValueType.of(count_dt)
    scan_plan = scan._plan_for(plus, cvt, cvt, cvt, slots, "exclusive", None)
    key_bytes = _align(n * sk_dt.itemsize)
    pair_bytes = key_bytes + _align(n * values.dtype.itemsize)
    counts_at = offset + (pair_count(m, digit_bits) * pair_bytes if buffers is None else 0)
    scan_at = counts_at + _align(slots * count_dt.itemsize)
    end = scan_at + _align(scan_plan.scratch)
    _, ws = _launch.workspace(b.device_id, b.stream, end)
    if buffers is None:
        buffers = [(ws.view(sk_dt, (n,), offset + i * pair_bytes),
                    ws.view(values.dtype, (n,), offset + i * pair_bytes + key_bytes))
                   for i in range(pair_count(m, digit_bits))]
    counts = ws.view(count_dt, (slots,), counts_at)
    n64, m64, tiles64 = np.int64(n), np.int64(m), np.int64(tiles)
    if status is None or on_bad is None:
        status, epoch, on_bad = counts, np.int64(0), _no_report   # nothing is recorded at epoch 0
    flag, gate_on = _launch.gate_args(b, gate)
    made = isinstance(values, Positions)          # the first pass makes the values
    src_k, src_v = keys, (keys if made else values)   # (made: a stand-in, never read)
    for p in range(n_passes):
        first = p == 0
        key_dt = keys.dtype if first else sk_dt
        shift = np.int64(p * digit_bits)
        report = on_bad if first else _no_report
        b.launch(count_kernel(key_dt, sk_dt, first, digit_bits, tile, report),
                 ("radix-count", key_dt, sk_dt, first, digit_bits, tile, _name(report)), tiles, nt,
                 (src_k, n64, m64, shift, counts, tiles64, status, epoch if first else np.int64(0), flag, gate_on))
        # the scan of the counts, in place (its scratch after them)
        scan.add_launches(b, scan_plan, counts, counts, slots, 0, False, scratch=(ws, scan_at))
        dst_k, dst_v = buffers[p % 2]
        here = made and first
        b.launch(scatter_kernel(key_dt, sk_dt, values.dtype, count_dt, first, digit_bits, tile, here),
                 ("radix-scatter", key_dt, sk_dt, values.dtype, count_dt, first, digit_bits, tile, here),
                 tiles, nt, (src_k, src_v, n64, m64, shift, counts, tiles64, dst_k, dst_v, flag, gate_on))
        src_k, src_v = dst_k, dst_v
    return src_k, src_v, end


def _plan_grouping(key, keys, values):
    """The Program of :func:`group_by_key` for call signature ``key``."""
    _, _, m, stream, alloc_stream, digit_bits, tile = key
    b = _programs.Builder(keys.device_id, stream, alloc_stream)
    k, v = b.input(keys), b.input(values)
    pairs = group_buffers(b, k, v, m, digit_bits)
    group(b, k, v, m, 0, pairs, digit_bits=digit_bits, tile=tile)
    last = 2 * ((passes(m, digit_bits) - 1) % 2)         # the pair the last pass wrote
    return b.build(lambda got: (_arrays.describe(got[last], "keys"), _arrays.describe(got[last + 1], "values")))


def group_buffers(b, keys, values, m, digit_bits=DIGIT_BITS):
    """The ping-pong (keys, values) pairs of :func:`group` as new arrays of each call
    (outputs of builder ``b``, like placeholder ``keys``): memory of the caller's library,
    which its allocator reuses, not kept by cufold between calls."""
    return [(b.output(keys, keys.size, sort_key_dtype(m)), b.output(keys, keys.size, values.dtype))
            for _ in range(pair_count(m, digit_bits))]


_groupings = _programs.Programs(_plan_grouping, "cufold.group_by_key", 256)


def group_by_key(keys, values, m, stream, alloc_stream=None, digit_bits=DIGIT_BITS, tile=TILE):
    """Sort ``(keys, values)`` (1-D :class:`Arr` descriptors, ``n >= 1`` pairs) stably by
    key, on raw stream ``stream``; returns ``(sorted keys, sorted values)``, new arrays
    (Arrs) of ``keys``' library allocated on ``alloc_stream`` (a raw handle; None: the
    library's current stream), as :func:`group` sorts them: one Program per signature.
    """
    key = (_programs.signature(keys), _programs.signature(values), m, stream, alloc_stream, digit_bits, tile)
    return _groupings.run(key, keys, values)
