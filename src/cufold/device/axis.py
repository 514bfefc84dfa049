"""Reductions along axes of N-D arrays (and of views that are not one contiguous
run), with NumPy's semantics: one layout planner, a kernel per layout.

The planner (:func:`plan_layout`, at plan time on the Program's placeholders)
turns (shape, strides, axes) into a *layout*:

1. size-1 dimensions are dropped;
2. where the operator commutes, reduced dimensions with negative strides are
   walked forwards (CuPy's reversed views) and all reduced dimensions are
   ordered by stride, so a transposed or permuted view reduces as the memory it
   covers; broadcast (zero-stride) dimensions go outermost. argmin/argmax (whose
   ties go to the lowest index, in any order) carry each dimension's C-order
   index stride, so the index an item gets is NumPy's wherever it is read.
   Non-commutative operators keep the view's C order;
3. neighbouring dimensions that chain (outer stride = inner stride x inner
   length; for argmin/argmax, index strides too) merge. Kept dimensions are ordered by stride too, each carrying its
   stride in the (C-order) result, and merge where they chain in both;
4. the layout is classified by where the smallest stride is:

=============  ===========================================  ====================================
layout         when                                          kernel
=============  ===========================================  ====================================
contiguous     one output, the reduced data one run          the device-wide reduce
               (``x.T.sum()``, reversed or strided            (:mod:`.reduce`, single pass;
               vectors)                                       8-byte loads at stride 1;
                                                              ``algorithm=`` applies)
rows           the innermost reduced dimension has the        ``rows``: a group of G threads per
               smallest stride (``x.sum(axis=-1)``, and        (output, chunk): G = 1..32 lanes
               full reductions of views that do not            for short rows (several rows a
               collapse: ``x[::2].sum()``)                     warp), a whole block for long rows
                                                               (>= ``long_row`` items); 4-byte
                                                               items 8 bytes a load where every
                                                               row starts 8-byte aligned
columns        a kept dimension has the smallest stride       ``columns``: a block of TX x TY
               (``x.sum(axis=0)``)                             threads, TX along the contiguous
                                                               kept dimension (coalesced), TY
                                                               along the reduced one (as many
                                                               as its items keep busy), combined
                                                               in shared memory; ``transposed``
                                                               where the results run along
                                                               another kept dimension: tiles of
                                                               results turned in shared memory
                                                               (whole sectors written)
=============  ===========================================  ====================================

A full reduction of a view in long contiguous runs (``x[::2].sum()``) by a commutative
operator whose indices rise with position takes the device-wide reduce over the runs' tiles
(:data:`RUNS`, ``reduce.Spec.runs``); so does the argmin/argmax of ``x.T``, whose indices
rise along each run only, a tile at a time (:data:`RETILE`). Otherwise a thread whose items
span whole innermost rows (a permuted array's argmax) walks them row by row: the outer
dimensions once a row.

Both kernels split an output's reduced items over several blocks (or warps)
when the outputs alone cannot fill the GPU: each writes its partial to the
workspace and the last to arrive (an atomic ticket per output or column tile,
reset by that last block, so no zeroing per call) folds them in order. So a
full reduction of a non-collapsing view runs on every SM, one launch. Every
case is one launch with no host synchronisation; everything is decided when
the Program is planned.

Order: commutative operators give a thread every G-th item (coalesced);
others give each thread a contiguous run of items, and threads, blocks and
partials are combined in sequence order, so the fold is NumPy's C order.

Floors (H200, copy bandwidth ~4.2 TB/s; ``bench axes`` prints % of floor):
the bytes of the 32-byte sectors a view touches, read once, over that
bandwidth: a (8192, 8192) float32 array is 256 MiB -> ~64 us whatever the
axis; ``x[:, ::2]`` touches every sector (~64 us), ``x[::2]`` half (~32 us).
"""

import collections
import functools
import os

import numpy as np
from numba import config, cuda

from .. import _codegen, block, warp
from ..host import arrays as _arrays, launch as _launch
from . import reduce as _reduce_mod
from ..ops import plus
from ..values import ValueType


#: Read 4-byte items of contiguous rows 8 bytes a load where aligned (``CUFOLD_WIDE_LOADS=0``:
#: never), as the device-wide reduce does.
WIDE_LOADS = _reduce_mod.WIDE_LOADS
#: Loads a thread issues before combining them (items of up to 4 bytes: UNROLL_SMALL, and
#: UNROLL_SUMS for sums whose threads fold at least 4 * UNROLL_SUMS items): enough bytes in
#: flight per SM to cover the memory latency at the 50% occupancy of MIN_BLOCKS. Long sums
#: take 16 (H200, (8192, 8192) along axis 0: sum 75.7 -> 71.2 us, mean 80.9 -> 70.8; torch
#: 75.2); max and argmax stay at 8, where 16 measured slower (71.8 -> 75.1 us: their compares
#: and NaN tests hold more registers); and so do short rows, whose last, partial batch
#: issues UNROLL - 1 guarded loads (a 3-item row's cost doubles at 16, see :func:`unroll_of`).
#: Rows read 8 bytes a load (pairs of 4-byte items) take the same counts, in pairs: at 4 pairs
#: a thread held 32 bytes in flight (H200, same run, 4 -> 8 pairs: the full argmax of A.T
#: 91.9 -> 74.0 us, A.sum(axis=1) 67.9 -> 64.5, y.max(axis=2) 20.6 -> 18.9). Wider items keep 4.
UNROLL = 4
UNROLL_SMALL = 8
UNROLL_SUMS = 16
#: Resident blocks per SM the rows and columns kernels are compiled for (``launch_bounds``:
#: registers capped at 64 for 256 threads): at 72-96 registers they ran 2-3 blocks, 24-33%
#: occupancy, too few loads in flight for the bandwidth (ncu, H100).
MIN_BLOCKS = 4
#: A thread a row (``group`` 1: rows of a few items) holds only its row's bytes in flight, so
#: it needs every thread an SM can hold: such kernels of 4-byte items whose accumulator has at
#: most two fields are compiled for 8 blocks of 256 (32 registers). ptxas sm_90, z = (2^24, 4)
#: float32 along axis 1: mean 40 -> 32 registers (a 16-byte spill outside the loops), argmax
#: 38 -> 26, sum and max 32 either way; mean_var's three fields would spill inside the loop.
THIN_ROW_BLOCKS = 8
#: A thread a row folds two of its rows at once (``CUFOLD_THIN_ROW_PAIRS=0``: one): both rows'
#: loads issue before either row's fold, twice the bytes in flight a thread. H200, z = (2^24, 4)
#: float32 along axis 1, two runs: max 90.1/90.9 -> 89.5/89.0 us (0.89-0.90 -> 0.90-0.91 of
#: the floor); sum, mean and argmax unchanged (within 0.5%): the sum's 0.93 was not held by
#: the bytes a thread has in flight (8 blocks of 256 an SM already hold 32 KiB).
THIN_ROW_PAIRS = os.environ.get("CUFOLD_THIN_ROW_PAIRS", "1") == "1"


def normalize_axis(axis, ndim):
    """A sorted tuple of distinct non-negative axes, with NumPy's errors."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError("cufold: axis must be an integer or a tuple of integers, got %r" % (a,))
        if not -ndim <= a < ndim:
            raise np.exceptions.AxisError(int(a), ndim)
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError("cufold: duplicate value in 'axis'")
    return tuple(sorted(out))


# --- the layout planner ------------------------------------------------------------

#: A planned layout. ``keep``: ((length, input stride, output stride), ...) outer to
#: inner; ``red``: ((length, stride, index stride), ...) outer to inner, where the index
#: stride steps the item's C-order index in the reduced space (argmin/argmax; else 0);
#: ``origin``: the offset (elements, from the view's element 0) of the first item of
#: output 0, ``index_origin`` its C-order index; ``kind``: 'contiguous', 'rows' or 'columns'.
Layout = collections.namedtuple("Layout", "kind keep red origin index_origin", defaults=(0,))


def _stride_order(stride):
    """Sort key putting outer dimensions first: broadcast ones, then by falling |stride|."""
    return (stride != 0, -abs(stride))


def _merge(dims, width):
    """Merge neighbours whose strides chain (in every one of ``width`` stride columns)."""
    out = []
    for d in dims:
        if out and all(out[-1][j] == d[j] * d[0] for j in range(1, width + 1)):
            prev = out.pop()
            d = (prev[0] * d[0],) + tuple(d[1:])
        out.append(tuple(d))
    return tuple(out)


def plan_layout(shape, strides, axes, reorder, indexed=False):
    """The :class:`Layout` of reducing a view (``shape``, element ``strides``) over
    ``axes``; ``reorder``: the reduced items may be visited in any order (a
    commutative operator); ``indexed``: the items' C-order indices are needed
    (argmin/argmax: then dimensions merge only where their indices chain too)."""
    ndim = len(shape)
    keep_dims = [d for d in range(ndim) if d not in axes]
    out_strides = {}
    size = 1
    for d in reversed(keep_dims):
        out_strides[d] = size
        size *= shape[d]
    index_strides = {}
    size = 1
    for d in reversed(axes):
        index_strides[d] = size if indexed else 0
        size *= shape[d]
    origin = index_origin = 0
    red = []
    for d in axes:
        n, s, i = shape[d], strides[d], index_strides[d]
        if n == 1:
            continue
        if reorder and s < 0:
            origin += (n - 1) * s
            index_origin += (n - 1) * i
            s, i = -s, -i
        red.append((n, s, i))
    if reorder:
        red.sort(key=lambda d: _stride_order(d[1]))
    red = _merge(red, 2) or ((1, 0, 0),)
    keep = [(shape[d], strides[d], out_strides[d]) for d in keep_dims if shape[d] != 1]
    keep.sort(key=lambda d: _stride_order(d[1]))
    keep = _merge(keep, 2)
    if not keep:
        # one run: the device-wide reduce, whose item numbers are C-order indices only unflipped
        one_run = len(red) == 1 and (not indexed or (red[0][2] == 1 and index_origin == 0))
        kind = "contiguous" if one_run else "rows"
    else:
        kind = "rows" if abs(red[-1][1]) <= abs(keep[-1][1]) else "columns"
    return Layout(kind, keep, red, origin, index_origin)


# --- limits (GPU or simulator) ----------------------------------------------------

#: nt: threads per block; long_row: items per output from which a whole block takes
#: a row; min_items: the fewest items per thread a split leaves; max_split: the most
#: chunks an output is split into; blocks: resident blocks the grid aims to fill;
#: resident: blocks of the (64-register, MIN_BLOCKS) axis kernels the GPU holds at once.
Limits = collections.namedtuple("Limits", "nt long_row min_items max_split blocks resident")


#: The simulator's: tiny blocks, so that small test arrays cross warp, block and split boundaries.
SIMULATOR_LIMITS = Limits(64, 256, 2, 8, 4, 4)


def limits(device_id):
    """The planner's limits on GPU ``device_id`` (:data:`SIMULATOR_LIMITS` in the simulator)."""
    if config.ENABLE_CUDASIM:
        return SIMULATOR_LIMITS
    # 256 threads, 8 blocks an SM: a full H100/H200. 16 items a thread at least keep
    # enough loads in flight per split chunk; 4096-item rows fill a 256-thread block.
    sms = _launch.sm_count(device_id)
    return Limits(256, 4096, 16, 1024, sms * 8, sms * MIN_BLOCKS)


