"""Warp layer: cooperative primitives for the 32 lanes of a warp.

Each function here is a *factory*: called on the host with an operator and a
value type, it returns a Numba device function that you call inside your own
``@cuda.jit`` kernel (as CUB's ``WarpReduce<T>`` is instantiated before use).
Factories are cached, so creating the same primitive twice costs nothing.

Logical warps: ``width`` may be 1..32. A power-of-two width splits each warp
into ``32 // width`` independent logical warps of consecutive lanes; any other
width uses the first logical warp only (lanes ``0..width-1``), and the other
lanes get their input back. Unless said otherwise, every lane of a logical
warp must call the primitive (as with any ``*_sync`` intrinsic).

Example::

    import numpy as np, cufold
    from numba import cuda

    warp_sum = cufold.warp.reduce(cufold.plus, np.float32)

    @cuda.jit
    def kernel(x, out):
        i = cuda.grid(1)
        total = warp_sum(x[i])            # valid on lane 0 of each warp
        if cuda.laneid == 0:
            out[i // 32] = total
"""

import functools

import numpy as np
from numba import cuda

from .ops import as_op
from .values import ValueType

FULL_MASK = 0xFFFFFFFF
WARP_SIZE = 32
# Factories cache with typed=True: True == 1 and 16.0 == 16 hash alike, and an
# untyped cache would hand out a cached primitive instead of rejecting them.


def _check_width(width):
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or not 1 <= width <= WARP_SIZE:
        raise ValueError("cufold: a logical warp width must be an integer in 1..32, got %r" % (width,))
    return int(width)


# --- lane masks, in 32-bit words ----------------------------------------------------------
# Numba widens uint32 arithmetic (and Python ints) to 64 bits, and a 64-bit popc, ffs or
# clz costs several instructions where a 32-bit one costs one (masked_reduce ran 1.6x
# slower so on an H200): the mask loops below build their masks with these
# (``test_mask_arithmetic_is_32_bit`` reads the PTX). Bits are cleared with ``^``, never
# with ``~`` of a Python int, which is negative (NumPy cannot mix that with a uint32 in
# the simulator).

@cuda.jit(device=True)
def _lanes_below(lane):
    """Lanes ``0 .. lane - 1``."""
    return np.uint32((np.uint32(1) << np.uint32(lane)) - np.uint32(1))


@cuda.jit(device=True)
def _lanes_above(lane):
    """Lanes ``lane + 1 .. 31``."""
    return np.uint32(np.uint32(0xFFFFFFFE) << np.uint32(lane))


@cuda.jit(device=True)
def _clear(mask, bits):
    """``mask`` without ``bits``."""
    return np.uint32(np.uint32(mask) & np.uint32(np.uint32(bits) ^ np.uint32(FULL_MASK)))


def _setup(op, dtype, width=WARP_SIZE):
    op = as_op(op)
    vt = ValueType.of(dtype)
    return op, vt, op.combine(vt), _check_width(width)


@functools.lru_cache(maxsize=None, typed=True)
def lane_info(width):
    """Device function ``() -> (logical_lane, member_mask, first_lane, active)``.

    ``member_mask`` holds the lanes of the caller's logical warp, and
    ``first_lane`` its first physical lane. ``active`` is False only for lanes
    outside the single logical warp of a non-power-of-two width.
    """
    width = _check_width(width)
    pow2 = width & (width - 1) == 0
    low_bits = (1 << width) - 1

    @cuda.jit(device=True)
    def info():
        lane = cuda.laneid
        if pow2:
            logical = lane & (width - 1)
            first = lane - logical
            return logical, (low_bits << first) & FULL_MASK, first, True
        return lane, low_bits, 0, lane < width

    return info


@functools.lru_cache(maxsize=None, typed=True)
def _reduce_down(op, vt, width, stride=1):
    """The shfl_down tree with ascending offsets: after it, each lane holds the
    reduction of its own value and the next lanes up to (excluding) ``limit``.

    Ascending offsets keep operands in lane order, so only associativity is
    needed; the ``limit`` guard serves full, partial and segmented warps alike.
    ``stride`` > 1: the ``width`` logical lanes are ``stride`` physical lanes apart
    (``stride`` interleaved trees in one warp, as a block's column of threads).
    """
    combine = op.combine(vt)
    shfl_down = vt.shuffle("down")

    @cuda.jit(device=True)
    def reduce_down(value, logical, mask, limit):
        offset = 1
        while offset < width:
            other = shfl_down(mask, value, offset * stride)
            if logical + offset < limit:
                value = combine(value, other)
            offset *= 2
        return value

    return reduce_down


