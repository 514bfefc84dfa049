"""Segmented scans: ``segmented_scan`` over CSR segments, ``inclusive_scan_by_key``
and ``exclusive_scan_by_key`` over runs of equal adjacent keys (thrust's).

One kernel for both: a single-pass flagged scan
=================================================

A segmented scan is a plain scan of (head flag, value) pairs under the
segmented operator (a head drops what came before it: ``_seg_combine`` of
``segmented.py``). The kernel scans tiles of values in one pass with a
decoupled look-back between tiles, as ``segmented_reduce`` does, and differs
from the plain scan only in where the head flags come from:

* **by key** (``*_scan_by_key``): tile ``t`` is values ``t*NV .. t*NV + NV - 1``
  (``NV = NT x VT``); value ``i`` is a head where ``i == 0`` or ``keys[i] !=
  keys[i-1]`` (read with coalesced loads next to the values). One launch.
* **over CSR offsets** (``segmented_scan``): a segment starts at every
  ``offsets[s]``. Tiles are cut on the *merge path* of the ``m + 1`` segment
  starts and the ``n`` values (Merrill and Garland's merge-based CSR SpMV, as
  ``segmented_reduce``): each tile takes exactly ``NV`` path items, starts and
  values together, so a million empty segments, a million short ones and one
  segment of a billion values cost the same per item (a tile of only starts
  writes nothing). A *partition* kernel binary-searches each tile's start
  on the path (``log2 m`` offset loads per tile), then the scan kernel marks the
  heads of its values from its own starts (coalesced loads). Two launches.

Per tile (``NT`` threads, ``VT`` values each, all in shared memory from load to
store): values and head flags are loaded striped (coalesced); each thread folds
its ``VT`` consecutive values with the segmented operator; a block-wide
segmented scan of the threads' folds (``_block_seg_scan``: shuffles and one
barrier) gives each thread what precedes it in the tile. A tile with a head
publishes its inclusive prefix at once (nothing before its last head matters to
later tiles); a tile inside one segment publishes its aggregate, looks back
over its predecessors (warp 0, 32 tiles a step: ``segmented._look_back``) and
publishes its prefix. Only a tile whose first value is not a head waits for the
look-back. Each thread then rescans its values after its carry-in and the tile
is stored striped. Tile ids come from an atomic ticket (``scan.draw``), so a
tile only waits on tiles already running.

Costs: reads the values (and keys, or ``m + 1`` offsets plus ``(tiles + 1)
log2 m`` in the partition) once and writes the results once; one or two
launches; no host synchronisation. Operands are combined strictly in sequence
order, so any associative operator works (commutativity is not needed), and an
inclusive scan needs no identity.

Where values lie outside every segment (before ``offsets[0]``, from
``offsets[-1]`` on) they are scanned too: the scan restarts at every offset, so
they form a leading and a trailing segment of their own.

Floating-point sums may differ in the last bits from run to run (as the
single-pass scan's: where a look-back stops depends on timing).
"""

import collections
import functools

import numpy as np
from numba import cuda

from .. import _codegen, block
from ..host import arrays as _arrays
from ..host import dispatch as _dispatch
from ..host import launch as _launch
from ..host import programs as _programs
from ..ops import as_op, as_transform, plus
from . import scan as _scan
from . import segmented as _seg

__all__ = ["ALGORITHMS", "exclusive_scan_by_key", "inclusive_scan_by_key", "segmented_scan"]

#: One algorithm (listed for ``cufold.algorithms("segmented_scan")``): the
#: single-pass look-back flagged scan, its heads from offsets or from keys.
ALGORITHMS = ("single_pass",)
_dispatch.register("segmented_scan", ALGORITHMS)

_PARTITION_THREADS = _seg._PARTITION_THREADS


# --- the partition: each tile's start on the merge path of segment starts and values --------

