"""Device-wide scans: ``inclusive_scan``, ``exclusive_scan`` and the NumPy-style
``cumsum``, ``cumprod``, ``cummax``, ``cummin``.

A tile is ``NT`` threads x ``VT`` items, as in the device reduce. Every
algorithm scans a tile the same way (Modern GPU style, seed 002), with the
tile held in shared memory from load to store:

1. *load*: each warp reads its ``32*VT`` consecutive items with coalesced
   (striped) loads, all issued before any is used, into its own slice of
   shared memory (a warp-private transpose: ``cuda.syncwarp``, no block
   barrier);
2. *scan*: ``cufold.block.inclusive_scan`` / ``exclusive_scan`` with
   ``items_per_thread=VT`` over each thread's ``VT`` consecutive items
   (blocked order), read from shared memory and written back over them
   (register blocking: a sequential scan per thread, a cooperative scan over
   the threads' totals), whose ``prefix`` callback supplies the carry-in of
   everything before the tile. No item is held in a register across the
   carry-in (the look-back), which keeps registers low (an int32 or float32
   inclusive scan: 32, so eight blocks of 256 threads fit on an SM);
3. *store*: each warp writes its slice out with coalesced stores.

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

Fields not wanted: ``out=`` of a tuple result may hold None for fields the
caller does not want (``out=(None, h)``: an affine recurrence's ``h`` without
the running products). The kernels are made for a ``values.OutputType``, whose
arrays are the stored fields' only and whose stores leave the others out of the
code (no argument, no address, no store); everything before the store (the
block scans, the look-back and its tile states, ``total=``) still carries the
whole value. Views that are gathered before they are scanned gather every field
into new arrays (not returned) and are scanned from there into ``out``.

The single-pass scan's tile states live in a buffer per (device, stream),
in one of two layouts (:func:`_tile_states`). An accumulator of at most 4
bytes (one field) is *packed*: one ``uint64`` word per tile holds the status
in its high half and the value's bits in its low half, published with one
atomic exchange and read with one load, with no fence (as CUB's). Wider and
tuple accumulators use *flags*, one ``uint32`` per tile, and value arrays
(aggregates and prefixes), with a fence between value and flag. A status is
EMPTY / AGGREGATE / PREFIX in the low 2 bits and a launch *epoch* above them:
a state of an older launch reads as EMPTY, so no memset is needed between
launches. A waiting tile polls with a plain (volatile) load, not an atomic
(:func:`_state_reader`). The buffer also holds the tile counter that hands out
tile ids (reset to 0 by the block drawing the last ticket). It grows with the
largest input seen and is never allocated per call after warm-up.

``CUFOLD_SCAN_VARIANT`` (read at plan time; see :class:`Variant`) selects
alternatives of the single-pass kernel for measurement, ``CUFOLD_TILE=NTxVT``
the tile.
"""

import collections
import functools
import os

import numpy as np
from numba import config, cuda

from .. import _codegen, block
from ..ops import as_op, as_transform, maximum, minimum, multiplies, plus
from ..values import InputType, OutputType, ValueType
from ..host import arrays as _arrays, dispatch as _dispatch, launch as _launch, programs as _programs, types as _types
from ..host.launch import Tile, fill
from .reduce import tile_for as _reduce_tile_for

__all__ = ["ALGORITHMS", "inclusive_scan", "exclusive_scan", "cumsum", "cumprod", "cummax",
           "cummin", "plan", "run", "choose", "tile_for"]

ALGORITHMS = ("single_pass", "reduce_then_scan", "single_block")
_dispatch.register("scan", ALGORITHMS)

#: Inputs of at most this many tiles go to ``single_block`` when no algorithm is named.
SINGLE_BLOCK_TILES = 1
#: ``reduce_then_scan`` scans its spine in one block when the spine has at most
#: this many (spine) tiles, else it recurses.
SPINE_BLOCK_TILES = 16

#: Threads per SM the flat single-pass kernel of the ``overlap`` ids is bounded to
#: (``launch_bounds``; 0: unbounded). ``CUFOLD_OVERLAP_THREADS``.
OVERLAP_THREADS_PER_SM = int(os.environ.get("CUFOLD_OVERLAP_THREADS", "2048"))

FULL_MASK = 0xFFFFFFFF
_U32 = ValueType.of(np.uint32)
# Tile states of the look-back (the low two bits of a flag).
EMPTY, AGGREGATE, PREFIX, OUTSIDE = 0, 1, 2, 3
# A launch's epoch is taken modulo 2^28: a flag or state word read as a float
# (_state_reader) then never has an all-ones exponent, so it is never a NaN.
_EPOCH_MASK = (1 << 28) - 1
# A state buffer serves this many launches counted on the host, then a fresh one
# replaces it, before an epoch could come round again to a stale state's.
_EPOCH_LIMIT = 1 << 27
_LOW32 = np.uint64(0xFFFFFFFF)


# --- variants (for measuring; CUFOLD_SCAN_VARIANT) ------------------------------------------

Variant = collections.namedtuple("Variant", "states poll hints ids")
Variant.__doc__ = """How a scan kernel is built, beyond the operator, types and tile.

``states`` (single_pass): ``packed`` puts a tile's status and a value of at
most 4 bytes in one 64-bit word (one store publishes both, one load reads
both, no fence); wider values, and every value with ``wide``, use a flag array
and value arrays with a fence between value and flag. ``poll``: how a waiting
tile reads a flag, ``volatile`` (a plain load that bypasses L1) or ``atomic``
(an atomic OR of 0 at L2). ``hints``: ``stream`` loads the input and stores the
output with evict-first hints (``ld.global.cs`` / ``st.global.cs``; data
touched once), ``plain`` without. ``ids``: tile ids from an atomic ``ticket``
(in the order blocks start: forward progress is guaranteed) or ``blockid``
(``blockIdx.x``, as CUB: relies on blocks starting in index order; the launch's
epoch is still drawn, before the tile's loads) or ``overlap`` (``blockIdx.x`` too,
and the draw's round trip overlaps the tile's loads: thread 0 issues it first and
settles it after them); ``auto`` (the default): ``overlap`` for packed states (not bool), where
it was measured faster (flat float32 and int32 cumsums of 2^24 items 45 -> 39 us on
an H200), ``ticket`` for the others (int32 summed as int64, pair states, lost 7%)."""

DEFAULT_VARIANT = Variant("packed", "volatile", "stream", "auto")
_VARIANT_WORDS = {w: f for f, words in (("states", ("packed", "wide")),
                                        ("poll", ("volatile", "atomic")),
                                        ("hints", ("stream", "plain")),
                                        ("ids", ("auto", "ticket", "blockid", "overlap"))) for w in words}


def variant(text=None):
    """The :class:`Variant` named by ``text`` (default: ``$CUFOLD_SCAN_VARIANT``,
    read at plan time), comma-separated words such as ``"wide,atomic"``;
    unnamed fields keep :data:`DEFAULT_VARIANT`'s choice."""
    return _parse_variant(os.environ.get("CUFOLD_SCAN_VARIANT", "") if text is None else text)


@functools.lru_cache(maxsize=64)
def _parse_variant(text):
    fields = {}
    for word in text.replace(" ", "").lower().split(","):
        if not word or word == "default":
            continue
        if word not in _VARIANT_WORDS:
            raise ValueError("cufold: unknown scan variant %r in CUFOLD_SCAN_VARIANT; known: %s"
                             % (word, ", ".join(sorted(_VARIANT_WORDS))))
        fields[_VARIANT_WORDS[word]] = word
    return DEFAULT_VARIANT._replace(**fields)


def tile_for(in_vt, acc_vt, n=None):
    """Threads per block and items per thread for a scan of ``n`` (where given)
    ``in_vt`` values accumulated as ``acc_vt``.

    ``CUFOLD_TILE=NTxVT`` overrides (as for the reduce; ``NT`` a multiple of
    32). The simulator uses the reduce's tiny tiles, so that small test inputs
    cross tile boundaries (fuller ones for large inputs: ``_launch.simulator_tile``).
    On a GPU: 256 threads, and as many items per thread as keep the tile's shared
    memory at 32 KiB or less (16 for 4-byte values).
    """
    if os.environ.get("CUFOLD_TILE"):
        tile = _reduce_tile_for(in_vt, acc_vt)
    elif config.ENABLE_CUDASIM:
        tile = _reduce_tile_for(in_vt, acc_vt)
        if n is not None:
            tile = _launch.simulator_tile(tile, n)
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


def _packable(vt):
    """Whether a value fits in the low half of a 64-bit state word (one field of
    at most 4 bytes; not float16, which Numba cannot bit-cast, and which is
    never an accumulator anyway)."""
    return vt.arity == 1 and vt.itemsize <= 4 and vt.fields[0] != np.float16


def _chunks(vt):
    """The 32-bit chunks of a value of ``vt`` (a field of 8 bytes is two), or None
    where a field cannot be bit-cast (float16, which is never an accumulator)."""
    if any(f == np.float16 or f.itemsize > 8 for f in vt.fields):
        return None
    return sum(1 if f.itemsize <= 4 else 2 for f in vt.fields)


def _pairable(vt):
    """Whether a value is two 32-bit chunks (int64, float64, or two fields of at most
    4 bytes: the affine pair of float32): the ``pair`` layout of :func:`_tile_states`."""
    return _chunks(vt) == 2


def state_layout(states, acc_vt, in_vt=None):
    """The tile-state layout a look-back of ``acc_vt`` uses when ``states`` (a
    :class:`Variant`'s) is asked for: ``packed`` (one word a tile), ``pair`` (two
    words, each with its own copy of the status) or ``wide`` (flags and value arrays).

    ``pair`` only where the input's fields are of at most 4 bytes (``in_vt``; None:
    any): there the kernels keep 32 registers and 8 blocks per SM (int32 summed as
    int64, pairs of float32); with 8-byte inputs (int64, float64) ptxas gives the pair
    look-back 36-39 registers, 6 blocks per SM, where ``wide`` keeps 8 (occupancy
    decided the scan's speed: docs/performance.md), so those stay ``wide``."""
    if states == "packed":
        if _packable(acc_vt):
            return "packed"
        if _pairable(acc_vt) and (in_vt is None or all(f.itemsize <= 4 for f in in_vt.fields)):
            return "pair"
    return "wide"


