"""Reductions by key into an array: ``out[key] = op(out[key], value)`` for every pair.

What ``torch.Tensor.index_add_``, ``torch.Tensor.scatter_reduce_`` and
``cupyx.scatter_add`` do, with any cufold operator, keys of any integer
width, and a choice of algorithms (``ALGORITHMS``; seed 001):

============  =========================================================================
name          how values meet their key's slot of ``out``
============  =========================================================================
``atomic``    one atomic per element (the baseline; what the peers do)
``warp``      seed 001's warp aggregation: each warp finds its lanes holding the same
              key (``cufold.warp.peers``: ``match_any_sync``), reduces every group of
              peers (``cufold.warp.reduce_peers``), and the group's first lane does one
              atomic: one atomic per key per 32 elements
``block``     the same, one level up: the group totals of all warps of a block go to a
              per-block shared-memory hash table (open addressing, CAS on the key
              slot, a shared-memory update of the value); the table is flushed with one
              global update per entry when it is half full and at the end. Each block
              owns a contiguous range of tiles. Needs an operator with an identity.
``sorted``    ordered: a segmented reduction over the runs of equal keys, folded
              in sequence order (a block-wide segmented scan per tile; the runs that
              cross tiles are reduced again, recursively, one level per factor ~1000),
              then **one** update per run. With grouped keys (every key one run, e.g.
              sorted keys) every key of ``out`` is updated exactly once, so
              floating-point results have the same bits every run, and non-commutative
              operators give the sequential fold. Keys that are not grouped still give
              a correct result (each run is one atomic update), only not bitwise
              reproducible.
``runs``      adjacent runs: a warp's span (``32 x VT`` consecutive elements, rows of
              32) is reduced run by run (a segmented shfl_up scan bounded by the run
              heads' ballot), and a run crossing rows is carried to the next row, so a
              run costs one atomic per span; a row whose 32 keys all differ from their
              left neighbours (random keys) does one atomic per element at once
``runs2``     ``runs`` with two consecutive elements per lane (rows of 64): each lane
              folds its pair first, so one segmented scan covers 64 elements and a
              row costs about the instructions of a ``runs`` row of 32 (seed 001's
              ordered keys at the read floor plus ~2 µs)
``adaptive``  ``runs2``, but a row with more than ``2 x RUNS_MAX`` of 64 run heads
              (keys that repeat, but not next to each other) groups by ``match_any``
              instead, each half of the row (32 consecutive elements) apart, as
              ``warp`` does; with hardware atomics a row of 64 heads too, where a half of
              distinct keys takes plain updates after one vote (the default)
``table``     ``runs``, but those rows fold every element into a per-block shared hash
              table (multiplicative hash, CAS-claimed key, shared atomic on the value;
              no match_any), flushed with one update per key after each tile: keys that
              repeat anywhere in the tile (2048 elements) meet there. Needs an identity.
============  =========================================================================

**The automatic choice is made inside the kernels, per row, with no host round
trip.** Every row asks which elements start a run (key unlike the element before;
lane 0 looks at the previous row's lane 31 through a rotating shuffle). All heads
(random keys): plain atomics, nothing else (a warp-uniform branch), except in
``adaptive``. Otherwise (``runs``, ``runs2``): runs. ``adaptive`` (the default) and
``table`` take runs for rows of at most ``RUNS_MAX`` (16) heads in 32 elements (sorted or
grouped keys); with more, the keys repeat out of order, or not at all: ``adaptive`` groups
the row's equal keys by ``match_any``, ``table`` merges what repeats within the tile.
Where its updates are hardware atomics (``plus``; integer ``minimum``/``maximum``; bitwise
operators), ``adaptive`` asks ``match_any`` of rows of all heads too, and those whose halves
hold distinct keys (one vote) take plain updates: shuffled keys of a power law (a graph's
in-degrees) repeat a few hot keys in most rows, never next to each other, and one hot key's
updates serialise in L2 (H200, 4M keys into 200k, ``tools/bykey_power_law.py``: 360 us
with plain updates, 209 now; uniform keys 51 us either way). Seed 001's box (10^7 values,
10^6 cells) issues, per call: ordered keys 1.06 M updates (one per run of
10, and the runs split at span ends), shifted keys 4.7 M with ``adaptive``, as with
``warp``'s rows of 32 (8.8 M by runs, 3.0 M by ``table``: the particles a cell receives
from its 8 neighbours meet within 2048 elements), random keys 10 M (nothing repeats within
reach; ``tools/tune_bykey.py`` models these counts). A host-side estimate would need a
synchronisation and would misjudge "shifted" (12% equal neighbours, yet 70% of its
updates could merge). The default
(``algorithm=None``) is ``AUTO`` (``adaptive``) for commutative operators, with an
identity or without (``AUTO_NO_IDENTITY``), and ``sorted`` for
non-commutative operators and for ``deterministic=True`` on floating point, after the
pairs are grouped by key with a stable radix sort (``cufold.device.radix``): each key is
then one run, folded in input order and written once, so the result has the same bits
every run whatever the key order (seed 001's box on an H200: 0.49-0.62 ms, 4-5x faster
than ``torch.index_add_`` under ``torch.use_deterministic_algorithms``, 5-13x the time
of the atomic paths). ``algorithm='sorted'`` skips the grouping: the caller says the keys are
grouped already (checked when ``deterministic=True``). Floors and predictions:
docs/performance.md, "Reduce by key".

Operators and dtypes. ``out`` must have a 32- or 64-bit dtype (int32, uint32, int64,
uint64, float32, float64). ``plus`` uses the hardware atomic add on all six,
``minimum``/``maximum`` the hardware atomic min/max on the integer ones and
``bit_and``/``bit_or``/``bit_xor`` theirs; an atomic whose result is unused compiles to a
fire-and-forget ``RED`` (checked in SASS). Every other case (``minimum``/``maximum``
on floats, ``multiplies``, ``logical_*``, your own ``cufold.Op``) runs a
compare-and-swap loop on the output word (a float's bits): load, combine, and
``cuda.atomic.cas``, retried when another thread changed the word in between; when
the operator leaves the word unchanged (a value below the current maximum) there is
no CAS at all. Without contention that is a load plus a CAS, about twice a hardware
atomic (Numba's own ``cuda.atomic.max`` on floats is such a loop too). Under
contention it degrades: with ``k`` threads on one word each success costs up to ``k``
attempts, so ``algorithm='atomic'`` on a single hot key is quadratic in the resident
threads; the aggregating algorithms bound the contenders (one per run, group or table
entry).

NaN: ``minimum``/``maximum`` propagate NaN as ``np.minimum.at``/``np.maximum.at``: a
NaN value makes ``out[key]`` NaN, and a NaN already in ``out`` stays. (Numba's
``cuda.atomic.max`` on floats ignores a NaN operand, hence the loop above.)

Keys outside ``[0, len(out))`` are never written. They are detected on the device
(one unsigned compare per element): with ``check=True`` (default) the call
synchronises the stream and raises ``IndexError`` naming the first bad position and
its key (the call's valid keys have been applied by then); a call with no bad key
pays the synchronisation and one read of a mapped (zero-copy) host word that the
kernels set only when they meet a bad key (``_Status``). With ``check=False`` there is
no synchronisation and bad keys are skipped silently (so a negative key can serve as
"drop this element").

Tuple values (``values`` and ``out`` tuples of arrays: a count beside sums, argmax
pairs, Welford triples, your own tuple operators) run in ``cufold.device.bykey_tuple``,
whose docstring says which path each operator takes (row-aggregated field-wise atomics,
a packed 64-bit atomic for argmin/argmax, two field-wise passes for Welford, a
compare-and-swap loop on a packed word for other tuples of at most 64 bits, a segmented
reduction over sorted or grouped keys for the rest and for ``deterministic=True``).

Host side: a call runs one Program per signature (``cufold.host.programs``: the
operator and options, the three arrays' layouts, the stream), planned on its first
call: the grouping's passes, the launches and, with ``check=True``, the synchronisation
and the flag's read after them. A later call describes its arrays and runs it; a
checked call passes its epoch (``_status``) as the Program's one per-call value.

Tuning: ``CUFOLD_BYKEY_TILE=NTxVT[xSLOTS]`` overrides threads per block, items per
thread and shared-table slots (a power of two), ``CUFOLD_BYKEY_RUNS`` the run-head
limit, ``CUFOLD_BYKEY_LOAD=cs|ca`` the inputs' cache hint (``GPU_TILES``, ``RUNS_MAX``,
``LOAD_HINT``). ``tools/tune_bykey.py`` times every variant on a GPU, or compiles them
for sm_90 without one.
"""

import collections
import contextlib
import functools
import os

import numpy as np
from numba import config, cuda

from .. import _codegen, block, warp
from ..ops import Op, as_op, as_transform, plus
from ..values import InputType, ValueType
from ..host import arrays as _arrays, dispatch as _dispatch, launch as _launch, programs as _programs
from ..host import readback as _readback
from . import radix

__all__ = ["reduce_by_key_into", "ALGORITHMS", "AUTO", "AUTO_NO_IDENTITY", "plan", "tile_for"]

ALGORITHMS = ("atomic", "warp", "block", "sorted", "runs", "runs2", "adaptive", "table")
_dispatch.register("reduce_by_key", ALGORITHMS)
#: What ``algorithm=None`` runs for commutative operators with an identity (see the module
#: doc). ``adaptive`` measured best overall on an H200 (tools/tune_bykey.py, 2026-11-22,
#: session 9: seed 001's ordered keys 2.38x cupyx.scatter_add, shifted 1.23x, random
#: 1.00x; ``runs2`` 2.49x, 1.15x, 0.99x; ``runs`` 2.09x, 1.08x, 0.99x; ``table`` 1.22x,
#: 0.77x, 0.99x; ``warp`` 0.95x, 1.33x, 0.99x).
AUTO = "adaptive"
#: ... and for commutative operators without one (``adaptive`` needs none).
AUTO_NO_IDENTITY = "adaptive"

SIMULATOR = bool(config.ENABLE_CUDASIM)
FULL_MASK = 0xFFFFFFFF
OUT_DTYPES = tuple(np.dtype(t) for t in (np.int32, np.uint32, np.int64, np.uint64, np.float32, np.float64))
_BITS = {4: np.dtype(np.int32), 8: np.dtype(np.int64)}
_HW_OPS = {"add": "iuf", "min": "iu", "max": "iu", "and_": "iu", "or_": "iu", "xor": "iu"}