@functools.lru_cache(maxsize=None)
def partition_kernel(nv):
    """Kernel ``(offsets, nvals, m, ps, pj, count)``: ``(ps[p], pj[p])`` = the
    merge-path coordinate (segment starts passed, values passed) of diagonal
    ``p * nv`` over the ``m + 1`` starts ``offsets[0..m]`` (clamped to
    ``[0, nvals]``) and the ``nvals`` values, for ``p < count``. A start ``s``
    comes before value ``i`` where ``offsets[s] <= i``."""
    offset = _seg._offset

    def partition(offsets, nvals, m, ps, pj, count):
        p = cuda.grid(1)
        if p < count:
            starts = m + 1
            diag = min(np.int64(p) * nv, starts + nvals)
            lo = max(diag - nvals, np.int64(0))
            hi = min(diag, starts)
            while lo < hi:
                pivot = (lo + hi) >> 1
                if offset(offsets, pivot, nvals) <= diag - pivot - 1:
                    lo = pivot + 1
                else:
                    hi = pivot
            ps[p] = lo
            pj[p] = diag - lo

    return partition


# --- device pieces ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _value_loader(in_vt, acc_vt, nt, vt, transform=None):
    """``load_values(values, first, count, sv, sf)``: ``values[first : first +
    count]`` (as accumulators) into the tile's slots ``sv``, striped, with their
    head flags ``sf`` cleared. Generated and unrolled so that each thread issues
    all its loads before its first shared-memory store."""
    lines = ["def load_values(values, first, count, sv, sf):",
             "    tid = cuda.threadIdx.x",
             "    if count > 0:",
             "        last = count - 1"]
    lines += ["        x%d = load_in(values, first + min(%d + tid, last))" % (k, k * nt) for k in range(vt)]
    for k in range(vt):
        lines += ["        if %d + tid < count:" % (k * nt),
                  "            s = slot(%d + tid)" % (k * nt),
                  "            store(sv, s, to_acc(x%d))" % k,
                  "            sf[s] = 0"]
    env = {"load_in": in_vt.load, "to_acc": _scan._to_acc(acc_vt, in_vt, transform), "store": acc_vt.store,
           "slot": _scan._slot(_scan._layout(vt))}
    return _codegen.build("\n".join(lines) + "\n", "load_values", env)


@functools.lru_cache(maxsize=None)
def _heads_from_offsets(nt, vt):
    """``(span, mark)`` of CSR mode. ``span(offsets, nvals, m, ps, pj, tile) ->
    (s0, starts, j0, count)``: the tile's first segment start, its number of
    starts, its first value and its number of values (clamped: decreasing
    offsets never reach outside the tile or the arrays). ``mark(offsets, nvals,
    m, s0, starts, j0, count, sf)``: flags the tile's values where a segment
    starts (after the flags were cleared and a barrier)."""
    nv = nt * vt
    slot = _scan._slot(_scan._layout(vt))
    offset = _seg._offset

    @cuda.jit(device=True)
    def span(offsets, nvals, m, ps, pj, tile):
        s0 = ps[tile]
        j0 = pj[tile]
        starts = max(min(ps[tile + 1] - s0, np.int64(nv), m + 1 - s0), np.int64(0))
        count = max(min(pj[tile + 1] - j0, np.int64(nv), nvals - j0), np.int64(0))
        return s0, starts, j0, count

    @cuda.jit(device=True)
    def mark(offsets, nvals, m, s0, starts, j0, count, sf):
        tid = cuda.threadIdx.x
        for k in range(vt):
            r = k * nt + tid
            if r < starts:
                at = offset(offsets, s0 + r, nvals) - j0
                if at >= 0 and at < count:
                    sf[slot(at)] = 1
        # A start equal to j0 may sit in an earlier tile (the path was cut between it
        # and value j0); value 0 starts the scan whatever the offsets.
        if tid == 0 and count > 0 and (j0 == 0 or (s0 > 0 and offset(offsets, s0 - 1, nvals) == j0)):
            sf[slot(0)] = 1

    return span, mark


@functools.lru_cache(maxsize=None)
def _heads_from_keys(key_vt, nt, vt):
    """``(span, mark)`` of by-key mode (see :func:`_heads_from_offsets`): tile
    ``t`` is values ``t*NV ..``; value ``i`` is a head where ``i == 0`` or its key
    differs from ``keys[i - 1]`` (coalesced loads of both)."""
    nv = nt * vt
    slot = _scan._slot(_scan._layout(vt))
    is_head = _seg._head(key_vt)

    @cuda.jit(device=True)
    def span(keys, nvals, m, ps, pj, tile):
        j0 = np.int64(tile) * nv
        return np.int64(0), np.int64(0), j0, max(min(nvals - j0, np.int64(nv)), np.int64(0))

    @cuda.jit(device=True)
    def mark(keys, nvals, m, s0, starts, j0, count, sf):
        tid = cuda.threadIdx.x
        for k in range(vt):
            i = k * nt + tid
            if i < count and is_head(keys, j0 + i):
                sf[slot(i)] = 1

    return span, mark