def single_pass_variant(var, acc_vt, in_vt=None):
    """``var`` with the state layout (:func:`state_layout`) and the tile ids (``auto``:
    see :class:`Variant`) a single-pass look-back over ``acc_vt`` uses."""
    states = state_layout(var.states, acc_vt, in_vt)
    return var._replace(states=states, ids=tile_ids(var.ids, states, acc_vt))


def tile_ids(ids, states, acc_vt):
    """The tile ids a look-back over ``states`` of ``acc_vt`` uses for ``ids`` (``auto``:
    see :class:`Variant`)."""
    if ids != "auto":
        return ids
    # (bool: under overlap's bound its logical_or kernel spills, ptxas sm_90: 48 bytes)
    return "overlap" if states == "packed" and acc_vt.fields[0] != np.bool_ else "ticket"


def state_words(layout):
    """uint64 state words a tile takes in a look-back state (``wide``: its flag only)."""
    return 2 if layout == "pair" else 1


@functools.lru_cache(maxsize=None)
def _pair_codec(vt):
    """``(to_words, from_words)`` device functions: a value of a pairable ``vt`` as
    two uint64 holding 32 bits each (low first), and back."""
    env = dict(vt._env())
    if vt.arity == 1:                            # one 8-byte field: its two halves
        env["U"] = np.uint64
        to = ("def to_words(v):\n    b = T0(%s).view(U)\n"
              "    return b & np.uint64(0xFFFFFFFF), b >> np.uint64(32)\n" % vt._field("v", 0))
        back = ("def from_words(w0, w1):\n    return %s\n"
                % vt._pack(["((w1 << np.uint64(32)) | (w0 & np.uint64(0xFFFFFFFF))).view(T0)"]))
        return _codegen.build(to, "to_words", env), _codegen.build(back, "from_words", env)
    parts_to, parts_back = [], []
    for i, f in enumerate(vt.fields):             # two fields of at most 4 bytes: one each
        v, w = vt._field("v", i), "w%d" % i
        if f.kind == "b":
            parts_to.append("np.uint64(1 if %s else 0)" % v)
            parts_back.append("(%s & np.uint64(1)) != 0" % w)
        else:
            env["U%d" % i] = np.dtype("u%d" % f.itemsize).type
            parts_to.append("np.uint64(T%d(%s).view(U%d))" % (i, v, i))
            parts_back.append("U%d(%s & np.uint64(%d)).view(T%d)" % (i, w, (1 << 8 * f.itemsize) - 1, i))
    to = "def to_words(v):\n    return %s, %s\n" % tuple(parts_to)
    back = "def from_words(w0, w1):\n    return %s\n" % vt._pack(parts_back)
    return _codegen.build(to, "to_words", env), _codegen.build(back, "from_words", env)


@functools.lru_cache(maxsize=None)
def _word_codec(vt):
    """``(to_bits, from_bits)`` device functions: a value of a packable ``vt`` as
    the low 32 bits of a uint64 (its bit pattern, zero-extended), and back."""
    f = vt.fields[0]
    if f.kind == "b":
        to_bits = "def to_bits(v):\n    return np.uint64(1 if %s else 0)\n" % vt._field("v", 0)
        from_bits = "def from_bits(w):\n    return %s\n" % vt._pack(["(w & np.uint64(1)) != 0"])
        env = {}
    else:
        env = dict(vt._env(), U=np.dtype("u%d" % f.itemsize).type)
        to_bits = "def to_bits(v):\n    return np.uint64(T0(%s).view(U))\n" % vt._field("v", 0)
        from_bits = "def from_bits(w):\n    return %s\n" % vt._pack(
            ["U(w & np.uint64(%d)).view(T0)" % ((1 << 8 * f.itemsize) - 1)])
    return (_codegen.build(to_bits, "to_bits", env), _codegen.build(from_bits, "from_bits", env))


@functools.lru_cache(maxsize=None)
def _state_reader(poll, dtype):
    """Device function ``(array, same_as_float, j) -> word``: an atomic read of
    ``array[j]`` (uint32 flags or uint64 state words) that no compiler keeps
    out of a polling loop.

    ``volatile``: ``cuda.atomic.nanmax(same_as_float, j, NaN)``, on a float
    view of the same memory. NaN is a missing value to ``nanmax``, so it
    changes nothing and returns the word as it was; Numba lowers it to a single
    ``ld.volatile.global`` (a relaxed load from L2). ``cuda.ldcg`` would be
    cheaper to write but is inline assembly without side effects, which NVVM
    hoists out of the loop (checked in the PTX: the loop then spins forever).
    ``atomic``: ``cuda.atomic.or_(array, j, 0)``, a read-modify-write at L2.
    """
    as_int = np.dtype(dtype).type
    nan = (np.float64 if np.dtype(dtype).itemsize == 8 else np.float32)(np.nan)
    if poll == "atomic":
        zero = as_int(0)

        @cuda.jit(device=True)
        def read_or(array, as_float, j):
            return cuda.atomic.or_(array, j, zero)

        return read_or

    @cuda.jit(device=True)
    def read_volatile(array, as_float, j):
        return cuda.atomic.nanmax(as_float, j, nan).view(as_int)

    return read_volatile


@cuda.jit(device=True, inline="always")
def _status_of(flag, tag):
    """The status in a flag (uint32), EMPTY unless it is of this launch (``tag``'s epoch)."""
    if np.uint32(flag >> np.uint32(2)) == np.uint32(tag >> np.uint32(2)):
        return np.int32(flag & np.uint32(3))
    return np.int32(EMPTY)


@functools.lru_cache(maxsize=None)
def _tile_states(acc_vt, layout, poll):
    """``(publish, wait)``: a tile's look-back state in memory.

    ``publish(lb, j, tag, status, value)`` (one lane) makes tile ``j``'s
    ``status`` (AGGREGATE or PREFIX) and ``value`` visible to other blocks.
    ``wait(lb, j, tag, placeholder) -> (status, value)`` (every lane of a warp,
    each its own ``j``) returns once every lane's tile has published something
    in this launch (``tag``'s epoch); tiles before 0 are OUTSIDE, with
    ``placeholder`` as their value.

    ``packed`` (``lb = (words, words as float64)``): the high half of a uint64
    word is ``tag | status``, the low half the value's bits. A 64-bit access is
    single-copy atomic, so the value is never seen without its flag: one atomic
    exchange publishes, one load per predecessor reads, and there is no fence.
    ``pair`` (the same ``lb``; tile ``j`` at words ``2j`` and ``2j + 1``): a value
    of two 32-bit chunks (int64, float64, a pair of float32), each chunk in the low
    half of its own word beside its own copy of ``tag | status``: two atomic
    exchanges publish, two loads read, and a reader takes a state only where both
    words show the same status of this launch (else it reads again), so it never
    mixes halves of two publishes; no fence either (as CUB's 16-byte words).
    ``wide`` (``lb = (flags, flags as float32, aggregates, prefixes)``): the
    value goes to its own array first, a fence, then the flag; a reader sees
    the flag, fences, then reads the value.
    """
    if layout == "pair":
        to_words, from_words = _pair_codec(acc_vt)
        read_pair = _state_reader(poll, np.uint64)

        @cuda.jit(device=True)
        def publish_pair(lb, j, tag, status, value):
            high = np.uint64(tag | status) << np.uint64(32)
            w0, w1 = to_words(value)
            cuda.atomic.exch(lb[0], 2 * j, high | w0)
            cuda.atomic.exch(lb[0], 2 * j + 1, high | w1)

        @cuda.jit(device=True)
        def wait_pair(lb, j, tag, placeholder):
            while True:
                s = np.int32(OUTSIDE)
                w0 = np.uint64(0)
                w1 = np.uint64(0)
                if j >= 0:
                    w0 = read_pair(lb[0], lb[1], 2 * j)
                    w1 = read_pair(lb[0], lb[1], 2 * j + 1)
                    s = _status_of(np.uint32(w0 >> np.uint64(32)), tag)
                    if _status_of(np.uint32(w1 >> np.uint64(32)), tag) != s:
                        s = np.int32(EMPTY)      # one half of a newer publish: read again
                if cuda.all_sync(FULL_MASK, s != EMPTY):
                    break
            return s, (from_words(w0, w1) if s != OUTSIDE else placeholder)

        return publish_pair, wait_pair

    if layout == "packed":
        to_bits, from_bits = _word_codec(acc_vt)
        read_word = _state_reader(poll, np.uint64)

        @cuda.jit(device=True)
        def publish_word(lb, j, tag, status, value):
            word = (np.uint64(tag | status) << np.uint64(32)) | to_bits(value)
            cuda.atomic.exch(lb[0], j, word)

        @cuda.jit(device=True)
        def wait_words(lb, j, tag, placeholder):
            while True:
                s = np.int32(OUTSIDE)
                w = np.uint64(0)
                if j >= 0:
                    w = read_word(lb[0], lb[1], j)
                    s = _status_of(np.uint32(w >> np.uint64(32)), tag)
                if cuda.all_sync(FULL_MASK, s != EMPTY):
                    break
            return s, (from_bits(w) if s != OUTSIDE else placeholder)

        return publish_word, wait_words

    publish_value, fetch = _publish(acc_vt), _fetch(acc_vt)
    read_flag = _state_reader(poll, np.uint32)

    @cuda.jit(device=True)
    def publish_flag(lb, j, tag, status, value):
        flags, as_float, aggs, pres = lb
        if status == PREFIX:
            publish_value(pres, j, value)
        else:
            publish_value(aggs, j, value)
        cuda.threadfence()                       # the value before the flag
        cuda.atomic.exch(flags, j, np.uint32(tag | status))

    @cuda.jit(device=True)
    def wait_flags(lb, j, tag, placeholder):
        flags, as_float, aggs, pres = lb
        while True:
            s = np.int32(OUTSIDE)
            if j >= 0:
                s = _status_of(read_flag(flags, as_float, j), tag)
            if cuda.all_sync(FULL_MASK, s != EMPTY):
                break
        cuda.threadfence()                       # the values were written before the flags
        value = placeholder
        if s == PREFIX:
            value = fetch(pres, j)
        elif s == AGGREGATE:
            value = fetch(aggs, j)
        return s, value

    return publish_flag, wait_flags