# Bad keys are reported through two int64 words per (device, stream): [0] the first
# out-of-range position, [1] the first position where keys decrease (deterministic
# mode). Each holds (epoch << POS_BITS) | (POS_MASK - position), updated with an
# atomic max: the newest checked call wins, and in it the smallest position. Calls
# with check=False pass epoch 0 and record nothing, so nothing ever needs clearing.
POS_BITS = 40
POS_MASK = (1 << POS_BITS) - 1
EPOCH_LIMIT = (1 << (63 - POS_BITS)) - 1
MAX_PROBES_GPU = 8
MAX_PROBES_SIM = 4
#: ``adaptive``/``table``: a row of 32 elements with at most this many run heads (of 64:
#: twice as many) is reduced by runs; with more (but not all) by ``match_any`` peers / the
#: shared table. ``CUFOLD_BYKEY_RUNS``.
RUNS_MAX = 16
#: Cache hint of the key and value loads: "cs" (evict first: the streamed inputs do
#: not push ``out`` out of L2) or "ca" (plain). ``CUFOLD_BYKEY_LOAD``.
LOAD_HINT = "cs"
#: Blocks of the one-tile-per-block kernels (all but ``block`` and ``sorted``): one block
#: per tile up to this many, then a block-stride loop.
GRID_CAP = 4 if SIMULATOR else 1 << 16

#: Threads, items per thread and table slots on a GPU (``None``: the warp-level kernels).
#: 4 items keep ``runs``/``atomic`` near 32 registers (full occupancy); ``runs2`` (38
#: registers) and ``adaptive`` (44) measured best with 2 rows of 64 and 4 warps (H200,
#: 2026-11-22, ordered/shifted µs: ``runs2`` 128x2 30.1/70.0, 256x2 30.5/72.0, 256x1
#: 32.7/70.2, 256x4 34.4/73.4; ``adaptive`` 128x2 31.5/55.9, 256x2 32.4/57.5, 128x1
#: 33.7/60.9); ``table`` keeps a 2048-element tile (its merge window)
#: with 16 warps; see docs/performance.md.
GPU_TILES = {None: (256, 4, 0), "runs2": (128, 2, 0), "adaptive": (128, 2, 0), "table": (512, 4, 2048),
             "block": (256, 8, 2048), "sorted": (256, 8, 0)}

#: Consecutive elements a lane holds in each row (``runs2``, ``adaptive``: two, rows of
#: 64); a tile is ``nt x vt x`` that many elements.
LANE_ITEMS = {"runs2": 2, "adaptive": 2}

Tile = collections.namedtuple("Tile", "nt vt slots runs_max hint")
Spec = collections.namedtuple("Spec", "algorithm op key_dt val_dt out_dt wide mode tile check_order val_source "
                              "transform", defaults=("array", None))
# val_source: "array", or "counting" / "constant" for generated values (the kernels get the
# start or the value where the array would go), or ("pack", largest, pos_kind): each value
# and its position become a packed argmax/argmin word (bykey_tuple's ``packed``); transform:
# None or an ops.Transform of a value, applied as it is loaded (fused; out accumulates what
# it returns). mode: "hw", "cas", or "hw_first" (a hardware max/min that reads the word first).


# --- sizes -------------------------------------------------------------------------------

def tile_for(algorithm):
    """Threads per block, items per thread, shared-table slots (``block``, ``table``), the
    run-head limit (``adaptive``, ``table``) and the load cache hint (``GPU_TILES``).

    The simulator uses tiny tiles (64 x 2 items, 64 slots, 4 probes) so that small
    test inputs cross tiles, fill the table and take the fallback path.
    ``CUFOLD_BYKEY_TILE=NTxVT[xSLOTS]``, ``CUFOLD_BYKEY_RUNS=N`` and
    ``CUFOLD_BYKEY_LOAD=cs|ca`` override (for study and tests).
    """
    forced = os.environ.get("CUFOLD_BYKEY_TILE")
    if forced:
        parts = [int(v) for v in forced.lower().split("x")]
        nt, vt = parts[0], parts[1]
        slots = parts[2] if len(parts) > 2 else (64 if SIMULATOR else 2048)
    elif SIMULATOR:
        nt, vt, slots = 64, 2, 64
    else:
        nt, vt, slots = GPU_TILES.get(algorithm, GPU_TILES[None])
    tables = algorithm in ("block", "table")
    if nt % 32 or not 32 <= nt <= 1024 or vt < 1 or (tables and (slots < 32 or slots & (slots - 1))):
        raise ValueError("cufold: bad CUFOLD_BYKEY_TILE %r: threads a multiple of 32 in 32..1024, "
                         "items >= 1, slots a power of two >= 32" % forced)
    runs_max = int(os.environ.get("CUFOLD_BYKEY_RUNS", RUNS_MAX))
    hint = os.environ.get("CUFOLD_BYKEY_LOAD", LOAD_HINT)
    if not 0 <= runs_max <= 31 or hint not in ("cs", "ca"):
        raise ValueError("cufold: bad CUFOLD_BYKEY_RUNS (0..31) or CUFOLD_BYKEY_LOAD (cs, ca)")
    return Tile(nt, vt, slots if tables else 0,
                runs_max if algorithm in ("adaptive", "table") else 0, hint)


def _smem_bytes(spec):
    if spec.algorithm not in ("block", "table"):
        return 0
    key_bytes = 8 if spec.wide else 4
    return spec.tile.slots * (key_bytes + spec.out_dt.itemsize) + (16 if spec.algorithm == "block" else 0)