@functools.lru_cache(maxsize=None, typed=True)
def reduce(op, dtype, width=WARP_SIZE):
    """Reduce a logical warp's values; ``f(value) -> total``.

    Result valid on: the first lane of each logical warp. Associativity is
    enough (operands are combined in lane order). Uses a shfl_down tree
    (seed 000's warpReduceSum) of ``ceil(log2(width))`` steps.

    Example::

        wmax = cufold.warp.reduce(cufold.maximum, np.int32, width=16)
        # in a kernel: m = wmax(v)   -> valid on lanes 0 and 16
    """
    op, vt, combine, width = _setup(op, dtype, width)
    info = lane_info(width)
    down = _reduce_down(op, vt, width)

    @cuda.jit(device=True)
    def warp_reduce(value):
        logical, mask, first, active = info()
        if not active:
            return value
        return down(value, logical, mask, width)

    return warp_reduce


@functools.lru_cache(maxsize=None, typed=True)
def partial_reduce(op, dtype, width=WARP_SIZE):
    """Reduce the first ``valid_items`` lanes of each logical warp;
    ``f(value, valid_items) -> total``.

    Every lane of the logical warp calls it (the values of lanes at and past
    ``valid_items`` are ignored); this is the last, partial tile of a
    grid (seed 003's contiguous partial warp). ``valid_items`` is clamped to
    ``1..width``. Result valid on: the first lane of each logical warp.

    Example::

        psum = cufold.warp.partial_reduce(cufold.plus, np.float64)
        # t = psum(v, n - warp_start)
    """
    op, vt, combine, width = _setup(op, dtype, width)
    info = lane_info(width)
    down = _reduce_down(op, vt, width)

    @cuda.jit(device=True)
    def warp_partial_reduce(value, valid_items):
        logical, mask, first, active = info()
        if not active:
            return value
        # Clamp: past the width, the tree would read lanes outside the
        # logical warp (a non-power-of-two width's lanes width..31).
        return down(value, logical, mask, min(valid_items, width))

    return warp_partial_reduce


@functools.lru_cache(maxsize=None, typed=True)
def masked_reduce(op, dtype):
    """Reduce the lanes of an arbitrary set; ``f(value, mask) -> total``.

    Called by exactly the lanes in ``mask`` (others may be inactive or
    exited): seed 003's dispersed partial warp. Each round pairs every
    remaining lane with the next remaining lane above it, so ``ceil(log2(k))``
    rounds reduce ``k`` lanes, in lane order. Result valid on: the lowest lane
    of ``mask``. A lane not in ``mask`` gets its own value back (it returns
    before any intrinsic, so this is not an error, on the simulator either).

    Example::

        msum = cufold.warp.masked_reduce(cufold.plus, np.int32)
        # if v > 0: s = msum(v, cuda.ballot_sync(0xffffffff, v > 0)) # valid on the first such lane
    """
    op = as_op(op)
    vt = ValueType.of(dtype)
    combine = op.combine(vt)
    shfl = vt.shuffle("idx")

    @cuda.jit(device=True)
    def warp_masked_reduce(value, mask):
        lane = np.uint32(cuda.laneid)
        members = np.uint32(mask & FULL_MASK)          # 32-bit masks: see _lanes_below
        if (members >> lane) & np.uint32(1) == 0:
            return value
        below = _lanes_below(lane)
        higher = _lanes_above(lane)
        remaining = members
        while cuda.popc(remaining) > 1:
            above = np.uint32(remaining & higher)
            source = cuda.ffs(above) - 1 if above != 0 else lane
            other = shfl(mask, value, source)
            rank = cuda.popc(np.uint32(remaining & below))
            keep = ((remaining >> lane) & np.uint32(1)) == 1 and rank % 2 == 0
            if keep and above != 0:
                value = combine(value, other)
            remaining = _clear(remaining, cuda.ballot_sync(mask, not keep))
        return value

    return warp_masked_reduce