@functools.lru_cache(maxsize=None)
def _local_items(vt, count):
    """Device function ``() -> items``: ``count`` values of ``vt`` in registers
    (a tuple of local arrays for a tuple type; inlined, so it can return them)."""
    lines = ["    a%d = cuda.local.array(%d, T%d)" % (i, count, i) for i in range(vt.arity)]
    src = "def local_items():\n%s\n    return %s\n" % (
        "\n".join(lines), vt._pack(["a%d" % i for i in range(vt.arity)]))
    return cuda.jit(device=True, inline="always")(
        _codegen.build(src, "local_items", vt._env(), device=False))


@functools.lru_cache(maxsize=None)
def _lane_io(vt, hints):
    """``(view, load, store)`` for data touched once. ``view(arrays, start)``:
    the arrays from element ``start`` on (a slice per field), which ``load(view,
    k)`` / ``store(view, k, value)`` then reach at offsets ``k``: a lane's
    ``VT`` accesses share one address register plus constant offsets.

    Numeric fields go through the cache-hinted ``cuda.ld*`` / ``cuda.st*``:
    with ``hints='stream'`` ``ldcs`` / ``stcs`` (evict-first: the scan's input
    and output need not stay in L2 for it), with ``'plain'`` ``ldca`` /
    ``stwb`` (PTX's defaults, the same as plain accesses; through the same
    path, because LLVM folds a plain access of a slice back into the whole
    array's indexing and spends a 64-bit address on each). Bool fields are
    plain accesses. A result with fields not stored (``values.OutputType``) has
    arrays for the others only: its view and store reach those (its load is None)."""
    ld, st = ("ldcs", "stcs") if hints == "stream" else ("ldca", "stwb")
    hinted = [f.kind in "iuf" for f in vt.fields]
    sources = getattr(vt, "sources", None)
    if sources is not None:        # generated fields (values.InputType): no memory, no slice
        return _generated_lane_io(vt, sources, ld, hinted)
    arrays = vt._arrays_in("a")
    # Inlined: Numba returns no array from a device function that did not receive it.
    view = cuda.jit(device=True, inline="always")(_codegen.build(
        "def view(a, start):\n    return %s\n" % vt._pack_arrays(["%s[start:]" % a for _, a in arrays]),
        "view", device=False))
    load = None
    if not isinstance(vt, OutputType):
        load = _codegen.build("def load(a, k):\n    return %s\n" % vt._pack(
            ["cuda.%s(%s, k)" % (ld, vt._field("a", i)) if h else "%s[k]" % vt._field("a", i)
             for i, h in enumerate(hinted)]), "load")
    lines = ["    cuda.%s(%s, k, %s)" % (st, a, vt._field("v", i)) if hinted[i] else
             "    %s[k] = %s" % (a, vt._field("v", i)) for i, a in arrays]
    store = _codegen.build("def store(a, k, v):\n%s\n" % "\n".join(lines), "store")
    return view, load, store


def _generated_lane_io(vt, sources, ld, hinted):
    """``_lane_io``'s view and load for an input with generated fields: a counting
    field's view from ``start`` is its start moved on by ``start``, a constant's is
    itself; stored fields are sliced and loaded as there. (Inputs are never stored to.)"""
    views, loads = [], []
    for i, src in enumerate(sources):
        a = vt._field("a", i)
        if src == "array":
            views.append("%s[start:]" % a)
            loads.append("cuda.%s(%s, k)" % (ld, a) if hinted[i] else "%s[k]" % a)
        elif src in ("counting", "countdown"):          # countdown: a reversed counting (_reversed)
            sign = "+" if src == "counting" else "-"
            views.append("T%d(%s %s T%d(start))" % (i, a, sign, i))
            loads.append("T%d(%s %s T%d(k))" % (i, a, sign, i))
        else:
            views.append(a)
            loads.append(a)
    env = vt._env()
    view = cuda.jit(device=True, inline="always")(_codegen.build(
        "def view(a, start):\n    return %s\n" % vt._pack(views), "view", env, device=False))
    load = _codegen.build("def load(a, k):\n    return %s\n" % vt._pack(loads), "load", env)
    return view, load, None


@functools.lru_cache(maxsize=None)
def _to_acc(acc_vt, in_vt, transform):
    """Device function: an input item as an accumulator value (through ``transform``,
    an ops.Transform of ``in_vt``'s items, fused into the load, where one is given)."""
    if transform is None:
        return acc_vt.cast
    return _codegen.build("def to_acc(v):\n    return cast(tf(v))\n", "to_acc",
                          {"cast": acc_vt.cast, "tf": transform.device(in_vt)})


# --- tile input and output ---------------------------------------------------------------

def _layout(vt):
    """Padding period of a tile's shared-memory layout: item ``i`` sits in slot
    ``i + i // period`` (``period`` 0: no padding, slot ``i``)."""
    if vt % 2:
        return 0          # blocked accesses stride an odd number of banks: no conflict
    if 32 % vt == 0:
        return 32         # one slot per 32: striped and blocked accesses conflict-free
    return vt             # one slot per thread: blocked ones conflict-free, striped 2-way at worst


