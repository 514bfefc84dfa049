"""Histograms: ``histogram`` and ``bincount`` with NumPy's semantics.

Every item is turned into a bin index on the fly (``bincount``: the value
itself; ``histogram`` with ``bins=k``: ``(x - first) * k / (last - first)``
followed by NumPy's own one-step correction against the edges, so that the
result is NumPy's bin for bin-edge ties too; ``histogram`` with an edge array:
a binary search over the edges). Values outside the range, and NaN, are
skipped, and the last bin is closed, as in NumPy.

Algorithms (``algorithm=``; the default picks one from the bin count and size):

================  ===============================================================
``shared``        per-block privatised bins in shared memory (dynamic shared
                  memory, ``bins x 4`` bytes of int32 counts or ``bins x 8`` of
                  float64 weights, up to 32 KiB: 8192 / 4096 bins); each block
                  walks a grid-stride share of the input, ``VT`` items per thread
                  per step with all loads in flight; then one global atomic per
                  non-zero bin per block (the merge).
``shared_match``  as ``shared``, with warp aggregation: the lanes of a warp that
                  hold the same bin find each other (``match_any_sync``,
                  :func:`cufold.warp.peers`) and only the first adds the group's
                  count (``popc``) or weight sum (:func:`cufold.warp.reduce_peers`).
                  Skewed data (a few hot bins) then costs one shared atomic per
                  distinct bin per warp instead of up to 32 serialised ones.
``global``        every item atomically adds to the global result (int64 counts
                  or float64 sums in L2); for bins too many for shared memory.
``global_match``  ``global`` with warp aggregation (the default for many bins).
================  ===============================================================

Default: ``shared`` when the bins fit in 32 KiB and the input has at least
``2 x bins`` items per multiprocessor (so that the merge's atomics are few next
to the items); else ``global_match``. On an H200 (2^26 items, counting kernel
alone, ``tools/hist_rates.py``, since removed: git keeps it) ``shared`` takes 112 us for int bins whatever
the data (64 or 1024 bins; uniform, skewed or all in one bin): the shared
atomics run at about one item per clock per multiprocessor, lanes on one bin
included, so warp aggregation only adds its ``match_any`` (``shared_match``
138 us for one bin, 508-612 us for uniform data). Float bins (``histogram``)
take 250 us the same way: the binning, not the atomics (float32 arithmetic
instead of float64, and skipping the edge lookups for items far from an edge,
were measured and gained nothing). With many bins aggregation
pays on global atomics (65536 bins, skewed: ``global_match`` 4.7 ms,
``global`` 6.5 ms). A call of up to ``ONCE_MAX_BINS`` bins is one launch: the
blocks add into a scratch accumulator that every launch leaves zeroed, and the
last block to finish (a ticket after a fence) moves it into the call's new result,
converted, and copies the edges into the call's own edges array. More bins take
a zeroing launch first (and a converting one after, for weights of a dtype
other than float64).

The host path (``cufold.host.programs``): a call runs a Program bound for its
signature (the bins, the range, the arrays' layouts, the stream). The edges
are the count kernel's argument (it takes the range and the bin width from
their first and last edge), either a device array of the Program's own, where
the key holds their values (``range=``: uploaded once per (bins, range, dtype)
through an edge cache; host edge sequences up to ``KEYED_EDGES``), or one given
on each call to a Program of their layout (the data's range: an edge cache
keyed by the range read; longer host sequences, uploaded; device edge arrays,
read by the kernels as they are).

Generated inputs (``cufold.counting``, ``cufold.constant``) go for ``x`` and for the
weights: the kernels take a load function (a stored array's ``x[i]``, or the input's
:class:`cufold.values.InputType` load, computing the item from the index from the
parameter the kernel gets in the array's place), and the min/max pass loads through
the same InputType. Results take the library and device of the weights where ``x``
is generated and they are stored (Numba's device arrays where all are generated).

Synchronisations (NumPy's semantics need host values): ``bincount`` reads
``min(x)`` and ``max(x)`` (a one-launch Program, then a read of the two
values: **one synchronisation**): the result length is ``max(x) + 1`` and negative
values raise ValueError. ``histogram`` with ``range=None`` likewise reads
``min``/``max`` (one synchronisation) to place the edges, and edges given as a
device array are read once (NumPy checks that they increase); with ``range=``
or host edges it does not synchronise (but for the synchronous upload of new
edges: once per (bins, range, dtype), or per Program). Reads go through :func:`read_to_host`
(one driver copy into page-locked memory, one stream synchronisation). Weighted
sums use float64 atomics: their order varies, so the last bits of a weighted
result may vary between runs (as torch's and CuPy's).
"""

import collections
import functools
import operator

import numpy as np
from numba import config, cuda

