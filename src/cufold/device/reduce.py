"""Device-wide reduce: every algorithm of the seeds, one kernel factory.

A tile is ``NT`` threads x ``VT`` items. Each thread folds its items in
registers (register blocking, seed 002), the block folds the threads
(``cufold.block.reduce``), and the algorithms differ only in how the blocks'
partials meet:

===============  =====================================================  =========
name             how blocks meet                                         launches
===============  =====================================================  =========
``single_pass``  partials in a workspace, a counter + fence elects the  1
                 last block, which folds them (seed 003; no atomics on
                 the data, deterministic)
``two_pass``     grid-stride partials, then one block folds them        2
                 (seed 000's deviceReduce)
``tiles``        one tile per block, host recursion until one tile      log_NV(n)
                 remains (seed 002's Reduce)
``single_block`` one block loops over everything (seed 002's small-     1
                 input latency path)
``atomic_warp``  warp shuffle reduce, lane 0 atomics into the result    2
                 (seed 000)
``atomic_block`` block reduce, thread 0 atomics into the result         2
                 (seed 000)
===============  =====================================================  =========

The atomic algorithms need an operator with a hardware atomic for the
result dtype; for floating point they are not bitwise reproducible, so they
run only when asked for by name with ``deterministic=False``.

Commutative operators load tiles in strided order (coalesced) and may
accumulate across the grid in any order; non-commutative ones load each
thread's items in blocked order and fold every tile in sequence (each block
owns a contiguous range of tiles), so the result is the ordered fold.
"""

import collections
import functools
import os

import numpy as np
from numba import config, cuda

from .. import _codegen, block
from ..host import arrays as _arrays, dispatch as _dispatch, launch as _launch
from ..host.launch import Tile, fill

#: The last block folds at most this many partials per thread (bounds the grid).
PARTIALS_PER_THREAD = 8
#: Read 4-byte inputs 8 bytes a load where aligned (``CUFOLD_WIDE_LOADS=0``: never).
WIDE_LOADS = os.environ.get("CUFOLD_WIDE_LOADS", "1") != "0"
#: Tuple inputs of at most this many 4-byte fields read 8 bytes a load too (a dot product's
#: ``(x, y)``); ``CUFOLD_WIDE_FIELDS=0``: never (for measuring).
WIDE_FIELDS = int(os.environ.get("CUFOLD_WIDE_FIELDS", "4"))
#: Cache hint of the 8-byte loads: "plain" (``ld.global``), or "cs", "cg", "ca" for
#: ``cuda.ldcs`` (evict first), ``ldcg`` (L2 only), ``ldca``, or "l2_128", "l2_256" for plain
#: loads with L2's 128- or 256-byte prefetch (``quads.load8_l2_*``) (``CUFOLD_REDUCE_LOAD``,
#: for study).
WIDE_LOAD_HINT = os.environ.get("CUFOLD_REDUCE_LOAD", "plain")

ALGORITHMS = ("single_pass", "two_pass", "tiles", "single_block", "atomic_warp", "atomic_block")
_dispatch.register("reduce", ALGORITHMS)
_ATOMIC_DTYPES = {np.dtype(t) for t in (np.int32, np.uint32, np.int64, np.uint64, np.float32, np.float64)}



#: 4-byte sums (and min, max...) of inputs so large that every resident block gets
#: LARGE_TILE_SHARE tiles or more (so they share the tiles evenly to 1/16) take 256 x 32
#: tiles: 2^28 float32 sums on an H200 ran 0.4-1.0% faster than at 128 x 32 in three
#: of three alternating runs (241.0-241.4 against 242.6-243.8 us; 2^24 was 0.4 us
#: slower, hence the bound); mean/var was 1.5% slower (bench/results/tune-H200-20261121s5).
LARGE_TILE = Tile(256, 32)
LARGE_TILE_SHARE = 16
#: Threads per SM that reduce kernels with a transform are compiled for (``launch_bounds``).
TRANSFORM_THREADS_PER_SM = 1024
#: ... and retiled argmin/argmax over runs (``Spec.retile``), which take 3 blocks of 256 an SM
#: unbounded: 4 at 64 registers, no spills. H200, argmax of (8192, 8192).T, us: 69.4 -> 68.3
#: (bench axes: 0.88 -> 0.92 of the floor). The rising runs (x[::2]) lost under the same
#: bound (39.3 -> 53.9) and keep none. ``CUFOLD_RETILE_THREADS=0``: no bound.
RETILE_THREADS_PER_SM = int(os.environ.get("CUFOLD_RETILE_THREADS", "1024"))


def tile_for(in_vt, acc_vt, lift="value", n=None, device_id=0):
    """Threads per block and items per thread for this input, accumulator and
    lift (what an item becomes: ``"index"`` for argmin/argmax), and, where
    given, the input's length ``n`` on GPU ``device_id`` (``LARGE_TILE``).

    ``CUFOLD_TILE=NTxVT`` overrides (for study). The simulator uses tiny
    tiles, so that small test inputs still cross tile and block boundaries.
    """
    forced = os.environ.get("CUFOLD_TILE")
    if forced:
        nt, vt = (int(v) for v in forced.lower().split("x"))
        return Tile(nt, vt)
    if config.ENABLE_CUDASIM:
        return Tile(64, 2)
    # 128 x 32 measured best for 4-byte inputs on an H200 (sum and mean/var at 2^28).
    # argmax/argmin at 2^28: 256 x 16 is 1.01x torch on an H100, where 128 x 32 is
    # 0.92x, and within 1% of 128 x 32 on an H200 (bench/results/tune-H100-20261121).
    size = max(in_vt.itemsize, 1)
    if lift == "index" and size <= 4:
        return Tile(256, 16)
    nv = LARGE_TILE.nt * LARGE_TILE.vt
    if (lift == "value" and size == 4 and not in_vt.is_tuple and n is not None
            and n >= LARGE_TILE_SHARE * _resident_blocks(device_id, LARGE_TILE.nt) * nv):
        return LARGE_TILE
    return Tile(128, 32 if size <= 4 else (16 if size <= 8 else 8))


