"""Device-wide scans: ``inclusive_scan``, ``exclusive_scan`` and the NumPy-style
``cumsum``, ``cumprod``, ``cummax``, ``cummin``.

A tile is ``NT`` threads x ``VT`` items, as in the device reduce. Every
algorithm scans a tile the same way (Modern GPU style, seed 002):

1. *load*: the tile is read with coalesced (striped) loads into shared
   memory, then each thread takes its ``VT`` consecutive items (blocked
   order) into registers;
2. *scan*: ``cufold.block.inclusive_scan`` / ``exclusive_scan`` with
   ``items_per_thread=VT`` (register blocking: a sequential scan per thread,
   a cooperative scan over the threads' totals) whose ``prefix`` callback
   supplies the carry-in of everything before the tile;
3. *store*: the scanned items go back through shared memory and leave with
   coalesced stores.

The algorithms differ only in where the carry-in comes from:

====================  =========================================================  ========
name                  carry-in of tile ``t``                                      launches
====================  =========================================================  ========
``single_pass``       decoupled look-back (Merrill and Garland 2016): each tile  1
                      publishes its aggregate, then its inclusive prefix; the
                      first warp of tile ``t`` reads its predecessors' states
                      32 at a time, back to the first inclusive prefix. Reads
                      and writes ``n`` items once: a scan at copy speed.
``reduce_then_scan``  seed 002's three phases: *upsweep* (every tile reduces to  3 (+2 per
                      a partial), *spine* (an inclusive scan of the partials,    extra spine
                      in place: one block, or this same algorithm again),        level)
                      *downsweep* (every tile scans its items after the spine
                      value of the tile before it). Reads the input twice.
``single_block``      one block walks the tiles in order, carrying a running     1
                      prefix in shared memory (the small-input latency path).
====================  =========================================================  ========

All three combine operands in sequence order, so an associative operator is
enough (no commutativity, no identity for inclusive scans).

Reproducibility: ``reduce_then_scan`` and ``single_block`` combine in an
order fixed by the input size alone, so floating-point results are bitwise
the same from run to run. ``single_pass`` is exact for integers, but where a
tile's look-back stops (at its predecessor's inclusive prefix, or further back
over aggregates) depends on timing, and with it the association of the
floating-point sums: its results may differ in the last bits between runs
(as CUB's DeviceScan). The algorithms' orders differ from one another.

``total=True`` also returns the reduction of all inputs (seed 002's "scan
total"), from the same pass: the last tile folds its valid items and adds
them to its carry-in.

In place (``out=x``) works for every algorithm: a tile reads all its inputs
before it writes any output, and no tile reads another tile's inputs after the
upsweep.

The single-pass scan's state lives in a workspace per (device, stream):
``flags`` (one ``uint32`` per tile: a launch *epoch* in the high 30 bits and
EMPTY / AGGREGATE / PREFIX in the low 2; a flag of an older epoch reads as
EMPTY, so no memset is needed between launches), the published values, and the
tile counter that hands out tile ids (reset to 0 by the block drawing the last
ticket). It grows with the largest input seen and is never allocated per call
after warm-up.
"""

import collections
import functools
import os

import numpy as np
from numba import config, cuda

from .. import _codegen, block, warp
from ..ops import as_op, maximum, minimum, multiplies, plus
from ..values import ValueType
from . import _arrays, _launch, _types
from .reduce import Tile, fill_kernel, tile_for as _reduce_tile_for

try:  # the one launch path (moving from reduce.py to _launch.py)
    from ._launch import launch
except ImportError:  # pragma: no cover - depends on the state of _launch
    from .reduce import launch

__all__ = ["ALGORITHMS", "inclusive_scan", "exclusive_scan", "cumsum", "cumprod", "cummax",
           "cummin", "plan", "run", "choose", "tile_for"]

ALGORITHMS = ("single_pass", "reduce_then_scan", "single_block")

#: Inputs of at most this many tiles go to ``single_block`` when no algorithm is named.
SINGLE_BLOCK_TILES = 1
#: ``reduce_then_scan`` scans its spine in one block when the spine has at most
#: this many (spine) tiles, else it recurses.
SPINE_BLOCK_TILES = 16

FULL_MASK = 0xFFFFFFFF
_U32 = ValueType.of(np.uint32)
# Tile states of the look-back (the low two bits of a flag).
EMPTY, AGGREGATE, PREFIX, OUTSIDE = 0, 1, 2, 3
_EPOCH_LIMIT = (1 << 30) - 1    # flags keep the epoch in 30 bits


