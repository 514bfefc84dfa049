"""Tuple values by key: ``reduce_by_key_into`` with ``values`` and ``out`` tuples of arrays.

``out[f][key]`` is field ``f`` of ``op((out[0][key], out[1][key], ...), value)`` for every
pair, ``out`` a tuple of equally long 1-D arrays (one per field of the operator's value,
dtypes may differ: an int64 count beside float64 sums) and ``values`` a tuple of equally
long 1-D arrays as long as ``keys`` (one per field), or one array where the operator
lifts it (below). What ``out`` held is an operand: keys nothing reaches keep it.

Paths (``ALGORITHMS``; ``algorithm=None`` picks per operator as listed; each can be
forced with ``algorithm=`` to time it):

==============  ==========================================================================
``adaptive``    field-wise operators (``plus``, ``minimum``, ``maximum``, the bit
                operators: ``Op.fieldwise``) and ``minmax``: each row of 32 consecutive
                elements (one per lane) is reduced once for the whole tuple, then the
                updating lane does one atomic per field: the hardware atomic where the
                field's operator and dtype have one (``plus`` on all six 32/64-bit dtypes,
                min/max on integers), else the compare-and-swap loop of the one-field path
                (float min/max, NaN as ``np.minimum.at``). How a row is reduced is chosen
                in the kernel, per row: at most ``RUNS_MAX`` run heads (sorted or
                grouped keys) by a segmented scan of the tuple over the runs
                (``bykey.segmented_scan``), one update per run and row; otherwise by
                ``match_any`` peers as ``warp``, also where all 32 neighbours differ
                (unlike the one-field ``adaptive``: with one atomic per field, a power
                law's hot keys repeating out of order pay for the match). ``minmax``
                is field-wise here (``minimum`` on field 0, ``maximum`` on field 1): one
                packed 64-bit atomic cannot take the min of one half and the max of the
                other. Needs 32/64-bit out fields.
``warp``        the same updates, every row by seed 001's ``match_any`` peers and
                ``reduce_peers`` on the whole tuple (one update per key and row).
``atomic``      the same updates, one per element (no aggregation): the baseline.
``packed``      ``argmin``/``argmax`` whose value field is 32 bits (float32, int32,
                uint32 ``out[0]``) and whose position fits 32 bits (an int32/uint32
                position field, or positions lifted from one ``values`` array with
                ``n < 2**32 - 1``): each pair becomes one uint64 word, high word the
                value under an order-preserving map (float: sign-flipped bits; NaN
                above +inf for argmax, below -inf for argmin; -0.0 as +0.0), low word
                the position (``~position`` for argmax) so that one 64-bit
                ``atomicMax``/``atomicMin`` keeps the greatest value at its *first*
                position, NaN winning as in ``numpy.argmax``; argmin's word is
                complemented, so both take ``atomicMax`` and 0 means "nothing yet".
                The words gather in a per-key uint64 buffer. Positions lifted from one
                ``values`` array: the one-field kernel of ``cufold.device.bykey`` (its
                ``adaptive`` rows, two items a lane) takes the words as its values
                and a hardware max that reads the word first (``CUFOLD_PACKED_MODE``:
                ``hw_first``, or ``cas``); given positions: the tuple scatter's rows
                (``ROWS``), aggregated as ``adaptive`` does. A finishing pass decodes each reached
                key's word, folds it into ``out`` with the operator (``out``'s prior
                (value, position) is the earlier operand, so its ties win when its
                position is smaller) and resets the word to 0. Up to
                ``KEPT_WORDS_MAX`` keys the buffer is scratch kept zero between calls
                (two launches: scatter, finish); above, new memory of ``out``'s
                library filled with 0 first (three). Cost beyond ``warp``: one or two
                passes over ``len(out)`` words.
``two_pass``    ``welford`` with one ``values`` array (each value lifted to the state
                ``(1, x, 0)``; out = (count, mean, M2), floating point): counts and
                sums by key (``adaptive`` rows, hardware float64 atomic adds into a
                per-key float64 buffer), each key's mean, then the sum of squared
                deviations from it (``adaptive`` again), then Chan's merge of each reached key's
                ``(count, mean, M2)`` into ``out``. Five launches; exact enough where
                the sum-of-squares form cancels (values near 1e6 with spread 1).
``cas``         every other commutative operator whose value packs into 64 bits (a user
                ``Op`` on (float32, int32), say): ``out`` is packed into a per-key uint64
                buffer (new memory, ``8 x len(out)`` bytes), the rows aggregated as
                ``adaptive`` does (``ROWS``), then a compare-and-swap loop on the whole
                word (load, combine, CAS; no CAS when the operator leaves the value
                unchanged), then the words are unpacked into ``out`` (bit for bit where
                nothing changed). Three launches. Under contention a CAS loop retries; the
                row aggregation bounds the contenders to one per key and row.
``sorted``      every operator, keys **sorted** (non-decreasing; checked with
                ``check=True``, one more pass over the keys): per-key CSR offsets
                from the sorted keys (a binary search per key), then cufold's
                merge-path segmented reduction
                (``device.segmented``) over the ``len(out)`` key segments, each folded
                in input order, and one update of each reached key, ``out[k] =
                op(out[k], total)``: no atomics, the same bits every run,
                non-commutative operators fold in sequence. Lifted values are first
                gathered into per-field arrays.
``grouped``     ``sorted`` after the stable radix grouping (``device.radix``) of the
                pairs' *positions* by key, the fields then gathered in grouped order:
                keys in any order. What ``deterministic=True`` runs (floating point),
                what non-commutative operators run, and every tuple of more than 64
                bits that no path above takes (a user ``Op`` on (int64, int64),
                ``argmin``/``argmax`` of 64-bit fields, ``welford`` of tuple states):
                nothing is lost and nothing serialises on a hot key.
==============  ==========================================================================

``transform=fn``: ``fn`` takes the tuple of items (the ``values`` arrays zipped, generated
fields computed from the index; the item itself for one array) and returns the operator's
value, one field per ``out`` array (cast under NumPy's ``same_kind`` rule); it is fused into
the scatter kernels' loads (``adaptive``, ``warp``, ``atomic``, ``cas``), into the segments
kernel (``sorted``) or into the gather (``grouped``), and nothing is lifted. ``packed``
reads its words from stored fields: a transformed argmin/argmax takes ``cas`` (64-bit
values) or ``grouped``. Generated value fields without a transform load the same way.

Lifts (one ``values`` array, an ``out`` of more fields): ``argmin``/``argmax`` with an
``out`` pair take ``(values[i], i)`` (the position in ``values``, as ``cufold.argmax(x)``);
``welford`` with an ``out`` triple takes ``(1, values[i], 0)``.

dtypes: each value field is cast to its ``out`` field, which must hold it (NumPy's
``safe`` casting; a lifted position needs an integer field holding ``n - 1``). The
accumulation happens in ``out``'s dtypes. Bad keys, ``check=`` and ``stream=`` as in
``cufold.device.bykey`` (same status words, the same synchronisation).
"""

