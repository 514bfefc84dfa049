"""Feature rows: reductions by key and over segments whose values are rows of ``F``
features, ``values`` of shape ``(n, F)``.

``reduce_by_key_into(keys, values, out)`` with ``out`` of shape ``(m, F)`` does
``out[keys[i], :] = op(out[keys[i], :], values[i, :])`` (``torch_geometric.utils.scatter``,
``index_add_`` over rows); ``segmented_reduce(values, offsets)`` returns ``(segments, F)``;
``reduce_by_key(keys, values)`` returns totals of shape ``(runs, F)``. Rows may be
C-contiguous or strided (any row stride and feature stride: the kernels index flat memory).

One kernel (``rows_kernel``) does all three. A warp owns a *span* of ``ROWS`` consecutive
rows (``SPAN_ROWS``; 128 on a GPU) and one chunk of features (``blockIdx.y``):

- **lanes over features.** ``P`` lanes cover a row's features (``P``: the power of two
  ``>= F``, at most 32); ``G = 32 / P`` consecutive rows are processed per step, one per
  group of ``P`` lanes (for ``F > 32`` one row per step, 2 or 4 features a lane: a warp
  covers up to 128 features, ``grid.y`` the chunks of them; for small ``F`` several rows
  per warp). Every load of a step is a coalesced row range (streamed: ``ld.global.cs``);
  ``UNROLL`` steps' loads are issued before the first is reduced.
- **runs of equal keys.** Each row has an id (its key, or its CSR segment); a group starts
  a run where its id differs from the previous row's. The step's runs are reduced by a
  segmented ``shfl_up`` scan over the groups (steps ``P, 2P, ...``), and the run open at
  the step's last group is carried into the next step, so a run costs **one update per
  feature per span**, however many rows it has (sorted destinations: long runs).
- **where a run goes** (``mode``):
  ``atomic``: ``out[id, f] = op(out[id, f], run)`` atomically (the hardware atomic of
  ``plus``/``min``/``max`` on integers, ``plus`` on floats; a compare-and-swap loop
  otherwise: ``bykey._updater``), for ``reduce_by_key_into``'s default. With one row a
  step (``F >= 32``) the span goes in windows of 32 rows: a ``match_any`` over the
  window's keys finds keys that repeat there but not next to each other (a power law's
  hot keys in shuffled order); the warp folds each such key's rows and updates once, and
  the runs skip them (``PEERS``);
  ``ordered``: a run inside the span is final and written once, with a plain store; the
  span's first and last runs (which may continue in the neighbouring spans) become two
  *pieces* (id and a row of partial totals, the second the identity when the span is one
  run). The pieces, in order, are reduced again by the same kernel (ids are sorted), one
  level per factor ``ROWS / 2``, until one span remains, which writes everything: every
  id is written exactly once, the fold in input order (bitwise reproducible, any
  associative operator with an identity).

Which runs when:

==============================  =================================================================
call                            kernels
==============================  =================================================================
``reduce_by_key_into``, F = 1   the 1-D algorithms (``cufold.device.bykey``) on the column views
``reduce_by_key_into``          ``atomic`` rows over the keys (any key order; ``check`` as 1-D)
``... deterministic=True``      floats: a stable radix grouping of ``(keys, row index)``
(or a non-commutative op)       (``cufold.device.radix``), then ``ordered`` rows gathering rows
                                by index, folded into ``out`` (``out[id] = op(out[id], total)``)
``segmented_reduce``, F = 1     the 1-D merge-path kernels (``cufold.device.segmented``) on columns
``segmented_reduce``            ``ordered`` rows whose ids come from the offsets (a 32-ary
                                search per span, then a walk): each segment written once as
                                ``init op total``; an empty one as ``init`` (or the identity)
``reduce_by_key``               its run offsets (one synchronisation, as 1-D), then the same
==============================  =================================================================

``transform=fn`` applies to each *item*: every feature of a row on its own (``fn`` of one
value, fused into the kernel's loads: ``rows_kernel``'s ``load_value``); the piece levels
reduce accumulators and take none.

No host synchronisation beyond the 1-D functions'; scratch (the pieces) comes from the
per-stream workspace and is bounded by the number of spans.
"""

import collections
import functools
import os

import numpy as np
from numba import config, cuda

from .. import _codegen, warp
from ..ops import as_op, as_transform
from ..values import ValueType
from ..host import arrays as _arrays, launch as _launch, programs as _programs

__all__ = ["SPAN_ROWS", "reduce_by_key_into", "rows_kernel", "segmented_reduce"]