@functools.lru_cache(maxsize=None, typed=True)
def all_reduce(op, dtype, width=WARP_SIZE):
    """Reduce a logical warp's values onto every lane; ``f(value) -> total``.

    Result valid on: every lane of the logical warp. A power-of-two width
    uses the shfl_xor butterfly (seed 000's warpAllReduceSum), ordering the
    operands of each step so that non-commutative operators work too; other
    widths reduce and broadcast.
    """
    op, vt, combine, width = _setup(op, dtype, width)
    info = lane_info(width)
    shfl_xor = vt.shuffle("xor")
    shfl_idx = vt.shuffle("idx")
    down = _reduce_down(op, vt, width)
    pow2 = width & (width - 1) == 0
    commutative = op.commutative

    @cuda.jit(device=True)
    def warp_all_reduce(value):
        logical, mask, first, active = info()
        if not active:
            return value
        if not pow2:
            return shfl_idx(mask, down(value, logical, mask, width), first)
        offset = 1
        while offset < width:
            other = shfl_xor(mask, value, offset)
            if commutative:
                value = combine(value, other)
            else:
                mine_first = (logical & offset) == 0
                lo = value if mine_first else other
                hi = other if mine_first else value
                value = combine(lo, hi)
            offset *= 2
        return value

    return warp_all_reduce


@functools.lru_cache(maxsize=None, typed=True)
def _inclusive(op, vt, width, stride=1):
    """The shfl_up Kogge-Stone scan of a logical warp of ``width`` lanes (``logical``:
    the lane's place in it). ``stride`` > 1: the logical lanes are ``stride`` physical
    lanes apart (``stride`` interleaved scans in one warp, as the rows of a few columns)."""
    combine = op.combine(vt)
    shfl_up = vt.shuffle("up")

    @cuda.jit(device=True)
    def scan_up(value, logical, mask):
        offset = 1
        while offset < width:
            other = shfl_up(mask, value, offset * stride)
            if logical >= offset:
                value = combine(other, value)
            offset *= 2
        return value

    return scan_up


@functools.lru_cache(maxsize=None, typed=True)
def inclusive_scan(op, dtype, width=WARP_SIZE, aggregate=False):
    """Inclusive scan over a logical warp; ``f(value) -> scan`` or, with
    ``aggregate=True``, ``f(value) -> (scan, warp_total)``.

    Kogge-Stone over shfl_up (seed 002's scan network): lane ``i`` gets
    ``x0 op x1 op ... op xi``. Associativity is enough. Result valid on: every
    lane of the logical warp (the total too).

    Example::

        cumsum = cufold.warp.inclusive_scan(cufold.plus, np.int32)
        # in a kernel: s = cumsum(v)
    """
    op, vt, combine, width = _setup(op, dtype, width)
    info = lane_info(width)
    scan_up = _inclusive(op, vt, width)
    shfl_idx = vt.shuffle("idx")
    last = width - 1

    @cuda.jit(device=True)
    def warp_inclusive_scan(value):
        logical, mask, first, active = info()
        if not active:
            return value
        return scan_up(value, logical, mask)

    @cuda.jit(device=True)
    def warp_inclusive_scan_aggregate(value):
        logical, mask, first, active = info()
        if not active:
            return value, value
        scanned = scan_up(value, logical, mask)
        return scanned, shfl_idx(mask, scanned, first + last)

    return warp_inclusive_scan_aggregate if aggregate else warp_inclusive_scan


