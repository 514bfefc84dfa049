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
alone, ``tools/hist_rates.py``) ``shared`` takes 112 us for int bins whatever
the data (64 or 1024 bins; uniform, skewed or all in one bin): the shared
atomics run at about one item per clock per multiprocessor, lanes on one bin
included, so warp aggregation only adds its ``match_any`` (``shared_match``
138 us for one bin, 508-612 us for uniform data). Float bins (``histogram``)
take 250 us the same way: the binning, not the atomics (float32 arithmetic
instead of float64, and skipping the edge lookups for items far from an edge,
were measured and gained nothing). With many bins aggregation
pays on global atomics (65536 bins, skewed: ``global_match`` 4.7 ms,
``global`` 6.5 ms). Every algorithm zeroes the result first (one small
kernel): two launches.

Synchronisations (NumPy's semantics need host values): ``bincount`` reads
``min(x)`` and ``max(x)`` (one device reduction, **one synchronisation**): the
result length is ``max(x) + 1`` and negative values raise ValueError.
``histogram`` with ``range=None`` likewise reads ``min``/``max`` (one
synchronisation) to place the edges; with ``range=`` or an edge array it does
not synchronise. Weighted sums use float64 atomics: their order varies, so the
last bits of a weighted result may vary between runs (as torch's and CuPy's).
"""

import collections
import functools
import operator

import numpy as np
from numba import config, cuda

from .. import warp
from ..ops import plus
from ..host import arrays as _arrays, dispatch as _dispatch, launch as _launch
from ..host.launch import launch
from .segmented import sm_count, to_host

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


# --- bin of an item -----------------------------------------------------------------------------
# bin_of(x, i, nbins, edges, lo, norm, e0, eN) -> bin in [0, nbins), or -1 to skip the item.

@cuda.jit(device=True)
def _bin_int(x, i, nbins, edges, lo, norm, e0, eN):
    b = np.int64(x[i])
    if b >= 0 and b < nbins:
        return b
    return np.int64(-1)


@cuda.jit(device=True)
def _bin_uniform(x, i, nbins, edges, lo, norm, e0, eN):
    # NumPy's equal-width bins: keep edges[0] <= v <= edges[-1] (NaN fails), guess
    # the bin from the width, then NumPy's one-step correction against the edges.
    v = np.float64(x[i])
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


@cuda.jit(device=True)
def _bin_edges(x, i, nbins, edges, lo, norm, e0, eN):
    # An edge array: the last edge <= v (NumPy's searchsorted rule); v == edges[-1]
    # goes to the last bin.
    v = np.float64(x[i])
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


_BIN_OF = {"int": _bin_int, "uniform": _bin_uniform, "edges": _bin_edges}


@cuda.jit(device=True)
def _one(w, i):
    return np.int32(1)


@cuda.jit(device=True)
def _weight(w, i):
    return np.float64(w[i])


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
def _process(mode, weighted, match, counter_dtype, tile):
    """``process(x, w, n, target, nbins, edges, lo, norm, e0, eN)``: this block's
    grid-stride share, ``VT`` striped items per thread per step (bins computed
    for all, then added). The loop is uniform over the block, so every lane of
    every warp reaches the warp-wide match together."""
    nt, vt = tile
    chunk = nt * vt
    bin_of = _BIN_OF[mode]
    value_of = _weight if weighted else _one
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


@functools.lru_cache(maxsize=None)
def hist_kernel(mode, weighted, algorithm, tile):
    """The Python kernel ``(x, w, n, out, nbins, edges, lo, norm, e0, eN)``:
    adds the counts (``out`` int64) or weight sums (``out`` float64) of ``x``'s
    items to ``out`` (zeroed by the caller). ``w`` is read only when weighted;
    ``edges``/``lo``/``norm``/``e0``/``eN`` by the histogram modes only. The
    shared algorithms need ``nbins x (8 if weighted else 4)`` bytes of dynamic
    shared memory."""
    nt = tile.nt
    match = algorithm.endswith("_match")
    out_dt = np.float64 if weighted else np.int64
    conv = np.dtype(out_dt).type
    if algorithm.startswith("global"):
        process = _process(mode, weighted, match, out_dt, tile)

        def hist_global(x, w, n, out, nbins, edges, lo, norm, e0, eN):
            process(x, w, n, out, nbins, edges, lo, norm, e0, eN)

        return hist_global

    smem_dt = np.float64 if weighted else np.int32
    process = _process(mode, weighted, match, smem_dt, tile)
    # The simulator sizes dynamic shared arrays by dtype.itemsize: it needs a dtype instance.
    smem_type = np.dtype(smem_dt) if SIMULATOR else smem_dt

    def hist_shared(x, w, n, out, nbins, edges, lo, norm, e0, eN):
        private = cuda.shared.array(0, smem_type)
        tid = cuda.threadIdx.x
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
                cuda.atomic.add(out, b, conv(c))
            b += nt

    return hist_shared


@functools.lru_cache(maxsize=None)
def fill_kernel(dtype):
    """Kernel ``(out, n, value)``: ``out[:n] = value`` (grid-stride)."""
    conv = np.dtype(dtype).type

    def fill(out, n, value):
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < n:
            out[i] = conv(value)
            i += step

    return fill


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


# --- host side -------------------------------------------------------------------------------------

_FILL_THREADS = 32 if SIMULATOR else 256
_FILL_BLOCKS = 2 if SIMULATOR else 4096     # grid-stride beyond


def _grid_1d(n):
    return max(1, min(-(-n // _FILL_THREADS), _FILL_BLOCKS))


def _fill(arr, n, value, handle):
    launch(fill_kernel(arr.dtype), ("hist_fill", arr.dtype), _grid_1d(n), _FILL_THREADS, handle,
           (arr, np.int64(n), value))


def _copy(src, dst, n, handle):
    launch(copy_kernel(src.dtype, dst.dtype), ("hist_copy", src.dtype, dst.dtype), _grid_1d(n),
           _FILL_THREADS, handle, (src, dst, np.int64(n)))


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


def _count(mode, x, w, n, out, nbins, edges, lo, norm, e0, eN, algorithm, handle, device_id):
    """Zero ``out`` (``nbins`` of int64 or float64) and add ``x``'s items to it."""
    weighted = w is not None
    _fill(out, nbins, 0, handle)
    if n == 0:
        return
    if algorithm is None:
        algorithm = choose(n, nbins, weighted, device_id)
    _check_algorithm(algorithm, nbins, weighted)
    if algorithm.endswith("_match") and nbins >= 2**31:
        algorithm = algorithm[:-len("_match")]     # match_any compares the bins as int32
    tile = _tile()
    chunk = tile.nt * tile.vt
    blocks = -(-n // chunk)
    resident = sm_count(device_id) * max(1, 2048 // tile.nt)
    smem = 0
    if algorithm.startswith("shared"):
        smem = nbins * (8 if weighted else 4)
        # Enough items per block that the merge (<= nbins atomics a block) stays small.
        grid = min(blocks, resident, max(sm_count(device_id), n // (4 * nbins)))
    else:
        grid = min(blocks, resident)
    grid = max(1, grid)
    args = (x, w if weighted else x, np.int64(n), out, np.int64(nbins), edges, np.float64(lo),
            np.float64(norm), np.float64(e0), np.float64(eN))
    fn = hist_kernel(mode, weighted, algorithm, tile)
    _launch.kernel_for(fn, ("hist", mode, weighted, algorithm, tile), args).launch(grid, tile.nt, handle, smem,
                                                                           *args)


def _input(x, name):
    a = _arrays.describe(x, name)
    if a.ndim != 1:
        raise ValueError("cufold: %s must be 1-D; got shape %s" % (name, a.shape))
    return a


def _weights(weights, n, kinds):
    if weights is None:
        return None
    w = _input(weights, "weights")
    if w.size != n:
        raise ValueError("cufold: weights and x must be equally long; got %d and %d" % (w.size, n))
    if w.dtype.kind not in kinds:
        raise TypeError("cufold: weights of dtype %s are not supported" % w.dtype)
    return w


def _with_weights(a, weights, kinds, stream):
    """Validated ``weights`` (or None), the launch stream, and the stream to
    allocate outputs on (None: the library's current one)."""
    w = _weights(weights, a.size, kinds)
    handle = _arrays.stream_handle(a if w is None else (a, w), stream)
    if w is not None:
        _arrays.same_device((a, w), "x and weights")
    return w, handle, (handle if stream is not None else None)


def _device_minmax(a, handle, alloc_stream):
    """(min, max) of ``a`` as host scalars: one device reduction, one synchronisation."""
    from ..ops import minmax          # a reduction too once cufold.device is imported
    _, buf = _arrays.empty(a, (2,), a.dtype, alloc_stream)
    size = a.dtype.itemsize
    minmax(a, out=(buf.view(a.dtype, (1,), 0), buf.view(a.dtype, (1,), size)), stream=handle)
    host = to_host(buf, handle, a.device_id)
    return host[0], host[1]


def _dummy(device_id):
    """A one-element float64 device array standing for the edges of bincount (never read)."""
    got = _dummies.get(device_id)
    if got is None:
        with _launch._numba_device_ctx(device_id):
            got = _dummies[device_id] = _arrays.describe(cuda.device_array(1, np.float64), "edges")
    return got


_dummies = {}


def bincount(x, weights=None, minlength=0, *, stream=None, algorithm=None):
    """Count the occurrences of each value of a non-negative integer array (``numpy.bincount``).

    Parameters
    ----------
    x : 1-D CUDA array of integers (any width, signed or unsigned) or bools.
    weights : optional CUDA array as long as ``x`` (any real dtype): the result
        sums them per value (float64) instead of counting.
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
    with _launch.nvtx_range("cufold.bincount"):
        a = _input(x, "x")
        if a.dtype.kind not in "biu":
            raise TypeError("cufold: bincount takes integers; x has dtype %s (NumPy: cannot cast "
                            "safely to int64)" % a.dtype)
        minlength = operator.index(minlength)
        if minlength < 0:
            raise ValueError("cufold: minlength must be non-negative, got %d" % minlength)
        n = a.size
        w, handle, alloc_stream = _with_weights(a, weights, "biuf", stream)
        nbins = minlength
        if n > 0:
            lo, hi = _device_minmax(a, handle, alloc_stream)
            if int(lo) < 0:
                raise ValueError("cufold: bincount's x must have no negative elements (min is %d)"
                                 % int(lo))
            nbins = max(int(hi) + 1, minlength)
        obj, out = _arrays.empty(a, (nbins,), np.float64 if w is not None else np.int64, alloc_stream)
        if nbins > 0:
            _count("int", a, w, n, out, nbins, _dummy(a.device_id), 0.0, 0.0, 0.0, 0.0, algorithm, handle,
                   a.device_id)
        return _arrays.to_library(obj, a)


# --- histogram edges ----------------------------------------------------------------------------------

_EDGE_CACHE = collections.OrderedDict()
_EDGE_CACHE_SIZE = 64


def _range_key(range):
    return tuple((type(v).__name__, repr(v)) for v in range)


def _cached_edges(key, make_host_edges, device_id):
    """(host edges, device copy) of uniform edges for a (bins, range, dtype) seen
    before: NumPy computes them (``make_host_edges()``, ~20 us of host time) and the
    upload synchronises once per key."""
    got = _EDGE_CACHE.get(key)
    if got is not None:
        _EDGE_CACHE.move_to_end(key)
        return got
    host_edges = np.ascontiguousarray(make_host_edges())
    with _launch._numba_device_ctx(device_id):
        got = host_edges, _arrays.describe(cuda.to_device(host_edges), "edges")     # synchronous upload
    _EDGE_CACHE[key] = got
    if len(_EDGE_CACHE) > _EDGE_CACHE_SIZE:
        _EDGE_CACHE.popitem(last=False)
    return got


def _upload(host, arr, handle):
    """Copy host array ``host`` into device array ``arr`` on raw stream ``handle``."""
    nb = _arrays.as_numba(arr)
    if SIMULATOR:
        nb.copy_to_device(host)
        return
    with _launch._numba_device_ctx(arr.device_id):
        if not handle:
            nb.copy_to_device(host)
        else:
            nb.copy_to_device(host, stream=cuda.external_stream(handle))


def _host_edges(bins, handle):
    """An edge array given as ``bins``: a host sequence, or a device array (copied
    to the host: one synchronisation)."""
    if isinstance(bins, np.ndarray) or isinstance(bins, (list, tuple)):
        return np.asarray(bins)
    try:
        e = _arrays.describe(bins, "bins")
    except TypeError:
        return np.asarray(bins)
    return to_host(e, handle)


def histogram(x, bins=10, range=None, *, weights=None, stream=None, algorithm=None):  # noqa: A002
    """Histogram of a 1-D array, as ``numpy.histogram``: returns ``(counts, edges)``.

    Parameters
    ----------
    x : 1-D CUDA array of integers or floats (any width).
    bins : an int (that many equal-width bins over ``range``), or an array of
        monotonically increasing edges (a host sequence or a device array).
    range : ``(lower, upper)`` for equal-width bins; default ``(min(x),
        max(x))``. Values outside it, and NaN, are not counted; the last bin
        includes its upper edge.
    weights : optional CUDA array as long as ``x``; the result sums them per
        bin (accumulated in float64, returned in the weights' dtype, as NumPy).
    stream : the library's stream object or a raw ``CUstream`` handle.
    algorithm : one of ``ALGORITHMS`` (see the module doc); None chooses.

    Returns ``(counts, edges)``: counts int64 (or the weights' dtype) and the
    edges in NumPy's dtype (the input's float dtype, float64 for integers, the
    given edges' dtype), both device arrays of ``x``'s library. Without
    ``range=`` (and with ``bins`` an int) **the host synchronises once** to read
    ``min(x)`` and ``max(x)``, and a non-finite extreme (NaN, inf) raises
    ValueError as in NumPy. NumPy's estimators (``bins='auto'``...) are not
    supported. The bins are NumPy's exactly, also for values on an edge
    (except where rounding the edges to a float16 input makes two edges equal).

    Example::

        >>> counts, edges = cufold.histogram(cupy.asarray([0.5, 1.5, 1.7, 3.]), bins=3, range=(0, 3))
        >>> counts, edges
        (array([1, 2, 1]), array([0., 1., 2., 3.]))
    """
    with _launch.nvtx_range("cufold.histogram"):
        a = _input(x, "x")
        if a.dtype.kind not in "iuf":
            raise TypeError("cufold: histogram takes integers or floats; x has dtype %s" % a.dtype)
        n = a.size
        w, handle, alloc_stream = _with_weights(a, weights, "iuf", stream)
        if isinstance(bins, str):
            raise TypeError("cufold: histogram's bins must be an integer or an array of edges; "
                            "NumPy's estimators (%r) are not supported" % bins)
        probe = np.empty(0, a.dtype)
        edges = None
        if np.ndim(bins) == 0:
            mode = "uniform"
            if range is None and n > 0:
                lo, hi = _device_minmax(a, handle, alloc_stream)
                probe = np.array([lo, hi], a.dtype)
            if range is not None:
                key = (operator.index(bins), _range_key(range), a.dtype.str, a.device_id)
                host_edges, edges = _cached_edges(
                    key, lambda: np.histogram_bin_edges(probe, bins=bins, range=range), a.device_id)
            else:
                host_edges = np.histogram_bin_edges(probe, bins=bins, range=range)
        else:
            mode = "edges"
            host_edges = np.histogram_bin_edges(probe, bins=_host_edges(bins, handle), range=range)
        host_edges = np.ascontiguousarray(host_edges)
        if host_edges.dtype.kind not in "iuf":
            raise TypeError("cufold: bin edges of dtype %s are not supported" % host_edges.dtype)
        nbins = host_edges.size - 1
        edges_obj, edges_out = _arrays.empty(a, (nbins + 1,), host_edges.dtype, alloc_stream)
        if edges is not None:
            _copy(edges, edges_out, nbins + 1, handle)
        else:
            _upload(host_edges, edges_out, handle)
            edges = edges_out
        first, last = float(host_edges[0]), float(host_edges[-1])
        norm = nbins / (last - first) if last > first else 0.0
        out_dt = np.dtype(np.int64) if w is None else w.dtype
        counts_obj, counts = _arrays.empty(a, (nbins,), out_dt, alloc_stream)
        acc = counts
        if w is not None and out_dt != np.float64:                      # float64, then converted
            _, acc = _arrays.empty(a, (nbins,), np.float64, alloc_stream)
        _count(mode, a, w, n, acc, nbins, edges, first, norm, first, last, algorithm, handle,
               a.device_id)
        if acc is not counts:
            _copy(acc, counts, nbins, handle)
        return _arrays.to_library(counts_obj, a), _arrays.to_library(edges_obj, a)