def index_rises(red):
    """Whether the C-order index of the reduced items ``red`` ((length, stride, index
    stride), outer to inner) grows with their position: then every fold, which takes a
    thread's items in rising position, takes them in rising index (argmin/argmax's cheap
    update, ``reduce.Spec.rising``). Rows along the contiguous axis and ``x[::2]`` rise;
    a transposed view, read in memory order, does not."""
    span = 0                  # the largest index offset within the inner dimensions
    for n, _, i in reversed(red):
        if n == 1:
            continue
        if i <= span:
            return False
        span += (n - 1) * i
    return True


def _pow2_at_least(n):
    p = 1
    while p < n:
        p *= 2
    return p


def _pow2_at_most(n):
    """The largest power of two <= ``n`` (1 for ``n`` < 2)."""
    return max(1, _pow2_at_least(n + 1) // 2)


#: How a layout runs: kernel 'rows' or 'columns'; rows: ``group`` threads per output
#: chunk; columns: ``tx`` x ``ty`` threads a block; ``split`` chunks per output (1: none),
#: ``chunk`` items per chunk, ``grid`` blocks, ``nt`` threads a block; columns with
#: ``ty == 1``: ``per`` neighbouring outputs a thread, or (``tb`` > 0) tiles of
#: ``tx`` x ``tb`` outputs turned in shared memory (:func:`transposed_tile`).
Schedule = collections.namedtuple("Schedule", "kernel group tx ty split chunk grid nt per tb", defaults=(1, 0))

#: The side of a transposed output tile: a warp's width along the input's contiguous
#: kept dimension; ``TRANSPOSED_ROWS`` (a multiple of nt / 32) along the output's.
TRANSPOSED_COLUMNS = int(os.environ.get("CUFOLD_TRANSPOSED_COLUMNS", "32"))
TRANSPOSED_ROWS = int(os.environ.get("CUFOLD_TRANSPOSED_ROWS", "64"))
#: Columns with one reduced dimension whose neighbouring outputs are neighbours in memory:
#: a thread folds two of them through 8-byte loads (``CUFOLD_COLUMN_PAIRS=0``: one a thread).
#: H200, same run: y.max(axis=0) of (64, 3, 65536) 20.0 -> 17.0 us (torch 18.5), its argmax
#: 24.4 -> 16.9 (with the rising update).
COLUMN_PAIRS = os.environ.get("CUFOLD_COLUMN_PAIRS", "1") == "1"


#: Rows of argmin/argmax take a block from this many times ``Limits.long_row`` items: the
#: block-wide combine of (value, index) pairs (shared memory, two barriers) cost more than a
#: warp's lanes folding the row's items (H200, 8192 rows of 8192 float32: a block a row
#: 107.4 us, a warp 77.0; x[:, ::2], rows of 4096: 77.3 -> 65.7; torch 120.2 and 68.8).
#: One-field sums and maxima measured the same either way.
INDEXED_LONG_ROW = 4


def schedule(layout, lim, indexed=False):
    """Threads, blocks and splits for ``layout`` (not 'contiguous') under ``lim``;
    ``indexed``: an argmin/argmax (see :data:`INDEXED_LONG_ROW`)."""
    nt = lim.nt
    m = int(np.prod([d[0] for d in layout.keep], dtype=np.int64)) if layout.keep else 1
    k = int(np.prod([d[0] for d in layout.red], dtype=np.int64))
    target_threads = lim.blocks * nt
    if layout.kind == "rows":
        if m == 1 or k >= lim.long_row * (INDEXED_LONG_ROW if indexed else 1):
            group = nt
        else:
            group = min(32, _pow2_at_least(-(-k // 4)))
        split = 1
        if group >= 32 and m * group < target_threads:
            split = min(-(-target_threads // (m * group)), max(1, k // (group * lim.min_items)), lim.max_split)
        chunk = -(-k // split)
        split = -(-k // chunk)               # no empty chunk
        work = m * split
        per_block = nt // group
        grid = max(1, min(-(-work // per_block), lim.blocks * 32))
        return Schedule("rows", group, 0, 0, split, chunk, grid, nt)
    # TX along the kept dimension (at least a warp's worth where it is that long, so loads
    # coalesce), TY along the reduced one: no more threads than the items keep busy
    # (min_items each), the rest of the block on more columns.
    # No more threads than one round of blocks holds where the columns alone fill it: threads
    # beyond it only add shared-memory trees (H200, (64, 3, 65536) along axis 0, 196608
    # columns of 64 items: 4 threads a column 19.1 us, 1 thread 16.6; along (0, 1), 65536
    # columns: 8 threads 18.2 us, 2 threads 15.6; torch 17.1 and 16.4).
    inner = layout.keep[-1][0]
    ty = min(nt // min(32, _pow2_at_least(inner)), _pow2_at_least(-(-k // lim.min_items)),
             _pow2_at_most(lim.resident * nt // m))
    tx = nt // ty
    # A column of a few items (one thread each) costs more in finding its place than in
    # reading it: give a thread two neighbouring outputs (one unravel for both) where the
    # tiles still fill the GPU. Not four: a warp's load then spans 512 bytes for 128 used,
    # each sector fetched by four loads (H200, y.sum(axis=1) of (64, 3, 65536): 1 output a
    # thread 50.8 us, 2 25.5, 4 30.3; torch 25.9).
    # Neighbouring outputs contiguous in the input, one reduced dimension: two a thread read
    # 8 bytes a load (where the data align, :func:`plan_axes`) whatever the count of tiles.
    pairs = COLUMN_PAIRS and layout.keep[-1][1] == 1 and len(layout.red) == 1
    per = 2 if ty == 1 and inner % 2 == 0 and (m // (tx * 2) >= lim.blocks or pairs) else 1
    if ty == 1:
        tiled = transposed_tile(layout, m, lim)
        if tiled:
            return tiled
    return columns_schedule(m, k, ty, per, lim)


def output_contiguous_dim(keep):
    """The index in ``keep`` (a layout's kept dimensions, by falling input stride) of the
    one the results run along (output stride 1), or None."""
    for d, (n, s_in, s_out) in enumerate(keep):
        if s_out == 1:
            return d
    return None


def transposed_tile(layout, m, lim):
    """The 'transposed' Schedule of ``layout`` (:func:`transposed_kernel`), or None where
    it does not pay.

    Where the kept dimension read coalesced (the input's contiguous one, A) is not the one
    the results run along (B), a warp's 32 results land ``stride`` apart: each int64 in its
    own 32-byte sector, (64, 3, 65536) permuted (1, 2, 0) along axis 0 wrote 4x its bytes
    (argmax 120 us against torch's 102; float32 sum 65 us). A block instead folds a tile
    of 32 along A x ``TRANSPOSED_ROWS`` along B, a thread a column at a time, keeps the
    results in shared memory and writes them along B: whole sectors. Taken where A and B
    are long enough to fill a tile's warps and the tiles alone fill the GPU (no split)."""
    keep = layout.keep
    b = output_contiguous_dim(keep)
    if b is None or b == len(keep) - 1:
        return None
    n_a, _, a_out = keep[-1]
    n_b = keep[b][0]
    ta = min(TRANSPOSED_COLUMNS, lim.nt)
    rows = lim.nt // ta
    tb = max(rows, min(TRANSPOSED_ROWS, _pow2_at_least(n_b)) // rows * rows)
    if a_out < 4 or n_a < ta // 2 or n_b < rows:
        return None
    tiles = (m // (n_a * n_b)) * -(-n_a // ta) * -(-n_b // tb)
    if tiles < lim.blocks:
        return None
    k = int(np.prod([d[0] for d in layout.red], dtype=np.int64))
    return Schedule("transposed", 0, ta, 1, 1, k, min(tiles, lim.blocks * 32), lim.nt, 1, tb)


def columns_schedule(m, k, ty, per, lim):
    """The 'columns' Schedule of ``m`` outputs of ``k`` items each, ``ty`` threads along
    the reduced axis (``lim.nt // ty`` columns a block) and ``per`` outputs a thread: split
    across blocks where the column tiles do not fill the GPU."""
    nt = lim.nt
    tx = nt // ty
    tiles = -(-m // (tx * per))
    split = 1
    if tiles < lim.blocks and per == 1:        # (a thread's outputs are folded whole)
        split = min(-(-lim.blocks // tiles), max(1, k // (ty * lim.min_items)), lim.max_split)
    chunk = -(-k // split)
    split = -(-k // chunk)
    grid = max(1, min(tiles * split, lim.blocks * 32))
    return Schedule("columns", 0, tx, ty, split, chunk, grid, nt, per)


# --- device helpers -----------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _unravel(nd):
    """Device function ``(r, shape, a_strides, b_strides) -> (a, b)``: number ``r`` over
    ``nd`` dimensions (C order) as offsets along two sets of strides at once (input
    offset and index, or input and output offsets; ``nd`` 0: both 0)."""
    if nd == 0:
        @cuda.jit(device=True)
        def unravel0(r, shape, a_strides, b_strides):
            return r * 0, r * 0
        return unravel0
    if nd == 1:
        @cuda.jit(device=True)
        def unravel1(r, shape, a_strides, b_strides):
            return r * a_strides[0], r * b_strides[0]
        return unravel1

    # Unsigned division: no floor-division sign fix-ups, and the compiler's 32-bit fast
    # path whenever both operands fit (a per-output unravel made short columns
    # instruction-bound on the H100).
    @cuda.jit(device=True)
    def unravel(r, shape, a_strides, b_strides):
        a = r * 0
        b = r * 0
        q = np.uint64(r)
        for d in range(nd - 1, -1, -1):
            n = np.uint64(shape[d])
            nq = q // n
            j = np.int64(q - nq * n)
            a += j * a_strides[d]
            b += j * b_strides[d]
            q = nq
        return a, b
    return unravel


def unroll_of(spec, items_per_thread):
    """How many loads :func:`_thread_fold` issues ahead of their combines (see UNROLL).

    A thread that folds fewer items than that (a short row or column, whole) gets exactly
    its count (at least 2): one full batch, where the general batch would issue its
    ``unroll - 1`` guarded loads and selects for every output (y.sum(axis=1) of (64, 3,
    65536), 3 items an output: 74 instructions an item at 25% of DRAM bandwidth, H200)."""
    if spec.in_vt.is_tuple or spec.in_vt.itemsize > 4:
        base = UNROLL
    else:
        # (measured for float32 items summed in float32 or compensated float32; wider
        # accumulators, int64 for int32 items, hold more registers: they keep 8)
        narrow = spec.acc_vt.itemsize <= 4 or spec.lift == "compensated"
        base = UNROLL_SUMS if spec.op is plus and narrow and items_per_thread >= 4 * UNROLL_SUMS else UNROLL_SMALL
    return max(2, min(base, items_per_thread))


#: A thread walks its items row by row (:func:`_thread_fold`'s walk ``"rows"``) where it
#: takes at least this many items of each innermost reduced row.
ROW_WALK_ITEMS = 8


def walk_of(length, step, nd_outer):
    """How a fold with ``step`` between a thread's items (1: a contiguous run) walks
    innermost reduced rows of ``length`` items (see :func:`_thread_fold`)."""
    if nd_outer == 0:
        return "items"
    if length >= ROW_WALK_ITEMS * step:
        return "rows"
    if nd_outer == 1 and step % length == 0:
        return "lattice"
    return "items"


@functools.lru_cache(maxsize=None)
def _thread_fold(spec, nd_outer, unroll, walk="items"):
    """As :func:`_thread_fold_items` (``walk`` "items": the outer dimensions stepped an item
    at a time), or through the one-dimension fold: ``"rows"``, the items of one innermost
    row at a time, the outer dimensions walked once a row; ``"lattice"`` (one outer
    dimension, ``step`` a multiple of the rows' length), a thread's items all at one
    innermost index, a line down the outer dimension (a full argmax of z.T of (2^24, 4):
    rows of 4 items). A full argmax of a view that does not collapse (x.T, a permuted 3-D
    array) spent ~25 instructions an item in the per-item walk (carries, branches, the
    index): instruction-bound at a third of the bandwidth (H200)."""
    if walk == "items" or nd_outer == 0:
        return _thread_fold_items(spec, nd_outer, unroll)
    fold_line = _line_fold(spec, unroll)
    if walk == "lattice":
        @cuda.jit(device=True)
        def fold_lattice(state, have, xs, base, k, k_end, step, inner, outer_shape, outer_strides,
                         outer_index_strides):
            if k >= k_end:
                return state, have
            length = inner[0]
            r = k // length
            i = k - r * length
            line = (outer_shape[0], outer_strides[0], outer_index_strides[0], inner[3] + i * inner[2], inner[4])
            state, have, _ = fold_line(state, have, xs, base + i * inner[1], r, (k_end - i + length - 1) // length,
                                       step // length, line, outer_shape, outer_strides, outer_index_strides)
            return state, have
        return fold_lattice
    outer_at = _unravel(nd_outer)

    @cuda.jit(device=True)
    def fold(state, have, xs, base, k, k_end, step, inner, outer_shape, outer_strides, outer_index_strides):
        if k >= k_end:
            return state, have
        length = inner[0]
        r = k // length
        i = k - r * length
        while k < k_end:
            roff, ridx = outer_at(r, outer_shape, outer_strides, outer_index_strides)
            i_end = min(length, i + (k_end - k))
            # (the line's fold returns where its next item would be: no division a line; a
            # step below the length, as "rows" walks have, lands in the next row at most)
            state, have, i_next = fold_line(state, have, xs, base + roff, i, i_end, step,
                                            (inner[0], inner[1], inner[2], inner[3] + ridx, inner[4]),
                                            outer_shape, outer_strides, outer_index_strides)
            k += i_next - i
            i = i_next
            if i >= length:
                i -= length
                r += 1
        return state, have

    return fold


@functools.lru_cache(maxsize=None)
def _line_fold(spec, unroll):
    """:func:`_thread_fold_items` over one line (no outer dimensions) for the walks of
    :func:`_thread_fold`. Along a line whose index stride is positive the C-order index
    rises even where the thread's items as a whole do not (a transposed view read in
    memory order: ``spec.rising`` false): argmin/argmax then fold the line into a state of
    its own with the rising update (value and first NaN only) and combine it into the
    thread's state, one general combine a line, not one an item (the full argmax of x.T of
    (8192, 8192): 136 instructions an 8-item trip against rows' 85, ptxas sm_90). A line
    walked against its index (a reversed view) takes the general update. Returns
    ``(state, have, k)``: ``k`` where the thread's next item after ``k_end`` would be."""
    rising = spec._replace(rising=True)
    fold_general = _thread_fold_items(spec, 0, unroll, ends=True)
    if spec.lift != "index" or spec.rising or _reduce_mod._rising_update(rising) is None:
        return fold_general
    fold_rising = _thread_fold_items(rising, 0, unroll, ends=True)
    combine = spec.op.combine(spec.acc_vt)

    @cuda.jit(device=True)
    def fold_line(state, have, xs, base, k, k_end, step, inner, outer_shape, outer_strides, outer_index_strides):
        if inner[2] <= 0:
            return fold_general(state, have, xs, base, k, k_end, step, inner, outer_shape, outer_strides,
                                outer_index_strides)
        line, line_have, k = fold_rising(state, False, xs, base, k, k_end, step, inner, outer_shape,
                                         outer_strides, outer_index_strides)
        if not line_have:
            return state, have, k
        return (combine(state, line) if have else line), True, k

    return fold_line


@functools.lru_cache(maxsize=None)
def _thread_fold_items(spec, nd_outer, unroll, across=False, ends=False):
    """Device function ``(state, have, xs, base, k, k_end, step, inner, outer_shape,
    outer_strides, outer_index_strides) -> (state, have)``: fold items ``k, k + step,
    ...`` (< ``k_end``) of one output's reduced space, whose innermost dimension is
    ``inner = (length, stride, index stride, index origin, pair step)`` and whose outer
    ones are ``outer_*``; item 0 is at ``base``. Where loads are wide (8-byte pairs of
    4-byte items, positions and lengths counted in pairs), a pair's second item's index is
    its first's plus ``pair step``. Positions advance by additions (no division
    per item); ``unroll`` loads (:func:`unroll_of`) are issued ahead of their
    combines, in the last, partial batch too (a short row's items
    are one round trip to memory, not one each). An item's number for the
    lift is its C-order index (argmin/argmax), else its position ``k``.

    ``across`` (wide, one reduced dimension): a pair's two items belong to two neighbouring
    outputs, not to one: ``(..., outer_index_strides, state_b) -> (state, have, state_b)``,
    the lower items folded into ``state``, the upper into ``state_b``.

    ``ends`` (one reduced dimension): ``-> (state, have, k)``, ``k`` the position of the
    thread's next item past ``k_end`` (where a walk over rows resumes, without a division)."""
    if (across or ends) and nd_outer:
        raise ValueError("cufold: a fold across outputs or to its end walks one reduced dimension")
    if across and not spec.wide:
        raise ValueError("cufold: a fold across two outputs reads 8-byte pairs")
    start, update, _ = _reduce_mod._protocol(spec)
    load = spec.in_vt.load
    outer_at = _unravel(nd_outer)      # (offset, C-order index)
    indexed = spec.lift == "index"
    wide = spec.wide

    @cuda.jit(device=True)
    def advance(r, i, roff, ridx, step_r, step_i, length, outer_shape, outer_strides, outer_index_strides):
        i += step_i
        r2 = r + step_r
        if i >= length:
            i -= length
            r2 += 1
        if r2 != r:
            roff, ridx = outer_at(r2, outer_shape, outer_strides, outer_index_strides)
        return r2, i, roff, ridx

    @cuda.jit(device=True)
    def number(k, ridx, i, inner):
        if indexed:
            return inner[3] + ridx + i * inner[2]
        return k

    def first_update(pad, j):
        """Fold the first loaded value (``have`` tells start from update)."""
        if across:
            return [pad + "lo%d, hi%d = halves(x%d)" % (j, j, j),
                    pad + "state = update(state, lo%d, n%d) if have else start(lo%d, n%d)" % (j, j, j, j),
                    pad + "state_b = update(state_b, hi%d, n%d) if have else start(hi%d, n%d)" % (j, j, j, j),
                    pad + "have = True"]
        if wide:
            return [pad + "lo%d, hi%d = halves(x%d)" % (j, j, j),
                    pad + "state = update(state, lo%d, n%d) if have else start(lo%d, n%d)" % (j, j, j, j),
                    pad + "have = True", pad + "state = update(state, hi%d, n%d + inner[4])" % (j, j)]
        return [pad + "state = update(state, x%d, n%d) if have else start(x%d, n%d)" % (j, j, j, j),
                pad + "have = True"]

    def updates(pad, j):
        if across:
            return [pad + "lo%d, hi%d = halves(x%d)" % (j, j, j), pad + "state = update(state, lo%d, n%d)" % (j, j),
                    pad + "state_b = update(state_b, hi%d, n%d)" % (j, j)]
        if wide:
            return [pad + "lo%d, hi%d = halves(x%d)" % (j, j, j), pad + "state = update(state, lo%d, n%d)" % (j, j),
                    pad + "state = update(state, hi%d, n%d + inner[4])" % (j, j)]
        return [pad + "state = update(state, x%d, n%d)" % (j, j)]

    # The unrolled loop, generated for ``unroll`` items: all their loads issued before
    # the first combine (the loads, not the arithmetic, set the pace).
    walk = "outer_shape, outer_strides, outer_index_strides"
    if across:
        lines = _single_dim_fold(unroll, walk + ", state_b", first_update, updates, "state, have, state_b")
    elif ends:
        lines = _single_dim_fold(unroll, walk, first_update, updates, "state, have, k")
    elif nd_outer == 0:
        lines = _single_dim_fold(unroll, walk, first_update, updates)
    else:
        lines = _walking_fold(unroll, walk, first_update, updates)
    env = {"outer_at": outer_at, "number": number, "advance": advance, "load": load, "start": start,
           "update": update}
    if wide:     # xs holds 8-byte pairs of 4-byte items, the lower first
        env["load"] = _codegen.build("def load(pairs, i):\n    return pairs[np.uint64(i)]\n", "load")
        env["halves"] = _codegen.build(
            "def halves(p):\n    return np.uint32(p & LOW).view(DT), np.uint32(p >> SHIFT).view(DT)\n", "halves",
            {"DT": spec.in_vt.fields[0].type, "LOW": np.uint64(0xFFFFFFFF), "SHIFT": np.uint64(32)})
    fold = _codegen.build("\n".join(lines) + "\n", "fold", env)
    return fold


def _single_dim_fold(unroll, walk, first_update, updates, returned="state, have"):
    """``fold``'s source where one dimension is reduced (no outer ones): item ``k`` is at
    ``base + k * stride``, so offsets advance by one addition and item numbers are ``k``
    (the general walk's carries and branches per item made a 3-item column
    instruction-bound: 82% issue slots busy at 17% of DRAM bandwidth, H100)."""
    lines = ["def fold(state, have, xs, base, k, k_end, step, inner, %s):" % walk,
             "    if k >= k_end:", "        return " + returned,
             "    o = base + k * inner[1]", "    o_step = step * inner[1]", "    zero = k * 0",
             "    while k + %d * step < k_end:" % (unroll - 1)]
    lines += ["        x%d = load(xs, o + %d * o_step)" % (j, j) for j in range(unroll)]
    lines += ["        n%d = number(k + %d * step, zero, k + %d * step, inner)" % (j, j, j) for j in range(unroll)]
    lines += first_update("        ", 0)
    for j in range(1, unroll):
        lines += updates("        ", j)
    lines += ["        k += %d * step" % unroll, "        o += %d * o_step" % unroll]
    # the last, partial batch: every load first; past the end, item k is read again, not combined
    lines += ["    if k < k_end:", "        x0 = load(xs, o)"]
    lines += ["        x%d = load(xs, o + (%d * o_step if k + %d * step < k_end else zero))" % (j, j, j)
              for j in range(1, unroll - 1)]
    lines += ["        n%d = number(k + %d * step, zero, k + %d * step, inner)" % (j, j, j) for j in range(unroll - 1)]
    lines += first_update("        ", 0)
    for j in range(1, unroll - 1):
        lines += ["        if k + %d * step < k_end:" % j] + updates("            ", j)
    if returned.endswith(", k"):     # where the next item would be (fewer than unroll steps)
        lines += ["    while k < k_end:", "        k += step"]
    lines += ["    return " + returned]
    return lines


def _walking_fold(unroll, walk, first_update, updates):
    """``fold``'s source over an innermost reduced dimension and outer ones."""
    lines = ["def fold(state, have, xs, base, k, k_end, step, inner, %s):" % walk,
             "    if k >= k_end:", "        return state, have",
             "    length = inner[0]", "    stride = inner[1]",
             # (64-bit divisions cost ~40 instructions: a row's first item needs none)
             "    r = k // length if k >= length else k * 0", "    i = k - r * length",
             "    roff, ridx = outer_at(r, %s)" % walk,
             "    step_r = step // length if step >= length else step * 0",
             "    step_i = step - step_r * length",
             "    while k + %d * step < k_end:" % (unroll - 1)]
    for j in range(unroll):
        lines += ["        o%d = roff + i * stride" % j,
                  "        n%d = number(k + %d * step, ridx, i, inner)" % (j, j),
                  "        r, i, roff, ridx = advance(r, i, roff, ridx, step_r, step_i, length, %s)" % walk]
    lines += ["        x%d = load(xs, base + o%d)" % (j, j) for j in range(unroll)]
    lines += first_update("        ", 0)
    for j in range(1, unroll):
        lines += updates("        ", j)
    lines += ["        k += %d * step" % unroll]
    # The last, partial batch (fewer than UNROLL items: all of a short row's): every load
    # issued before the first combine too; past the end, item 0 is read again, not combined.
    lines += ["    if k < k_end:"]
    for j in range(unroll - 1):
        lines += ["        o%d = roff + i * stride" % j,
                  "        n%d = number(k + %d * step, ridx, i, inner)" % (j, j)]
        if j < unroll - 2:
            lines += ["        r, i, roff, ridx = advance(r, i, roff, ridx, step_r, step_i, length, %s)" % walk]
    lines += ["        x0 = load(xs, base + o0)"]
    lines += ["        x%d = load(xs, base + (o%d if k + %d * step < k_end else o0))" % (j, j, j)
              for j in range(1, unroll - 1)]
    lines += first_update("        ", 0)
    for j in range(1, unroll - 1):
        lines += ["        if k + %d * step < k_end:" % j] + updates("            ", j)
    lines += ["    return state, have"]
    return lines


@functools.lru_cache(maxsize=None)
def _whole_output(spec, nd_outer, unroll):
    """Device function ``(xs, base, k_count, inner, outer_shape, outer_strides,
    outer_index_strides, init, has_init) -> result``: one output whose ``k_count`` items
    (item 0 at ``base``) a thread folds alone, ``init`` in front where ``has_init``,
    projected (``init``: the projection's per-launch value otherwise)."""
    start, _, finish = _reduce_mod._protocol(spec)
    combine = spec.op.combine(spec.acc_vt)
    project = _reduce_mod.project_of(spec, per_launch=True)
    load = spec.in_vt.load
    fold = _thread_fold(spec, nd_outer, unroll)

    @cuda.jit(device=True)
    def whole_output(xs, base, k_count, inner, outer_shape, outer_strides, outer_index_strides, init, has_init):
        state = start(load(xs, base), 0)
        state, have = fold(state, np.bool_(False), xs, base, k_count * 0, k_count, k_count * 0 + 1, inner,
                           outer_shape, outer_strides, outer_index_strides)
        total = finish(state)
        if has_init:
            total = combine(init, total)
        return project(total, init)

    return whole_output


@functools.lru_cache(maxsize=None)
def _fold_partials(vt, op):
    """Device function ``(partials, lo, hi, fallback) -> value``: ``partials[lo:hi]``
    folded in order (``fallback`` where the range is empty)."""
    load, combine = vt.load, op.combine(vt)

    @cuda.jit(device=True)
    def fold_partials(partials, lo, hi, fallback):
        if lo >= hi:
            return fallback
        acc = load(partials, lo)
        for j in range(lo + 1, hi):
            acc = combine(acc, load(partials, j))
        return acc

    return fold_partials


def _assign(k0, k1, t, threads, strided):
    """(first item, end, step) of thread ``t`` of ``threads`` in chunk [k0, k1)."""
    if strided:
        return k0 + t, k1, threads
    per = (k1 - k0 + threads - 1) // threads
    lo = k0 + t * per
    return lo, min(lo + per, k1), 1


_assign_dev = cuda.jit(device=True)(_assign)


@cuda.jit(device=True)
def _threads_with_items(count, threads, strided):
    if strided:
        return min(count, threads)
    per = (count + threads - 1) // threads
    return (count + per - 1) // per


# --- the kernels ----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def rows_kernel(spec, group, nt, nd_keep, nd_outer, split, unroll=UNROLL_SMALL, walk="items", pairs=False):
    """Groups of ``group`` threads (1..32 lanes, or ``nt``: the block) reduce one
    (output, chunk) each; ``split`` > 1: outputs are split in chunks whose
    partials the last group to arrive folds.

    Arguments: (xs, origin, m_count, keep_shape, keep_in, keep_out, k_count, inner,
    outer_shape, outer_strides, outer_index_strides, splits, chunk, partials, counters,
    outs, init, has_init); ``inner``: (length, stride, index stride, index origin, pair
    step) of the innermost reduced dimension (see :func:`_thread_fold`); ``init``: the value
    folded in front where ``has_init``, else the projection's per-launch value (1 / the count
    of a ``"sum_mean"``); ``walk``: see :func:`_thread_fold`; ``pairs`` (group 1, no split): a
    thread folds two of its outputs at once (:data:`THIN_ROW_PAIRS`)."""
    start, _, finish = _reduce_mod._protocol(spec)
    acc_vt = spec.acc_vt
    combine = spec.op.combine(acc_vt)
    project = _reduce_mod.project_of(spec, per_launch=True)
    load, store_out = spec.in_vt.load, spec.out_vt.store
    store_acc = acc_vt.store
    keep_at = _unravel(nd_keep)        # (input offset, output offset)
    fold = _thread_fold(spec, nd_outer, unroll, walk)
    fold_partials = _fold_partials(acc_vt, spec.op)
    strided = not spec.ordered
    whole_block = group == nt
    # inlined: Numba returns a new array (the view) only from a function inlined at the IR level
    reads = cuda.jit(device=True, inline="always")(_codegen.build(
        "def reads(xs):\n    return %s\n" % ("xs.view(np.uint64)" if spec.wide else "xs"), "reads", device=False))
    if whole_block:
        group_reduce = block.reduce(spec.op, acc_vt, nt, partial=True)
    elif group > 1:
        group_reduce = warp.partial_reduce(spec.op, acc_vt, group)
    else:
        group_reduce = _alone
    groups_per_block = nt // group
    two_rows = pairs and group == 1 and not split

    @cuda.jit(device=True, inline="always")
    def whole_row(xs, src, origin, m, keep_shape, keep_in, keep_out, k_count, inner, outer_shape,
                  outer_strides, outer_index_strides):
        # (output offset, total) of output m, folded by this thread alone (group 1, no split)
        in_off, out_off = keep_at(m, keep_shape, keep_in, keep_out)
        state = start(load(xs, 0), k_count * 0)
        state, have = fold(state, np.bool_(False), src, origin + in_off, k_count * 0, k_count, k_count * 0 + 1,
                           inner, outer_shape, outer_strides, outer_index_strides)
        return out_off, finish(state)

    @cuda.jit(device=True, inline="always")
    def store_total(outs, out_off, total, init, has_init):
        if has_init:
            total = combine(init, total)
        store_out(outs, out_off, project(total, init))

    @cuda.jit(device=True, inline="always")
    def reduce_group(value, valid):
        total = group_reduce(value, valid)
        if whole_block:
            cuda.syncthreads()    # the block reduce's shared memory is free again
        return total

    @cuda.jit(device=True, inline="always")
    def any_in_group(flag):
        if whole_block:
            return cuda.syncthreads_or(flag)
        if group == 1:
            return flag
        # the group's lanes in one warp: the leader's flag, broadcast
        return cuda.shfl_sync(0xFFFFFFFF, flag, (cuda.laneid // group) * group)

    def rows(xs, origin, m_count, keep_shape, keep_in, keep_out, k_count, inner, outer_shape,
             outer_strides, outer_index_strides, splits, chunk, partials, counters, outs, init, has_init):
        tid = cuda.threadIdx.x
        t = tid % group
        groups = cuda.gridDim.x * groups_per_block
        src = reads(xs)           # (wide: the items as 8-byte pairs; the geometry counts pairs)
        work = m_count * splits
        w = cuda.blockIdx.x * groups_per_block + tid // group
        # Sub-warp groups in one warp may run different counts of items; a whole warp
        # (or block) always runs its items together.
        while w < work:
            if two_rows and w + groups < work:
                # two of this thread's rows at once: the second's loads need not wait for
                # the first's fold (a row of a few items is one batch of loads)
                out_a, total_a = whole_row(xs, src, origin, w, keep_shape, keep_in, keep_out, k_count, inner,
                                           outer_shape, outer_strides, outer_index_strides)
                out_b, total_b = whole_row(xs, src, origin, w + groups, keep_shape, keep_in, keep_out, k_count,
                                           inner, outer_shape, outer_strides, outer_index_strides)
                store_total(outs, out_a, total_a, init, has_init)
                store_total(outs, out_b, total_b, init, has_init)
                w += 2 * groups
                continue
            if split:
                m = w // splits
                c = w - m * splits
            else:
                m = w
                c = w * 0
            in_off, out_off = keep_at(m, keep_shape, keep_in, keep_out)
            base = origin + in_off
            k0 = c * chunk
            k1 = min(k0 + chunk, k_count)
            lo, hi, step = _assign_dev(k0, k1, t, group, strided)
            state = start(load(xs, 0), k0)     # a state of the right type, unused until `have`
            state, have = fold(state, np.bool_(False), src, base, lo, hi, step, inner, outer_shape,
                               outer_strides, outer_index_strides)
            total = reduce_group(finish(state), _threads_with_items(k1 - k0, group, strided))
            if not split:
                if t == 0:
                    store_total(outs, out_off, total, init, has_init)
            else:
                last = 0
                if t == 0:
                    store_acc(partials, w, total)
                    cuda.threadfence()
                    ticket = cuda.atomic.add(counters, m, 1)
                    last = 1 if ticket == splits - 1 else 0
                if any_in_group(last):
                    cuda.threadfence()
                    per = (splits + group - 1) // group
                    lo_p = m * splits + min(t * per, splits)
                    hi_p = m * splits + min(t * per + per, splits)
                    mine = fold_partials(partials, lo_p, hi_p, total)
                    total = reduce_group(mine, (splits + per - 1) // per)
                    if t == 0:
                        store_total(outs, out_off, total, init, has_init)
                        counters[m] = 0           # ready for the next launch on this stream
            w += groups

    rows.jit_options = {"launch_bounds": (nt, rows_blocks(spec, group))}
    return rows


def rows_blocks(spec, group):
    """Resident blocks an SM the rows kernel of ``spec`` and ``group`` is compiled for."""
    thin = group == 1 and spec.in_vt.itemsize <= 4 and spec.acc_vt.arity <= 2
    return THIN_ROW_BLOCKS if thin else MIN_BLOCKS


@cuda.jit(device=True)
def _alone(value, valid):
    """A group of one thread: its value is the group's."""
    return value


@functools.lru_cache(maxsize=None)
def columns_kernel(spec, tx, ty, nd_keep, nd_outer, split, per=1, unroll=UNROLL_SMALL):
    """Blocks of ``tx`` x ``ty`` threads: ``tx`` neighbouring outputs (along the kept
    dimension of smallest stride: coalesced) x ``ty`` threads sharing each one's
    chunk of reduced items, combined in shared memory (a tree in ``ty`` order);
    ``split`` > 1: chunks of a column tile meet through partials and a ticket per tile.
    ``per`` > 1 (``ty`` 1, no split): a thread folds ``per`` neighbouring outputs whole
    (they share one row of the innermost kept dimension: its length is a multiple).

    Arguments as :func:`rows_kernel`'s."""
    start, _, finish = _reduce_mod._protocol(spec)
    acc_vt = spec.acc_vt
    combine = spec.op.combine(acc_vt)
    project = _reduce_mod.project_of(spec, per_launch=True)
    load, store_out = spec.in_vt.load, spec.out_vt.store
    store_acc, load_acc = acc_vt.store, acc_vt.load
    keep_at = _unravel(nd_keep)        # (input offset, output offset)
    fold = _thread_fold(spec, nd_outer, unroll)
    whole = _whole_output(spec, nd_outer, unroll)
    strided = not spec.ordered
    nt = tx * ty
    outputs = per                      # (the kernel's own ``per`` is another)
    # spec.wide (per 2, one reduced dimension): a thread's two outputs are neighbours in
    # memory, read together 8 bytes a load (``inner``'s stride then counts pairs)
    across = spec.wide
    if across and (per != 2 or nd_outer):
        raise ValueError("cufold: columns read 8 bytes a load only as two outputs a thread")
    fold_across = _thread_fold_items(spec, 0, unroll, across=True) if across else None
    reads = cuda.jit(device=True, inline="always")(_codegen.build(
        "def reads(xs):\n    return %s\n" % ("xs.view(np.uint64)" if across else "xs"), "reads", device=False))
    shared = block.temp_storage(acc_vt, nt)
    full = np.uint32(warp.FULL_MASK)

    # A column's ty threads: wy of them in each warp (lanes tx apart), ty // wy warps.
    wy = max(1, warp.WARP_SIZE // tx)
    groups = ty // wy
    reduce_down = warp._reduce_down(spec.op, acc_vt, wy, tx)

    @cuda.jit(device=True)
    def tree(value, temp, x, y, valid):
        """The values of threads (x, 0..valid-1) combined in y order; valid on y == 0.
        Shuffles down within each warp, then one round through shared memory: two
        barriers, where a tree through shared memory took two a level (and its
        loop-invariant addresses, hoisted by the compiler, made z.sum(axis=0)'s split
        kernel spill 35 words a thread across the fold)."""
        if wy > 1:
            yw = y % wy
            value = reduce_down(value, yw, full, min(wy, valid - y + yw))
        if groups > 1:
            g = y // wy
            if y % wy == 0:
                store_acc(temp, g * tx + x, value)
            cuda.syncthreads()
            if y == 0:
                for h in range(1, groups):
                    if h * wy < valid:
                        value = combine(value, load_acc(temp, h * tx + x))
            cuda.syncthreads()
        return value

    @cuda.jit(device=True)
    def outputs_per_thread(xs, origin, m_count, keep_shape, keep_in, keep_out, k_count, inner,
                           outer_shape, outer_strides, outer_index_strides, outs, init, has_init):
        step_in = keep_in[nd_keep - 1]
        step_out = keep_out[nd_keep - 1]
        m = (cuda.blockIdx.x * tx + cuda.threadIdx.x) * outputs
        src = reads(xs)
        while m < m_count:
            in_off, out_off = keep_at(m, keep_shape, keep_in, keep_out)
            if across:
                first = origin + in_off                      # even: the pair's lower item
                state = start(load(xs, first), 0)            # a state of the right type
                zero = first * 0
                state, have, state_b = fold_across(state, np.bool_(False), src, first // 2, zero, k_count,
                                                   zero + 1, inner, outer_shape, outer_strides,
                                                   outer_index_strides, state)
                total, total_b = finish(state), finish(state_b)
                if has_init:
                    total, total_b = combine(init, total), combine(init, total_b)
                store_out(outs, out_off, project(total, init))
                store_out(outs, out_off + step_out, project(total_b, init))
                m += cuda.gridDim.x * tx * outputs
                continue
            for j in range(outputs):
                store_out(outs, out_off + j * step_out,
                          whole(xs, origin + in_off + j * step_in, k_count, inner, outer_shape, outer_strides,
                                outer_index_strides, init, has_init))
            m += cuda.gridDim.x * tx * outputs

    def columns(xs, origin, m_count, keep_shape, keep_in, keep_out, k_count, inner, outer_shape,
                outer_strides, outer_index_strides, splits, chunk, partials, counters, outs, init, has_init):
        temp = shared()
        tid = cuda.threadIdx.x
        x = tid % tx
        y = tid // tx
        if outputs > 1:
            outputs_per_thread(xs, origin, m_count, keep_shape, keep_in, keep_out, k_count, inner,
                               outer_shape, outer_strides, outer_index_strides, outs, init, has_init)
            return
        tiles = (m_count + tx - 1) // tx
        work = tiles * splits
        w = cuda.blockIdx.x
        while w < work:                              # uniform over the block
            c = w // tiles
            tile = w - c * tiles
            m = tile * tx + x
            in_off, out_off = keep_at(min(m, m_count - 1), keep_shape, keep_in, keep_out)
            base = origin + in_off
            k0 = c * chunk
            k1 = min(k0 + chunk, k_count)
            lo, hi, step = _assign_dev(k0, k1, y, ty, strided)
            state = start(load(xs, base), k0)
            state, have = fold(state, np.bool_(False), xs, base, lo, hi, step, inner, outer_shape,
                               outer_strides, outer_index_strides)
            total = tree(finish(state), temp, x, y, _threads_with_items(k1 - k0, ty, strided))
            if not split:
                if y == 0 and m < m_count:
                    if has_init:
                        total = combine(init, total)
                    store_out(outs, out_off, project(total, init))
            else:
                if y == 0 and m < m_count:
                    store_acc(partials, c * m_count + m, total)
                    cuda.threadfence()
                cuda.syncthreads()
                last = 0
                if tid == 0:
                    ticket = cuda.atomic.add(counters, tile, 1)
                    last = 1 if ticket == splits - 1 else 0
                if cuda.syncthreads_or(last):
                    cuda.threadfence()
                    per = (splits + ty - 1) // ty
                    p0 = min(y * per, splits)
                    p1 = min(p0 + per, splits)
                    mm = min(m, m_count - 1)
                    mine = total
                    if p0 < p1:
                        mine = load_acc(partials, p0 * m_count + mm)
                        for p in range(p0 + 1, p1):
                            mine = combine(mine, load_acc(partials, p * m_count + mm))
                    total = tree(mine, temp, x, y, (splits + per - 1) // per)
                    if y == 0 and m < m_count:
                        if has_init:
                            total = combine(init, total)
                        store_out(outs, out_off, project(total, init))
                    if tid == 0:
                        counters[tile] = 0       # ready for the next launch on this stream
            w += cuda.gridDim.x

    columns.jit_options = {"launch_bounds": (nt, MIN_BLOCKS)}
    return columns


@functools.lru_cache(maxsize=None)
def transposed_kernel(spec, nt, ta, tb, nd_keep, nd_outer, unroll=UNROLL_SMALL):
    """Blocks of ``nt`` threads over tiles of ``ta`` outputs along the input's contiguous kept
    dimension A (the last of ``keep_*``) x ``tb`` along the results' contiguous one B (the
    one before it; the planner puts it there): each warp folds whole columns of a tile row
    at a time (lanes along A: coalesced), the results go through shared memory, and the
    threads write them along B (runs of ``tb``: whole sectors). Other kept dimensions
    (``keep_*[:-2]``) number the tiles' outer index. Arguments as :func:`columns_kernel`'s
    (no split)."""
    store_out = spec.out_vt.store
    tile_vt = spec.out_vt.plain
    store_tile, load_tile = tile_vt.store, tile_vt.load
    whole = _whole_output(spec, nd_outer, unroll)
    outer_at = _unravel(nd_keep - 2)
    rows = nt // ta
    pitch = ta + 1                      # a padded tile row: the column reads hit 32 banks
    shared = block.temp_storage(tile_vt, tb * pitch)

    def transposed(xs, origin, m_count, keep_shape, keep_in, keep_out, k_count, inner, outer_shape,
                   outer_strides, outer_index_strides, splits, chunk, partials, counters, outs, init, has_init):
        tile = shared()
        lane = cuda.threadIdx.x % ta
        row = cuda.threadIdx.x // ta
        n_a, a_in, a_out = keep_shape[nd_keep - 1], keep_in[nd_keep - 1], keep_out[nd_keep - 1]
        n_b, b_in, b_out = keep_shape[nd_keep - 2], keep_in[nd_keep - 2], keep_out[nd_keep - 2]
        tiles_a = (n_a + ta - 1) // ta
        tiles = tiles_a * ((n_b + tb - 1) // tb)
        work = m_count // (n_a * n_b) * tiles
        w = np.int64(cuda.blockIdx.x)
        while w < work:                              # uniform over the block
            r = w // tiles
            t = w - r * tiles
            b0 = t // tiles_a * tb
            a0 = (t - t // tiles_a * tiles_a) * ta
            in_off, out_off = outer_at(r, keep_shape, keep_in, keep_out)
            a = a0 + lane
            for j in range(row, tb, rows):          # fold: lanes along A
                b = b0 + j
                if a < n_a and b < n_b:
                    store_tile(tile, j * pitch + lane,
                               whole(xs, origin + in_off + a * a_in + b * b_in, k_count, inner, outer_shape,
                                     outer_strides, outer_index_strides, init, has_init))
            cuda.syncthreads()
            for i in range(cuda.threadIdx.x, tb * ta, nt):     # write: threads along B
                jb = i % tb
                ja = i // tb
                a = a0 + ja
                b = b0 + jb
                if a < n_a and b < n_b:
                    store_out(outs, out_off + a * a_out + b * b_out, load_tile(tile, jb * pitch + ja))
            cuda.syncthreads()
            w += cuda.gridDim.x

    transposed.jit_options = {"launch_bounds": (nt, MIN_BLOCKS)}
    return transposed


# --- host side ----------------------------------------------------------------------------

def plan_axes(b, arrs, given, is_tuple, axes, keepdims, prep, init, algorithm, lift, project, ddof,
              needs_items, name):
    """Add the reduction of ``arrs`` (placeholders of equally shaped arrays) over
    ``axes`` to Program builder ``b``; ``given``: the placeholders of ``out=``, or
    empty (then the results are new arrays: outputs of the Program, in order)."""
    like = arrs[0]
    shape = like.shape
    for a in arrs[1:]:
        if a.shape != shape:
            raise ValueError("cufold: the arrays of a tuple value must have one shape; got %s and %s"
                             % (shape, a.shape))
        # (a stride of a dimension of length 1 is never used: torch leaves such strides as they were)
        if any(sa != sl for sa, sl, n in zip(a.strides, like.strides, shape) if n > 1):
            raise ValueError("cufold: the arrays of a tuple value must have one layout (strides); got %s and %s"
                             % (like.strides, a.strides))
    keep = [d for d in range(like.ndim) if d not in axes]
    out_shape = tuple(1 if d in axes else shape[d] for d in range(like.ndim)) if keepdims \
        else tuple(shape[d] for d in keep)
    m_count = int(np.prod([shape[d] for d in keep], dtype=np.int64))
    k_count = int(np.prod([shape[d] for d in axes], dtype=np.int64))
    out_vt = prep.out_vt
    outs = _result_arrays(b, like, out_vt, out_shape, m_count, given)
    if m_count == 0:
        return
    if k_count == 0:
        value = init if init is not None else prep.op.identity_for(prep.acc_vt)
        if lift in _reduce_mod.NAN_WHEN_EMPTY:
            value = tuple(np.nan for _ in out_vt.fields) if out_vt.is_tuple else np.nan
        elif needs_items or value is None:
            raise ValueError("cufold: zero-size array to reduction operation %s which has no identity" % name)
        if prep.post is not None and lift != "welford":     # the identity through the post-map
            _reduce_mod.fill_projected(b, prep.acc_vt, out_vt, prep.post, outs, m_count, value)
        else:
            _launch.fill(b, out_vt, outs, m_count, value)
        return
    op = prep.op
    layout = plan_layout(shape, like.strides, axes, op.commutative, lift == "index")
    # Element offsets from the lowest address, so every index is non-negative.
    lowest = sum(s * (n - 1) for n, s in zip(shape, like.strides) if s < 0)
    extent = sum(abs(s) * (n - 1) for n, s in zip(shape, like.strides)) + 1
    origin = layout.origin - lowest
    if layout.kind == "contiguous":
        run = layout.red[0][1]    # (an index lift's run is unflipped: its item numbers are the indices)
        xs = tuple(_arrays.window(a, layout.origin, (k_count,), (run,)) for a in arrs)
        p = _reduce_mod.plan(op, prep.in_vt, prep.acc_vt, out_vt, k_count, b.device_id, algorithm,
                             lift=lift, project=project, ddof=ddof, transform=prep.transform, post=prep.post)
        _reduce_mod.run(b, p, xs if is_tuple else xs[0], k_count, outs, init)
        return
    flat = tuple(_arrays.window(a, lowest, (extent,), (1,)) for a in arrs)
    xs = flat if is_tuple else flat[0]
    if layout.kind == "rows" and not layout.keep and algorithm is None:
        runs = _runs_plan(b, prep, layout, flat, origin, extent, k_count, out_vt, lift, project, ddof)
        if runs is not None:
            _reduce_mod.run(b, runs[0], xs, runs[1], outs, init)
            return
    sched = schedule(layout, limits(b.device_id), lift == "index")
    acc_vt = prep.acc_vt
    f32 = ValueType.of(np.float32)
    compensated = prep.transform is None and prep.in_vt == f32 and prep.out_vt == f32
    thin = sched.kernel == "rows" and sched.group == 1
    if project == "count_mean" and lift == "count" and init is None and (
            sched.kernel in ("columns", "transposed") or (thin and compensated)):
        # A mean along an outer axis: every output's count is k_count, so the kernel folds a
        # one-field sum and multiplies by 1 / k_count as it stores (a per-launch value), not a
        # (count, sum) pair: half the shared-memory tree and split partials. Measured on an
        # H200, (8192, 8192) along axis 0: 87.1 -> 84.1 us; along the contiguous axis (rows
        # kernels) the pair measured 2-3 us faster, so rows keep it. Float32 items with a
        # float32 result fold in compensated float32 (reduce._protocol_items: 84.1 -> 80.9
        # us); mean(x, dtype=np.float64) asks for float64's accuracy, so it folds float64.
        # (Three items an output, y.mean(axis=1) of (64, 3, 65536), fold faster compensated than
        # in float64: 28.2 against 34.0 us, H200; the sum takes 26.4.)
        # Rows of a thread each (at most 4 items: z = (2^24, 4) along axis 1) fold compensated
        # float32 into a float32 result with no float64 at all: the thread's sum is the row's,
        # and float64 conversions run at 16 an SM a clock on sm_90, a quarter of the adds
        # (the (count, float64 sum) pair: 94.8 us against the sum's 86.5, H200).
        lift, project, acc_vt = ("compensated" if compensated else "value"), "sum_mean", \
            (f32 if thin else ValueType.of(acc_vt.fields[1]))
    keep_dims = layout.keep or ((1, 0, 0),)
    if sched.kernel == "transposed":     # the results' contiguous dimension next to the last
        b_dim = output_contiguous_dim(keep_dims)
        keep_dims = keep_dims[:b_dim] + keep_dims[b_dim + 1:-1] + (keep_dims[b_dim], keep_dims[-1])
    length, stride, index_stride = layout.red[-1]
    outer = layout.red[:-1]
    nd_outer = len(outer)
    outer = outer or ((1, 0, 0),)
    spec = _reduce_mod.Spec(op, prep.in_vt, acc_vt, out_vt, lift, project, ddof,
                            _launch.Tile(sched.nt, 1), "final", "warp", not op.commutative,
                            transform=prep.transform, post=prep.post,
                            rising=lift == "index" and index_rises(layout.red))
    chunk = sched.chunk + (sched.chunk & 1)
    items = k_count                    # per output (k_count counts pairs where loads are wide)
    pair_step = 0
    if (WIDE_LOADS and sched.kernel == "rows" and op.commutative and not is_tuple
            and prep.in_vt.itemsize == 4 and prep.in_vt.fields[0].kind in "iuf" and stride == 1
            and length % 2 == 0 and origin % 2 == 0 and extent % 2 == 0 and not xs.ptr & 7
            and all(d[1] % 2 == 0 for d in layout.red[:-1] + layout.keep)):
        # 8-byte loads: every row starts on an even element of an 8-byte aligned extent, so
        # the reduction runs over pairs, with the geometry halved (chunks of whole pairs).
        # argmin/argmax too: a pair's first item's index steps twice the index stride, its
        # second is the first's plus one index stride (``pair_step``). H200, same run: y's
        # rows argmax 26.1-27.2 -> 25.1-26.0 us, full argmax of z.T 89.9 -> 84.4, of
        # A[::2] 54.3 -> 52.4; (2^24, 4) along axis 1, a thread a row, 119.2 -> 121.5.
        sched = sched._replace(chunk=chunk, split=-(-k_count // chunk))
        spec = spec._replace(wide=True)
        origin, k_count, length = origin // 2, k_count // 2, length // 2
        pair_step, index_stride = index_stride, 2 * index_stride
        keep_dims = tuple((n, s // 2, o) for n, s, o in keep_dims)
        outer = tuple((n, s // 2, i) for n, s, i in outer)
        sched = sched._replace(chunk=sched.chunk // 2)
    if (WIDE_LOADS and sched.kernel == "columns" and sched.per == 2 and nd_outer == 0 and not is_tuple
            and prep.in_vt.itemsize == 4 and prep.in_vt.fields[0].kind in "iuf" and keep_dims[-1][1] == 1
            and stride % 2 == 0 and origin % 2 == 0 and extent % 2 == 0 and not xs.ptr & 7
            and all(d[1] % 2 == 0 for d in keep_dims[:-1])):
        # two neighbouring outputs a thread, 8 bytes a load: the reduced stride in pairs
        spec = spec._replace(wide=True)
        stride //= 2
    has_init = init is not None
    init_value = (prep.acc_vt.make(init) if has_init else acc_vt.make(1.0 / items) if project == "sum_mean"
                  else _reduce_mod._zero(acc_vt))
    i64 = np.int64

    def launch_of(sched):       # (the arguments' order: rows_kernel's docstring; SPLITS_ARG)
        """(kernel, key, args) of schedule ``sched``."""
        partials, counters = _split_workspace(b, acc_vt, m_count * sched.split if sched.split > 1 else 1,
                                              m_count if sched.kernel == "rows" else -(-m_count // max(sched.tx, 1)))
        args = (xs, i64(origin), i64(m_count), tuple(i64(d[0]) for d in keep_dims),
                tuple(i64(d[1]) for d in keep_dims), tuple(i64(d[2]) for d in keep_dims), i64(k_count),
                (i64(length), i64(stride), i64(index_stride), i64(layout.index_origin), i64(pair_step)),
                tuple(i64(d[0]) for d in outer), tuple(i64(d[1]) for d in outer), tuple(i64(d[2]) for d in outer),
                i64(sched.split), i64(sched.chunk), partials, counters, outs, init_value, has_init)
        split = sched.split > 1
        if sched.kernel == "rows":
            unroll = unroll_of(spec, -(-sched.chunk // max(sched.group, 1)))
            walk = walk_of(length, sched.group if op.commutative else 1, nd_outer)
            pairs = THIN_ROW_PAIRS and sched.group == 1 and not split
            kernel = rows_kernel(spec, sched.group, sched.nt, len(keep_dims), nd_outer, split, unroll, walk, pairs)
            key = ("axis_rows", spec, sched.group, sched.nt, len(keep_dims), nd_outer, split, unroll, walk, pairs)
        elif sched.kernel == "transposed":
            unroll = unroll_of(spec, k_count)
            kernel = transposed_kernel(spec, sched.nt, sched.tx, sched.tb, len(keep_dims), nd_outer, unroll)
            key = ("axis_transposed", spec, sched.nt, sched.tx, sched.tb, len(keep_dims), nd_outer, unroll)
        else:
            unroll = unroll_of(spec, -(-sched.chunk // max(sched.ty, 1)) if sched.per == 1 else k_count)
            if spec.wide:            # a pair a load is one item of each output: as many ahead
                unroll = max(2, min(UNROLL_SMALL, k_count))
            kernel = columns_kernel(spec, sched.tx, sched.ty, len(keep_dims), nd_outer, split, sched.per, unroll)
            key = ("axis_columns", spec, sched.tx, sched.ty, len(keep_dims), nd_outer, split, sched.per, unroll)
        return kernel, key, args

    kernel, key, args = launch_of(sched)
    fitted = one_round(sched, m_count, k_count, b.resident(kernel, key, args, sched.nt))
    if fitted != sched:
        sched = fitted
        kernel, key, args = launch_of(sched)
    b.launch(kernel, key, sched.grid, sched.nt, args)


#: A full reduction of a view in contiguous runs (``x[::2]``) by a commutative operator, whose
#: C-order indices (argmin/argmax) rise with position, takes the device reduce over the runs'
#: tiles where they waste at most 1/RUNS_WASTE of the loads (a run's last tile may be
#: partial): the contiguous reduce's loads and grid. H200, (8192, 8192)[::2], us, against the
#: rows kernel split across blocks: sum 37.5 -> 37.1, max 37.8 -> 37.5, argmax 40.1 -> 39.7,
#: mean 38.2 -> 36.9 (a contiguous copy of the view: 35.3, 35.8, 37.6, 36.7). Where indices do
#: not rise (y.permute(1, 0, 2).argmax(): 22.6 -> 28.8, the tie-breaking update) and for other
#: operators (unmeasured) the rows kernel stays. ``CUFOLD_AXIS_RUNS=0``: the rows kernel.
RUNS = os.environ.get("CUFOLD_AXIS_RUNS", "1") != "0"
RUNS_WASTE = 8
#: argmin/argmax of runs whose indices rise along each run but not from run to run (a full
#: argmax of x.T, read in memory order) take the device reduce over runs too, each tile folded
#: afresh and merged by the op's tie-breaking combine (``reduce.Spec.retile``). H200, us, against
#: the rows kernel: (8192, 8192).T 70.8 -> 68.3 (a contiguous copy's argmax: 66.8). Over two
#: outer dimensions (permutations of (64, 3, 65536)) they lost: 22.4 -> 23.6-23.8. So
#: ``CUFOLD_AXIS_RETILE=1`` (default): runs over one outer dimension only; ``all``: any; ``every``:
#: any, and the runs whose indices rise throughout too (x[::2]; unmeasured); ``0``: the rows kernel.
RETILE = os.environ.get("CUFOLD_AXIS_RETILE", "1")


def _runs_plan(b, prep, layout, flat, origin, extent, k_count, out_vt, lift, project, ddof):
    """(the device reduce's plan, its geometry) of a full reduction of ``layout`` (kind
    'rows', no kept dimension) as runs (:data:`RUNS`), or None where its runs do not pay.
    ``flat``: the windows of memory the view covers, ``origin`` its first item there."""
    length, stride, index_stride = layout.red[-1]
    # (index strides are 0 unless indexed; a single run is here only for a flipped index)
    if not RUNS or not prep.op.commutative or stride != 1 or len(layout.red) == 1 or index_stride < 0:
        return None
    # Indices (nonzero index strides: argmin/argmax) that rise along each run but turn from run
    # to run (x.T): tiles folded afresh where RETILE takes them, else the rows kernel.
    turns = bool(index_stride) and (index_stride != 1 or not index_rises(layout.red))
    if turns and RETILE not in ("all", "every") and not (RETILE == "1" and len(layout.red) == 2):
        return None
    retile = turns or (bool(index_stride) and RETILE == "every")
    outer = layout.red[:-1]
    p = _reduce_mod.plan(prep.op, prep.in_vt, prep.acc_vt, out_vt, k_count, b.device_id, None,
                         lift=lift, project=project, ddof=ddof, transform=prep.transform, post=prep.post,
                         runs=(len(outer), length, retile))
    per_run = -(-length // (p.spec.tile.nt * p.spec.tile.vt))
    if per_run * p.spec.tile.nt * p.spec.tile.vt * RUNS_WASTE > length * (RUNS_WASTE + 1):
        return None
    # 8-byte loads where every run starts on an even item of an 8-byte aligned window
    scale = 2 if (p.wide is not None and origin % 2 == 0 and length % 2 == 0 and extent % 2 == 0
                  and all(d[1] % 2 == 0 for d in outer) and not any(a.ptr & 7 for a in flat)) else 1
    if scale == 2:
        p = p.wide
    i64 = np.int64
    geometry = (i64(origin // scale), i64(length // scale), i64(per_run), i64(k_count // length * per_run),
                i64(layout.index_origin), i64(extent), tuple(i64(d[0]) for d in outer),
                tuple(i64(d[1] // scale) for d in outer), tuple(i64(d[2]) for d in outer),
                i64(index_stride if retile else 1))
    return p, geometry


#: Where ``splits`` sits in the axis kernels' arguments (bench axes reads recorded launches).
SPLITS_ARG = 11


def one_round(sched, m_count, k_count, slots):
    """``sched`` with fewer splits where its blocks would not all fit the GPU at once.

    The limits assume 8 blocks of 256 an SM; a kernel of 49-64 registers holds 4. Then
    x.sum(axis=0) of (8192, 8192), 256 column tiles x 5 splits = 1280 blocks, ran 2.4
    rounds of 528, the last with 58% of the SMs' slots idle. Splitting each output only as
    far as one round of blocks holds (2 here) reads the same bytes with every slot
    busy. ``slots``: the blocks of the kernel the GPU holds at once (``Builder.resident``;
    None: unknown, keep ``sched``)."""
    if not slots or sched.split <= 1 or sched.grid <= slots:
        return sched
    per_block = sched.nt // sched.group if sched.kernel == "rows" else 1
    outputs = m_count if sched.kernel == "rows" else sched.grid // sched.split   # column tiles
    split = max(1, slots * per_block // outputs)
    if split >= sched.split:
        return sched
    chunk = -(-k_count // split)
    split = -(-k_count // chunk)       # (k_count and chunks in pairs where the loads are wide)
    grid = -(-outputs * split // per_block)
    return sched._replace(split=split, chunk=chunk, grid=max(1, grid))




def _split_workspace(b, acc_vt, partial_count, counter_count):
    """Partials (the per-stream workspace: never read before written) and ``counter_count``
    arrival counters (their own zeroed buffer, per stream and size class: the last
    arrival resets its counter, so they are zero before every launch)."""
    _, ws = _launch.workspace(b.device_id, b.stream,
                              max(16, sum(-(-partial_count * f.itemsize // 16) * 16 for f in acc_vt.fields)))
    views, offset = [], 0
    for f in acc_vt.fields:
        views.append(ws.view(f, (partial_count,), offset))
        offset += -(-partial_count * f.itemsize // 16) * 16
    cap = _pow2_at_least(max(counter_count, 1))
    counters = _launch.kept_zeros("axis counters", b.device_id, b.stream, 4 * cap).view(np.uint32, (cap,), 0)
    return (tuple(views) if acc_vt.is_tuple else views[0]), counters


def _result_arrays(b, like, out_vt, out_shape, m_count, given):
    """The results' flat views: of new output arrays, or of ``out=``'s placeholders (checked)."""
    vecs = []
    if not given:
        for f in out_vt.fields:
            vecs.append(_arrays.window(b.output(like, out_shape, f), 0, (m_count,), (1,)))
    else:
        if len(given) != out_vt.arity:
            raise ValueError("cufold: out= needs %d array(s) for a result of type %s" % (out_vt.arity, out_vt))
        for a, f in zip(given, out_vt.fields):
            if a.shape != out_shape:
                raise ValueError("cufold: out= has shape %s, the result has shape %s" % (a.shape, out_shape))
            if a.dtype != f:
                raise TypeError("cufold: out= has dtype %s, the result is %s" % (a.dtype, f))
            if not a.c_contiguous:
                raise ValueError("cufold: out= must be C-contiguous")
            vecs.append(_arrays.window(a, 0, (m_count,), (1,)))
    return tuple(vecs) if out_vt.is_tuple else vecs[0]