@functools.lru_cache(maxsize=None, typed=True)
def _exclusive_scan(op, vt, width, initial, seeded, aggregate):
    info = lane_info(width)
    combine = op.combine(vt)
    scan_up = _inclusive(op, vt, width)
    shfl_up = vt.shuffle("up")
    shfl_idx = vt.shuffle("idx")
    cast = vt.cast
    last = width - 1

    @cuda.jit(device=True)
    def shifted(value, logical, mask):
        start = cast(initial)
        inclusive = scan_up(value, logical, mask)
        before = shfl_up(mask, inclusive, 1)
        if seeded:
            before = combine(start, before)
        return (start if logical == 0 else before), inclusive

    @cuda.jit(device=True)
    def warp_exclusive_scan(value):
        logical, mask, first, active = info()
        if not active:
            return value
        return shifted(value, logical, mask)[0]

    @cuda.jit(device=True)
    def warp_exclusive_scan_aggregate(value):
        logical, mask, first, active = info()
        if not active:
            return value, value
        scanned, inclusive = shifted(value, logical, mask)
        return scanned, shfl_idx(mask, inclusive, first + last)

    return warp_exclusive_scan_aggregate if aggregate else warp_exclusive_scan


def exclusive_scan(op, dtype, width=WARP_SIZE, initial=None, aggregate=False):
    """Exclusive scan over a logical warp; ``f(value) -> scan`` or, with
    ``aggregate=True``, ``f(value) -> (scan, warp_total)``.

    Lane ``i`` gets ``initial op x0 op ... op x(i-1)`` (lane 0: ``initial``).
    ``initial`` defaults to the operator's identity; an operator without one
    needs it. The aggregate does not include ``initial``. Result valid on:
    every lane of the logical warp.

    Example::

        excl = cufold.warp.exclusive_scan(cufold.plus, np.int32)
        # offset = excl(count)   -> where each lane writes its items
    """
    op, vt, combine, width = _setup(op, dtype, width)
    identity = op.identity_for(vt)
    if initial is None:
        if identity is None:
            raise ValueError(
                "cufold: operator %s has no identity; pass initial= to exclusive_scan" % op.name)
        initial, seeded = identity, False
    else:
        initial = vt.make(initial)
        seeded = identity is None or not _same(initial, identity)
    return _exclusive_scan(op, vt, width, vt.constant(initial), seeded, bool(aggregate))


def _same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return all(np.array(x).tobytes() == np.array(y).tobytes() for x, y in zip(a, b))


@functools.lru_cache(maxsize=None, typed=True)
def segmented_reduce(op, dtype, width=WARP_SIZE):
    """Reduce segments of a logical warp marked by head flags;
    ``f(value, head_flag) -> segment_total``.

    A lane whose ``head_flag`` is true starts a segment (lane 0 always does).
    Result valid on: the head lane of each segment (CUB's
    HeadSegmentedReduce). Each lane reduces up to the next head with the same
    shfl_down tree as :func:`reduce`, so the cost is ``log2(width)`` steps
    whatever the segments.

    Example::

        segsum = cufold.warp.segmented_reduce(cufold.plus, np.float32)
        # t = segsum(v, key != previous_key)
    """
    op, vt, combine, width = _setup(op, dtype, width)
    info = lane_info(width)
    down = _reduce_down(op, vt, width)
    in_width = np.uint32((1 << width) - 1)

    @cuda.jit(device=True)
    def warp_segmented_reduce(value, head_flag):
        logical, mask, first, active = info()
        if not active:
            return value
        heads = np.uint32(np.uint32(np.uint32(cuda.ballot_sync(mask, head_flag)) >> np.uint32(first)) & in_width)
        after = np.uint32(heads & _lanes_above(logical))      # 32-bit masks: see _lanes_below
        limit = cuda.ffs(after) - 1 if after != 0 else width
        return down(value, logical, mask, limit)

    return warp_segmented_reduce