from .. import warp
from ..ops import minmax, plus
from ..values import InputType, ValueType
from ..host import arrays as _arrays, dispatch as _dispatch, launch as _launch, programs as _programs
from ..host import types as _types
from . import reduce as _reduce
from ..host.launch import sm_count
from ..host import readback as _readback

__all__ = ["histogram", "bincount", "ALGORITHMS"]

SIMULATOR = bool(config.ENABLE_CUDASIM)
ALGORITHMS = ("shared", "shared_match", "global", "global_match")
_dispatch.register("histogram", ALGORITHMS)
#: Shared memory a block may use for its private bins.
SHARED_BYTES = 32 * 1024
_BLOCK_THREADS = 64 if SIMULATOR else 256
_ITEMS = 2 if SIMULATOR else 8

Tile = collections.namedtuple("Tile", "nt vt")


def _tile():
    return Tile(_BLOCK_THREADS, _ITEMS)


# --- loading an item ----------------------------------------------------------------------------
# load(x, i) -> item i of an input: x[i] for a stored array (the kernel's argument is the
# array); for a generated input (cufold.counting, cufold.constant) the kernel's argument is
# its parameter, and the item is computed from the index by its InputType's load.

@cuda.jit(device=True)
def _stored(x, i):
    return x[i]


def _loader(a):
    """The load key of input ``a`` (an Arr, or a Generated one): ``None`` for a stored
    array, else (source, dtype)."""
    if a.__class__ is _arrays.Generated:
        return (a.source, a.dtype)
    return None


@functools.lru_cache(maxsize=None)
def _load(key):
    """Device function ``load(x, i)`` for a load key of :func:`_loader`."""
    if key is None:
        return _stored          # the same x[i] as ever: the stored kernels' PTX is unchanged
    source, dtype = key
    return InputType.of(dtype, (source,)).load


# --- bin of an item -----------------------------------------------------------------------------
# bin_of(x, i, nbins, edges, lo, norm, e0, eN) -> bin in [0, nbins), or -1 to skip the item.

def _bin_int(load):
    @cuda.jit(device=True)
    def bin_int(x, i, nbins, edges, lo, norm, e0, eN):
        b = np.int64(load(x, i))
        if b >= 0 and b < nbins:
            return b
        return np.int64(-1)

    return bin_int


def _bin_uniform(load):
    @cuda.jit(device=True)
    def bin_uniform(x, i, nbins, edges, lo, norm, e0, eN):
        # NumPy's equal-width bins: keep edges[0] <= v <= edges[-1] (NaN fails), guess
        # the bin from the width, then NumPy's one-step correction against the edges.
        v = np.float64(load(x, i))
        if not (v >= e0 and v <= eN):
            return np.int64(-1)
        b = np.int64((v - lo) * norm)
        if b > nbins - 1:
            b = nbins - 1
        if b < 0:
            b = np.int64(0)
        if v < np.float64(edges[b]):
            b -= 1
        if b != nbins - 1 and v >= np.float64(edges[b + 1]):
            b += 1
        return b

    return bin_uniform


def _bin_edges(load):
    @cuda.jit(device=True)
    def bin_edges(x, i, nbins, edges, lo, norm, e0, eN):
        # An edge array: the last edge <= v (NumPy's searchsorted rule); v == edges[-1]
        # goes to the last bin.
        v = np.float64(load(x, i))
        if not (v >= e0 and v <= eN):
            return np.int64(-1)
        a = np.int64(0)
        b = nbins
        while a < b:
            mid = (a + b + 1) >> 1
            if np.float64(edges[mid]) <= v:
                a = mid
            else:
                b = mid - 1
        return min(a, nbins - 1)

    return bin_edges


_BIN_OF = {"int": _bin_int, "uniform": _bin_uniform, "edges": _bin_edges}


@functools.lru_cache(maxsize=None)
def _bin_of(mode, x_load):
    """``bin_of`` of ``mode`` for items loaded as load key ``x_load``."""
    return _BIN_OF[mode](_load(x_load))


@cuda.jit(device=True)
def _one(w, i):
    return np.int32(1)


@functools.lru_cache(maxsize=None)
def _value_of(w_load):
    """``value_of(w, i)``: the float64 weight of item ``i`` (weights loaded as load key
    ``w_load``)."""
    load = _load(w_load)

    @cuda.jit(device=True)
    def weight(w, i):
        return np.float64(load(w, i))

    return weight