SIMULATOR = bool(config.ENABLE_CUDASIM)
FULL_MASK = 0xFFFFFFFF
#: Rows per warp span (GPU; the simulator's spans are short so that tests cross many).
SPAN_ROWS = 128
#: Steps whose loads are issued together.
UNROLL = 4
#: Warps per block.
WARPS = 4
#: ``atomic`` rows of 32+ features: merge the repeats of a key within 32 rows (``match_any``)
#: before their updates (``CUFOLD_ROWS_PEERS=0``: runs only).
PEERS = os.environ.get("CUFOLD_ROWS_PEERS", "1") != "0"
#: Lanes per row at least (a power of two; ``CUFOLD_ROWS_LANES``): 32 gives rows of few
#: features one row a step too (idle lanes, no scan over groups, the peer merging).
LANES_MIN = int(os.environ.get("CUFOLD_ROWS_LANES", "1"))

Spec = collections.namedtuple("Spec", "op source key_dt in_dt acc_dt out_dt lanes vec steps unroll mode write "
                              "gather check transform", defaults=(None,))
Spec.__doc__ = """What a rows kernel is compiled for: ``source`` 'keys' (ids read from a key
array, ``gather``: through a row index) or 'csr' (ids from offsets); ``mode`` 'atomic' or
'ordered'; ``write`` 'into' (``out = op(out, total)``) or 'fresh' (``init op total``);
``lanes`` P; ``vec`` features per lane (``P = 32`` only); ``steps`` per span; ``check``:
record keys out of range; ``transform``: None or an ops.Transform of one ``in_dt`` item,
applied to every value (each feature of a row alone) as it is loaded."""


def lanes_for(F):
    """Lanes per row: the power of two ``>= F`` (and ``>= LANES_MIN``), at most 32."""
    p = 1
    while p < min(max(F, LANES_MIN), 32):
        p *= 2
    return p