@functools.lru_cache(maxsize=None)
def _resident_blocks(device_id, nt):
    if config.ENABLE_CUDASIM:
        return 4
    sms = _launch.sm_count(device_id)
    return sms * max(1, 2048 // nt)


# --- lifts: input item and index -> accumulator value ----------------------------------

def _lift_value(x, i):
    return x


def _lift_index(x, i):
    return (x, i)


def _lift_pair(x, i):
    return (x, x)


def _lift_welford(x, i):
    return (1.0, x, 0.0)


def _lift_count(x, i):
    return (1.0, x)


LIFTS = {"value": _lift_value, "index": _lift_index, "pair": _lift_pair, "welford": _lift_welford,
         "count": _lift_count}
#: Lifts of means: their reduction of nothing is NaN (NumPy's mean of an empty slice).
NAN_WHEN_EMPTY = ("welford", "count")


@functools.lru_cache(maxsize=None)
def _lift(kind, acc_vt):
    return _codegen.build("def lift(x, i):\n    return cast(f(x, i))\n", "lift",
                          {"cast": acc_vt.cast, "f": _codegen.device(LIFTS[kind])})


# --- projections: accumulator value -> result -------------------------------------------

def _project_value(v, ddof):
    return v


def _project_index(v, ddof):
    return v[1]


def _project_mean(v, ddof):
    return v[1]


def _project_count_mean(v, ddof):
    return v[1] / v[0]


def _project_var(v, ddof):
    return v[2] / (v[0] - ddof)


def _project_mean_var(v, ddof):
    return (v[1], v[2] / (v[0] - ddof))


PROJECTIONS = {"value": _project_value, "index": _project_index, "mean": _project_mean,
               "count_mean": _project_count_mean,
               "var": _project_var, "mean_var": _project_mean_var}


@functools.lru_cache(maxsize=None)
def _project(kind, ddof, out_vt, post=None, per_launch=False):
    """Device function: accumulator value -> result; with ``post`` (``(Transform,
    type before it)``), the projection cast to that type, then the post-map.

    ``per_launch``: ``project(v, extra)``, ``extra`` an accumulator value fixed per launch.
    Kind ``"sum_mean"`` (per launch only) is a mean as a one-field sum times ``extra``,
    the reciprocal of the items per output (known when the launch is planned, so no count
    travels with the sum: half the registers and partial bytes of ``"count_mean"``'s
    pair; a multiply, where a float64 division is a dozen FP64 instructions an output,
    within one float64 rounding of the quotient); the other kinds ignore it."""
    if kind == "sum_mean" and not per_launch:
        raise ValueError("cufold: projection 'sum_mean' needs its per-launch count")
    value = "v * extra" if kind == "sum_mean" else "f(v, ddof)"
    env = {"cast": out_vt.cast, "f": _codegen.device(PROJECTIONS.get(kind, _project_value)), "ddof": ddof}
    body = "cast(%s)" % value
    if post is not None:
        fn, mid_vt = post
        env.update(mid=mid_vt.cast, post=fn.device(mid_vt))
        body = "cast(post(mid(%s)))" % value
    return _codegen.build("def project(%s):\n    return %s\n" % ("v, extra" if per_launch else "v", body),
                          "project", env)


def project_of(spec, per_launch=False):
    """The projection (and post-map) of a reduction's Spec: ``project(v)``, or with
    ``per_launch`` ``project(v, extra)`` (see :func:`_project`)."""
    return _project(spec.project, spec.ddof, spec.out_vt, spec.post, per_launch)


@functools.lru_cache(maxsize=None)
def fill_projected_kernel(acc_vt, out_vt, post):
    """Kernel ``(outs, count, value)``: ``outs[:count] = post(value)`` (``value`` an
    accumulator value, grid-stride): an empty reduction's results where a post-map applies."""
    store, cast, project = out_vt.store, acc_vt.cast, _project("value", 0, out_vt, post)

    def fill_projected(outs, count, value):
        k = np.int64(cuda.grid(1))
        while k < count:
            store(outs, k, project(cast(value)))
            k += cuda.gridsize(1)

    return fill_projected


def fill_projected(b, acc_vt, out_vt, post, outs, count, value):
    """``launch.fill`` of accumulator value ``value`` through the projection and post-map
    ``post`` (``Spec.post``): the results of empty reductions with a post-map."""
    nt = min(256, 32 * -(-count // 32)) or 32
    b.launch(fill_projected_kernel(acc_vt, out_vt, post), ("fill_projected", acc_vt, out_vt, post),
             max(1, min(-(-count // nt), 1024)), nt, (outs, np.int64(count), acc_vt.make(value)))


# --- the kernel factory --------------------------------------------------------------

Spec = collections.namedtuple(
    "Spec", "op in_vt acc_vt out_vt lift project ddof tile finish block_algorithm ordered wide hint "
    "transform post rising runs retile", defaults=(False, "plain", None, None, False, 0, False))
# wide: the input is read 8 bytes (two 4-byte items) per load, with cache hint ``hint``;
# see _fold_tile_wide. transform: None or an ops.Transform of in_vt's items, applied to
# each item as it is loaded (fused: the lift sees its result). post: None or
# (ops.Transform, the result type before it), applied to each result (project_of).
# rising: a thread's fold takes its items in rising index order, so for argmin/argmax an
# item never wins a tie against the state (_RISING_UPDATES); combines of states keep the op's.
# runs: 0, or the input is a view of equally long contiguous runs (``x[::2]``) over this many
# outer dimensions, read as one flat window of memory whose tiles are laid along each run
# (reduce_kernel's ``geometry``); commutative operators only, whose indices (argmin/argmax)
# rise with position, unless retile.
# retile (runs of argmin/argmax only): indices rise along each run (by the run's index
# stride) but not from run to run (x.T read in memory order): a thread folds each tile
# afresh, its items' indices their positions in the run, then turns the tile's state's index
# into the C-order one and merges it with the op's combine, which breaks ties by index.


# --- the thread's accumulation protocol -------------------------------------------------
# A thread folds its items through (start, update, finish): by default start is
# the lift and update combines, but Welford's per-item division would make the
# thread loop compute-bound, so a thread keeps shifted sums (n, K, sum(x-K),
# sum((x-K)^2)) and turns them into (n, mean, M2) once, before the block merges
# with Chan's formula.

@functools.lru_cache(maxsize=None)
def _protocol(spec):
    start, update, finish = _protocol_items(spec._replace(transform=None, post=None, wide=False, hint="plain"))
    if spec.transform is None:
        return start, update, finish
    # The transform applies to every item as the thread takes it in: fused, no pass of its own.
    env = {"tf": spec.transform.device(spec.in_vt), "start0": start, "update0": update}
    start = _codegen.build("def start(x, i):\n    return start0(tf(x), i)\n", "start", env)
    update = _codegen.build("def update(s, x, i):\n    return update0(s, tf(x), i)\n", "update", env)
    return start, update, finish


def _argmax_rising(s, x):
    # x's index is above the state's: x wins by a larger value only, or as the first NaN
    # (& and |, not and/or: predicates, where short-circuits compiled to a branch an item)
    return (x > s[0]) | ((x != x) & (s[0] == s[0]))


def _argmin_rising(s, x):
    return (x < s[0]) | ((x != x) & (s[0] == s[0]))


#: argmin/argmax's update where items come in rising index order (``Spec.rising``): the
#: general combine tests both sides for NaN and breaks ties by index (int64 compares and
#: two-register selects): ncu counted 26.7 instructions an item in argmax rows where the
#: sum runs 7.6 (H200, y.argmax(axis=2)), issue-bound at half the bandwidth.
_RISING_UPDATES = {"argmax": _argmax_rising, "argmin": _argmin_rising}


def _rising_update(spec):
    """``update(s, x, i)`` of ``spec`` (index lift, rising), or None where its operator has none."""
    from .. import ops
    wins = _RISING_UPDATES.get(spec.op.name) if spec.op in (ops.argmax, ops.argmin) else None
    if wins is None:
        return None
    return _codegen.build("def update(s, x, i):\n    return lift(x, i) if wins(s, x) else s\n", "update",
                          {"wins": _codegen.device(wins), "lift": _lift("index", spec.acc_vt)})


@functools.lru_cache(maxsize=None)
def _protocol_items(spec):
    acc_vt = spec.acc_vt
    if spec.rising and spec.lift == "index":
        update = _rising_update(spec)
        if update is not None:
            return _lift("index", acc_vt), update, _codegen.build("def finish(s):\n    return s\n", "finish")
    if spec.lift == "welford":
        t = acc_vt.fields[0].type
        env = {"T": t}
        start = _codegen.build("def start(x, i):\n    return (T(1), T(x), T(0), T(0))\n", "start", env)
        update = _codegen.build(
            "def update(s, x, i):\n    d = T(x) - s[1]\n    return (s[0] + T(1), s[1], s[2] + d, s[3] + d * d)\n",
            "update", env)
        finish = _codegen.build(
            "def finish(s):\n    q = s[2] / s[0]\n    return (s[0], s[1] + q, s[3] - s[2] * q)\n", "finish", env)
        return start, update, finish
    if spec.lift == "compensated":
        # float32 items summed into a float64 accumulator (a mean): converting every item
        # to float64 costs more issue slots than the load it follows, so a thread keeps a
        # compensated float32 sum (Kahan: three more float32 adds an item; its error stays
        # near one float32 rounding of the thread's total however many items it folds) and
        # converts once, at its end.
        env = {"T": spec.in_vt.fields[0].type, "A": acc_vt.fields[0].type}
        start = _codegen.build("def start(x, i):\n    return (x, T(0))\n", "start", env)
        update = _codegen.build("def update(s, x, i):\n    y = x - s[1]\n    t = s[0] + y\n"
                                "    return (t, (t - s[0]) - y)\n", "update", env)
        finish = _codegen.build("def finish(s):\n    return A(s[0]) - A(s[1])\n", "finish", env)
        return start, update, finish
    combine = spec.op.combine(acc_vt)
    lift = _lift(spec.lift, acc_vt)
    start = lift
    update = _codegen.build("def update(s, x, i):\n    return combine(s, lift(x, i))\n", "update",
                            {"combine": combine, "lift": lift})
    finish = _codegen.build("def finish(s):\n    return s\n", "finish")
    return start, update, finish


@functools.lru_cache(maxsize=None)
def _fold_tile(spec):
    """Device function ``(state, have, xs, n, base, tid, shift) -> (state, have)``: fold
    this thread's items of one tile (from position ``base``; ``n``: the end of the run it
    lies in) into its state; an item's index is its position + ``shift`` (0 but in runs).

    A tile's VT loads are all issued before the first combine (generated,
    unrolled code), so they are in flight together whatever branches the
    operator has. In the last, partial tile the loads past the end read the
    last item instead and are not combined: one round trip to memory, not VT
    (a small input is one partial tile, and this its whole latency). ``have``
    says whether ``state`` holds a value yet, so no identity is needed.
    """
    if spec.wide:
        return _fold_tile_wide(spec)
    nt, vt = spec.tile
    nv = nt * vt
    step = 1 if spec.ordered else nt   # blocked order keeps a thread's items adjacent
    span = vt if spec.ordered else 1
    start, update, _ = _protocol(spec)
    load = spec.in_vt.load
    # (``first`` the thread's first position, ``at`` its first item's index: the same but in
    # the runs of a view, where the index is the C-order one)
    lines = ["def fold_full(state, have, xs, first, at):"]
    lines += ["    x%d = load(xs, first + %d)" % (k, k * step) for k in range(vt)]
    # (argmin/argmax take the rising update here, Spec.rising: their tiles' items come in
    # index order. Before it, folding a tile as a tree of combines gained 2%, H200.)
    lines += ["    state = update(state, x0, at) if have else start(x0, at)"]
    # two items a call site (each costs Numba's typing; see _guarded)
    lines += ["    state = update_two(state, x%d, at + %d, x%d, at + %d)" % (k, k * step, k + 1, (k + 1) * step)
              for k in range(1, vt - 1, 2)]
    lines += ["    state = update(state, x%d, at + %d)" % (k, k * step) for k in range(1 + (vt - 1) // 2 * 2, vt)]
    lines += ["    return state"]
    env = {"load": load, "start": start, "update": update, "update_two": _codegen.build(
        "def update_two(state, x, i, y, j):\n    return update(update(state, x, i), y, j)\n", "update_two",
        {"update": update})}
    fold_full = _codegen.build("\n".join(lines) + "\n", "fold_full", env)
    # Indices grow with k: item k is in range only if item 0 is, so only item 0 needs
    # `have` (one start call site, not VT: a fifth of a first call's compile, and fewer branches).
    lines = ["def fold_part(state, have, xs, first, n, at):", "    last = n - 1"]
    lines += ["    x%d = load_upto(xs, first + %d, last)" % (k, k * step) for k in range(vt)]
    lines += ["    if first < n:",
              "        state = update(state, x0, at) if have else start(x0, at)",
              "        have = True"]
    # (a call an item, not a branch: see _guarded)
    lines += ["    state = update_if(first + %d, n, state, x%d, at + %d)" % (k * step, k, k * step)
              for k in range(1, vt)]
    lines += ["    return state, have"]
    env["update_if"] = _guarded(update, 2)
    env["load_upto"] = _codegen.build("def load_upto(xs, i, last):\n    return load(xs, min(i, last))\n", "load_upto",
                                      {"load": load})
    fold_part = _codegen.build("\n".join(lines) + "\n", "fold_part", env)

    @cuda.jit(device=True)
    def fold_tile(state, have, xs, n, base, tid, shift):
        first = base + tid * span
        if base + nv <= n:  # a full tile: no bounds checks
            return fold_full(state, have, xs, first, first + shift), True
        return fold_part(state, have, xs, first, n, first + shift)

    return fold_tile


def _guarded(fn, arity):
    """Device function ``(i, n, state, a_1 .. a_arity) -> state``: ``fn(state, a_1 ..
    a_arity)`` where ``i < n``, else ``state`` (an item past the end of a partial tile or
    range). A generated fold calls it an item where it had a branch an item: Numba's passes
    cost grows with a function's blocks (a user's operator compiles at its first call:
    the partial tile's fold took 0.43 s of 1.3), and NVVM inlines it back into the same code."""
    args = ", ".join("a%d" % k for k in range(arity))
    return _codegen.build("def guarded(i, n, state, %s):\n    if i < n:\n        return fn(state, %s)\n"
                          "    return state\n" % (args, args), "guarded", {"fn": fn})


def _pairs_fold_tile(fold_full, fold_part, nvp):
    """``fold_tile`` over pairs: ``fold_full`` where the tile's ``nvp`` pairs are all
    there, ``fold_part`` (bounds-checked) at the end."""

    # (``shift``, the index offset, is unused: pairs are never read for argmin/argmax, see plan)
    @cuda.jit(device=True)
    def fold_tile(state, have, pairs, n, base, tid, shift):
        first = base + tid
        if base + nvp <= n:
            return fold_full(state, have, pairs, first), True
        return fold_part(state, have, pairs, first, n)

    return fold_tile


def _fold_tile_wide(spec):
    """``_fold_tile`` over pairs: ``pairs`` is the input as 8-byte words (two
    4-byte items each, the lower first), ``n`` the number of pairs and ``base``
    a pair index; a tile is ``nt x vt`` items, ``vt / 2`` loads per thread.
    A float32 sum at 2^28 reads ~5% faster this way on an H100 (the loads,
    not the arithmetic, set the pace; Numba issues no 16-byte loads).
    Tuple inputs of 4-byte fields (zipped arrays: a dot product's ``(x, y)``)
    read each field's pairs: ``pairs`` is then a tuple of word arrays."""
    if spec.in_vt.is_tuple:
        return _fold_tile_wide_fields(spec)
    nt, vt = spec.tile
    half = vt // 2
    start, update, _ = _protocol(spec)
    # cuda.ld* cast the index to a signed intp (Numba's negative-index wraparound
    # follows unless the sign bit is known clear)
    get = ("def get(pairs, i):\n    return pairs[i]\n" if spec.hint == "plain" else
           "def get(pairs, i):\n    return load8(pairs, i)\n" if spec.hint.startswith("l2_") else
           "def get(pairs, i):\n    return cuda.ld%s(pairs, np.uint64(i) & SIGN_CLEAR)\n" % spec.hint)
    env = {"start": start, "update": update}
    from .. import quads
    env["get"] = _codegen.build(get, "get", {"SIGN_CLEAR": np.uint64(0x7FFFFFFFFFFFFFFF),
                                             "load8": getattr(quads, "load8_" + spec.hint, None)})
    # One device function splits a pair: each `.view` call site costs Numba ~2 ms to type.
    env["halves"] = _codegen.build(
        "def halves(p):\n    return np.uint32(p & LOW).view(DT), np.uint32(p >> SHIFT).view(DT)\n", "halves",
        {"DT": spec.in_vt.fields[0].type, "LOW": np.uint64(0xFFFFFFFF), "SHIFT": np.uint64(32)})
    split = "    lo%d, hi%d = halves(p%d)"
    # A device function folds a pair (one call site a pair, not three: see _guarded).
    env["pair_in"] = _codegen.build(
        "def pair_in(state, p, j):\n    lo, hi = halves(p)\n"
        "    return update(update(state, lo, 2 * j), hi, 2 * j + 1)\n",
        "pair_in", {"update": update, "halves": env["halves"]})
    lines = ["def fold_full(state, have, pairs, first):"]
    lines += ["    p%d = get(pairs, first + %d)" % (k, k * nt) for k in range(half)]
    lines += [split % (0, 0, 0),
              "    state = update(state, lo0, 2 * first) if have else start(lo0, 2 * first)",
              "    state = update(state, hi0, 2 * first + 1)"]
    lines += ["    state = pair_in(state, p%d, first + %d)" % (k, k * nt) for k in range(1, half)]
    lines += ["    return state"]
    fold_full = _codegen.build("\n".join(lines) + "\n", "fold_full", env)
    # the partial tile: every load issued (past the end: the last pair, not combined)
    # (as in _fold_tile: only pair 0 needs `have`)
    lines = ["def fold_part(state, have, pairs, first, n):", "    last = n - 1"]
    lines += ["    p%d = get(pairs, min(first + %d, last))" % (k, k * nt) for k in range(half)]
    lines += ["    if first < n:", "    " + split % (0, 0, 0),
              "        state = update(state, lo0, 2 * first) if have else start(lo0, 2 * first)",
              "        state = update(state, hi0, 2 * first + 1)",
              "        have = True"]
    # (a call a pair, not a branch: see _guarded)
    lines += ["    state = pair_if(first + %d, n, state, p%d, first + %d)" % (k * nt, k, k * nt)
              for k in range(1, half)]
    lines += ["    return state, have"]
    env["pair_if"] = _guarded(env["pair_in"], 2)
    fold_part = _codegen.build("\n".join(lines) + "\n", "fold_part", env)
    return _pairs_fold_tile(fold_full, fold_part, nt * half)


def _fold_tile_wide_fields(spec):
    """``_fold_tile_wide`` of a tuple input: every field read as 8-byte words, each
    word split into its two items, the fields' lower items making the first value."""
    nt, vt = spec.tile
    half = vt // 2
    arity = spec.in_vt.arity
    start, update, _ = _protocol(spec)
    env = {"start": start, "update": update}
    for f, dt in enumerate(spec.in_vt.fields):
        env["halves%d" % f] = _codegen.build(
            "def halves(p):\n    return np.uint32(p & LOW).view(DT), np.uint32(p >> SHIFT).view(DT)\n", "halves",
            {"DT": dt.type, "LOW": np.uint64(0xFFFFFFFF), "SHIFT": np.uint64(32)})

    def value(part, k):
        return "(%s,)" % ", ".join("%s%d_%d" % (part, k, f) for f in range(arity))

    def split(k, pad):
        return [pad + "lo%d_%d, hi%d_%d = halves%d(p%d_%d)" % (k, f, k, f, f, k, f) for f in range(arity)]

    lines = ["def fold_full(state, have, pairs, first):"]
    lines += ["    p%d_%d = pairs[%d][first + %d]" % (k, f, f, k * nt) for k in range(half) for f in range(arity)]
    for k in range(half):
        lines += split(k, "    ")
        i = "2 * (first + %d)" % (k * nt)
        lines += ["    state = update(state, %s, %s) if have else start(%s, %s)" % (value("lo", 0), i, value("lo", 0), i)
                  if k == 0 else "    state = update(state, %s, %s)" % (value("lo", k), i)]
        lines += ["    state = update(state, %s, %s + 1)" % (value("hi", k), i)]
    lines += ["    return state"]
    fold_full = _codegen.build("\n".join(lines) + "\n", "fold_full", env)
    lines = ["def fold_part(state, have, pairs, first, n):", "    last = n - 1"]
    lines += ["    p%d_%d = pairs[%d][min(first + %d, last)]" % (k, f, f, k * nt)
              for k in range(half) for f in range(arity)]
    for k in range(half):
        i = "2 * (first + %d)" % (k * nt)
        lines += ["    if first + %d < n:" % (k * nt)]
        lines += split(k, "        ")
        if k == 0:
            lines += ["        state = update(state, %s, %s) if have else start(%s, %s)"
                      % (value("lo", 0), i, value("lo", 0), i), "        have = True"]
        else:
            lines += ["        state = update(state, %s, %s)" % (value("lo", k), i)]
        lines += ["        state = update(state, %s, %s + 1)" % (value("hi", k), i)]
    lines += ["    return state, have"]
    fold_part = _codegen.build("\n".join(lines) + "\n", "fold_part", env)
    return _pairs_fold_tile(fold_full, fold_part, nt * half)


@functools.lru_cache(maxsize=None)
def _reads(wide, arity=0):
    """Device function ``(xs, n) -> (array, length)``: what ``_fold_tile`` reads,
    the items themselves or (wide) the first ``n - n % 2`` of them as 8-byte pairs
    (``arity`` > 0: a tuple input of that many fields, each viewed so)."""
    if wide and arity:
        words = ", ".join("xs[%d][:n - (n & 1)].view(np.uint64)" % f for f in range(arity))
        return _codegen.build("def reads(xs, n):\n    return (%s,), n >> 1\n" % words, "reads")
    if wide:
        return _codegen.build("def reads(xs, n):\n    return xs[:n - (n & 1)].view(np.uint64), n >> 1\n",
                              "reads")
    return _codegen.build("def reads(xs, n):\n    return xs, n\n", "reads")


@functools.lru_cache(maxsize=None)
def _fold_range(op, vt):
    """Device function: fold ``arrays[lo:hi]`` in order, for ``0 < hi - lo <=
    PARTIALS_PER_THREAD``. The loads are unrolled and issued together (the
    last block's fold of the partials is pure latency otherwise)."""
    k = PARTIALS_PER_THREAD
    lines = ["def fold_range(arrays, lo, hi):", "    last = hi - 1"]
    lines += ["    x%d = load(arrays, min(lo + %d, last))" % (i, i) for i in range(k)]
    lines += ["    acc = x0"]
    lines += ["    acc = combine_if(lo + %d, hi, acc, x%d)" % (i, i) for i in range(1, k)]
    lines += ["    return acc"]
    return _codegen.build("\n".join(lines) + "\n", "fold_range",
                          {"load": vt.load, "combine_if": _guarded(op.combine(vt), 1)})


@functools.lru_cache(maxsize=None)
def _atomic(op_atomic):
    src = "def atomic(out, v):\n    cuda.atomic.%s(out, 0, v)\n" % op_atomic
    return _codegen.build(src, "atomic")


@functools.lru_cache(maxsize=None)
def reduce_kernel(spec):
    """The Python kernel function for ``spec`` (compiled by the launch path).

    Arguments: ``(xs, n, partials, counter, out, init, has_init)``; where ``spec.runs``,
    ``xs`` is the flat window of memory the view covers and ``n`` its *geometry* (every
    field int64; positions in pairs where ``spec.wide``): ``(origin, length, tiles_per_run,
    tiles, index_origin, extent, shape, strides, index_strides, run_index_stride)``: the
    position of run 0's first item, the runs' length, their tiles, that item's C-order index,
    the window's items, the outer dimensions' lengths, strides and index strides
    (``spec.runs`` of each, outer to inner), and the index step along a run (1 unless
    ``spec.retile``). Run ``r``'s tiles are tiles
    ``r * tiles_per_run ..``: a tile never straddles two runs, so its loads are the
    contiguous reduce's own.
    """
    nt, vt = spec.tile
    nv = nt * vt
    wide = spec.wide
    per_tile = nv // 2 if wide else nv   # what fold_tile reads per tile: pairs (wide) or items
    reads = _reads(wide, spec.in_vt.arity if spec.in_vt.is_tuple else 0)
    span = vt if spec.ordered else 1
    ordered = spec.ordered
    finish = spec.finish
    combine = spec.op.combine(spec.acc_vt)
    fold_tile = _fold_tile(spec)
    start, update, finish_state = _protocol(spec)
    load = spec.in_vt.load
    block_reduce = block.reduce(spec.op, spec.acc_vt, nt, algorithm=spec.block_algorithm, partial=True)
    fold_partials = _fold_range(spec.op, spec.acc_vt)
    store_acc, load_acc = spec.acc_vt.store, spec.acc_vt.load
    store_out = spec.out_vt.store
    project = project_of(spec)
    is_atomic = finish in ("atomic_warp", "atomic_block")
    warp_reduce = None
    atomic = None
    if is_atomic:
        atomic = _atomic(spec.op.atomic)
        from .. import warp
        warp_reduce = warp.partial_reduce(spec.op, spec.acc_vt)
    runs = spec.runs
    retile = spec.retile
    lift_index = _lift("index", spec.acc_vt) if retile else None

    @cuda.jit(device=True)
    def run_tile(geometry, r, j):
        """Tile ``j`` of run ``r``: (its first position, the end of its run, the index
        shift: an item's C-order index is its position plus this)."""
        origin, length, _, _, index_origin, _, shape, strides, index_strides, _ = geometry
        start = origin
        at = index_origin
        if runs == 1:          # (x[::2]: no division a tile)
            start += r * strides[0]
            at += r * index_strides[0]
        else:
            q = r
            for k in range(runs - 1, -1, -1):
                c = q % shape[k]
                q //= shape[k]
                start += c * strides[k]
                at += c * index_strides[k]
        return start + j * per_tile, start + length, at - start

    @cuda.jit(device=True)
    def threads_with_items(n, base):
        # Threads holding a value after the first tile: a prefix of the block.
        left = n - base
        return min(nt, (left + span - 1) // span) if left > 0 else 0

    # Inlined: a device function holding shared memory (block_reduce) must be
    # reached along one call path only, or Numba links its shared array twice.
    @cuda.jit(device=True, inline="always")
    def block_total(xs, n, tid):
        """Fold this block's share; the result is valid on thread 0."""
        block_id = cuda.blockIdx.x
        grid = cuda.gridDim.x
        acc = start(load(xs, 0), 0)  # any state of the right type; not counted until `have`
        if runs:
            # Grid-stride over the runs' tiles, (run, tile) stepped without a division.
            src, _ = reads(xs, n[5])
            per_run, tiles = n[2], n[3]
            step_r = grid // per_run
            step_j = grid - step_r * per_run
            r = block_id // per_run
            j = block_id - r * per_run
            have = np.bool_(False)
            valid = 0
            for _ in range(block_id, tiles, grid):
                base, end, shift = run_tile(n, r, j)
                # (a run's last tile may be partial, and a later tile full: the threads
                # holding a value are the widest tile's prefix)
                valid = max(valid, threads_with_items(end, base))
                if retile:
                    # the tile afresh, its indices positions in the run, then C-order and merged
                    run_start = end - n[1]
                    got, mine = fold_tile(acc, np.bool_(False), src, end, base, tid, -run_start)
                    if mine:     # (the tile's first index in C order, plus its step along the run)
                        got = lift_index(got[0], shift + run_start + got[1] * n[9])
                        acc = combine(acc, got) if have else got
                        have = np.bool_(True)
                else:
                    acc, have = fold_tile(acc, have, src, end, base, tid, shift)
                r += step_r
                j += step_j
                if j >= per_run:
                    j -= per_run
                    r += 1
            return block_reduce(finish_state(acc), max(valid, 1))
        shift = np.int64(0)     # (positions are indices)
        if not ordered:
            # Grid-stride over tiles of what fold_tile reads: items, or (wide) pairs.
            src, count = reads(xs, n)
            have = np.bool_(False)  # a bool: Literal[bool](False) would compile fold_tile a second time
            base = block_id * per_tile
            valid = threads_with_items(count, base)
            while base < count:
                acc, have = fold_tile(acc, have, src, count, base, tid, shift)
                base += grid * per_tile
            if wide and n & 1 and tid == 0 and block_id == ((n - 1) // nv) % grid:
                # The odd last item, left out of the pairs, goes to thread 0 of the
                # block owning its tile (which may hold no pair: n = k * nv + 1).
                x = load(xs, n - 1)
                acc = update(acc, x, n - 1) if have else start(x, n - 1)
            return block_reduce(finish_state(acc), max(valid, 1))
        # Ordered: this block owns tiles [t0, t1) and folds them in sequence.
        tiles = (n + nv - 1) // nv
        per_block = (tiles + grid - 1) // grid
        t0 = block_id * per_block
        t1 = min(tiles, t0 + per_block)
        running = finish_state(acc)
        for t in range(t0, t1):
            base = t * nv
            acc, have = fold_tile(acc, False, xs, n, base, tid, shift)
            tile_total = block_reduce(finish_state(acc), max(threads_with_items(n, base), 1))
            running = tile_total if t == t0 else combine(running, tile_total)
        return running

    @cuda.jit(device=True)
    def write_result(out, total, init, has_init):
        if has_init:
            total = combine(init, total)
        store_out(out, 0, project(total))

    def kernel(xs, n, partials, counter, out, init, has_init):
        tid = cuda.threadIdx.x
        block_id = cuda.blockIdx.x
        if finish == "atomic_warp":
            # Seed 000's warp atomics: no shared memory, one atomic per warp.
            acc = start(load(xs, 0), 0)
            have = np.bool_(False)  # (as in block_total)
            base = block_id * nv
            valid = threads_with_items(n, base)
            while base < n:
                acc, have = fold_tile(acc, have, xs, n, base, tid, np.int64(0))
                base += cuda.gridDim.x * nv
            lanes = min(max(valid - (tid - cuda.laneid), 0), 32)
            total = warp_reduce(finish_state(acc), max(lanes, 1))
            if cuda.laneid == 0 and lanes > 0:
                atomic(out, total)
            return
        total = block_total(xs, n, tid)  # the host gives every block at least one tile
        if finish == "atomic_block":
            if tid == 0:
                atomic(out, total)
        elif finish == "final":
            if tid == 0:
                write_result(out, total, init, has_init)
        elif finish == "partials":
            if tid == 0:
                store_acc(partials, block_id, total)
        else:  # "last_block": seed 003's cross-block reduce without atomics on the data
            if tid == 0:
                store_acc(partials, block_id, total)
                cuda.threadfence()
                ticket = cuda.atomic.add(counter, 0, 1)
                last = 1 if ticket == cuda.gridDim.x - 1 else 0
            else:
                last = 0
            if cuda.syncthreads_or(last):
                cuda.threadfence()
                grid = cuda.gridDim.x
                chunk = (grid + nt - 1) // nt
                lo = min(tid * chunk, grid)
                hi = min(lo + chunk, grid)
                mine = fold_partials(partials, lo, hi) if lo < hi else load_acc(partials, 0)
                final = block_reduce(mine, max((grid + chunk - 1) // chunk, 1))
                if tid == 0:
                    write_result(out, final, init, has_init)
                    counter[0] = 0  # ready for the next launch on this stream

    # Without link-time optimisation: NVVM makes the PTX once and ptxas compiles it, where
    # LTO runs NVVM twice and optimises again at link time. A user's operator then compiles
    # in 2.2-2.3 s instead of 3.2-3.3 (first call, H200 host), and the kernel runs the same
    # (sum, argmax, mean_var, float32 and int32, 2^16..2^28: within 0.3%). Scans lost 5% at
    # 2^28 without it and keep it.
    kernel.jit_options = {"lto": False}
    if spec.transform is not None and not spec.acc_vt.is_tuple:
        # A transform's registers are the user's: at 70 (v * v on 256 x 32 float32 tiles)
        # 3 blocks of 256 fit an SM, so the grid, sized by whole rounds of blocks, runs
        # 2.67 rounds: 4.7% below the plain sum on an H200. Capped at 64, 4 blocks fit
        # (the plain sum's own count) with no spills (ptxas, sm_90).
        kernel.jit_options["launch_bounds"] = (nt, max(1, TRANSFORM_THREADS_PER_SM // nt))
    elif retile and RETILE_THREADS_PER_SM:
        kernel.jit_options["launch_bounds"] = (nt, max(1, RETILE_THREADS_PER_SM // nt))
    return kernel


# --- host side -------------------------------------------------------------------------

class Plan:
    """What one reduction will launch (made once per argument set by :func:`plan`,
    so it hashes by identity, cheaply)."""

    __slots__ = ("spec", "grid", "algorithm", "wide", "__weakref__")

    def __init__(self, spec, grid, algorithm, wide=None):
        self.spec, self.grid, self.algorithm = spec, grid, algorithm
        self.wide = wide      # the same reduction reading 8 bytes a load, or None (see for_input)

    def for_input(self, xs):
        """This plan, or its wide twin where ``xs`` (an Arr, or a tuple of them) allows
        8-byte loads: contiguous, 1-D, 8-byte aligned."""
        w = self.wide
        if w is None:
            return self
        for a in (xs if xs.__class__ is tuple else (xs,)):
            if a.__class__ is not _arrays.Arr or a.ptr & 7 or a.ndim != 1 or not a.c_contiguous:
                return self
        return w


def tile_override():
    """The ``CUFOLD_TILE`` override (raw), or None."""
    return _launch.knob("CUFOLD_TILE")


def plan(op, in_vt, acc_vt, out_vt, n, device_id, algorithm, lift="value", project="value",
         ddof=0, deterministic=True, transform=None, post=None, runs=None):
    """Choose and validate the algorithm, and size the grid (cached per call
    shape and per ``CUFOLD_TILE`` override, which tests change). ``transform`` and
    ``post``: see :data:`Spec`. ``runs``: None, or ``(outer dimensions, length)`` of a
    view of ``n`` items in contiguous runs (:func:`reduce_kernel`'s geometry): for
    commutative operators, whose C-order indices rise with position (:data:`Spec`);
    ``(outer dimensions, length, True)``: argmin/argmax whose indices rise along each run
    only (``Spec.retile``)."""
    return _plan(op, in_vt, acc_vt, out_vt, n, device_id, algorithm, lift, project, ddof, deterministic,
                 tile_override(), transform, post, runs)


@functools.lru_cache(maxsize=4096)
def _plan(op, in_vt, acc_vt, out_vt, n, device_id, algorithm, lift, project, ddof, deterministic, forced_tile,
          transform=None, post=None, runs=None):
    if algorithm is None:
        algorithm = _dispatch.choose_reduce(n, tile_for(acc_vt, acc_vt))
    elif algorithm not in ALGORITHMS:
        raise ValueError("cufold: unknown reduce algorithm %r; choose from %s"
                         % (algorithm, ", ".join(ALGORITHMS)))
    if algorithm.startswith("atomic"):
        _check_atomic(op, acc_vt, out_vt, deterministic, algorithm)
    tile = tile_for(in_vt, acc_vt, lift, n, device_id)
    nv = tile.nt * tile.vt
    tiles = -(-n // nv) if runs is None else n // runs[1] * -(-runs[1] // nv)
    ordered = not op.commutative
    if runs is not None and ordered:
        raise ValueError("cufold: the reduce over runs takes commutative operators only")
    retile = runs is not None and len(runs) > 2 and runs[2]
    if retile and lift != "index":
        raise ValueError("cufold: runs folded a tile at a time are for argmin/argmax")
    if algorithm in ("single_block",):
        grid = 1
    elif algorithm == "tiles":
        grid = tiles
    else:
        grid = min(tiles, _resident_blocks(device_id, tile.nt))
        if algorithm in ("single_pass", "two_pass"):
            grid = min(grid, tile.nt * PARTIALS_PER_THREAD)
    if ordered and grid > 1:
        per_block = -(-tiles // grid)
        grid = -(-tiles // per_block)  # every block owns at least one tile
    finish = {"single_pass": "last_block", "two_pass": "partials", "tiles": "partials",
              "single_block": "final", "atomic_warp": "atomic_warp",
              "atomic_block": "atomic_block"}[algorithm]
    if grid == 1 and finish in ("partials", "last_block"):
        finish = "final"
    # (a thread's items, tile by tile, come in rising position, and positions are the indices)
    spec = Spec(op, in_vt, acc_vt, out_vt, lift, project, ddof, tile, finish, "warp", ordered,
                transform=transform, post=post, rising=lift == "index", runs=0 if runs is None else runs[0],
                retile=bool(retile))
    wide = None
    # Not for argmin/argmax: 8-byte loads made them 9% slower on an H200 (1% faster on an H100).
    if (WIDE_LOADS and not ordered and all(f.itemsize == 4 and f.kind in "iuf" for f in in_vt.fields)
            and (not in_vt.is_tuple or in_vt.arity <= WIDE_FIELDS) and getattr(in_vt, "sources", None) is None
            and tile.vt % 2 == 0 and lift != "index" and n >= nv and finish in ("final", "partials", "last_block")):
        wide = Plan(spec._replace(wide=True, hint=WIDE_LOAD_HINT), grid, algorithm)
    return Plan(spec, grid, algorithm, wide)


def _check_atomic(op, acc_vt, out_vt, deterministic, algorithm):
    if op.atomic is None or acc_vt.is_tuple or acc_vt != out_vt or acc_vt.dtype not in _ATOMIC_DTYPES:
        raise ValueError(
            "cufold: algorithm %r needs an operator with a hardware atomic (plus, minimum, maximum, bit "
            "ops) on int32/uint32/int64/uint64/float32/float64 results; %s on %s has none"
            % (algorithm, op.name, acc_vt))
    if acc_vt.dtype.kind == "f" and op.name == "plus" and deterministic:
        raise ValueError(
            "cufold: floating-point atomic sums are not bitwise reproducible; pass "
            "deterministic=False to use %r" % algorithm)


_workspaces = _launch.BoundedCache(1024)


def _workspace(device_id, stream, acc_vt, count):
    key = (device_id, stream, acc_vt, count)
    got = _workspaces.get(key)
    return got if got is not None else _workspaces.put(key, _make_workspace(device_id, stream, acc_vt, count))


def _make_workspace(device_id, stream, acc_vt, count):
    """Per-(device, stream) scratch: ``count`` accumulator values per field, plus
    the zeroed arrival counter of the last-block reduction (the last block resets
    it, so it is zero before every launch)."""
    counter = _launch.kept_zeros("reduce counter", device_id, stream, 4).view(np.uint32, (1,), 0)
    nbytes = sum(-(-count * f.itemsize // 16) * 16 for f in acc_vt.fields)
    _, ws = _launch.workspace(device_id, stream, max(nbytes, 16))
    views, offset = [], 0
    for f in acc_vt.fields:
        views.append(ws.view(f, (count,), offset))
        offset += -(-count * f.itemsize // 16) * 16
    return (tuple(views) if acc_vt.is_tuple else views[0]), counter


def _fields(vt, arrs):
    return tuple(arrs) if vt.is_tuple else arrs[0]


def run(b, plan_, xs, n, outs, init):
    """Add a plan's launches to Program builder ``b`` (``host.programs``): ``xs`` the
    input Arr(s), ``outs`` 1-element Arr(s) of the result; for a plan of runs, ``n`` is
    their geometry and ``plan_`` the variant (wide or not) it was made in."""
    if not plan_.spec.runs:
        plan_ = plan_.for_input(xs)
    spec, grid = plan_.spec, plan_.grid
    acc_vt, nt = spec.acc_vt, spec.tile.nt
    has_init = init is not None
    init_value = acc_vt.make(init) if has_init else _zero(acc_vt)
    partial_count = grid if spec.finish in ("partials", "last_block") else 1
    partials, counter = _workspace(b.device_id, b.stream, acc_vt, max(partial_count, 1))
    if partial_count > 1 and not spec.ordered:
        # One round: at most the blocks the GPU holds at once. The plan assumes full
        # occupancy (2048 threads an SM); a kernel that fits fewer (mean's 78 registers: 6
        # blocks of 128 where 16 were planned) would run a second, partial round of blocks
        # that each fold as many tiles as the first round's, most SMs idle in it.
        slots = b.resident(reduce_kernel(spec), ("reduce", spec),
                           (xs, n, partials, counter, outs, init_value, has_init), nt)
        grid = min(grid, slots or grid)
        if grid != partial_count:
            partial_count = grid
            partials, counter = _workspace(b.device_id, b.stream, acc_vt, grid)
    if spec.finish in ("atomic_warp", "atomic_block"):
        start = init_value if has_init else spec.op.identity_for(acc_vt)
        fill(b, spec.out_vt, outs, 1, start)
    b.launch(reduce_kernel(spec), ("reduce", spec), grid, nt, (xs, n, partials, counter, outs, init_value, has_init))
    if spec.finish != "partials":
        return
    # Partials, then fold them again: once more for two_pass (one block), recursively for tiles.
    again = plan(spec.op, acc_vt, acc_vt, spec.out_vt, grid, b.device_id,
                 "single_block" if plan_.algorithm == "two_pass" else plan_.algorithm,
                 project=spec.project, ddof=spec.ddof, post=spec.post)
    if again.grid > 1:
        # Fold into a second scratch area behind the first (tiles recursion).
        run(b, again, _copy_partials(b, acc_vt, partials, grid), grid, outs, init)
        return
    b.launch(reduce_kernel(again.spec), ("reduce", again.spec), 1, again.spec.tile.nt,
             (partials, grid, partials, counter, outs, init_value, has_init))


_spare = {}


def _copy_partials(b, acc_vt, partials, count):
    """The tiles recursion reads level k while writing level k+1: give level k its
    own buffer (bounded by n / tile, allocated once per size class)."""
    key = (b.device_id, b.stream, acc_vt, count.bit_length())
    arrs = _spare.get(key)
    if arrs is None:
        cap = 1 << count.bit_length()
        arrs = _spare[key] = tuple(_launch.zeros(b.device_id, b.stream, cap * f.itemsize).view(f, (cap,), 0)
                                   for f in acc_vt.fields)
    fields = partials if acc_vt.is_tuple else (partials,)
    dst = tuple(a.view(a.dtype, (count,), 0) for a in arrs)
    b.launch(_copy_kernel(acc_vt), ("copy", acc_vt), -(-count // 256), 256,
             (_fields(acc_vt, fields), _fields(acc_vt, dst), count))
    return _fields(acc_vt, dst)


@functools.lru_cache(maxsize=None)
def _copy_kernel(vt):
    load, store = vt.load, vt.store

    def copy(src, dst, n):
        i = cuda.grid(1)
        if i < n:
            store(dst, i, load(src, i))

    return copy


@functools.lru_cache(maxsize=None)
def _zero(vt):
    return vt.make(tuple(0 for _ in vt.fields) if vt.is_tuple else 0)