# --- adding an item to its bin --------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _adder(weighted, match, counter_dtype):
    """``add(target, b, v)``: ``target[b] += v`` (skipped for ``b < 0``), every lane
    of the warp calling together; with ``match`` the lanes holding the same bin
    add once, through their first lane."""
    conv = np.dtype(counter_dtype).type
    if not match:
        @cuda.jit(device=True)
        def add(target, b, v):
            if b >= 0:
                cuda.atomic.add(target, b, conv(v))

        return add

    find_peers = warp.peers(np.int32, "match")
    if weighted:
        peer_sum = warp.reduce_peers(plus, np.float64)

        @cuda.jit(device=True)
        def add_weights(target, b, v):
            peers = find_peers(np.int32(b))
            s = peer_sum(peers, v)
            if b >= 0 and cuda.laneid == cuda.ffs(peers) - 1:
                cuda.atomic.add(target, b, conv(s))

        return add_weights

    @cuda.jit(device=True)
    def add_counts(target, b, v):
        peers = find_peers(np.int32(b))
        if b >= 0 and cuda.laneid == cuda.ffs(peers) - 1:
            cuda.atomic.add(target, b, conv(cuda.popc(peers)))

    return add_counts


@functools.lru_cache(maxsize=None)
def _process(mode, weighted, match, counter_dtype, tile, x_load=None, w_load=None):
    """``process(x, w, n, target, nbins, edges, lo, norm, e0, eN)``: this block's
    grid-stride share, ``VT`` striped items per thread per step (bins computed
    for all, then added). The loop is uniform over the block, so every lane of
    every warp reaches the warp-wide match together. ``x_load`` and ``w_load``
    (:func:`_loader`'s keys) say how items and weights load: None for stored arrays."""
    nt, vt = tile
    chunk = nt * vt
    bin_of = _bin_of(mode, x_load)
    value_of = _value_of(w_load) if weighted else _one
    add = _adder(weighted, match, counter_dtype)

    @cuda.jit(device=True)
    def process(x, w, n, target, nbins, edges, lo, norm, e0, eN):
        tid = cuda.threadIdx.x
        bins = cuda.local.array(vt, np.int64)
        base = np.int64(cuda.blockIdx.x) * chunk
        stride = np.int64(cuda.gridDim.x) * chunk
        while base < n:
            for k in range(vt):
                i = base + k * nt + tid
                bins[k] = bin_of(x, i, nbins, edges, lo, norm, e0, eN) if i < n else np.int64(-1)
            for k in range(vt):
                i = base + k * nt + tid
                add(target, bins[k], value_of(w, min(i, n - 1)))
            base += stride

    return process


@cuda.jit(device=True)
def _no_limits(edges, nbins):
    return 0.0, 0.0, 0.0, 0.0


@cuda.jit(device=True)
def _edge_limits(edges, nbins):
    # (lo, norm, e0, eN) of the bin functions, from the edges themselves (a Program
    # may get new edges on every call): float64 arithmetic as on the host, so the
    # bins are NumPy's whichever side computes them.
    first = np.float64(edges[0])
    last = np.float64(edges[nbins])
    norm = np.float64(nbins) / (last - first) if last > first else np.float64(0.0)
    return first, norm, first, last


_LIMITS = {"int": _no_limits, "uniform": _edge_limits, "edges": _edge_limits}


@functools.lru_cache(maxsize=None)
def hist_kernel(mode, weighted, algorithm, tile, once, out_dtype, x_load=None, w_load=None):
    """The Python kernel ``(x, w, n, target, done, out, nbins, edges, edges_out,
    nedges)``: adds the counts (``target`` int64) or weight sums (``target``
    float64) of ``x``'s items to ``target``. ``w`` is read only when weighted;
    ``edges`` (the ``nbins + 1`` bin edges) by the histogram modes only, which also
    take the range and the bin width from its first and last edge. The shared
    algorithms need ``nbins x (8 if weighted else 4)`` bytes of dynamic shared memory.

    ``once=False``: ``target`` is the result, zeroed by the caller (``done``,
    ``out``, ``edges_out`` and ``nedges`` unused). ``once=True``, the whole call in
    one launch: ``target`` is a scratch accumulator that is all zeros at the start
    of every launch, ``done`` a uint32 counter, zero likewise. Each block adds its
    share to ``target``, then takes a ticket; the last block (all others' adds
    visible through the fence before their tickets) moves ``target`` into ``out``
    (converted to ``out_dtype``), reading it at L2 and leaving it zero again,
    copies ``edges[:nedges]`` to ``edges_out`` and resets ``done``.

    ``x_load`` and ``w_load`` (:func:`_loader`'s keys): how ``x``'s items and the
    weights load; None, stored arrays (``x[i]``); else a generated input's (source,
    dtype), whose argument is its parameter (:class:`cufold.values.InputType`'s load)."""
    nt = tile.nt
    match = algorithm.endswith("_match")
    acc_dt = np.float64 if weighted else np.int64
    conv = np.dtype(acc_dt).type
    conv_out = np.dtype(out_dtype).type
    limits = _LIMITS[mode]
    private_bins = algorithm.startswith("shared")
    smem_dt = np.float64 if weighted else np.int32
    process = _process(mode, weighted, match, smem_dt if private_bins else acc_dt, tile, x_load, w_load)
    # The simulator sizes dynamic shared arrays by dtype.itemsize: it needs a dtype instance.
    smem_type = np.dtype(smem_dt) if SIMULATOR else smem_dt
    zero = conv(0)

    def hist(x, w, n, target, done, out, nbins, edges, edges_out, nedges):
        lo, norm, e0, eN = limits(edges, nbins)
        tid = cuda.threadIdx.x
        if private_bins:
            private = cuda.shared.array(0, smem_type)
            b = tid
            while b < nbins:
                private[b] = 0
                b += nt
            cuda.syncthreads()
            process(x, w, n, private, nbins, edges, lo, norm, e0, eN)
            cuda.syncthreads()
            b = tid
            while b < nbins:                        # the merge: one atomic per non-zero bin
                c = private[b]
                if c != 0:
                    cuda.atomic.add(target, b, conv(c))
                b += nt
        else:
            process(x, w, n, target, nbins, edges, lo, norm, e0, eN)
        if once:
            last = cuda.shared.array(1, np.int32)
            cuda.threadfence()
            cuda.syncthreads()
            if tid == 0:
                last[0] = 1 if cuda.atomic.add(done, 0, 1) == cuda.gridDim.x - 1 else 0
            cuda.syncthreads()
            if last[0] == 1:
                cuda.threadfence()
                b = tid
                while b < nbins:
                    # read at L2, where the adds are (no float64 atomic exchange):
                    # every other block is done, so the reset cannot lose an add
                    out[b] = conv_out(cuda.atomic.add(target, b, zero))
                    target[b] = zero
                    b += nt
                e = tid
                while e < nedges:
                    edges_out[e] = edges[e]
                    e += nt
                if tid == 0:
                    done[0] = 0

    return hist


