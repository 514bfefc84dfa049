"""Scans along one axis of an N-D array, forwards or in reverse: the planner and
its kernels (the public calls are :mod:`.scan`'s, with ``axis=`` and ``reverse=``).

The scanned axis keeps its order; every other axis is a *batch*. The planner
(:func:`plan_layout`, at plan time on the Program's placeholders) drops size-1
batch dimensions, orders the others by input stride and merges those that chain
in both the input and the output (C-order or ``out=``'s strides), as
:func:`.axis.plan_layout` does for reductions. What is left must be at most two
batch groups, ``A`` (outer) and ``C`` (inner, the smaller input stride): every
scan then runs on a 3-D view ``(A, L, C)`` of the input and of the output, with
the scanned axis of length ``L`` in the middle. ``reverse=True`` is the same view
walked from its last item (a negative stride along the scan: the kernels read
backwards, nothing is copied), so the result is ``flip(scan(flip(x)))`` with the
operator applied in its own order, as ``jax.lax.associative_scan(reverse=True)``.

Which kernel runs (``R = A*C`` rows of ``L`` items):

===========  ==========================================  ==================================
layout       when                                        kernel
===========  ==========================================  ==================================
flat         ``R == 1`` (1-D input, ``axis=None`` of a   the device-wide scan of
             contiguous array, or every batch dim 1)     :mod:`.scan` (single pass look-back;
                                                         ``algorithm=`` applies)
segments     ``L <= LANE_ROW`` (256), the rows back to   ``segments``: the rows as one run
             back in one run (``C == 1``, row stride =   of ``R*L`` items (backwards for
             ``L`` x item stride: a C-order batch)       ``reverse``); a warp takes whole
                                                         rows, 32 items a step, SEGMENT_STEPS
                                                         steps' loads issued together
                                                         (coalesced); a segmented shuffle
                                                         scan whose heads come from each
                                                         item's position in its row (kept
                                                         by additions, no division), and a
                                                         carry from step to step (rows of
                                                         2..32 items dividing 32: within a
                                                         step, log2(L) shuffles, no carry)
lanes        ``L <= LANE_ROW``, the scanned axis has     ``lanes``: a group of G = 1..32
             the smaller stride, rows not in one run     lanes per row (G the power of two
             (strided or permuted batches)               >= L, up to a warp: several short
                                                         rows a warp), G items a step, a
                                                         shuffle scan and a carry down the
                                                         row; each lane keeps ROWS_PER_LANE
                                                         rows' loads in flight
tiles        the scanned axis has the smaller stride,    ``tiles``: the single-pass tile
             ``L > LANE_ROW``                            scan of :mod:`.scan` on every row:
                                                         a tile (up to 256 threads x VT
                                                         items; 128 x 2VT for rows of
                                                         several tiles) per block, one
                                                         block a row up to one tile,
                                                         longer rows a batch
                                                         of decoupled look-backs (each row
                                                         its own range of tile states; the
                                                         ticket order is row-major)
columns      a batch dimension has the smaller stride    columns enough to fill the GPU:
             (``axis=0`` of a C-order matrix)            ``columns``, a thread per column,
                                                         threads along the contiguous batch
                                                         dimension (coalesced), a running
                                                         carry, COLUMN_UNROLL loads in
                                                         flight. Fewer, long columns whose
                                                         strips of 32, 16 or 8 fill the GPU
                                                         (4096+ columns): ``column_strips``,
                                                         a block down each strip, its carry
                                                         kept in the block, no look-back.
                                                         Fewer still: ``column_tiles``, one
                                                         pass: tiles of
                                                         8 columns x 512 rows (4-byte items;
                                                         256 rows for 8-byte ones), a look-
                                                         back down each column (a warp a
                                                         column).
                                                         ``algorithm="reduce_then_scan"``:
                                                         chunks of ``columns`` instead,
                                                         *upsweep* (each chunk's fold), a
                                                         row scan of the folds (lanes or
                                                         tiles, in place), *downsweep*: 3
                                                         launches, the input read twice, a
                                                         fixed order of operations
===========  ==========================================  ==================================

Views whose batch dimensions do not merge into two groups (permutations of 4 or
more dimensions), and ``axis=None`` of a non-contiguous N-D view, are first
gathered in C order into the output (cast to the result dtype), which is then
scanned in place. Everything is decided when the Program is planned; a call is
its launches, with no host synchronisation.

All kernels combine operands in sequence order (an associative operator is
enough); exclusive scans start every row at ``init`` (or the identity).

``out=(None, h)`` (fields of a tuple result not wanted): every kernel's output
type is then a ``values.OutputType`` (``out_vt``), whose stores (``_access3``,
``_row_view``, :func:`.scan._lane_io`) reach the stored fields' arrays only, so a
field not wanted costs no argument, address or store in any layout; a gathered
view goes to new arrays of every field first (:func:`.scan._gather_target`).

``transform=`` (a function of an item, or of a tuple input's tuple of items) is
fused into every kernel's loads of the input (``scan._to_acc``): segments, lanes,
tiles (the tile loads of :mod:`.scan`), both phases of columns (the spine scans
folds, untransformed); the gather applies it on its way, so the scan in place after
it has none. Each kernel factory takes it as its last parameter (None: the kernel
of before, under the launch key of before).
"""

import collections
import functools
import math
import os

import numpy as np
from numba import config, cuda

from .. import _codegen, block, warp
from ..host import arrays as _arrays
from ..host import launch as _launch
from ..host.launch import Tile
from ..values import OutputType

__all__ = ["LANE_ROW", "Layout", "add_launches", "gather", "plan_layout"]

#: Rows of at most this many items run on groups of lanes; longer ones on tiles.
LANE_ROW = 256
#: Steps of 32 items whose loads a warp of the segments kernel issues together.
SEGMENT_STEPS = 8
#: Rows of 2, 4, .. 32 items (a divisor of 32) run the segments kernel's aligned form: each
#: row within one step's lanes, log2(length) shuffles an item, no carry
#: (``CUFOLD_ALIGNED_SEGMENTS=0``: the general form).
ALIGNED_SEGMENTS = os.environ.get("CUFOLD_ALIGNED_SEGMENTS", "1") != "0"
#: Rows of several tiles scan in tiles of half the threads, twice the items a thread
#: (:func:`row_tile`; ``CUFOLD_LONG_ROW_TILE=0``: the scan's own tile).
LONG_ROW_TILE = not config.ENABLE_CUDASIM and os.environ.get("CUFOLD_LONG_ROW_TILE", "1") != "0"
#: Threads per SM the narrow columns under the ``overlap`` ids (named only) are bounded to
#: (``launch_bounds``; 0, the default: unbounded). ``CUFOLD_NARROW_OVERLAP_THREADS``, for study.
NARROW_OVERLAP_THREADS = int(os.environ.get("CUFOLD_NARROW_OVERLAP_THREADS", "0"))
#: Rows a lane of the lanes kernel works on at once (their loads in flight together;
#: each costs ~9 registers: 4 rows take 60, 8 take 95).
ROWS_PER_LANE = 4
#: Loads a thread of the columns kernel issues before combining them (``CUFOLD_COLUMN_UNROLL``).
COLUMN_UNROLL = int(os.environ.get("CUFOLD_COLUMN_UNROLL", "8"))
#: Threads per SM the columns kernel is bounded to (``launch_bounds``; 0, the default:
#: unbounded: float32 takes 48 registers, 5 blocks of 256). ``CUFOLD_COLUMN_THREADS``, for study.
COLUMN_THREADS_PER_SM = int(os.environ.get("CUFOLD_COLUMN_THREADS", "0"))
#: The columns kernel splits a column into chunks of at least this many items.
COLUMN_MIN_CHUNK = 16
#: Columns a tile of the column-tiles kernel covers, at most: a warp of the block's 8
#: looks back down each (with 16 or 32, a warp took 2 or 4 in turn: 1.6-1.9x the time
#: on an H200, tools/colscan_probe.py).
COLUMN_TILE_WIDTH = 8
#: Columns of a strip of the column-strips kernel, widest first: the widest whose strips fill
#: at least STRIP_FILL of the GPU's resident blocks (blocks of 32 x width threads, 1024
#: threads an SM at 64 registers) takes them (``CUFOLD_COLUMN_STRIPS=0``: never; the column tiles instead).
STRIP_WIDTHS = (2,) if config.ENABLE_CUDASIM else (32, 16, 8)
STRIP_FILL = 0.9
#: Bytes of accumulators a thread of the column strips holds a chunk (``CUFOLD_COLUMN_STRIP_BYTES``;
#: ptxas sm_90, float32: 32 -> 62 registers, 48 -> 64, 64 -> 64 and 16 bytes of spills).
STRIP_BYTES = int(os.environ.get("CUFOLD_COLUMN_STRIP_BYTES", "32"))
COLUMN_STRIPS = os.environ.get("CUFOLD_COLUMN_STRIPS", "1") != "0"
#: Columns layouts of at most this many columns that the strips do not fill take the narrow
#: columns (:func:`narrow_columns_kernel`) instead of the column tiles (``CUFOLD_NARROW_COLUMNS``;
#: 0: never). Session 33, H200, float32: (2^22, 4) 56.3 us against the tiles' 81.4; (2^21, 8)
#: 64.8 against 55.3; (2^20, 16) 230 against 55. Session 34 (4 x 32 tiles): (2^22, 4) 50.2,
#: (5592405, 3) 55.9 against 117, (2^23, 2) 47.8 against 156.
NARROW_COLUMNS = int(os.environ.get("CUFOLD_NARROW_COLUMNS", "4"))
#: ... and only where their accumulators are of NARROW_BYTES or fewer (``CUFOLD_NARROW_BYTES``):
#: see :func:`narrow_pays`.
NARROW_BYTES = int(os.environ.get("CUFOLD_NARROW_BYTES", "8"))
FULL_MASK = 0xFFFFFFFF