Spec = collections.namedtuple("Spec", "op in_vt acc_vt out_vt key_vt tile exclusive transform",
                              defaults=(None,))
Spec.__doc__ = """What a segmented scan kernel is compiled for: ``key_vt`` None for CSR
offsets (head flags from segment starts), else the keys' value type; ``transform``
None or an ops.Transform applied to each value as it is loaded."""


@functools.lru_cache(maxsize=None)
def segscan_kernel(spec):
    """The Python kernel of the single-pass segmented scan.

    Arguments: ``(values, heads, nvals, m, ps, pj, outs, init, fold_init, tiles,
    counter, flags, aggs, pres)``. ``heads``: the offsets (``m`` segments; ``ps``,
    ``pj``: the partition) or the keys (``m``, ``ps``, ``pj`` unused); ``init`` is
    folded in front of every segment when ``fold_init``, and is what an exclusive
    segment starts with (then the identity where no init was given);
    ``counter``/``flags``/``aggs``/``pres``: the look-back's epoch and tickets,
    tile states and values.
    """
    op, in_vt, acc_vt, out_vt = spec.op, spec.in_vt, spec.acc_vt, spec.out_vt
    nt, vt = spec.tile
    nw = nt // 32
    exclusive = spec.exclusive
    combine = op.combine(acc_vt)
    load, store = acc_vt.load, acc_vt.store
    store_out, to_out = out_vt.store, out_vt.cast
    slots = _scan._tile_slots(spec.tile)
    slot = _scan._slot(_scan._layout(vt))
    tile_storage = block.temp_storage(acc_vt, slots)
    warp_storage = block.temp_storage(acc_vt, nw)
    carry_storage = block.temp_storage(acc_vt, 1)
    block_scan = _seg._block_seg_scan(op, acc_vt, nt)
    tile_carry, thread_carry = _seg._tile_carry(op, acc_vt)
    load_values = _value_loader(in_vt, acc_vt, nt, vt, spec.transform)
    by_offsets = spec.key_vt is None
    if by_offsets:
        span, mark = _heads_from_offsets(nt, vt)
    else:
        span, mark = _heads_from_keys(spec.key_vt, nt, vt)

    def segscan(values, heads, nvals, m, ps, pj, outs, init, fold_init, tiles, counter, flags, aggs, pres):
        sv = tile_storage()
        wv = warp_storage()
        ev = carry_storage()
        sf = cuda.shared.array(slots, np.uint8)
        wr = cuda.shared.array(nw, np.int32)
        wh = cuda.shared.array(nw, np.int32)
        meta = cuda.shared.array(3, np.int64)
        tid = cuda.threadIdx.x
        if tid == 0:
            # Dynamic tile ids: tiles start in id order, so a look-back only waits for running tiles.
            t, tg = _scan.draw(counter, tiles)
            meta[0] = t
            meta[1] = tg
        cuda.syncthreads()
        tile = meta[0]
        tag = np.uint32(meta[1])
        s0, starts, j0, count = span(heads, nvals, m, ps, pj, tile)

        load_values(values, j0, count, sv, sf)
        if by_offsets:
            cuda.syncthreads()                  # flags cleared before any start marks one
        mark(heads, nvals, m, s0, starts, j0, count, sf)
        cuda.syncthreads()

        # This thread's values: VT consecutive ones, folded with the segmented operator
        # (init folded in front of each head's value, which is kept for the second pass).
        first = np.int32(tid) * vt
        mine = min(max(count - first, np.int64(0)), np.int64(vt))
        r = False
        h = False
        v = init
        for k in range(vt):
            if k < mine:
                s = slot(first + k)
                x = load(sv, s)
                if sf[s] != 0:
                    if fold_init:
                        x = combine(init, x)
                        store(sv, s, x)
                    r = True
                    v = x
                elif h:
                    v = combine(v, x)
                else:
                    v = x
                h = True

        # What precedes each thread in the tile, and the tile's fold.
        cr, ch, cv, tr, th, tv = block_scan(r, h, v, wr, wh, wv)

        if tid < 32:
            # The tile's first segment began in an earlier tile: it needs the look-back.
            needs = tile > 0 and count > 0 and sf[slot(0)] == 0
            tile_carry(tid, tile, count == 0, needs, tr, th, tv, flags, tag, aggs, pres, init, meta, 2, ev)
        cuda.syncthreads()

        # Rescan this thread's values after its carry-in: (tile carry) op (earlier threads).
        if mine > 0:
            ph, pv = thread_carry(cr, ch, cv, meta, 2, ev)
            for k in range(vt):
                if k < mine:
                    s = slot(first + k)
                    x = load(sv, s)
                    if sf[s] != 0:
                        ph = False
                    if exclusive:
                        store(sv, s, pv if ph else init)
                    pv = combine(pv, x) if ph else x
                    ph = True
                    if not exclusive:
                        store(sv, s, pv)
        cuda.syncthreads()
        for k in range(vt):
            i = k * nt + tid
            if i < count:
                store_out(outs, j0 + i, to_out(load(sv, slot(i))))

    return segscan