@functools.lru_cache(maxsize=None)
def start_kernel(out_dtype):
    """Kernel ``(out, nbins, src, dst, nedges)``: ``out[:nbins] = 0`` and
    ``dst[:nedges] = src[:nedges]`` (grid-stride): the counts zeroed and the
    call's own copy of the edges made in one launch."""
    zero = np.dtype(out_dtype).type(0)

    def start(out, nbins, src, dst, nedges):
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < nbins or i < nedges:
            if i < nbins:
                out[i] = zero
            if i < nedges:
                dst[i] = src[i]
            i += step

    return start


@functools.lru_cache(maxsize=None)
def copy_kernel(src_dtype, dst_dtype):
    """Kernel ``(src, dst, n)``: ``dst[:n] = src[:n]`` converted (grid-stride)."""
    conv = np.dtype(dst_dtype).type

    def copy(src, dst, n):
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < n:
            dst[i] = conv(src[i])
            i += step

    return copy


# --- host side: Programs ------------------------------------------------------------------------------

_FILL_THREADS = 32 if SIMULATOR else 256
_FILL_BLOCKS = 2 if SIMULATOR else 4096     # grid-stride beyond
#: Host edge sequences up to this many edges key their Program by value (more: a Program
#: that takes the edges, uploaded on every call).
KEYED_EDGES = 4096