#: The 3-D form of a scan: ``A`` rows of ``C`` columns of ``L`` items each;
#: ``inp``/``out``: (element origin, (A stride, L stride, C stride)) of the input
#: and the output; ``kind``: 'flat', 'segments', 'lanes', 'tiles' or 'columns' ('segments':
#: ``inp``/``out`` give the origin and the item stride of the run of ``A*L`` items).
Layout = collections.namedtuple("Layout", "kind A L C inp out")


def _merge(dims):
    """Merge neighbours (outer to inner) whose input and output strides chain."""
    out = []
    for d in dims:
        if out and out[-1][1] == d[1] * d[0] and out[-1][2] == d[2] * d[0]:
            prev = out.pop()
            d = (prev[0] * d[0], d[1], d[2])
        out.append(d)
    return out


def plan_layout(shape, in_strides, out_strides, axis, reverse):
    """The :class:`Layout` of scanning ``axis`` of a view of ``shape`` (element
    strides of the input and of the output), or None where the batch dimensions
    do not merge into two groups (the caller gathers the input first)."""
    length, il, ol = shape[axis], in_strides[axis], out_strides[axis]
    batch = [(shape[d], in_strides[d], out_strides[d]) for d in range(len(shape))
             if d != axis and shape[d] != 1]
    batch.sort(key=lambda d: (-abs(d[1]), -abs(d[2])))
    groups = _merge(batch)
    if len(groups) > 2:
        return None
    one = (1, 0, 0)
    if not groups:
        outer, inner = one, one
    elif len(groups) == 1:
        g = groups[0]
        outer, inner = (one, g) if abs(g[1]) < abs(il) else (g, one)
    else:
        outer, inner = groups
    rows = outer[0] * inner[0]
    if rows == 1:
        kind = "flat"
    elif inner[0] > 1 and abs(inner[1]) < abs(il):
        kind = "columns"
    elif length > LANE_ROW:
        kind = "tiles"
    elif inner[0] == 1 and outer[1] == length * il and outer[2] == length * ol:
        # rows back to back (one run): a flat run of rows*length items, walked backwards to reverse
        kind = "segments"
        if reverse:
            last = rows * length - 1
            return Layout(kind, outer[0], length, 1, (last * il, (0, -il, 0)), (last * ol, (0, -ol, 0)))
        return Layout(kind, outer[0], length, 1, (0, (0, il, 0)), (0, (0, ol, 0)))
    else:
        kind = "lanes"
    in_origin = out_origin = 0
    if reverse and length > 0:
        in_origin, out_origin = (length - 1) * il, (length - 1) * ol
        il, ol = -il, -ol
    return Layout(kind, outer[0], length, inner[0], (in_origin, (outer[1], il, inner[1])),
                  (out_origin, (outer[2], ol, inner[2])))


def windows(arrs, side, lay):
    """The 3-D views ``(A, L, C)`` of Arr(s) ``arrs`` (a tuple for tuple values)
    for ``side`` (``lay.inp`` or ``lay.out``)."""
    origin, strides = side
    shape = (lay.A, lay.L, lay.C)
    if isinstance(arrs, tuple):
        return tuple(_arrays.window(a, origin, shape, strides) for a in arrs)
    return _arrays.window(arrs, origin, shape, strides)


def segment_windows(arrs, side, lay):
    """The 1-D views of a ``segments`` layout: its ``A*L`` items in scan order."""
    origin, strides = side
    if isinstance(arrs, tuple):
        return tuple(_arrays.window(a, origin, (lay.A * lay.L,), (strides[1],)) for a in arrs)
    return _arrays.window(arrs, origin, (lay.A * lay.L,), (strides[1],))


def flat_windows(arrs, side, lay):
    """The 1-D views along the scan of a ``flat`` layout (its one row)."""
    origin, strides = side
    if isinstance(arrs, tuple):
        return tuple(_arrays.window(a, origin, (lay.L,), (strides[1],)) for a in arrs)
    return _arrays.window(arrs, origin, (lay.L,), (strides[1],))


# --- device routines -------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _access3(vt):
    """``(load3(arrays, a, l, c), store3(arrays, a, l, c, value))`` on 3-D arrays (a
    result with fields not stored, ``values.OutputType``: no load3, and store3 writes
    the stored fields only)."""
    load = None
    if not isinstance(vt, OutputType):
        load = _codegen.build("def load3(x, a, l, c):\n    return %s\n" % vt._pack(
            ["%s[np.uint64(a), np.uint64(l), np.uint64(c)]" % vt._field("x", i) for i in range(vt.arity)]),
            "load3")
    lines = ["    %s[np.uint64(a), np.uint64(l), np.uint64(c)] = %s" % (x, vt._field("v", i))
             for i, x in vt._arrays_in("x")]
    store = _codegen.build("def store3(x, a, l, c, v):\n%s\n" % "\n".join(lines), "store3")
    return load, store


@functools.lru_cache(maxsize=None)
def _dims(vt):
    """Device function ``(arrays) -> shape`` of (the first field of) ``arrays``."""
    return _codegen.build("def dims(x):\n    return %s.shape\n" % vt._field("x", 0), "dims")


@functools.lru_cache(maxsize=None)
def _row_view(vt, spelling="index"):
    """Device function ``(arrays, a, c) -> arrays``: row ``(a, c)`` of 3-D arrays as
    1-D views (inlined: Numba returns no array view from an ordinary device function).
    ``spelling``: ``index`` (``x[a, :, c]``) or ``slice`` (``x[a, :, c:][:, 0]``), the
    same view; ptxas (sm_90) allocates the tiles kernel 32 registers (8 blocks per SM)
    with ``slice`` for rows walked forwards and with ``index`` for reversed rows, 40
    (6 blocks) the other way round."""
    expr = "%s[a, :, c]" if spelling == "index" else "%s[a, :, c:][:, 0]"
    return cuda.jit(device=True, inline="always")(_codegen.build(
        "def row(x, a, c):\n    return %s\n" % vt._pack_arrays(
            [expr % x for _, x in vt._arrays_in("x")]), "row", device=False))


@functools.lru_cache(maxsize=None)
def _local(vt, count):
    """Device function ``() -> items``: ``count`` values of ``vt`` in registers."""
    lines = ["    a%d = cuda.local.array(%d, T%d)" % (i, count, i) for i in range(vt.arity)]
    src = "def local_items():\n%s\n    return %s\n" % (
        "\n".join(lines), vt._pack(["a%d" % i for i in range(vt.arity)]))
    return cuda.jit(device=True, inline="always")(_codegen.build(src, "local_items", vt._env(), device=False))


@functools.lru_cache(maxsize=None)
def _states_from(acc_vt, layout):
    """Device function ``(states, aggs, pres, first) -> lb``: the look-back states
    (:func:`.scan._tile_states`' ``lb``) from tile ``first`` on, so that a row (the
    tiles kernel) or a column (the column tiles) looks back over its own run of tiles
    numbered from 0. ``layout``: 'packed' or 'pair' (state words only, ``states`` =
    (words, words as float64)), else 'wide' (``states`` = (flags, flags as float32), and
    the value arrays ``aggs`` and ``pres``)."""
    from . import scan as S
    if layout in ("packed", "pair"):
        words = S.state_words(layout)

        @cuda.jit(device=True, inline="always")
        def words_from(states, aggs, pres, first):
            return (states[0][first * words:], states[1][first * words:])

        return words_from
    from_in = S._lane_io(S._storage_vt(acc_vt), "plain")[0]      # value arrays from an index on

    @cuda.jit(device=True, inline="always")
    def flags_from(states, aggs, pres, first):
        return (states[0][first:], states[1][first:], from_in(aggs, first), from_in(pres, first))

    return flags_from


# --- lanes: groups of G lanes per row ------------------------------------------------------