@functools.lru_cache(maxsize=None, typed=True)
def peers(key_dtype, method="auto"):
    """Find the lanes holding the same key; ``f(key) -> peer_mask``.

    Every lane of the warp calls it; each gets the mask of the lanes whose
    key equals its own (itself included), as a uint32 (lane 31's bit set
    makes numba's int32 masks negative; uint32 keeps them plain). ``method='match'`` uses
    ``match_any_sync`` (sm_70+, keys of one scalar field);
    ``method='ballot'`` is seed 001's loop (shfl the key of the first
    unclaimed lane, ballot who matches), which works for any key type, tuples
    included, in as many rounds as there are distinct keys. ``'auto'`` picks
    ``match`` for scalar keys on sm_70 and later, ``ballot`` otherwise. Result valid on: every lane.

    Example::

        find_peers = cufold.warp.peers(np.int32)
        # p = find_peers(cell)   -> lanes with the same cell
    """
    vt = ValueType.of(key_dtype)
    if method not in ("auto", "match", "ballot"):
        raise ValueError("cufold: peers method must be 'auto', 'match' or 'ballot', got %r" % (method,))
    if method == "match" and vt.is_tuple:
        raise TypeError("cufold: match_any_sync compares one scalar; use method='ballot' for tuple keys")
    if method == "auto":
        method = "ballot" if vt.is_tuple or not _has_match() else "match"

    if method == "match":
        dt = vt.dtype
        # match_any_sync compares 32- or 64-bit words; widen narrower keys.
        word = np.int64 if dt.itemsize == 8 else np.int32
        if dt.kind == "f":
            word = np.float64 if dt.itemsize == 8 else np.float32

        @cuda.jit(device=True)
        def match_peers(key):
            return np.uint32(cuda.match_any_sync(FULL_MASK, word(key)))

        return match_peers

    shfl = vt.shuffle("idx")
    equal = vt.equal

    @cuda.jit(device=True)
    def ballot_peers(key):
        unclaimed = np.uint32(FULL_MASK)      # 32-bit masks: see _lanes_below
        mine = np.uint32(0)
        while unclaimed != 0:
            leader = cuda.ffs(unclaimed) - 1
            theirs = shfl(FULL_MASK, key, leader)
            # The leader always claims itself: a key unequal to itself (NaN)
            # would otherwise never leave ``unclaimed``, and the loop not end.
            is_peer = equal(key, theirs) or cuda.laneid == leader
            matched = np.uint32(cuda.ballot_sync(FULL_MASK, is_peer))
            if is_peer:
                mine = matched
            unclaimed = _clear(unclaimed, matched)
        return mine

    return ballot_peers


@functools.lru_cache(maxsize=None)
def _has_match():
    """Whether the GPU has ``match.any.sync`` (sm_70+). The simulator has it;
    without a usable GPU, assume a current one."""
    from numba import config
    if config.ENABLE_CUDASIM:
        return True
    try:
        return cuda.get_current_device().compute_capability >= (7, 0)
    except Exception:  # noqa: BLE001 - no driver here: compile for a modern GPU
        return True


@functools.lru_cache(maxsize=None, typed=True)
def reduce_peers(op, dtype):
    """Reduce each group of peer lanes; ``f(peer_mask, value) -> group_total``.

    ``peer_mask`` is what :func:`peers` returned. Seed 001's reduce_peers:
    a tree over every group at once, reading the bit patterns to find the
    next peer, ``log2`` of the largest group's size in steps. Every lane of the
    warp calls it. Result valid on: the first (lowest) lane of each group;
    operands are combined in lane order.

    Example::

        find_peers = cufold.warp.peers(np.int32)
        group_sum = cufold.warp.reduce_peers(cufold.plus, np.float64)
        # p = find_peers(cell); s = group_sum(p, v)
        # if cuda.laneid == cuda.ffs(p) - 1: cuda.atomic.add(out, cell, s)
    """
    op = as_op(op)
    vt = ValueType.of(dtype)
    combine = op.combine(vt)
    shfl = vt.shuffle("idx")

    @cuda.jit(device=True)
    def warp_reduce_peers(peer_mask, value):
        lane = np.uint32(cuda.laneid)
        peers = np.uint32(peer_mask)                  # 32-bit masks: see _lanes_below
        rank = cuda.popc(np.uint32(peers & _lanes_below(lane)))
        # The peers above me that have not yet been folded away.
        pending = np.uint32(peers & _lanes_above(lane))
        while cuda.any_sync(FULL_MASK, pending != 0):
            source = cuda.ffs(pending)
            other = shfl(FULL_MASK, value, source - 1)
            if source != 0:
                value = combine(value, other)
            # Lanes at odd relative positions have been read for the last time.
            pending = _clear(pending, cuda.ballot_sync(FULL_MASK, (rank & 1) == 1))
            rank >>= 1
        return value

    return warp_reduce_peers