import collections
import functools
import os

import numpy as np
from numba import cuda

from .. import _codegen, warp
from ..ops import argmax, argmin, as_op, as_transform, maximum, minimum, minmax, plus, welford
from ..values import InputType, ValueType
from ..host import arrays as _arrays, dispatch as _dispatch, launch as _launch, programs as _programs
from . import bykey as _bk, radix, segmented as _seg

__all__ = ["ALGORITHMS", "reduce_into", "path_for"]

ALGORITHMS = ("adaptive", "warp", "atomic", "packed", "two_pass", "cas", "sorted", "grouped")
_dispatch.register("reduce_by_key_tuple", ALGORITHMS)
#: How the scatters of ``packed`` and ``two_pass`` treat a row (``CUFOLD_BYKEY_TUPLE_ROWS``).
ROWS = "adaptive"
SIMULATOR = _bk.SIMULATOR
FULL_MASK = _bk.FULL_MASK
#: threads and block cap of the per-key passes (fill, decode, offsets, gathers)
EACH_NT = 64 if SIMULATOR else 256
EACH_CAP = 4 if SIMULATOR else 1 << 14
U32_MAX = (1 << 32) - 1
#: The epoch of an unchecked call (0: kernels record nothing).
_UNCHECKED = np.int64(0)

Spec = collections.namedtuple("Spec", "algorithm lift key_dt val_dts in_vt out_vt ops reduce_op wide tile transform",
                              defaults=(None,))
Spec.__doc__ = """A tuple scatter kernel (``algorithm``: adaptive, warp or atomic rows).
``lift``: how an element becomes a value of ``out_vt`` (``none``, ``index``, ``count``,
``sqdev``, or ``("pack", largest, pos_kind, lifted)``: the packed word of ``in_vt = (value
dtype of out, position dtype)``); ``val_dts``: the dtypes of the ``values`` arrays; ``ops``:
the per-field atomic operators (None: a compare-and-swap loop on one packed word per key);
``reduce_op``: what the rows combine with; ``transform``: None or an ops.Transform of
``in_vt``'s items (lift ``none``: its result is the operator's value). Where ``in_vt`` is an
``InputType`` (generated fields) or there is a transform, items load through ``in_vt.load``."""


# --- loads ------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _encoders(val_dt, pos_kind, largest):
    """Device functions ``encode(x, p) -> uint64`` and ``decode(w) -> (x, p)`` of the packed
    argmax (``largest``) / argmin word: the better pair has the larger word, in both, so
    both take the atomic max, and 0, the word of "nothing yet", is below every pair (or
    equals one int32 pair at the very end of the range: unreached and that pair then fold
    the same way into ``out``'s prior value but for its position on a tie). ``val_dt``: float32, int32 or uint32; ``pos_kind``: 'i' (signed
    32-bit positions), 'u' (unsigned, and lifted positions < 2**32 - 1)."""
    env = {"U32": np.uint32, "U64": np.uint64, "F": val_dt.type, "I32": np.int32,
           "P": np.int64, "TOP": np.uint32(0x80000000), "ALL": np.uint32(0xFFFFFFFF)}
    enc = ["def encode(x, p):"]
    dec = ["def decode(w):", "    h = U32(w >> U64(32))", "    lo = U32(w & U64(0xFFFFFFFF))"]
    if val_dt.kind == "f":
        nan_word = "ALL" if largest else "U32(0)"
        enc += ["    if x != x:", "        h = %s" % nan_word, "    else:",
                "        b = U32(0) if x == 0 else x.view(U32)",        # -0.0 as +0.0
                "        h = U32(~b) if (b & TOP) != U32(0) else U32(b | TOP)"]
        dec += ["    if h == %s:" % nan_word, "        x = F(np.nan)", "    else:",
                "        b = U32(h & ~TOP) if (h & TOP) != U32(0) else U32(~h)",
                "        x = b.view(F)"]
    elif val_dt.kind == "i":
        enc.append("    h = U32(U32(x) ^ TOP)")
        dec.append("    x = F(I32(U32(h ^ TOP)))")
    else:
        enc.append("    h = U32(x)")
        dec.append("    x = F(h)")
    enc.append("    q = U32(U32(p) ^ TOP)" if pos_kind == "i" else "    q = U32(p)")
    if largest:
        enc.append("    q = U32(~q)")
        dec.append("    lo = U32(~lo)")
    dec.append("    p = P(I32(U32(lo ^ TOP)))" if pos_kind == "i" else "    p = P(lo)")
    # argmin's word is complemented: the smallest pair is the largest word, so both take
    # the atomic max and the word of "nothing yet" is 0 for both (kept-zero scratch)
    enc.append("    return U64(U64(h) << U64(32)) | U64(q)" if largest else
               "    return ~(U64(U64(h) << U64(32)) | U64(q))")
    if not largest:
        dec.insert(1, "    w = ~w")
    dec.append("    return x, p")
    return (_codegen.build("\n".join(enc) + "\n", "encode", env),
            _codegen.build("\n".join(dec) + "\n", "decode", env))