def _grid_1d(n):
    return max(1, min(-(-n // _FILL_THREADS), _FILL_BLOCKS))


def _start(b, out, nbins, src, dst, nedges):
    b.launch(start_kernel(out.dtype), ("hist_start", out.dtype), _grid_1d(max(nbins, nedges)), _FILL_THREADS,
             (out, np.int64(nbins), src, dst, np.int64(nedges)))


def _copy(b, src, dst, n):
    b.launch(copy_kernel(src.dtype, dst.dtype), ("hist_copy", src.dtype, dst.dtype), _grid_1d(n),
             _FILL_THREADS, (src, dst, np.int64(n)))


def choose(n, nbins, weighted, device_id):
    """The default algorithm (see the module doc)."""
    if _fits(nbins, weighted) and n >= 2 * nbins * sm_count(device_id):
        return "shared"
    return "global_match"


def _fits(nbins, weighted):
    return nbins * (8 if weighted else 4) <= SHARED_BYTES


def _check_algorithm(algorithm, nbins, weighted):
    if algorithm not in ALGORITHMS:
        raise ValueError("cufold: unknown histogram algorithm %r; choose from %s"
                         % (algorithm, ", ".join(ALGORITHMS)))
    if algorithm.startswith("shared") and not _fits(nbins, weighted):
        raise ValueError("cufold: algorithm %r keeps %d %s bins in shared memory (at most %d bytes); "
                         "use 'global' or 'global_match'"
                         % (algorithm, nbins, "float64" if weighted else "int32", SHARED_BYTES))


#: Calls of at most this many bins run in one launch (``hist_kernel(once=True)``), with a
#: zeroed accumulator per (device, stream, bins, type) kept between calls; more bins
#: are zeroed by a launch of their own (``start_kernel``) and counted in place.
ONCE_MAX_BINS = 1 << 14


def _accumulator(device_id, stream, nbins, weighted):
    """(target, done): the zeroed scratch of one-launch calls on this stream."""
    ws = _launch.kept_zeros("histogram accumulator", device_id, stream, 8 * nbins + 8)
    return ws.view(np.float64 if weighted else np.int64, (nbins,), 0), ws.view(np.uint32, (1,), 8 * nbins)


def _count(b, mode, x, w, n, out, nbins, edges, algorithm, edges_out=None):
    """Add to Program builder ``b`` the counting of ``x``'s ``n`` items (weights
    ``w``) into ``out`` (``nbins`` new elements: int64 counts, or weight sums of any
    float dtype), and the copy of ``edges`` (the ``nbins + 1`` edges the histogram
    modes bin by) to ``edges_out`` where given: one launch for up to
    ``ONCE_MAX_BINS`` bins, else a zeroing launch and a counting one."""
    weighted = w is not None
    if algorithm is None:
        algorithm = choose(n, nbins, weighted, b.device_id)
    _check_algorithm(algorithm, nbins, weighted)
    if algorithm.endswith("_match") and nbins >= 2**31:
        algorithm = algorithm[:-len("_match")]     # match_any compares the bins as int32
    acc_dt = np.dtype(np.float64 if weighted else np.int64)
    once = nbins <= ONCE_MAX_BINS
    nedges = 0 if edges_out is None else nbins + 1
    if once:
        target, done = _accumulator(b.device_id, b.stream, nbins, weighted)
    else:
        target = out
        if out.dtype != acc_dt:
            target = b.output(_home(x, w), (nbins,), acc_dt)     # weights add up in float64, then converted
        _start(b, target, nbins, edges, edges if edges_out is None else edges_out, nedges)
        done = _dummy(b.device_id, b.stream).view(np.uint32, (1,), 0)
    tile = _tile()
    chunk = tile.nt * tile.vt
    blocks = max(1, -(-n // chunk))
    resident = sm_count(b.device_id) * max(1, 2048 // tile.nt)
    smem = 0
    if algorithm.startswith("shared"):
        smem = nbins * (8 if weighted else 4)
        # Enough items per block that the merge (<= nbins atomics a block) stays small.
        grid = min(blocks, resident, max(sm_count(b.device_id), n // (4 * nbins)))
    else:
        grid = min(blocks, resident)
    x_load, w_load = _loader(x), (_loader(w) if weighted else None)
    loads = () if x_load is None and w_load is None else (x_load, w_load)    # stored: the keys as ever
    b.launch(hist_kernel(mode, weighted, algorithm, tile, once, out.dtype, x_load, w_load),
             ("hist", mode, weighted, algorithm, tile, once, out.dtype) + loads, max(1, grid), tile.nt,
             (x, w if weighted else x, np.int64(n), target, done, out, np.int64(nbins), edges,
              edges if edges_out is None else edges_out, np.int64(nedges)), shared=smem)
    if not once and target is not out:
        _copy(b, target, out, nbins)


def _plan_counts(mode, a, w, nbins, edges, edges_per_call, algorithm, handle, alloc_stream):
    """The Program of one histogram (``mode`` "uniform" or "edges") or bincount
    ("int") signature, called with ``x`` (and ``weights``), and for
    ``edges_per_call`` the edges (laid out as ``edges``); else ``edges`` is the
    Program's own (bincount: None). Returns ``counts`` (bincount) or ``(counts,
    edges)``: new arrays of ``x``'s library, the edges copied on the device."""
    device_id = _device_of(a, w)
    b = _programs.Builder(device_id, handle, alloc_stream)
    xs = b.input(a)
    ws = None if w is None else b.input(w)
    if edges_per_call:
        edges = b.input(edges)
    home = _home(xs, ws)
    if mode == "int":
        counts = b.output(home, (nbins,), np.int64 if w is None else np.float64)
        if nbins > 0:
            _count(b, mode, xs, ws, a.size, counts, nbins, _dummy(device_id, handle), algorithm)
        return b.build()
    counts = b.output(home, (nbins,), np.int64 if w is None else w.dtype)
    edges_out = b.output(home, (nbins + 1,), edges.dtype)           # each call's own
    _count(b, mode, xs, ws, a.size, counts, nbins, edges, algorithm, edges_out)
    return b.build(lambda got: (got[0], got[1]))


def _plan_minmax(key, a, w=None):
    """The Program ``(x[, weights]) -> Arr``: ``[min(x), max(x)]`` in a new 2-element
    array (``x`` not empty): ``cufold.minmax``'s reduction, one launch (the weights
    are checked, not read)."""
    kind, _, _, handle, alloc_stream = key
    _check_inputs(kind, a, w)
    acc = _types.accumulate(a.dtype)
    in_vt = InputType.of(a.dtype, (getattr(a, "source", "array"),))     # generated x: computed items
    acc_vt, out_vt = ValueType.of((acc, acc)), ValueType.of((a.dtype, a.dtype))
    minmax.check(acc_vt)
    device_id = _device_of(a, w)
    b = _programs.Builder(device_id, handle, alloc_stream)
    xs = b.input(a)
    ws = None if w is None else b.input(w)
    both = b.output(_home(xs, ws), (2,), a.dtype)
    outs = (both.view(a.dtype, (1,), 0), both.view(a.dtype, (1,), a.itemsize))
    p = _reduce.plan(minmax, in_vt, acc_vt, out_vt, a.size, device_id, None, lift="pair")
    _reduce.run(b, p, xs, a.size, outs, None)
    return b.build(lambda got: _arrays.describe(got[0], "minmax"))


def _device_minmax(kind, a, w, handle, alloc_stream):
    """(min, max) of ``a`` (not empty) as host scalars: one small Program, then one
    read of the two values: **one synchronisation**. ``kind``'s checks of ``x`` and
    ``weights`` run when the Program is planned."""
    key = (kind, _programs.signature(a), None if w is None else _programs.signature(w), handle, alloc_stream)
    both = _readback.read_to_host(_minmax_programs.run(key, *((a,) if w is None else (a, w))), handle)       # the sync
    return both[0], both[1]


def _one_d(a, name):
    if a.ndim != 1:
        raise ValueError("cufold: %s must be 1-D; got shape %s" % (name, a.shape))


def _check_inputs(kind, a, w):
    """What ``kind`` ("bincount" or "histogram") takes of ``x`` and ``weights`` (Arrs; w may be None)."""
    _one_d(a, "x")
    if kind == "bincount" and a.dtype.kind not in "biu":
        raise TypeError("cufold: bincount takes integers; x has dtype %s (NumPy: cannot cast "
                        "safely to int64)" % a.dtype)
    if kind == "histogram" and a.dtype.kind not in "iuf":
        raise TypeError("cufold: histogram takes integers or floats; x has dtype %s" % a.dtype)
    if w is None:
        return
    _one_d(w, "weights")
    if w.size != a.size:
        raise ValueError("cufold: weights and x must be equally long; got %d and %d" % (w.size, a.size))
    if w.dtype.kind not in ("biuf" if kind == "bincount" else "iuf"):
        raise TypeError("cufold: weights of dtype %s are not supported" % w.dtype)
    stored = tuple(v for v in (a, w) if v.library != "generated")
    if stored:
        _arrays.same_device(stored, "x and weights")


def _home(x, w):
    """Where results go: ``x`` (an Arr or a Program's placeholder), or the weights ``w``
    where ``x`` is generated and they are not (their library and device)."""
    return w if x.library == "generated" and w is not None and w.library != "generated" else x


def _device_of(a, w):
    """The device of a call of ``x`` ``a`` and weights ``w`` (None): its stored arrays'
    (a generated input's is the current device)."""
    return _home(a, w).device_id


def _dummy(device_id, stream):
    """A one-element float64 device array standing for the edges of bincount (never read)."""
    return _launch.kept_zeros("histogram dummy", device_id, stream, 8).view(np.float64, (1,), 0)
def _plan_count_key(key, *arrays):
    """The Program of a bincount or histogram call signature ``key``: ``(kind,
    ...plan data..., common)``, ``common`` = (x's and weights' signatures, algorithm,
    stream, allocation stream); ``arrays``: x, the weights where given, then for
    kind "given" the edges. Kinds: "int" (bincount; data: nbins), "uniform" (equal
    bins over a range: nbins, the range's key, the range), "given" (device edges
    laid out as the last array: the mode), "host" (edges given on the host: their
    dtype, shape and bytes, the range)."""
    kind, common = key[0], key[-1]
    _, w_sig, algorithm, handle, alloc_stream = common
    a, w = arrays[0], (arrays[1] if w_sig is not None else None)
    _check_inputs("bincount" if kind == "int" else "histogram", a, w)
    if kind == "int":
        return _plan_counts("int", a, w, key[1], None, False, algorithm, handle, alloc_stream)
    if kind == "uniform":
        nbins, range_key, range = key[1:4]
        dev = _device_of(a, w)
        _, edges = _cached_edges((nbins, range_key, a.dtype.str, dev),
                                 lambda: np.histogram_bin_edges(np.empty(0, a.dtype), bins=nbins, range=range),
                                 dev)
        return _plan_counts("uniform", a, w, edges.size - 1, edges, False, algorithm, handle, alloc_stream)
    if kind == "given":
        edges = arrays[-1]
        return _plan_counts(key[1], a, w, edges.size - 1, edges, True, algorithm, handle, alloc_stream)
    dtype, shape, data, range = key[1:5]
    edges = _upload(_numpy_edges(a, np.frombuffer(data, dtype).reshape(shape), range), _device_of(a, w))
    return _plan_counts("edges", a, w, edges.size - 1, edges, False, algorithm, handle, alloc_stream)


_minmax_programs = _programs.Programs(_plan_minmax, "cufold.minmax (of the bins' data)", 1024)
_count_programs = _programs.Programs(_plan_count_key, "cufold.histogram", 4096)


def bincount(x, weights=None, minlength=0, *, stream=None, algorithm=None):
    """Count the occurrences of each value of a non-negative integer array (``numpy.bincount``).

    Parameters
    ----------
    x : 1-D CUDA array of integers (any width, signed or unsigned) or bools, or a
        generated input (``cufold.counting``, ``cufold.constant``).
    weights : optional CUDA array (or generated input) as long as ``x`` (any real
        dtype): the result sums them per value (float64) instead of counting.
    minlength : the result has at least this many bins.
    stream : the library's stream object or a raw ``CUstream`` handle.
    algorithm : one of ``ALGORITHMS`` (see the module doc); None chooses.

    Returns an int64 (float64 with weights) array of ``max(max(x) + 1,
    minlength)`` bins in ``x``'s library. **Synchronises the host once** to read
    ``min(x)`` and ``max(x)`` (the result's length, and NumPy's ValueError for a
    negative value), except for an empty ``x``.

    Example::

        >>> cufold.bincount(cupy.asarray([0, 1, 1, 3, 2, 1, 7]))
        array([1, 3, 1, 1, 0, 0, 0, 1])
        >>> cufold.bincount(torch.tensor([0, 1, 1], device="cuda"),
        ...                 weights=torch.tensor([.5, 1., 2.], device="cuda"))
        tensor([0.5000, 3.0000], device='cuda:0', dtype=torch.float64)
    """
    a = _arrays.describe(x, "x")
    w = None if weights is None else _arrays.describe(weights, "weights")
    minlength = operator.index(minlength)
    if minlength < 0:
        raise ValueError("cufold: minlength must be non-negative, got %d" % minlength)
    handle = _arrays.stream_handle(a if w is None else (a, w), stream)
    alloc_stream = handle if stream is not None else None
    nbins = minlength
    if a.size > 0:
        lo, hi = _device_minmax("bincount", a, w, handle, alloc_stream)
        if int(lo) < 0:
            raise ValueError("cufold: bincount's x must have no negative elements (min is %d)"
                             % int(lo))
        nbins = max(int(hi) + 1, minlength)
    common = (_programs.signature(a), None if w is None else _programs.signature(w), algorithm, handle,
              alloc_stream)
    return _count_programs.run(("int", nbins, common), *((a,) if w is None else (a, w)))


# --- histogram edges ----------------------------------------------------------------------------------

_EDGE_CACHE = collections.OrderedDict()
_EDGE_CACHE_SIZE = 64


def _range_key(range):
    return tuple((type(v).__name__, repr(v)) for v in range)


def _upload(host_edges, device_id):
    """A device copy of host array ``host_edges`` (an Arr; a synchronous upload)."""
    with _launch._numba_device_ctx(device_id):
        return _arrays.describe(cuda.to_device(host_edges), "edges")


def _cached_edges(key, make_host_edges, device_id):
    """(host edges, device copy) of uniform edges for a (bins, range, dtype) seen
    before: NumPy computes them (``make_host_edges()``, ~20 us of host time) and the
    upload synchronises once per key."""
    got = _EDGE_CACHE.get(key)
    if got is not None:
        _EDGE_CACHE.move_to_end(key)
        return got
    host_edges = _checked_edges(make_host_edges())
    got = _EDGE_CACHE[key] = host_edges, _upload(host_edges, device_id)
    if len(_EDGE_CACHE) > _EDGE_CACHE_SIZE:
        _EDGE_CACHE.popitem(last=False)
    return got


def _checked_edges(host_edges):
    host_edges = np.ascontiguousarray(host_edges)
    if host_edges.dtype.kind not in "iuf":
        raise TypeError("cufold: bin edges of dtype %s are not supported" % host_edges.dtype)
    return host_edges


def _numpy_edges(a, bins, range):
    """NumPy's edges (and checks) for ``bins`` and ``range`` over no data of ``x``'s dtype."""
    return _checked_edges(np.histogram_bin_edges(np.empty(0, a.dtype), bins=bins, range=range))


def _bin_count(bins):
    """``bins`` as an int, else NumPy's TypeError."""
    try:
        return operator.index(bins)
    except TypeError:
        raise TypeError("`bins` must be an integer, a string, or an array") from None


def histogram(x, bins=10, range=None, *, weights=None, stream=None, algorithm=None):  # noqa: A002
    """Histogram of a 1-D array, as ``numpy.histogram``: returns ``(counts, edges)``.

    Parameters
    ----------
    x : 1-D CUDA array of integers or floats (any width), or a generated input
        (``cufold.counting``, ``cufold.constant``).
    bins : an int (that many equal-width bins over ``range``), or an array of
        monotonically increasing edges (a host sequence or a device array).
    range : ``(lower, upper)`` for equal-width bins; default ``(min(x),
        max(x))``. Values outside it, and NaN, are not counted; the last bin
        includes its upper edge.
    weights : optional CUDA array (or generated input) as long as ``x``; the result sums them per
        bin (accumulated in float64, returned in the weights' dtype, as NumPy).
    stream : the library's stream object or a raw ``CUstream`` handle.
    algorithm : one of ``ALGORITHMS`` (see the module doc); None chooses.

    Returns ``(counts, edges)``: counts int64 (or the weights' dtype) and the
    edges in NumPy's dtype (the input's float dtype, float64 for integers, the
    given edges' dtype), both new device arrays of ``x``'s library. With
    ``range=`` (or a host sequence of edges) the host is not synchronised.
    Without ``range=`` (and with ``bins`` an int) **the host synchronises once**
    to read ``min(x)`` and ``max(x)``, and a non-finite extreme (NaN, inf)
    raises ValueError as in NumPy; edges given as a device array are read once
    (one synchronisation: NumPy checks that they increase). NumPy's estimators
    (``bins='auto'``...) are not supported. The bins are NumPy's exactly, also
    for values on an edge (except where rounding the edges to a float16 input
    makes two edges equal).

    Example::

        >>> counts, edges = cufold.histogram(cupy.asarray([0.5, 1.5, 1.7, 3.]), bins=3, range=(0, 3))
        >>> counts, edges
        (array([1, 2, 1]), array([0., 1., 2., 3.]))
    """
    a = _arrays.describe(x, "x")
    w = None if weights is None else _arrays.describe(weights, "weights")
    handle = _arrays.stream_handle(a if w is None else (a, w), stream)
    alloc_stream = handle if stream is not None else None
    inputs = (a,) if w is None else (a, w)
    sig = (_programs.signature(a), None if w is None else _programs.signature(w), algorithm, handle,
           alloc_stream)
    if bins.__class__ is not int:
        if isinstance(bins, str):
            raise TypeError("cufold: histogram's bins must be an integer or an array of edges; "
                            "NumPy's estimators (%r) are not supported" % bins)
        if np.ndim(bins) != 0:
            return _with_edge_array(a, w, bins, range, inputs, sig, algorithm, handle, alloc_stream)
    if range is None:
        nbins = _bin_count(bins)
        if a.size > 0:
            # NumPy's range is the data's: read it (the sync), then edges as for a range.
            lo, hi = _device_minmax("histogram", a, w, handle, alloc_stream)
            probe = np.array([lo, hi], a.dtype)
            dev = _device_of(a, w)
            _, edges = _cached_edges((nbins, ("data", probe.tobytes()), a.dtype.str, dev),
                                     lambda: np.histogram_bin_edges(probe, bins=bins), dev)
            return _with_edges(a, w, "uniform", edges, inputs, sig, algorithm, handle, alloc_stream)
        range = (0, 1)                  # NumPy's range for no data
    else:
        nbins = operator.index(bins)
    return _count_programs.run(("uniform", nbins, _range_key(range), tuple(range), sig), *inputs)


def _with_edges(a, w, mode, edges, inputs, sig, algorithm, handle, alloc_stream):
    """``(counts, edges)`` by device edges ``edges`` (an Arr) given to a Program
    of their layout (not of their values) on this call."""
    return _count_programs.run(("given", mode, _programs.signature(edges), sig), *inputs, edges)


def _with_edge_array(a, w, bins, range, inputs, sig, algorithm, handle, alloc_stream):
    """``(counts, edges)`` for ``bins`` an array of edges: a host sequence (its
    values key the Program up to KEYED_EDGES edges) or a device array (read once to
    check it as NumPy does: a synchronisation; then the kernels read it)."""
    try:
        given = None if isinstance(bins, (np.ndarray, list, tuple)) else _arrays.describe(bins, "bins")
    except TypeError:
        given = None
    if given is not None:
        host = _readback.read_to_host(given, handle)    # the sync
        host_edges = _numpy_edges(a, host, range)
        if given.device_id != _device_of(a, w):
            given = _upload(host_edges, _device_of(a, w))
        return _with_edges(a, w, "edges", given, inputs, sig, algorithm, handle, alloc_stream)
    values = np.asarray(bins)
    if values.size > KEYED_EDGES:
        return _with_edges(a, w, "edges", _upload(_numpy_edges(a, values, range), _device_of(a, w)), inputs, sig,
                           algorithm, handle, alloc_stream)
    key = ("host", values.dtype.str, values.shape, values.tobytes(), None if range is None else tuple(range), sig)
    return _count_programs.run(key, *inputs)