@functools.lru_cache(maxsize=None)
def _resident_blocks(device_id, nt, smem):
    if SIMULATOR:
        return 4
    gpu = cuda.gpus[device_id]
    per_sm = max(1, 2048 // nt)
    if smem:
        try:
            sm_bytes = int(gpu.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
        except Exception:  # pragma: no cover - attribute missing: assume sm_90's 228 KiB
            sm_bytes = 228 << 10
        per_sm = max(1, min(per_sm, sm_bytes // (smem + 1024)))
    return gpu.MULTIPROCESSOR_COUNT * per_sm


# --- atomic updates -----------------------------------------------------------------------

def _atomic_mode(op, dt):
    """'hw' (a ``cuda.atomic`` function) or 'cas' (a compare-and-swap loop)."""
    kinds = _HW_OPS.get(op.atomic)
    return "hw" if kinds is not None and dt.kind in kinds else "cas"


def _bits_dtype(mode, dt):
    """The dtype the compare-and-swap loop works on (floats: their bits)."""
    return _BITS[dt.itemsize] if mode == "cas" and dt.kind == "f" else dt


@functools.lru_cache(maxsize=None)
def _bit_casts(dt):
    """Device functions ``(to_bits, to_value)``: a value of ``dt`` as the signed integer
    of its width, and back (floats by their bits; integers are their own bits)."""
    env = {"B": _BITS[dt.itemsize].type, "T": dt.type}
    view = dt.kind == "f"
    to_bits = _codegen.build("def to_bits(v):\n    return %s\n" % ("v.view(B)" if view else "B(v)"), "to_bits", env)
    to_value = _codegen.build("def to_value(w):\n    return %s\n" % ("w.view(T)" if view else "T(w)"),
                              "to_value", env)
    return to_bits, to_value


def _index_expr(wide):
    """A non-negative index expression for ``cuda.atomic.*`` (which casts it to a signed
    intp and adds Numba's negative-index wraparound unless the sign bit is known clear)."""
    return "(np.uint64(idx) & np.uint64(0x7FFFFFFFFFFFFFFF))" if wide else "np.uint32(idx)"


@functools.lru_cache(maxsize=None)
def _updater(op, out_dt, mode, wide=True, red_word=None):
    """Device function ``update(out, bits, idx, v)``: ``out[idx] = op(out[idx], v)``,
    atomically (``idx >= 0``; ``wide``: it may exceed int32). ``bits`` is ``out``
    itself, or (a float operator without a hardware atomic) an integer view of the
    same memory, for the compare-and-swap loop, which skips the CAS when the operator
    leaves the word unchanged (``max`` below the current value: a load only). A hardware
    atomic whose result is unused compiles to a fire-and-forget ``RED`` (checked in SASS)."""
    env = {"T": out_dt.type, "I": _BITS[out_dt.itemsize].type}
    if mode == "hw_first":
        # read first: a key's word only moves one way, so a stale read just leaves the
        # decision to the atomic, and most items of a hot key skip it (packed argmax)
        src = ("def update(out, bits, idx, v):\n"
               "    u = %s\n"
               "    if v %s out[u]:\n"
               "        cuda.atomic.%s(out, u, v)\n" % (_index_expr(wide), ">" if op.atomic == "max" else "<",
                                                       op.atomic))
        return _codegen.build(src, "update", env)
    if mode == "hw":
        src = ("def update(out, bits, idx, v):\n"
               "    cuda.atomic.%s(out, %s, v)\n" % (op.atomic, _index_expr(wide)))
        return _codegen.build(src, "update", env)
    env["combine"] = op.combine(ValueType.of(out_dt))
    if out_dt.kind == "f":
        # Floats: combine the value, compare and swap the bits (NaN-safe: the loop
        # ends on equal bits, and the operator decides what a NaN does).
        word, step = "bits", "combine(old.view(T), v).view(I)"
    else:
        word, step = "out", "combine(old, v)"
    # mode 'cas_from': ``update(out, bits, idx, v, old)``, the loop from a word read before
    # (floats: its bits), as a 16-byte read gives four (a stale word only costs a retry);
    # 'red_from': no loop, ``red_word(out, idx, v)`` where the word read changes (a float
    # maximum or minimum: a stale word only costs a reduction that changes nothing)
    if mode == "red_from":
        env.update(combine=op.combine(ValueType.of(out_dt)), red_word=red_word)
        src = ("def update(out, bits, idx, v, old):\n"
               "    if combine(old.view(T), v).view(I) != old:\n"
               "        red_word(out, idx, v)\n")
        return _codegen.build(src, "update", env)
    src = ("def update(out, bits, idx, v{arg}):\n"
           "    u = {i}\n"
           "{read}"
           "    while True:\n"
           "        new = {s}\n"
           "        if new == old:\n"
           "            break\n"
           "        seen = cuda.atomic.cas({w}, u, old, new)\n"
           "        if seen == old:\n"
           "            break\n"
           "        old = seen\n").format(w=word, s=step, i=_index_expr(wide),
                                    arg=", old" if mode == "cas_from" else "",
                                    read="" if mode == "cas_from" else "    old = %s[u]\n" % word)
    return _codegen.build(src, "update", env)


@cuda.jit(device=True)
def _record(status, slot, epoch, i):
    """Record bad position ``i`` in ``status = (words, flag)`` (see ``_Status``)."""
    cuda.atomic.max(status[0], slot, (epoch << POS_BITS) | (POS_MASK - i))
    status[1][0] = epoch      # the same value from every recording thread: a plain store


@cuda.jit(device=True)
def _record_out_of_range(status, epoch, i):
    """``_record`` of a key outside ``[0, len(out))`` at input position ``i``."""
    _record(status, 0, epoch, i)


@functools.lru_cache(maxsize=None)
def _loader(key_dt, val_dt, out_dt, wide, full=False, hint="ca", val_source="array", transform=None):
    """Device function ``load(keys, values, n, m, i) -> (idx, value, ok, bad)``:
    ``idx`` the key as the index type (int32, int64 when ``wide``), -1 unless ``ok``
    (``i < n`` and the key in ``[0, m)``); ``bad``: ``i < n`` and the key out of range.
    ``full``: the caller knows ``i < n``. ``hint='cs'``: streaming loads (``cuda.ldcs``,
    evict first), for integer and float arrays. ``val_source`` and ``transform``: see
    :data:`Spec`."""
    # One unsigned compare tests both ends (a negative key wraps to a huge one); 32 bits
    # when key and m fit (m < 2**31 unless wide).
    ct = np.uint32 if key_dt.itemsize <= 4 and not wide else np.uint64
    env = {"IT": np.int64 if wide else np.int32, "T": out_dt.type, "CT": ct}
    get_k = "cuda.ldcs(keys, u)" if hint == "cs" else "keys[u]"
    get_v = "cuda.ldcs(values, u)" if hint == "cs" and val_dt.kind in "iuf" else "values[u]"
    if val_source.__class__ is tuple:     # ("pack", largest, pos_kind): a packed argmax word
        from .bykey_tuple import _encoders
        env["encode"], env["V"] = _encoders(val_dt, val_source[2], val_source[1])[0], val_dt.type
        get_v = "encode(V(%s), i)" % get_v
    elif val_source != "array":     # generated: computed from the position
        env["V"] = val_dt.type
        get_v = "V(values + V(u))" if val_source == "counting" else "values"
    if transform is not None:
        env["tf"] = transform.device(InputType.of(val_dt, (val_source,)))
        get_v = "tf(%s)" % get_v
    # cuda.ldcs casts the index to a signed intp and adds Numba's negative-index
    # wraparound unless the sign bit is known clear
    take = ["u = np.uint64(i) & np.uint64(0x7FFFFFFFFFFFFFFF)" if hint == "cs" else "u = np.uint64(i)",
            "k = %s" % get_k,
            "ok = CT(k) < CT(m)",
            "return (IT(k) if ok else IT(-1)), T(%s), ok, not ok" % get_v]
    if full:
        lines = ["    " + s for s in take]
    else:
        lines = ["    if i < n:"] + ["        " + s for s in take] + ["    return IT(-1), T(0), False, False"]
    src = "def load(keys, values, n, m, i):\n" + "\n".join(lines) + "\n"
    return _codegen.build(src, "load", env)


# --- atomic / warp / block rows -----------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _peer_slot(spec, deliver, distinct_path=True):
    """Device function ``slot(out, bits, idx, v, ok[, table...])``: seed 001's
    aggregation of 32 elements, one per lane. Each group of lanes holding one key is
    reduced, and its first lane hands the total to ``deliver`` (a global update, or an
    insert into the block's table). ``distinct_path``: a row of distinct keys (random
    keys) takes plain updates at once (a warp-uniform branch; one vote a row, a loss
    where rows were chosen for repeating keys: ``adaptive``'s match rows, 55.9 against
    58.1 µs on seed 001's shifted keys); ``"flag"``: the caller says per row, in one more
    argument after ``ok``. Lanes without a valid key (``ok`` False) hold -1: they match no
    real key."""
    find_peers = warp.peers(np.int64 if spec.wide else np.int32)
    group_total = warp.reduce_peers(spec.op, ValueType.of(spec.out_dt))
    update = _updater(spec.op, spec.out_dt, spec.mode, spec.wide)

    @cuda.jit(device=True)
    def peer_slot_flagged(out, bits, idx, v, ok, distinct, *table):
        p = find_peers(idx)
        lane = cuda.laneid
        if distinct and cuda.all_sync(FULL_MASK, p == (1 << lane)):
            if ok:
                update(out, bits, idx, v)
        else:
            s = group_total(p, v)
            if ok and cuda.ffs(p) - 1 == lane:
                deliver(out, bits, idx, s, *table)

    if distinct_path == "flag":
        return peer_slot_flagged

    @cuda.jit(device=True)
    def peer_slot(out, bits, idx, v, ok, *table):
        peer_slot_flagged(out, bits, idx, v, ok, distinct_path, *table)

    return peer_slot


@functools.lru_cache(maxsize=None)
def _slot(spec):
    """Device function processing one row (32 consecutive elements, one per lane) of
    ``atomic``, ``warp`` or ``block``: ``slot(out, bits, idx, v, ok[, table...])``."""
    update = _updater(spec.op, spec.out_dt, spec.mode, spec.wide)
    if spec.algorithm == "atomic":
        @cuda.jit(device=True)
        def atomic_slot(out, bits, idx, v, ok):
            if ok:
                update(out, bits, idx, v)
        return atomic_slot

    if spec.algorithm == "warp":
        return _peer_slot(spec, update)

    slots = spec.tile.slots
    mask = slots - 1
    log2 = slots.bit_length() - 1
    probes = MAX_PROBES_SIM if SIMULATOR else MAX_PROBES_GPU
    empty = -1
    # The table holds values as ``out`` does, or their bits for a float CAS loop:
    # either way the same update works on it (``update(table, table, slot, v)``).
    table_update = update

    @cuda.jit(device=True)
    def insert(out, bits, idx, v, tkeys, tvals, count):
        s = (idx ^ (idx >> log2)) & mask
        done = False
        for _ in range(probes):
            cur = tkeys[s]
            if cur == empty:
                cur = cuda.atomic.cas(tkeys, s, empty, idx)
                if cur == empty:    # claimed: count it (the flush decision)
                    cuda.atomic.add(count, 0, 1)
                    cur = idx
            if cur == idx:
                table_update(tvals, tvals, s, v)
                done = True
                break
            s = (s + 1) & mask
        if not done:                # the neighbourhood is full: straight to global memory
            update(out, bits, idx, v)

    return _peer_slot(spec, insert)


# --- runs / adaptive rows -----------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _key_before(wide):
    """Device function ``key_before(prev, idx)``: the key of the element before this
    lane's, when lane ``l`` holds the element after lane ``l - 1``'s and lane 0 the one
    after the previous row's last (``prev``, supplied by lane 31, whose own key no lane
    reads): one rotate-by-one shuffle."""
    it = np.int64 if wide else np.int32

    @cuda.jit(device=True)
    def key_before(prev, idx):
        lane = cuda.laneid
        return cuda.shfl_sync(FULL_MASK, it(prev) if lane == 31 else it(idx), (lane + 31) & 31)

    return key_before


@functools.lru_cache(maxsize=None)
def _heads(wide):
    """Device functions ``first(idx)`` and ``following(previous_idx, idx)`` -> uint32
    ballot of the lanes whose key differs from the element before (a run head). Row
    ``j`` of a span follows row ``j - 1`` in memory, so lane 0's left neighbour is
    lane 31 of the previous row (``_key_before``). Row 0's lane 0 is a head."""
    it = np.int64 if wide else np.int32
    key_before = _key_before(wide)

    @cuda.jit(device=True)
    def first(idx):
        left = cuda.shfl_up_sync(FULL_MASK, it(idx), 1)
        return np.uint32(cuda.ballot_sync(FULL_MASK, cuda.laneid == 0 or idx != left))

    @cuda.jit(device=True)
    def following(prev, idx):
        return np.uint32(cuda.ballot_sync(FULL_MASK, idx != key_before(prev, idx)))

    return first, following


@functools.lru_cache(maxsize=None)
def _by_runs(algorithm, runs_max):
    """Device function ``by_runs(heads) -> bool``: whether a row is reduced by runs
    (warp-uniform). Rows where every lane is a head take plain atomics instead."""
    if algorithm == "runs":
        @cuda.jit(device=True)
        def by_runs(heads):
            return heads != np.uint32(FULL_MASK)
    else:
        @cuda.jit(device=True)
        def by_runs(heads):
            return cuda.popc(heads) <= runs_max
    return by_runs


def _span_loads(elements):
    """Generated lines of a span body: ``k<name>, v<name>, ok<name>, bad<name>`` for the
    element ``first + offset`` of each ``(name, offset)``, all loads issued before any
    work, then one branch recording the (rare) bad keys."""
    lines = ["    k%s, v%s, ok%s, bad%s = load(keys, values, n, m, first + %d)" % (e, e, e, e, d) for e, d in elements]
    lines.append("    if (%s) and epoch > 0:" % " or ".join("bad%s" % e for e, _ in elements))
    for e, d in elements:
        lines += ["        if bad%s:" % e, "            record(status, 0, epoch, first + %d)" % d]
    return lines


@functools.lru_cache(maxsize=None)
def _segment_step(op, out_vt):
    """Device function ``step(v, dist, offset)``: one step of an inclusive segmented scan
    by ``shfl_up`` (``dist``: the lane's distance to its segment's first lane) of values
    of ``out_vt`` (a scalar or a tuple type)."""
    combine = op.combine(out_vt)
    up = out_vt.shuffle("up")

    @cuda.jit(device=True)
    def step(v, dist, offset):
        o = up(FULL_MASK, v, offset)
        if dist >= offset:
            v = combine(o, v)
        return v

    return step


@functools.lru_cache(maxsize=None)
def _segmented_scan(spec):
    """``segmented_scan(spec.op, out_dt)``: the one-field algorithms' scan."""
    return segmented_scan(spec.op, ValueType.of(spec.out_dt))


@functools.lru_cache(maxsize=None)
def segmented_scan(op, out_vt):
    """Device function ``scan(v, heads) -> v``: the inclusive scan of ``v`` (of ``out_vt``)
    over lanes, restarted at every lane of the ``heads`` ballot (lane 0 always starts a
    segment); the 8 and 16 steps only when some segment is that long."""
    step = _segment_step(op, out_vt)
    full = np.uint32(FULL_MASK)

    @cuda.jit(device=True)
    def scan(v, heads):
        lane = np.uint32(cuda.laneid)
        below = full >> (np.uint32(31) - lane)              # lanes 0..lane
        # Numba types ``uint32 | uint32`` as uint64 (NumPy keeps uint32, so the simulator
        # cannot tell): without the cast ``clz`` counts 64 bits (``clz.b64``), ``start`` is
        # off by 32 and every lane scans across run heads (wrong sums on a GPU only;
        # ``test_runs_ptx_clz_32``).
        start = np.int32(31) - np.int32(cuda.clz(np.uint32((heads | np.uint32(1)) & below)))
        dist = np.int32(np.int32(lane) - start)            # 32-bit compares below
        v = step(v, dist, 1)
        v = step(v, dist, 2)
        v = step(v, dist, 4)
        if cuda.any_sync(FULL_MASK, dist >= 8):
            v = step(v, dist, 8)
            if cuda.any_sync(FULL_MASK, dist >= 16):
                v = step(v, dist, 16)
        return v

    return scan


@functools.lru_cache(maxsize=None)
def _close_runs(spec):
    """Device function ``close(out, bits, idx, v, ends, from_last, cin, cout, carry) ->
    carry``: the end of a row reduced by runs, ``v`` being each lane's scan. The run open
    at the row's start (``from_last``: no head up to this lane) takes the previous row's
    ``carry`` when one comes in (``cin``); lanes where a run ``ends`` update ``out``;
    with ``cout`` the run open at lane 31 goes on as the new carry."""
    out_vt = ValueType.of(spec.out_dt)
    combine = spec.op.combine(out_vt)
    broadcast = out_vt.shuffle("idx")
    update = _updater(spec.op, spec.out_dt, spec.mode, spec.wide)

    @cuda.jit(device=True)
    def close(out, bits, idx, v, ends, from_last, cin, cout, carry):
        if cin and from_last:
            v = combine(carry, v)
        if ends and idx >= 0:
            update(out, bits, idx, v)
        if cout:
            carry = broadcast(FULL_MASK, v, 31)
        return carry

    return close


@functools.lru_cache(maxsize=None)
def _runs_part(spec):
    """Device function ``runs(out, bits, idx, v, heads, cin, cout, carry) -> carry``: a
    row's runs of equal keys reduced by a segmented scan bounded by the run heads'
    ballot, then one update by the last lane of each run. The run ending at lane 31 may
    continue in the next row (``cout``): its total is broadcast as ``carry`` instead,
    and the next row's first run (``cin``) folds it in, so a run costs one update per
    span whatever the rows it crosses. Operands are combined in sequence order
    (``combine(earlier, later)``)."""
    scan = _segmented_scan(spec)
    close = _close_runs(spec)
    full = np.uint32(FULL_MASK)
    top = np.uint32(0x80000000)

    @cuda.jit(device=True)
    def runs(out, bits, idx, v, heads, cin, cout, carry):
        lane = np.uint32(cuda.laneid)
        below = full >> (np.uint32(31) - lane)
        v = scan(v, heads)
        tail = (((heads >> np.uint32(1)) | top) >> lane) & np.uint32(1) != 0
        ends = tail and not (cout and lane == 31)
        return close(out, bits, idx, v, ends, np.uint32(heads & below) == 0, cin, cout, carry)

    return runs


@functools.lru_cache(maxsize=None)
def _runs2_part(spec):
    """Device function ``runs2(out, bits, ka, va, kb, vb, ha, hb, heads, heads_a, cin,
    cout, carry) -> carry``: ``_runs_part`` for a row of 64 elements, lane ``l`` holding
    the consecutive elements ``a = 2l`` and ``b = 2l + 1`` (``ha``, ``hb``: each starts
    a run). The lane folds its pair first (``b`` alone when it starts a run), so one
    segmented scan covers twice the elements; segments start at the lanes of ``heads``
    (``ha or hb``). ``b`` ends a run where the next lane's ``a`` starts one
    (``heads_a``); ``a`` ends one where ``b`` starts one, its total being the previous
    lane's scan (and the carry, when the run came from the previous row) with ``va``."""
    out_vt = ValueType.of(spec.out_dt)
    combine = spec.op.combine(out_vt)
    up = out_vt.shuffle("up")
    update = _updater(spec.op, spec.out_dt, spec.mode, spec.wide)
    scan = _segmented_scan(spec)
    close = _close_runs(spec)
    full = np.uint32(FULL_MASK)

    @cuda.jit(device=True)
    def runs2(out, bits, ka, va, kb, vb, ha, hb, heads, heads_a, cin, cout, carry):
        lane = np.uint32(cuda.laneid)
        below = full >> (np.uint32(31) - lane)
        t = scan(vb if hb else combine(va, vb), heads)
        before = up(FULL_MASK, t, 1)                         # the run open at lane - 1's end
        if hb and ka >= 0:                                   # a ends a run
            a = va
            if not ha:
                if lane > 0:
                    a = combine(before, va)
                if cin and np.uint32(heads & (below >> np.uint32(1))) == 0:
                    a = combine(carry, a)                    # no head before: from the last row
            update(out, bits, ka, a)
        if lane == 31:
            ends = not cout
        else:
            ends = (heads_a >> (lane + np.uint32(1))) & np.uint32(1) != 0
        return close(out, bits, kb, t, ends, np.uint32(heads & below) == 0, cin, cout, carry)

    return runs2


@functools.lru_cache(maxsize=None)
def _match_pair(spec):
    """Device function ``pair(out, bits, ka, va, kb, vb, distinct)``: a row of 64 (``runs2``'s
    layout, lane ``l`` holding elements ``2l`` and ``2l + 1``) by seed 001's
    aggregation, one half of the row at a time. One ``shfl_xor`` by 16 regroups the
    row so that each lane holds an element of the first 32 (``x``) and one of the last
    32 (``y``): lanes below 16 keep ``a`` and receive lane ``l + 16``'s ``a``; the others
    receive lane ``l - 16``'s ``b`` and keep ``b``. Each half's lanes are grouped by
    ``match_any`` and reduced per group, and each group's first lane updates ``out``:
    one update per distinct key of 32 consecutive elements, as ``warp`` (the same
    ``_peer_slot``; interleaved halves, ``a`` apart from ``b``, would merge fewer: seed
    001's shifted keys, 6.1 M updates against 4.7 M). Keys ``< 0`` (bad, past ``n``)
    update nothing. ``distinct`` (rows of 64 heads, where most halves hold distinct keys):
    a half of distinct keys takes plain updates after one vote (``_peer_slot``'s)."""
    it = np.int64 if spec.wide else np.int32
    vbits = _BITS[spec.out_dt.itemsize].type
    swap_key = ValueType.of(it).shuffle("xor")
    swap_value = ValueType.of(spec.out_dt).shuffle("xor")
    half = _peer_slot(spec, _updater(spec.op, spec.out_dt, spec.mode, spec.wide), "flag")
    to_bits, to_value = _bit_casts(spec.out_dt)

    @cuda.jit(device=True)
    def pair(out, bits, ka, va, kb, vb, distinct):
        lane = cuda.laneid
        low = lane < 16
        kr = swap_key(FULL_MASK, kb if low else ka, 16)
        vr = swap_value(FULL_MASK, vb if low else va, 16)
        # ``x = a if low else received`` and ``y = received if low else b`` as bit masks
        # from a ballot (opaque to the compiler): with plain selects on ``low``, LLVM and
        # ptxas duplicated the second half per half-warp, so its match_any ran diverged
        # (2.4x slower on seed 001's shifted keys)
        high = np.uint32(cuda.ballot_sync(FULL_MASK, not low)) >> np.uint32(lane) & np.uint32(1)
        km = it(it(0) - it(high))
        vm = vbits(vbits(0) - vbits(high))
        kx = it((ka & ~km) | (kr & km))
        ky = it((kr & ~km) | (kb & km))
        ab, rb, bb = to_bits(va), to_bits(vr), to_bits(vb)
        vx = to_value(vbits((ab & ~vm) | (rb & vm)))
        vy = to_value(vbits((rb & ~vm) | (bb & vm)))
        half(out, bits, kx, vx, kx >= 0, distinct)
        half(out, bits, ky, vy, ky >= 0, distinct)

    return pair


@functools.lru_cache(maxsize=None)
def _runs2_body(spec, full):
    """``_span_body`` of ``runs2`` and ``adaptive``: a span of ``64 x VT`` consecutive
    elements, lane ``l`` of row ``j`` holding elements ``first + 64 j`` and the one after
    (``first``: the span's start + ``2 l``). Heads: ``a`` against the previous lane's
    ``b`` (lane 0: the previous row's lane 31, one rotating shuffle), ``b`` against
    ``a``. A row of 64 heads (random keys) does plain updates; the others are reduced by
    runs, carried across rows as in ``runs``; ``adaptive``: only rows of at most ``2 x
    runs_max`` heads, the others by ``match_any`` peers (``_match_pair``), and where updates
    are hardware atomics rows of 64 heads too (a half of distinct keys: plain updates)."""
    vt = spec.tile.vt
    matching = spec.algorithm == "adaptive"
    # Rows of 64 heads meet by match_any only where every update is a hardware atomic
    # ("hw"): a hot key's atomics serialise in L2. A compare-and-swap loop, or a hardware
    # atomic that reads the word first ("hw_first"), skips the updates that leave the word
    # unchanged (a maximum's, mostly), and there the vote cost more than it saved (H200,
    # float32 maxima of 4M keys into 200k: uniform 33.2 -> 40.9 us, shuffled power law
    # 30.6 -> 36.5).
    matching_heads = matching and spec.mode == "hw"
    lines = ["def body(keys, values, out, bits, n, m, status, epoch, first):"]
    lines += _span_loads([("%s%d" % (h, j), 64 * j + d) for j in range(vt) for h, d in (("a", 0), ("b", 1))])
    lines.append("    lane = cuda.laneid")
    for j in range(vt):
        prev = "IT(-1)" if j == 0 else "kb%d" % (j - 1)
        # ``ha`` and ``hb`` are balloted apart and the words combined: ptxas (CUDA 13,
        # sm_90) compiled ``ballot(ha or hb)`` beside ``ballot(ha and hb)`` as the ``and``
        # for both (wrong sums on a GPU only). ``ballot_sync`` is int32 to Numba, so the
        # words are compared as uint32.
        lines += ["    ha%d = ka%d != key_before(%s, kb%d)%s" % (j, j, prev, j, " or lane == 0" if j == 0 else ""),
                  "    hb%d = kb%d != ka%d" % (j, j, j),
                  "    A%d = U32(cuda.ballot_sync(FULL, ha%d))" % (j, j),
                  "    B%d = U32(cuda.ballot_sync(FULL, hb%d))" % (j, j),
                  "    H%d = U32(A%d | B%d)" % (j, j, j),
                  "    d%d = U32(A%d & B%d) == FULL" % (j, j, j)]
        if matching_heads:
            # rows of 64 heads too: keys that repeat, but never next to each other (a power
            # law's hot keys, shuffled), meet by match_any; a half of distinct keys takes
            # plain updates after one vote
            lines.append("    r%d = not (d%d or cuda.popc(A%d) + cuda.popc(B%d) > RUNS2)" % (j, j, j, j))
        elif matching:
            lines += ["    g%d = not d%d and cuda.popc(A%d) + cuda.popc(B%d) > RUNS2" % (j, j, j, j),
                      "    r%d = not d%d and not g%d" % (j, j, j)]
        else:
            lines.append("    r%d = not d%d" % (j, j))
    # a run continues from row j into row j + 1: both reduced by runs, and row j + 1's
    # first element is no head
    lines += ["    c%d = r%d and r%d and (A%d & U32(1)) == 0" % (j, j, j + 1, j + 1) for j in range(vt - 1)]
    lines += ["    c%d = False" % (vt - 1), "    carry = T(0)"]
    for j in range(vt):
        lines += ["    if r%d:" % j,
                  "        carry = runs2(out, bits, ka%d, va%d, kb%d, vb%d, ha%d, hb%d, H%d, A%d, %s, c%d, carry)"
                  % (j, j, j, j, j, j, j, j, "False" if j == 0 else "c%d" % (j - 1), j)]
        if matching_heads:
            lines += ["    else:",
                      "        pair(out, bits, ka%d, va%d, kb%d, vb%d, d%d)" % (j, j, j, j, j)]
        else:
            if matching:
                lines += ["    elif g%d:" % j,
                          "        pair(out, bits, ka%d, va%d, kb%d, vb%d, False)" % (j, j, j, j)]
            lines += ["    else:",
                      "        if oka%d:" % j,
                      "            update(out, bits, ka%d, va%d)" % (j, j),
                      "        if okb%d:" % j,
                      "            update(out, bits, kb%d, vb%d)" % (j, j)]
    env = {"load": _loader(spec.key_dt, spec.val_dt, spec.out_dt, spec.wide, full, spec.tile.hint,
                           spec.val_source, spec.transform),
           "record": _record, "T": spec.out_dt.type, "FULL": np.uint32(FULL_MASK), "U32": np.uint32,
           "IT": np.int64 if spec.wide else np.int32, "runs2": _runs2_part(spec), "key_before": _key_before(spec.wide),
           "update": _updater(spec.op, spec.out_dt, spec.mode, spec.wide)}
    if matching:
        env["pair"] = _match_pair(spec)
        env["RUNS2"] = 2 * spec.tile.runs_max
    return _codegen.build("\n".join(lines) + "\n", "body", env)


def _table_layout(spec):
    """(key type, word dtype, identity word) of the ``table``/``block`` shared tables:
    values as ``out`` holds them, or their bits for a float CAS loop (the same update
    works on either: ``update(table, table, slot, v)``)."""
    kt = np.int64 if spec.wide else np.int32
    out_vt = ValueType.of(spec.out_dt)
    table_dt = _bits_dtype(spec.mode, spec.out_dt)
    identity = out_vt.make(spec.op.identity_for(out_vt))
    if table_dt != spec.out_dt:
        identity = identity.view(table_dt)     # the identity's bits
    return kt, table_dt, identity


@functools.lru_cache(maxsize=None)
def _table_insert(spec):
    """Device function ``insert(out, bits, idx, v, tkeys, tvals)`` (``idx >= 0``): fold
    ``v`` into the slot of ``idx`` in a block's shared table (multiplicative hash,
    linear probing, the key claimed by compare-and-swap, the value updated with a
    shared atomic); after a few occupied probes, straight to ``out``."""
    slots = spec.tile.slots
    log2 = slots.bit_length() - 1
    mask = np.uint32(slots - 1)
    probes = MAX_PROBES_SIM if SIMULATOR else MAX_PROBES_GPU
    empty = -1
    update = _updater(spec.op, spec.out_dt, spec.mode, spec.wide)
    wide = spec.wide
    golden = np.uint64(0x9E3779B1)
    shift = np.uint64(32 - log2)

    @cuda.jit(device=True)
    def insert(out, bits, idx, v, tkeys, tvals):
        x = np.uint64(idx)
        if wide:
            x = x ^ (x >> np.uint64(32))
        # the top bits of the low word of key * golden ratio (Fibonacci hashing): local
        # keys (shifted orders: a few clusters of consecutive keys) spread evenly
        s = np.uint32(((x & np.uint64(0xFFFFFFFF)) * golden >> shift) & np.uint64(slots - 1))
        for _ in range(probes):
            cur = tkeys[s]
            if cur == empty:
                cur = cuda.atomic.cas(tkeys, s, empty, idx)
                if cur == empty:
                    cur = idx
            if cur == idx:
                update(tvals, tvals, s, v)
                return
            s = (s + np.uint32(1)) & mask
        update(out, bits, idx, v)

    return insert


@functools.lru_cache(maxsize=None)
def _runs_row(spec):
    """Device function ``row(out, bits, idx, v, heads, runs, cin, cout, carry[, tkeys,
    tvals]) -> carry`` of ``runs`` and ``table``: one row of 32 consecutive elements
    (lane order). A row where every lane is a run head (random keys) does one update
    per lane; a row with ``runs`` (see ``_by_runs``) is reduced by runs
    (``_runs_part``). ``table``: the others, with more than ``runs_max`` heads, but not
    all, fold each element into the block's shared table (flushed to ``out`` by the
    kernel), which merges the keys that repeat anywhere in the tile."""
    update = _updater(spec.op, spec.out_dt, spec.mode, spec.wide)
    runs_part = _runs_part(spec)
    full = np.uint32(FULL_MASK)
    alg = spec.algorithm

    if alg == "table":
        insert = _table_insert(spec)

        @cuda.jit(device=True)
        def table_row(out, bits, idx, v, heads, runs, cin, cout, carry, tkeys, tvals):
            if heads == full or runs:
                if heads == full:
                    if idx >= 0:
                        update(out, bits, idx, v)
                    return carry
                return runs_part(out, bits, idx, v, heads, cin, cout, carry)
            if idx >= 0:
                insert(out, bits, idx, v, tkeys, tvals)
            return carry

        return table_row

    @cuda.jit(device=True)
    def row(out, bits, idx, v, heads, runs, cin, cout, carry):
        if heads == full:
            if idx >= 0:
                update(out, bits, idx, v)
            return carry
        return runs_part(out, bits, idx, v, heads, cin, cout, carry)

    return row


@functools.lru_cache(maxsize=None)
def _span_body(spec, full):
    """Device function: one warp's share of a tile, ``32 x VT`` consecutive elements
    (a span), lane ``l`` holding elements ``first + 32 j`` (row ``j``: coalesced). All
    loads are issued before the first row is processed (generated, unrolled code);
    ``full`` spans (inside ``n``) skip the ``i < n`` tests. ``table``'s returns whether
    a row used the shared table."""
    vt = spec.tile.vt
    alg = spec.algorithm
    extra = {"block": ", tkeys, tvals, count", "table": ", tkeys, tvals"}.get(alg, "")
    lines = ["def body(keys, values, out, bits, n, m, status, epoch, first%s):" % extra]
    lines += _span_loads([("%d" % j, 32 * j) for j in range(vt)])
    env = {"load": _loader(spec.key_dt, spec.val_dt, spec.out_dt, spec.wide, full, spec.tile.hint,
                           spec.val_source, spec.transform),
           "record": _record, "T": spec.out_dt.type, "FULL": np.uint32(FULL_MASK)}
    if alg in ("runs", "table"):
        env["first_heads"], env["heads"] = _heads(spec.wide)
        env["by_runs"] = _by_runs(alg, spec.tile.runs_max)
        env["row"] = _runs_row(spec)
        lines.append("    h0 = first_heads(k0)")
        lines += ["    h%d = heads(k%d, k%d)" % (j, j - 1, j) for j in range(1, vt)]
        lines += ["    r%d = by_runs(h%d)" % (j, j) for j in range(vt)]
        # a run continues from row j into row j + 1: both reduced by runs, and row j + 1's
        # lane 0 is no head
        lines += ["    c%d = r%d and r%d and (h%d & 1) == 0" % (j, j, j + 1, j + 1) for j in range(vt - 1)]
        lines.append("    c%d = False" % (vt - 1))
        lines.append("    carry = T(0)")
        for j in range(vt):
            lines.append("    carry = row(out, bits, k%d, v%d, h%d, r%d, %s, c%d, carry%s)"
                         % (j, j, j, j, "False" if j == 0 else "c%d" % (j - 1), j, extra))
        if alg == "table":
            lines.append("    return %s" % " or ".join("(h%d != FULL and not r%d)" % (j, j) for j in range(vt)))
    else:
        env["slot"] = _slot(spec)
        lines += ["    slot(out, bits, k%d, v%d, ok%d%s)" % (j, j, j, extra) for j in range(vt)]
    return _codegen.build("\n".join(lines) + "\n", "body", env)


# --- kernels ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _value_of(spec):
    """Device function: a table word as ``out``'s dtype (floats of a CAS loop: from bits)."""
    if _bits_dtype(spec.mode, spec.out_dt) != spec.out_dt:
        return _bit_casts(spec.out_dt)[1]
    return _codegen.build("def value_of(w):\n    return w\n", "value_of")


@functools.lru_cache(maxsize=None)
def scatter_kernel(spec):
    """The kernel of ``atomic``/``warp``/``runs``/``runs2``/``adaptive``/``table``/``block``:
    ``(keys, values, out, bits, n, m, status, epoch)``. Every lane of a warp runs the
    same iterations (collectives). ``block``: block ``b`` owns a contiguous range of
    tiles (its shared table persists across them). The others: one tile per block (a
    block-stride loop beyond ``GRID_CAP``), so the hardware balances blocks over the
    SMs whatever the occupancy, and the resident blocks work on neighbouring tiles;
    ``table`` flushes its shared table after each tile that used it."""
    nt, vt = spec.tile.nt, spec.tile.vt
    per_lane = LANE_ITEMS.get(spec.algorithm, 1)
    tile = nt * vt * per_lane
    span = 32 * vt * per_lane
    body = _runs2_body if per_lane == 2 else _span_body
    full_body = body(spec, True)
    part_body = body(spec, False)

    if spec.algorithm not in ("block", "table"):
        def scatter(keys, values, out, bits, n, m, status, epoch):
            tiles = (n + (tile - 1)) // tile
            offset = (cuda.threadIdx.x // 32) * span + cuda.laneid * per_lane
            t = np.int64(cuda.blockIdx.x)
            while t < tiles:
                base = t * tile
                if base + tile <= n:
                    full_body(keys, values, out, bits, n, m, status, epoch, base + offset)
                else:
                    part_body(keys, values, out, bits, n, m, status, epoch, base + offset)
                t += cuda.gridDim.x

        return scatter

    slots = spec.tile.slots
    kt, table_dt, identity = _table_layout(spec)
    ttype = table_dt.type
    value_of = _value_of(spec)
    update = _updater(spec.op, spec.out_dt, spec.mode, spec.wide)
    empty = -1

    @cuda.jit(device=True)
    def flush(out, bits, tkeys, tvals, tid):
        """One update of ``out`` per key in the shared table, which is left empty
        (the block's threads share the slots; a barrier must follow)."""
        for s in range(tid, slots, nt):
            k = tkeys[s]
            if k != empty:
                update(out, bits, k, value_of(tvals[s]))
                tkeys[s] = empty
                tvals[s] = identity

    if spec.algorithm == "table":
        def scatter_table(keys, values, out, bits, n, m, status, epoch):
            tkeys = cuda.shared.array(slots, kt)
            tvals = cuda.shared.array(slots, ttype)
            tid = cuda.threadIdx.x
            for s in range(tid, slots, nt):
                tkeys[s] = empty
                tvals[s] = identity
            cuda.syncthreads()
            tiles = (n + (tile - 1)) // tile
            offset = (tid // 32) * span + cuda.laneid
            t = np.int64(cuda.blockIdx.x)
            while t < tiles:
                base = t * tile
                if base + tile <= n:
                    used = full_body(keys, values, out, bits, n, m, status, epoch, base + offset, tkeys, tvals)
                else:
                    used = part_body(keys, values, out, bits, n, m, status, epoch, base + offset, tkeys, tvals)
                # a barrier for the tile's inserts; the flush (one update per key) is skipped
                # when no row of the tile used the table
                if cuda.syncthreads_or(1 if used else 0):
                    flush(out, bits, tkeys, tvals, tid)
                    cuda.syncthreads()
                t += cuda.gridDim.x

        return scatter_table

    flush_at = slots // 2

    def scatter_block(keys, values, out, bits, n, m, status, epoch):
        tkeys = cuda.shared.array(slots, kt)
        tvals = cuda.shared.array(slots, ttype)
        count = cuda.shared.array(1, np.int32)
        tid = cuda.threadIdx.x
        for s in range(tid, slots, nt):
            tkeys[s] = empty
            tvals[s] = identity
        if tid == 0:
            count[0] = 0
        cuda.syncthreads()
        tiles = (n + tile - 1) // tile
        per = (tiles + cuda.gridDim.x - 1) // cuda.gridDim.x
        t0 = cuda.blockIdx.x * per
        t1 = min(tiles, t0 + per)
        offset = (tid // 32) * span + cuda.laneid
        for t in range(t0, t1):
            base = t * tile
            if base + tile <= n:
                full_body(keys, values, out, bits, n, m, status, epoch, base + offset, tkeys, tvals, count)
            else:
                part_body(keys, values, out, bits, n, m, status, epoch, base + offset, tkeys, tvals, count)
            # A barrier for the tile's inserts, and one block-wide decision: flush when
            # the table is half full, and after the block's last tile.
            if cuda.syncthreads_or(1 if (count[0] > flush_at or t == t1 - 1) else 0):
                flush(out, bits, tkeys, tvals, tid)
                cuda.syncthreads()
                if tid == 0:
                    count[0] = 0
                cuda.syncthreads()

    return scatter_block


# --- sorted: segmented reduction over runs ------------------------------------------------

@functools.lru_cache(maxsize=None)
def _maybe(op, out_dt):
    """Device function ``maybe(has_a, a, has_b, b) -> (has, value)``: the operator
    extended with "no value" (an identity for any operator)."""
    combine = op.combine(ValueType.of(out_dt))

    @cuda.jit(device=True)
    def maybe(ha, a, hb, b):
        if ha and hb:
            return True, combine(a, b)
        if ha:
            return True, a
        return hb, b

    return maybe


@functools.lru_cache(maxsize=None)
def _segment_op(op, out_dt):
    """The segmented-scan operator on ``(head, has, value)``: a later element with a
    head flag restarts the segment (associative, not commutative)."""
    maybe = _maybe(op, out_dt)

    def segmented(a, b):
        if b[0]:
            return (True, b[1], b[2])
        h, v = maybe(a[1], a[2], b[1], b[2])
        return (a[0], h, v)

    return Op(segmented, identity=lambda vt: (False, False, 0), name="segmented_" + op.name)


@functools.lru_cache(maxsize=None)
def sorted_kernel(spec, level0):
    """One level of the ``sorted`` algorithm, one tile per block:
    ``(keys, values, has, out, bits, n, m, status, epoch, pk, pv, ph, last)``.

    Thread ``t`` holds the tile's items ``t*VT .. t*VT+VT-1``. A block-wide exclusive
    segmented scan gives each thread the running total of the run it starts in; each
    thread then walks its items and finishes the runs ending there. Runs inside the
    tile are written (one update each). The tile's first and last runs may continue
    in the neighbouring tiles: they become the pieces ``2*tile`` (first) and
    ``2*tile + 1`` (last; "no value" when the tile is a single run) of the next
    level's input, whose keys stay in order. With ``last`` (a single tile) they are
    written too. Level 0 reads the caller's keys and values; the next levels read
    pieces: int64 keys (-1: none), values of ``out``'s dtype, uint8 has-flags.
    """
    nt, vt = spec.tile.nt, spec.tile.vt
    tile = nt * vt
    out_dt = spec.out_dt
    T = out_dt.type
    update = _updater(spec.op, out_dt, spec.mode)
    maybe = _maybe(spec.op, out_dt)
    scan = block.exclusive_scan(_segment_op(spec.op, out_dt), (np.bool_, np.bool_, out_dt), nt)
    check_order = bool(spec.check_order and level0)
    load = _loader(spec.key_dt, spec.val_dt, out_dt, True, val_source=spec.val_source, transform=spec.transform)
    if level0:

        @cuda.jit(device=True)
        def item(keys, values, has, n, m, i):
            k, v, ok, bad = load(keys, values, n, m, i)
            return k, ok, v, bad
    else:
        @cuda.jit(device=True)
        def item(keys, values, has, n, m, i):
            u = np.uint64(i)
            return keys[u], has[u] != 0, values[u], False

    @cuda.jit(device=True)
    def key_at(keys, values, has, n, m, i):
        if level0:
            return load(keys, values, n, m, i)[0]
        return keys[np.uint64(i)]

    @cuda.jit(device=True)
    def put(pk, pv, ph, j, k, h, v):
        u = np.uint64(j)
        pk[u] = k
        pv[u] = v
        ph[u] = 1 if h else 0

    @cuda.jit(device=True)
    def write(out, bits, k, h, v):
        if h and k >= 0:
            update(out, bits, k, v)

    def segments(keys, values, has, out, bits, n, m, status, epoch, pk, pv, ph, last):
        tid = cuda.threadIdx.x
        t = cuda.blockIdx.x
        base = t * tile
        count = min(tile, n - base)
        tile_last = count - 1
        p0 = tid * vt
        ks = cuda.local.array(vt, np.int64)
        vs = cuda.local.array(vt, T)
        hs = cuda.local.array(vt, np.bool_)
        bads = cuda.local.array(vt, np.bool_)
        # every load first: a bad-key record (an atomic) between two loads would order them
        for j in range(vt):
            p = p0 + j
            if p < count:
                k, h, v, bad = item(keys, values, has, n, m, base + p)
                ks[j] = k
                hs[j] = h
                vs[j] = v
                bads[j] = bad
        # the key before this thread's first item (for heads and the order check)
        prev0 = np.int64(-1)
        if p0 < count and (p0 > 0 or (check_order and base > 0)):
            prev0 = key_at(keys, values, has, n, m, base + p0 - 1)
        following = np.int64(-1)
        if p0 + vt < count:
            following = key_at(keys, values, has, n, m, base + p0 + vt)
        # pass 1: load, and this thread's (head seen, has, value since the last head)
        head = False
        agg_has = False
        agg = T(0)
        prev = prev0
        for j in range(vt):
            p = p0 + j
            if p < count:
                k, h, v = ks[j], hs[j], vs[j]
                if bads[j] and epoch > 0:
                    _record(status, 0, epoch, base + p)
                if p > 0 and k != prev:
                    head = True
                    agg_has = False
                agg_has, agg = maybe(agg_has, agg, h, v)
                if check_order and epoch > 0 and (p > 0 or base > 0) and k >= 0 and k < prev:
                    _record(status, 1, epoch, base + p)
                prev = k
        carry = scan((head, agg_has, agg))
        # pass 2: finish the runs that end in this thread's items
        first_run = not carry[0]        # no head between the tile's start and here
        run_has = carry[1]
        run = carry[2]
        prev = prev0
        for j in range(vt):
            p = p0 + j
            if p < count:
                k = ks[j]
                if p > 0 and k != prev:
                    first_run = False
                    run_has = False
                run_has, run = maybe(run_has, run, hs[j], vs[j])
                if p == tile_last:
                    end = True
                else:
                    nk = ks[j + 1] if j + 1 < vt else following
                    end = nk != k
                if end:
                    if first_run or p == tile_last:
                        if last:
                            write(out, bits, k, run_has, run)
                        elif first_run and p == tile_last:      # the tile is one run
                            put(pk, pv, ph, 2 * t, k, run_has, run)
                            put(pk, pv, ph, 2 * t + 1, k, False, run)
                        elif first_run:
                            put(pk, pv, ph, 2 * t, k, run_has, run)
                        else:
                            put(pk, pv, ph, 2 * t + 1, k, run_has, run)
                    else:
                        write(out, bits, k, run_has, run)
                prev = k

    return segments


# --- host side -----------------------------------------------------------------------------

#: ``group``: sort the pairs by key first (``radix.group``), then run ``spec``.
Plan = collections.namedtuple("Plan", "spec grid group")


@functools.lru_cache(maxsize=4096)
def plan(op, key_dt, val_dt, out_dt, m, n, device_id, algorithm, deterministic, check, val_source="array",
         transform=None):
    """Check the operator against the output dtype, choose and size the algorithm
    (``val_source``, ``transform``: see :data:`Spec`)."""
    vt_out = ValueType.of(out_dt)
    op.check(vt_out)
    mode = _atomic_mode(op, out_dt)
    # integer hardware atomics are exact in any order; everything else varies with it
    ordered = bool(deterministic) and not (mode == "hw" and out_dt.kind in "iu")
    group = False
    if algorithm is None:
        if ordered or not op.commutative:
            # keys in any order: group them first (a stable sort), then fold each run
            algorithm, group = "sorted", True
        else:
            algorithm = AUTO if op.identity_for(vt_out) is not None else AUTO_NO_IDENTITY
    elif algorithm not in ALGORITHMS:
        raise ValueError("cufold: unknown reduce_by_key algorithm %r; choose from %s"
                         % (algorithm, ", ".join(ALGORITHMS)))
    if algorithm != "sorted":
        if ordered:
            raise ValueError(
                "cufold: algorithm %r updates out in a varying order, so %s results are not "
                "reproducible bit for bit; deterministic=True needs algorithm='sorted' (or None)"
                % (algorithm, out_dt))
        if not op.commutative:
            raise ValueError(
                "cufold: algorithm %r combines values in a varying order and needs a commutative "
                "operator; %s is not declared commutative (cufold.Op(fn, commutative=True)), or use "
                "algorithm='sorted' with keys grouped into runs (e.g. sorted)" % (algorithm, op.name))
    if algorithm in ("block", "table") and op.identity_for(vt_out) is None:
        raise ValueError(
            "cufold: algorithm %r starts its shared table at the operator's identity; %s has "
            "none (cufold.Op(fn, identity=...)): use 'adaptive' or 'warp'" % (algorithm, op.name))
    wide = m > np.iinfo(np.int32).max
    if group:
        key_dt = radix.sort_key_dtype(m)
    if group and val_source != "array":
        raise ValueError("cufold: deterministic=True groups the values by key (a sort), which needs them "
                         "stored; generated values (counting, constant) take integer outputs or "
                         "algorithm='sorted' with grouped keys")
    spec = Spec(algorithm, op, key_dt, val_dt, out_dt, wide or algorithm == "sorted", mode,
                tile_for(algorithm), bool(deterministic and check and not group), val_source, transform)
    if _smem_bytes(spec) > 48 << 10:
        raise ValueError("cufold: a %d-slot shared table of %s needs %d bytes of shared memory, more "
                         "than the 48 KiB a kernel may declare (CUFOLD_BYKEY_TILE)"
                         % (spec.tile.slots, out_dt, _smem_bytes(spec)))
    nt, vt = spec.tile.nt, spec.tile.vt
    tiles = -(-n // (nt * vt * LANE_ITEMS.get(algorithm, 1)))
    if algorithm == "sorted":
        grid = tiles
    elif algorithm == "block":
        grid = max(1, min(tiles, _resident_blocks(device_id, nt, _smem_bytes(spec))))
    else:
        grid = max(1, min(tiles, GRID_CAP))
    return Plan(spec, grid, group)


class _Status:
    """What the kernels report bad keys through, per (device, stream): two device words
    (zeroed once; see ``POS_BITS``) and a flag word in mapped (zero-copy) host memory
    that every recording thread sets to its call's epoch, so that a checked call with
    no bad key costs one stream synchronisation and a host read, no copy. ``kernel``:
    the ``(words, flag)`` pair the kernels take; ``flag_host`` None where mapped memory
    is unavailable (then the flag is device memory and the words are copied back)."""

    __slots__ = ("words", "kernel", "flag_host", "epoch")

    def __init__(self, device_id):
        self.epoch = 0
        with _device_ctx(device_id):
            self.words = _arrays.describe(cuda.to_device(np.zeros(2, np.int64)), "status")
            self.flag_host = None
            try:
                host = cuda.mapped_array(1, np.int64)
                host[0] = 0
                flag = _mapped_arr(host, device_id)
                self.flag_host = host
            except Exception:  # pragma: no cover - no mapped memory: copy the words back
                flag = _arrays.describe(cuda.to_device(np.zeros(1, np.int64)), "status")
        self.kernel = (self.words, flag)

    def flagged(self, epoch):
        """Whether a kernel recorded something for ``epoch`` (after a synchronisation)."""
        if self.flag_host is None:
            return True
        return int(self.flag_host[0]) == epoch


def _mapped_arr(host, device_id):
    """An Arr of a Numba mapped array (its device address; a host ndarray to cufold's
    ``describe``)."""
    if SIMULATOR:
        return _arrays.describe(host, "status")
    ptr = int(host.__cuda_array_interface__["data"][0])
    return _arrays.Arr(ptr, host.shape, (1,), host.dtype, host.size, "numba", host, device_id)


_statuses = {}


def _status(device_id, stream, check):
    """(the status object of this device and stream, epoch): epoch 0 (record nothing)
    unless ``check``."""
    key = (device_id, stream)
    st = _statuses.get(key)
    if st is None or (check and st.epoch >= EPOCH_LIMIT):
        st = _statuses[key] = _Status(device_id)
    if not check:
        return st, 0
    st.epoch += 1
    return st, st.epoch


def _bits_view(a):
    """An integer descriptor of the memory of float placeholder ``a`` (same shape and
    strides): the words the compare-and-swap loop swaps. A view of a placeholder: the
    Program writes its address on every call."""
    return _arrays.Arr(a.ptr, a.shape, a.strides, _BITS[a.itemsize], a.size, a.library, None, a.device_id,
                       a.stream)


def _device_ctx(device_id):
    if SIMULATOR:
        return contextlib.nullcontext()
    return _arrays._numba_ctx(device_id) or contextlib.nullcontext()


def _element(a, i):
    with _device_ctx(a.device_id):
        return _arrays.as_numba(a)[int(i)]


def _raise_errors(st, epoch, keys, m, stream, device_id, sorted_by=None):
    """After a checked call: synchronise; raise for the first bad key it recorded.
    ``sorted_by``: what needs sorted keys (default: ``deterministic=True``)."""
    _readback.synchronize(stream, device_id)
    if not st.flagged(epoch):
        return
    with _device_ctx(device_id):
        got = _arrays.as_numba(st.words).copy_to_host()
    for slot in (0, 1):
        w = int(got[slot])
        if w >> POS_BITS != epoch:
            continue
        pos = POS_MASK - (w & POS_MASK)
        if slot == 0:
            raise IndexError("cufold: key %d at position %d is out of range for out of length %d"
                             % (int(_element(keys, pos)), pos, m))
        if sorted_by is not None:
            raise ValueError("cufold: %s needs keys sorted (non-decreasing); keys[%d] = %d follows keys[%d] = %d. "
                             "Sort keys and values by key first, or pass algorithm=None"
                             % (sorted_by, pos, int(_element(keys, pos)), pos - 1, int(_element(keys, pos - 1))))
        raise ValueError(
            "cufold: deterministic=True needs keys sorted (grouped into runs); keys[%d] = %d follows "
            "keys[%d] = %d. Sort keys and values by key first (a stable sort), or pass "
            "deterministic=False" % (pos, int(_element(keys, pos)), pos - 1, int(_element(keys, pos - 1))))


def _check_1d(a, name):
    if a.ndim != 1:
        raise ValueError("cufold: reduce_by_key_into takes 1-D arrays; %s has shape %s" % (name, a.shape))


def _check_types(key_dt, val_dt, out_dt):
    if key_dt.kind not in "iu":
        raise TypeError("cufold: keys must have an integer dtype (signed or unsigned, any width); got %s"
                        % key_dt)
    if out_dt not in OUT_DTYPES:
        raise TypeError("cufold: out must have a 32- or 64-bit dtype with atomics (%s); got %s"
                        % (", ".join(str(d) for d in OUT_DTYPES), out_dt))
    if val_dt.kind not in "biuf" or not np.can_cast(val_dt, out_dt, casting="same_kind"):
        raise TypeError("cufold: values of dtype %s cannot be accumulated into out of dtype %s "
                        "(NumPy's same_kind casting rule)" % (val_dt, out_dt))


def _plan_key(key, k, v, o, *epoch):
    """The Program of ``reduce_by_key_into`` call signature ``key`` (the arrays' checks first)."""
    op, algorithm, deterministic, check, _, _, _, handle, transform = key
    transform = as_transform(transform)
    for a, name in ((o, "out"), (k, "keys"), (v, "values")):
        _check_1d(a, name)
    if k.size != v.size:
        raise ValueError("cufold: keys and values must be equally long; got %d and %d" % (k.size, v.size))
    _arrays.same_device((o, k) + ((v,) if v.library != "generated" else ()), "reduce_by_key_into's arrays")
    item_dt = v.dtype
    if transform is not None:
        item = transform.result_type(InputType.of(v.dtype, (getattr(v, "source", "array"),)))
        if item.is_tuple:
            raise TypeError("cufold: transform %s returns %s; reduce_by_key_into of one out array takes "
                            "single values" % (transform.name, item))
        item_dt = item.dtype
    _check_types(k.dtype, item_dt, o.dtype)
    return _plan_program(as_op(op), k, v, o, algorithm, bool(deterministic), bool(check), handle, transform)


_bykey_programs = _programs.Programs(_plan_key, "cufold.reduce_by_key_into", 4096)

# Tests and tools change the CUFOLD_BYKEY_* tuning between calls and then forget the
# plans (plan.cache_clear()): the Programs built from them must go too.
_forget_sizes = plan.cache_clear


def _forget_plans():
    _forget_sizes()
    _bykey_programs.clear()


plan.cache_clear = _forget_plans


def reduce_by_key_into(keys, values, out, op=plus, *, algorithm=None, deterministic=False,
                       check=True, stream=None, transform=None):
    """For every ``i``: ``out[keys[i]] = op(out[keys[i]], values[i])``; returns ``out``.

    ``torch.Tensor.index_add_(0, keys, values)`` / ``scatter_reduce_`` and
    ``cupyx.scatter_add(out, keys, values)`` with any cufold operator. ``out`` is
    updated in place, on the stream of ``out``'s library (or ``stream=``).

    Parameters
    ----------
    keys : 1-D CUDA array of any integer dtype (signed or not, 8..64 bits)
    values : 1-D CUDA array as long as ``keys``, of a dtype that casts to ``out``'s
        under NumPy's ``same_kind`` rule (it is cast, then accumulated in ``out``'s dtype);
        or a tuple of such arrays, one per field of a tuple value; or feature rows: a 2-D
        array ``(n, F)`` (any strides) with ``out`` of shape ``(m, F)``, each row reduced
        into ``out[keys[i], :]`` (``cufold.device.rows``: a warp's lanes over a row's
        features, one update per feature per run of equal keys; F = 1 runs the 1-D paths).
        From 32 features and 2^16 rows on, where an update costs a compare-and-swap loop
        (float maxima) or ``out`` is larger than the L2 cache, a kernel looks whether the
        keys are sorted: sorted, the runs update ``out`` atomically; not, the rows are
        grouped by key first (a radix sort of the keys) and each key's rows folded and
        written once. The choice is made on the GPU (no synchronisation)
    out : 1-D CUDA array of int32, uint32, int64, uint64, float32 or float64; or a tuple
        of equally long 1-D arrays, one per field of the operator's value (each must hold
        its value field under NumPy's ``safe`` rule; ``argmin``/``argmax`` into an
        ``out`` pair and ``welford`` into an ``out`` triple take one ``values`` array and
        lift it: ``(values[i], i)``, ``(1, values[i], 0)``). Tuple paths:
        ``cufold.device.bykey_tuple`` (``algorithm=`` one of
        ``cufold.algorithms("reduce_by_key_tuple")``)
    op : cufold.Op or function; must be associative, and commutative except with
        ``algorithm='sorted'``. ``plus``, ``minimum`` and ``maximum`` (NaN propagates as
        in ``np.maximum.at``) use hardware atomics; others a compare-and-swap loop.
    algorithm : one of ``ALGORITHMS`` (``cufold.algorithms("reduce_by_key")``), or None:
        adaptive per warp (see the module doc).
    deterministic : True: the same bits every run for floating point, keys in any order
        (a stable radix sort by key, then the ``sorted`` algorithm: one update per key).
        With ``algorithm='sorted'`` the keys must be grouped into runs already (no sort;
        checked with ``check=True``). Integers are exact in any algorithm.
    check : True: synchronise and raise ``IndexError`` for a key outside
        ``[0, len(out))`` (and ``ValueError`` for keys not grouped under
        ``algorithm='sorted', deterministic=True``).
        False: no synchronisation; bad keys are skipped. Never a write out of bounds.
    transform : a function applied to each value as it is loaded, in the same kernel
        (``out`` accumulates what it returns, cast to ``out``'s dtype under NumPy's
        ``same_kind`` rule). Single values: a function of one value. Feature rows:
        a function of one item, applied to every feature of a row on its own. Tuple
        values: a function of the tuple of items (the ``values`` arrays zipped; one
        item for one array) returning the operator's value, one field per ``out``
        array (a wrong arity raises a TypeError naming the function); no lift then,
        e.g. ``reduce_by_key_into(keys, (x, cufold.counting(n)), (best, at),
        cufold.argmax, transform=lambda v: (abs(v[0]), v[1]))``. ``values`` (or a
        field of tuple values) may be a generated input: ``reduce_by_key_into(keys,
        cufold.counting(len(keys)), first, cufold.minimum)`` finds each key's first
        position.

    Example::

        >>> cells = cupy.asarray([2, 0, 2, 1, 2], dtype=cupy.int32)
        >>> mass = cupy.asarray([1., 2., 3., 4., 5.])
        >>> total = cupy.zeros(3)
        >>> cufold.reduce_by_key_into(cells, mass, total)
        array([2., 4., 9.])
        >>> cufold.reduce_by_key_into(cells, mass, cupy.full(3, -cupy.inf), cufold.maximum)
        array([2., 4., 5.])
        >>> rows = cupy.stack([mass, 10 * mass], axis=1)       # feature rows (5, 2)
        >>> cufold.reduce_by_key_into(cells, rows, cupy.zeros((3, 2)))
        array([[ 2., 20.],
               [ 4., 40.],
               [ 9., 90.]])
        >>> best = (cupy.full(3, -cupy.inf), cupy.full(3, -1))    # the maximum and its position
        >>> cufold.reduce_by_key_into(cells, mass, best, cufold.argmax)
        (array([2., 4., 5.]), array([1, 3, 4]))
        >>> n, mean, m2 = (cupy.zeros(3) for _ in range(3))
        >>> _ = cufold.reduce_by_key_into(cells, mass, (n, mean, m2), cufold.welford)
        >>> mean, m2 / n
        (array([2., 4., 3.]), array([0., 0., 2.66666667]))
    """
    if out.__class__ in _SEQUENCES or values.__class__ in _SEQUENCES:
        return _tuple().reduce_into(keys, values, out, op, algorithm, deterministic, check, stream, transform)
    o = _arrays.describe(out, "out")
    k = _arrays.describe(keys, "keys")
    v = _arrays.describe(values, "values")
    handle = _arrays.stream_handle((o, k, v), stream)
    if v.ndim != 1 or o.ndim != 1:       # feature rows: values (n, F), out (m, F)
        from . import rows
        rows.reduce_by_key_into(k, v, o, op, algorithm, deterministic, check, handle, transform)
        return out
    sig = _programs.signature
    # no stream-ordered allocation (the Program allocates nothing): the handle is enough
    key = (op, algorithm, deterministic, check, sig(k), sig(v), sig(o), handle, transform)
    if check:
        _bykey_programs.run(key, k, v, o, _status(o.device_id, handle, True)[1])
    else:
        _bykey_programs.run(key, k, v, o)
    return out


_SEQUENCES = (tuple, list)


def _tuple():
    from . import bykey_tuple     # imports this module: imported on use
    return bykey_tuple


def _quiet_status(device_id, stream):
    """The status arguments of kernels that record nothing (epoch 0): memory never written,
    from the capture-aware allocator (a call planned inside a CUDA graph's capture)."""
    words = _launch.kept_zeros("bykey quiet status", device_id, stream, 24)
    return words.view(np.int64, (2,), 0), words.view(np.int64, (1,), 16)


def _plan_program(op, keys, values, out, algorithm, deterministic, check, stream, transform=None):
    """The Program of a ``reduce_by_key_into`` signature, called with ``(keys, values,
    out)`` and, when ``check``, the call's epoch (of ``_status``); then it synchronises
    and raises for the bad keys the call's kernels recorded."""
    m, device_id = out.size, out.device_id
    p = plan(op, keys.dtype, values.dtype, out.dtype, m, keys.size, device_id, algorithm, deterministic, check,
             getattr(values, "source", "array"), transform)
    st = _status(device_id, stream, False)[0] if check else None
    b = _programs.Builder(device_id, stream)
    ks, vs, os_ = b.input(keys), b.input(values), b.input(out)
    epoch = b.value(np.int64(0)) if check else np.int64(0)     # 0: record nothing
    if keys.size > 0:
        _launches(b, p, ks, vs, os_, st.kernel if check else _quiet_status(device_id, stream), epoch)
        if check:
            # epochs are drawn from the current status: one renewed (EPOCH_LIMIT) is not st
            where = (device_id, stream)
            b.guard(lambda: _statuses.get(where) is st)
            b.after(lambda arrays, values: _raise_errors(st, values[0], arrays[0], m, stream, device_id))
    return b.build(lambda got: None)


def _launches(b, p, keys, values, out, status, epoch):
    """Add the launches of plan ``p`` on placeholders ``keys``, ``values``, ``out`` (``n >=
    1`` pairs) to Program builder ``b``; ``status``: ``_Status.kernel``; ``epoch``:
    ``np.int64`` (0: record nothing) or a per-call value of ``b``."""
    spec = p.spec
    m = out.size
    bits = _bits_view(out) if spec.mode == "cas" and spec.out_dt.kind == "f" else out
    nt = spec.tile.nt
    offset = 0                    # the workspace's free bytes start here
    if p.group:
        # bad keys are reported (by input position) while grouping; they sort last, as m
        keys, values, offset = radix.group(b, keys, values, m, 0, radix.group_buffers(b, keys, values, m),
                                           status=status, epoch=epoch, on_bad=_record_out_of_range)
        epoch = np.int64(0)
    n64, m64 = np.int64(keys.size), np.int64(m)
    if spec.algorithm != "sorted":
        b.launch(scatter_kernel(spec), ("bykey", spec), p.grid, nt,
                 (keys, values, out, bits, n64, m64, status, epoch))
        return
    tile = nt * spec.tile.vt
    tiles = p.grid
    # Two ping-pong piece buffers of 2 * tiles entries each (int64 keys, values, uint8 flags).
    count = 2 * tiles
    per = [8, spec.out_dt.itemsize, 1]
    sizes = [-(-count * width // 256) * 256 for width in per]
    _, ws = _launch.workspace(b.device_id, b.stream, offset + (2 * sum(sizes) if tiles > 1 else 256))
    bufs = []
    for _ in range(2 if tiles > 1 else 1):
        views = []
        for dt, size in zip((np.int64, spec.out_dt, np.uint8), sizes):
            views.append(ws.view(dt, (max(count, 1),), offset) if tiles > 1 else ws.view(dt, (1,), offset))
            offset += size if tiles > 1 else 0
        bufs.append(views)
    pk, pv, ph = bufs[0]
    b.launch(sorted_kernel(spec, True), ("bykey-sorted0", spec), tiles, nt,
             (keys, values, ph, out, bits, n64, m64, status, epoch, pk, pv, ph, np.bool_(tiles == 1)))
    level = 0
    length = count
    while tiles > 1:
        src = bufs[level % 2]
        dst = bufs[(level + 1) % 2]
        tiles = -(-length // tile)
        b.launch(sorted_kernel(spec, False), ("bykey-sorted", spec), tiles, nt,
                 (src[0], src[1], src[2], out, bits, np.int64(length), m64, status, np.int64(0),
                  dst[0], dst[1], dst[2], np.bool_(tiles == 1)))
        length = 2 * tiles
        level += 1


def run(p, keys, values, out, status, epoch, stream):
    """Launch plan ``p`` once on Arr descriptors, with no checks and no error report (a
    Program made for this call): for tests and tools that alter a plan by hand.
    ``status``: ``_Status.kernel``; ``epoch``: 0 records nothing."""
    b = _programs.Builder(out.device_id, stream)
    _launches(b, p, b.input(keys), b.input(values), b.input(out), status, np.int64(epoch))
    b.build(lambda got: None)(keys, values, out)