@functools.lru_cache(maxsize=None)
def _loader(spec):
    """Device function ``load(keys, values, n, m, i) -> (idx, value, ok, bad)`` (see
    ``bykey._loader``): ``value`` a tuple of ``spec.out_vt``, lifted as ``spec.lift`` says;
    0 where not ``ok``."""
    out_vt, in_vt = spec.out_vt, spec.in_vt
    ct = np.uint32 if spec.key_dt.itemsize <= 4 and not spec.wide else np.uint64
    env = {"IT": np.int64 if spec.wide else np.int32, "CT": ct, "F64": np.float64}
    env.update(out_vt._env())
    k = out_vt.arity
    zero = out_vt._pack(["T%d(0)" % f for f in range(k)])
    lift = spec.lift
    # streaming loads (evict first: ``bykey.LOAD_HINT``); the index's sign bit cleared, or
    # ``cuda.ldcs`` adds Numba's negative-index wraparound
    stream = spec.tile.hint == "cs"

    def get(array, dt):
        # ldcs on 32/64-bit words only (bool and narrow fields: plain loads)
        return "cuda.ldcs(%s, u)" % array if stream and dt.kind in "iuf" and dt.itemsize >= 4 else "%s[u]" % array
    body = []
    if lift == "none" and (spec.transform is not None or isinstance(in_vt, InputType)):
        # zipped (and generated) items, through the transform: the operator's value
        env["load_in"] = in_vt.load
        item = "load_in(values, u)"
        result_tuple = in_vt.is_tuple
        if spec.transform is not None:
            env["tf"] = spec.transform.device(in_vt)
            item = "tf(%s)" % item
            result_tuple = spec.transform.result_type(in_vt).is_tuple
        body = ["        t = %s" % item]
        value = out_vt._pack(["T%d(t[%d])" % (f, f) if result_tuple else "T%d(t)" % f for f in range(k)])
    elif lift == "none":
        value = out_vt._pack(["T%d(%s)" % (f, get("values[%d]" % f, spec.val_dts[f])) for f in range(k)])
    elif lift == "index":
        value = "(T0(%s), T1(i))" % get("values", spec.val_dts[0])
    elif lift == "count":
        value = "(T0(1), T1(%s))" % get("values", spec.val_dts[0])
    elif lift == "sqdev":
        body = ["        d = F64(%s) - values[1][np.uint64(k)] if ok else F64(0)" % get("values[0]", spec.val_dts[0])]
        value = "(T0(d * d),)"
    else:                         # ("pack", largest, pos_kind, lifted): one packed word
        _, largest, pos_kind, lifted = lift
        env["encode"] = _encoders(in_vt.fields[0], pos_kind, largest)[0]
        env["V"] = in_vt.fields[0].type
        value = "(encode(V(%s), i),)" % get("values", spec.val_dts[0]) if lifted else \
            "(encode(V(%s), %s),)" % (get("values[0]", spec.val_dts[0]), get("values[1]", spec.val_dts[1]))
    lines = ["def load(keys, values, n, m, i):",
             "    if i < n:",
             "        u = np.uint64(i) & np.uint64(0x7FFFFFFFFFFFFFFF)",
             "        k = %s" % get("keys", spec.key_dt),
             "        ok = CT(k) < CT(m)"] + body + [
             "        return (IT(k) if ok else IT(-1)), %s, ok, not ok" % value,
             "    return IT(-1), %s, False, False" % zero]
    return _codegen.build("\n".join(lines) + "\n", "load", env)


@functools.lru_cache(maxsize=None)
def _field_updater(ops, out_vt, wide):
    """Device function ``update(outs, bits, idx, v)``: field ``f`` of ``v`` into
    ``outs[f][idx]`` with ``ops[f]``'s atomic (``bykey._updater``: hardware or a CAS loop on
    ``bits[f]``, the field's integer view)."""
    env, lines = {}, ["def update(outs, bits, idx, v):"]
    for f, (fop, dt) in enumerate(zip(ops, out_vt.fields)):
        env["u%d" % f] = _bk._updater(fop, dt, _bk._atomic_mode(fop, dt), wide)
        lines.append("    u%d(outs[%d], bits[%d], idx, v[%d])" % (f, f, f, f))
    return _codegen.build("\n".join(lines) + "\n", "update", env)


@cuda.jit(device=True)
def _word_max(outs, bits, idx, v):
    """``update(outs, bits, idx, v)`` of ``packed``: the atomic max of word ``v[0]`` into
    ``outs[0][idx]``, only where it beats the word read first. The words only grow, so a
    stale read just leaves the decision to the atomic, and most elements of a key seen
    many times (a power law's hot keys) skip it: the one-field float max by key, whose
    compare-and-swap loop reads first, runs 4x faster than unconditional 64-bit atomics
    on shuffled keys (H100)."""
    if v[0] > outs[0][idx]:
        cuda.atomic.max(outs[0], idx, v[0])


def cas_fits(vt):
    """Whether a value of ``vt`` packs into one 64-bit word (fields of at most 8 bytes in
    all; no float16, whose bits Numba cannot view)."""
    return vt.itemsize <= 8 and all(f != np.dtype(np.float16) for f in vt.fields)


@functools.lru_cache(maxsize=None)
def _word_codec(vt):
    """Device functions ``pack(value) -> uint64`` and ``unpack(word) -> value`` of a tuple type
    that ``cas_fits``: field ``f``'s bits at bit ``8 x`` (the bytes of the fields before it)."""
    env = vt._env()
    env.update({"U64": np.uint64})
    pack, unpack, shift = ["def pack(v):", "    w = U64(0)"], ["def unpack(w):"], 0
    for f, dt in enumerate(vt.fields):
        env["W%d" % f] = np.dtype("u%d" % dt.itemsize).type
        field = vt._field("v", f)
        if dt.kind == "b":
            bits = "(U64(1) if %s else U64(0))" % field
            back = "(w >> U64(%d)) & U64(1) != U64(0)" % shift
        elif dt.kind == "f":
            bits = "U64(%s.view(W%d))" % (field, f)
            back = "W%d(w >> U64(%d)).view(T%d)" % (f, shift, f)
        else:
            bits = "U64(W%d(%s))" % (f, field)
            back = "T%d(W%d(w >> U64(%d)))" % (f, f, shift)
        pack.append("    w |= %s << U64(%d)" % (bits, shift))
        unpack.append("    f%d = %s" % (f, back))
        shift += 8 * dt.itemsize
    pack.append("    return w")
    unpack.append("    return %s" % vt._pack(["f%d" % f for f in range(vt.arity)]))
    return (_codegen.build("\n".join(pack) + "\n", "pack", env),
            _codegen.build("\n".join(unpack) + "\n", "unpack", env))


@functools.lru_cache(maxsize=None)
def _cas_updater(op, vt, wide):
    """Device function ``update(outs, bits, idx, v)``: ``outs[0]`` (uint64 words holding
    values of ``vt``, ``_word_codec``) at ``idx`` becomes ``op(word's value, v)`` by a
    compare-and-swap loop on the whole word; no CAS where the operator leaves it unchanged."""
    pack, unpack = _word_codec(vt)
    env = {"pack": pack, "unpack": unpack, "combine": op.combine(vt)}
    src = ("def update(outs, bits, idx, v):\n"
           "    words = outs[0]\n"
           "    u = %s\n"
           "    old = words[u]\n"
           "    while True:\n"
           "        new = pack(combine(unpack(old), v))\n"
           "        if new == old:\n"
           "            break\n"
           "        seen = cuda.atomic.cas(words, u, old, new)\n"
           "        if seen == old:\n"
           "            break\n"
           "        old = seen\n") % _bk._index_expr(wide)
    return _codegen.build(src, "update", env)


@functools.lru_cache(maxsize=None)
def cas_words_kernel(vt, to_words):
    """Kernel ``(outs, words, m)``: ``words[k] = pack(outs[k])`` (``to_words``), or back."""
    pack, unpack = _word_codec(vt)
    load, store = vt.load, vt.store

    def convert(outs, words, m):
        k = np.int64(cuda.grid(1))
        while k < m:
            u = np.uint64(k)
            if to_words:
                words[u] = pack(load(outs, k))
            else:
                store(outs, k, unpack(words[u]))
            k += cuda.gridsize(1)

    return convert


# --- the scatter kernel (warp, atomic; the passes of packed and two_pass) ---------------------