def tile_for(in_vt, acc_vt):
    """Threads per block and items per thread for a scan of ``in_vt`` values
    accumulated as ``acc_vt``.

    ``CUFOLD_TILE=NTxVT`` overrides (as for the reduce; ``NT`` a multiple of
    32). The simulator uses the reduce's tiny tiles, so that small test inputs
    cross tile boundaries. On a GPU: 256 threads, and as many items per thread
    as keep the tile's shared memory at 32 KiB or less (16 for 4-byte values).
    """
    if os.environ.get("CUFOLD_TILE") or config.ENABLE_CUDASIM:
        tile = _reduce_tile_for(in_vt, acc_vt)
    else:
        size = max(in_vt.itemsize, acc_vt.itemsize, 1)
        tile = Tile(256, 16 if size <= 4 else max(1, min(8, 128 // size)))
    if tile.nt % 32 or tile.nt > 1024 or tile.vt < 1:
        raise ValueError("cufold: a scan tile needs a multiple of 32 threads (<= 1024) and at least "
                         "one item per thread; got %dx%d" % tile)
    return tile


# --- value routines the look-back needs --------------------------------------------------

@functools.lru_cache(maxsize=None)
def _storage_vt(vt):
    """``vt`` with bool fields stored as uint8 (the cache-hinted loads take numbers only)."""
    fields = tuple(np.dtype(np.uint8) if f.kind == "b" else f for f in vt.fields)
    return ValueType.of(fields if vt.is_tuple else fields[0])


@functools.lru_cache(maxsize=None)
def _publish(vt):
    """Device function ``(arrays, i, value)``: store a tile state's value to L2
    (``st.global.cg``), as ``_storage_vt(vt)``."""
    lines = []
    for i, f in enumerate(vt.fields):
        v = vt._field("v", i)
        if f.kind == "b":
            v = "np.uint8(1 if %s else 0)" % v
        lines.append("    cuda.stcg(%s, i, %s)" % (vt._field("a", i), v))
    return _codegen.build("def publish(a, i, v):\n%s\n" % "\n".join(lines), "publish")


@functools.lru_cache(maxsize=None)
def _fetch(vt):
    """Device function ``(arrays, i) -> value``: read a published value from L2
    (``ld.global.cg``: never a stale L1 line of another tile's state)."""
    parts = []
    for i, f in enumerate(vt.fields):
        load = "cuda.ldcg(%s, i)" % vt._field("a", i)
        parts.append("(%s != 0)" % load if f.kind == "b" else "T%d(%s)" % (i, load))
    return _codegen.build("def fetch(a, i):\n    return %s\n" % vt._pack(parts), "fetch", vt._env())


@functools.lru_cache(maxsize=None)
def _local_items(vt, count):
    """Device function ``() -> items``: ``count`` values of ``vt`` in registers
    (a tuple of local arrays for a tuple type; inlined, so it can return them)."""
    lines = ["    a%d = cuda.local.array(%d, T%d)" % (i, count, i) for i in range(vt.arity)]
    src = "def local_items():\n%s\n    return %s\n" % (
        "\n".join(lines), vt._pack(["a%d" % i for i in range(vt.arity)]))
    return cuda.jit(device=True, inline="always")(
        _codegen.build(src, "local_items", vt._env(), device=False))


# --- tile input and output ---------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _tile_io(op, in_vt, acc_vt, out_vt, tile):
    """``(load_tile, store_tile, fold_valid)`` device functions for one tile.

    Shared memory ``smem`` holds ``NV`` accumulator values with one padding
    slot per 32 (``i + i // 32``), so that the blocked accesses (thread ``t``,
    item ``t * VT + k``) do not conflict on banks.
    """
    nt, vt = tile
    nv = nt * vt
    load_in, store_out = in_vt.load, out_vt.store
    to_acc, to_out = acc_vt.cast, out_vt.cast
    load, store = acc_vt.load, acc_vt.store
    combine = op.combine(acc_vt)

    @cuda.jit(device=True)
    def load_tile(xs, n, base, tid, smem, items):
        """Items ``base + tid*VT .. base + tid*VT + VT - 1`` into ``items``
        (items past ``n`` repeat ``x[n-1]``: real values, never counted)."""
        if base + nv <= n:
            for k in range(vt):
                i = k * nt + tid
                store(smem, i + (i >> 5), to_acc(load_in(xs, base + i)))
        else:
            for k in range(vt):
                i = k * nt + tid
                store(smem, i + (i >> 5), to_acc(load_in(xs, min(base + i, n - 1))))
        cuda.syncthreads()
        for k in range(vt):
            i = tid * vt + k
            store(items, k, load(smem, i + (i >> 5)))

    @cuda.jit(device=True)
    def store_tile(outs, n, base, tid, smem, items):
        """The scanned ``items`` back to ``outs`` with coalesced stores."""
        cuda.syncthreads()                       # every thread is done reading smem
        for k in range(vt):
            i = tid * vt + k
            store(smem, i + (i >> 5), load(items, k))
        cuda.syncthreads()
        if base + nv <= n:
            for k in range(vt):
                i = k * nt + tid
                store_out(outs, base + i, to_out(load(smem, i + (i >> 5))))
        else:
            for k in range(vt):
                i = k * nt + tid
                if base + i < n:
                    store_out(outs, base + i, to_out(load(smem, i + (i >> 5))))

    @cuda.jit(device=True)
    def fold_valid(smem, valid, tid):
        """This thread's items among the tile's first ``valid``, folded in order
        (threads with none return a value that is not to be counted)."""
        first = tid * vt
        acc = load(smem, 0)
        if first < valid:
            acc = load(smem, first + (first >> 5))
        for k in range(1, vt):
            i = first + k
            if i < valid:
                acc = combine(acc, load(smem, i + (i >> 5)))
        return acc

    return load_tile, store_tile, fold_valid


# --- carry-in: the block scans' prefix callbacks ------------------------------------------
#
# Every lane of the block's first warp calls the callback with the tile's
# aggregate and the state tuple ``(tile, flags, tag, aggs, pres, init, has_init,
# stash)``; lane 0's result goes in front of the tile's scan. Each writes the
# tile's exclusive prefix *without init* to ``stash[0]`` (on lane 0, which is
# thread 0) for the total. Inclusive scans call it for tiles > 0 only (tile 0
# has no carry-in, and an operator may have no identity); see ``_first``.

@functools.lru_cache(maxsize=None)
def _look_back(op, acc_vt):
    """Decoupled look-back (single_pass)."""
    combine, store = op.combine(acc_vt), acc_vt.store
    publish, fetch = _publish(acc_vt), _fetch(acc_vt)
    window_reduce = warp.segmented_reduce(op, acc_vt)   # valid on the head lane
    shfl_idx = acc_vt.shuffle("idx")

    @cuda.jit(device=True)
    def status(flags, j, tag):
        """Tile ``j``'s state in this launch (OUTSIDE before tile 0).

        An atomic read: always the L2 copy, and never hoisted out of the
        polling loop."""
        if j < 0:
            return OUTSIDE
        f = cuda.atomic.or_(flags, j, np.uint32(0))
        if (f >> 2) == (tag >> 2):
            return f & 3
        return EMPTY

    @cuda.jit(device=True)
    def wait_all(flags, j, tag):
        """Spin until the 32 lanes' tiles have published something.

        Forward progress: tile ids come from an atomic counter in the order
        blocks start, so every tile waited on belongs to a block that is
        already running and that itself only waits on earlier tiles."""
        while True:
            s = status(flags, j, tag)
            if cuda.all_sync(FULL_MASK, s != EMPTY):
                return s

    @cuda.jit(device=True)
    def look_back(aggregate, state):
        tile, flags, tag, aggs, pres, init, has_init, stash = state
        lane = cuda.laneid
        if tile == 0:
            if lane == 0:                        # the first tile's prefix is its aggregate
                publish(pres, 0, aggregate)
                cuda.threadfence()
                cuda.atomic.exch(flags, 0, np.uint32(tag | PREFIX))
            return init
        if lane == 0:                            # publish the aggregate at once
            publish(aggs, tile, aggregate)
            cuda.threadfence()
            cuda.atomic.exch(flags, tile, np.uint32(tag | AGGREGATE))
        exclusive = aggregate
        top = tile - 1                           # the predecessor lane 31 looks at
        while True:
            j = top - 31 + lane                  # lanes take tiles in order
            s = wait_all(flags, j, tag)
            cuda.threadfence()                   # the values were written before the flags
            value = aggregate                    # OUTSIDE lanes: never counted
            if s == PREFIX:
                value = fetch(pres, j)
            elif s == AGGREGATE:
                value = fetch(aggs, j)
            prefixes = cuda.ballot_sync(FULL_MASK, s == PREFIX)
            start = 31 - cuda.clz(prefixes) if prefixes != 0 else 0
            # The window's part: from the last inclusive prefix on, in tile order.
            window = shfl_idx(FULL_MASK, window_reduce(value, lane == start), start)
            exclusive = window if top == tile - 1 else combine(window, exclusive)
            if prefixes != 0:
                break
            top -= 32
        if lane == 0:
            store(stash, 0, exclusive)
            publish(pres, tile, combine(exclusive, aggregate))
            cuda.threadfence()
            cuda.atomic.exch(flags, tile, np.uint32(tag | PREFIX))
        return combine(init, exclusive) if has_init else exclusive

    return look_back


@functools.lru_cache(maxsize=None)
def _spine_carry(op, acc_vt):
    """Downsweep (reduce_then_scan): ``pres`` is the spine, the inclusive scan of
    the tiles' partials, so tile ``t``'s carry-in is ``pres[t - 1]``."""
    combine, load, store = op.combine(acc_vt), acc_vt.load, acc_vt.store

    @cuda.jit(device=True)
    def spine_carry(aggregate, state):
        tile, flags, tag, aggs, pres, init, has_init, stash = state
        if tile == 0:
            return init
        exclusive = load(pres, tile - 1)
        if cuda.laneid == 0:
            store(stash, 0, exclusive)
        return combine(init, exclusive) if has_init else exclusive

    return spine_carry


@functools.lru_cache(maxsize=None)
def _running_carry(op, acc_vt):
    """One block over every tile (single_block): ``stash[1]`` is the running
    total of the tiles before this one."""
    combine, load, store = op.combine(acc_vt), acc_vt.load, acc_vt.store

    @cuda.jit(device=True)
    def running_carry(aggregate, state):
        tile, flags, tag, aggs, pres, init, has_init, stash = state
        exclusive = aggregate
        running = aggregate
        result = init
        if tile > 0:
            exclusive = load(stash, 1)
            running = combine(exclusive, aggregate)
            result = combine(init, exclusive) if has_init else exclusive
        cuda.syncwarp(FULL_MASK)                 # every lane has read stash[1]
        if cuda.laneid == 0:
            store(stash, 0, exclusive)
            store(stash, 1, running)
        return result

    return running_carry


@functools.lru_cache(maxsize=None)
def _first(carry, op, acc_vt):
    """``first(aggregate, state)``, thread 0 after an inclusive scan's tile 0
    (scanned without a carry-in): what the carry callback would have recorded."""
    publish, store = _publish(acc_vt), acc_vt.store

    if carry == "single_pass":
        @cuda.jit(device=True)
        def first(aggregate, state):
            tile, flags, tag, aggs, pres, init, has_init, stash = state
            publish(pres, 0, aggregate)
            cuda.threadfence()
            cuda.atomic.exch(flags, 0, np.uint32(tag | PREFIX))
    elif carry == "single_block":
        @cuda.jit(device=True)
        def first(aggregate, state):
            store(state[7], 1, aggregate)
    else:
        @cuda.jit(device=True)
        def first(aggregate, state):
            pass
    return first


# --- the kernel factory --------------------------------------------------------------------

Spec = collections.namedtuple("Spec", "op in_vt acc_vt out_vt tile kind carry")
Spec.__doc__ = """What a scan kernel is compiled for. ``kind``: 'inclusive' or
'exclusive'; ``carry``: 'single_pass' (look-back), 'downsweep' (spine of
reduce_then_scan) or 'single_block' (running prefix)."""

_CARRIES = {"single_pass": _look_back, "downsweep": _spine_carry, "single_block": _running_carry}


@functools.lru_cache(maxsize=None)
def _block_scans(kind, op, acc_vt, nt, vt, carry):
    """``scan(items, out, state)`` (the block scan after the ``carry`` callback's
    prefix) and, for inclusive scans, ``scan_first(items, out) -> aggregate``
    (tile 0, no carry-in); one signature whatever ``vt``."""
    make = block.inclusive_scan if kind == "inclusive" else block.exclusive_scan
    scan = make(op, acc_vt, nt, items_per_thread=vt, prefix=carry)
    scan_first = block.inclusive_scan(op, acc_vt, nt, items_per_thread=vt, aggregate=True) \
        if kind == "inclusive" else None
    if vt > 1:
        return scan, scan_first
    # One item per thread: the block primitives take and return the value itself.
    load, store = acc_vt.load, acc_vt.store
    scan_one, first_one = scan, scan_first

    @cuda.jit(device=True)
    def scan_item(items, out, state):
        store(out, 0, scan_one(load(items, 0), state))

    if first_one is None:
        return scan_item, None

    @cuda.jit(device=True)
    def scan_first_item(items, out):
        value, aggregate = first_one(load(items, 0))
        store(out, 0, value)
        return aggregate

    return scan_item, scan_first_item


@functools.lru_cache(maxsize=None)
def _tile_scan(spec):
    """Device function scanning one tile:
    ``(xs, outs, n, tile, tiles, state, smem, totals, want_total)``."""
    op, acc_vt, out_vt = spec.op, spec.acc_vt, spec.out_vt
    nt, vt = spec.tile
    nv = nt * vt
    load_tile, store_tile, fold_valid = _tile_io(op, spec.in_vt, acc_vt, out_vt, spec.tile)
    carry = _CARRIES[spec.carry](op, acc_vt)
    scan, scan_first = _block_scans(spec.kind, op, acc_vt, nt, vt, carry)
    block_reduce = block.reduce(op, acc_vt, nt, partial=True)
    local_items = _local_items(acc_vt, vt)
    combine, load = op.combine(acc_vt), acc_vt.load
    store_out, to_out = out_vt.store, out_vt.cast

    @cuda.jit(device=True)
    def finish(xs, outs, n, tile, tiles, stash, smem, items, totals, want_total):
        """The total (last tile only: its carry-in, then its valid items), then the store."""
        tid = cuda.threadIdx.x
        base = tile * nv
        if want_total and tile == tiles - 1:
            valid = n - base
            mine = fold_valid(smem, valid, tid)
            tile_total = block_reduce(mine, (valid + vt - 1) // vt)
            if tid == 0:
                total = tile_total if tile == 0 else combine(load(stash, 0), tile_total)
                store_out(totals, 0, to_out(total))
        store_tile(outs, n, base, tid, smem, items)

    if spec.kind == "exclusive":
        @cuda.jit(device=True)
        def tile_scan(xs, outs, n, tile, tiles, state, smem, totals, want_total):
            items = local_items()
            load_tile(xs, n, tile * nv, cuda.threadIdx.x, smem, items)
            scan(items, items, state)
            finish(xs, outs, n, tile, tiles, state[7], smem, items, totals, want_total)

        return tile_scan

    first = _first(spec.carry, op, acc_vt)

    @cuda.jit(device=True)
    def tile_scan(xs, outs, n, tile, tiles, state, smem, totals, want_total):
        items = local_items()
        load_tile(xs, n, tile * nv, cuda.threadIdx.x, smem, items)
        if tile == 0:
            aggregate = scan_first(items, items)
            if cuda.threadIdx.x == 0:
                first(aggregate, state)
        else:
            scan(items, items, state)
        finish(xs, outs, n, tile, tiles, state[7], smem, items, totals, want_total)

    return tile_scan


@functools.lru_cache(maxsize=None)
def scan_kernel(spec):
    """The Python kernel function for ``spec`` (compiled by the launch path).

    Arguments: ``(xs, outs, n, tiles, counter, flags, tag, aggs, pres, init,
    has_init, totals, want_total)``; ``counter``, ``flags``, ``tag`` and
    ``aggs`` matter to single_pass only, ``pres`` to single_pass (published
    inclusive prefixes) and downsweep (the spine).
    """
    nt, vt = spec.tile
    tile_scan = _tile_scan(spec)
    tile_storage = block.temp_storage(spec.acc_vt, (nt * vt - 1) + ((nt * vt - 1) >> 5) + 1)
    stash_storage = block.temp_storage(spec.acc_vt, 2)

    if spec.carry == "single_pass":
        def scan_single_pass(xs, outs, n, tiles, counter, flags, tag, aggs, pres, init, has_init,
                             totals, want_total):
            smem = tile_storage()
            stash = stash_storage()
            ticket = cuda.shared.array(1, np.int64)
            if cuda.threadIdx.x == 0:
                # Dynamic tile ids: tiles start in id order (see wait_all).
                t = cuda.atomic.add(counter, 0, np.uint32(1))
                if t == tiles - 1:               # the last ticket: reset for the next launch
                    cuda.atomic.exch(counter, 0, np.uint32(0))
                ticket[0] = t
            cuda.syncthreads()
            tile = ticket[0]
            state = (tile, flags, tag, aggs, pres, init, has_init, stash)
            tile_scan(xs, outs, n, tile, tiles, state, smem, totals, want_total)

        return scan_single_pass

    if spec.carry == "downsweep":
        def scan_downsweep(xs, outs, n, tiles, counter, flags, tag, aggs, pres, init, has_init,
                           totals, want_total):
            smem = tile_storage()
            stash = stash_storage()
            tile = cuda.blockIdx.x
            state = (tile, flags, tag, aggs, pres, init, has_init, stash)
            tile_scan(xs, outs, n, tile, tiles, state, smem, totals, want_total)

        return scan_downsweep

    def scan_single_block(xs, outs, n, tiles, counter, flags, tag, aggs, pres, init, has_init,
                          totals, want_total):
        smem = tile_storage()
        stash = stash_storage()
        for tile in range(tiles):
            cuda.syncthreads()                   # the previous tile is out of smem and stash
            state = (tile, flags, tag, aggs, pres, init, has_init, stash)
            tile_scan(xs, outs, n, tile, tiles, state, smem, totals, want_total)

    return scan_single_block


@functools.lru_cache(maxsize=None)
def upsweep_kernel(op, in_vt, acc_vt, tile):
    """Kernel ``(xs, n, partials)``: ``partials[t]`` = the reduction of tile ``t``.

    A commutative operator folds the striped (coalesced) items straight from
    memory; any other goes through shared memory in blocked order.
    """
    nt, vt = tile
    nv = nt * vt
    block_reduce = block.reduce(op, acc_vt, nt, partial=True)
    combine, store = op.combine(acc_vt), acc_vt.store
    load_in, to_acc = in_vt.load, acc_vt.cast

    if op.commutative:
        def upsweep_striped(xs, n, partials):
            tid = cuda.threadIdx.x
            base = cuda.blockIdx.x * nv
            acc = to_acc(load_in(xs, min(base + tid, n - 1)))
            if base + nv <= n:
                for k in range(1, vt):
                    acc = combine(acc, to_acc(load_in(xs, base + k * nt + tid)))
            else:
                for k in range(1, vt):
                    i = base + k * nt + tid
                    if i < n:
                        acc = combine(acc, to_acc(load_in(xs, i)))
            total = block_reduce(acc, min(nt, n - base))
            if tid == 0:
                store(partials, cuda.blockIdx.x, total)

        return upsweep_striped

    load_tile, _, fold_valid = _tile_io(op, in_vt, acc_vt, acc_vt, tile)
    tile_storage = block.temp_storage(acc_vt, (nv - 1) + ((nv - 1) >> 5) + 1)
    local_items = _local_items(acc_vt, vt)

    def upsweep_blocked(xs, n, partials):
        tid = cuda.threadIdx.x
        base = cuda.blockIdx.x * nv
        smem = tile_storage()
        items = local_items()
        load_tile(xs, n, base, tid, smem, items)
        valid = min(nv, n - base)
        total = block_reduce(fold_valid(smem, valid, tid), (valid + vt - 1) // vt)
        if tid == 0:
            store(partials, cuda.blockIdx.x, total)

    return upsweep_blocked


# --- host side: plans ------------------------------------------------------------------

class Plan(collections.namedtuple("Plan", "spec tiles algorithm spine scratch")):
    """What one scan launches: ``spec`` of the main kernel, ``tiles`` its tile
    count, for reduce_then_scan the ``spine`` plan (an inclusive scan of the
    partials, in place), and ``scratch``, the bytes of workspace it carves."""


def choose(op, in_vt, acc_vt, n):
    """The default algorithm (the dispatcher's choice, see ``_dispatch.choose_scan``)."""
    from . import _dispatch
    return _dispatch.choose_scan(op, in_vt, acc_vt, n)


def _check_algorithm(algorithm):
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError("cufold: unknown scan algorithm %r; choose from %s"
                         % (algorithm, ", ".join(ALGORITHMS)))


def plan(op, in_vt, acc_vt, out_vt, n, kind, algorithm=None):
    """Choose and validate the algorithm and size the launches (``n >= 1``)."""
    _check_algorithm(algorithm)
    if algorithm is None:
        algorithm = choose(op, in_vt, acc_vt, n)
    tile = tile_for(in_vt, acc_vt)
    nv = tile.nt * tile.vt
    tiles = -(-n // nv)
    spine = None
    if algorithm == "single_pass":
        carry = "single_pass"
    elif algorithm == "single_block" or tiles == 1:
        carry = "single_block"
    else:
        carry = "downsweep"
        spine_tile = tile_for(acc_vt, acc_vt)
        spine_alg = ("single_block" if tiles <= SPINE_BLOCK_TILES * spine_tile.nt * spine_tile.vt
                     else "reduce_then_scan")
        spine = plan(op, acc_vt, acc_vt, acc_vt, tiles, "inclusive", spine_alg)
    spec = Spec(op, in_vt, acc_vt, out_vt, tile, kind, carry)
    return Plan(spec, tiles, algorithm, spine, _scratch_bytes(spec, tiles, algorithm, spine))


@functools.lru_cache(maxsize=1024)
def _cached_plan(op, in_vt, acc_vt, out_vt, n, kind, algorithm, forced_tile, thresholds):
    return plan(op, in_vt, acc_vt, out_vt, n, kind, algorithm)


def _plan_for(op, in_vt, acc_vt, out_vt, n, kind, algorithm):
    """``plan()``, cached per call shape (and per tile override and thresholds,
    which tests change)."""
    return _cached_plan(op, in_vt, acc_vt, out_vt, n, kind, algorithm,
                        os.environ.get("CUFOLD_TILE"), (SINGLE_BLOCK_TILES, SPINE_BLOCK_TILES))


def _align(nbytes):
    return -(-nbytes // 256) * 256


def _bytes(vt, count):
    return sum(_align(max(count, 1) * f.itemsize) for f in vt.fields)


def _scratch_bytes(spec, tiles, algorithm, spine):
    """Bytes of per-stream workspace ``_run`` carves for a plan (mirrors it)."""
    dummy_total = _bytes(spec.out_vt, 1)
    if algorithm == "single_pass":               # published aggregates and prefixes
        return 2 * _bytes(_storage_vt(spec.acc_vt), tiles) + dummy_total
    if spine is None:                            # single block: placeholders only
        return 256 + _bytes(spec.acc_vt, 1) + dummy_total
    return 256 + _bytes(spec.acc_vt, tiles) + dummy_total + spine.scratch


_carved = {}


def _carve(ws, offset, vt, count):
    """``count`` values of ``vt`` (an array per field) from workspace ``ws`` at
    ``offset``; returns (views, next offset). Cached: the same workspace is
    carved the same way call after call (the cache keeps ``ws`` alive, so the
    views stay valid)."""
    key = (ws, offset, vt, count)
    got = _carved.get(key)
    if got is None:
        views = []
        end = offset
        for f in vt.fields:
            views.append(ws.view(f, (max(count, 1),), end))
            end += _align(max(count, 1) * f.itemsize)
        if len(_carved) > 4096:
            _carved.clear()
        got = _carved[key] = ((tuple(views) if vt.is_tuple else views[0]), end)
    return got


def _placeholder(ws, offset):
    """A uint32 view for the kernel arguments an algorithm does not use."""
    return _carve(ws, offset, _U32, 64)


class _LookBackState:
    """Per (device, stream): the tile counter and the flags of the look-back."""

    __slots__ = ("buffer", "capacity", "epoch", "counter", "flags")

    def __init__(self, device_id, capacity):
        self.capacity = capacity
        self.epoch = 0                           # fresh zeros: every flag is of epoch 0
        self.buffer = _zeroed(device_id, 256 + 4 * capacity)
        self.counter = self.buffer.view(np.uint32, (1,), 0)
        self.flags = self.buffer.view(np.uint32, (capacity,), 256)


_look_back_states = {}
# Superseded states stay alive: kernels still queued on the stream may use them.
# Capacities grow geometrically, so they hold at most as much memory again.
_retired = []


def _zeroed(device_id, nbytes):
    """A zeroed uint8 device buffer of ``nbytes`` on ``device_id`` (as an Arr).
    ``to_device`` returns once the copy is done, so any stream sees the zeros."""
    zeros = np.zeros(nbytes, np.uint8)
    if config.ENABLE_CUDASIM:
        return _arrays.describe(cuda.to_device(zeros), "workspace")
    with cuda.gpus[device_id]:
        return _arrays.describe(cuda.to_device(zeros), "workspace")


def _look_back_state(device_id, stream, tiles):
    """(counter, flags, tag) for a single-pass launch of ``tiles`` tiles; a new
    epoch per launch, so flags never need clearing (a fresh zeroed buffer when
    the epochs run out or more tiles are needed)."""
    key = (device_id, stream)
    st = _look_back_states.get(key)
    if st is None or st.capacity < tiles or st.epoch >= _EPOCH_LIMIT:
        cap = max(tiles, 1024)
        if st is not None:
            _retired.append(st)
            if st.capacity < tiles:
                cap = max(cap, 2 * st.capacity)
        st = _look_back_states[key] = _LookBackState(device_id, cap)
    st.epoch += 1
    return st.counter, st.flags, np.uint32(st.epoch << 2)


def run(p, xs, outs, n, stream, device_id, init, has_init, totals=None):
    """Launch a plan. ``xs``/``outs``: the input and output Arr(s) (``outs``
    may be ``xs``); ``init``: a host value of the accumulator type (an
    exclusive scan's first value; ignored by inclusive scans); ``totals``:
    1-element Arr(s) of the result type to receive the total, or None."""
    _, ws = _launch.workspace(device_id, stream, p.scratch)
    _run(p, xs, outs, n, stream, device_id, p.spec.acc_vt.make(init), bool(has_init), totals,
         ws, 0)


def _run(p, xs, outs, n, stream, device_id, init, has_init, totals, ws, offset):
    spec = p.spec
    nt = spec.tile.nt
    acc_vt, out_vt = spec.acc_vt, spec.out_vt
    key = ("scan", spec)
    want_total = totals is not None
    if totals is None:                           # never written (want_total is False)
        totals, offset = _carve(ws, offset, out_vt, 1)
    else:
        offset += _bytes(out_vt, 1)
    if p.algorithm == "single_pass":
        counter, flags, tag = _look_back_state(device_id, stream, p.tiles)
        sv = _storage_vt(acc_vt)
        aggs, offset = _carve(ws, offset, sv, p.tiles)
        pres, offset = _carve(ws, offset, sv, p.tiles)
        launch(scan_kernel(spec), key, p.tiles, nt, stream,
               (xs, outs, n, p.tiles, counter, flags, tag, aggs, pres, init, has_init, totals,
                want_total))
        return
    counter, offset = _placeholder(ws, offset)           # unused by these kernels
    flags = counter
    if p.spine is None:                                  # one block walks every tile
        values, offset = _carve(ws, offset, acc_vt, 1)
        launch(scan_kernel(spec), key, 1, nt, stream,
               (xs, outs, n, p.tiles, counter, flags, np.uint32(0), values, values, init,
                has_init, totals, want_total))
        return
    # reduce_then_scan: upsweep, spine (inclusive, in place), downsweep.
    spine, offset = _carve(ws, offset, acc_vt, p.tiles)
    launch(upsweep_kernel(spec.op, spec.in_vt, acc_vt, spec.tile),
           ("scan_upsweep", spec.op, spec.in_vt, acc_vt, spec.tile), p.tiles, nt, stream,
           (xs, n, spine))
    _run(p.spine, spine, spine, p.tiles, stream, device_id, init, False, None, ws, offset)
    launch(scan_kernel(spec), key, p.tiles, nt, stream,
           (xs, outs, n, p.tiles, counter, flags, np.uint32(0), spine, spine, init, has_init,
            totals, want_total))


# --- the public calls -----------------------------------------------------------------------

_vt_of = {}


def _inputs(x):
    if isinstance(x, tuple):
        arrs = _arrays.describe_many(x)
        in_vt = ValueType.of(tuple(a.dtype for a in arrs))
    else:
        a = _arrays.describe(x)
        arrs = (a,)
        in_vt = _vt_of.get(a.dtype)
        if in_vt is None:
            in_vt = _vt_of[a.dtype] = ValueType.of(a.dtype)
    for a in arrs:
        if a.ndim != 1:
            raise ValueError("cufold: scans take 1-D arrays; got shape %s" % (a.shape,))
    return arrs, in_vt


def _result_fields(in_vt, dtype, numpy_sum):
    if dtype is not None:
        if isinstance(dtype, (tuple, list)):
            if len(dtype) != in_vt.arity:
                raise ValueError("cufold: dtype= gives %d dtypes for values of %d fields"
                                 % (len(dtype), in_vt.arity))
            fields = tuple(np.dtype(d) for d in dtype)
        else:
            fields = tuple(np.dtype(dtype) for _ in in_vt.fields)
    elif numpy_sum:
        fields = tuple(_types.sum_dtype(f) for f in in_vt.fields)
    else:
        fields = in_vt.fields
    return fields if in_vt.is_tuple else fields[0]


def _scan_outputs(like, out_vt, out, n, alloc_stream):
    """(Arr(s) to write, object(s) to return): new arrays of ``x``'s library, or ``out``."""
    if out is None:
        made = [_arrays.empty(like, (n,), f, alloc_stream) for f in out_vt.fields]
        arrs = [m[1] for m in made]
        objs = [_arrays.to_library(m[0], like) for m in made]
    else:
        objs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(objs) != out_vt.arity or (isinstance(out, (tuple, list)) != out_vt.is_tuple):
            raise ValueError("cufold: out= needs %s for a result of type %s"
                             % ("a tuple of %d arrays" % out_vt.arity if out_vt.is_tuple
                                else "one array", out_vt))
        arrs = [_arrays.describe(o, "out") for o in objs]
        for a, f in zip(arrs, out_vt.fields):
            if a.ndim != 1 or a.size != n:
                raise ValueError("cufold: out= must be a 1-D array of %d elements (as x); it has "
                                 "shape %s" % (n, a.shape))
            if a.dtype != f:
                raise TypeError("cufold: out= has dtype %s, the scan's result is %s" % (a.dtype, f))
            if a.device_id != like.device_id:
                raise ValueError("cufold: out= is on device %d, x on device %d"
                                 % (a.device_id, like.device_id))
    pack = (lambda v: tuple(v)) if out_vt.is_tuple else (lambda v: v[0])
    return pack(arrs), pack(objs)


def _total_outputs(like, out_vt, alloc_stream):
    made = [_arrays.empty(like, (), f, alloc_stream) for f in out_vt.fields]
    vec = [m[1].view(f, (1,), 0) for m, f in zip(made, out_vt.fields)]
    objs = [_arrays.to_library(m[0], like) for m in made]
    if out_vt.is_tuple:
        return tuple(vec), tuple(objs)
    return vec[0], objs[0]


_typed = {}


def _types_for(op, in_vt, dtype, numpy_sum):
    """(accumulator, result value types, identity), checked once per call shape."""
    try:
        key = (op, in_vt, dtype, numpy_sum)
        got = _typed.get(key)
    except TypeError:                            # an unhashable dtype= spelling
        key, got = None, None
    if got is None:
        acc_vt, out_vt = _types.value_types(_result_fields(in_vt, dtype, numpy_sum))
        op.check(acc_vt)
        got = (acc_vt, out_vt, op.identity_for(acc_vt))
        if key is not None:
            _typed[key] = got
    return got


def _scan(x, op, init, dtype, out, stream, algorithm, total, kind, name, numpy_sum=False):
    op = as_op(op)
    if algorithm is not None and algorithm not in ALGORITHMS:
        _check_algorithm(algorithm)
    with _launch.nvtx_range("cufold." + name):
        arrs, in_vt = _inputs(x)
        like = arrs[0]
        n = like.size
        acc_vt, out_vt, identity = _types_for(op, in_vt, dtype, numpy_sum)
        has_init = False
        if kind == "exclusive":
            if init is None:
                if identity is None:
                    raise ValueError("cufold: operator %s has no identity; pass init= to "
                                     "exclusive_scan" % op.name)
                init_value = identity
            else:
                init_value, has_init = acc_vt.make(init), True
        elif init is not None:
            raise TypeError("cufold: an inclusive scan takes no init")
        else:
            init_value = identity if identity is not None else acc_vt.sample()
        handle = _arrays.stream_handle(tuple(arrs) if in_vt.is_tuple else like, stream)
        alloc_stream = handle if stream is not None else None
        if total and n == 0 and identity is None:
            raise ValueError("cufold: the total of an empty input needs an operator with an "
                             "identity; %s has none" % op.name)
        outs, result = _scan_outputs(like, out_vt, out, n, alloc_stream)
        totals, total_obj = _total_outputs(like, out_vt, alloc_stream) if total else (None, None)
        if n == 0:
            if total:
                launch(fill_kernel(out_vt), ("fill", out_vt), 1, 1, handle,
                       (totals, out_vt.make(identity)))
        else:
            xs = tuple(arrs) if in_vt.is_tuple else like
            p = _plan_for(op, in_vt, acc_vt, out_vt, n, kind, algorithm)
            run(p, xs, outs, n, handle, like.device_id, init_value, has_init, totals)
        return (result, total_obj) if total else result


def inclusive_scan(x, op=plus, *, dtype=None, out=None, stream=None, algorithm=None, total=False):
    """Inclusive scan: ``out[i] = x[0] op x[1] op ... op x[i]``.

    Parameters
    ----------
    x : CUDA array (any library), or a tuple of equally long ones (tuple values).
    op : cufold.Op or function ``(a, b) -> c``; associative (commutativity and
        an identity are not needed).
    dtype : result dtype (a tuple for tuple values); default: ``x``'s own.
        float16 results accumulate in float32.
    out : device array(s) of ``len(x)`` and the result dtype to write into;
        may be ``x`` itself (in place).
    stream : the library's stream object or a raw ``CUstream`` handle.
    algorithm : one of ``cufold.algorithms("scan")``; None chooses (one block
        for small inputs, else ``single_pass``). For floating-point results
        that are bitwise reproducible from run to run, ask for
        ``"reduce_then_scan"`` (see the module doc).
    total : also return the reduction of all of ``x`` (0-d device array(s)),
        from the same pass.

    Returns the scanned array(s) in ``x``'s library, or ``(scanned, total)``;
    the host is not synchronised.

    Example::

        >>> x = cupy.asarray([1, 7, 4, 0, 9], dtype=cupy.int32)
        >>> cufold.inclusive_scan(x)
        array([ 1,  8, 12, 12, 21], dtype=int32)
        >>> cufold.inclusive_scan(x, cufold.maximum, total=True)
        (array([1, 7, 7, 7, 9], dtype=int32), array(9, dtype=int32))
    """
    return _scan(x, op, None, dtype, out, stream, algorithm, total, "inclusive", "inclusive_scan")


def exclusive_scan(x, op=plus, init=None, *, dtype=None, out=None, stream=None, algorithm=None,
                   total=False):
    """Exclusive scan: ``out[0] = init``, ``out[i] = init op x[0] op ... op x[i-1]``.

    ``init`` defaults to the operator's identity (an operator without one needs
    ``init``). ``total=True`` also returns the reduction of all of ``x``
    *without* ``init`` (seed 002's scan total; for an empty ``x``, the
    identity). Other parameters as :func:`inclusive_scan`.

    Example::

        >>> x = torch.tensor([1, 7, 4, 0, 9], device="cuda")
        >>> offsets, count = cufold.exclusive_scan(x, total=True)
        >>> offsets, count
        (tensor([ 0,  1,  8, 12, 12], device='cuda:0'), tensor(21, device='cuda:0'))
        >>> cufold.exclusive_scan(x, init=100)
        tensor([100, 101, 108, 112, 112], device='cuda:0')
    """
    return _scan(x, op, init, dtype, out, stream, algorithm, total, "exclusive", "exclusive_scan")


def cumsum(x, dtype=None, out=None, stream=None, *, algorithm=None):
    """``numpy.cumsum`` of a 1-D device array: small integers and bool sum as
    int64 (unsigned: uint64), float16 accumulates in float32 and stores float16.

    Example: ``cufold.cumsum(cupy.arange(5, dtype=cupy.int32))  # int64 [0 1 3 6 10]``
    """
    return _scan(x, plus, None, dtype, out, stream, algorithm, False, "inclusive", "cumsum",
                 numpy_sum=True)


def cumprod(x, dtype=None, out=None, stream=None, *, algorithm=None):
    """``numpy.cumprod`` (the dtypes of :func:`cumsum`).

    Example: ``cufold.cumprod(torch.tensor([1., 2., 3.], device='cuda'))  # [1, 2, 6]``
    """
    return _scan(x, multiplies, None, dtype, out, stream, algorithm, False, "inclusive", "cumprod",
                 numpy_sum=True)


def cummax(x, out=None, stream=None, *, algorithm=None):
    """``numpy.maximum.accumulate``: the running maximum, same dtype, NaN propagates.

    Example: ``cufold.cummax(cupy.asarray([3, 1, 4, 1, 5]))  # [3 3 4 4 5]``
    """
    return _scan(x, maximum, None, None, out, stream, algorithm, False, "inclusive", "cummax")


def cummin(x, out=None, stream=None, *, algorithm=None):
    """``numpy.minimum.accumulate``: the running minimum, same dtype, NaN propagates.

    Example: ``cufold.cummin(cupy.asarray([3, 1, 4, 1, 5]))  # [3 1 1 1 1]``
    """
    return _scan(x, minimum, None, None, out, stream, algorithm, False, "inclusive", "cummin")
