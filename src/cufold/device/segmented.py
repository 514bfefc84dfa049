"""Segmented reductions: ``segmented_reduce`` over CSR segments and
``reduce_by_key`` over runs of equal keys (thrust::reduce_by_key).

``segmented_reduce``: merge-path decomposition, balanced for any mix of segments
==================================================================================

Segment ``i`` is ``values[offsets[i]:offsets[i+1]]``. Think of the work as one
path that merges two sorted lists: the ``m`` segment *ends* ``offsets[1:]`` and
the ``nnz`` value indices ``offsets[0] .. offsets[m]-1`` (Merrill and Garland's
merge-based CSR SpMV). Walking the path, a value is folded into the running
segment total, and a segment end writes the total out and starts the next
segment. The path has ``m + nnz`` items whatever the segment lengths, and it
is cut into tiles of exactly ``NV = NT x VT`` items (a tile per block, ``VT``
per thread): a million empty segments, a million short ones and one segment
of a billion values cost the same per item. This is what CUB's
one-block-per-segment ``DeviceSegmentedReduce`` lacks (one block walks a huge
segment alone while the others idle, and every empty segment occupies a block).

Two kernels per call:

1. *partition* (``tiles + 1`` threads): each thread binary-searches the path
   diagonal ``d = tile * NV`` against ``offsets`` (``log2 m`` loads), giving the
   tile's start coordinate (segments ended, values consumed). Reads
   ``(tiles + 1) log2 m`` offsets, a few µs.
2. *segments* (``tiles`` blocks, one pass): a tile loads its values (converted
   to the accumulator type) and its segment ends into shared memory with
   coalesced loads; every thread finds its own start on the tile's path with
   a merge-path search in shared memory (``log2 NV`` steps) and walks its
   ``VT`` items in order, writing every segment that starts and ends within
   its items. What is left, per thread, is the total of the segment it ended
   in (its *tail*) and of the segment it started in (its *head*): a block-wide
   segmented scan of the tails (reset by any segment end, shuffles plus one
   barrier) gives each thread the part of its head segment that precedes it
   in the tile, and the thread writes that segment. Segments crossing tile
   boundaries get what precedes them in earlier tiles from a *decoupled
   look-back* (as the single-pass scan): a tile that ends a segment publishes
   its tail at once as its inclusive prefix (nothing before it matters for its
   successors); a tile inside one segment publishes its aggregate, looks back
   over its predecessors (32 per step, a warp) and publishes its prefix. Tile
   ids come from an atomic ticket, so a tile only waits for running tiles.

Costs: reads ``nnz`` values and ``m + 1`` offsets once (plus ``(tiles+1)
log2 m`` in the partition), writes ``m`` results once (each by the thread that
meets the segment's end), ``tiles`` look-back states; two launches; no host
synchronisation. Operands are combined strictly in order (``init op x0 op x1
op ...``), so any associative operator works, commutative or not; no operator
identity is needed inside (partial totals carry a "has a value" flag).

``reduce_by_key``: head flags -> CSR offsets -> ``segmented_reduce``
=====================================================================

A key starts a run where it differs from its predecessor. One kernel counts
the run heads per tile, one block scans the counts; the number of runs is read
on the host (**one synchronisation**: the results have exactly one element per
run, as NumPy-style results must); a third kernel writes each run's start
offset and key, and ``segmented_reduce`` folds the runs.
"""

import collections
import functools
import os

import numpy as np
from numba import config, cuda

from .. import _codegen, block
from ..ops import as_op, as_transform, plus
from ..values import InputType, ValueType
from ..host import arrays as _arrays, launch as _launch, programs as _programs, types as _types
from ..host.launch import Tile
from ..host import readback as _readback
from .scan import _fetch, _publish, _storage_vt, _to_acc, draw, look_back_state  # the scan's look-back pieces

__all__ = ["segmented_reduce", "reduce_by_key", "tile_for"]

SIMULATOR = bool(config.ENABLE_CUDASIM)
FULL_MASK = 0xFFFFFFFF
# Look-back tile states (the low two bits of a flag; the launch's epoch above them: scan.draw).
EMPTY, AGGREGATE, PREFIX, PREFIX_NONE = 0, 1, 2, 3
_PARTITION_THREADS = 64 if SIMULATOR else 256


# --- tiles ---------------------------------------------------------------------------------