@functools.lru_cache(maxsize=None)
def scatter_kernel(spec):
    """Kernel ``(keys, values, outs, bits, n, m, status, epoch)``: each warp takes spans of
    ``32 x VT`` consecutive elements (rows of 32, coalesced), one tile of ``NT x VT`` per
    block (a block-stride loop beyond ``bykey.GRID_CAP``). ``warp``: each row's lanes of one
    key are ``match_any`` peers, reduced with ``spec.reduce_op`` on the whole tuple, and the
    group's first lane updates every field (a row of distinct keys updates at once);
    ``adaptive``: a row of at most ``runs_max`` run heads by a segmented scan over its runs
    (the run's last lane updates), distinct rows at once, the others as ``warp`` (every
    branch warp-uniform); ``atomic``: one update per element."""
    nt, vt = spec.tile.nt, spec.tile.vt
    tile, span = nt * vt, 32 * vt
    load = _loader(spec)
    if spec.ops is None:         # one packed word per key (``cas``)
        update = _cas_updater(spec.reduce_op, spec.out_vt, spec.wide)
    elif spec.lift.__class__ is tuple:       # ``packed``: one word per key, max or min
        update = _word_max
    else:
        update = _field_updater(spec.ops, spec.out_vt, spec.wide)
    record = _bk._record
    if spec.algorithm in ("warp", "adaptive"):
        find_peers = warp.peers(np.int64 if spec.wide else np.int32)
        group_total = warp.reduce_peers(spec.reduce_op, spec.out_vt)

        @cuda.jit(device=True)
        def by_peers(outs, bits, idx, v, ok):
            p = find_peers(idx)
            lane = cuda.laneid
            if cuda.all_sync(FULL_MASK, p == (1 << lane)):
                if ok:
                    update(outs, bits, idx, v)
            else:
                s = group_total(p, v)
                if ok and cuda.ffs(p) - 1 == lane:
                    update(outs, bits, idx, s)

    if spec.algorithm == "warp":
        slot = by_peers
    elif spec.algorithm == "adaptive":
        it = np.int64 if spec.wide else np.int32
        scan = _bk.segmented_scan(spec.reduce_op, spec.out_vt)
        runs_max = spec.tile.runs_max
        top = np.uint32(0x80000000)

        @cuda.jit(device=True)
        def slot(outs, bits, idx, v, ok):
            lane = np.uint32(cuda.laneid)
            left = cuda.shfl_up_sync(FULL_MASK, it(idx), 1)
            heads = np.uint32(np.uint32(cuda.ballot_sync(FULL_MASK, idx != left)) | np.uint32(1))
            # A row whose neighbours all differ still goes by peers: with several fields an
            # update costs one atomic per field, and keys that repeat out of order (a
            # power law's hot keys) then merge first (shuffled count + 3 sums, H100:
            # 314 us by peers, 510 us updating such rows at once).
            if cuda.popc(heads) <= runs_max:                 # runs: one update per run
                s = scan(v, heads)
                tail = (np.uint32(np.uint32(heads >> np.uint32(1)) | top) >> lane) & np.uint32(1) != 0
                if tail and ok:
                    update(outs, bits, idx, s)
            else:                                            # repeats out of order: peers
                by_peers(outs, bits, idx, v, ok)
    else:
        @cuda.jit(device=True)
        def slot(outs, bits, idx, v, ok):
            if ok:
                update(outs, bits, idx, v)

    # one warp's span: every row's loads issued before the first row's collectives and
    # atomics (which may alias them, so the compiler would not hoist the loads itself)
    lines = ["def body(keys, values, outs, bits, n, m, status, epoch, first):"]
    lines += _bk._span_loads([("%d" % j, 32 * j) for j in range(vt)])
    lines += ["    slot(outs, bits, k%d, v%d, ok%d)" % (j, j, j) for j in range(vt)]
    body = _codegen.build("\n".join(lines) + "\n", "body", {"load": load, "record": record, "slot": slot})

    def scatter(keys, values, outs, bits, n, m, status, epoch):
        tiles = (n + (tile - 1)) // tile
        offset = (cuda.threadIdx.x // 32) * span + cuda.laneid
        t = np.int64(cuda.blockIdx.x)
        while t < tiles:
            body(keys, values, outs, bits, n, m, status, epoch, t * tile + offset)
            t += cuda.gridDim.x

    return scatter


# --- per-key passes ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def packed_finish_kernel(op, out_vt, pos_kind):
    """Kernel ``(words, outs, m)``: each key's packed word decoded and folded into ``outs``
    (``op(out, decoded)``) where a pair reached it (not 0), and reset to 0, so the words
    are zero again for the next call (``_packed_words``)."""
    decode = _encoders(out_vt.fields[0], pos_kind, op is argmax)[1]
    combine, load, store, cast = op.combine(out_vt), out_vt.load, out_vt.store, out_vt.cast

    def finish(words, outs, m):
        k = np.int64(cuda.grid(1))
        while k < m:
            w = words[np.uint64(k)]
            if w != np.uint64(0):
                store(outs, k, combine(load(outs, k), cast(decode(w))))
                words[np.uint64(k)] = np.uint64(0)
            k += cuda.gridsize(1)

    return finish


def welford_mean_kernel(count_sum, sq, m):
    """Kernel: ``count_sum = (counts, sums)``: sums become each key's mean; ``sq[k] = 0``."""
    k = np.int64(cuda.grid(1))
    while k < m:
        u = np.uint64(k)
        c = count_sum[0][u]
        if c > 0:
            count_sum[1][u] = count_sum[1][u] / c
        sq[0][u] = 0.0
        k += cuda.gridsize(1)


@functools.lru_cache(maxsize=None)
def welford_finish_kernel(out_vt):
    """Kernel ``(count_mean, sq, outs, m)``: each reached key's (count, mean, M2) merged
    into ``outs`` by Chan's rule (``welford``)."""
    combine = welford.combine(ValueType.of((np.float64,) * 3))
    load, store, cast = out_vt.load, out_vt.store, out_vt.cast

    def finish(count_mean, sq, outs, m):
        k = np.int64(cuda.grid(1))
        while k < m:
            u = np.uint64(k)
            c = count_mean[0][u]
            if c > 0:
                a = load(outs, k)
                prior = (np.float64(a[0]), np.float64(a[1]), np.float64(a[2]))
                store(outs, k, cast(combine(prior, (c, count_mean[1][u], sq[0][u]))))
            k += cuda.gridsize(1)

    return finish


@functools.lru_cache(maxsize=None)
def _key_at(key_dt):
    """Device function ``key_at(keys, m, i) -> (key, bad)``: ``keys[i]`` as int64, a key
    outside ``[0, m)`` as -1 when negative, else as ``m`` (so sorted keys stay sorted)."""
    signed = key_dt.kind == "i"
    K = key_dt.type

    @cuda.jit(device=True)
    def key_at(keys, m, i):
        k = keys[np.uint64(i)]
        if np.uint64(k) < np.uint64(m):
            return np.int64(k), False
        if signed and k < K(0):
            return np.int64(-1), True
        return np.int64(m), True

    return key_at


@functools.lru_cache(maxsize=None)
def offsets_kernel(key_dt):
    """Kernel ``(keys, n, m, offsets)``: for keys in non-decreasing order (``_key_at``'s),
    ``offsets[k]`` = the first position holding a key ``>= k``, ``k`` in ``[0, m]``: a
    binary search per key (``log2 n`` loads; no thread walks a gap of unreached keys)."""
    key_at = _key_at(key_dt)

    def offsets(keys, n, m, out):
        k = np.int64(cuda.grid(1))
        while k <= m:
            lo, hi = np.int64(0), n
            while lo < hi:
                mid = (lo + hi) >> 1
                if key_at(keys, m, mid)[0] < k:
                    lo = mid + 1
                else:
                    hi = mid
            out[np.uint64(k)] = lo
            k += cuda.gridsize(1)

    return offsets


@functools.lru_cache(maxsize=None)
def order_kernel(key_dt):
    """Kernel ``(keys, n, m, status, epoch)`` of a checked ``sorted`` call: records each key
    outside ``[0, m)`` (status slot 0) and each position where the keys decrease (slot 1)."""
    key_at = _key_at(key_dt)

    def order(keys, n, m, status, epoch):
        i = np.int64(cuda.grid(1))
        while i < n:
            cur, bad = key_at(keys, m, i)
            if bad:
                _bk._record(status, 0, epoch, i)
            if i > 0 and cur < key_at(keys, m, i - 1)[0]:
                _bk._record(status, 1, epoch, i)
            i += cuda.gridsize(1)

    return order


@functools.lru_cache(maxsize=None)
def gather_kernel(lift, in_vt, acc_vt, by_position, transform=None):
    """Kernel ``(values, positions, n, gathered)``: ``gathered[j]`` = element ``p`` lifted
    to ``acc_vt`` (``p = positions[j]`` when ``by_position``, else ``j``); with a
    ``transform`` (lift ``none``), its result for the (zipped, generated) items."""
    env = acc_vt._env()
    k = acc_vt.arity
    item = "values"
    if transform is not None or (lift == "none" and isinstance(in_vt, InputType)):
        env["load_in"] = in_vt.load
        item = "load_in(values, p)"
        result_tuple = in_vt.is_tuple
        if transform is not None:
            env["tf"] = transform.device(in_vt)
            item = "tf(%s)" % item
            result_tuple = transform.result_type(in_vt).is_tuple
        value = acc_vt._pack(["T%d(t[%d])" % (f, f) if result_tuple else "T%d(t)" % f for f in range(k)])
    elif lift == "index":
        value = "(T0(values[p]), T1(p))"
    elif lift == "welford":
        value = "(T0(1), T1(values[p]), T2(0))"
    else:
        value = acc_vt._pack(["T%d(values[%d][p])" % (f, f) for f in range(k)])
    src = ("def get(values, positions, j):\n"
           "    p = np.uint64(positions[j]) if BY else np.uint64(j)\n"
           "    t = %s\n"
           "    return %s\n" % (item, value))
    env["BY"] = by_position
    get = _codegen.build(src, "get", env)
    store = acc_vt.store

    def gather(values, positions, n, gathered):
        j = np.int64(cuda.grid(1))
        while j < n:
            store(gathered, j, get(values, positions, np.uint64(j)))
            j += cuda.gridsize(1)

    return gather


@functools.lru_cache(maxsize=None)
def sorted_finish_kernel(op, out_vt):
    """Kernel ``(offsets, totals, outs, m)``: ``outs[k] = op(outs[k], totals[k])`` for each
    key whose segment is not empty (one writer per key: no atomics)."""
    combine, load, store = op.combine(out_vt), out_vt.load, out_vt.store

    def finish(offsets, totals, outs, m):
        k = np.int64(cuda.grid(1))
        while k < m:
            u = np.uint64(k)
            if offsets[u + np.uint64(1)] > offsets[u]:
                store(outs, k, combine(load(outs, k), load(totals, k)))
            k += cuda.gridsize(1)

    return finish


# --- choosing ---------------------------------------------------------------------------------

def _each_grid(count):
    return max(1, min(-(-count // EACH_NT), EACH_CAP))


def _field_ops(op, out_vt):
    """The per-field atomic operators of a field-wise path, or None."""
    if op is minmax and out_vt.arity == 2:
        return (minimum, maximum)
    if op.fieldwise:
        return (op,) * out_vt.arity
    return None


def _packable(op, in_vt, out_vt, lift, n, fused=False):
    """The position kind ('i', 'u') of a packed argmin/argmax, or None."""
    if op not in (argmin, argmax) or out_vt.arity != 2 or fused:
        return None
    if out_vt.fields[0] not in (np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.uint32)):
        return None
    if out_vt.fields[1].kind not in "iu":
        return None
    if lift == "index":
        return "u" if n < U32_MAX else None
    pos = in_vt.fields[1]
    if pos.kind in "iu" and pos.itemsize <= 4 and in_vt.fields[0].itemsize <= 4:
        return "i" if pos.kind == "i" else "u"
    return None


def path_for(op, in_vt, out_vt, lift, n, algorithm, deterministic, fused=False):
    """The path (one of ``ALGORITHMS``) of a call, after checking ``algorithm``; ``fused``:
    items come through a transform or from generated inputs (not ``packed``, whose words
    are read from the stored fields)."""
    field_ops = _field_ops(op, out_vt)
    atomic_fields = all(f in _bk.OUT_DTYPES for f in out_vt.fields)
    floats = any(f.kind == "f" for f in out_vt.fields)
    exact = field_ops is not None and not floats and all(
        _bk._atomic_mode(o, f) == "hw" for o, f in zip(field_ops, out_vt.fields))
    ordered = bool(deterministic) and not exact
    if algorithm is None:
        if ordered or not op.commutative:
            return "grouped"
        if field_ops is not None and atomic_fields:
            return "adaptive"
        if _packable(op, in_vt, out_vt, lift, n, fused):
            return "packed"
        if op is welford and lift == "welford":
            return "two_pass"
        if cas_fits(out_vt) and lift == "none":
            return "cas"
        return "grouped"
    if algorithm not in ALGORITHMS:
        raise ValueError("cufold: algorithm %r does not take tuple values; for tuples choose from %s "
                         "(cufold.device.bykey_tuple)" % (algorithm, ", ".join(ALGORITHMS)))
    if algorithm in ("sorted", "grouped"):
        return algorithm
    if ordered:
        raise ValueError("cufold: algorithm %r updates out in a varying order, so %s results are not "
                         "reproducible bit for bit; deterministic=True needs algorithm='sorted' (or None)"
                         % (algorithm, out_vt))
    if not op.commutative:
        raise ValueError("cufold: algorithm %r combines values in a varying order and needs a commutative "
                         "operator; %s is not declared commutative" % (algorithm, op.name))
    fieldwise = field_ops is not None and atomic_fields
    ok = {"adaptive": fieldwise, "warp": fieldwise, "atomic": fieldwise,
          "packed": _packable(op, in_vt, out_vt, lift, n, fused) is not None,
          "two_pass": op is welford and lift == "welford", "cas": cas_fits(out_vt) and lift == "none"}[algorithm]
    if not ok:
        raise ValueError(
            "cufold: algorithm %r cannot reduce %s values into out of %s with %s (adaptive/warp/atomic: field-wise "
            "operators and minmax on 32/64-bit fields; packed: argmin/argmax of a 32-bit value and position; "
            "two_pass: welford of one values array; cas: tuple values of at most 64 bits); use None"
            % (algorithm, in_vt, out_vt, op.name))
    return algorithm


# --- host side --------------------------------------------------------------------------------

def _lift_of(op, n_values, out_arity):
    """How one ``values`` array becomes the operator's value (None: it does not)."""
    if n_values != 1 or out_arity == 1:
        return "none"
    if op in (argmin, argmax) and out_arity == 2:
        return "index"
    if op is welford and out_arity == 3:
        return "welford"
    return None


def _sources(vals):
    return tuple(getattr(v, "source", "array") for v in vals)


def _check_transformed(op, transform, vals, outs):
    """The value types (given, out) of a call with ``transform``: it takes the tuple of
    items (zipped ``values``; one item for one array) and returns the operator's value, of
    ``out``'s arity; each result field is cast to its ``out`` field (NumPy's
    ``same_kind``, as single values' are)."""
    out_vt = ValueType.of(tuple(o.dtype for o in outs))
    in_vt = InputType.of(tuple(v.dtype for v in vals) if len(vals) > 1 else vals[0].dtype, _sources(vals))
    item = transform.result_type(in_vt)
    if item.arity != out_vt.arity:
        raise TypeError("cufold: transform %s returns %s (%d field(s)) but out has %d field(s): with transform=, "
                        "%s reduces what it returns, one field per out array"
                        % (transform.name, item, item.arity, out_vt.arity, op.name))
    for f, (src, dst) in enumerate(zip(item.fields, out_vt.fields)):
        if src.kind not in "biuf" or not np.can_cast(src, dst, casting="same_kind"):
            raise TypeError("cufold: out[%d] of dtype %s cannot take field %d of what transform %s returns (%s; "
                            "NumPy's same_kind casting)" % (f, dst, f, transform.name, src))
    op.check(out_vt)
    return in_vt, out_vt


def _check_fields(op, lift, vals, outs, n):
    """The value types (given, out) after the arity and dtype checks."""
    out_vt = ValueType.of(tuple(o.dtype for o in outs))
    if lift == "none" and len(vals) == len(outs) and any(s != "array" for s in _sources(vals)):
        in_vt = InputType.of(tuple(v.dtype for v in vals) if len(vals) > 1 else vals[0].dtype, _sources(vals))
        for f, (src, dst) in enumerate(zip(in_vt.fields, out_vt.fields)):
            if src.kind not in "biuf" or not np.can_cast(src, dst, casting="safe"):
                raise TypeError("cufold: out[%d] of dtype %s cannot hold values of dtype %s (NumPy's safe "
                                "casting); give out[%d] a wider dtype" % (f, dst, src, f))
        op.check(out_vt)
        return in_vt, out_vt
    if any(s != "array" for s in _sources(vals)):
        raise ValueError("cufold: generated values (counting, constant) reduce by key as fields of the "
                         "operator's value (one values array per out field) or through transform=, not "
                         "lifted by %s" % op.name)
    if lift is None or (lift == "none" and len(vals) != len(outs)):
        raise ValueError(
            "cufold: out has %d field(s) but values has %d: %s reduces values of the arity of out (one array "
            "per field; one values array lifts only for argmin/argmax into an out pair and welford into an "
            "out triple)" % (len(outs), len(vals), op.name))
    if lift == "none":
        in_vt = ValueType.of(tuple(v.dtype for v in vals))
        pairs = list(zip(in_vt.fields, out_vt.fields))
    elif lift == "index":
        in_vt = ValueType.of((vals[0].dtype, np.int64))
        pairs = [(vals[0].dtype, out_vt.fields[0])]
        pos = out_vt.fields[1]
        if pos.kind not in "iu" or (n > 0 and np.iinfo(pos).max < n - 1):
            raise TypeError("cufold: out[1] (the positions) of dtype %s cannot hold the position %d of "
                            "values; use an int64 array" % (pos, n - 1))
    else:
        in_vt = ValueType.of((vals[0].dtype,) * 3)
        pairs = [(vals[0].dtype, f) for f in out_vt.fields]
        if any(f.kind != "f" for f in out_vt.fields):
            raise TypeError("cufold: welford by key needs floating-point out fields (count, mean, M2); got %s"
                            % (out_vt,))
    for f, (src, dst) in enumerate(pairs):
        if src.kind not in "biuf" or not np.can_cast(src, dst, casting="safe"):
            raise TypeError("cufold: out[%d] of dtype %s cannot hold values of dtype %s (NumPy's safe casting); "
                            "give out[%d] a wider dtype" % (f, dst, src, f))
    op.check(out_vt)
    return in_vt, out_vt


def _plan_key(key, *arrays):
    """The Program of a tuple ``reduce_by_key_into`` signature ``key`` for ``arrays``: keys,
    the value fields, the out fields (then the call's epoch where checked)."""
    op, algorithm, deterministic, check, _, vsigs, osigs, handle, transform = key
    transform = as_transform(transform)
    k, vals, outs = arrays[0], arrays[1:1 + len(vsigs)], arrays[1 + len(vsigs):1 + len(vsigs) + len(osigs)]
    for a, name in [(k, "keys")] + [(v, "values") for v in vals] + [(o, "out") for o in outs]:
        _bk._check_1d(a, name)
    if k.size != vals[0].size:
        raise ValueError("cufold: keys and values must be equally long; got %d and %d" % (k.size, vals[0].size))
    if k.dtype.kind not in "iu":
        raise TypeError("cufold: keys must have an integer dtype (signed or unsigned, any width); got %s" % k.dtype)
    _arrays.same_device((k,) + tuple(v for v in vals if v.library != "generated") + outs,
                        "reduce_by_key_into's arrays")
    op = as_op(op)
    if transform is not None:       # the transform's result is the operator's value: no lift
        lift = "none"
        in_vt, out_vt = _check_transformed(op, transform, vals, outs)
    else:
        lift = _lift_of(op, len(vals), len(outs))
        in_vt, out_vt = _check_fields(op, lift, vals, outs, k.size)
    return _plan_program(op, lift, in_vt, out_vt, k, vals, outs, algorithm, bool(deterministic), bool(check),
                         handle, transform)


_programs_by_key = _programs.Programs(_plan_key, "cufold.reduce_by_key_into (tuple)", 4096)
_forget_one_field = _bk.plan.cache_clear


def _forget_plans():
    """``bykey.plan.cache_clear`` (tests and tools changing ``CUFOLD_BYKEY_*``) forgets
    these Programs too: their tiles come from ``bykey.tile_for``."""
    _forget_one_field()
    _programs_by_key.clear()


_bk.plan.cache_clear = _forget_plans


def reduce_into(keys, values, out, op, algorithm, deterministic, check, stream, transform=None):
    """``reduce_by_key_into`` of tuple values or a tuple ``out`` (see the module doc);
    ``transform``: a function of the tuple of items (zipped ``values``) returning the
    operator's value."""
    vals = _arrays.describe_many(values if values.__class__ in (tuple, list) else (values,), "values")
    outs = _arrays.describe_many(out if out.__class__ in (tuple, list) else (out,), "out")
    k = _arrays.describe(keys, "keys")
    handle = _arrays.stream_handle((k,) + vals + outs, stream)
    sig = _programs.signature
    key = (op, algorithm, deterministic, check, sig(k), tuple(map(sig, vals)), tuple(map(sig, outs)), handle,
           transform)
    if check:
        _programs_by_key.run(key, k, *vals, *outs, _bk._status(outs[0].device_id, handle, True)[1])
    else:
        _programs_by_key.run(key, k, *vals, *outs)
    return out


def _bits_of(out, field_op):
    """The array a field's update swaps words of: an integer view of a float field updated
    by a compare-and-swap loop, else the field itself."""
    if _bk._atomic_mode(field_op, out.dtype) == "cas" and out.dtype.kind == "f":
        return _bk._bits_view(out)
    return out


def _rows():
    """The rows of the scatters inside ``packed`` and ``two_pass``: ``ROWS``, or
    ``CUFOLD_BYKEY_TUPLE_ROWS`` (adaptive, warp, atomic; for measuring)."""
    rows = os.environ.get("CUFOLD_BYKEY_TUPLE_ROWS", ROWS)
    if rows not in ("adaptive", "warp", "atomic"):
        raise ValueError("cufold: bad CUFOLD_BYKEY_TUPLE_ROWS %r (adaptive, warp, atomic)" % rows)
    return rows


def _tile():
    """The scatter kernels' tile: ``warp``'s (``bykey.tile_for``, ``CUFOLD_BYKEY_TILE``), with
    ``adaptive``'s run-head limit (``CUFOLD_BYKEY_RUNS``)."""
    return _bk.tile_for("warp")._replace(runs_max=_bk.tile_for("adaptive").runs_max)


def _scatter(b, spec, keys, values, outs, bits, n, m, status, epoch):
    tile = spec.tile
    grid = max(1, min(-(-n // (tile.nt * tile.vt)), _bk.GRID_CAP))
    b.launch(scatter_kernel(spec), ("bykey-tuple", spec), grid, tile.nt,
             (keys, values, outs, bits, np.int64(n), np.int64(m), status, epoch))


def _plan_program(op, lift, in_vt, out_vt, keys, vals, outs, algorithm, deterministic, check, stream,
                  transform=None):
    n, m, device_id = keys.size, outs[0].size, keys.device_id
    fused = transform is not None or isinstance(in_vt, InputType)
    path = path_for(op, in_vt, out_vt, lift, n, algorithm, deterministic, fused)
    st = _bk._status(device_id, stream, False)[0] if check else None
    b = _programs.Builder(device_id, stream)
    ks = b.input(keys)
    vs = tuple(b.input(v) for v in vals)
    os_ = tuple(b.input(o) for o in outs)
    epoch = b.value(np.int64(0)) if check else _UNCHECKED
    status = st.kernel if check else _bk._quiet_status(device_id, stream)
    if n > 0:
        _paths[path](b, op, lift, in_vt, out_vt, ks, vs, os_, n, m, status, epoch, transform)
        if check:
            where = (device_id, stream)
            b.guard(lambda: _bk._statuses.get(where) is st)
            b.after(lambda arrays, values: _bk._raise_errors(
                st, values[0], arrays[0], m, stream, device_id,
                "algorithm='sorted' on tuple values" if path == "sorted" else None))
    return b.build(lambda got: None)


def _warp_path(algorithm):
    def add(b, op, lift, in_vt, out_vt, keys, vals, outs, n, m, status, epoch, transform=None):
        ops = _field_ops(op, out_vt)
        wide = m > np.iinfo(np.int32).max
        spec = Spec(algorithm, "index" if lift == "index" else "none", keys.dtype, tuple(v.dtype for v in vals),
                    in_vt, out_vt, ops, op, wide, _tile(), transform)
        values = vals[0] if lift == "index" or not in_vt.is_tuple else vals
        _scatter(b, spec, keys, values, outs, tuple(_bits_of(o, f) for o, f in zip(outs, ops)), n, m, status, epoch)
    return add


#: Up to this many keys, ``packed`` keeps its words in scratch that every call leaves zero
#: (``launch.kept_zeros``, one buffer per stream and power-of-two size), which saves the
#: launch that fills them; more keys fill a call's own words first.
KEPT_WORDS_MAX = 1 << 22
#: The packed words' update (``_packed_mode``).
PACKED_MODE = "hw_first"


def _packed_words(b, keys, m):
    """The ``m`` zeroed words of a ``packed`` call (``b``'s Program)."""
    if m <= KEPT_WORDS_MAX:
        size = 1 << max(9, (m - 1).bit_length())
        return _launch.kept_zeros("bykey packed words", b.device_id, b.stream, 8 * size).view(np.uint64, (m,), 0)
    words = b.output(keys, (m,), np.uint64)
    _launch.fill(b, ValueType.of((np.uint64,)), (words,), m, (0,))
    return words


def _packed_mode():
    """How ``packed`` updates a word: ``hw_first`` (read it, then a hardware max where the
    item wins) or ``cas`` (read it, then a compare-and-swap loop): ``CUFOLD_PACKED_MODE``."""
    mode = os.environ.get("CUFOLD_PACKED_MODE", PACKED_MODE)
    if mode not in ("hw_first", "cas"):
        raise ValueError("cufold: bad CUFOLD_PACKED_MODE %r (hw_first, cas)" % mode)
    return mode


def _packed_path(b, op, lift, in_vt, out_vt, keys, vals, outs, n, m, status, epoch, transform=None):
    pos_kind = _packable(op, in_vt, out_vt, lift, n)
    words = _packed_words(b, keys, max(m, 1))
    src_vt = ValueType.of((out_vt.fields[0], np.dtype(np.uint32 if pos_kind == "u" else np.int32)))
    wide = m > np.iinfo(np.int32).max
    spec = Spec(_rows(), ("pack", op is argmax, pos_kind, lift == "index"), keys.dtype,
                tuple(v.dtype for v in vals), src_vt, ValueType.of((np.uint64,)), (maximum,), maximum, wide, _tile())
    if lift == "index":
        # positions are the items' own: the one-field max by key of the packed words, one
        # kernel for both (its adaptive rows hold two items a lane; the tuple scatter's
        # rows took 32 us of 2^22 sorted power-law keys on an H100, the one-field max's 24)
        one = _bk.Spec(spec.algorithm, maximum, keys.dtype, vals[0].dtype, np.dtype(np.uint64), wide, _packed_mode(),
                       _bk.tile_for(spec.algorithm), False, ("pack", op is argmax, pos_kind))
        tile = one.tile.nt * one.tile.vt * _bk.LANE_ITEMS.get(one.algorithm, 1)
        b.launch(_bk.scatter_kernel(one), ("bykey", one), max(1, min(-(-n // tile), _bk.GRID_CAP)), one.tile.nt,
                 (keys, vals[0], words, words, np.int64(n), np.int64(m), status, epoch))
    else:
        _scatter(b, spec, keys, vals, (words,), (words,), n, m, status, epoch)
    b.launch(packed_finish_kernel(op, out_vt, pos_kind), ("bykey-unpack", op, out_vt, pos_kind), _each_grid(m),
             EACH_NT, (words, outs, np.int64(m)))


def _cas_path(b, op, lift, in_vt, out_vt, keys, vals, outs, n, m, status, epoch, transform=None):
    words = b.output(keys, (max(m, 1),), np.uint64)
    b.launch(cas_words_kernel(out_vt, True), ("bykey-pack", out_vt, True), _each_grid(m), EACH_NT,
             (outs, words, np.int64(m)))
    wide = m > np.iinfo(np.int32).max
    spec = Spec(_rows(), "none", keys.dtype, tuple(v.dtype for v in vals), in_vt, out_vt, None, op, wide, _tile(),
                transform)
    _scatter(b, spec, keys, vals if in_vt.is_tuple else vals[0], (words,), (words,), n, m, status, epoch)
    b.launch(cas_words_kernel(out_vt, False), ("bykey-pack", out_vt, False), _each_grid(m), EACH_NT,
             (outs, words, np.int64(m)))


def _two_pass_path(b, op, lift, in_vt, out_vt, keys, vals, outs, n, m, status, epoch, transform=None):
    f64 = np.dtype(np.float64)
    cs_vt, sq_vt = ValueType.of((f64, f64)), ValueType.of((f64,))
    count_sum = (b.output(keys, (max(m, 1),), f64), b.output(keys, (max(m, 1),), f64))
    sq = (b.output(keys, (max(m, 1),), f64),)
    wide = m > np.iinfo(np.int32).max
    _launch.fill(b, cs_vt, count_sum, m, (0.0, 0.0))
    x = vals[0]
    spec = Spec(_rows(), "count", keys.dtype, (x.dtype,), ValueType.of(x.dtype), cs_vt, (plus, plus), plus, wide,
                _tile())
    _scatter(b, spec, keys, x, count_sum, count_sum, n, m, status, epoch)
    b.launch(welford_mean_kernel, ("bykey-mean",), _each_grid(m), EACH_NT, (count_sum, sq, np.int64(m)))
    spec = Spec(_rows(), "sqdev", keys.dtype, (x.dtype, f64), ValueType.of((x.dtype, f64)), sq_vt, (plus,), plus,
                wide, _tile())
    _scatter(b, spec, keys, (x, count_sum[1]), sq, sq, n, m, status, np.int64(0))   # bad keys: reported once
    b.launch(welford_finish_kernel(out_vt), ("bykey-welford", out_vt), _each_grid(m), EACH_NT,
             (count_sum, sq, outs, np.int64(m)))


def _sorted_path(grouped):
    def add(b, op, lift, in_vt, out_vt, keys, vals, outs, n, m, status, epoch, transform=None):
        like = keys
        values = vals[0] if lift in ("index", "welford") or not in_vt.is_tuple else vals
        positions = None
        if grouped:
            at = radix.Positions(np.dtype(np.uint32 if n < U32_MAX else np.uint64))
            keys, positions, _ = radix.group(b, keys, at, m, 0, radix.group_buffers(b, like, at, m),
                                             status=status, epoch=epoch, on_bad=_bk._record_out_of_range)
            epoch = np.int64(0)
        if not grouped and epoch is not _UNCHECKED:
            b.launch(order_kernel(keys.dtype), ("bykey-order", keys.dtype), _each_grid(n), EACH_NT,
                     (keys, np.int64(n), np.int64(m), status, epoch))
        off = b.output(like, (m + 1,), np.int64)
        b.launch(offsets_kernel(keys.dtype), ("bykey-offsets", keys.dtype), _each_grid(m + 1), EACH_NT,
                 (keys, np.int64(n), np.int64(m), off))
        if m == 0:
            return
        seg_in = in_vt if lift == "none" else out_vt
        seg_transform = transform       # sorted keys: the segments kernel fuses it into its loads
        if grouped or lift != "none":
            gathered = tuple(b.output(like, (n,), f) for f in out_vt.fields)
            src_vt = in_vt if lift == "none" else ValueType.of(vals[0].dtype)
            b.launch(gather_kernel(lift, src_vt, out_vt, grouped, transform),
                     ("bykey-gather", lift, src_vt, out_vt, grouped, transform),
                     _each_grid(n), EACH_NT, (values, positions if grouped else off, np.int64(n), gathered))
            values, seg_in, seg_transform = gathered, out_vt, None
        totals = tuple(b.output(like, (m,), f) for f in out_vt.fields)
        init_value, has_init = _seg._start_value(op, out_vt, None, "reduce_by_key_into", never_empty=True)
        spec = _seg.Spec(op, seg_in, out_vt, out_vt, _seg.tile_for(out_vt, n + m), seg_transform)
        _seg._run_segments(b, spec, values, off, n, m, totals, init_value, has_init)
        b.launch(sorted_finish_kernel(op, out_vt), ("bykey-sorted-finish", op, out_vt), _each_grid(m), EACH_NT,
                 (off, totals, outs, np.int64(m)))
    return add


_paths = {"adaptive": _warp_path("adaptive"), "warp": _warp_path("warp"), "atomic": _warp_path("atomic"),
          "packed": _packed_path, "two_pass": _two_pass_path, "cas": _cas_path, "sorted": _sorted_path(False),
          "grouped": _sorted_path(True)}
