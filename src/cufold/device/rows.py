"""Feature rows: reductions by key and over segments whose values are rows of ``F``
features, ``values`` of shape ``(n, F)``.

``reduce_by_key_into(keys, values, out)`` with ``out`` of shape ``(m, F)`` does
``out[keys[i], :] = op(out[keys[i], :], values[i, :])`` (``torch_geometric.utils.scatter``,
``index_add_`` over rows); ``segmented_reduce(values, offsets)`` returns ``(segments, F)``;
``reduce_by_key(keys, values)`` returns totals of shape ``(runs, F)``. Rows may be
C-contiguous or strided (any row stride and feature stride: the kernels index flat memory).

One kernel (``rows_kernel``) does all three. A *span* is ``SPAN_ROWS`` consecutive rows
(128 on a GPU) of one chunk of features (``blockIdx.y``); a group of ``P`` lanes owns a
span, a warp ``G = 32 / P`` spans side by side:

- **lanes over features.** ``P`` lanes cover a row, ``V`` features a lane (``f = l + j *
  P``): ``P`` is the power of two ``>= F`` up to 8, 8 for 9-32 features (2-4 a lane: each
  load of a row is a whole 32-byte sector, and the per-row work is shared by more
  features), 32 above (a warp a row, up to 128 features, ``grid.y`` the chunks of them).
  Quads (see ``atomic`` below): ``V = 4`` consecutive features a lane (``f = 4 l + j``),
  ``P`` the power of two ``>= F / 4`` up to 32. A group walks its span one row a step;
  ``U`` steps' loads are issued before the first is reduced, values before (not after)
  the keys arrive, streamed (``ld.global.cs``).
- **runs of equal keys.** Each row has an id (its key, or its CSR segment, from the
  group's own walk over the offsets). A group carries the run open at its last row: a row
  of the same id adds to it, a row of a new id flushes it and opens its own. No shuffles
  per row and nothing shared between groups, so a run costs **one update per feature per
  span**, however many rows it has (sorted destinations: long runs), for a few
  instructions a row shared by the row's ``V`` features.
- **where a run goes** (``mode``):
  ``atomic``: ``out[id, f] = op(out[id, f], run)`` atomically (the hardware atomic of
  ``plus``/``min``/``max`` on integers, ``plus`` on floats; a compare-and-swap loop
  otherwise: ``bykey._updater``), for ``reduce_by_key_into``'s default. Float32 sums of
  ``F = 4k`` features go a *quad* a lane (four consecutive features, ``quads_for``): a
  run's four totals are one 16-byte reduction (``cufold.quads.add4``); compare-and-swap
  rows of ``F = 4k`` 32-bit features go a quad a lane too, reading a run's four words in
  one 16-byte load (``cufold.quads.read4``). The spans go in
  windows of 32 rows a warp (``min(P, SPAN_ROWS)`` rows of each group's span, one key a
  lane): a ``match_any`` over the window's keys finds keys that repeat there but not
  next to each other in one span (a power law's hot keys in shuffled order); each group
  folds its rows of such a key, the groups' folds combine across the warp (``shfl_xor``),
  one group updates once, and the runs skip those rows (``PEERS``);
  ``ordered``: a run inside the span is final and written once, with a plain store; the
  span's first and last runs (which may continue in the neighbouring spans) become two
  *pieces* (id and a row of partial totals, the second the identity when the span is one
  run). The pieces, in order, are reduced again by the same kernel (ids are sorted), one
  level per factor ``SPAN_ROWS / 2``, until one span remains, which writes everything:
  every id is written exactly once, the fold in input order (bitwise reproducible, any
  associative operator with an identity).

Which runs when:

==============================  =================================================================
call                            kernels
==============================  =================================================================
``reduce_by_key_into``, F = 1   the 1-D algorithms (``cufold.device.bykey``) on the column views
``reduce_by_key_into``          ``atomic`` rows over the keys (any key order; ``check`` as 1-D)
``... F >= 32, n >= 2^16,``     adaptive, on the GPU: a kernel flags keys that are not sorted;
``a CAS operator or out > L2``  flagged, the ``deterministic=True`` kernels below run and the
                                atomic ones return at once; not flagged, the other way round.
                                Later calls of the signature launch only the path the last
                                flag chose (a hint read without waiting: ``PATH_HINTS``)
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

from .. import _codegen, quads as _quads, warp
from ..ops import as_op, as_transform
from ..values import ValueType
from ..host import arrays as _arrays, launch as _launch, programs as _programs, readback as _readback
from ..host.launch import gated_off

__all__ = ["SPAN_ROWS", "reduce_by_key_into", "rows_kernel", "segmented_reduce"]

SIMULATOR = bool(config.ENABLE_CUDASIM)
FULL_MASK = 0xFFFFFFFF
#: Rows per span, the rows one group of ``P`` lanes owns (GPU; the simulator's spans are
#: short so that tests cross many).
SPAN_ROWS = 128
#: Rows per span of the piece levels (``ordered``): a level leaves 2 pieces a span, so it
#: shrinks the pieces by ``LEVEL_ROWS / 2``. Short spans keep the levels wide: at 128 rows a
#: span, level 1 of E = 4M rows had 489 spans (one warp each, 32 batches of loads one after
#: another) and level 2 had 8; the levels took 294 of 992 us at F = 64 and 562 of 2772 at
#: F = 256 (ncu, H200, shuffled power-law keys, deterministic=True).
LEVEL_ROWS = 4 if SIMULATOR else 16
#: ``reduce_by_key_into``'s default takes the adaptive path (grouped where the keys are not
#: sorted, see ``_plan_into``) from this many features (``CUFOLD_ROWS_ADAPTIVE_F``) and rows on.
ADAPTIVE_MIN_FEATURES = 4 if SIMULATOR else int(os.environ.get("CUFOLD_ROWS_ADAPTIVE_F", "32"))
ADAPTIVE_MIN_ROWS = 1 if SIMULATOR else 1 << 16
#: Hardware-atomic rows (sums) of at least this many features take the adaptive path too,
#: their table in L2 or not (``CUFOLD_ROWS_ADAPTIVE_HW_F``; 0: only a table larger than L2).
#: At F = 64 (E = 4M power-law keys into N = 200k rows, H200, two runs, gated pair every call)
#: 32 took shuffled keys' sums 1076 / 1038 -> 838 / 800 us (the L2's atomic bandwidth holds the
#: atomic quads) but sorted keys' 371 / 359 -> 461 / 433: the look, the grouping's scans and ~15
#: launches that return at once. With PATH_HINTS a repeated call launches one path (H200,
#: session 32, against 0 without hints): sorted 346 -> 371 us (the look), shuffled 1068 -> 801.
ADAPTIVE_HW_FEATURES = int(os.environ.get("CUFOLD_ROWS_ADAPTIVE_HW_F", "32"))
#: An adaptive signature's later calls launch only the path its previous look chose
#: (``CUFOLD_ROWS_PATH_HINTS=0``: both paths, gated on the GPU, every call). The look still
#: runs every call and publishes its answer to a host-mapped slot (readback.HintSlot),
#: read without waiting: a call whose keys changed order takes the other path's time
#: once, never a wrong result (either path is right for any order).
PATH_HINTS = os.environ.get("CUFOLD_ROWS_PATH_HINTS", "1") != "0"
#: Steps whose loads are issued together (rows of 32+ features: a warp's row a step).
UNROLL = 4
#: Steps whose loads are issued together for rows of < 32 features (``CUFOLD_ROWS_UNROLL``):
#: each of the warp's ``32 / P`` groups has this many rows in flight.
UNROLL_SMALL = int(os.environ.get("CUFOLD_ROWS_UNROLL", "4"))
#: Warps per block.
WARPS = 4
#: Resident blocks per SM the rows kernels are compiled for (``launch_bounds``;
#: ``CUFOLD_ROWS_MIN_BLOCKS``): 8 blocks of 4 warps, 64 registers.
MIN_BLOCKS = int(os.environ.get("CUFOLD_ROWS_MIN_BLOCKS", "8"))
#: ``atomic`` rows: merge the repeats of a key within a window of 32 rows (``match_any``;
#: ``min(P, span)`` rows of each group's span) before their updates (``CUFOLD_ROWS_PEERS=0``:
#: runs only).
PEERS = os.environ.get("CUFOLD_ROWS_PEERS", "1") != "0"
#: Lanes per row of 9 to 32 features (several features a lane): 8 lanes of 4-byte items
#: read a whole 32-byte sector of a row together.
SMALL_LANES = 8
#: Lanes per row at least (a power of two; ``CUFOLD_ROWS_LANES``): 32 gives rows of few
#: features a warp each (idle lanes, a span a warp).
LANES_MIN = int(os.environ.get("CUFOLD_ROWS_LANES", "1"))
#: ``atomic`` float32 sums go to ``out`` four features in one reduction where they can
#: (``quads_for``; ``CUFOLD_ROWS_QUADS=0``: a feature an atomic).
QUADS = os.environ.get("CUFOLD_ROWS_QUADS", "1") != "0"
#: ``ordered`` rows of aligned float32 values load four features of a row at once
#: (``CUFOLD_ROWS_QUADS_ORDERED=0``: a feature a load). H200, E = 4M shuffled rows grouped
#: by key: F = 256 sum 2710 -> 1863 us, F = 64 maximum 1106 -> 878; F = 16 unchanged.
QUADS_ORDERED = os.environ.get("CUFOLD_ROWS_QUADS_ORDERED", "1") != "0"
#: ``atomic`` rows of a compare-and-swap operator (a float maximum) go a quad a lane too
#: where ``out``'s quads are aligned 32-bit words (``CUFOLD_ROWS_QUADS_CAS=0``: a feature
#: every ``P`` lanes), reading a run's four words in one 16-byte load: one round trip where
#: there were two to four, each waiting on the previous feature's loop. H200, E = 4M power-law
#: rows: F = 16 shuffled maximum 757 -> 675 us, sorted 382 -> 343; F = 256 sorted 2004 -> 1721.
QUADS_CAS = os.environ.get("CUFOLD_ROWS_QUADS_CAS", "1") != "0"
#: 'cas4' rows of a float32 maximum or minimum update a word the run changes with one
#: fire-and-forget integer reduction of its bits (``cufold.quads.red_max``, 'red4') instead
#: of a compare-and-swap whose answer the lane waits for (``CUFOLD_ROWS_FLOAT_RED=0``).
FLOAT_RED = os.environ.get("CUFOLD_ROWS_FLOAT_RED", "1") != "0"

Spec = collections.namedtuple("Spec", "op source key_dt in_dt acc_dt out_dt lanes vec steps unroll mode write "
                              "gather check transform quads flush4", defaults=(None, None, None))
Spec.__doc__ = """What a rows kernel is compiled for: ``source`` 'keys' (ids read from a key
array, ``gather``: through a row index) or 'csr' (ids from offsets); ``mode`` 'atomic' or
'ordered'; ``write`` 'into' (``out = op(out, total)``) or 'fresh' (``init op total``);
``lanes`` P; ``vec`` features per lane (``f = l + j * P``); ``steps``: rows per span; ``check``:
record keys out of range; ``transform``: None or an ops.Transform of one ``in_dt`` item,
applied to every value (each feature of a row alone) as it is loaded; ``quads``: None, or
(see :func:`quads_for`) a lane's ``V = 4`` features are consecutive (``f = 4 * l + j``),
'load4' if they come in one 16-byte load, 'scalar' if not; ``flush4``: (``atomic`` quads,
``out``'s quads 16-byte aligned) None, 'add4' (a run's four totals go to ``out`` as one
16-byte reduction, ``cufold.quads.add4``) or 'cas4' (one 16-byte read of the four words,
``cufold.quads.read4``, then a compare-and-swap for each that the run changes) or 'red4'
(as 'cas4', a float32 maximum or minimum: an integer reduction for each word it changes,
``cufold.quads.red_max``)."""


def lanes_for(F, quads=False):
    """Lanes per row: the power of two ``>= F`` up to ``SMALL_LANES`` (rows of more
    features up to 32: ``SMALL_LANES``, several features a lane; more than 32: 32), or
    (``quads``: four features a lane) ``>= F / 4`` up to 32; and ``>= LANES_MIN``."""
    if quads:
        want = -(-F // 4)
    else:
        want = F if F <= SMALL_LANES or F > 32 else SMALL_LANES
    p = 1
    while p < min(max(want, LANES_MIN), 32):
        p *= 2
    return p


def quads_for(mode, op, F, values, out=None, device_id=0):
    """``(quads, flush4)`` of ``Spec`` for rows of ``F`` features (flat views as :func:`flat`
    gives them): whether a lane holds four consecutive features ('load4' where the values'
    quads are 16-byte aligned float32, else 'scalar'; None: a feature every ``P`` lanes),
    and how its runs go to ``out`` (``Spec.flush4``).

    ``atomic`` rows: quads with 'add4' where four features can be one 16-byte atomic
    reduction (a float32 sum, ``F`` a multiple of 4, ``out``'s quads 16-byte aligned, sm_90
    on). An L2 atomic unit takes a 16-byte reduction for about the price of a 4-byte one,
    and shuffled keys' updates are what such rows cost (F = 16 sum, E = 4M shuffled
    power-law keys, H200: 488 -> 345 us). With ``QUADS_CAS``, quads with 'cas4' for a
    compare-and-swap operator where ``out``'s quads are aligned 32-bit words (one read of a
    run's four words). ``ordered`` rows: 'load4' where the values' quads are aligned (one
    16-byte load where there were four) and ``QUADS_ORDERED`` is on."""
    vflat, vrs, vfs, voff = values
    if F % 4:
        return None, None
    aligned = vflat.dtype == np.float32 and vfs == 1 and vrs % 4 == 0 and voff % 4 == 0 and vflat.ptr % 16 == 0
    loads = "load4" if aligned else "scalar"
    if mode == "ordered":
        return ("load4" if QUADS_ORDERED and aligned else None), None
    oflat, ors, ofs, ooff = out
    out_quads = ofs == 1 and ors % 4 == 0 and ooff % 4 == 0 and oflat.ptr % 16 == 0
    if (QUADS and op.atomic == "add" and oflat.dtype == np.float32 and out_quads
            and _launch.compute_capability(device_id) >= (9, 0)):
        return loads, "add4"
    from . import bykey
    if QUADS_CAS and bykey._atomic_mode(op, oflat.dtype) == "cas":
        # (without the 16-byte read, a quad a lane is slower than a feature every P lanes:
        # its four reads wait one after another; H200, F = 16 shuffled max 840 vs 760 us)
        if oflat.dtype.itemsize == 4 and oflat.dtype.kind in "fiu" and out_quads:
            extreme = FLOAT_RED and oflat.dtype == np.float32 and op.atomic in ("max", "min")
            return loads, ("red4" if extreme else "cas4")
    return None, None


def shape_for(F, peers=False, quads=None):
    """``(lanes, features per lane, rows per span, unroll)`` of rows of ``F`` features. A
    group of ``P`` lanes covers a row (``V`` features a lane, ``f = l + j * P``), the
    warp's ``32 / P`` groups a span each: the per-row work (the id, the run test, the
    flush) is a group's, shared by its ``V`` features, so fewer lanes a row are fewer
    instructions a row; ``P >= 8`` keeps each load of a row whole 32-byte sectors. Rows of
    more than 32 features: a warp a row, up to 128 features (``grid.y``: the chunks).
    ``peers``: the atomic rows' windows (``min(P, span)`` rows of a group) are whole
    unrolled chunks. ``quads`` (``Spec.quads``): four consecutive features a lane."""
    p = lanes_for(F, bool(quads))
    if quads:                               # 4 consecutive features a lane: a lane a quad
        vec = 4
    elif F <= 32:
        vec = -(-F // p)
    else:
        vec = min(4, 1 << max(0, (-(-F // 32) - 1).bit_length()))
    if SIMULATOR:
        unroll, steps = 2, 8
    else:
        # sub-warp rows: U rows of each group's span in flight (U * 32 / P rows a warp)
        unroll = (UNROLL if vec < 4 else 2) if p == 32 else max(2, UNROLL_SMALL * 2 // max(vec, 2))
        steps = SPAN_ROWS
    if peers:
        unroll = min(unroll, p, steps)
    return p, vec, -(-steps // unroll) * unroll, unroll


def span_rows(spec):
    """Rows of one span (one group of ``P`` lanes)."""
    return spec.steps


def chunk_features(spec):
    """Features a warp covers (``grid.y`` chunks of them)."""
    return spec.lanes * spec.vec


# --- the kernel ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def rows_kernel(spec):
    """The kernel of every feature-row reduction (see the module doc):
    ``(src, perm, values, vrs, vfs, voff, n, m, F, out, bits, ors, ofs, ooff, pk, pv,
    spans, last, status, epoch, init, has_init, gate, gate_on)``.

    ``src``: keys (``n``; ids ``0 <= key < m``, others skipped) or CSR offsets (``m + 1``);
    ``perm``: row of each position (``gather``; else unused); ``values``, ``out``: flat 1-D
    views, element ``(r, f)`` at ``r * rs + f * fs + off``; ``pk``, ``pv``: this level's
    pieces (``ordered``; ``2 * spans`` ids and rows of ``F`` accumulators); ``last``: one
    span, write everything; ``init``: the value of an empty segment and, with ``has_init``,
    folded in front of every total (``fresh``); ``gate``, ``gate_on``: see
    ``launch.gated_off`` (the two paths of an adaptive ``reduce_by_key_into``). Group ``g =
    lane // P`` of warp ``w`` owns
    span ``w * 32 / P + g``; its lane ``l`` holds features ``chunk * P * V + l % P + j * P``
    (``j < V``; quads: ``chunk * P * V + 4 * (l % P) + j``) of the span's rows, one row a step.
    """
    from . import bykey            # the atomic updates and the bad-key record
    op = spec.op
    P, V = spec.lanes, spec.vec
    G = 32 // P
    quads = spec.quads is not None
    load4 = spec.quads == "load4"
    flush_add4 = spec.flush4 == "add4"                    # one 16-byte reduction of a lane's four
    flush_read4 = spec.flush4 in ("cas4", "red4")          # the four words read at once first
    red_word = (_quads.red_max if op.atomic == "max" else _quads.red_min) if spec.flush4 == "red4" else None
    assert not quads or V == 4
    assert spec.flush4 is None or (quads and spec.mode == "atomic")
    FSTEP = 1 if quads else P                   # feature j of a lane: f0 + j * FSTEP
    S, U = spec.steps, spec.unroll
    CHUNK = P * V
    UV = U * V
    acc_vt = ValueType.of(spec.acc_dt)
    ACC = spec.acc_dt.type
    OUT = spec.out_dt.type
    combine = op.combine(acc_vt)
    across = acc_vt.shuffle("xor")
    ident = op.identity_for(acc_vt)
    zero = acc_vt.make(ident if ident is not None else 0)
    atomic = spec.mode == "atomic"
    csr = spec.source == "csr"
    fresh = spec.write == "fresh"
    gather = spec.gather
    check = spec.check
    update = bykey._updater(op, spec.out_dt, bykey._atomic_mode(op, spec.out_dt), True) if atomic else None
    update_from = bykey._updater(op, spec.out_dt, "cas_from" if red_word is None else "red_from", True,
                                 red_word) if flush_read4 else None
    record = bykey._record
    # the lanes of one group, as bits from the group's first lane on
    group_lanes = np.uint32(FULL_MASK if P == 32 else (1 << P) - 1)
    # atomic rows: windows of min(P, S) rows of each group's span (32 rows a warp, one key a
    # lane) whose equal keys that are not adjacent in one span (a power law's hot keys in any
    # order, or in several spans) are merged before their update
    peers = atomic and PEERS and spec.source == "keys" and not gather
    WIN = min(P, S) if peers else S
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
    if load4:
        tf = spec.transform.device(ValueType.of(spec.in_dt)) if spec.transform is not None else None
        load_quad = _codegen.build(
            "def load_quad(values, i, vs, at):\n"
            "    a, b, c, d = load4(values, i)\n"
            + "".join("    vs[at + %d] = ACC(%s)\n" % (j, ("tf(%s)" if tf else "%s") % "abcd"[j]) for j in range(4)),
            "load_quad", {"load4": _quads.load4, "tf": tf, "ACC": ACC})
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
    def next_segment(src, s, s_start, s_end, m, n, f0, F, out, ors, ofs, ooff, init):
        """Past CSR segment ``s`` (``fresh``: written ``init`` if empty): the next
        ``(s, s_start, s_end)``."""
        if fresh and s_start == s_end:
            for j in range(V):
                if f0 + j * FSTEP < F:
                    out[s * ors + (f0 + j * FSTEP) * ofs + ooff] = OUT(init)
        s += 1
        s_start = s_end
        if s < m:
            s_end = seg_end(src, s, n)
        return s, s_start, s_end

    @cuda.jit(device=True)
    def first_segment(src, m, n, r0, fl, my_bit):
        """The first segment whose end is ``>= r0`` (``m``: none), for each group's own
        ``r0``: a ``(P + 1)``-ary search, each of the group's lanes probing one point of
        its range per round (the warp loops until every group is done)."""
        lo = np.int64(0)
        hi = m
        while cuda.ballot_sync(FULL_MASK, lo < hi) != 0:
            width = hi - lo
            q = lo + (width * (fl + 1)) // (P + 1)          # lo <= q < hi where lo < hi
            hit = np.uint32(cuda.ballot_sync(FULL_MASK, lo < hi and seg_end(src, q, n) >= r0))
            hit = np.uint32(np.uint32(hit >> my_bit) & group_lanes)
            first = cuda.ffs(hit) - 1                       # -1: no probe reached r0
            at = cuda.shfl_sync(FULL_MASK, q, my_bit + max(first, 0))
            below = cuda.shfl_sync(FULL_MASK, q, my_bit + (P - 1 if first < 0 else max(first - 1, 0))) + 1
            if lo < hi:
                if first < 0:
                    lo = below
                else:
                    if first > 0:
                        lo = below
                    hi = at
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

    add_quad, read_words = _quads.add4, _quads.read4

    @cuda.jit(device=True)
    def flush_all(idv, vals, piece, f0, F, m, out, bits, ors, ofs, ooff, pv, init, has_init):
        """This lane's features of a run (``vals``: ``V`` accumulators), each as ``flush``
        does; 'add4': one 16-byte reduction of the four; 'cas4' and 'red4': their words in
        one read, then a compare-and-swap or an integer reduction for each that changes."""
        if flush_add4:
            if f0 < F and idv >= 0 and idv < m:
                add_quad(out, idv * ors + f0 + ooff, OUT(vals[0]), OUT(vals[1]), OUT(vals[2]), OUT(vals[3]))
        elif flush_read4:
            if f0 < F and idv >= 0 and idv < m:
                ix = idv * ors + f0 + ooff
                w0, w1, w2, w3 = read_words(bits, ix)
                update_from(out, bits, ix, OUT(vals[0]), w0)
                update_from(out, bits, ix + 1, OUT(vals[1]), w1)
                update_from(out, bits, ix + 2, OUT(vals[2]), w2)
                update_from(out, bits, ix + 3, OUT(vals[3]), w3)
        else:
            for j in range(V):
                flush(idv, vals[j], piece, f0 + j * FSTEP, F, m, out, bits, ors, ofs, ooff, pv, init, has_init)

    @cuda.jit(device=True)
    def load_row(values, row, f0, F, vrs, vfs, voff, vs, at):
        """This lane's ``V`` values of row ``row`` into ``vs[at:at + V]`` (``zero`` past ``F``)."""
        if load4:
            if f0 < F:
                load_quad(values, row * vrs + f0 + voff, vs, at)
            else:
                for j in range(V):
                    vs[at + j] = zero
        else:
            for j in range(V):
                v = zero
                f = f0 + j * FSTEP
                if f < F:
                    v = ACC(load_value(values, row * vrs + f * vfs + voff))
                vs[at + j] = v

    @cuda.jit(device=True)
    def piece_id(pk, piece, idv, fl):
        if piece >= 0 and cuda.blockIdx.y == 0 and fl == 0:
            pk[piece] = idv

    def rows(src, perm, values, vrs, vfs, voff, n, m, F, out, bits, ors, ofs, ooff, pk, pv, spans, last,
             status, epoch, init, has_init, gate, gate_on):
        if gated_off(gate, gate_on):
            return                                  # the other path of an adaptive call runs
        lane = cuda.laneid
        w = np.int64(cuda.blockIdx.x) * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
        if w * G >= spans:
            return
        fl = lane % P
        my_bit = np.uint32(lane - fl)               # the first lane of this lane's group
        f0 = np.int64(cuda.blockIdx.y) * CHUNK + fl * (V if quads else 1)
        span = w * G + lane // P
        # spans = ceil(n / S): a group past the last span has no rows (r0 = r1 = n), and
        # every group runs the same code (no branch on the lane before the collectives)
        r0 = min(span * S, n)
        r1 = min(r0 + S, n)
        ordered_last = (not atomic) and last
        s = np.int64(0)
        s_start = np.int64(0)
        s_end = np.int64(0)
        if csr:
            s = first_segment(src, m, n, r0, fl, my_bit)
            if s < m:
                s_start = seg_start(src, s, n)
                s_end = seg_end(src, s, n)
        carry_id = np.int64(-2)                     # no run open
        carry_start = np.int64(-1)
        carry_v = cuda.local.array(V, ACC)
        cur = cuda.local.array(V, ACC)
        got = cuda.local.array(V, ACC)
        for j in range(V):
            carry_v[j] = zero
        ids = cuda.local.array(U, np.int64)
        rowix = cuda.local.array(U, np.int64)
        vs = cuda.local.array(UV, ACC)
        for w0 in range(0, S, WIN):
            wb = r0 + w0
            kid = np.int64(-1)
            scattered = np.uint32(0)
            spread_lanes = np.uint32(0)
            mine = np.uint32(0)
            if peers:
                # a warp-wide exit: the window's collectives need every lane
                if cuda.ballot_sync(FULL_MASK, wb < r1) == 0:
                    break
                # the window's keys, one a lane (lane my_bit + t: row wb + t of its group's
                # span); scattered: rows of a key that repeats in the window but not next
                # to itself in one span (merged below, skipped by the runs)
                kr = wb + fl
                if fl < WIN and kr < r1:
                    k = np.int64(src[kr])
                    if k >= 0 and k < m:
                        kid = k
                    elif check and epoch > 0 and cuda.blockIdx.y == 0:
                        record(status, 0, epoch, kr)
                mine = find_peers(kid)
                low = np.uint32(mine >> np.uint32(cuda.ffs(mine) - 1))
                spread = kid >= 0 and cuda.popc(low) + cuda.clz(low) != 32      # not one block of lanes
                spread_lanes = np.uint32(cuda.ballot_sync(FULL_MASK, spread))
                scattered = np.uint32(spread_lanes >> my_bit)      # bit t: row wb + t of this span
            elif wb >= r1:
                break
            # the runs of this group's rows, one row a step: no collectives below (a group
            # leaves on its own), so no loop is duplicated per lane into diverged collectives
            for t0 in range(w0, w0 + WIN, U):
                rb0 = r0 + t0
                if rb0 >= r1:
                    break
                # ids (and gathered rows) of U steps
                for u in range(U):
                    q = rb0 + u
                    idv = np.int64(-1)
                    if q < r1 and not csr:
                        k = np.int64(src[q])
                        if k >= 0 and k < m:
                            idv = k
                        elif check and not peers and epoch > 0 and fl == 0 and cuda.blockIdx.y == 0:
                            record(status, 0, epoch, q)
                        if peers and (scattered >> np.uint32(t0 - w0 + u)) & np.uint32(1) != 0:
                            idv = np.int64(-1)
                        if gather:
                            q = np.int64(perm[q])
                    ids[u] = idv
                    if gather:
                        rowix[u] = q
                # values of U steps: issued before the ids arrive (a row of no id is read and
                # dropped), except gathered rows (their index is loaded with the id) and the
                # peers' scattered rows (known from the window)
                for u in range(U):
                    live = rb0 + u < r1
                    if gather:
                        live = live and ids[u] >= 0
                    if peers:
                        live = live and (scattered >> np.uint32(t0 - w0 + u)) & np.uint32(1) == 0
                    if live:
                        load_row(values, rowix[u] if gather else rb0 + u, f0, F, vrs, vfs, voff, vs, u * V)
                    else:
                        for j in range(V):
                            vs[u * V + j] = zero
                # runs: a row of a new id ends the carried run (flushed) and opens its own
                for u in range(U):
                    r = rb0 + u
                    if r < r1:
                        if csr:
                            # the row's segment: the group's walk over the offsets
                            while s < m and s_end <= r:
                                s, s_start, s_end = next_segment(src, s, s_start, s_end, m, n, f0, F, out, ors,
                                                                 ofs, ooff, init)
                            idv = s if s < m and s_start <= r else np.int64(-1)
                        else:
                            idv = ids[u]
                        if idv != carry_id:
                            if carry_id != -2:
                                piece = np.int64(-1)
                                if not atomic and not ordered_last and carry_start == r0:
                                    piece = 2 * span        # the span's first run: it may go on before r0
                                piece_id(pk, piece, carry_id, fl)
                                flush_all(carry_id, carry_v, piece, f0, F, m, out, bits, ors, ofs, ooff, pv, init,
                                          has_init)
                            carry_id = idv
                            carry_start = r
                            for j in range(V):
                                carry_v[j] = vs[u * V + j]
                        else:
                            for j in range(V):
                                carry_v[j] = combine(carry_v[j], vs[u * V + j])
            if peers:
                # each scattered key of the window: every group folds its own rows of the
                # key, the groups' folds are combined across the warp, and the group of the
                # key's first lane updates once
                lead = np.uint32(np.uint32(cuda.ballot_sync(FULL_MASK, cuda.ffs(mine) - 1 == lane)) & spread_lanes)
                while lead != 0:
                    t = cuda.ffs(lead) - 1
                    lead = np.uint32(lead & np.uint32(lead - np.uint32(1)))
                    members = np.uint32(cuda.shfl_sync(FULL_MASK, np.int64(mine), t))
                    idv = cuda.shfl_sync(FULL_MASK, kid, t)
                    own = np.uint32(np.uint32(members >> my_bit) & group_lanes)
                    for j in range(V):
                        cur[j] = zero
                    have = np.int32(0)
                    while own != 0:
                        r = wb + (cuda.ffs(own) - 1)
                        own = np.uint32(own & np.uint32(own - np.uint32(1)))
                        load_row(values, r, f0, F, vrs, vfs, voff, got, 0)
                        for j in range(V):
                            cur[j] = combine(cur[j], got[j]) if have != 0 else got[j]
                        have = np.int32(1)
                    d = P
                    while d < 32:           # the groups' folds, across the warp
                        theirs = cuda.shfl_xor_sync(FULL_MASK, have, d)
                        for j in range(V):
                            o = across(FULL_MASK, cur[j], d)
                            if theirs != 0:
                                cur[j] = combine(cur[j], o) if have != 0 else o
                        have = have | theirs
                        d *= 2
                    if t // P == lane // P:     # the leader's group updates (t varies: no unswitching)
                        flush_all(idv, cur, np.int64(-1), f0, F, m, out, bits, ors, ofs, ooff, pv, init, has_init)
        if not span < spans:                        # a group past the last span writes nothing
            return
        if csr and r1 >= n:
            # the last span: the empty segments at the end
            while s < m:
                s, s_start, s_end = next_segment(src, s, s_start, s_end, m, n, f0, F, out, ors, ofs, ooff, init)
        # the run open at the span's end
        if atomic or ordered_last:
            if carry_id != -2:
                flush_all(carry_id, carry_v, np.int64(-1), f0, F, m, out, bits, ors, ofs, ooff, pv, init, has_init)
        else:
            first_piece = 2 * span
            if carry_id == -2:                      # an empty span (no rows): two pieces of nothing
                carry_id = np.int64(-1)
                carry_start = r0
                for j in range(V):
                    carry_v[j] = zero
            if carry_start == r0:                   # the span is one run: its second piece is nothing
                piece_id(pk, first_piece, carry_id, fl)
                piece_id(pk, first_piece + 1, carry_id, fl)
                for j in range(V):
                    flush(carry_id, carry_v[j], first_piece, f0 + j * FSTEP, F, m, out, bits, ors, ofs, ooff, pv,
                          init, has_init)
                    flush(carry_id, zero, first_piece + 1, f0 + j * FSTEP, F, m, out, bits, ors, ofs, ooff, pv,
                          init, has_init)
            else:
                piece_id(pk, first_piece + 1, carry_id, fl)
                for j in range(V):
                    flush(carry_id, carry_v[j], first_piece + 1, f0 + j * FSTEP, F, m, out, bits, ors, ofs, ooff,
                          pv, init, has_init)

    # (WARPS * 32, MIN_BLOCKS): 64 registers, 32 warps an SM (ptxas would take up to 80 for
    # four features a lane, 24 warps; tools/rows_ptx.py shows registers and spills)
    rows.jit_options = {"launch_bounds": (WARPS * 32, MIN_BLOCKS)}
    return rows