def tile_for(acc_vt, items=None):
    """Threads and values per thread of a segmented scan tile (``segmented.tile_for``:
    256 x 8 on a GPU, fewer for accumulators over 4 bytes; ``CUFOLD_SEG_TILE``
    overrides; tiny tiles in the simulator)."""
    return _seg.tile_for(acc_vt, items)


# --- host side --------------------------------------------------------------------------------

def _start_value(op, acc_vt, identity, init, exclusive, name):
    """(init value, fold_init): a given ``init`` is folded in front of every
    segment; without one an exclusive segment starts with the identity (an
    operator without one needs ``init``) and an inclusive scan folds nothing."""
    if init is not None:
        return acc_vt.make(init), True
    if exclusive and identity is None:
        raise ValueError("cufold: operator %s has no identity; pass init= to %s (the value an exclusive "
                         "segment starts with)" % (op.name, name))
    return (identity if identity is not None else acc_vt.make(acc_vt.sample())), False


def _plan(varrs, head_arrs, key_vt, op, exclusive, init, dtype, handle, alloc_stream, name, transform=None):
    """The Program of a segmented scan of ``varrs`` (the value fields) with head flags
    from ``head_arrs``: the CSR offsets (``key_vt`` None) or the key fields. The
    Program is called with the value fields, then ``head_arrs``."""
    in_vt = _seg._value_type(varrs)
    acc_vt, out_vt, identity = _scan._types_for(op, _seg._item_type(in_vt, transform), dtype, False)
    init_value, fold_init = _start_value(op, acc_vt, identity, init, exclusive, name)
    n = varrs[0].size
    b = _programs.Builder(head_arrs[0].device_id, handle, alloc_stream)
    xs = [b.input(a) for a in varrs]
    hs = [b.input(a) for a in head_arrs]
    home = xs[0] if xs[0].library != "generated" else hs[0]
    outs = [b.output(home, (n,), f) for f in out_vt.fields]
    if n > 0:
        by_offsets = key_vt is None
        m = head_arrs[0].size - 1 if by_offsets else 0
        spec = Spec(op, in_vt, acc_vt, out_vt, key_vt, tile_for(acc_vt, n + m + 1), bool(exclusive), transform)
        nt, vt = spec.tile
        nv = nt * vt
        tiles = -(-(m + 1 + n) // nv) if by_offsets else -(-n // nv)
        sacc = _scan._storage_vt(acc_vt)
        idx_bytes = _seg._align(8 * (tiles + 1))
        val_bytes = sum(_seg._align(tiles * f.itemsize) for f in sacc.fields)
        _, ws = _launch.workspace(b.device_id, b.stream, 2 * idx_bytes + 2 * val_bytes)
        ps = ws.view(np.int64, (tiles + 1,), 0)
        pj = ws.view(np.int64, (tiles + 1,), idx_bytes)
        aggs, offset = _seg._carve(ws, 2 * idx_bytes, sacc, tiles)
        pres, offset = _seg._carve(ws, offset, sacc, tiles)
        st = _scan.look_back_state(b.device_id, b.stream, tiles)
        b.guard(lambda: st.fits(tiles))
        heads = hs[0] if by_offsets else _seg._pack(key_vt, hs)
        if by_offsets:
            b.launch(partition_kernel(nv), ("segscan_partition", nv), -(-(tiles + 1) // _PARTITION_THREADS),
                     _PARTITION_THREADS, (heads, np.int64(n), np.int64(m), ps, pj, np.int64(tiles + 1)))
        b.launch(segscan_kernel(spec), ("segscan", spec), tiles, nt,
                 (_seg._pack(in_vt, xs), heads, np.int64(n), np.int64(m), ps, pj, _seg._pack(out_vt, outs),
                  init_value, bool(fold_init), np.int64(tiles), st.counter, st.flags[0], aggs, pres))
    return b.build(lambda got: tuple(got) if out_vt.is_tuple else got[0])


def _check_values(arrs, name):
    for a in arrs:
        if a.ndim != 1:
            raise ValueError("cufold: %s takes 1-D values; got shape %s" % (name, a.shape))


def segmented_scan(values, offsets, op=plus, *, exclusive=False, init=None, dtype=None, stream=None,
                   transform=None):
    """Scan every segment ``values[offsets[i]:offsets[i+1]]`` of a CSR layout on
    its own (the scan restarts at every offset).

    Parameters
    ----------
    values : 1-D CUDA array (any library), or a tuple of equally long ones (tuple values).
    offsets : 1-D CUDA array of any integer dtype, ``len(segments) + 1 >= 1``
        entries, non-decreasing, within ``[0, len(values)]`` (not checked:
        offsets outside are clamped; decreasing ones give unspecified results,
        never a read or write outside the arrays). Values before ``offsets[0]``
        and from ``offsets[-1]`` on are scanned as two more segments.
    op : cufold.Op or function ``(a, b) -> c``; associative (combined in
        sequence order: no commutativity needed).
    exclusive : False: ``out[i] = v[s] op ... op v[i]`` (``s`` the start of
        ``i``'s segment); True: ``out[i] = init op v[s] op ... op v[i-1]``, and
        ``init`` at each segment's start.
    init : exclusive: what each segment starts with (default: the operator's
        identity; an operator without one needs ``init``). Inclusive: folded in
        front of every segment where given (``init op v[s] op ...``).
    dtype : result dtype (a tuple for tuple values); default: the values' own;
        float16 accumulates in float32.
    stream : the library's stream object or a raw ``CUstream`` handle.
    transform : a function of one value (of the tuple of values for tuple
        inputs) applied to each as it is loaded, in the same kernel (as
        ``cufold.inclusive_scan``'s); ``values`` may be or hold generated inputs.

    Returns an array as long as ``values`` in its library (a tuple for tuple
    values), without synchronising the host. Balanced whatever the segment
    lengths (merge path over segment starts and values; see the module doc);
    two launches.

    Example::

        >>> v = cupy.arange(1, 8, dtype=cupy.int32)
        >>> off = cupy.asarray([0, 3, 3, 7])
        >>> cufold.segmented_scan(v, off)
        array([ 1,  3,  6,  4,  9, 15, 22], dtype=int32)
        >>> cufold.segmented_scan(v, off, exclusive=True)
        array([ 0,  1,  3,  0,  4,  9, 15], dtype=int32)
        >>> cufold.segmented_scan(v, off, cufold.maximum, exclusive=True, init=-1)
        array([-1,  1,  2, -1,  4,  5,  6], dtype=int32)
    """
    arrs = _seg._describe_values(values, "values")
    off = _arrays.describe(offsets, "offsets")
    return _offset_programs.run(
        (tuple(map(_programs.signature, arrs)), _programs.signature(off),
         _arrays.stream_handle(arrs + (off,), stream), op, bool(exclusive), init, dtype, stream is not None,
         transform), *arrs, off)


def _plan_offsets_key(key, *arrays):
    """The Program of segmented_scan call signature ``key`` for ``arrays`` (the value
    fields, then the offsets)."""
    _, _, handle, op, exclusive, init, dtype, given_stream, transform = key
    arrs, off = arrays[:-1], arrays[-1]
    _check_values(arrs, "segmented_scan")
    _seg._check_offsets(off)
    _arrays.same_device(tuple(a for a in arrays if a.library != "generated"), "values and offsets")
    return _plan(arrs, (off,), None, as_op(op), exclusive, init, dtype, handle, handle if given_stream else None,
                 "segmented_scan", as_transform(transform))


def inclusive_scan_by_key(keys, values, op=plus, *, dtype=None, stream=None, transform=None):
    """Inclusive scan of each run of equal adjacent keys
    (``thrust::inclusive_scan_by_key``): ``out[i] = v[s] op ... op v[i]``, ``s``
    the first index of ``i``'s run.

    Parameters
    ----------
    keys : 1-D CUDA array (any numeric dtype), or a tuple of equally long ones
        (tuple keys, equal where every field is). A run starts where
        ``keys[i] != keys[i-1]``: a key that comes back later starts a new run;
        each NaN key is a run of its own.
    values : CUDA array(s) as long as ``keys`` (a tuple for tuple values).
    op : cufold.Op or function ``(a, b) -> c``; associative.
    dtype : result dtype (default: the values' own).
    stream : the library's stream object or a raw ``CUstream`` handle.
    transform : a function of one value applied to each as it is loaded (as
        :func:`segmented_scan`'s).

    Returns an array as long as ``values`` in its library, without
    synchronising the host (one launch: keys and values read once).

    Example::

        >>> k = torch.tensor([1, 1, 2, 2, 2, 1], device="cuda")
        >>> cufold.inclusive_scan_by_key(k, torch.ones(6, device="cuda"))
        tensor([1., 2., 1., 2., 3., 1.], device='cuda:0')
    """
    return _by_key(keys, values, op, False, None, dtype, stream, "inclusive_scan_by_key", transform)


def exclusive_scan_by_key(keys, values, op=plus, init=None, *, dtype=None, stream=None, transform=None):
    """Exclusive scan of each run of equal adjacent keys
    (``thrust::exclusive_scan_by_key``): ``out[i] = init op v[s] op ... op
    v[i-1]``, ``init`` at each run's first index.

    ``init`` defaults to the operator's identity (an operator without one needs
    ``init``). Other parameters as :func:`inclusive_scan_by_key`.

    Example::

        >>> k = torch.tensor([1, 1, 2, 2, 2, 1], device="cuda")
        >>> cufold.exclusive_scan_by_key(k, torch.ones(6, device="cuda"), init=10)
        tensor([10., 11., 10., 11., 12., 10.], device='cuda:0')
    """
    return _by_key(keys, values, op, True, init, dtype, stream, "exclusive_scan_by_key", transform)


def _by_key(keys, values, op, exclusive, init, dtype, stream, name, transform=None):
    karrs = _seg._describe_values(keys, "keys")
    varrs = _seg._describe_values(values, "values")
    return _key_programs.run(
        (tuple(map(_programs.signature, karrs)), tuple(map(_programs.signature, varrs)),
         _arrays.stream_handle(karrs + varrs, stream), op, exclusive, init, dtype, stream is not None, name,
         transform), *varrs, *karrs)


def _plan_keys_key(key, *arrays):
    """The Program of a scan-by-key call signature ``key`` for ``arrays`` (the value
    fields, then the key fields: the order of the Program's inputs)."""
    _, vsig, handle, op, exclusive, init, dtype, given_stream, name, transform = key
    varrs, karrs = arrays[:len(vsig)], arrays[len(vsig):]
    _check_values(karrs + varrs, name)
    if varrs[0].size != karrs[0].size:
        raise ValueError("cufold: keys and values must be equally long; got %d and %d"
                         % (karrs[0].size, varrs[0].size))
    _arrays.same_device(tuple(a for a in arrays if a.library != "generated") or arrays, "keys and values")
    key_vt = _seg._value_type(karrs)
    return _plan(varrs, karrs, key_vt, as_op(op), exclusive, init, dtype, handle, handle if given_stream else None,
                 name, as_transform(transform))


_offset_programs = _programs.Programs(_plan_offsets_key, "cufold.segmented_scan", 4096)
_key_programs = _programs.Programs(_plan_keys_key, "cufold.scan_by_key", 4096)