def tile_for(acc_vt, path_items=None):
    """Threads and path items per thread of a ``segmented_reduce`` tile, for
    ``path_items`` (values and segments, where given).

    ``CUFOLD_SEG_TILE=NTxVT`` overrides (NT a multiple of 32). GPU: 256 threads
    and 8 items (fewer for accumulators over 16 bytes, so that the tile's values
    stay within 32 KiB of shared memory). Simulator: 64 x 2, so that inputs of a
    few hundred items cross many tiles (fuller for large inputs:
    ``_launch.simulator_tile``).
    """
    forced = os.environ.get("CUFOLD_SEG_TILE")
    if forced:
        nt, vt = (int(v) for v in forced.lower().split("x"))
    elif SIMULATOR:
        return _launch.simulator_tile(Tile(64, 2), path_items or 0)
    else:
        nt = 256
        vt = max(1, min(8, 32768 // (nt * max(acc_vt.itemsize, 1))))
    if nt % 32 or not 32 <= nt <= 1024 or vt < 1:
        raise ValueError("cufold: a segmented tile needs a multiple of 32 threads (<= 1024) and at "
                         "least one item per thread; got %dx%d" % (nt, vt))
    return Tile(nt, vt)


def _key_tile(n):
    """Keys per tile of the run-head kernels of ``reduce_by_key`` over ``n`` keys."""
    return _launch.simulator_tile(Tile(64, 2), n) if SIMULATOR else Tile(256, 16)


# --- offsets --------------------------------------------------------------------------------

@cuda.jit(device=True)
def _offset(offsets, i, nvals):
    """``offsets[i]`` clamped to ``[0, nvals]`` (no read outside ``values``)."""
    v = np.int64(offsets[i])
    return min(max(v, np.int64(0)), nvals)


@cuda.jit(device=True)
def _segment_end(offsets, s, base, nvals):
    """End of segment ``s`` as a path value index (relative to ``offsets[0]``), >= 0."""
    return max(_offset(offsets, s + 1, nvals), base) - base


@functools.lru_cache(maxsize=None)
def partition_kernel(nv):
    """Kernel ``(offsets, nvals, m, ps, pj, count)``: ``(ps[p], pj[p])`` = the
    merge-path coordinate (segments ended, values consumed) of diagonal
    ``p * nv`` (clamped to the path's end), for ``p < count``."""

    def partition(offsets, nvals, m, ps, pj, count):
        p = cuda.grid(1)
        if p < count:
            base = _offset(offsets, 0, nvals)
            nnz = max(_offset(offsets, m, nvals), base) - base
            diag = min(np.int64(p) * nv, m + nnz)
            lo = max(diag - nnz, np.int64(0))
            hi = min(diag, m)
            while lo < hi:
                pivot = (lo + hi) >> 1
                # Segment end `pivot` comes before value `diag - pivot - 1` iff end <= that index.
                if _segment_end(offsets, pivot, base, nvals) <= diag - pivot - 1:
                    lo = pivot + 1
                else:
                    hi = pivot
            ps[p] = lo
            pj[p] = diag - lo

    return partition


# --- device pieces of the segments kernel ---------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _seg_combine(op, vt):
    """``seg(ar, ah, av, br, bh, bv) -> (r, h, v)``: the segmented operator on
    (reset, has value, value) triples, ``a`` before ``b``: a reset in ``b``
    drops ``a``'s value; values combine in order; an empty side is skipped."""
    combine = op.combine(vt)

    @cuda.jit(device=True)
    def seg(ar, ah, av, br, bh, bv):
        if br:
            return True, bh, bv
        if not bh:
            return ar, ah, av
        if not ah:
            return ar, True, bv
        return ar, True, combine(av, bv)

    return seg


@functools.lru_cache(maxsize=None)
def _block_seg_scan(op, vt, nt):
    """``scan(r, h, v, wr, wh, wv) -> (exclusive r, h, v, tile r, h, v)`` over the
    block's threads in order, with the segmented operator: Kogge-Stone in each
    warp, warp totals through shared memory (``wr``, ``wh``: int32[NT/32],
    ``wv``: NT/32 values), one barrier. Every thread of the block calls it once."""
    seg = _seg_combine(op, vt)
    shfl_up = vt.shuffle("up")
    load, store = vt.load, vt.store
    nw = nt // 32

    @cuda.jit(device=True)
    def scan(r, h, v, wr, wh, wv):
        tid = cuda.threadIdx.x
        lane = tid & 31
        w = tid >> 5
        d = 1
        while d < 32:
            orr = cuda.shfl_up_sync(FULL_MASK, np.int32(1 if r else 0), d)
            oh = cuda.shfl_up_sync(FULL_MASK, np.int32(1 if h else 0), d)
            ov = shfl_up(FULL_MASK, v, d)
            if lane >= d:
                r, h, v = seg(orr != 0, oh != 0, ov, r, h, v)
            d *= 2
        if lane == 31:
            wr[w] = 1 if r else 0
            wh[w] = 1 if h else 0
            store(wv, w, v)
        er = cuda.shfl_up_sync(FULL_MASK, np.int32(1 if r else 0), 1)
        eh = cuda.shfl_up_sync(FULL_MASK, np.int32(1 if h else 0), 1)
        ev = shfl_up(FULL_MASK, v, 1)
        first = lane == 0
        cuda.syncthreads()
        pr, ph, pv = False, False, v
        tr, th, tv = False, False, v
        for k in range(nw):
            kr = wr[k] != 0
            kh = wh[k] != 0
            kv = load(wv, k)
            if k < w:
                pr, ph, pv = seg(pr, ph, pv, kr, kh, kv)
            tr, th, tv = seg(tr, th, tv, kr, kh, kv)
        if first:
            return pr, ph, pv, tr, th, tv
        cr, ch, cv = seg(pr, ph, pv, er != 0, eh != 0, ev)
        return cr, ch, cv, tr, th, tv

    return scan


@functools.lru_cache(maxsize=None)
def _look_back(op, vt):
    """``look_back(tile, flags, tag, aggs, pres, placeholder) -> (has, exclusive)``:
    the fold of everything in front of ``tile`` back to the last inclusive prefix
    (PREFIX: a value; PREFIX_NONE: nothing). Called by the 32 lanes of warp 0."""
    combine = op.combine(vt)
    fetch = _fetch(vt)
    shfl_idx = vt.shuffle("idx")

    @cuda.jit(device=True)
    def status(flags, j, tag):
        """Tile ``j``'s state in this launch (an atomic read: the L2 copy, never hoisted)."""
        if j < 0:
            return np.uint32(PREFIX_NONE)
        f = cuda.atomic.or_(flags, j, np.uint32(0))
        if (f >> 2) == (tag >> 2):
            return f & 3
        return np.uint32(EMPTY)

    @cuda.jit(device=True)
    def look_back(tile, flags, tag, aggs, pres, placeholder):
        lane = cuda.laneid
        has = False
        excl = placeholder
        top = tile - 1
        while True:
            j = top - 31 + lane                 # lanes take tiles in order
            s = status(flags, j, tag)
            while not cuda.all_sync(FULL_MASK, s != EMPTY):
                s = status(flags, j, tag)       # wait for every lane's tile to publish
            cuda.threadfence()                  # values were written before the flags
            value = placeholder
            mine = False
            if s == AGGREGATE:
                value = fetch(aggs, j)
                mine = True
            elif s == PREFIX:
                value = fetch(pres, j)
                mine = True
            stops = cuda.ballot_sync(FULL_MASK, s >= PREFIX)
            start = 31 - cuda.clz(stops) if stops != 0 else 0
            # The window's part, from the last prefix on, in tile order.
            wh = False
            wv = placeholder
            for src in range(start, 32):
                ov = shfl_idx(FULL_MASK, value, src)
                oh = cuda.shfl_sync(FULL_MASK, np.int32(1 if mine else 0), src)
                if oh != 0:
                    wv = combine(wv, ov) if wh else ov
                    wh = True
            if wh:
                excl = combine(wv, excl) if has else wv
                has = True
            if stops != 0:
                break
            top -= 32
        return has, excl

    return look_back


@cuda.jit(device=True)
def _set_flag(flags, tile, tag, state):
    cuda.threadfence()                      # the value before the flag
    cuda.atomic.exch(flags, tile, np.uint32(tag | state))


@functools.lru_cache(maxsize=None)
def _tile_carry(op, vt):
    """``(tile_carry, thread_carry)`` of a segmented tile.

    ``tile_carry(tid, tile, empty, needs, tr, th, tv, flags, tag, aggs, pres, init, meta, k,
    ev)``, called by warp 0: publishes the tile's state (``tr``: a segment starts in it;
    ``th``, ``tv``: its fold since the last start) and, where ``needs`` (its first segment
    began in an earlier tile), looks back for the carry into it; thread 0 leaves whether
    there is one in ``meta[k]`` and its value in ``ev``.

    ``thread_carry(cr, ch, cv, meta, k, ev) -> (has, value)``, after a barrier: what comes
    before a thread, (tile carry) op (earlier threads: ``cr``, ``ch``, ``cv``)."""
    combine = op.combine(vt)
    load, store = vt.load, vt.store
    publish = _publish(vt)
    look_back = _look_back(op, vt)

    @cuda.jit(device=True, inline="always")
    def tile_carry(tid, tile, empty, needs, tr, th, tv, flags, tag, aggs, pres, init, meta, k, ev):
        e_has = False
        e_val = init
        if tid == 0:
            if empty:
                _set_flag(flags, tile, tag, PREFIX_NONE)
            elif tr or not needs:
                # Nothing before this tile matters to its successors: publish the prefix now.
                if th:
                    publish(pres, tile, tv)
                    _set_flag(flags, tile, tag, PREFIX)
                else:
                    _set_flag(flags, tile, tag, PREFIX_NONE)
            else:
                publish(aggs, tile, tv)     # inside one segment: th is true
                _set_flag(flags, tile, tag, AGGREGATE)
        if needs:
            e_has, e_val = look_back(tile, flags, tag, aggs, pres, init)
            if not tr and tid == 0:
                publish(pres, tile, combine(e_val, tv) if e_has else tv)
                _set_flag(flags, tile, tag, PREFIX)
        if tid == 0:
            meta[k] = 1 if e_has else 0
            store(ev, 0, e_val)

    @cuda.jit(device=True, inline="always")
    def thread_carry(cr, ch, cv, meta, k, ev):
        ph = ch
        pv = cv
        if not cr and meta[k] != 0:
            e = load(ev, 0)
            pv = combine(e, cv) if ch else e
            ph = True
        return ph, pv

    return tile_carry, thread_carry


@functools.lru_cache(maxsize=None)
def _tile_loader(in_vt, acc_vt, nt, vt, transform=None):
    """``load_tile(values, offsets, nvals, m, base, s0, j0, nrows, nvt, sv, sa)``:
    the tile's ``nvt`` values (as accumulators) into ``sv`` and its ``nrows + 1``
    segment ends (relative to ``j0``, clamped to ``[0, NV + 1]``) into ``sa``,
    striped (coalesced). Generated and unrolled so that each thread issues all
    its loads before its first shared-memory store: they are in flight together."""
    big = nt * vt + 1
    lines = ["def load_tile(values, offsets, nvals, m, base, s0, j0, nrows, nvt, sv, sa):",
             "    tid = cuda.threadIdx.x",
             "    if nvt > 0:",
             "        last = nvt - 1",
             "        first = base + j0"]
    # Values: every slot loads (a clamped, valid address), only slots < nvt store.
    lines += ["        x%d = load_in(values, first + min(%d + tid, last))" % (k, k * nt) for k in range(vt)]
    lines += ["        if %d + tid < nvt:\n            store(sv, %d + tid, to_acc(x%d))" % (k * nt, k * nt, k)
              for k in range(vt)]
    # Segment ends: chunks beyond the tile's count are skipped as a block.
    lines += ["    count = nrows + 1", "    top = m - 1"]
    for k in range(vt + 1):
        lines += ["    e%d = np.int64(BIG)" % k,
                  "    if %d < count:" % (k * nt),
                  "        r%d = s0 + %d + tid" % (k, k * nt),
                  "        if r%d < m:" % k,
                  "            e%d = seg_end(offsets, min(r%d, top), base, nvals) - j0" % (k, k)]
    for k in range(vt + 1):
        lines += ["    if %d + tid < count:" % (k * nt),
                  "        sa[%d + tid] = min(max(e%d, np.int64(0)), np.int64(BIG))" % (k * nt, k)]
    env = {"load_in": in_vt.load, "to_acc": _to_acc(acc_vt, in_vt, transform), "store": acc_vt.store,
           "seg_end": _segment_end, "BIG": big}
    return _codegen.build("\n".join(lines) + "\n", "load_tile", env)


Spec = collections.namedtuple("Spec", "op in_vt acc_vt out_vt tile transform", defaults=(None,))
Spec.__doc__ = ("What a segments kernel is compiled for (``transform``: None or an ops.Transform "
                "applied to each value as it is loaded).")


@functools.lru_cache(maxsize=None)
def segments_kernel(spec):
    """The Python kernel of the one-pass merge-path segmented reduction.

    Arguments: ``(values, offsets, nvals, m, ps, pj, outs, init, has_init,
    tiles, counter, flags, aggs, pres)``; ``counter``: the launch's epoch and
    tile tickets (``scan.draw``); ``init`` is the value folded in
    front of every segment when ``has_init``, else the identity written for an
    empty segment.
    """
    op, in_vt, acc_vt, out_vt = spec.op, spec.in_vt, spec.acc_vt, spec.out_vt
    nt, vt = spec.tile
    nv = nt * vt
    nw = nt // 32
    combine = op.combine(acc_vt)
    load = acc_vt.load
    store_out, to_out = out_vt.store, out_vt.cast
    tile_storage = block.temp_storage(acc_vt, nv)
    warp_storage = block.temp_storage(acc_vt, nw)
    carry_storage = block.temp_storage(acc_vt, 1)
    block_scan = _block_seg_scan(op, acc_vt, nt)
    tile_carry, thread_carry = _tile_carry(op, acc_vt)
    load_tile = _tile_loader(in_vt, acc_vt, nt, vt, spec.transform)
    big = nv + 1                                # also the row-end array's size (a constant)

    @cuda.jit(device=True)
    def finish(outs, row, have, acc, init, has_init):
        """Write segment ``row``: ``init op total`` (``init`` alone when empty)."""
        if has_init:
            v = combine(init, acc) if have else init
        else:
            v = acc if have else init
        store_out(outs, row, to_out(v))

    def segments(values, offsets, nvals, m, ps, pj, outs, init, has_init, tiles, counter, flags,
                 aggs, pres):
        sv = tile_storage()
        wv = warp_storage()
        ev = carry_storage()
        sa = cuda.shared.array(big, np.int32)
        wr = cuda.shared.array(nw, np.int32)
        wh = cuda.shared.array(nw, np.int32)
        meta = cuda.shared.array(2, np.int64)
        tid = cuda.threadIdx.x
        if tid == 0:
            # Dynamic tile ids: tiles start in id order, so a look-back only waits for running tiles.
            t, tg = draw(counter, tiles)
            meta[0] = t
            meta[1] = tg
        cuda.syncthreads()
        tile = meta[0]
        tag = np.uint32(meta[1])
        s0 = ps[tile]
        j0 = pj[tile]
        nrows = ps[tile + 1] - s0               # segment ends in this tile
        nvt = pj[tile + 1] - j0                 # values in this tile
        total = nrows + nvt
        base = _offset(offsets, 0, nvals)

        load_tile(values, offsets, nvals, m, base, s0, j0, nrows, nvt, sv, sa)
        cuda.syncthreads()

        # This thread's start on the tile's path (merge-path search in shared memory).
        diag = min(np.int64(tid) * vt, total)
        lo = max(diag - nvt, np.int64(0))
        hi = min(diag, nrows)
        while lo < hi:
            pivot = (lo + hi) >> 1
            if sa[pivot] <= diag - pivot - 1:
                lo = pivot + 1
            else:
                hi = pivot
        s = lo
        j = diag - lo
        stop = min(diag + vt, total)

        # Walk: fold values; a segment end writes the segment (all but the first).
        head_row = s0 + s
        have = False
        acc = init
        head_have = False
        head = init
        resets = 0
        end = sa[s]
        for k in range(vt):
            if s + j < stop:
                if j < end:
                    x = load(sv, j)
                    acc = combine(acc, x) if have else x
                    have = True
                    j += 1
                else:
                    if resets == 0:
                        head_have = have
                        head = acc
                    else:
                        finish(outs, s0 + s, have, acc, init, has_init)
                    resets += 1
                    have = False
                    s += 1
                    end = sa[s]

        # What precedes each thread's head segment in the tile, and the tile's total.
        cr, ch, cv, tr, th, tv = block_scan(resets > 0, have, acc, wr, wh, wv)

        if tid < 32:
            needs = False                       # the tile's first segment began in an earlier tile
            if tile > 0 and total > 0:
                started = np.int64(0)
                if s0 > 0:
                    started = _segment_end(offsets, s0 - 1, base, nvals)
                needs = started < j0
            tile_carry(tid, tile, total == 0, needs, tr, th, tv, flags, tag, aggs, pres, init, meta, 1, ev)
        cuda.syncthreads()

        # The first segment end of each thread: (tile carry) op (earlier threads) op head.
        if resets > 0:
            ph, pv = thread_carry(cr, ch, cv, meta, 1, ev)
            if head_have:
                fv = combine(pv, head) if ph else head
                fh = True
            else:
                fv = pv
                fh = ph
            finish(outs, head_row, fh, fv, init, has_init)

    return segments


def _align(nbytes):
    return -(-nbytes // 256) * 256


def _carve(ws, offset, vt, count):
    views = []
    for f in vt.fields:
        views.append(ws.view(f, (max(count, 1),), offset))
        offset += _align(max(count, 1) * f.itemsize)
    return (tuple(views) if vt.is_tuple else views[0]), offset


def _pack(vt, arrs):
    return tuple(arrs) if vt.is_tuple else arrs[0]


# --- host side -------------------------------------------------------------------------------------

def _describe_values(x, name):
    """The Arr(s) of a value input: one array, or a tuple (list) of equally long ones."""
    if x.__class__ is tuple or x.__class__ is list:
        return _arrays.describe_many(tuple(x), name)
    return (_arrays.describe(x, name),)


def _value_type(arrs):
    """The arrays' value type (an InputType where some are generated: counting, constant)."""
    return InputType.of(tuple(a.dtype for a in arrs) if len(arrs) > 1 else arrs[0].dtype,
                        tuple(getattr(a, "source", "array") for a in arrs))


def _item_type(in_vt, transform):
    """What the operator combines: the values, or what ``transform`` returns for them."""
    return ValueType.of(in_vt) if transform is None else transform.result_type(in_vt)


def _result_types(op, in_vt, dtype):
    """(accumulator, result) value types, as ``cufold.reduce`` chooses them."""
    return _types.value_types(_types.result_fields(op, in_vt, dtype))


def _start_value(op, acc_vt, init, name, never_empty=False):
    """(init value, has_init): ``init`` if given, else the identity (the value of
    an empty segment); an operator without identity needs ``init``, unless no
    segment can be empty (reduce_by_key's runs), when a placeholder is never used."""
    if init is not None:
        return acc_vt.make(init), True
    ident = op.identity_for(acc_vt)
    if ident is None and never_empty:
        return acc_vt.make(acc_vt.sample()), False
    if ident is None:
        raise ValueError("cufold: operator %s has no identity; pass init= to %s (the value of an "
                         "empty segment, folded in front of every segment)" % (op.name, name))
    return ident, False


def _run_segments(b, spec, xs, off, nvals, m, outs, init_value, has_init):
    """Add the partition and segments kernels (``m >= 1``) to Program builder ``b``."""
    nt, vt = spec.tile
    nv = nt * vt
    tiles = max(1, -(-(m + nvals) // nv))       # nnz <= nvals: extra tiles are empty
    sacc = _storage_vt(spec.acc_vt)
    idx_bytes = _align(8 * (tiles + 1))
    val_bytes = sum(_align(tiles * f.itemsize) for f in sacc.fields)
    _, ws = _launch.workspace(b.device_id, b.stream, 2 * idx_bytes + 2 * val_bytes)
    ps = ws.view(np.int64, (tiles + 1,), 0)
    pj = ws.view(np.int64, (tiles + 1,), idx_bytes)
    aggs, offset = _carve(ws, 2 * idx_bytes, sacc, tiles)
    pres, offset = _carve(ws, offset, sacc, tiles)
    st = look_back_state(b.device_id, b.stream, tiles)
    b.guard(lambda: st.fits(tiles))
    b.launch(partition_kernel(nv), ("seg_partition", nv), -(-(tiles + 1) // _PARTITION_THREADS),
             _PARTITION_THREADS, (off, np.int64(nvals), np.int64(m), ps, pj, np.int64(tiles + 1)))
    b.launch(segments_kernel(spec), ("segments", spec), tiles, nt,
             (xs, off, np.int64(nvals), np.int64(m), ps, pj, outs, init_value, bool(has_init),
              np.int64(tiles), st.counter, st.flags[0], aggs, pres))


def _plan_segmented(arrs, off, op, init, dtype, handle, alloc_stream, name, never_empty=False, transform=None):
    """The Program of a segmented reduction of ``arrs`` (the value fields) over CSR
    offsets ``off``, called with the value arrays and the offsets."""
    in_vt = _value_type(arrs)
    acc_vt, out_vt = _result_types(op, _item_type(in_vt, transform), dtype)
    op.check(acc_vt)
    init_value, has_init = _start_value(op, acc_vt, init, name, never_empty)
    b = _programs.Builder(off.device_id, handle, alloc_stream)
    xs = [b.input(a) for a in arrs]
    o = b.input(off)
    m = off.size - 1
    home = xs[0] if xs[0].library != "generated" else o
    outs = [b.output(home, (m,), f) for f in out_vt.fields]
    if m > 0:
        spec = Spec(op, in_vt, acc_vt, out_vt, tile_for(acc_vt, arrs[0].size + m), transform)
        _run_segments(b, spec, _pack(in_vt, xs), o, arrs[0].size, m, _pack(out_vt, outs), init_value,
                      has_init)
    return b.build(lambda got: tuple(got) if out_vt.is_tuple else got[0])


def _check_values(arrs, name):
    for a in arrs:
        if a.ndim != 1:
            raise ValueError("cufold: %s must be 1-D; got shape %s" % (name, a.shape))


def _check_offsets(off):
    if off.ndim != 1 or off.size < 1:
        raise ValueError("cufold: offsets must be a 1-D array of len(segments) + 1 >= 1 entries; "
                         "got shape %s" % (off.shape,))
    if off.dtype.kind not in "iu":
        raise TypeError("cufold: offsets must have an integer dtype, not %s" % off.dtype)


def segmented_reduce(values, offsets, op=plus, init=None, *, dtype=None, stream=None, deterministic=True,
                     transform=None):
    """Reduce every segment ``values[offsets[i]:offsets[i+1]]`` of a CSR layout.

    Parameters
    ----------
    values : CUDA array (any library), or a tuple of equally long arrays (tuple values);
        or feature rows, a 2-D array ``(n, F)`` (any strides; the result is ``(segments,
        F)``; ``cufold.device.rows``: lanes over features, spans of rows per warp).
    offsets : 1-D CUDA array of any integer dtype, ``len(segments) + 1`` entries,
        non-decreasing, within ``[0, len(values)]`` (not checked: offsets outside
        are clamped, decreasing ones give unspecified results). Values before
        ``offsets[0]`` and from ``offsets[-1]`` on are ignored.
    op : cufold.Op or function ``(a, b) -> c``; associative. Commutativity is not
        needed: each segment is the ordered fold ``init op v0 op v1 op ...``.
    init : folded in front of every segment, and the result of an empty one
        (NumPy's ``initial``). Default: the operator's identity, which an
        operator without one replaces by a required ``init``.
    dtype : accumulator and result dtype (default as ``cufold.reduce``: sums of
        small integers are int64/uint64, float16 accumulates in float32).
    stream : the library's stream object or a raw ``CUstream`` handle.
    deterministic : True (default): the same bits run to run; ``"gpu_to_gpu"``
        (float sums, ``op=plus``, no ``init``): the same bits on any GPU and launch
        shape, by binned summation (a warp per segment; see
        :mod:`cufold.device.reproducible` for the error bound); with ``transform=``
        too, whose results (one float per value) are what is summed.
    transform : a function of one value (of the tuple of values for tuple inputs)
        applied to each value as it is loaded, in the same kernel (as
        ``cufold.reduce``'s); ``values`` may be or hold generated inputs. Feature
        rows ``(n, F)``: it applies to each item, every feature of a row on its own
        (``transform=abs`` sums ``|values|`` feature by feature).

    Returns an array of ``len(offsets) - 1`` results in ``values``' library (a
    tuple for tuple values), without synchronising the host.

    Unlike ``np.add.reduceat`` (which gives ``values[offsets[i]]`` for an empty
    segment), an empty segment is ``init`` or the identity, as
    ``torch.segment_reduce`` and CUB.

    Load balancing: merge path over segment ends and values (see the module doc):
    every block gets the same number of (values + segment ends) whatever the mix
    of empty, tiny and huge segments; two launches, no host synchronisation.

    Example::

        >>> v = cupy.arange(10, dtype=cupy.float32)
        >>> cufold.segmented_reduce(v, cupy.asarray([0, 3, 3, 10]))
        array([ 3.,  0., 42.], dtype=float32)
        >>> cufold.segmented_reduce(v, cupy.asarray([0, 3, 3, 10]), cufold.maximum, init=-1)
        array([ 2., -1.,  9.], dtype=float32)
        >>> cufold.segmented_reduce(v.reshape(5, 2), cupy.asarray([0, 1, 5]))
        array([[ 0.,  1.],
               [20., 24.]], dtype=float32)
    """
    arrs = _describe_values(values, "values")
    off = _arrays.describe(offsets, "offsets")
    if len(arrs) == 1 and arrs[0].ndim != 1:          # feature rows (n, F)
        from . import rows
        if deterministic.__class__ is str and \
                rows.item_dtype(arrs[0].dtype, as_transform(transform), "segmented_reduce").kind == "f":
            raise ValueError("cufold: deterministic=%r takes 1-D values; feature rows (n, F) are reproducible "
                             "run to run (deterministic=True), not across GPUs" % (deterministic,))
        return rows.segmented_reduce(arrs[0], off, op, init, dtype, _arrays.stream_handle(arrs + (off,), stream),
                                     stream is not None, transform)
    return _segmented_programs.run(
        (tuple(map(_programs.signature, arrs)), _programs.signature(off),
         _arrays.stream_handle(arrs + (off,), stream), op, init, dtype, stream is not None, deterministic,
         transform), *arrs, off)


def _plan_segmented_key(key, *arrays):
    """The Program of segmented_reduce call signature ``key`` for ``arrays`` (the
    value fields, then the offsets)."""
    _, _, handle, op, init, dtype, given_stream, deterministic = key[:8]
    transform = as_transform(key[8] if len(key) > 8 else None)
    arrs, off = arrays[:-1], arrays[-1]
    _check_values(arrs, "values")
    _check_offsets(off)
    _arrays.same_device(tuple(a for a in arrays if a.library != "generated"), "values and offsets")
    if deterministic.__class__ is str and any(f.kind == "f" for f in _item_type(_value_type(arrs), transform).fields):
        if deterministic != "gpu_to_gpu":
            raise ValueError("cufold: deterministic must be True or 'gpu_to_gpu'; got %r" % (deterministic,))
        from . import reproducible
        b = _programs.Builder(off.device_id, handle, handle if given_stream else None)
        reproducible.plan_segments(b, arrs, off, off.size - 1, as_op(op), init, dtype, transform)
        return b.build()
    return _plan_segmented(arrs, off, as_op(op), init, dtype, handle, handle if given_stream else None,
                           "segmented_reduce", transform=transform)


_segmented_programs = _programs.Programs(_plan_segmented_key, "cufold.segmented_reduce", 4096)


# --- reduce_by_key -----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _head(key_vt):
    """``is_head(keys, i) -> bool``: item ``i`` starts a run (``i == 0`` or a new key)."""
    load, equal = key_vt.load, key_vt.equal

    @cuda.jit(device=True)
    def is_head(keys, i):
        if i == 0:
            return True
        return not equal(load(keys, i), load(keys, i - 1))

    return is_head


@functools.lru_cache(maxsize=None)
def count_heads_kernel(key_vt, tile):
    """Kernel ``(keys, n, counts)``: ``counts[b]`` = run heads in tile ``b`` (striped loads)."""
    nt, vt = tile
    nv = nt * vt
    is_head = _head(key_vt)
    block_sum = block.reduce(plus, np.int64, nt)

    def count_heads(keys, n, counts):
        tid = cuda.threadIdx.x
        base = np.int64(cuda.blockIdx.x) * nv
        c = np.int64(0)
        for k in range(vt):
            i = base + k * nt + tid
            if i < n and is_head(keys, i):
                c += 1
        total = block_sum(c)
        if tid == 0:
            counts[cuda.blockIdx.x] = total

    return count_heads


@functools.lru_cache(maxsize=None)
def scan_counts_kernel(nt):
    """Kernel ``(counts, tiles, total)`` for one block: ``counts`` becomes its
    exclusive scan in place; ``total[0]`` the number of runs."""
    scan = block.exclusive_scan(plus, np.int64, nt, aggregate=True)

    def scan_counts(counts, tiles, total):
        tid = cuda.threadIdx.x
        running = np.int64(0)
        for base in range(0, tiles, nt):
            i = base + tid
            c = counts[i] if i < tiles else np.int64(0)
            excl, agg = scan(c)
            if i < tiles:
                counts[i] = running + excl
            running += agg
        if tid == 0:
            total[0] = running

    return scan_counts


@functools.lru_cache(maxsize=None)
def scatter_heads_kernel(key_vt, tile):
    """Kernel ``(keys, n, bases, runs, offsets, unique)``: each run's start
    offset and key, in order (blocked: a thread's items are adjacent); the last
    block also writes ``offsets[runs] = n``."""
    nt, vt = tile
    nv = nt * vt
    is_head = _head(key_vt)
    load, store = key_vt.load, key_vt.store
    scan = block.exclusive_scan(plus, np.int64, nt)

    def scatter_heads(keys, n, bases, runs, offsets, unique):
        tid = cuda.threadIdx.x
        first = np.int64(cuda.blockIdx.x) * nv + np.int64(tid) * vt
        c = np.int64(0)
        for k in range(vt):
            i = first + k
            if i < n and is_head(keys, i):
                c += 1
        pos = scan(c) + bases[cuda.blockIdx.x]
        for k in range(vt):
            i = first + k
            if i < n and is_head(keys, i):
                offsets[pos] = i
                store(unique, pos, load(keys, i))
                pos += 1
        if tid == 0 and cuda.blockIdx.x == cuda.gridDim.x - 1:
            offsets[runs] = n

    return scatter_heads


def reduce_by_key(keys, values, op=plus, *, dtype=None, stream=None, transform=None):
    """Reduce each run of equal adjacent keys (``thrust::reduce_by_key``).

    Parameters
    ----------
    keys : 1-D CUDA array (any numeric dtype), or a tuple of equally long arrays
        (tuple keys, equal when every field is); equal keys must be adjacent to
        be one run (a key that comes back later starts a new run, as in thrust;
        NaN keys never equal anything, so each NaN is its own run).
    values : CUDA array(s) as long as ``keys`` (a tuple for tuple values); or feature
        rows, a 2-D array ``(n, F)``: totals of shape ``(runs, F)``.
    op : cufold.Op or function ``(a, b) -> c``; associative (an ordered fold per run).
    dtype : accumulator and result dtype (default as ``cufold.reduce``).
    stream : the library's stream object or a raw ``CUstream`` handle.
    transform : a function of one value applied to each as it is loaded (as
        ``cufold.reduce``'s); ``values`` may be or hold generated inputs. Feature
        rows: it applies to each item, every feature of a row on its own.

    Returns ``(unique_keys, totals)``, arrays of the input library with one
    element per run. **Synchronises the host once**, to read the number of runs
    and allocate results of exactly that length (thrust returns an end iterator
    instead). Cost: keys are read three times and values once.

    Example::

        >>> k = torch.tensor([1, 1, 2, 2, 2, 1], device="cuda")
        >>> cufold.reduce_by_key(k, torch.ones(6, device="cuda"))
        (tensor([1, 2, 1], device='cuda:0'), tensor([2., 3., 1.], device='cuda:0'))
    """
    karrs = _describe_values(keys, "keys")
    varrs = _describe_values(values, "values")
    rows = varrs[0].shape[0] if varrs[0].ndim else 1
    if rows != karrs[0].size:
        raise ValueError("cufold: keys and values must be equally long; got %d and %d"
                         % (karrs[0].size, rows))
    handle = _arrays.stream_handle(karrs + varrs, stream)
    ksig = tuple(map(_programs.signature, karrs))
    if karrs[0].size == 0:
        return _by_runs.run((ksig, tuple(map(_programs.signature, varrs)), handle, op, dtype, 0,
                             stream is not None, transform), *karrs, *varrs)
    counts = _run_counts.run((ksig, handle), *karrs)
    runs = int(_readback.read_to_host(counts.view(np.int64, (1,), (counts.size - 1) * 8), handle)[0])  # the sync
    return _by_runs.run((ksig, tuple(map(_programs.signature, varrs)), handle, op, dtype, runs,
                         stream is not None, transform), *karrs, counts, *varrs)


def _check_by_key(karrs, varrs):
    every = karrs + varrs
    if len(varrs) == 1 and varrs[0].ndim != 1:        # feature rows (n, F)
        from . import rows
        rows.check_segment_rows(varrs[0])
        every = karrs
    _check_values(every, "keys and values")
    _arrays.same_device(karrs + varrs, "keys and values")


def _plan_count_key(key, *karrs):
    """The counting Program of reduce_by_key's keys of signature ``key``."""
    _check_values(karrs, "keys")
    _arrays.same_device(karrs, "keys")
    return _plan_count_runs(karrs, key[1])


def _plan_runs_key(key, *arrays):
    """The Program of reduce_by_key call signature ``key`` for ``runs`` runs: keys,
    the counts (where there are runs), values."""
    ksig, vsig, handle, op, dtype, runs, given_stream = key[:7]
    karrs, varrs = arrays[:len(ksig)], arrays[len(arrays) - len(vsig):]
    _check_by_key(karrs, varrs)
    return _plan_runs(karrs, varrs, as_op(op), dtype, runs, handle, handle if given_stream else None,
                      as_transform(key[7] if len(key) > 7 else None))


def _plan_count_runs(karrs, handle):
    """Program ``(keys...) -> counts``: per key tile, the runs starting before it
    (an exclusive scan), then the number of runs (``counts[tiles]``), in a new
    int64 array on the device (an Arr, read by the caller and the next Program)."""
    key_vt = _value_type(karrs)
    n = karrs[0].size
    nt, vt = _key_tile(n)
    tiles = -(-n // (nt * vt))
    b = _programs.Builder(karrs[0].device_id, handle)
    ks = [b.input(a) for a in karrs]
    counts = b.output(ks[0], (tiles + 1,), np.int64)
    kx = _pack(key_vt, ks)
    first, total = counts.view(np.int64, (tiles,), 0), counts.view(np.int64, (1,), 8 * tiles)
    b.launch(count_heads_kernel(key_vt, (nt, vt)), ("rbk_count", key_vt, (nt, vt)), tiles, nt,
             (kx, np.int64(n), first))
    b.launch(scan_counts_kernel(nt), ("rbk_scan", nt), 1, nt, (first, np.int64(tiles), total))
    return b.build(lambda got: _arrays.describe(got[0], "counts"))


def _plan_runs(karrs, varrs, op, dtype, runs, handle, alloc_stream, transform=None):
    """Program ``(keys..., counts, values...) -> (unique keys, totals)`` for ``runs``
    runs (none: ``(keys..., values...)``, empty results)."""
    key_vt, in_vt = _value_type(karrs), _value_type(varrs)
    features = varrs[0].shape[1:] if len(varrs) == 1 and varrs[0].ndim == 2 else ()
    if features and transform is not None:       # feature rows: each value (a row's feature) alone
        from . import rows
        rows.item_dtype(varrs[0].dtype, transform, "reduce_by_key")
    acc_vt, out_vt = _result_types(op, _item_type(in_vt, transform), dtype)
    op.check(acc_vt)
    n = karrs[0].size
    nt, vt = _key_tile(n)
    tiles = -(-n // (nt * vt))
    b = _programs.Builder(karrs[0].device_id, handle, alloc_stream)
    ks = [b.input(a) for a in karrs]
    counts = b.input(_arrays.shell(karrs[0], np.int64, (tiles + 1,))) if n > 0 else None
    vs = [b.input(a) for a in varrs]
    ukeys = [b.output(ks[0], (runs,), f) for f in key_vt.fields]
    off = b.output(ks[0], (runs + 1,), np.int64)                  # the runs as CSR segments
    totals = [b.output(ks[0], (runs,) + features, f) for f in out_vt.fields]
    if runs > 0:
        b.launch(scatter_heads_kernel(key_vt, (nt, vt)), ("rbk_scatter", key_vt, (nt, vt)), tiles, nt,
                 (_pack(key_vt, ks), np.int64(n), counts, np.int64(runs), off, _pack(key_vt, ukeys)))
        init_value, has_init = _start_value(op, acc_vt, None, "reduce_by_key", never_empty=True)
        if features:
            from . import rows
            rows.add_segments(b, op, acc_vt, out_vt, vs[0], off, n, runs, features[0], totals[0], init_value,
                              has_init, transform)
        else:
            spec = Spec(op, in_vt, acc_vt, out_vt, tile_for(acc_vt, n + runs), transform)
            _run_segments(b, spec, _pack(in_vt, vs), off, n, runs, _pack(out_vt, totals), init_value, has_init)
    k, t = key_vt.arity, out_vt.arity
    return b.build(lambda got: (_pack(key_vt, got[:k]), _pack(out_vt, got[k + 1:k + 1 + t])))


_run_counts = _programs.Programs(_plan_count_key, "cufold.reduce_by_key (runs)", 1024)
_by_runs = _programs.Programs(_plan_runs_key, "cufold.reduce_by_key", 4096)