def shape_for(F):
    """``(lanes, features per lane, steps, unroll)`` of rows of ``F`` features: a warp
    covers up to 128 features of a row (4 a lane, ``P`` loads of a row in flight
    together), so that the per-row work (the id, the run heads, the carry) is shared."""
    p = lanes_for(F)
    vec = 1 if F <= 32 else min(4, 1 << max(0, (-(-F // 32) - 1).bit_length()))
    g = 32 // p
    if SIMULATOR:
        unroll = 2
        steps = max(unroll, 8 // g)
    else:
        unroll = UNROLL if vec < 4 else 2
        steps = max(unroll, SPAN_ROWS // g)
    return p, vec, -(-steps // unroll) * unroll, unroll


def span_rows(spec):
    return spec.steps * (32 // spec.lanes)


def chunk_features(spec):
    """Features a warp covers (``grid.y`` chunks of them)."""
    return spec.lanes * spec.vec


# --- the kernel ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def rows_kernel(spec):
    """The kernel of every feature-row reduction (see the module doc):
    ``(src, perm, values, vrs, vfs, voff, n, m, F, out, bits, ors, ofs, ooff, pk, pv,
    spans, last, status, epoch, init, has_init)``.

    ``src``: keys (``n``; ids ``0 <= key < m``, others skipped) or CSR offsets (``m + 1``);
    ``perm``: row of each position (``gather``; else unused); ``values``, ``out``: flat 1-D
    views, element ``(r, f)`` at ``r * rs + f * fs + off``; ``pk``, ``pv``: this level's
    pieces (``ordered``; ``2 * spans`` ids and rows of ``F`` accumulators); ``last``: one
    span, write everything; ``init``: the value of an empty segment and, with ``has_init``,
    folded in front of every total (``fresh``). Lane ``l`` of a warp holds features
    ``chunk * P * V + l % P + j * P`` (``j < V``) of row ``l // P`` of each step.
    """
    from . import bykey            # the atomic updates and the bad-key record
    op = spec.op
    P, V = spec.lanes, spec.vec
    G = 32 // P
    S, U = spec.steps, spec.unroll
    ROWS = S * G
    CHUNK = P * V
    UV = U * V
    acc_vt = ValueType.of(spec.acc_dt)
    ACC = spec.acc_dt.type
    OUT = spec.out_dt.type
    combine = op.combine(acc_vt)
    up = acc_vt.shuffle("up")
    bcast = acc_vt.shuffle("idx")
    ident = op.identity_for(acc_vt)
    zero = acc_vt.make(ident if ident is not None else 0)
    atomic = spec.mode == "atomic"
    csr = spec.source == "csr"
    fresh = spec.write == "fresh"
    gather = spec.gather
    check = spec.check
    update = bykey._updater(op, spec.out_dt, bykey._atomic_mode(op, spec.out_dt), True) if atomic else None
    record = bykey._record
    full = np.uint32(FULL_MASK)
    # the first lane of every group: where run heads are read from the ballot
    group_heads = np.uint32(sum(1 << (k * P) for k in range(G)))
    # atomic rows of one row a step: windows of 32 rows whose equal keys that are not
    # adjacent (a power law's hot keys in any order) are merged before their update
    peers = atomic and G == 1 and PEERS
    WIN = min(32, S) if peers else S
    assert S % WIN == 0 and WIN % U == 0
    find_peers = warp.peers(np.int64) if peers else None

    if spec.in_dt.kind in "iuf" and spec.in_dt.itemsize >= 4:
        @cuda.jit(device=True)
        def load_value(values, i):
            """A streamed value (evict first: ``out``, which the updates read, stays in L2)."""
            return cuda.ldcs(values, np.uint64(i) & np.uint64(0x7FFFFFFFFFFFFFFF))
    else:
        @cuda.jit(device=True)
        def load_value(values, i):
            return values[i]
    if spec.transform is not None:     # per item: each feature of a row on its own, fused into the load
        load_value = _codegen.build("def load_item(values, i):\n    return tf(load(values, i))\n", "load_item",
                                    {"tf": spec.transform.device(ValueType.of(spec.in_dt)), "load": load_value})

    @cuda.jit(device=True)
    def seg_end(src, s, n):
        """End (exclusive) of CSR segment ``s``, clamped to ``[0, n]``."""
        return min(max(np.int64(src[s + 1]), np.int64(0)), n)

    @cuda.jit(device=True)
    def seg_start(src, s, n):
        return min(max(np.int64(src[s]), np.int64(0)), n)

    @cuda.jit(device=True, inline="always")
    def next_segment(src, s, s_start, s_end, m, n, g, f0, F, out, ors, ofs, ooff, init):
        """Past CSR segment ``s`` (``fresh``: written ``init`` if empty): the next
        ``(s, s_start, s_end)``."""
        if fresh and s_start == s_end and g == 0:
            for j in range(V):
                if f0 + j * P < F:
                    out[s * ors + (f0 + j * P) * ofs + ooff] = OUT(init)
        s += 1
        s_start = s_end
        if s < m:
            s_end = seg_end(src, s, n)
        return s, s_start, s_end

    @cuda.jit(device=True)
    def first_segment(src, m, n, r0):
        """The first segment whose end is ``>= r0`` (``m``: none): a 32-ary search, every
        lane probing one point of the range per round."""
        lane = cuda.laneid
        lo = np.int64(0)
        hi = m
        while lo < hi:
            width = hi - lo
            q = max(lo + (width * (lane + 1)) // 32 - 1, lo)
            hit = np.uint32(cuda.ballot_sync(FULL_MASK, seg_end(src, q, n) >= r0))
            if hit == 0:
                lo = hi
            else:
                first = cuda.ffs(hit) - 1
                new_hi = cuda.shfl_sync(FULL_MASK, q, first)
                below = cuda.shfl_sync(FULL_MASK, q, max(first - 1, 0)) + 1
                if first > 0:
                    lo = below
                hi = new_hi
        return lo

    @cuda.jit(device=True)
    def flush(idv, v, piece, f, F, m, out, bits, ors, ofs, ooff, pv, init, has_init):
        """Feature ``f`` of this span's part of a run of id ``idv``: final, or (``piece``
        >= 0) piece ``piece`` of the next level."""
        if f < F:
            if piece >= 0:
                pv[piece * F + f] = v
            elif idv >= 0 and idv < m:
                ix = idv * ors + f * ofs + ooff
                if atomic:
                    update(out, bits, ix, OUT(v))
                elif fresh:
                    out[ix] = OUT(combine(init, v) if has_init else v)
                else:
                    out[ix] = OUT(combine(ACC(out[ix]), v))

    @cuda.jit(device=True)
    def piece_id(pk, piece, idv, fl):
        if piece >= 0 and cuda.blockIdx.y == 0 and fl == 0:
            pk[piece] = idv

    def rows(src, perm, values, vrs, vfs, voff, n, m, F, out, bits, ors, ofs, ooff, pk, pv, spans, last,
             status, epoch, init, has_init):
        lane = cuda.laneid
        w = np.int64(cuda.blockIdx.x) * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
        if w >= spans:
            return
        g = lane // P
        fl = lane % P
        f0 = np.int64(cuda.blockIdx.y) * CHUNK + fl
        my_bit = np.uint32(lane - fl)               # the first lane of this lane's group
        first_group = np.int64(1 if g == 0 else 0)
        r0 = w * ROWS
        r1 = min(r0 + ROWS, n)
        ordered_last = (not atomic) and last
        s = np.int64(0)
        s_start = np.int64(0)
        s_end = np.int64(0)
        if csr:
            s = first_segment(src, m, n, r0)
            if s < m:
                s_start = seg_start(src, s, n)
                s_end = seg_end(src, s, n)
        carry_id = np.int64(-2)                     # no run open
        carry_start = np.int64(-1)
        carry_v = cuda.local.array(V, ACC)
        cur = cuda.local.array(V, ACC)
        for j in range(V):
            carry_v[j] = zero
        ids = cuda.local.array(U, np.int64)
        rowix = cuda.local.array(U, np.int64)
        vs = cuda.local.array(UV, ACC)
        for w0 in range(0, S, WIN):
            wb = r0 + np.int64(w0) * G
            if wb >= r1:
                break
            kid = np.int64(-1)
            scattered = np.uint32(0)
            mine = np.uint32(0)
            if peers:
                # the window's keys, one a lane; scattered: rows of a key that repeats in the
                # window but not next to itself (merged below, skipped by the runs)
                kr = wb + lane
                if lane < WIN and kr < r1:
                    k = np.int64(src[kr])
                    if k >= 0 and k < m:
                        kid = k
                    elif check and epoch > 0 and cuda.blockIdx.y == 0:
                        record(status, 0, epoch, kr)
                mine = find_peers(kid)
                low = np.uint32(mine >> np.uint32(cuda.ffs(mine) - 1))
                spread = kid >= 0 and np.uint32(low & np.uint32(low + np.uint32(1))) != 0
                scattered = np.uint32(cuda.ballot_sync(FULL_MASK, spread))
            for t0 in range(w0, w0 + WIN, U):
                rb0 = r0 + np.int64(t0) * G
                if rb0 >= r1:
                    break
                # ids of U steps
                for u in range(U):
                    rb = rb0 + u * G
                    idv = np.int64(-1)
                    q = rb + g
                    if peers:
                        t = t0 - w0 + u
                        idv = cuda.shfl_sync(FULL_MASK, kid, t)
                        if (scattered >> np.uint32(t)) & np.uint32(1) != 0:
                            idv = np.int64(-1)
                    elif csr:
                        for gg in range(G):
                            r = rb + gg
                            if r < r1:
                                while s < m and s_end <= r:
                                    s, s_start, s_end = next_segment(src, s, s_start, s_end, m, n, g, f0, F,
                                                                     out, ors, ofs, ooff, init)
                                if gg == g and s < m and s_start <= r:
                                    idv = s
                    elif q < r1:
                        k = np.int64(src[q])
                        if k >= 0 and k < m:
                            idv = k
                        elif check and epoch > 0 and fl == 0 and cuda.blockIdx.y == 0:
                            record(status, 0, epoch, q)
                        if gather:
                            q = np.int64(perm[q])
                    ids[u] = idv
                    rowix[u] = q
                # values of U steps
                for u in range(U):
                    live = rb0 + u * G + g < r1 and ids[u] >= 0     # rows of no id are never read
                    for j in range(V):
                        v = zero
                        f = f0 + j * P
                        if live and f < F:
                            v = ACC(load_value(values, rowix[u] * vrs + f * vfs + voff))
                        vs[u * V + j] = v
                # runs
                for u in range(U):
                    rb = rb0 + u * G
                    if rb < r1:
                        idv = ids[u]
                        for j in range(V):
                            cur[j] = vs[u * V + j]
                        if G == 1:
                            prev = carry_id
                        else:
                            up_id = cuda.shfl_up_sync(FULL_MASK, idv, P)
                            prev = up_id + (carry_id - up_id) * first_group     # carry_id for group 0
                        hm = np.uint32(np.uint32(cuda.ballot_sync(FULL_MASK, idv != prev)) & group_heads)
                        if (hm & np.uint32(1)) != 0 and carry_id != -2 and g == 0:
                            # the run carried from the last step ended there
                            piece = np.int64(-1)
                            if not atomic and not ordered_last and carry_start == r0:
                                piece = 2 * w
                            piece_id(pk, piece, carry_id, fl)
                            for j in range(V):
                                flush(carry_id, carry_v[j], piece, f0 + j * P, F, m, out, bits, ors, ofs, ooff, pv,
                                      init, has_init)
                        upto = np.uint32(hm & (full >> (np.uint32(31) - my_bit)))
                        from_carry = upto == 0
                        start_lane = np.int64(31 - cuda.clz(np.uint32(upto | np.uint32(1))))
                        if G > 1:
                            dist = (np.int64(my_bit) - start_lane) // P
                            d = 1
                            while d < G:
                                o = up(FULL_MASK, cur[0], d * P)
                                if dist >= d:
                                    cur[0] = combine(o, cur[0])
                                d *= 2
                        if from_carry and carry_id != -2:
                            for j in range(V):
                                cur[j] = combine(carry_v[j], cur[j])
                        start = carry_start if from_carry else rb + start_lane // P
                        if G > 1:
                            if g < G - 1 and np.uint32(hm >> (my_bit + np.uint32(P))) & np.uint32(1) != 0:
                                # the run ends at this group
                                piece = np.int64(-1)
                                if not atomic and not ordered_last and start == r0:
                                    piece = 2 * w
                                piece_id(pk, piece, idv, fl)
                                flush(idv, cur[0], piece, f0, F, m, out, bits, ors, ofs, ooff, pv, init, has_init)
                            src_lane = (G - 1) * P + fl
                            carry_v[0] = bcast(FULL_MASK, cur[0], src_lane)
                            carry_id = cuda.shfl_sync(FULL_MASK, idv, src_lane)
                            carry_start = cuda.shfl_sync(FULL_MASK, start, src_lane)
                        else:
                            for j in range(V):
                                carry_v[j] = cur[j]
                            carry_id = idv
                            carry_start = start
            if peers:
                # each scattered key of the window: its rows folded by the warp, one update
                lead = np.uint32(cuda.ballot_sync(FULL_MASK, cuda.ffs(mine) - 1 == lane)) & scattered
                while lead != 0:
                    t = cuda.ffs(lead) - 1
                    lead = np.uint32(lead & np.uint32(lead - np.uint32(1)))
                    members = np.uint32(cuda.shfl_sync(FULL_MASK, np.int64(mine), t))
                    idv = cuda.shfl_sync(FULL_MASK, kid, t)
                    for j in range(V):
                        cur[j] = zero
                    have = False
                    while members != 0:
                        r = wb + (cuda.ffs(members) - 1)
                        members = np.uint32(members & np.uint32(members - np.uint32(1)))
                        for j in range(V):
                            f = f0 + j * P
                            if f < F:
                                x = ACC(load_value(values, r * vrs + f * vfs + voff))
                                cur[j] = combine(cur[j], x) if have else x
                        have = True
                    for j in range(V):
                        flush(idv, cur[j], np.int64(-1), f0 + j * P, F, m, out, bits, ors, ofs, ooff, pv, init,
                              has_init)
        if csr and r1 >= n:
            # the last span: the empty segments at the end
            while s < m:
                s, s_start, s_end = next_segment(src, s, s_start, s_end, m, n, g, f0, F, out, ors, ofs, ooff,
                                                 init)
        # the run open at the span's end
        if g == 0:
            if atomic or ordered_last:
                if carry_id != -2:
                    for j in range(V):
                        flush(carry_id, carry_v[j], np.int64(-1), f0 + j * P, F, m, out, bits, ors, ofs, ooff, pv,
                              init, has_init)
            else:
                first_piece = 2 * w
                if carry_id == -2:                  # an empty span (no rows): two pieces of nothing
                    carry_id = np.int64(-1)
                    carry_start = r0
                    for j in range(V):
                        carry_v[j] = zero
                if carry_start == r0:               # the span is one run: its second piece is nothing
                    piece_id(pk, first_piece, carry_id, fl)
                    piece_id(pk, first_piece + 1, carry_id, fl)
                    for j in range(V):
                        flush(carry_id, carry_v[j], first_piece, f0 + j * P, F, m, out, bits, ors, ofs, ooff, pv,
                              init, has_init)
                        flush(carry_id, zero, first_piece + 1, f0 + j * P, F, m, out, bits, ors, ofs, ooff, pv,
                              init, has_init)
                else:
                    piece_id(pk, first_piece + 1, carry_id, fl)
                    for j in range(V):
                        flush(carry_id, carry_v[j], first_piece + 1, f0 + j * P, F, m, out, bits, ors, ofs, ooff,
                              pv, init, has_init)

    return rows


@functools.lru_cache(maxsize=None)
def iota_kernel():
    """Kernel ``(out, n)``: ``out[i] = i``."""

    def iota(out, n):
        i = cuda.grid(1)
        if i < n:
            out[i] = i

    return iota


# --- host side --------------------------------------------------------------------------------

def flat(a):
    """``(flat, row stride, feature stride, offset)`` of 2-D placeholder ``a``: a 1-D
    contiguous view of the memory ``a`` spans, and how element ``(r, f)`` is found in it
    (``r * rs + f * fs + offset``; negative strides included)."""
    lo = sum((d - 1) * s for d, s in zip(a.shape, a.strides) if s < 0 and d > 0)
    hi = sum((d - 1) * s for d, s in zip(a.shape, a.strides) if s > 0 and d > 0)
    size = hi - lo + 1
    view = _arrays.Arr(a.ptr + lo * a.itemsize, (size,), (1,), a.dtype, size, a.library, None, a.device_id,
                       a.stream)
    return view, np.int64(a.strides[0]), np.int64(a.strides[1]), np.int64(-lo)


def _align(nbytes):
    return -(-nbytes // 256) * 256


def add_rows(b, spec, src, perm, values, n, m, F, out, bits, init, has_init, status, epoch, offset=0):
    """Add the launches of a feature-row reduction to Program builder ``b``: ``values`` and
    ``out`` as :func:`flat` gives them (``bits``: the flat view the compare-and-swap loop
    swaps), level 0 and, ``ordered``, the piece levels (pieces from the workspace, from byte
    ``offset`` on)."""
    rows = span_rows(spec)
    chunks = max(1, -(-F // chunk_features(spec)))
    warps = 1 if SIMULATOR else WARPS
    spans = max(1, -(-n // rows))
    acc = spec.acc_dt
    n64, m64, F64 = np.int64(n), np.int64(m), np.int64(F)
    vflat, vrs, vfs, voff = values
    oflat, ors, ofs, ooff = out

    def pieces_of(count):
        return _align(8 * count) + _align(count * F * acc.itemsize)

    if spec.mode == "atomic":
        _, ws = _launch.workspace(b.device_id, b.stream, offset + 512)
        bufs = [(ws.view(np.int64, (1,), offset), ws.view(acc, (1,), offset + 256))]
    else:
        c0 = 2 * spans
        c1 = 2 * max(1, -(-c0 // rows))
        _, ws = _launch.workspace(b.device_id, b.stream, offset + pieces_of(c0) + pieces_of(c1))
        bufs = []
        for count in (c0, c1):
            bufs.append((ws.view(np.int64, (count,), offset), ws.view(acc, (count * F,), offset + _align(8 * count))))
            offset += pieces_of(count)
    pk, pv = bufs[0]
    grid = (-(-spans // warps), chunks)
    b.launch(rows_kernel(spec), ("rows", spec), grid, 32 * warps,
             (src, perm, vflat, vrs, vfs, voff, n64, m64, F64, oflat, bits, ors, ofs, ooff, pk, pv,
              np.int64(spans), np.bool_(spans == 1), status, epoch, init, np.bool_(has_init)))
    if spec.mode == "atomic":
        return
    level_spec = spec._replace(source="keys", key_dt=np.dtype(np.int64), in_dt=acc, gather=False, check=False,
                               transform=None)
    level = 0
    while spans > 1:
        count = 2 * spans
        src_k, src_v = bufs[level % 2]
        spans = -(-count // rows)
        pk, pv = bufs[(level + 1) % 2]
        b.launch(rows_kernel(level_spec), ("rows", level_spec), (-(-spans // warps), chunks), 32 * warps,
                 (src_k, src_k, src_v, F64, np.int64(1), np.int64(0), np.int64(count), m64, F64, oflat, bits,
                  ors, ofs, ooff, pk, pv, np.int64(spans), np.bool_(spans == 1), status, np.int64(0), init,
                  np.bool_(has_init)))
        level += 1


def check_rows(k, v, o):
    """The shapes of ``reduce_by_key_into`` with feature rows (``v`` or ``o`` not 1-D)."""
    if k.ndim != 1:
        raise ValueError("cufold: reduce_by_key_into takes 1-D keys; keys has shape %s" % (k.shape,))
    for a, name in ((v, "values"), (o, "out")):
        if a.ndim != 2:
            raise ValueError("cufold: reduce_by_key_into takes values of shape (n,) and out of shape (m,), or "
                             "feature rows: values (n, F) and out (m, F); %s has shape %s" % (name, a.shape))
    if v.shape[1] != o.shape[1]:
        raise ValueError("cufold: values have %d features per row (shape %s) but out has %d (shape %s)"
                         % (v.shape[1], v.shape, o.shape[1], o.shape))
    if k.size != v.shape[0]:
        raise ValueError("cufold: keys and values must be equally long; got %d keys and %d rows"
                         % (k.size, v.shape[0]))


def _column(a):
    """Feature 0 of 2-D ``a`` as a 1-D Arr (its rows' stride)."""
    return _arrays.Arr(a.ptr, (a.shape[0],), (a.strides[0],), a.dtype, a.shape[0], a.library, a.obj, a.device_id,
                       a.stream)


def reduce_by_key_into(k, v, o, op, algorithm, deterministic, check, handle, transform=None):
    """``cufold.reduce_by_key_into`` of feature rows (described arrays ``k``, ``v``, ``o``;
    ``handle``: the raw stream; ``transform`` applies to each value, a row's features
    one by one)."""
    from . import bykey
    check_rows(k, v, o)
    sig = _programs.signature
    if v.shape[1] == 1:     # one feature: the 1-D algorithms on the columns
        v, o = _column(v), _column(o)
        key = (op, algorithm, deterministic, check, sig(k), sig(v), sig(o), handle, transform)
        programs = bykey._bykey_programs
    else:
        key = ("rows", op, algorithm, deterministic, check, sig(k), sig(v), sig(o), handle, transform)
        programs = _into_programs
    if check:
        programs.run(key, k, v, o, bykey._status(o.device_id, handle, True)[1])
    else:
        programs.run(key, k, v, o)


def _plan_into(key, k, v, o, *epoch):
    """The Program of a feature-row ``reduce_by_key_into`` signature."""
    from . import bykey, radix
    _, op, algorithm, deterministic, check, _, _, _, handle, transform = key
    op = as_op(op)
    transform = as_transform(transform)
    if algorithm is not None:
        raise ValueError("cufold: reduce_by_key_into of feature rows chooses its algorithm itself; pass "
                         "algorithm=None (got %r)" % (algorithm,))
    _arrays.same_device((o, k, v), "reduce_by_key_into's arrays")
    bykey._check_types(k.dtype, item_dtype(v.dtype, transform, "reduce_by_key_into"), o.dtype)
    out_vt = ValueType.of(o.dtype)
    op.check(out_vt)
    mode = bykey._atomic_mode(op, o.dtype)
    ordered = (bool(deterministic) and not (mode == "hw" and o.dtype.kind in "iu")) or not op.commutative
    if ordered and op.identity_for(out_vt) is None:
        raise ValueError("cufold: reduce_by_key_into of feature rows in order (deterministic=True or a "
                         "non-commutative operator) needs an operator with an identity; %s has none" % op.name)
    m, (n, F) = o.shape[0], v.shape
    device_id = o.device_id
    b = _programs.Builder(device_id, handle)
    ks, vs, os_ = b.input(k), b.input(v), b.input(o)
    st = bykey._status(device_id, handle, False)[0] if check else None
    status = st.kernel if check else bykey._quiet_status(device_id, handle)
    epoch = b.value(np.int64(0)) if check else np.int64(0)
    if n > 0 and F > 0:         # m == 0 too: every key is out of range (reported)
        P, V, S, U = shape_for(F)
        oflat = flat(os_)
        bits = bykey._bits_view(oflat[0]) if mode == "cas" and o.dtype.kind == "f" else oflat[0]
        zero = out_vt.make(op.identity_for(out_vt) if op.identity_for(out_vt) is not None else 0)
        if ordered:
            idx_dt = np.dtype(np.int32 if n < (1 << 31) else np.int64)
            iota = b.output(ks, n, idx_dt)
            nt = 64 if SIMULATOR else 256
            b.launch(iota_kernel(), ("rows-iota",), -(-n // nt), nt, (iota, np.int64(n)))
            sk, perm, end = radix.group(b, ks, iota, m, 0, radix.group_buffers(b, ks, iota, m), status=status,
                                        epoch=epoch, on_bad=bykey._record_out_of_range)
            spec = Spec(op, "keys", sk.dtype, v.dtype, o.dtype, o.dtype, P, V, S, U, "ordered", "into", True, False,
                        transform)
            add_rows(b, spec, sk, perm, flat(vs), n, m, F, oflat, bits, zero, False, status, np.int64(0), end)
        else:
            spec = Spec(op, "keys", k.dtype, v.dtype, o.dtype, o.dtype, P, V, S, U, "atomic", "into", False,
                        bool(check), transform)
            add_rows(b, spec, ks, ks, flat(vs), n, m, F, oflat, bits, zero, False, status, epoch)
    if check:
        where = (device_id, handle)
        b.guard(lambda: bykey._statuses.get(where) is st)
        if n > 0:
            b.after(lambda arrays, values: bykey._raise_errors(st, values[0], arrays[0], m, handle, device_id))
    return b.build(lambda got: None)


_into_programs = _programs.Programs(_plan_into, "cufold.reduce_by_key_into (rows)", 4096)


# --- segments ---------------------------------------------------------------------------------

def add_segments(b, op, acc_vt, out_vt, vs, off, n, m, F, out, init_value, has_init, transform=None):
    """Add a feature-row segmented reduction over CSR offsets ``off`` (placeholders of
    builder ``b``: values ``vs`` (n, F), ``out`` (m, F), C-contiguous) to ``b``;
    ``transform`` (an ops.Transform or None) applies to each value as it is loaded."""
    from . import bykey, segmented
    if m == 0 or F == 0:
        return
    if F == 1:      # one feature: the 1-D merge-path kernels on the columns
        spec = segmented.Spec(op, ValueType.of(vs.dtype), acc_vt, out_vt, segmented.tile_for(acc_vt, n + m),
                              transform)
        segmented._run_segments(b, spec, _column(vs), off, n, m, _column(out), init_value, has_init)
        return
    if op.identity_for(acc_vt) is None:
        raise ValueError("cufold: segmented reductions of feature rows need an operator with an identity; "
                         "%s has none" % op.name)
    P, V, S, U = shape_for(F)
    oflat = flat(out)
    spec = Spec(op, "csr", off.dtype, vs.dtype, acc_vt.fields[0], out_vt.fields[0], P, V, S, U, "ordered", "fresh",
                False, False, transform)
    add_rows(b, spec, off, off, flat(vs), n, m, F, oflat, oflat[0], init_value, has_init,
             bykey._quiet_status(b.device_id, b.stream), np.int64(0))


def check_segment_rows(v):
    if v.ndim != 2:
        raise ValueError("cufold: segmented reductions take values of shape (n,) or feature rows (n, F); got "
                         "shape %s" % (v.shape,))
    if v.dtype.kind not in "biuf":
        raise TypeError("cufold: feature rows of dtype %s are not supported" % v.dtype)


def item_dtype(dt, transform, name):
    """The dtype of what the operator sees of a value of ``dt``: ``dt``, or the result of
    ``transform`` (an ops.Transform of one item: a row's features are transformed one by
    one), which must be a single value."""
    if transform is None:
        return dt
    item = transform.result_type(ValueType.of(dt))
    if item.is_tuple:
        raise TypeError("cufold: transform %s returns %s; %s of feature rows transforms each value (one "
                        "feature of a row) into one value" % (transform.name, item, name))
    return item.dtype


def segmented_reduce(v, off, op, init, dtype, handle, given_stream, transform=None):
    """``cufold.segmented_reduce`` of feature rows (described ``v`` (n, F) and offsets)."""
    sig = _programs.signature
    return _segment_programs.run((sig(v), sig(off), handle, op, init, dtype, given_stream, transform), v, off)


def _plan_segments(key, v, off):
    from . import segmented as seg
    _, _, handle, op, init, dtype, given_stream, transform = key
    transform = as_transform(transform)
    check_segment_rows(v)
    seg._check_offsets(off)
    _arrays.same_device((v, off), "values and offsets")
    op = as_op(op)
    acc_vt, out_vt = seg._result_types(op, ValueType.of(item_dtype(v.dtype, transform, "segmented_reduce")), dtype)
    op.check(acc_vt)
    init_value, has_init = seg._start_value(op, acc_vt, init, "segmented_reduce")
    b = _programs.Builder(off.device_id, handle, handle if given_stream else None)
    vs, o = b.input(v), b.input(off)
    m = off.size - 1
    out = b.output(vs, (m, v.shape[1]), out_vt.fields[0])
    add_segments(b, op, acc_vt, out_vt, vs, o, v.shape[0], m, v.shape[1], out, init_value, has_init, transform)
    return b.build()


_segment_programs = _programs.Programs(_plan_segments, "cufold.segmented_reduce (rows)", 4096)