@functools.lru_cache(maxsize=None)
def lanes_kernel(op, in_vt, acc_vt, out_vt, kind, group, per_lane, split, transform=None):
    """Kernel ``(xs, outs, rows, cols, init)`` over 3-D ``(A, L, C)`` views
    (``rows = A*C``, row ``r`` is ``(r // C, :, r % C)``): groups of ``group``
    lanes (a power of two <= 32) scan a row ``group`` items at a time (a shuffle
    scan of the group, after the carry of the items before); each lane works on
    ``per_lane`` rows at once. Every lane of a warp runs every step (shuffles
    with the full mask): lanes past the last row load a real item and store nothing.
    ``split``: ``C > 1`` (else a row is ``(r, :, 0)``, with no division).
    ``transform``: None or an ops.Transform of ``in_vt``'s items, fused into the loads."""
    from . import scan as S
    g = group
    exclusive = kind == "exclusive"
    scan = warp.inclusive_scan(op, acc_vt, width=g)
    shfl_up, shfl_idx = acc_vt.shuffle("up"), acc_vt.shuffle("idx")
    combine = op.combine(acc_vt)
    load_in, _ = _access3(in_vt)
    _, store_out = _access3(out_vt)
    to_acc, to_out = S._to_acc(acc_vt, in_vt, transform), out_vt.cast
    get, put = acc_vt.load, acc_vt.store
    local = _local(acc_vt, per_lane)
    dims = _dims(in_vt)

    def scan_lanes(xs, outs, rows, cols, init):
        length = dims(xs)[1]
        lane = cuda.laneid
        sub = lane & (g - 1)
        last_lane = lane - sub + (g - 1)
        per_block = cuda.blockDim.x // g
        groups = cuda.gridDim.x * per_block
        gid = cuda.blockIdx.x * per_block + cuda.threadIdx.x // g
        span = groups * per_lane
        steps = (rows + span - 1) // span                # the same for every lane
        vals = local()
        carry = local()
        for step in range(steps):
            first_row = step * span + gid
            for j in range(per_lane):
                put(carry, j, init)
            for start in range(0, length, g):
                k = start + sub
                kc = min(k, length - 1)
                for j in range(per_lane):
                    row = min(first_row + j * groups, rows - 1)
                    a = row // cols if split else row
                    put(vals, j, to_acc(load_in(xs, a, kc, row - a * cols if split else 0)))
                for j in range(per_lane):
                    v = scan(get(vals, j))
                    c_in = get(carry, j)
                    if exclusive or start > 0:
                        v = combine(c_in, v)
                    result = v
                    if exclusive:                        # every lane shuffles, stored or not
                        result = shfl_up(FULL_MASK, v, 1)
                        if sub == 0:
                            result = c_in
                    row = first_row + j * groups
                    if row < rows and k < length:
                        a = row // cols if split else row
                        store_out(outs, a, k, row - a * cols if split else 0, to_out(result))
                    put(carry, j, shfl_idx(FULL_MASK, v, last_lane))

    return scan_lanes


# --- segments: rows back to back, a warp over whole rows ----------------------------------------

@functools.lru_cache(maxsize=None)
def segments_kernel(op, in_vt, acc_vt, out_vt, kind, per_lane, transform=None, aligned=0):
    """Kernel ``(xs, outs, rows, length, rows_per_warp, init)`` over 1-D views of
    ``rows`` rows of ``length`` items back to back: each warp takes
    ``rows_per_warp`` whole rows at a time and walks them 32 items a step
    (``per_lane`` steps' loads issued together, coalesced), with a segmented
    Kogge-Stone scan over the 32 lanes whose segment heads come from the item's
    position in its row (no flags: lane ``l`` adds lane ``l - d`` where its
    position is ``>= d``), and the carry of the step before where a row started
    before it. The position moves by ``32 % length`` a step: no division.
    ``transform``: None or an ops.Transform of ``in_vt``'s items, fused into the loads.
    ``aligned``: 0, or ``length`` where it divides 32 (rows of 2, 4, .. 32 items): every
    row then lies within a step's lanes ``pos = lane % length``, so the scan takes
    ``log2(length)`` shuffles and no carry (``(2^20, 16)`` along its rows: 4 shuffles an
    item instead of 6)."""
    from . import scan as S
    exclusive = kind == "exclusive"
    combine = op.combine(acc_vt)
    shfl_up, shfl_idx = acc_vt.shuffle("up"), acc_vt.shuffle("idx")
    # A lane's accesses of a step group: one address register, constant offsets (32 k).
    view_in, load_in, _ = S._lane_io(in_vt, "stream")
    view_out, _, store_out = S._lane_io(out_vt, "stream")
    to_acc, to_out = S._to_acc(acc_vt, in_vt, transform), out_vt.cast
    get, put = acc_vt.load, acc_vt.store
    local = _local(acc_vt, per_lane)
    group = 32 * per_lane
    # aligned: logical warps of ``aligned`` lanes, one row each (log2(aligned) shuffles)
    scan_rows = warp.inclusive_scan(op, acc_vt, width=aligned or 32)    # (not aligned: not called)

    def scan_segments(xs, outs, rows, length, rows_per_warp, init):
        lane = cuda.laneid
        warps = (cuda.gridDim.x * cuda.blockDim.x) >> 5
        w = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) >> 5
        span = rows_per_warp * length
        n = rows * length
        advance = np.int32(32 % length)
        first_pos = np.int32(lane % length)
        vals = local()
        while w * rows_per_warp < rows:                   # the same for every lane of a warp
            base = w * span
            end = min(base + span, n)
            pos = first_pos                               # a warp's rows start at its first lane
            carry = init                                  # (not used before the first step's end)
            at = base
            while at < end:
                if at + group <= end:                     # every item of the group: no clamps
                    mine = view_in(xs, at + lane)
                    for k in range(per_lane):
                        put(vals, k, to_acc(load_in(mine, 32 * k)))
                else:                                     # items past the end repeat the last
                    start = min(at + lane, end - 1)
                    last = np.uint32(end - 1 - start)
                    mine = view_in(xs, start)
                    for k in range(per_lane):
                        put(vals, k, to_acc(load_in(mine, min(np.uint32(32 * k), last))))
                mine_out = view_out(outs, at + lane)
                for k in range(per_lane):
                    v = get(vals, k)
                    if exclusive and pos == 0:
                        v = combine(init, v)
                    if aligned:                           # a row within the step: no carry
                        v = scan_rows(v)
                    else:
                        for step in range(5):
                            d = 1 << step
                            other = shfl_up(FULL_MASK, v, d)
                            if lane >= d and pos >= d:
                                v = combine(other, v)
                        if pos > lane:                    # the row started before this step
                            v = combine(carry, v)
                    result = v
                    if exclusive:
                        result = shfl_up(FULL_MASK, v, 1)
                        if pos == 0:
                            result = init
                        elif lane == 0 and not aligned:   # (aligned: lane 0 is a row's first)
                            result = carry
                    if at + 32 * k + lane < end:
                        store_out(mine_out, 32 * k, to_out(result))
                    if not aligned:                       # (aligned: the position stays)
                        carry = shfl_idx(FULL_MASK, v, 31)
                        pos += advance
                        if pos >= length:
                            pos -= length
                at += 32 * per_lane
            w += warps

    return scan_segments


# --- tiles: the single-pass tile scan on every row --------------------------------------------

@functools.lru_cache(maxsize=None)
def tiles_kernel(spec, spelling="slice"):
    """Kernel ``(xs, outs, per_row, tiles, cols, counter, states, aggs, pres, init,
    has_init, totals)``: :mod:`.scan`'s single-pass tile scan (``spec``) of every
    row of 3-D ``(A, L, C)`` views; ``tiles = rows * per_row``. A block draws a
    ticket (:func:`.scan.draw`); ticket ``t`` is tile ``t % per_row`` of row
    ``t // per_row``, whose look-back reads only that row's range of tile states
    (a row's first tile starts it: its prefix is its aggregate). Rows of one tile
    (``spec.carry == 'single_block'``): block ``r`` scans row ``r``, with no
    ticket and no tile states. ``spelling``: of the row views (:func:`_row_view`)."""
    from . import scan as S
    tile_scan, temp_items = S._tile_scan(spec)
    tile_storage = block.temp_storage(spec.acc_vt, S._tile_slots(spec.tile))
    scan_storage = block.temp_storage(spec.acc_vt, temp_items)
    stash_storage = block.temp_storage(spec.acc_vt, 2)
    row_in, row_out = _row_view(spec.in_vt, spelling), _row_view(spec.out_vt, spelling)
    dims = _dims(spec.in_vt)
    begin = S.tile_draw(spec.variant.ids)[0]
    row_states = _states_from(spec.acc_vt, spec.variant.states)

    @cuda.jit(device=True, inline="always")
    def start(ticket, per_row, cols):
        row = ticket // per_row
        a = row // cols
        return row * per_row, ticket - row * per_row, a, row - a * cols

    def scan_rows_ticketed(xs, outs, per_row, tiles, cols, counter, states, aggs, pres, init, has_init,
                           totals):
        smem = tile_storage()
        temp = scan_storage()
        stash = stash_storage()
        ticket, drawn, pending = begin(counter, tiles)
        first, tile, a, c = start(ticket, per_row, cols)
        state = (tile, row_states(states, aggs, pres, first), drawn, init, has_init, stash)
        length = dims(xs)[1]
        tile_scan(row_in(xs, a, c), row_out(outs, a, c), length, tile, per_row, state, smem, temp, totals,
                  False, pending)

    def scan_rows_one_tile(xs, outs, per_row, tiles, cols, counter, states, aggs, pres, init, has_init,
                           totals):
        smem = tile_storage()
        temp = scan_storage()
        stash = stash_storage()
        row = np.int64(cuda.blockIdx.x)
        a = row // cols
        state = (np.int64(0), pres, np.uint32(0), init, has_init, stash)
        length = dims(xs)[1]
        tile_scan(row_in(xs, a, row - a * cols), row_out(outs, a, row - a * cols), length, np.int64(0), 1,
                  state, smem, temp, totals, False, 0)

    if spec.carry == "single_block":
        return scan_rows_one_tile
    return scan_rows_ticketed