@functools.lru_cache(maxsize=None)
def _slot(period):
    """``slot(i)``: shared-memory slot of a tile's item ``i`` (``i + i // period``, see
    :func:`_layout`), in 32 bits (Numba computes in 64): fewer registers."""

    @cuda.jit(device=True, inline="always")
    def slot(i):
        i = np.int32(i)
        if period == 0:
            return i
        return np.int32(i + i // period)

    return slot


def _tile_slots(tile):
    """Shared-memory values a tile occupies (see :func:`_tile_io`)."""
    nv = tile.nt * tile.vt
    period = _layout(tile.vt)
    return nv + ((nv - 1) // period if period else 0)


_TileIO = collections.namedtuple("_TileIO", "load_tile store_tile fold_valid own_items")


@functools.lru_cache(maxsize=None)
def _tile_io(op, in_vt, acc_vt, out_vt, tile, hints="plain", transform=None):
    """Device functions moving one tile through shared memory ``smem``, where
    it stays from load to store: registers hold at most a thread's ``VT``
    values at a time, and none across the look-back, so that many blocks fit
    on an SM.

    Each warp owns ``32*VT`` consecutive items of the tile, and only its own
    lanes touch them (``cuda.syncwarp``, no block barrier): *striped* global
    accesses (coalesced: access ``k`` of lane ``l`` is the warp's item
    ``32k + l``) and *blocked* thread accesses (lane ``l`` owns the warp's
    items ``l*VT .. l*VT + VT - 1``). Item ``i`` of the tile sits in slot
    ``i + i // period`` (see :func:`_layout`): a thread's items are always
    consecutive slots, so its accesses share one address register.

    ``load_tile(xs, n, base, tid, smem)``: the tile into ``smem`` (items past
    ``n`` repeat ``x[n-1]``: real values, never counted); ``store_tile(outs,
    n, base, tid, smem)``: ``smem`` back out. In between, a thread reaches its
    own items only: ``own_items(smem, tid)`` (its ``VT`` items as arrays, for
    the block scans: they read them from shared memory and write the results
    back in place) and ``fold_valid(smem, valid, tid)`` (those among the tile's
    first ``valid``, folded in order; a thread with none gets a value not to be
    counted).
    """
    nt, vt = tile
    nv = nt * vt
    wv = 32 * vt                                 # items per warp
    period = _layout(vt)
    view_in, load_in, _ = _lane_io(in_vt, hints)
    view_out, _, store_out = _lane_io(out_vt, hints)
    to_acc, to_out = _to_acc(acc_vt, in_vt, transform), out_vt.cast
    load, store = acc_vt.load, acc_vt.store
    combine = op.combine(acc_vt)
    local_items = _local_items(acc_vt, vt)
    view_acc = _lane_io(acc_vt, "plain")[0]

    slot = _slot(period)

    @cuda.jit(device=True, inline="always")
    def striped_slot(tid, k):
        """Slot of lane ``tid % 32``'s striped access ``k``."""
        i = np.int32((tid >> 5) * wv + (tid & 31))
        if period == 0:
            return np.int32(i + 32 * k)
        if period == 32:
            return np.int32(slot(i) + 33 * k)
        return slot(i + 32 * k)

    @cuda.jit(device=True, inline="always")
    def own_slot(tid):
        """Slot of the thread's first (blocked) item; the others follow it."""
        return slot(np.int32(tid) * np.int32(vt))

    @cuda.jit(device=True)
    def load_tile(xs, n, base, tid, smem):
        items = local_items()
        at = base + (tid >> 5) * wv + (tid & 31)         # this lane's first striped item
        # Every load is issued before any is used.
        if base + nv <= n:
            mine = view_in(xs, at)
            for k in range(vt):
                store(items, k, to_acc(load_in(mine, 32 * k)))
        else:
            at = min(at, n - 1)
            mine = view_in(xs, at)
            last = np.uint32(n - 1 - at)         # < NV; unsigned: no wrap-around code
            for k in range(vt):
                store(items, k, to_acc(load_in(mine, min(np.uint32(32 * k), last))))
        for k in range(vt):
            store(smem, striped_slot(tid, k), load(items, k))
        cuda.syncwarp(FULL_MASK)

    @cuda.jit(device=True)
    def store_tile(outs, n, base, tid, smem):
        cuda.syncwarp(FULL_MASK)
        at = base + (tid >> 5) * wv + (tid & 31)
        mine = view_out(outs, at)
        if base + nv <= n:
            for k in range(vt):
                store_out(mine, 32 * k, to_out(load(smem, striped_slot(tid, k))))
        elif at < n:
            last = np.uint32(n - 1 - at)         # < NV
            for k in range(vt):
                if np.uint32(32 * k) <= last:
                    store_out(mine, 32 * k, to_out(load(smem, striped_slot(tid, k))))

    @cuda.jit(device=True)
    def fold_valid(smem, valid, tid):
        first = own_slot(tid)
        acc = load(smem, first)
        for k in range(1, vt):
            if tid * vt + k < valid:
                acc = combine(acc, load(smem, first + k))
        return acc

    @cuda.jit(device=True, inline="always")
    def own_items(smem, tid):
        """The thread's items, as arrays (a slice of ``smem`` per field)."""
        return view_acc(smem, own_slot(tid))

    return _TileIO(load_tile, store_tile, fold_valid, own_items)


# --- carry-in: the block scans' prefix callbacks ------------------------------------------
#
# Every lane of the block's first warp calls the callback with the tile's
# aggregate and the state tuple ``(tile, lb, tag, init, has_init, stash)``
# (single_pass: ``tag`` is the block's shared ``(ticket, tag)`` of :func:`draw`)
# (``lb``: the carry's arrays); lane 0's result goes in front of the tile's
# scan. Each writes the tile's exclusive prefix *without init* to ``stash[0]``
# (on lane 0, which is thread 0) for the total. Inclusive scans call it for
# tiles > 0 only (tile 0 has no carry-in, and an operator may have no
# identity); see ``_first``.

@functools.lru_cache(maxsize=None)
def _look_back(op, acc_vt, layout="wide", poll="volatile", published=False):
    """Decoupled look-back (single_pass); ``layout`` and ``poll`` as in
    :func:`_tile_states` and :func:`_state_reader`. ``published``: the caller has
    already published the tile's aggregate (tile 0: its prefix), as a block that
    looks back over several states in turn must before the first (a successor
    waits for every state of its window to be published).

    Forward progress: a tile waits only on earlier tiles, and tile ids go to
    blocks in the order they start (the ticket), so every tile waited on
    belongs to a block that is already running. The ``blockid`` and ``overlap``
    ids take ``blockIdx.x`` instead and rely, as CUB's scans do, on the GPU
    starting a launch's blocks in index order."""
    combine, store = op.combine(acc_vt), acc_vt.store
    publish, wait = _tile_states(acc_vt, layout, poll)
    shfl_down, shfl_idx = acc_vt.shuffle("down"), acc_vt.shuffle("idx")

    @cuda.jit(device=True)
    def suffix_total(value, start):
        """The values of lanes ``start .. 31`` combined in lane order, on every
        lane: a shuffle-down tree, whose result at lane ``start`` involves no
        lane below it (so no head flags: only lane arithmetic on constants)."""
        lane = cuda.laneid
        for step in range(5):
            other = shfl_down(FULL_MASK, value, 1 << step)
            if lane + (1 << step) < 32:
                value = combine(value, other)
        return shfl_idx(FULL_MASK, value, start)

    @cuda.jit(device=True)
    def look_back(aggregate, state):
        # ``drawn``: the block's shared (ticket, tag) of scan.draw; the tag is read where
        # it is used, so that no register holds it across the tile (one more live
        # register took int64 scans from 32 to 40 registers, 8 to 6 blocks per SM).
        tile, lb, drawn, init, has_init, stash = state
        lane = cuda.laneid
        if tile == 0:
            if lane == 0 and not published:      # the first tile's prefix is its aggregate
                publish(lb, 0, np.uint32(drawn[1]), PREFIX, aggregate)
            return init
        if lane == 0 and not published:          # publish the aggregate at once
            publish(lb, tile, np.uint32(drawn[1]), AGGREGATE, aggregate)
        exclusive = aggregate
        top = tile - 1                           # the predecessor lane 31 looks at
        tag = np.uint32(drawn[1])
        while True:
            j = top - 31 + lane                  # lanes take tiles in order
            s, value = wait(lb, j, tag, aggregate)   # OUTSIDE lanes: never counted
            prefixes = cuda.ballot_sync(FULL_MASK, s == PREFIX)
            start = 31 - cuda.clz(prefixes) if prefixes != 0 else 0
            # The window's part: from the last inclusive prefix on, in tile order.
            window = suffix_total(value, start)
            exclusive = window if top == tile - 1 else combine(window, exclusive)
            if prefixes != 0:
                break
            top -= 32
        if lane == 0:
            store(stash, 0, exclusive)
            publish(lb, tile, np.uint32(drawn[1]), PREFIX, combine(exclusive, aggregate))
        return combine(init, exclusive) if has_init else exclusive

    return look_back


@functools.lru_cache(maxsize=None)
def _spine_carry(op, acc_vt):
    """Downsweep (reduce_then_scan): ``lb`` is the spine, the inclusive scan of
    the tiles' partials, so tile ``t``'s carry-in is ``spine[t - 1]``."""
    combine, load, store = op.combine(acc_vt), acc_vt.load, acc_vt.store

    @cuda.jit(device=True)
    def spine_carry(aggregate, state):
        tile, spine, tag, init, has_init, stash = state
        if tile == 0:
            return init
        exclusive = load(spine, tile - 1)
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
        tile, lb, tag, init, has_init, stash = state
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


def _carry(spec):
    """The prefix callback of ``spec``'s kernel."""
    if spec.carry == "single_pass":
        return _look_back(spec.op, spec.acc_vt, spec.variant.states, spec.variant.poll)
    return {"downsweep": _spine_carry, "single_block": _running_carry}[spec.carry](
        spec.op, spec.acc_vt)


@functools.lru_cache(maxsize=None)
def _first(spec):
    """``first(aggregate, state)``, thread 0 after an inclusive scan's tile 0
    (scanned without a carry-in): what the carry callback would have recorded."""
    store = spec.acc_vt.store

    if spec.carry == "single_pass":
        publish, _ = _tile_states(spec.acc_vt, spec.variant.states, spec.variant.poll)

        @cuda.jit(device=True)
        def first(aggregate, state):
            publish(state[1], 0, np.uint32(state[2][1]), PREFIX, aggregate)     # state[2]: draw's (ticket, tag)
    elif spec.carry == "single_block":
        @cuda.jit(device=True)
        def first(aggregate, state):
            store(state[5], 1, aggregate)
    else:
        @cuda.jit(device=True)
        def first(aggregate, state):
            pass
    return first


# --- the kernel factory --------------------------------------------------------------------

Spec = collections.namedtuple("Spec", "op in_vt acc_vt out_vt tile kind carry variant transform",
                              defaults=(None,))
Spec.__doc__ = """What a scan kernel is compiled for. ``kind``: 'inclusive' or
'exclusive'; ``carry``: 'single_pass' (look-back), 'downsweep' (spine of
reduce_then_scan) or 'single_block' (running prefix); ``variant``: a
:class:`Variant` (its ``states`` says the layout actually used: 'packed' only
for a packable accumulator; fields that do not apply to ``carry`` are None);
``transform``: None or an ops.Transform applied to each item as it is loaded."""


@functools.lru_cache(maxsize=None)
def _block_scans(kind, op, acc_vt, nt, vt, carry):
    """``(scan(items, out, state, temp), scan_first(items, out, temp) ->
    aggregate, temp_items)``: the block scan after the ``carry`` callback's
    prefix and, for inclusive scans, the one for tile 0 (no carry-in, and the
    operator may have no identity; None for exclusive scans); one signature
    whatever ``vt``. Both take the caller's shared ``temp`` (``temp_items``
    values) and start with no barrier of their own: a block uses it once, or
    (single_block) once per tile after the loop's barrier."""
    make = block.inclusive_scan if kind == "inclusive" else block.exclusive_scan
    scan = make(op, acc_vt, nt, items_per_thread=vt, prefix=carry, storage=True)
    scan_first = block.inclusive_scan(op, acc_vt, nt, items_per_thread=vt, aggregate=True,
                                      storage=True) if kind == "inclusive" else None
    temp_items = max(scan.temp_items, scan_first.temp_items if scan_first is not None else 0)
    if vt > 1:
        return scan, scan_first, temp_items
    # One item per thread: the block primitives take and return the value itself.
    load, store = acc_vt.load, acc_vt.store
    scan_one, first_one = scan, scan_first

    @cuda.jit(device=True)
    def scan_item(items, out, state, temp):
        store(out, 0, scan_one(load(items, 0), state, temp))

    if first_one is None:
        return scan_item, None, temp_items

    @cuda.jit(device=True)
    def scan_first_item(items, out, temp):
        value, aggregate = first_one(load(items, 0), temp)
        store(out, 0, value)
        return aggregate

    return scan_item, scan_first_item, temp_items


@functools.lru_cache(maxsize=None)
def _tile_scan(spec):
    """``(tile_scan, temp_items)``: the device function scanning one tile,
    ``(xs, outs, n, tile, tiles, state, smem, temp, totals, want_total, pending)``,
    and the shared memory ``temp`` its block scans need (``pending``: of
    :func:`tile_draw`'s ``begin``; anything where ``carry`` is not single_pass). The block scans read a
    thread's items from the tile in shared memory and write the results over
    them, so that no item is held in a register across the look-back."""
    op, acc_vt, out_vt = spec.op, spec.acc_vt, spec.out_vt
    nt, vt = spec.tile
    nv = nt * vt
    io = _tile_io(op, spec.in_vt, acc_vt, out_vt, spec.tile, spec.variant.hints, spec.transform)
    load_tile, store_tile, fold_valid, own_items = io
    inclusive = spec.kind == "inclusive"
    scan, scan_first, temp_items = _block_scans(spec.kind, op, acc_vt, nt, vt, _carry(spec))
    block_reduce = block.reduce(op, acc_vt, nt, partial=True)
    first = _first(spec)
    combine, load = op.combine(acc_vt), acc_vt.load
    store_total, to_out = out_vt.plain.store, out_vt.cast       # the total: every field

    settle = tile_draw(spec.variant.ids if spec.carry == "single_pass" else "ticket")[1]

    @cuda.jit(device=True)
    def tile_scan(xs, outs, n, tile, tiles, state, smem, temp, totals, want_total, pending):
        tid = cuda.threadIdx.x
        base = tile * nv
        load_tile(xs, n, base, tid, smem)
        settle(state[2], pending)                # the overlap ids' draw, after the loads
        # total=True: the last tile folds its valid items before they are scanned in place.
        last = want_total and tile == tiles - 1
        part = fold_valid(smem, 1, tid)          # a placeholder of the right type
        if last:
            valid = n - base
            part = block_reduce(fold_valid(smem, valid, tid), (valid + vt - 1) // vt)
        mine = own_items(smem, tid)
        if inclusive and tile == 0:
            aggregate = scan_first(mine, mine, temp)
            if tid == 0:
                first(aggregate, state)
        else:
            scan(mine, mine, state, temp)
        if last and tid == 0:                    # the carry wrote stash[0] on this thread
            total = part if tile == 0 else combine(load(state[5], 0), part)
            store_total(totals, 0, to_out(total))
        store_tile(outs, n, base, tid, smem)

    return tile_scan, temp_items


@cuda.jit(device=True, inline="always")
def draw_issue(counter):
    """The counter word before this block's draw (:func:`draw`'s atomic alone)."""
    return cuda.atomic.add(counter, 0, np.uint64(1))


@cuda.jit(device=True, inline="always")
def draw_settle(counter, w, draws):
    """:func:`draw`'s ``(ticket, tag)`` from the word ``w`` of :func:`draw_issue`;
    the launch's last draw moves the epoch on."""
    ticket = np.int64(w & _LOW32)
    if ticket == draws - 1:
        cuda.atomic.add(counter, 0, np.uint64(4294967296 - draws))
    return ticket, np.uint32((np.uint32(w >> np.uint64(32)) & np.uint32(_EPOCH_MASK)) << np.uint32(2))


@cuda.jit(device=True)
def draw(counter, draws):
    """``(ticket, tag)`` for one block of a look-back launch (called by one thread).

    ``counter`` (a uint64 word per (device, stream)) holds the launch's epoch in
    its high half and the draws so far in its low half; the launch's last draw
    (of ``draws``) moves the epoch on and the count back to 0. The epoch lives on
    the device, so a launch replayed from a CUDA graph gets a new one, as an
    eager launch does. ``tag``: the epoch (modulo 2^28) in bits 2.. of a state."""
    return draw_settle(counter, draw_issue(counter), draws)


@cuda.jit(device=True, inline="always")
def drawn_ticket(counter, draws):
    """The block's shared ``(ticket, tag)`` of :func:`draw`, drawn by thread 0."""
    drawn = cuda.shared.array(2, np.int64)
    if cuda.threadIdx.x == 0:
        ticket, tag = draw(counter, draws)
        drawn[0] = ticket
        drawn[1] = tag
    cuda.syncthreads()
    return drawn


@functools.lru_cache(maxsize=None)
def tile_draw(ids):
    """``(begin, settle)``: how a look-back kernel's block gets its tile for ``ids``
    (:class:`Variant`; ``ticket``, ``blockid`` or ``overlap``).

    ``begin(counter, draws) -> (tile, drawn, pending)``, called by every thread at the
    start: ``drawn`` the block's shared ``(ticket, tag)`` of :func:`draw`. ``settle(drawn,
    pending)``, called by every thread once the tile's loads are issued: ``overlap``'s
    thread 0 issued its draw in ``begin`` and stores it now, so the draw's round trip
    overlaps the loads, with no barrier of its own (``drawn`` is read after the block's
    next barrier); nothing for the others, whose ``begin`` waits for the draw at a barrier."""
    if ids == "overlap":
        @cuda.jit(device=True, inline="always")
        def begin_overlapped(counter, draws):
            drawn = cuda.shared.array(2, np.int64)
            w = np.uint64(0)
            if cuda.threadIdx.x == 0:
                w = draw_issue(counter)
            return np.int64(cuda.blockIdx.x), drawn, (counter, w, draws)

        @cuda.jit(device=True, inline="always")
        def settle_draw(drawn, pending):
            counter, w, draws = pending
            if cuda.threadIdx.x == 0:
                ticket, tag = draw_settle(counter, w, draws)
                drawn[0] = ticket
                drawn[1] = tag

        return begin_overlapped, settle_draw

    by_ticket = ids == "ticket"

    @cuda.jit(device=True, inline="always")
    def begin_drawn(counter, draws):
        drawn = drawn_ticket(counter, draws)
        # Dynamic tile ids: tiles start in id order (see _look_back).
        return (drawn[0] if by_ticket else np.int64(cuda.blockIdx.x)), drawn, 0

    @cuda.jit(device=True, inline="always")
    def settled(drawn, pending):
        pass

    return begin_drawn, settled


@functools.lru_cache(maxsize=None)
def scan_kernel(spec):
    """The Python kernel function for ``spec`` (compiled by the launch path).

    Arguments: ``(xs, outs, n, tiles, counter, states, aggs, pres, init,
    has_init, totals, want_total)``; ``counter`` (the launch's epoch and tile
    tickets: :func:`draw`) and ``states`` (flags or state words, and the same
    memory as floats) matter to single_pass only, ``aggs`` to its wide layout,
    ``pres`` to that and to downsweep (the spine). Unused ones are
    placeholders. (Arguments nest one tuple deep at most: the launch path
    takes no deeper.)
    """
    tile_scan, temp_items = _tile_scan(spec)
    tile_storage = block.temp_storage(spec.acc_vt, _tile_slots(spec.tile))
    scan_storage = block.temp_storage(spec.acc_vt, temp_items)
    stash_storage = block.temp_storage(spec.acc_vt, 2)

    if spec.carry == "single_pass":
        begin = tile_draw(spec.variant.ids)[0]
        packed = spec.variant.states in ("packed", "pair")      # state words (no value arrays)

        def scan_single_pass(xs, outs, n, tiles, counter, states, aggs, pres, init,
                             has_init, totals, want_total):
            smem = tile_storage()
            temp = scan_storage()
            stash = stash_storage()
            tile, drawn, pending = begin(counter, tiles)
            lb = states if packed else (states[0], states[1], aggs, pres)
            state = (tile, lb, drawn, init, has_init, stash)
            tile_scan(xs, outs, n, tile, tiles, state, smem, temp, totals, want_total, pending)

        if spec.variant.ids == "overlap" and OVERLAP_THREADS_PER_SM:
            # The draw's word, live across the loads, would take float32's 32 registers to 40
            # (8 -> 6 blocks of 256 an SM); bounded, it keeps 32 with no spills (ptxas).
            nt = spec.tile.nt
            scan_single_pass.jit_options = {"launch_bounds": (nt, max(1, OVERLAP_THREADS_PER_SM // nt))}
        return scan_single_pass

    if spec.carry == "downsweep":
        def scan_downsweep(xs, outs, n, tiles, counter, states, aggs, pres, init, has_init,
                           totals, want_total):
            tag = np.uint32(0)                   # no tile states
            smem = tile_storage()
            temp = scan_storage()
            stash = stash_storage()
            tile = np.int64(cuda.blockIdx.x)
            state = (tile, pres, tag, init, has_init, stash)
            tile_scan(xs, outs, n, tile, tiles, state, smem, temp, totals, want_total, 0)

        return scan_downsweep

    def scan_single_block(xs, outs, n, tiles, counter, states, aggs, pres, init, has_init,
                          totals, want_total):
        tag = np.uint32(0)                       # no tile states
        smem = tile_storage()
        temp = scan_storage()
        stash = stash_storage()
        for tile in range(tiles):
            cuda.syncthreads()                   # the previous tile is done with temp and stash
            state = (tile, pres, tag, init, has_init, stash)
            tile_scan(xs, outs, n, tile, tiles, state, smem, temp, totals, want_total, 0)

    return scan_single_block


@functools.lru_cache(maxsize=None)
def upsweep_kernel(op, in_vt, acc_vt, tile, transform=None):
    """Kernel ``(xs, n, partials)``: ``partials[t]`` = the reduction of tile ``t``.

    A commutative operator folds the striped (coalesced) items straight from
    memory; any other goes through shared memory in blocked order.
    """
    nt, vt = tile
    nv = nt * vt
    block_reduce = block.reduce(op, acc_vt, nt, partial=True)
    combine, store = op.combine(acc_vt), acc_vt.store
    load_in, to_acc = in_vt.load, _to_acc(acc_vt, in_vt, transform)

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

    io = _tile_io(op, in_vt, acc_vt, acc_vt, tile, transform=transform)
    load_tile, fold_valid = io.load_tile, io.fold_valid
    tile_storage = block.temp_storage(acc_vt, _tile_slots(tile))

    def upsweep_blocked(xs, n, partials):
        tid = cuda.threadIdx.x
        base = cuda.blockIdx.x * nv
        smem = tile_storage()
        load_tile(xs, n, base, tid, smem)
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
    """The default algorithm (the dispatcher's choice, see ``dispatch.choose_scan``)."""
    return _dispatch.choose_scan(n, tile_for(in_vt, acc_vt))


def _check_algorithm(algorithm):
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError("cufold: unknown scan algorithm %r; choose from %s"
                         % (algorithm, ", ".join(ALGORITHMS)))


def plan(op, in_vt, acc_vt, out_vt, n, kind, algorithm=None, var=None, transform=None):
    """Choose and validate the algorithm and size the launches (``n >= 1``);
    ``var``: a :class:`Variant` (default: :func:`variant` of the environment);
    ``transform``: see :data:`Spec`."""
    _check_algorithm(algorithm)
    if algorithm is None:
        algorithm = choose(op, in_vt, acc_vt, n)
    var = variant() if var is None else var
    tile = tile_for(in_vt, acc_vt, n)
    nv = tile.nt * tile.vt
    tiles = -(-n // nv)
    spine = None
    if algorithm == "single_pass":
        carry = "single_pass"
        var = single_pass_variant(var, acc_vt, in_vt)
    else:
        carry = "single_block" if algorithm == "single_block" or tiles == 1 else "downsweep"
        var = var._replace(states=None, poll=None, ids=None)
    if carry == "downsweep":
        spine_tile = tile_for(acc_vt, acc_vt, tiles)
        spine_alg = ("single_block" if tiles <= SPINE_BLOCK_TILES * spine_tile.nt * spine_tile.vt
                     else "reduce_then_scan")
        spine = plan(op, acc_vt, acc_vt, acc_vt, tiles, "inclusive", spine_alg, var)
    spec = Spec(op, in_vt, acc_vt, out_vt, tile, kind, carry, var, transform)
    return Plan(spec, tiles, algorithm, spine, _scratch_bytes(spec, tiles, algorithm, spine))


@functools.lru_cache(maxsize=1024)
def _cached_plan(op, in_vt, acc_vt, out_vt, n, kind, algorithm, forced_tile, var, thresholds, transform=None):
    return plan(op, in_vt, acc_vt, out_vt, n, kind, algorithm, var, transform)


def _plan_for(op, in_vt, acc_vt, out_vt, n, kind, algorithm, transform=None):
    """``plan()``, cached per call shape (and per tile override, variant and
    thresholds, which tests and tools/tune_scan.py change)."""
    return _cached_plan(op, in_vt, acc_vt, out_vt, n, kind, algorithm,
                        os.environ.get("CUFOLD_TILE"), variant(),
                        (SINGLE_BLOCK_TILES, SPINE_BLOCK_TILES), transform)


def _align(nbytes):
    return -(-nbytes // 256) * 256


def _bytes(vt, count):
    return sum(_align(max(count, 1) * f.itemsize) for f in vt.fields)


def _scratch_bytes(spec, tiles, algorithm, spine):
    """Bytes of per-stream workspace ``_run`` carves for a plan (mirrors it)."""
    dummy_total = _bytes(spec.out_vt, 1)
    if algorithm == "single_pass":
        return tile_state_bytes(spec.variant.states, spec.acc_vt, tiles) + dummy_total
    if spine is None:                            # single block: placeholders only
        return 256 + _bytes(spec.acc_vt, 1) + dummy_total
    return 256 + _bytes(spec.acc_vt, tiles) + dummy_total + spine.scratch


_carved = _launch.BoundedCache(4096)


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
        got = _carved.put(key, ((tuple(views) if vt.is_tuple else views[0]), end))
    return got


def _placeholder(ws, offset):
    """A uint32 view for the kernel arguments an algorithm does not use."""
    return _carve(ws, offset, _U32, 64)


class LookBackState:
    """Per (device, stream): what a look-back launch (this scan's single pass,
    ``segmented_reduce``) keeps between launches: the ``counter`` word of
    :func:`draw` (epoch and tickets), and the tile states in both layouts
    (``flags``: uint32 per tile; ``words``: uint64 per tile; each with a float
    view of the same memory for the volatile read). Every launch on the stream
    has a new epoch, so a state of an earlier launch, of either layout and
    either family, reads as EMPTY. ``launches`` counts those made from the host
    (see ``_EPOCH_LIMIT``)."""

    __slots__ = ("buffer", "capacity", "launches", "counter", "flags", "words")

    def __init__(self, device_id, stream, capacity):
        self.capacity = capacity
        self.launches = 0
        words_at = 256 + _align(4 * capacity)
        self.buffer = _launch.zeros(device_id, stream, words_at + 8 * capacity)   # every state EMPTY, epoch 0
        self.counter = self.buffer.view(np.uint64, (1,), 0)
        self.flags = (self.buffer.view(np.uint32, (capacity,), 256),
                      self.buffer.view(np.float32, (capacity,), 256))
        self.words = (self.buffer.view(np.uint64, (capacity,), words_at),
                      self.buffer.view(np.float64, (capacity,), words_at))

    def fits(self, tiles):
        """Whether a launch of ``tiles`` tiles may use this state (counted as one)."""
        if self.capacity < tiles or self.launches >= _EPOCH_LIMIT:
            return False
        self.launches += 1
        return True


_look_back_states = {}
# Superseded states stay alive: kernels still queued on the stream may use them.
# Capacities grow geometrically, so they hold at most as much memory again.
_retired = []


def look_back_state(device_id, stream, tiles):
    """The :class:`LookBackState` for a launch of ``tiles`` tiles on ``stream``
    (a fresh zeroed one when more tiles are needed or the epochs run out)."""
    key = (device_id, stream)
    st = _look_back_states.get(key)
    if st is None or not st.fits(tiles):
        cap = max(tiles, 1024)
        if st is not None:
            _retired.append(st)
            if st.capacity < tiles:
                cap = max(cap, 2 * st.capacity)
        st = _look_back_states[key] = LookBackState(device_id, stream, cap)
        st.fits(tiles)
    return st


def tile_state_bytes(layout, acc_vt, tiles):
    """Workspace bytes that :func:`tile_states` carves for ``tiles`` tile states of
    ``layout``: none for state words (packed, pair: they live in the look-back state),
    else two value arrays (aggregates, inclusive prefixes)."""
    if layout in ("packed", "pair"):
        return 0
    return 2 * _bytes(_storage_vt(acc_vt), tiles)


def tile_states(b, layout, acc_vt, tiles, ws, offset):
    """``(st, states, aggs, pres, offset)``: the tile states of a single-pass look-back
    over ``tiles`` tiles of ``layout`` (:func:`state_layout`) for Program builder ``b``:
    the stream's look-back state ``st`` (its counter draws the tiles), guarded for the
    Program; ``states`` its state words (packed, pair; ``aggs``/``pres`` unused) or its
    flags, with two value arrays carved from ``ws`` at ``offset`` (wide)."""
    slots = tiles * state_words(layout)
    st = look_back_state(b.device_id, b.stream, slots)
    b.guard(lambda: st.fits(slots))
    if layout in ("packed", "pair"):
        return st, st.words, st.counter, st.counter, offset
    sv = _storage_vt(acc_vt)
    aggs, offset = _carve(ws, offset, sv, tiles)
    pres, offset = _carve(ws, offset, sv, tiles)
    return st, st.flags, aggs, pres, offset


def add_launches(b, p, xs, outs, n, init, has_init, totals=None, scratch=None):
    """Add a plan's launches, in order, to Program builder ``b`` (``host.programs``).
    ``xs``/``outs``: the input and output Arr(s) (``outs`` may be ``xs``); ``init``:
    a host value of the accumulator type (an exclusive scan's first value; ignored
    by inclusive scans); ``totals``: 1-element Arr(s) of the result type to receive
    the total, or None; ``scratch``: ``(workspace, byte offset)`` of ``p.scratch``
    bytes to use (default: the start of the stream's workspace)."""
    if scratch is None:
        scratch = (_launch.workspace(b.device_id, b.stream, p.scratch)[1], 0)
    _add_launches(b, p, xs, outs, n, p.spec.acc_vt.make(init), bool(has_init), totals, *scratch)


def run(p, xs, outs, n, stream, device_id, init, has_init, totals=None):
    """Launch a plan once on these arrays (a Program made for this call only)."""
    b = _programs.Builder(device_id, stream)
    add_launches(b, p, xs, outs, n, init, has_init, totals)
    b.build(lambda got: None)()


def _add_launches(b, p, xs, outs, n, init, has_init, totals, ws, offset):
    spec = p.spec
    nt = spec.tile.nt
    acc_vt, out_vt = spec.acc_vt, spec.out_vt
    key = ("scan", spec)
    want_total = totals is not None
    if totals is None:                           # never written (want_total is False)
        totals, offset = _carve(ws, offset, out_vt.plain, 1)
    else:
        offset += _bytes(out_vt, 1)
    if p.algorithm == "single_pass":
        st, states, aggs, pres, offset = tile_states(b, spec.variant.states, acc_vt, p.tiles, ws, offset)
        b.launch(scan_kernel(spec), key, p.tiles, nt,
                 (xs, outs, n, p.tiles, st.counter, states, aggs, pres, init, has_init, totals, want_total))
        return
    counter, offset = _placeholder(ws, offset)           # unused by these kernels
    states = (counter, counter)
    if p.spine is None:                                  # one block walks every tile
        b.launch(scan_kernel(spec), key, 1, nt,
                 (xs, outs, n, p.tiles, counter, states, counter, counter, init, has_init, totals, want_total))
        return
    # reduce_then_scan: upsweep, spine (inclusive, in place), downsweep.
    spine, offset = _carve(ws, offset, acc_vt, p.tiles)
    b.launch(upsweep_kernel(spec.op, spec.in_vt, acc_vt, spec.tile, spec.transform),
             ("scan_upsweep", spec.op, spec.in_vt, acc_vt, spec.tile, spec.transform), p.tiles, nt, (xs, n, spine))
    _add_launches(b, p.spine, spine, spine, p.tiles, init, False, None, ws, offset)
    b.launch(scan_kernel(spec), key, p.tiles, nt,
             (xs, outs, n, p.tiles, counter, states, counter, spine, init, has_init, totals, want_total))


knob = _launch.knob


# --- the public calls -----------------------------------------------------------------------

_vt_of = {}


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


def _written_type(out_vt, stored):
    """The type of what a scan writes: ``out_vt``, or where ``out=`` holds None for
    fields of a tuple result (``stored``: whether each entry is an array; None: all
    are), the OutputType that leaves those fields out of the kernels."""
    if stored is None:
        return out_vt
    if not out_vt.is_tuple:
        raise ValueError("cufold: out= holds None, but the scan's result (%s) is not a tuple; None "
                         "leaves out a field of a tuple result" % out_vt)
    if len(stored) != out_vt.arity:
        raise ValueError("cufold: out= needs a tuple of %d entries (an array, or None for a field not "
                         "wanted) for a result of type %s; it has %d" % (out_vt.arity, out_vt, len(stored)))
    if not any(stored):
        raise ValueError("cufold: out= holds None for every field of the result; give an array for at "
                         "least one (out=None allocates them all)")
    return OutputType.of(out_vt, stored)


def _scan_outputs(b, like, out_vt, given, shape):
    """Arr(s) to write: new arrays of ``shape`` (outputs of the Program), or out= (checked;
    for an OutputType, the stored fields' arrays only)."""
    if not given:
        arrs = [b.output(like, shape, f) for f in out_vt.fields]
    else:
        fields = [f for f, kept in zip(out_vt.fields, out_vt.stored) if kept]
        if len(given) != len(fields):
            raise ValueError("cufold: out= needs %s for a result of type %s"
                             % ("a tuple of %d arrays" % out_vt.arity if out_vt.is_tuple
                                else "one array", out_vt))
        arrs = list(given)
        for a, f in zip(arrs, fields):
            if a.shape != tuple(shape):
                raise ValueError("cufold: out= must have the result's shape %s (%d elements); it has "
                                 "shape %s" % (tuple(shape), int(np.prod(shape)), a.shape))
            if a.dtype != f:
                raise TypeError("cufold: out= has dtype %s, the scan's result is %s" % (a.dtype, f))
            if a.device_id != like.device_id:
                raise ValueError("cufold: out= is on device %d, x on device %d"
                                 % (a.device_id, like.device_id))
    return tuple(arrs) if out_vt.is_tuple else arrs[0]


def _gather_target(b, like, out_vt, outs, shape):
    """``(arrays, value type)`` a view that is not scanned where it lies is gathered
    into (C order): ``outs`` themselves, scanned in place; where the result has fields
    not stored (an OutputType), new arrays of every field (not returned), scanned from
    into ``outs``."""
    if out_vt.plain is out_vt:
        return outs, out_vt
    return tuple(b.output(like, shape, f) for f in out_vt.fields), out_vt.plain


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


def _scan(x, op, init, dtype, out, stream, algorithm, total, kind, name, numpy_sum=False, axis=None,
          reverse=False, transform=None):
    """A scan call: describe the arrays, find (or plan) the Program of the call's signature, run it."""
    is_tuple = x.__class__ is tuple
    arrs = _arrays.describe_many(x) if is_tuple else (_arrays.describe(x),)
    stored = None                                # out= leaves no field out
    if out is None:
        given = ()
    else:
        if out.__class__ is int:                 # cummax(x, 0): NumPy's positional axis
            _positional_axis(name, out)
        entries = out if isinstance(out, (tuple, list)) else (out,)
        given = tuple(_arrays.describe(o, "out") for o in entries if o is not None)
        if len(given) != len(entries):           # out=(None, h): the fields not wanted
            stored = tuple(o is not None for o in entries)
    h = _arrays.stream_handle(arrs if is_tuple else arrs[0], stream)
    got = _programs_of_scans.run(
        (tuple(map(_programs.signature, arrs)), h, op, kind, numpy_sum, init, dtype, algorithm, total, is_tuple,
         tuple(map(_programs.signature, given)), stream is not None, knob("CUFOLD_TILE"),
         knob("CUFOLD_SCAN_VARIANT"), axis, bool(reverse), transform, stored), *arrs, *given)
    if out is None:
        return got
    return (out, got) if total else out


def _positional_axis(name, axis):
    raise TypeError("cufold: %s takes the axis by keyword only: %s(x, axis=%d)" % (name, name, axis))


def _plan_key(key, *arrays):
    """The Program of scan call signature ``key`` (see :func:`_scan`) for ``arrays``:
    the input(s), then out='s."""
    sigs, h, op, kind, numpy_sum, init, dtype, algorithm, total, is_tuple, _, given_stream = key[:12]
    if dtype.__class__ is int:                  # cumsum(x, 1): NumPy's positional axis
        raise TypeError("cufold: a scan's dtype cannot be %d; the axis goes by keyword only: cumsum(x, axis=%d)"
                        % (dtype, dtype))
    axis, reverse, transform, stored = key[14:18]
    return _plan_scan(arrays[:len(sigs)], arrays[len(sigs):], is_tuple, op, init, dtype, algorithm, total, kind,
                      numpy_sum, h, h if given_stream else None, axis, reverse, transform, stored)


def _scan_axis(axis, ndim):
    """``axis`` as a non-negative int, None where the scan is of the whole array
    (``axis=None``, or any axis of a 1-D input); NumPy's errors."""
    if axis is None:
        return None
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError("cufold: a scan's axis must be an integer or None, got %r" % (axis,))
    if ndim == 0 or not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(int(axis), ndim)
    return None if ndim == 1 else int(axis) % ndim


def _reversed(arrs):
    """1-D Arr(s) walked from their last element (a generated counting input: one that
    counts down from its last item, ``countdown``; a constant: itself)."""
    def flip(a):
        if a.__class__ is _arrays.Generated:
            if a.source != "counting":
                return a
            with np.errstate(over="ignore"):          # integers wrap, as the items do
                last = a.param + np.asarray(a.size - 1).astype(a.dtype)[()]
            return _arrays.Generated("countdown", a.size, last, a.dtype)
        s = a.strides[0]
        return _arrays.window(a, (a.size - 1) * s, (a.size,), (-s,))
    return tuple(map(flip, arrs)) if isinstance(arrs, tuple) else flip(arrs)


def _input_type(arrs):
    """The InputType of Arr(s) ``arrs`` (generated fields by their source)."""
    fields = _fields(arrs)
    dts = tuple(a.dtype for a in fields)
    return InputType.of(dts if isinstance(arrs, tuple) else dts[0],
                        tuple(getattr(a, "source", "array") for a in fields))


def _check_reversible(in_vt):
    """A reversed scan reads a generated counting input counting down from its last
    item: exact for integers (which wrap alike both ways), not for floats."""
    for f, src in zip(in_vt.fields, in_vt.sources):
        if src == "counting" and f.kind == "f":
            raise ValueError("cufold: a reversed scan of a floating-point counting() is not supported "
                             "(its items counted down would round differently); use an integer dtype "
                             "and transform= to convert")


def _flat(arrs):
    """1-D Arr(s) of the elements of C-contiguous (or 0-d, or 1-D) ones, in order."""
    def one(a):
        return a if a.ndim == 1 else _arrays.window(a, 0, (a.size,), (1,))
    return tuple(map(one, arrs)) if isinstance(arrs, tuple) else one(arrs)


def _fields(arrs):
    return arrs if isinstance(arrs, tuple) else (arrs,)


def _plan_scan(arrs, given, is_tuple, op, init, dtype, algorithm, total, kind, numpy_sum, h, alloc_stream,
               axis=None, reverse=False, transform=None, stored=None):
    """The Program of a scan (see :func:`_scan`): checks, types, outputs, the plan's launches.
    ``axis``/``reverse``: see :mod:`.scan_axis` (which kernel runs for which layout);
    ``given``: out='s arrays, of the fields ``stored`` says (None: of every field)."""
    from . import scan_axis as _sa
    op = as_op(op)
    _check_algorithm(algorithm)
    shape = arrs[0].shape
    ax = _scan_axis(axis, len(shape))
    in_vt = InputType.of(tuple(a.dtype for a in arrs) if is_tuple else arrs[0].dtype,
                         tuple(getattr(a, "source", "array") for a in arrs))
    transform = as_transform(transform)
    item_vt = ValueType.of(in_vt) if transform is None else transform.result_type(in_vt)
    acc_vt, out_vt, identity = _types_for(op, item_vt, dtype, numpy_sum)
    out_vt = _written_type(out_vt, stored)
    if getattr(in_vt, "sources", None) is not None and reverse:
        _check_reversible(in_vt)
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
    n = arrs[0].size
    if total and ax is not None:
        raise ValueError("cufold: total= is for scans of a whole array (axis=None or a 1-D input); "
                         "got axis=%r of an array of shape %s" % (axis, shape))
    if total and n == 0 and identity is None:
        raise ValueError("cufold: the total of an empty input needs an operator with an "
                         "identity; %s has none" % op.name)
    b = _programs.Builder(_arrays.first_stored(arrs).device_id, h, alloc_stream)
    xs = tuple(b.input(a) for a in arrs)
    ys = tuple(b.input(a) for a in given)
    like = _arrays.first_stored(xs)
    outs = _scan_outputs(b, like, out_vt, ys, (n,) if ax is None else shape)
    totals = None
    if total:
        vecs = tuple(_arrays.window(b.output(like, (), f), 0, (1,), (1,)) for f in out_vt.fields)
        totals = vecs if out_vt.is_tuple else vecs[0]
    # ``tf``: the transform still to apply as the scan loads ``src`` (a gather applies it on its way)
    src, src_vt, tf = (xs if is_tuple else xs[0]), in_vt, transform
    if n == 0:
        if total:
            fill(b, out_vt.plain, totals, 1, identity)
    elif ax is None:                             # the whole array, in C order
        if not all(a.ndim <= 1 or a.c_contiguous for a in xs):
            full, full_vt = _gather_target(b, like, out_vt, outs, (n,))
            _sa.gather(b, in_vt, full_vt, src, full, n, tf)       # then scanned from there
            src, src_vt, tf = full, full_vt, None
        src, dst = _flat(src), outs
        if reverse:
            src, dst = _reversed(src), _reversed(dst)
            if src_vt is in_vt:                  # generated fields count down (_reversed)
                src_vt = _input_type(src)
        p = _plan_for(op, src_vt, acc_vt, out_vt, n, kind, algorithm, tf)
        add_launches(b, p, src, dst, n, init_value, has_init, totals)
    else:
        lay = None
        out_strides = {a.strides for a in _fields(outs)}
        if len(out_strides) != 1:
            raise ValueError("cufold: the arrays of out= must share one layout for an axis scan")
        out_strides = out_strides.pop()
        if len({a.strides for a in xs}) == 1:
            lay = _sa.plan_layout(shape, xs[0].strides, out_strides, ax, reverse)
        if lay is None:                          # batch dims that do not merge: gather, scan from there
            full, full_vt = _gather_target(b, like, out_vt, outs, shape)
            _sa.gather(b, in_vt, full_vt, src, full, n, tf)
            src, src_vt, tf = full, full_vt, None
            lay = _sa.plan_layout(shape, _fields(full)[0].strides, out_strides, ax, reverse)
            if lay is None:
                raise ValueError("cufold: cannot scan along axis %d of an out= with strides %s; "
                                 "pass a C-contiguous out=" % (ax, out_strides))
        if lay.kind == "flat":
            p = _plan_for(op, src_vt, acc_vt, out_vt, n, kind, algorithm, tf)
            add_launches(b, p, _sa.flat_windows(src, lay.inp, lay), _sa.flat_windows(outs, lay.out, lay), n,
                         init_value, has_init, None)
        else:
            var = variant()
            nbytes = _sa.scratch_bytes(b, lay, op, src_vt, acc_vt, out_vt, var, algorithm)
            ws = _launch.workspace(b.device_id, b.stream, nbytes)[1]
            views = _sa.segment_windows if lay.kind == "segments" else _sa.windows
            _sa.add_launches(b, lay, op, src_vt, acc_vt, out_vt, kind, views(src, lay.inp, lay),
                             views(outs, lay.out, lay), acc_vt.make(init_value), has_init, ws, 0, var, tf,
                             algorithm)
    fields = out_vt.arity
    pack = tuple if out_vt.is_tuple else _only
    if given:                                    # the totals come first (then any gather target)
        return b.build((lambda got: pack(got[:fields])) if total else None)
    if total:
        return b.build(lambda got: (pack(got[:fields]), pack(got[fields:])))
    return b.build(tuple if out_vt.is_tuple else None)


def _only(got):
    return got[0]


_programs_of_scans = _programs.Programs(_plan_key, "cufold.scan", 4096)   # users' operators too (bounded)





def inclusive_scan(x, op=plus, *, axis=None, reverse=False, dtype=None, out=None, stream=None, algorithm=None,
                   total=False, transform=None):
    """Inclusive scan: ``out[i] = x[0] op x[1] op ... op x[i]``.

    Parameters
    ----------
    x : CUDA array (any library, any strides), or a tuple of equally shaped
        ones (tuple values).
    op : cufold.Op or function ``(a, b) -> c``; associative (commutativity and
        an identity are not needed).
    axis : the axis to scan along, as NumPy's ``cumsum``: None (the default)
        scans the whole array in C order and returns a 1-D result; an int
        (negative counts from the end) scans every line along that axis and
        returns ``x``'s shape (see :mod:`cufold.device.scan_axis` for which
        kernel runs for which shape).
    reverse : scan from the end: ``flip(scan(flip(x)))`` along the axis, with
        ``op``'s operands in the same order as ``jax.lax.associative_scan(
        reverse=True)``: ``out[i] = x[-1] op x[-2] op ... op x[i]``.
    dtype : result dtype (a tuple for tuple values); default: ``x``'s own.
        float16 results accumulate in float32.
    out : device array(s) of the result's shape and dtype to write into;
        may be ``x`` itself (in place). For a tuple result, ``None`` in place of
        a field's array leaves that field out: it is never written (the kernels
        are compiled without its stores) and needs no memory, so
        ``out=(None, h)`` of the affine recurrence below writes ``h`` only (12
        bytes an element of float32 where both fields take 16). At least one
        field needs an array. (Unlike NumPy's ufuncs, where None in ``out`` asks
        for a new array.) Every scan here takes it: exclusive, reversed, along
        any axis, with ``transform=``; ``total=`` still returns every field.
    stream : the library's stream object or a raw ``CUstream`` handle.
    algorithm : one of ``cufold.algorithms("scan")`` for a scan of a single
        run (``axis=None``, a 1-D input, or one line); None chooses (one block
        for small inputs, else ``single_pass``). For floating-point results
        that are bitwise reproducible from run to run, ask for
        ``"reduce_then_scan"`` (see the module doc). Scans of several lines
        choose their kernel by shape; where that is a look-back down long
        columns (``axis=0`` of a C-order matrix of few columns),
        ``"reduce_then_scan"`` takes the 3-launch form with a fixed order.
    total : also return the reduction of all of ``x`` (0-d device array(s)),
        from the same pass (scans of the whole array only).
    transform : a function of one item (of the tuple of items for tuple inputs:
        zipped) applied to each item as it is loaded, in the same kernel, along
        any axis, reversed, of any view (a view that is first gathered is
        transformed by the gather); the scan combines (and its dtype rules and
        result dtype follow) what it returns. ``x`` may also be or hold generated
        inputs (``cufold.counting``, ``cufold.constant``: 1-D, so ``axis`` None,
        0 or -1; reversed too, except a floating-point ``counting``).

    Returns the scanned array(s) in ``x``'s library (``out`` itself where it is
    given, None included: ``(None, h)``), or ``(scanned, total)``; the host is
    not synchronised.

    Example::

        >>> x = cupy.asarray([1, 7, 4, 0, 9], dtype=cupy.int32)
        >>> cufold.inclusive_scan(x)
        array([ 1,  8, 12, 12, 21], dtype=int32)
        >>> cufold.inclusive_scan(x, cufold.maximum, total=True)
        (array([1, 7, 7, 7, 9], dtype=int32), array(9, dtype=int32))
        >>> cufold.inclusive_scan(x, reverse=True)
        array([21, 20, 13,  9,  9], dtype=int32)
        >>> a, b = cupy.full((2, 3), 0.5), cupy.ones((2, 3))   # h = a*h + b along each row
        >>> affine = lambda p, q: (p[0] * q[0], p[1] * q[0] + q[1])
        >>> cufold.inclusive_scan((a, b), affine, axis=-1)[1]
        array([[1.  , 1.5 , 1.75],
               [1.  , 1.5 , 1.75]])
        >>> cufold.inclusive_scan((a, b), affine, axis=-1, transform=lambda ab: (ab[0], ab[1] * 2))[1]
        array([[2. , 3. , 3.5],
               [2. , 3. , 3.5]])
        >>> h = cupy.empty((2, 3))                     # h only: the products of a are never written
        >>> cufold.inclusive_scan((a, b), affine, axis=-1, out=(None, h))
        (None, array([[1.  , 1.5 , 1.75],
               [1.  , 1.5 , 1.75]]))
        >>> cufold.cumsum(cufold.counting(4), reverse=True).copy_to_host()    # generated: no memory
        array([6, 6, 5, 3])
    """
    return _scan(x, op, None, dtype, out, stream, algorithm, total, "inclusive", "inclusive_scan",
                 axis=axis, reverse=reverse, transform=transform)


def exclusive_scan(x, op=plus, init=None, *, axis=None, reverse=False, dtype=None, out=None, stream=None,
                   algorithm=None, total=False, transform=None):
    """Exclusive scan: ``out[0] = init``, ``out[i] = init op x[0] op ... op x[i-1]``
    (along every line of ``axis``, each starting at ``init``; with ``reverse``,
    ``out[-1] = init``, ``out[i] = init op x[-1] op ... op x[i+1]``).

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
        >>> cufold.exclusive_scan(x.reshape(1, 5), axis=1, reverse=True)
        tensor([[20, 13,  9,  9,  0]], device='cuda:0')
    """
    return _scan(x, op, init, dtype, out, stream, algorithm, total, "exclusive", "exclusive_scan",
                 axis=axis, reverse=reverse, transform=transform)


def cumsum(x, dtype=None, out=None, stream=None, *, axis=None, reverse=False, algorithm=None, transform=None):
    """``numpy.cumsum(x, axis)``: small integers and bool sum as int64 (unsigned:
    uint64), float16 accumulates in float32 and stores float16. ``axis=None``
    scans the whole array in C order (a 1-D result), as NumPy; ``reverse``: from
    the end (see :func:`inclusive_scan`).

    Example: ``cufold.cumsum(cupy.arange(5, dtype=cupy.int32))  # int64 [0 1 3 6 10]``;
    ``cufold.cumsum(torch.ones(3, 4, device="cuda"), axis=0)  # rows 1, 2, 3``
    """
    return _scan(x, plus, None, dtype, out, stream, algorithm, False, "inclusive", "cumsum",
                 numpy_sum=True, axis=axis, reverse=reverse, transform=transform)


def cumprod(x, dtype=None, out=None, stream=None, *, axis=None, reverse=False, algorithm=None, transform=None):
    """``numpy.cumprod(x, axis)`` (the dtypes and axes of :func:`cumsum`).

    Example: ``cufold.cumprod(torch.tensor([1., 2., 3.], device='cuda'))  # [1, 2, 6]``
    """
    return _scan(x, multiplies, None, dtype, out, stream, algorithm, False, "inclusive", "cumprod",
                 numpy_sum=True, axis=axis, reverse=reverse, transform=transform)


def cummax(x, out=None, stream=None, *, axis=None, reverse=False, algorithm=None, transform=None):
    """``numpy.maximum.accumulate``: the running maximum, same dtype, NaN propagates.
    ``axis=None`` (the default) scans the whole array in C order, as the other
    scans (``numpy.maximum.accumulate``'s own default is axis 0: pass ``axis=0``).

    Example: ``cufold.cummax(cupy.asarray([3, 1, 4, 1, 5]))  # [3 3 4 4 5]``
    """
    return _scan(x, maximum, None, None, out, stream, algorithm, False, "inclusive", "cummax",
                 axis=axis, reverse=reverse, transform=transform)


def cummin(x, out=None, stream=None, *, axis=None, reverse=False, algorithm=None, transform=None):
    """``numpy.minimum.accumulate``: the running minimum, same dtype, NaN propagates
    (axes as :func:`cummax`).

    Example: ``cufold.cummin(cupy.asarray([3, 1, 4, 1, 5]))  # [3 1 1 1 1]``
    """
    return _scan(x, minimum, None, None, out, stream, algorithm, False, "inclusive", "cummin",
                 axis=axis, reverse=reverse, transform=transform)