@functools.lru_cache(maxsize=None)
def publish_kernel():
    """Kernel ``(flag, slot)``: ``slot[0] = flag[0]`` (one thread: the unsorted look's
    answer into a host-mapped hint slot, readback.HintSlot)."""

    def publish(flag, slot):
        slot[0] = flag[0]

    return publish


@functools.lru_cache(maxsize=None)
def unsorted_kernel():
    """Kernel ``(keys, n, flag)``: ``flag[0] = 1`` where some ``keys[i] > keys[i + 1]``
    (``flag`` is set to 0 before it)."""

    def unsorted(keys, n, flag):
        i = np.int64(cuda.grid(1))
        step = np.int64(cuda.gridsize(1))
        down = False
        while i + 1 < n:
            down = down or keys[i] > keys[i + 1]
            i += step
        if cuda.any_sync(FULL_MASK, down) and cuda.laneid == 0:
            flag[0] = 1                             # the same value from every warp that saw one

    return unsorted


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


def add_rows(b, spec, src, perm, values, n, m, F, out, bits, init, has_init, status, epoch, offset=0, gate=None):
    """Add the launches of a feature-row reduction to Program builder ``b``: ``values`` and
    ``out`` as :func:`flat` gives them (``bits``: the flat view the compare-and-swap loop
    swaps), level 0 and, ``ordered``, the piece levels (pieces from the workspace, from byte
    ``offset`` on). ``gate``: None, or ``(flag, value)``: every launch runs only where
    ``flag[0] == value`` on the GPU."""
    rows = span_rows(spec)
    groups = 32 // spec.lanes                  # spans a warp
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
        c1 = 2 * max(1, -(-c0 // LEVEL_ROWS))
        _, ws = _launch.workspace(b.device_id, b.stream, offset + pieces_of(c0) + pieces_of(c1))
        bufs = []
        for count in (c0, c1):
            bufs.append((ws.view(np.int64, (count,), offset), ws.view(acc, (count * F,), offset + _align(8 * count))))
            offset += pieces_of(count)
    pk, pv = bufs[0]
    flag, gate_on = _launch.gate_args(b, gate)
    grid = (-(-spans // (groups * warps)), chunks)
    b.launch(rows_kernel(spec), ("rows", spec), grid, 32 * warps,
             (src, perm, vflat, vrs, vfs, voff, n64, m64, F64, oflat, bits, ors, ofs, ooff, pk, pv,
              np.int64(spans), np.bool_(spans == 1), status, epoch, init, np.bool_(has_init), flag, gate_on))
    if spec.mode == "atomic":
        return
    # (the pieces: rows of F accumulators, 256-byte aligned; quads stay where they are float32)
    level_spec = spec._replace(source="keys", key_dt=np.dtype(np.int64), in_dt=acc, gather=False, check=False,
                               transform=None, steps=LEVEL_ROWS, quads=spec.quads if acc == np.float32 else None)
    assert LEVEL_ROWS % level_spec.unroll == 0
    level = 0
    while spans > 1:
        count = 2 * spans
        src_k, src_v = bufs[level % 2]
        spans = -(-count // LEVEL_ROWS)
        pk, pv = bufs[(level + 1) % 2]
        b.launch(rows_kernel(level_spec), ("rows", level_spec), (-(-spans // (groups * warps)), chunks), 32 * warps,
                 (src_k, src_k, src_v, F64, np.int64(1), np.int64(0), np.int64(count), m64, F64, oflat, bits,
                  ors, ofs, ooff, pk, pv, np.int64(spans), np.bool_(spans == 1), status, np.int64(0), init,
                  np.bool_(has_init), flag, gate_on))
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
        key = ("rows", op, algorithm, deterministic, check, sig(k), sig(v), sig(o), handle, transform, None)
        programs = _into_programs
        slot = _path_hints.get(key)         # an adaptive signature's: what its last look found
        if slot is not None and PATH_HINTS:
            seen = slot.read()              # (no wait: -1 until a look's answer has landed)
            if seen >= 0:
                key = key[:-1] + ("grouped" if seen else "atomic",)
    if check:
        programs.run(key, k, v, o, bykey._status(o.device_id, handle, True)[1])
    else:
        programs.run(key, k, v, o)


def _plan_into(key, k, v, o, *epoch):
    """The Program of a feature-row ``reduce_by_key_into`` signature."""
    from . import bykey, radix
    _, op, algorithm, deterministic, check, _, _, _, handle, transform, path = key
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
    # Keys in any order whose updates are costly (a compare-and-swap loop a feature, or a
    # table larger than L2, where every update is a read-modify-write of DRAM) take either
    # path, chosen on the GPU: grouped by key first where the keys are not sorted, atomic
    # runs where they are (a kernel looks; the other path's kernels return at once). The
    # signature's later calls launch only the path the last look chose (``path``, from the
    # hint the look publishes; PATH_HINTS), and the look again, for the call after.
    adaptive = (not ordered and op.identity_for(out_vt) is not None and n >= ADAPTIVE_MIN_ROWS
                and F >= ADAPTIVE_MIN_FEATURES
                and (mode == "cas" or m * F * o.dtype.itemsize > _launch.l2_bytes(device_id)
                     or 0 < ADAPTIVE_HW_FEATURES <= F))
    if n > 0 and F > 0:         # m == 0 too: every key is out of range (reported)
        oflat, vflat = flat(os_), flat(vs)
        bits = bykey._bits_view(oflat[0]) if mode == "cas" and o.dtype.kind == "f" else oflat[0]
        zero = out_vt.make(op.identity_for(out_vt) if op.identity_for(out_vt) is not None else 0)
        nt = 64 if SIMULATOR else 256
        gate = None
        if adaptive:
            flag = b.output(ks, 1, np.dtype(np.int32))
            _launch.fill(b, ValueType.of(np.dtype(np.int32)), flag, 1, 0)
            b.launch(unsorted_kernel(), ("rows-unsorted",), min(-(-n // nt), 1024), nt, (ks, np.int64(n), flag))
            # the look's answer, for the next call of this signature to launch one path only
            # (not planned during a CUDA graph's capture, where page-locked memory cannot be
            # allocated: that signature keeps the gated pair)
            hint_key = key[:-1] + (None,)
            slot = _path_hints.get(hint_key)
            if slot is None and PATH_HINTS and not _launch.capturing(handle):
                slot = _path_hints.put(hint_key, _readback.hint_slot(device_id))
            if slot is not None:
                b.launch(publish_kernel(), ("rows-publish",), 1, 1, (flag, slot.arr))
            if path is None:
                gate = (flag, 1)
            else:           # a hint chose: either path is right for any key order
                adaptive, ordered = False, path == "grouped"
        # (adaptive: the atomic rows go first, so that on sorted keys the GPU runs them while
        # Python still launches the grouping's kernels, which then return at once)
        if not ordered:
            quads, flush4 = quads_for("atomic", op, F, vflat, oflat, device_id)
            P, V, S, U = shape_for(F, peers=PEERS, quads=quads)
            spec = Spec(op, "keys", k.dtype, v.dtype, o.dtype, o.dtype, P, V, S, U, "atomic", "into", False,
                        bool(check), transform, quads, flush4)
            add_rows(b, spec, ks, ks, vflat, n, m, F, oflat, bits, zero, False, status, epoch,
                     gate=None if gate is None else (gate[0], 0))
        if ordered or adaptive:
            quads, _ = quads_for("ordered", op, F, vflat)
            P, V, S, U = shape_for(F, quads=quads)
            rows_at = radix.Positions(np.dtype(np.int32 if n < (1 << 31) else np.int64))
            # (adaptive: on sorted keys the grouping's kernels return at once too; its scans still run)
            sk, perm, end = radix.group(b, ks, rows_at, m, 0, radix.group_buffers(b, ks, rows_at, m), status=status,
                                        epoch=epoch, on_bad=bykey._record_out_of_range, gate=gate)
            spec = Spec(op, "keys", sk.dtype, v.dtype, o.dtype, o.dtype, P, V, S, U, "ordered", "into", True, False,
                        transform, quads)
            add_rows(b, spec, sk, perm, vflat, n, m, F, oflat, bits, zero, False, status, np.int64(0), end, gate)
    if check:
        where = (device_id, handle)
        b.guard(lambda: bykey._statuses.get(where) is st)
        if n > 0:
            b.after(lambda arrays, values: bykey._raise_errors(st, values[0], arrays[0], m, handle, device_id))
    return b.build(lambda got: None)


_into_programs = _programs.Programs(_plan_into, "cufold.reduce_by_key_into (rows)", 4096)
#: Adaptive signatures' hint slots (readback.HintSlot), by Program key (its path None).
_path_hints = _launch.BoundedCache(4096)


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
    oflat, vflat = flat(out), flat(vs)
    quads, _ = quads_for("ordered", op, F, vflat)
    P, V, S, U = shape_for(F, quads=quads)
    spec = Spec(op, "csr", off.dtype, vs.dtype, acc_vt.fields[0], out_vt.fields[0], P, V, S, U, "ordered", "fresh",
                False, False, transform, quads)
    add_rows(b, spec, off, off, vflat, n, m, F, oflat, oflat[0], init_value, has_init,
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