def row_tile(in_vt, acc_vt, length):
    """The tile of the tiles kernel for rows of ``length``: :func:`.scan.tile_for`'s,
    with fewer threads where a row is shorter than a tile (down to a warp), and for rows
    of several tiles (a look-back down each) half its threads with twice the items each
    (``LONG_ROW_TILE``): the same tile in blocks of 4 warps, so that a block's look-back
    (one warp) idles 3 warps, not 7, and twice the blocks fit an SM (H200, float32
    (16, 2^20) along its rows: 256x16 43.7 us, 128x32 41.4; the flat 1-D scan 45.0 / 44.9)."""
    from . import scan as S
    tile = S.tile_for(in_vt, acc_vt, length)
    nt = tile.nt
    while nt > 32 and (nt // 2) * tile.vt >= length:
        nt //= 2
    if LONG_ROW_TILE and nt == tile.nt > 64 and length > nt * tile.vt and not os.environ.get("CUFOLD_TILE"):
        return Tile(nt // 2, tile.vt * 2)
    return Tile(nt, tile.vt)


# --- columns: a thread per (column, chunk) ---------------------------------------------------

@functools.lru_cache(maxsize=None)
def columns_kernel(op, in_vt, acc_vt, out_vt, kind, phase, unroll, transform=None):
    """Kernel ``(xs, outs, chunk, chunks, cols, partials, init, has_init)`` over 3-D
    ``(A, L, C)`` views: thread ``w`` takes column ``w % C`` of chunk ``w // C %
    chunks`` (``chunk`` items) of row group ``w // (C*chunks)``. ``phase``: 'up'
    folds the chunk into ``partials[(a*C + c), chunk, 0]`` (not the last chunk);
    'down' scans the chunk after its carry (``partials[.., chunk - 1, 0]``: the
    inclusive scan of the folds before it), writing ``outs``. ``transform``: None or an
    ops.Transform of ``in_vt``'s items, fused into the loads (of both phases)."""
    exclusive = kind == "exclusive"
    combine = op.combine(acc_vt)
    rows = _column_rows(op, in_vt, acc_vt, out_vt, kind, unroll, transform)
    load_acc, store_acc = _access3(acc_vt)
    local = _local(acc_vt, unroll)
    up = phase == "up"
    dims = _dims(in_vt)

    def scan_columns(xs, outs, chunk, chunks, cols, partials, init, has_init):
        shape = dims(xs)
        length = shape[1]
        groups = shape[0]
        work = groups * chunks * cols
        w = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        step = cuda.gridDim.x * cuda.blockDim.x
        vals = local()
        while w < work:
            r = w // cols
            c = w - r * cols
            a = r // chunks
            ch = r - a * chunks
            lo = ch * chunk
            hi = min(lo + chunk, length)
            if up and ch == chunks - 1:
                lo = hi                                  # the last chunk's fold is never used
            have = np.bool_(exclusive and not up)     # a fold starts at its first item
            carry = init
            if ch > 0 and not up:
                before = load_acc(partials, a * cols + c, ch - 1, 0)
                carry = combine(init, before) if (exclusive and has_init) else before
                have = np.bool_(True)
            # The column as a 1-D view: an address and a stride, not three indices an item
            # (the 3-D indexing made the kernel issue-bound: 0.70 warps a cycle, H200 ncu).
            column = rows.column(xs, np.uint64(a), np.uint64(c))
            i = lo
            while i < hi:
                mine = min(hi - i, unroll)
                rows.load(vals, 0, 1, column, i, hi, mine == unroll)
                if up:
                    total = rows.fold(vals, 0, 1, mine)
                    carry = combine(carry, total) if have else total
                else:
                    carry = rows.store(outs, a, c, i, vals, 0, 1, mine, carry, have)
                have = np.bool_(True)
                i += unroll
            if up and lo < hi:
                store_acc(partials, a * cols + c, ch, 0, carry)
            w += step

    if COLUMN_THREADS_PER_SM and not config.ENABLE_CUDASIM:
        nt = _threads()
        scan_columns.jit_options = {"launch_bounds": (nt, max(1, COLUMN_THREADS_PER_SM // nt))}
    return scan_columns


# --- a thread's rows of one column: what both column kernels do with them ----------------------

ColumnRows = collections.namedtuple("ColumnRows", "column load fold store")


@functools.lru_cache(maxsize=None)
def _column_rows(op, in_vt, acc_vt, out_vt, kind, per, transform=None, step=1):
    """Device functions over a thread's ``per`` rows ``step`` apart (1: consecutive) of one column of 3-D
    ``(A, L, C)`` arrays (a thread's loads: one address and a stride, not one address an
    item), the items held at ``items[k * stride + at]`` (registers: ``at`` 0, ``stride`` 1;
    a block's shared tile: the thread's index and the block's threads):

    ``column(xs, a, c)``: column ``(a, c)`` of the input, a 1-D view;
    ``load(items, at, stride, column, row0, length, whole)``: rows ``row0 ..`` of ``column``
    as accumulators (``transform`` applied); ``whole``: all ``per`` rows lie inside (else rows
    past the end repeat the last);
    ``fold(items, at, stride, mine)``: the fold of the first ``mine`` items (the first
    item alone where ``mine <= 1``: a thread past the end folds a repeat, never read);
    ``store(outs, a, c, row0, items, at, stride, mine, run, have)``: the first ``mine``
    items scanned after ``run`` (``have``: ``run`` holds a value; an exclusive scan stores
    ``run`` first, so it always has one) into column ``(a, c)`` of ``outs`` from ``row0``;
    returns the running total after them (``mine >= 1`` or ``have``: else ``run`` as given)."""
    from . import scan as S
    exclusive = kind == "exclusive"
    combine = op.combine(acc_vt)
    row_in, row_out = _row_view(in_vt, "slice"), _row_view(out_vt, "slice")
    view_in, load_in, _ = S._lane_io(in_vt, "stream")
    view_out, _, store_out = S._lane_io(out_vt, "stream")
    to_acc, to_out = S._to_acc(acc_vt, in_vt, transform), out_vt.cast
    get, put = acc_vt.load, acc_vt.store

    @cuda.jit(device=True)
    def load(items, at, stride, column, row0, length, whole):
        if whole:
            mine_in = view_in(column, np.uint64(row0))
            for k in range(per):
                put(items, k * stride + at, to_acc(load_in(mine_in, np.uint32(k * step))))
        else:
            start = min(row0, length - 1)
            last = np.uint32(length - 1 - start)
            mine_in = view_in(column, np.uint64(start))
            for k in range(per):
                put(items, k * stride + at, to_acc(load_in(mine_in, min(np.uint32(k * step), last))))

    @cuda.jit(device=True)
    def fold(items, at, stride, mine):
        total = get(items, at)
        for k in range(1, per):
            if k < mine:
                total = combine(total, get(items, k * stride + at))
        return total

    @cuda.jit(device=True)
    def store(outs, a, c, row0, items, at, stride, mine, run, have):
        mine_out = view_out(row_out(outs, np.uint64(a), np.uint64(c)), np.uint64(row0))
        for k in range(per):
            if k < mine:
                v = get(items, k * stride + at)
                if exclusive:
                    store_out(mine_out, np.uint32(k), to_out(run))
                    run = combine(run, v)
                else:
                    run = combine(run, v) if have else v
                    have = True
                    store_out(mine_out, np.uint32(k), to_out(run))
        return run

    return ColumnRows(row_in, load, fold, store)


# --- column tiles: columns with a single-pass look-back down each strip -------------------------

@functools.lru_cache(maxsize=None)
def column_tiles_kernel(op, in_vt, acc_vt, out_vt, kind, tc, ty, per, states, poll, transform=None,
                        ids="ticket"):
    """Kernel ``(xs, outs, tiles, strips, col_strips, chunks, counter, words, aggs, pres,
    init, has_init)`` over 3-D ``(A, L, C)`` views whose columns (``C``, the smaller
    stride) are scanned down ``L`` in one pass.

    A tile is ``tc`` columns (a *strip*; ``strips = A * col_strips``) by ``ty *
    per`` rows (``chunks`` tiles down a strip). Thread ``(y, x)`` (``tid = y*tc +
    x``) loads ``per`` consecutive rows of column ``x`` (a warp's loads are rows of
    ``tc`` neighbouring items: whole sectors) into shared memory, where only it reads
    them again (item ``k`` at ``k*nt + tid``: no bank conflicts, and no register
    holds an item across the look-back, so more blocks fit an SM). A warp a column
    then scans the column's ``ty`` thread folds (shuffles), publishes the column's
    state and looks back over the tiles above (:func:`.scan._look_back`, over that
    column's tile states, which lie together: column ``x`` of strip ``s`` at states
    ``(s*tc + x)*chunks ..``), so a column's chain of tiles runs as a 1-D scan's does.
    Tiles go to blocks by ticket, row-chunk major: ticket ``t`` is chunk ``t //
    strips`` of strip ``t % strips`` (strip by strip measured slower: 74 against 56 us
    at 2^20 x 16 on an H200). A warp with several columns publishes them all before its
    first look-back: a look-back waits until every state of its window is published,
    so a state published after another column's look-back would chain the tiles one
    after another. ``states``/``poll``: the look-back's layout
    (:func:`.scan.state_layout`) and flag reads; ``ids``: how a block gets its tile
    (:func:`.scan.tile_draw`)."""
    from . import scan as S
    exclusive = kind == "exclusive"
    begin, settle = S.tile_draw(ids)
    combine = op.combine(acc_vt)
    rows = _column_rows(op, in_vt, acc_vt, out_vt, kind, per, transform)
    get, put = acc_vt.load, acc_vt.store
    look_back = S._look_back(op, acc_vt, states, poll, published=True)
    publish = S._tile_states(acc_vt, states, poll)[0]
    column_states = _states_from(acc_vt, states)
    stash_at = S._lane_io(acc_vt, "plain")[0]
    g = min(32, ty)                                         # lanes of a column's scan
    scan_lanes = warp.inclusive_scan(op, acc_vt, width=g)
    shfl_up, shfl_idx = acc_vt.shuffle("up"), acc_vt.shuffle("idx")
    nt = tc * ty
    warps = nt // 32
    items_storage = block.temp_storage(acc_vt, nt * per)    # the tile, each thread's items striped
    scans_storage = block.temp_storage(acc_vt, nt)          # the threads' folds, then their carries
    carry_storage = block.temp_storage(acc_vt, tc)          # each column's total, then its carry
    stash_storage = block.temp_storage(acc_vt, 2 * warps)   # the look-back's stash, a pair a warp
    dims = _dims(in_vt)
    rows_per_tile = ty * per

    def scan_column_tiles(xs, outs, tiles, strips, col_strips, chunks, counter, words, aggs, pres, init,
                          has_init):
        items = items_storage()
        scans = scans_storage()
        carries = carry_storage()
        stash = stash_storage()
        t, drawn, pending = begin(counter, tiles)
        chunk = t // strips
        strip = t - chunk * strips
        a = strip // col_strips
        shape = dims(xs)
        length, cols = shape[1], shape[2]
        tid = cuda.threadIdx.x
        x = tid % tc
        y = tid // tc
        first_col = (strip - a * col_strips) * tc
        c = first_col + x
        cc = min(c, cols - 1)                     # columns past the last: loaded, never stored
        top_row = chunk * rows_per_tile
        row0 = top_row + y * per
        mine = min(max(length - row0, 0), per)    # this thread's rows inside the array
        busy = min(ty, (length - top_row + per - 1) // per)   # threads of a column with rows
        # (Unsigned indices: Numba adds no wraparound test for negative ones.)
        rows.load(items, tid, nt, rows.column(xs, np.uint64(a), np.uint64(cc)), row0, length, mine == per)
        settle(drawn, pending)                    # (read after the barrier below)
        put(scans, tid, rows.fold(items, tid, nt, mine))
        cuda.syncthreads()
        # A warp a column: the column's threads in order (their carries within the tile, the
        # tile's total), then the column's state published.
        w = tid >> 5
        lane = cuda.laneid
        tag = np.uint32(drawn[1])
        last_col = min(tc, cols - first_col)
        for k in range(w, last_col, warps):
            total = init
            for base in range(0, ty, g):
                if base < busy:                   # the same on every lane
                    yy = base + (lane & (g - 1))
                    inc = scan_lanes(get(scans, min(yy, busy - 1) * tc + k))
                    before = shfl_up(FULL_MASK, inc, 1)
                    if base > 0:
                        inc = combine(total, inc)
                        before = total if (lane & (g - 1)) == 0 else combine(total, before)
                    if lane < g and 0 < yy < busy:
                        put(scans, yy * tc + k, before)
                    total = shfl_idx(FULL_MASK, inc, min(busy - 1 - base, g - 1))
            if lane == 0:
                put(carries, k, total)
                publish(column_states(words, aggs, pres, (strip * tc + k) * chunks), chunk, tag,
                        np.int32(S.PREFIX if chunk == 0 else S.AGGREGATE), total)
        cuda.syncwarp(FULL_MASK)                  # lane 0's totals, for the look-backs
        lane_stash = stash_at(stash, 2 * w)
        for k in range(w, last_col, warps):
            carry = look_back(get(carries, k), (chunk, column_states(words, aggs, pres, (strip * tc + k) * chunks),
                                                drawn, init, has_init, lane_stash))
            cuda.syncwarp(FULL_MASK)              # every lane has read the total
            if lane == 0:
                put(carries, k, carry)
        cuda.syncthreads()
        # The items after their carry: the tiles above, then this column's threads above.
        have = exclusive or chunk > 0
        carry = get(carries, x)
        if y > 0 and y < busy:
            inside = get(scans, tid)
            carry = combine(carry, inside) if have else inside
            have = True
        if c < cols and mine > 0:
            rows.store(outs, a, c, row0, items, tid, nt, mine, carry, have)

    return scan_column_tiles


# --- column strips: a block down each strip of columns, no look-back ----------------------------

def strip_items(acc_vt):
    """Rows a thread of the column-strips kernel takes a chunk (STRIP_BYTES of values in
    registers, at least 2 values; twice: the chunk it scans and the next one, loading)."""
    return 2 if config.ENABLE_CUDASIM else max(2, STRIP_BYTES // max(4, acc_vt.itemsize))


@functools.lru_cache(maxsize=None)
def column_strips_kernel(op, in_vt, acc_vt, out_vt, kind, tc, per, transform=None):
    """Kernel ``(xs, outs, col_strips, init)`` over 3-D ``(A, L, C)`` views with many
    columns (``C``, the smaller stride), scanned down ``L``: block ``s`` takes strip ``s``
    (``tc`` columns of row group ``s // col_strips``) and walks all its rows, a chunk of
    ``32 * per`` rows at a time, carrying each column's total from chunk to chunk itself
    (no look-back, no ticket, nothing shared between blocks).

    Thread ``(y, x)`` (``tid = y*tc + x``, ``y < 32``) holds ``per`` consecutive rows of
    column ``x`` in registers (a warp's loads: rows of ``tc`` neighbouring items, whole
    sectors) and loads the next chunk's while the block scans this one: its fold goes to
    shared memory, warp ``x`` scans column ``x``'s 32 folds (shuffles) after the column's
    carry and writes each thread its prefix, and the thread scans its rows after it. Two
    barriers a chunk. Where it pays: strips enough to fill the GPU (4096 columns and more
    of 4-byte items), where the column tiles spend 8 look-backs a tile."""
    exclusive = kind == "exclusive"
    combine = op.combine(acc_vt)
    rows = _column_rows(op, in_vt, acc_vt, out_vt, kind, per, transform)
    get, put = acc_vt.load, acc_vt.store
    scan_lanes = warp.inclusive_scan(op, acc_vt, width=32)
    shfl_up, shfl_idx = acc_vt.shuffle("up"), acc_vt.shuffle("idx")
    pitch = tc + 1                          # a warp reads a column of the folds: no bank conflicts
    folds_storage = block.temp_storage(acc_vt, 32 * pitch)
    local = _local(acc_vt, per)
    dims = _dims(in_vt)
    rows_per_chunk = 32 * per

    def scan_column_strips(xs, outs, col_strips, init):
        folds = folds_storage()
        cur = local()
        nxt = local()
        s = cuda.blockIdx.x
        a = s // col_strips
        shape = dims(xs)
        length, cols = shape[1], shape[2]
        tid = cuda.threadIdx.x
        x = tid % tc
        y = tid // tc
        w = tid >> 5                        # the column this warp scans the folds of
        lane = cuda.laneid
        c = (s - a * col_strips) * tc + x
        column = rows.column(xs, np.uint64(a), np.uint64(min(c, cols - 1)))
        carry = init                        # warp w's: column w's total so far
        chunks = (length + rows_per_chunk - 1) // rows_per_chunk
        if chunks == 0:
            return                          # (a whole block: no barrier is left waiting)
        rows.load(cur, 0, 1, column, y * per, length, y * per + per <= length)
        for ch in range(chunks):
            top = ch * rows_per_chunk
            row0 = top + y * per
            mine = min(max(length - row0, 0), per)
            busy = min(32, (length - top + per - 1) // per)     # threads of a column with rows
            put(folds, y * pitch + x, rows.fold(cur, 0, 1, mine))
            if ch + 1 < chunks:
                ahead = row0 + rows_per_chunk
                rows.load(nxt, 0, 1, column, ahead, length, ahead + per <= length)
            cuda.syncthreads()
            inc = scan_lanes(get(folds, min(lane, busy - 1) * pitch + w))
            before = shfl_up(FULL_MASK, inc, 1)
            if exclusive or ch > 0:
                before = carry if lane == 0 else combine(carry, before)
            if lane < busy:
                put(folds, lane * pitch + w, before)     # (inclusive, first chunk, lane 0: unread)
            total = shfl_idx(FULL_MASK, inc, busy - 1)
            carry = combine(carry, total) if (exclusive or ch > 0) else total
            cuda.syncthreads()
            if c < cols and mine > 0:
                rows.store(outs, a, c, row0, cur, 0, 1, mine, get(folds, y * pitch + x),
                           exclusive or ch > 0 or y > 0)
            # (no third barrier: a thread's next fold goes to its own slot, which after the
            # second barrier only it reads)
            for k in range(per):
                put(cur, k, get(nxt, k))

    # 64 registers a thread (two chunks' items): 1024 threads an SM, 32 / tc blocks
    scan_column_strips.jit_options = {"launch_bounds": (32 * tc, max(1, 32 // tc))}
    return scan_column_strips


def _strip_width(b, lay):
    """Columns a strip of :func:`column_strips_kernel` for ``lay`` (0: strips would not
    fill the GPU, the column tiles run)."""
    if not COLUMN_STRIPS:
        return 0
    sms = _launch.sm_count(b.device_id)
    for tc in STRIP_WIDTHS:
        if lay.A * -(-lay.C // tc) >= STRIP_FILL * sms * max(1, 32 // tc):
            return tc
    return 0


# --- narrow columns: a few columns across a warp's lanes, one look-back for all of them --------

def narrow_tile(in_vt, acc_vt):
    """``(warps, steps)`` of :func:`narrow_columns_kernel`: warps a block, and steps of
    ``32 // width`` rows a lane holds: 4 x 32 for accumulators of up to 8 bytes (8 x 32 for
    8-byte items; int64 untimed), else 64 bytes of accumulators a lane (``CUFOLD_NARROW_TILE=WxS``
    overrides). Four warps, not eight, idle fewer while warp 0 looks back (H200, (2^22, 4)
    along axis 0, us: float32 8 x 16 56.5, 4 x 32 49.8, 8 x 32 49.9; int32 -> int32 8 x 16
    61.2, 4 x 32 56.0; int32 -> int64 8 x 16 123, 4 x 32 81.5, 8 x 32 97.4). float64 is the
    exception: 8 x 8 195, 8 x 16 129, 4 x 32 120.3-121, 8 x 32 110.4-111, 4 x 64 253 (and
    (2^23, 2): 4 x 32 102.0, 8 x 32 100.1). The simulator takes 2 x 2, so that small test
    inputs span many tiles."""
    forced = os.environ.get("CUFOLD_NARROW_TILE")
    if forced:
        warps, steps = (int(v) for v in forced.lower().split("x"))
        return warps, steps
    if config.ENABLE_CUDASIM:
        return 2, 2
    if acc_vt.itemsize <= 8:
        return (8 if in_vt.itemsize == 8 and not in_vt.is_tuple else 4), 32
    return 8, max(2, 64 // acc_vt.itemsize)


def narrow_width(cols):
    """Lanes a row takes in :func:`narrow_columns_kernel`: the power of two >= ``cols``."""
    return 1 << max(0, (cols - 1).bit_length())


@functools.lru_cache(maxsize=None)
def _columns_look_back(op, acc_vt, width, states, poll):
    """Device function ``(aggregate, chain, chunk, lb, tag, valid) -> exclusive``: the
    decoupled look-back of up to ``width`` columns at once, on every lane of one warp.

    Lane ``(d, c)`` (``lane = d * width + c``) carries column ``c``: ``aggregate`` is the
    tile's fold of it, ``chain`` the index of the column's first tile state (tile ``t`` at
    ``chain + t``), ``valid`` whether column ``c`` exists. Lanes ``d = 0`` publish the
    tile's state (tile 0: its prefix), then each column's ``32 // width`` lanes look at
    that many tiles above at a time, ``d`` in tile order: a window of each column, all
    columns in one wait. A column stops at its window's last inclusive prefix; the others
    go on up. Returns the column's fold of the tiles above (tile 0: ``aggregate``, not to
    be used), after publishing ``exclusive op aggregate`` as the tile's prefix."""
    from . import scan as S
    combine = op.combine(acc_vt)
    publish, wait = S._tile_states(acc_vt, states, poll)
    shfl_idx = acc_vt.shuffle("idx")
    window = 32 // width
    shift = width.bit_length() - 1
    suffix = warp._reduce_down(op, acc_vt, window, width)    # lanes d.. of each column, in order
    column_lanes = np.uint32(sum(1 << (width * k) for k in range(window)))   # column 0's ballot bits
    prefix_status, aggregate_status = np.int32(S.PREFIX), np.int32(S.AGGREGATE)

    @cuda.jit(device=True)
    def look_back(aggregate, chain, chunk, lb, tag, valid):
        lane = cuda.laneid
        c = lane & (width - 1)
        d = lane >> shift
        if d == 0 and valid:
            publish(lb, chain + chunk, tag, prefix_status if chunk == 0 else aggregate_status, aggregate)
        exclusive = aggregate
        if chunk == 0:
            return exclusive
        done = not valid
        first = True
        top = chunk - 1                          # the tile lanes d = window - 1 look at
        while True:
            t = top - (window - 1) + d
            j = chain + t
            if t < 0 or done:
                j = -1                           # OUTSIDE: never counted
            s, value = wait(lb, j, tag, aggregate)
            prefixes = (cuda.ballot_sync(FULL_MASK, s == prefix_status) >> np.uint32(c)) & column_lanes
            start = np.int32((31 - cuda.clz(prefixes)) >> shift) if prefixes != 0 else np.int32(0)
            part = shfl_idx(FULL_MASK, suffix(value, d, FULL_MASK, window), (start << shift) + c)
            if not done:
                exclusive = part if first else combine(part, exclusive)
                done = prefixes != 0
            first = False
            if cuda.all_sync(FULL_MASK, done):
                break
            top -= window
        if d == 0 and valid:
            publish(lb, chain + chunk, tag, prefix_status, combine(exclusive, aggregate))
        return exclusive

    return look_back


@functools.lru_cache(maxsize=None)
def narrow_columns_kernel(op, in_vt, acc_vt, out_vt, kind, width, warps, steps, states, poll,
                          transform=None, ids="ticket"):
    """Kernel ``(xs, outs, tiles, counter, words, aggs, pres, init, has_init)`` over 3-D
    ``(A, L, C)`` views of at most 32 columns (``C``, the smaller stride), scanned down
    ``L`` in one pass: a row across ``width`` lanes (the power of two >= C), a warp step
    ``32 // width`` rows (a warp's load: whole rows, whole sectors where the rows lie back
    to back), one look-back for all the tile's columns.

    A tile is ``warps`` warps of ``steps`` steps; warp ``w`` takes the tile's ``w``-th run of
    ``steps * 32 // width`` rows. Lane ``(h, c)`` holds column ``c`` of row ``h`` of each
    step, in registers. Each step is scanned down its rows (shuffles ``width`` lanes apart:
    ``log2(32 // width)``), after the warp's carry from the steps before; each warp's
    column totals go to shared memory, the first warp folds them into the tile's and looks
    back for every column at once (:func:`_columns_look_back`), and every item is stored
    after its carry (the tiles above, then the warps before). Tiles go to blocks by ticket,
    chunk-major (ticket ``t``: chunk ``t // A`` of row group ``t % A``); column ``c`` of
    group ``a`` keeps its tile states together from ``(a*C + c) * chunks``.
    Where it pays: 4 columns or fewer (:func:`narrow_pays`), where the column tiles' 8-wide
    tiles are half empty or more and spend a look-back a column (from 8 columns on, the one
    warp's look-back for all of them is the slower: (2^21, 8) 64.8 us against 55.3).
    ``ids``: how a block gets its tile (:func:`.scan.tile_draw`)."""
    from . import scan as S
    exclusive = kind == "exclusive"
    combine = op.combine(acc_vt)
    get, put = acc_vt.load, acc_vt.store
    per_step = 32 // width                        # rows a step
    rows = _column_rows(op, in_vt, acc_vt, out_vt, kind, steps, transform, per_step)   # a lane's loads
    row_out = _row_view(out_vt, "slice")
    view_out, _, store_out = S._lane_io(out_vt, "stream")
    to_out = out_vt.cast
    shfl_up, shfl_idx = acc_vt.shuffle("up"), acc_vt.shuffle("idx")
    shift = width.bit_length() - 1
    scan_step = warp._inclusive(op, acc_vt, per_step, width)
    look_back = _columns_look_back(op, acc_vt, width, states, poll)
    local = _local(acc_vt, steps)
    totals_storage = block.temp_storage(acc_vt, warps * width)    # each warp's column totals
    carry_storage = block.temp_storage(acc_vt, width)             # the tile's carry of each column
    dims = _dims(in_vt)
    rows_per_warp = per_step * steps
    rows_per_tile = warps * rows_per_warp
    last_row = (per_step - 1) * width                             # lane of a step's last row, column 0
    packed = states in ("packed", "pair")                         # state words (no value arrays)

    begin, settle = S.tile_draw(ids)

    def scan_narrow_columns(xs, outs, tiles, counter, words, aggs, pres, init, has_init):
        totals = totals_storage()
        carries = carry_storage()
        t, drawn, pending = begin(counter, tiles)
        shape = dims(xs)
        groups, length, cols = shape[0], shape[1], shape[2]
        chunk = t // groups
        a = t - chunk * groups
        chunks = tiles // groups
        tid = cuda.threadIdx.x
        w = tid >> 5
        lane = cuda.laneid
        c = lane & (width - 1)
        h = lane >> shift
        cc = min(c, cols - 1)                     # columns past the last: loaded, never stored
        row0 = chunk * rows_per_tile + w * rows_per_warp + h
        vals = local()                            # (rows past the end repeat the last)
        rows.load(vals, 0, 1, rows.column(xs, np.uint64(a), np.uint64(cc)), row0, length,
                  chunk * rows_per_tile + rows_per_tile <= length)
        settle(drawn, pending)                    # (read after the barrier below)
        # Each step down its rows, after the warp's steps before (an exclusive scan keeps the
        # items before each: lane (0, c) of step 0 has none, and its slot is not read).
        carry = get(vals, 0)
        for k in range(steps):
            inc = scan_step(get(vals, k), h, FULL_MASK)
            total = shfl_idx(FULL_MASK, inc, last_row + c) if per_step > 1 else inc
            if exclusive:
                before = shfl_up(FULL_MASK, inc, width)
                if k > 0:
                    before = carry if h == 0 else combine(carry, before)
                put(vals, k, before)
            else:
                put(vals, k, inc if k == 0 else combine(carry, inc))
            carry = total if k == 0 else combine(carry, total)
        if h == 0:
            put(totals, w * width + c, carry)
        cuda.syncthreads()
        if w == 0:                                # the tile's columns: fold, look back
            aggregate = get(totals, c)
            for v in range(1, warps):
                aggregate = combine(aggregate, get(totals, v * width + c))
            chain = (np.int64(a) * cols + cc) * chunks
            lb = words if packed else (words[0], words[1], aggs, pres)
            above = look_back(aggregate, chain, np.int64(chunk), lb, np.uint32(drawn[1]), c < cols)
            if h == 0:
                if chunk == 0:
                    put(carries, c, init)         # (inclusive: not read)
                else:
                    put(carries, c, combine(init, above) if has_init else above)
        cuda.syncthreads()
        have = exclusive or chunk > 0
        run = get(carries, c)
        for v in range(warps):
            if v < w:
                inside = get(totals, v * width + c)
                run = combine(run, inside) if have else inside
                have = True
        if c < cols:
            mine_out = view_out(row_out(outs, np.uint64(a), np.uint64(c)), np.uint64(row0))
            for k in range(steps):
                if row0 + k * per_step < length:
                    v = get(vals, k)
                    if exclusive and k == 0 and h == 0:
                        v = run
                    elif have:
                        v = combine(run, v)
                    store_out(mine_out, np.uint32(k * per_step), to_out(v))

    if ids == "overlap" and NARROW_OVERLAP_THREADS:
        # (float32: overlap's held draw takes 64 registers to 80, 8 -> 6 blocks of 128 an SM)
        nt = 32 * warps
        scan_narrow_columns.jit_options = {"launch_bounds": (nt, max(1, NARROW_OVERLAP_THREADS // nt))}
    return scan_narrow_columns


def narrow_tiles(lay, in_vt, acc_vt):
    """``(width, warps, steps, tiles)`` of :func:`narrow_columns_kernel` for ``lay``."""
    width = narrow_width(lay.C)
    warps, steps = narrow_tile(in_vt, acc_vt)
    rows_per_tile = warps * steps * (32 // width)
    return width, warps, steps, lay.A * -(-lay.L // rows_per_tile)


# --- gather (views that are not three merged groups) -----------------------------------------

@functools.lru_cache(maxsize=None)
def gather_kernel(in_vt, out_vt, ndim, flat_out, transform=None):
    """Kernel ``(xs, outs, n)``: ``outs`` = ``xs`` (``ndim``-D) in C order, cast to
    ``out_vt``; ``outs`` is 1-D (``flat_out``) or of ``xs``'s shape. ``transform``:
    None or an ops.Transform applied to each item (a tuple input's tuple of items)
    on its way, so the scan in place after it reads the input once."""
    idx = ", ".join("np.uint64(i%d)" % d for d in range(ndim))
    lines = ["def gather(x, o, n):",
             "    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x",
             "    step = cuda.gridDim.x * cuda.blockDim.x",
             "    shape = %s.shape" % in_vt._field("x", 0),
             "    while i < n:",
             "        r = i"]
    for d in range(ndim - 1, 0, -1):
        lines += ["        i%d = r %% shape[%d]" % (d, d), "        r = r // shape[%d]" % d]
    lines.append("        i0 = r")
    at = "np.uint64(i)" if flat_out else idx
    env = {"O%d" % i: f.type for i, f in enumerate(out_vt.fields)}
    if transform is None:
        for f in range(in_vt.arity):
            lines.append("        %s[%s] = O%d(%s[%s])" % (out_vt._field("o", f), at, f, in_vt._field("x", f), idx))
    else:
        env["tf"] = transform.device(in_vt)
        lines.append("        v = tf(%s)" % in_vt._pack(["%s[%s]" % (in_vt._field("x", f), idx)
                                                           for f in range(in_vt.arity)]))
        for f in range(out_vt.arity):
            lines.append("        %s[%s] = O%d(%s)" % (out_vt._field("o", f), at, f, out_vt._field("v", f)))
    lines.append("        i += step")
    return _codegen.build("\n".join(lines) + "\n", "gather", env, device=False)


def _grid(b, work, nt, per_sm):
    """Blocks for ``work`` threads of ``nt``: no more than ``per_sm`` per SM (grid-stride)."""
    return max(1, min(-(-work // nt), _launch.sm_count(b.device_id) * per_sm))


def _threads():
    """Threads per block of the lanes, columns and gather kernels."""
    return 32 if config.ENABLE_CUDASIM else 256


def gather(b, in_vt, out_vt, xs, outs, n, transform=None):
    """Add the launch copying ``xs`` (N-D) into ``outs`` in C order, cast (through
    ``transform`` where given)."""
    nd = (xs[0] if in_vt.is_tuple else xs).ndim
    flat = (outs[0] if out_vt.is_tuple else outs).ndim == 1 and nd != 1
    nt = _threads()
    key = ("scan_gather", in_vt, out_vt, nd, flat) + ((transform,) if transform is not None else ())
    b.launch(gather_kernel(in_vt, out_vt, nd, flat, transform), key,
             _grid(b, n, nt, 8), nt, (xs, outs, n))


# --- launches ---------------------------------------------------------------------------------

def _column_chunks(b, lay):
    """(chunk, chunks) for the columns kernel: chunks enough for every column x
    chunk to fill the GPU's resident threads, each of COLUMN_MIN_CHUNK items or more."""
    target = _launch.sm_count(b.device_id) * 2048
    columns = lay.A * lay.C
    chunks = min(-(-target // columns), -(-lay.L // COLUMN_MIN_CHUNK))
    chunks = max(1, chunks)
    chunk = -(-lay.L // chunks)
    return chunk, -(-lay.L // chunk)


def narrow_pays(acc_vt):
    """Whether the narrow columns beat the column tiles for accumulators of ``acc_vt``,
    whatever their look-back states (:func:`.scan.state_layout`). Measured in
    session 34 (H200, (2^22, 4) along axis 0, us, narrow in 4 x 32 tiles against the column
    tiles): float32 (packed states) 50.2 / 81.4, and (2^23, 2) 47.8 / 156; int32 (packed)
    61.5 / 96.7 (8 x 16 tiles); float64 (wide) 121 / 166; int32 summed as int64 (pair)
    81.7 / 107. Tuples above 8 bytes are unmeasured: the tiles."""
    return acc_vt.itemsize <= NARROW_BYTES


def _columns_route(b, lay, algorithm, narrow_ok):
    """How a columns layout runs: 'one' (a thread per column walks all of it:
    columns enough to fill the GPU), 'strips' (:func:`column_strips_kernel`: strips
    enough to fill it, 4096+ columns of 4-byte items), 'narrow'
    (:func:`narrow_columns_kernel`: NARROW_COLUMNS columns or fewer, where ``narrow_ok``,
    :func:`narrow_pays`), else 'tiles'
    (:func:`column_tiles_kernel`, one pass), or 'spine' for ``algorithm="reduce_then_scan"`` (upsweep, a scan of
    the chunk folds, downsweep: 3 launches, the input read twice, but a fixed
    order of operations, so floating-point results are the same bits every run)."""
    if _column_chunks(b, lay)[1] == 1:
        return "one"
    if algorithm == "reduce_then_scan":
        return "spine"
    if _strip_width(b, lay):
        return "strips"
    return "narrow" if lay.C <= NARROW_COLUMNS and narrow_ok else "tiles"


def _column_tiles(lay, in_vt, acc_vt):
    """``(tc, ty, per, col_strips, strips, tiles)`` of :func:`column_tiles_kernel` for
    ``lay``: up to COLUMN_TILE_WIDTH columns a tile (the power of two >= C), the
    block's other threads down the rows, ``per`` rows each (the scan tile's items
    per thread, fewer for short columns)."""
    from . import scan as S
    tc = min(COLUMN_TILE_WIDTH, 1 << max(0, (lay.C - 1).bit_length()))
    ty = _threads() // tc
    return column_tile_grid(lay, tc, ty, max(1, min(S.tile_for(in_vt, acc_vt).vt, -(-lay.L // ty))))


def column_tile_grid(lay, tc, ty, per):
    """``(tc, ty, per, col_strips, strips, tiles)`` for tiles of ``tc`` columns by ``ty``
    threads of ``per`` rows over ``lay``."""
    col_strips = -(-lay.C // tc)
    strips = lay.A * col_strips
    return tc, ty, per, col_strips, strips, strips * -(-lay.L // (ty * per))


def scratch_bytes(b, lay, op, in_vt, acc_vt, out_vt, var, algorithm=None):
    """Workspace bytes :func:`add_launches` carves for ``lay`` (mirrors it)."""
    from . import scan as S
    if lay.kind == "columns":
        route = _columns_route(b, lay, algorithm, narrow_pays(acc_vt))
        if route == "one":
            return S._bytes(acc_vt, 1)
        if route == "strips":
            return 0
        layout = S.state_layout(var.states, acc_vt, in_vt)
        if route == "narrow":
            return S.tile_state_bytes(layout, acc_vt, narrow_tiles(lay, in_vt, acc_vt)[3] * lay.C)
        if route == "tiles":
            tc, tiles = _column_tiles(lay, in_vt, acc_vt)[0::5]
            return S.tile_state_bytes(layout, acc_vt, tiles * tc)
        chunks = _column_chunks(b, lay)[1]
        spine = Layout("segments" if chunks <= LANE_ROW else "tiles", lay.A * lay.C, chunks, 1, None, None)
        return S._bytes(acc_vt, lay.A * lay.C * chunks) + scratch_bytes(b, spine, op, acc_vt, acc_vt, acc_vt, var)
    if lay.kind == "tiles":
        tile = row_tile(in_vt, acc_vt, lay.L)
        tiles = lay.A * lay.C * -(-lay.L // (tile.nt * tile.vt))
        return S._bytes(out_vt, 1) + S.tile_state_bytes(S.state_layout(var.states, acc_vt, in_vt), acc_vt, tiles)
    return 0


def add_launches(b, lay, op, in_vt, acc_vt, out_vt, kind, xs, outs, init, has_init, ws, offset, var,
                 transform=None, algorithm=None):
    """Add the launches of a scan of layout ``lay`` (not 'flat') to builder ``b``:
    ``xs``/``outs`` are the 3-D views (:func:`windows`); ``init`` a value of
    ``acc_vt`` (an exclusive scan's start; any value for inclusive ones);
    ``ws``/``offset``: workspace to carve (:func:`scratch_bytes` bytes);
    ``transform``: None or an ops.Transform of ``in_vt``'s items, fused into every
    kernel's loads of ``xs`` (a spine of folds has none); ``algorithm``: the
    caller's, which picks the columns route (:func:`_columns_route`)."""
    from . import scan as S
    tf = (transform,) if transform is not None else ()       # in launch keys (none: as before)
    rows = lay.A * lay.C
    if lay.kind == "segments":
        per_lane = SEGMENT_STEPS
        rows_per_warp = max(1, 32 * per_lane // lay.L)
        nt = _threads()
        grid = _grid(b, -(-rows // rows_per_warp) * 32, nt, 8)
        aligned = lay.L if ALIGNED_SEGMENTS and 1 < lay.L <= 32 and 32 % lay.L == 0 else 0
        b.launch(segments_kernel(op, in_vt, acc_vt, out_vt, kind, per_lane, transform, aligned),
                 ("scan_segments", op, in_vt, acc_vt, out_vt, kind, per_lane) + tf + ((aligned,) if aligned else ()),
                 grid, nt, (xs, outs, rows, lay.L, rows_per_warp, init))
        return
    if lay.kind == "lanes":
        group = 1 << max(0, math.ceil(math.log2(max(1, min(lay.L, 32)))))
        per_lane = ROWS_PER_LANE
        nt = _threads()
        groups = -(-rows // per_lane)
        grid = _grid(b, groups * group, nt, 8)
        split = lay.C > 1
        b.launch(lanes_kernel(op, in_vt, acc_vt, out_vt, kind, group, per_lane, split, transform),
                 ("scan_lanes", op, in_vt, acc_vt, out_vt, kind, group, per_lane, split) + tf, grid, nt,
                 (xs, outs, rows, lay.C, init))
        return
    if lay.kind == "tiles":
        tile = row_tile(in_vt, acc_vt, lay.L)
        per_row = -(-lay.L // (tile.nt * tile.vt))
        tiles = rows * per_row
        totals, offset = S._carve(ws, offset, out_vt.plain, 1)    # never written
        spelling = "index" if lay.inp[1][1] < 0 else "slice"       # (registers: _row_view)
        if per_row == 1:
            spec = S.Spec(op, in_vt, acc_vt, out_vt, tile, kind, "single_block",
                          var._replace(states=None, poll=None, ids=None), transform)
            b.launch(tiles_kernel(spec, spelling), ("scan_tiles", spec, spelling), tiles, tile.nt,
                     (xs, outs, per_row, tiles, lay.C, totals, totals, totals, totals, init, has_init, totals))
            return
        var = S.single_pass_variant(var, acc_vt, in_vt)
        spec = S.Spec(op, in_vt, acc_vt, out_vt, tile, kind, "single_pass", var, transform)
        st, states, aggs, pres, offset = S.tile_states(b, var.states, acc_vt, tiles, ws, offset)
        b.launch(tiles_kernel(spec, spelling), ("scan_tiles", spec, spelling), tiles, tile.nt,
                 (xs, outs, per_row, tiles, lay.C, st.counter, states, aggs, pres, init, has_init, totals))
        return
    # columns
    route = _columns_route(b, lay, algorithm, narrow_pays(acc_vt))
    states = S.state_layout(var.states, acc_vt, in_vt)          # (the column routes' look-backs)
    if route == "strips":
        tc = _strip_width(b, lay)
        per = strip_items(acc_vt)
        col_strips = -(-lay.C // tc)
        b.launch(column_strips_kernel(op, in_vt, acc_vt, out_vt, kind, tc, per, transform),
                 ("scan_column_strips", op, in_vt, acc_vt, out_vt, kind, tc, per) + tf,
                 lay.A * col_strips, 32 * tc, (xs, outs, col_strips, init))
        return
    if route == "narrow":
        width, warps, steps, tiles = narrow_tiles(lay, in_vt, acc_vt)
        st, words, aggs, pres, offset = S.tile_states(b, states, acc_vt, tiles * lay.C, ws, offset)
        ids = "ticket" if var.ids == "auto" else var.ids          # (overlap unmeasured here)
        b.launch(narrow_columns_kernel(op, in_vt, acc_vt, out_vt, kind, width, warps, steps, states, var.poll,
                                       transform, ids),
                 ("scan_narrow_columns", op, in_vt, acc_vt, out_vt, kind, width, warps, steps, states, var.poll,
                  ids) + tf,
                 tiles, 32 * warps, (xs, outs, tiles, st.counter, words, aggs, pres, init, has_init))
        return
    if route == "tiles":
        tc, ty, per, col_strips, strips, tiles = _column_tiles(lay, in_vt, acc_vt)
        st, words, aggs, pres, offset = S.tile_states(b, states, acc_vt, tiles * tc, ws, offset)
        ids = S.tile_ids(var.ids, states, acc_vt)
        b.launch(column_tiles_kernel(op, in_vt, acc_vt, out_vt, kind, tc, ty, per, states, var.poll, transform,
                                     ids),
                 ("scan_column_tiles", op, in_vt, acc_vt, out_vt, kind, tc, ty, per, states, var.poll, ids) + tf,
                 tiles, tc * ty, (xs, outs, tiles, strips, col_strips, tiles // strips, st.counter, words, aggs,
                                  pres, init, has_init))
        return
    chunk, chunks = _column_chunks(b, lay)
    nt = _threads()
    work = rows * chunks
    grid = _grid(b, work, nt, 16)
    if route == "one":
        dummy, offset = S._carve(ws, offset, acc_vt, 1)
        parts = windows(dummy, (0, (0, 0, 0)), lay._replace(A=1, L=1, C=1))
        b.launch(columns_kernel(op, in_vt, acc_vt, out_vt, kind, "down", COLUMN_UNROLL, transform),
                 ("scan_columns", op, in_vt, acc_vt, out_vt, kind, "down") + tf, grid, nt,
                 (xs, outs, chunk, chunks, lay.C, parts, init, has_init))
        return
    flat, offset = S._carve(ws, offset, acc_vt, rows * chunks)
    spine = Layout("segments" if chunks <= LANE_ROW else "tiles", rows, chunks, 1,
                   (0, (chunks, 1, 1)), (0, (chunks, 1, 1)))
    parts = windows(flat, spine.inp, spine)
    b.launch(columns_kernel(op, in_vt, acc_vt, acc_vt, kind, "up", COLUMN_UNROLL, transform),
             ("scan_columns", op, in_vt, acc_vt, acc_vt, kind, "up") + tf, grid, nt,
             (xs, parts, chunk, chunks, lay.C, parts, init, has_init))
    run = segment_windows(flat, (0, (0, 1, 0)), spine) if spine.kind == "segments" else parts
    add_launches(b, spine, op, acc_vt, acc_vt, acc_vt, "inclusive", run, run, init, False, ws, offset, var)
    b.launch(columns_kernel(op, in_vt, acc_vt, out_vt, kind, "down", COLUMN_UNROLL, transform),
             ("scan_columns", op, in_vt, acc_vt, out_vt, kind, "down") + tf, grid, nt,
             (xs, outs, chunk, chunks, lay.C, parts, init, has_init))
