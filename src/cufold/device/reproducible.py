"""Sums reproducible on any GPU: ``deterministic="gpu_to_gpu"`` (CUB's name).

``cufold.sum(x, deterministic="gpu_to_gpu")`` (and ``mean``, ``reduce`` with
``plus``, ``segmented_reduce`` with ``plus``, any of them with ``transform=``, and
``dot``, ``vdot``, ``norm``) returns the same bits for any
launch configuration (tile, grid), any GPU model, any order of the items and
any split of the input into pieces whose partial *states* are combined later
(:func:`sum_state`, :func:`combine_states`, :func:`finalise`: the multi-GPU
path). ``deterministic=True`` keeps its meaning (the same bits run to run on
one GPU and configuration); integer sums are exact, so reproducible anyway.

Algorithm: binned summation (Demmel and Nguyen; ReproBLAS's binned numbers)
============================================================================

The exponent axis is cut into *bins* at fixed positions: bin ``k`` holds
multiples of ``u_k = 2^g_k``, ``g_k = k W - G`` (raised to the dtype's
smallest subnormal), ``W`` = 18 bits for float32 data, 30 for float64. A
*frame* ``T`` is a function of a maximum ``|x|`` only (the smallest ``T`` with
``|x| < u_{T+1} / 2``, from its exponent field). An item ``x`` is split, in
frame ``T``, into ``K = 3`` slices ``q_T, q_{T-1}, q_{T-2}``: ``q_T`` is ``x``
rounded to nearest-even on ``u_T``'s grid and each next slice the remainder
rounded on the next grid (Rump's error-free extraction: ``t = x + sigma_k``,
``q = t - sigma_k``, ``r = x - q`` with a constant ``sigma_k = 1.5 * 2^(p-1) *
u_k``; a fixed sigma makes each slice a function of ``x`` alone, ties
included). What is below bin ``T-2`` is dropped. A slice is an integer
number of its bin's units, at most ``2^(W-1)`` in magnitude, so the *state*

    ``(T, S_T, S_{T-1}, S_{T-2}, specials)``

with ``S_k`` the exact int64 sum of the items' slices in bin ``k`` does not
depend on the order in which items are added. A higher frame only adds
zero slices above the old top (``|x| < u_{T+1} / 2`` rounds to 0 there) and
drops bins at the bottom, so two states combine exactly by aligning both
to the larger frame (dropping what falls below) and adding the bin sums:
the combination is exactly associative and commutative, and the final
state is that of the frame of the global maximum, whatever the split.

Per thread, a tile of ``VT`` items is loaded, its maximum ``|x|`` moves the
thread's frame up where needed (rare), and each item is deposited into
three float accumulators started at ``sigma_k`` (exact for ``2^(p-1-W)``
deposits: 32 float32 items per tile, so ``VT <= 32``), which are then
flushed into the int64 bin sums by integer subtraction of their bit
patterns. 11 float operations per item (``fma`` where the top bins are
scaled by ``2^-64`` / ``2^-512`` to keep ``sigma`` finite): the float32 sum
stays memory-bound. Threads, the block (``cufold.block.reduce`` with the
state-merging operator :data:`MERGE`) and the grid (the last block folds
the blocks' states, as the ``single_pass`` reduce) combine states.

The result is ``S_T u_T + S_{T-1} u_{T-1} + S_{T-2} u_{T-2}`` (carried to
canonical digits in integers, the lower two in ``[0, 2^W)``, then added in
float64, top down, and rounded to the result dtype): a function of the
state alone.

Error bound
-----------
With ``M = max |x_i|`` and ``n`` items, ``|result - sum(x)| <= n * 2^(1-2W) *
M + rounding of the result``: each item loses at most half a unit of bin
``T-2``, and ``u_{T-2} <= 2^(1-2W) M`` (the frame's top bin holds ``M``).
float32 data: ``n * 2^-35 * M``, plus the float64 combination (exact below
2^36 items) and one rounding to float32: within ~1 ulp of the binned sum.
float64 data: ``n * 2^-59 * M``, plus ~2 ulp of float64 (the final
combination of the bins rounds twice). NaN in any item gives NaN; +inf and
-inf give NaN together and themselves alone (IEEE, which is order free); a
finite sum beyond the dtype's range gives +-inf. A state absorbs up to
``2^(64-W)`` items (2^46 float32, 2^34 float64) before its int64 bins could
overflow: larger sums raise.

Which kernel runs when
----------------------
* whole-array sums and means of contiguous float16/float32 (binned as
  float32) and float64 arrays, and means of integer arrays (binned as float64:
  each item converts exactly up to 2^53): one kernel, grid-stride over tiles
  of ``NT x VT`` items (``256 x 32`` float32, read 8 bytes a load where the
  input is 8-byte aligned; ``128 x 16`` float64), as many blocks as surely fit
  on the GPU at once (:data:`REGISTERS`), the last block to arrive folds the
  blocks' states and writes the result (or the state, for :func:`sum_state`).
  One pass, no atomics on data, no host sync.
* ``segmented_reduce(..., deterministic="gpu_to_gpu")``: a warp per segment
  (grid-stride over segments), lanes fold the segment's tiles, a warp
  reduction of states, lane 0 writes; balanced for segments of similar
  length (one warp walks a long segment alone).
* fused items (``transform=`` on ``sum``/``mean``/``reduce(plus)``/
  ``segmented_reduce``; ``dot``, ``vdot``, ``norm``): the same kernels, each item
  ``F(transform(load(xs, i)))`` (:func:`items_of`: zipped tuple inputs, generated
  fields computed from the index), the transform's result binned as its own dtype
  (float16/float32 as float32, float64 as float64). The state is the binned sum of the
  transformed items, so the bound above holds with ``M`` the largest ``|transform(x)|``
  (a dot product: ``|x_i y_i|``, each product rounded once to the accumulator dtype,
  as the plain dot's). The sum is then as reproducible as the transform's results
  are: single IEEE operations (``*``, ``/``, ``abs``, ``sqrt``; the shortcuts' transforms)
  round the same everywhere; libdevice functions (``exp``, ``pow``) are the same code on
  every model; ``a * b + c`` may be contracted into an ``fma`` by NVVM (alike for every
  target in practice, but a compiler's choice: the simulator's and NumPy's references
  round it twice). ``post=`` maps the finished value (``norm``'s ``sqrt``);
  ``norm(ord=inf/-inf)`` and other min/max reductions are exact in any order and run
  the ordinary kernels. Always 4-byte loads of fused items (never ``wide``).
* ``axis=``, ``keepdims``, non-contiguous views, ``init=``: not supported
  (a clear error).
"""

import collections
import functools
import math
import os

import numpy as np
from numba import config, cuda

from .. import _codegen, block, warp
from ..ops import Op, as_transform
from ..values import InputType, ValueType
from ..host import arrays as _arrays, launch as _launch, programs as _programs
from ..host.launch import Tile
from . import reduce as _reduce_mod

__all__ = ["sum_state", "combine_states", "finalise", "binning", "STATE_WORDS", "MERGE", "sum_plan",
           "host_state", "host_combine", "host_finalise"]

SIMULATOR = bool(config.ENABLE_CUDASIM)
#: Read float32 items 8 bytes a load where aligned (as the plain sum), by default? The 8-byte
#: kernel takes 94 registers (2 blocks of 256 per SM), the 4-byte one 80 (3 blocks): 4-byte
#: loads until measured (bench ``reproducible`` times both; ``CUFOLD_REPRO_WIDE=1`` switches).
WIDE_LOADS = os.environ.get("CUFOLD_REPRO_WIDE", "0") == "1"
K = 3                  # bins kept per state
STATE_WORDS = 5        # a state as int64 words: frame, three bin sums, the specials' sum (float64 bits)
STATE_VT = ValueType.of((np.int64, np.int64, np.int64, np.int64, np.float64))

Binning = collections.namedtuple(
    "Binning", "dtype F I mant bias width offset sub scale_at scale deposits floor_frame max_items")


@functools.lru_cache(maxsize=None)
def binning(dtype):
    """The bin layout for items of ``dtype`` (float32 or float64): see the module doc."""
    dt = np.dtype(dtype)
    if dt == np.float32:
        F, Int, mant, bias, emin, width, scale_at, scale = np.float32, np.int32, 23, 127, -126, 18, 40, 64
    elif dt == np.float64:
        F, Int, mant, bias, emin, width, scale_at, scale = np.float64, np.int64, 52, 1023, -1022, 30, 512, 512
    else:
        raise TypeError("cufold: reproducible sums bin float32 or float64 items, not %s" % dt)
    sub = emin - mant                                   # exponent of the smallest subnormal
    offset = width * (math.ceil(-sub / width) + K)      # bin 0 lies below every frame's lowest bin
    frame = (1 - bias + 2 + offset + width - 1) // width - 1   # the frame of |x| = 0 (exponent field 1)
    assert frame - K + 1 >= 0
    return Binning(dt, F, Int, mant, bias, width, offset, sub, scale_at, scale, 1 << (mant - width), frame,
                   1 << (64 - width))


def frame_of(bn, biased_exponent):
    """The frame of a maximum |x| whose exponent field is ``biased_exponent`` (host)."""
    e = max(biased_exponent, 1) - bn.bias
    return (e + 2 + bn.offset + bn.width - 1) // bn.width - 1


def bin_exponent(bn, k):
    """``g_k``: bin ``k`` holds multiples of ``2^g_k`` (host)."""
    return max(k * bn.width - bn.offset, bn.sub)


# --- device pieces ------------------------------------------------------------------------------

@cuda.jit(device=True)
def _shift(s0, s1, s2, d):
    """Bin sums (top first) moved ``d >= 0`` frames up: what falls below the third bin is dropped."""
    z = np.int64(0)
    if d == 0:
        return s0, s1, s2
    if d == 1:
        return z, s0, s1
    if d == 2:
        return z, z, s0
    return z, z, z


def _merge(a, b):
    t = max(a[0], b[0])
    a0, a1, a2 = _shift(a[1], a[2], a[3], t - a[0])
    b0, b1, b2 = _shift(b[1], b[2], b[3], t - b[0])
    return (t, a0 + b0, a1 + b1, a2 + b2, a[4] + b[4])


#: The state-combining operator (exactly associative and commutative): align to the
#: larger frame, add the bin sums and the specials.
MERGE = Op(_merge, identity=(0, 0, 0, 0, 0.0), commutative=True, name="binned_merge")


@functools.lru_cache(maxsize=None)
def _consts(bn):
    """Device function ``k -> (sigma, scale, 1/scale)`` of bin ``k``."""
    src = """
def consts(k):
    g = k * W - OFFSET
    if g < SUB:
        g = SUB
    sc = SCALE if g > SCALE_AT else 0
    sigma = I(((MANT + g - sc + BIAS) << MANT) | HALF).view(F)
    s = I((BIAS - sc) << MANT).view(F)
    inv = I((BIAS + sc) << MANT).view(F)
    return sigma, s, inv
"""
    return _codegen.build(src, "consts", _env(bn))


def _env(bn):
    return {"W": np.int64(bn.width), "OFFSET": np.int64(bn.offset), "SUB": np.int64(bn.sub),
            "SCALE": np.int64(bn.scale), "SCALE_AT": np.int64(bn.scale_at), "MANT": np.int64(bn.mant),
            "BIAS": np.int64(bn.bias), "HALF": np.int64(1 << (bn.mant - 1)), "F": bn.F, "I": bn.I,
            "EXP": bn.I((1 << (8 * bn.dtype.itemsize - 1 - bn.mant)) - 1), "ZERO": bn.F(0),
            "FLOOR": np.int64(bn.floor_frame), "MANT_I": bn.I(bn.mant)}


@functools.lru_cache(maxsize=None)
def _bits(bn):
    return _codegen.build("def bits(v):\n    return F(v).view(I)\n", "bits", _env(bn))


@functools.lru_cache(maxsize=None)
def _frame(bn):
    """Device function: the frame of a maximum ``|x|`` (``m >= 0``, finite or inf)."""
    env = _env(bn)
    env["bits"] = _bits(bn)
    # num // W by a multiply and a shift (a 64-bit division is a long subroutine), checked
    # here for every exponent field
    lo = 1 - bn.bias + 2 + bn.offset + bn.width - 1
    hi = (1 << (8 * bn.dtype.itemsize - 1 - bn.mant)) - 1 - bn.bias + 2 + bn.offset + bn.width - 1
    magic = (1 << 20) // bn.width + 1
    assert lo > 0 and all((v * magic) >> 20 == v // bn.width for v in range(lo, hi + 1))
    env["MAGIC"] = np.int64(magic)
    src = """
def frame(m):
    e = np.int64((bits(m) >> MANT_I) & EXP)
    if e < 1:
        e = np.int64(1)
    return ((e - BIAS + 2 + OFFSET + W - 1) * MAGIC >> 20) - 1
"""
    return _codegen.build(src, "frame", env)


@functools.lru_cache(maxsize=None)
def _fold_tile(bn, item, nt, vt, wide=False):
    """Device function ``(st, xs, pairs, base, hi, tid) -> st``: deposit this thread's
    items ``base + j * nt + tid < hi`` (``j < vt``) of one tile into its state
    ``st = (frame, S0, S1, S2, specials, sigma0, s0, inv0, sigma1, ..., inv2)``.
    ``wide``: a full tile is read as 8-byte pairs of 4-byte items (``pairs``, the
    input as uint64 words; thread ``tid`` takes pairs ``base / 2 + tid + k * nt``),
    the order of the items being free."""
    if vt > bn.deposits:
        raise ValueError("cufold: a reproducible tile holds at most %d items per thread" % bn.deposits)
    env = _env(bn)
    env.update(item=item, frame=_frame(bn), consts=_consts(bn), shift=_shift, bits=_bits(bn))
    lines = ["def fold_tile(st, xs, pairs, base, hi, tid):",
             "    T, S0, S1, S2, sp, g0, s0, v0, g1, s1, v1, g2, s2, v2 = st",
             "    first = base + tid",
             "    if base + %d <= hi:" % (nt * vt)]
    if wide:
        env["halves"] = _codegen.build(
            "def halves(p):\n    return np.uint32(p & LOW).view(F), np.uint32(p >> SHIFT).view(F)\n", "halves",
            {"F": bn.F, "LOW": np.uint64(0xFFFFFFFF), "SHIFT": np.uint64(32)})
        lines += ["        pair = np.uint64((base >> 1) + tid)"]
        lines += ["        x%d, x%d = halves(pairs[pair + np.uint64(%d)])" % (2 * k, 2 * k + 1, k * nt)
                  for k in range(vt // 2)]
    else:
        lines += ["        x%d = F(item(xs, first + %d))" % (j, j * nt) for j in range(vt)]
    lines += ["    else:", "        last = hi - 1"]
    for j in range(vt):
        lines += ["        x%d = F(item(xs, min(first + %d, last)))" % (j, j * nt),
                  "        if first + %d >= hi:" % (j * nt), "            x%d = ZERO" % j]
    # the tile's maximum |x| (a comparison keeps NaN out: it never raises the frame)
    lines += ["    m = ZERO"]
    for j in range(vt):
        lines += ["    a%d = abs(x%d)" % (j, j), "    m = a%d if a%d > m else m" % (j, j)]
    lines += ["    Tn = frame(m)",
              "    if Tn > T:",
              "        S0, S1, S2 = shift(S0, S1, S2, Tn - T)",
              "        T = Tn",
              "        g0, s0, v0 = consts(T)",
              "        g1, s1, v1 = consts(T - 1)",
              "        g2, s2, v2 = consts(T - 2)",
              "    A0 = g0", "    A1 = g1", "    A2 = g2"]
    for j in range(vt):
        lines += ["    t = cuda.fma(x%d, s0, g0)" % j, "    q = t - g0", "    r = cuda.fma(q, -v0, x%d)" % j,
                  "    A0 += q",
                  "    t = cuda.fma(r, s1, g1)", "    q = t - g1", "    r = cuda.fma(q, -v1, r)", "    A1 += q",
                  "    t = cuda.fma(r, s2, g2)", "    A2 += t - g2"]
    # flush: the accumulators' bit patterns minus sigma's count units (exact at both binade edges)
    lines += ["    b0 = bits(A0)",
              "    if (b0 >> MANT_I) & EXP == EXP:",
              "        sp += np.float64(A0)",
              "    S0 += np.int64(b0 - bits(g0))",
              "    S1 += np.int64(bits(A1) - bits(g1))",
              "    S2 += np.int64(bits(A2) - bits(g2))",
              "    return (T, S0, S1, S2, sp, g0, s0, v0, g1, s1, v1, g2, s2, v2)"]
    return _codegen.build("\n".join(lines) + "\n", "fold_tile", env)


@functools.lru_cache(maxsize=None)
def _initial(bn):
    """Device function ``() -> st``: the thread state of no items (the frame of zero)."""
    env = _env(bn)
    env["consts"] = _consts(bn)
    src = """
def initial():
    g0, s0, v0 = consts(FLOOR)
    g1, s1, v1 = consts(FLOOR - 1)
    g2, s2, v2 = consts(FLOOR - 2)
    z = np.int64(0)
    return (FLOOR, z, z, z, np.float64(0.0), g0, s0, v0, g1, s1, v1, g2, s2, v2)
"""
    return _codegen.build(src, "initial", env)


@functools.lru_cache(maxsize=None)
def _pow2():
    """Device function ``e -> 2.0 ** e`` (float64) for ``-1022 <= e <= 1023``."""
    return _codegen.build("def pow2(e):\n    return np.int64((e + 1023) << 52).view(np.float64)\n", "pow2")


@functools.lru_cache(maxsize=None)
def _finalise(bn):
    """Device function ``state -> float64``: the state's value (see :func:`host_finalise`)."""
    env = _env(bn)
    env["pow2"] = _pow2()
    env["gexp"] = _codegen.build("def gexp(k):\n    g = k * W - OFFSET\n    return g if g > SUB else SUB\n",
                                 "gexp", env)
    src = """
def finalise(st):
    T, S0, S1, S2, sp = st
    if sp != 0.0 or sp != sp:
        return sp
    e0 = gexp(T)
    e1 = gexp(T - 1)
    e2 = gexp(T - 2)
    d = e1 - e2
    c = S2 >> d
    S2 -= c << d
    S1 += c
    d = e0 - e1
    c = S1 >> d
    S1 -= c << d
    S0 += c
    # canonical digits: S1, S2 in [0, 2^W); each term below is exact, two roundings
    v = (np.float64(S0) * pow2(e0 - e2) + np.float64(S1 << (e1 - e2))) + np.float64(S2)
    h = e2 >> 1
    return v * pow2(h) * pow2(e2 - h)
"""
    return _codegen.build(src, "finalise", env)


def _load_item(xs, i):
    return xs[np.uint64(i)]     # unsigned: no negative-index wraparound code per load


@functools.lru_cache(maxsize=None)
def _plain_item():
    return _codegen.device(_load_item)


Spec = collections.namedtuple("Spec", "dtype item tile finish out_dtype wide post", defaults=(False, None))
# finish: "sum", "mean", "sqrt" (the value, divided by n, its square root) or "state";
# post: None or (ops.Transform, the dtype it is given): applied to the finished value
# (``post=``: the result's dtype is the post-map's, ``out_dtype``)


@functools.lru_cache(maxsize=None)
def _store_result(bn, finish, out_dtype, post=None):
    env = _env(bn)
    env.update(finalise=_finalise(bn), OUT=np.dtype(out_dtype).type if out_dtype is not None else None,
               math=math)
    if post is not None:
        fn, mid = post
        env.update(MID=np.dtype(mid).type, post=fn.device(ValueType.of(mid)))
    if finish == "state":
        src = """
def store_result(total, out, n):
    sp = total[4]
    special = sp != 0.0 or sp != sp
    z = np.int64(0)
    out[0] = total[0]
    out[1] = z if special else total[1]
    out[2] = z if special else total[2]
    out[3] = z if special else total[3]
    out[4] = np.float64(sp).view(np.int64)
"""
    else:
        value = {"sum": "v", "mean": "v / np.float64(n)", "sqrt": "math.sqrt(v)"}[finish]
        if post is not None:        # the post-map sees the value in its own dtype, as the plain reduce's
            value = "post(MID(%s))" % value
        src = "def store_result(total, out, n):\n    v = finalise(total)\n    out[0] = OUT(%s)\n" % value
    return _codegen.build(src, "store_result", env)


@functools.lru_cache(maxsize=None)
def sum_kernel(spec):
    """Kernel ``(xs, n, partials, counter, out)``: the binned sum of ``item(xs, i)``,
    ``i < n``; ``out`` gets the result (one element) or the state (5 int64 words)."""
    bn = binning(spec.dtype)
    nt, vt = spec.tile
    nv = nt * vt
    wide = spec.wide
    fold_tile = _fold_tile(bn, spec.item, nt, vt, wide)
    reads = _reduce_mod._reads(wide)      # the input as 8-byte pairs (wide), or itself
    initial = _initial(bn)
    block_reduce = block.reduce(MERGE, STATE_VT, nt)
    merge = MERGE.combine(STATE_VT)
    load_state, store_state = STATE_VT.load, STATE_VT.store
    store_result = _store_result(bn, spec.finish, spec.out_dtype, spec.post)

    def kernel(xs, n, partials, counter, out):
        tid = cuda.threadIdx.x
        grid = cuda.gridDim.x
        st = initial()
        pairs, _ = reads(xs, n)
        base = np.int64(cuda.blockIdx.x) * nv
        while base < n:
            st = fold_tile(st, xs, pairs, base, n, tid)
            base += np.int64(grid) * nv
        total = block_reduce((st[0], st[1], st[2], st[3], st[4]))
        if grid == 1:
            if tid == 0:
                store_result(total, out, n)
            return
        last = 0
        if tid == 0:
            store_state(partials, cuda.blockIdx.x, total)
            cuda.threadfence()
            ticket = cuda.atomic.add(counter, 0, 1)
            last = 1 if ticket == grid - 1 else 0
        if cuda.syncthreads_or(last):
            cuda.threadfence()
            st0 = initial()
            acc = (st0[0], st0[1], st0[2], st0[3], st0[4])
            j = tid
            while j < grid:
                acc = merge(acc, load_state(partials, j))
                j += nt
            total = block_reduce(acc)
            if tid == 0:
                store_result(total, out, n)
                counter[0] = 0      # ready for the next launch on this stream

    return kernel


@functools.lru_cache(maxsize=None)
def segments_kernel(spec):
    """Kernel ``(xs, offsets, nvals, m, out)``: a warp per segment (grid-stride),
    ``out[s]`` the binned sum of segment ``s``."""
    from .segmented import _offset
    bn = binning(spec.dtype)
    nt, vt = spec.tile            # nt: threads per block; a warp's tile is 32 x vt
    fold_tile = _fold_tile(bn, spec.item, 32, vt)
    initial = _initial(bn)
    warp_reduce = warp.reduce(MERGE, STATE_VT)
    finalise = _finalise(bn)
    OUT = np.dtype(spec.out_dtype).type
    warps_per_block = nt // 32

    def kernel(xs, offsets, nvals, m, out):
        lane = cuda.laneid
        s = np.int64(cuda.blockIdx.x) * warps_per_block + cuda.threadIdx.x // 32
        step = np.int64(cuda.gridDim.x) * warps_per_block
        while s < m:
            lo = _offset(offsets, s, nvals)
            hi = max(_offset(offsets, s + 1, nvals), lo)
            st = initial()
            base = lo
            while base < hi:
                st = fold_tile(st, xs, xs, base, hi, lane)
                base += 32 * vt
            total = warp_reduce((st[0], st[1], st[2], st[3], st[4]))
            if lane == 0:
                out[s] = OUT(finalise(total))
            s += step

    return kernel


# --- host side ----------------------------------------------------------------------------------

def tile_for(dtype):
    """Threads per block and items per thread (``CUFOLD_TILE=NTxVT`` overrides; tiny tiles
    in the simulator so that test inputs cross tile and block boundaries)."""
    forced = os.environ.get("CUFOLD_TILE")
    if forced:
        nt, vt = (int(v) for v in forced.lower().split("x"))
        return Tile(nt, vt)
    if SIMULATOR:
        return Tile(32, 4)
    return Tile(256, 32) if np.dtype(dtype).itemsize <= 4 else Tile(128, 16)


#: Registers per thread of the sum kernel (ptxas 13.0, sm_90, default tiles: 80 for float32,
#: 71 for float64), with a quarter more as headroom for the driver's own compile: the grid
#: is the blocks that surely fit at once (2 x 256 threads per SM for float32, 5 x 128 for
#: float64), so that the grid-stride tiles run in one even wave, never in 1.x waves.
#: ``CUFOLD_REPRO_PER_SM`` (blocks per SM) overrides, for study.
REGISTERS = {4: 100, 8: 90}


def _resident_blocks(device_id, nt, dtype, kernel=None):
    """Blocks of ``nt`` threads that run at once: the driver's occupancy of the compiled
    ``kernel`` where it can be asked, else the :data:`REGISTERS` estimate."""
    if SIMULATOR:
        return _reduce_mod._resident_blocks(device_id, nt)
    forced = os.environ.get("CUFOLD_REPRO_PER_SM")
    per_sm = int(forced) if forced else (occupancy(kernel, device_id, nt) if kernel is not None else None)
    if not per_sm:
        regs = -(-REGISTERS[np.dtype(dtype).itemsize] // 8) * 8
        per_sm = max(1, min(2048 // nt, 65536 // (regs * nt)))
    return _launch.sm_count(device_id) * per_sm


def occupancy(kernel, device_id, nt):
    """Blocks of ``nt`` threads of ``kernel`` (a ``launch.Kernel``) resident per SM, as the
    driver computes it (``cuOccupancyMaxActiveBlocksPerMultiprocessor``), or None."""
    try:
        from cuda.bindings import driver as cbd
        func, _ = kernel._entry(device_id)
        err, count = cbd.cuOccupancyMaxActiveBlocksPerMultiprocessor(cbd.CUfunction(int(func)), nt, 0)
        return int(count) if err == cbd.CUresult.CUDA_SUCCESS and count > 0 else None
    except Exception:
        return None


def binning_dtype(dtype):
    """The dtype items are binned as: float32 for float16/float32, float64 for float64 and
    integers (exact up to 2^53), or None (not supported)."""
    dt = np.dtype(dtype)
    if dt in (np.float16, np.float32):
        return np.dtype(np.float32)
    if dt == np.float64 or dt.kind in "iub":
        return np.dtype(np.float64)
    return None


_CAST_ITEMS = {}


def _item_for(in_dtype, bin_dtype):
    """The item function: a plain load, or a load converted to the binning dtype."""
    if np.dtype(in_dtype) == bin_dtype:
        return _plain_item()
    key = (np.dtype(in_dtype), bin_dtype)
    fn = _CAST_ITEMS.get(key)
    if fn is None:
        fn = _CAST_ITEMS[key] = _codegen.build("def item(xs, i):\n    return F(xs[np.uint64(i)])\n", "item",
                                               {"F": bin_dtype.type})
    return fn


@functools.lru_cache(maxsize=None)
def items_of(in_vt, transform, bin_dtype):
    """The item function of a fused sum: ``F(transform(load(xs, i)))``, ``load`` the input
    type's (tuple inputs are zipped, generated fields computed from the index), the
    transform's result converted to the binning dtype ``F`` (exact for float16/float32
    results binned as float32, float64 as float64). ``transform`` may be None."""
    env = {"load": in_vt.load, "F": np.dtype(bin_dtype).type}
    body = "F(load(xs, i))"
    if transform is not None:
        env["tf"] = transform.device(in_vt)
        body = "F(tf(load(xs, i)))"
    return _codegen.build("def item(xs, i):\n    return %s\n" % body, "item", env)


def _concrete(a):
    """What a kernel receives for placeholder(s) ``a``: a generated input's parameter."""
    if a.__class__ is tuple:
        return tuple(_concrete(m) for m in a)
    return a.param if a.__class__ is _arrays.Generated else a


def sum_plan(b, xs, n, out, *, dtype, finish="sum", out_dtype=None, item=None, tile=None, grid=None, wide=None,
             post=None):
    """Add a binned sum's launch to Program builder ``b`` (``host.programs``): ``xs`` the
    input Arr (or what ``item`` reads), ``n`` items, ``item(xs, i)`` a device function
    giving item ``i`` (default: ``xs[i]``; a fused transform, e.g. ``xs[0][i] * xs[1][i]``
    for a dot product, goes here), ``dtype`` the binning dtype (float32 or float64),
    ``finish`` "sum", "mean", "sqrt" (a 2-norm from squares) or "state", ``out`` a
    1-element Arr of ``out_dtype`` (5 int64 words for "state"). ``tile``/``grid``
    override the launch shape (tests: the result must not change), ``wide`` whether
    aligned float32 input is read 8 bytes a load (None: :data:`WIDE_LOADS`), ``post``
    None or ``(ops.Transform, the dtype it takes)``: a post-map of the finished value
    (then ``out_dtype`` is its result's)."""
    bn = binning(dtype)
    if n >= bn.max_items:
        raise ValueError("cufold: a reproducible %s sum takes fewer than 2^%d items; got %d"
                         % (bn.dtype, 64 - bn.width, n))
    tile = Tile(*tile) if tile is not None else tile_for(dtype)
    nv = tile.nt * tile.vt
    item = item if item is not None else _plain_item()
    # 8-byte loads of 4-byte items (as the plain sum's): the input itself, contiguous, aligned
    wide = ((WIDE_LOADS if wide is None else wide) and item is _plain_item() and bn.dtype.itemsize == 4
            and xs.__class__ is _arrays.Arr and xs.dtype == bn.dtype and xs.ndim == 1 and xs.c_contiguous
            and not xs.ptr & 7 and tile.vt % 2 == 0 and n >= nv)
    spec = Spec(bn.dtype, item, tile, finish, None if finish == "state" else np.dtype(out_dtype), wide,
                None if post is None else (post[0], np.dtype(post[1])))
    if grid is None:
        kernel = None
        if not SIMULATOR:     # the Kernel b.launch will use (same argument layouts), to ask its occupancy
            like = _reduce_mod._workspace(b.device_id, b.stream, STATE_VT, 1)
            kernel = _launch.kernel_for(sum_kernel(spec), ("binned_sum", spec),
                                        (_concrete(xs), np.int64(n)) + like + (out,))
        grid = max(1, min(-(-n // nv), _resident_blocks(b.device_id, tile.nt, bn.dtype, kernel)))
    partials, counter = _reduce_mod._workspace(b.device_id, b.stream, STATE_VT, max(grid, 1))
    b.launch(sum_kernel(spec), ("binned_sum", spec), grid, tile.nt, (xs, np.int64(n), partials, counter, out))


def plan_reduction(b, arrs, xs, given, name, prep, init, axis, keepdims):
    """The gpu_to_gpu Program of ``sum``/``mean``/``reduce(plus)`` (device/__init__.py's
    ``_Reduction._plan`` hands over here, with its ``_Prepared`` value types ``prep``):
    whole contiguous arrays; the transform (of zipped and generated inputs too) fused into
    the item load, the post-map applied to the finished value."""
    from . import _scalar_outputs, _results, _flat
    like = _arrays.first_stored(arrs)
    item_vt = prep.item_vt
    if item_vt.is_tuple:
        raise TypeError("cufold: deterministic='gpu_to_gpu' sums single values; %s gives %s"
                        % ("the transform %s" % prep.transform.name if prep.transform else "the input", item_vt))
    stored = all(a.c_contiguous for a in arrs)
    if (axis is not None and len(_normalize(axis, like.ndim)) != like.ndim) or keepdims or not stored:
        raise ValueError("cufold: deterministic='gpu_to_gpu' reduces whole contiguous arrays (axis=None, "
                         "keepdims=False); got axis=%r, keepdims=%r%s"
                         % (axis, keepdims, "" if stored else ", a non-contiguous view"))
    if init is not None:
        raise ValueError("cufold: deterministic='gpu_to_gpu' takes no init")
    item_dt = item_vt.dtype
    bin_dt = binning_dtype(item_dt)
    mid_dt = (prep.post[1] if prep.post is not None else prep.out_vt).dtype
    if bin_dt is None or mid_dt.kind != "f" or (name == "sum" and item_dt.kind != "f"):
        raise TypeError("cufold: deterministic='gpu_to_gpu' %s needs float16/float32/float64 items%s and "
                        "a float result; got %s -> %s%s"
                        % (name, " (or integers, for mean)" if name == "mean" else "", item_dt, mid_dt,
                           " (what transform %s returns)" % prep.transform.name if prep.transform else ""))
    flat = tuple(_flat(x) if x.ndim != 1 else x for x in xs)
    first = _arrays.first_stored(xs)
    out = _scalar_outputs(b, first, prep.out_vt, given)
    plain = prep.transform is None and len(arrs) == 1 and arrs[0].library != "generated"
    item = _item_for(item_dt, bin_dt) if plain else items_of(prep.in_vt, prep.transform, bin_dt)
    sum_plan(b, flat if len(flat) > 1 else flat[0], like.size, out, dtype=bin_dt,
             finish="mean" if name == "mean" else "sum", out_dtype=prep.out_vt.dtype, item=item,
             post=prep.post)
    if name == "mean" and like.size == 0:
        import warnings
        b.after(lambda arrays, values: warnings.warn("Mean of empty slice", RuntimeWarning, stacklevel=4))
    return b.build(_results(prep.out_vt, given))


def _normalize(axis, ndim):
    from .axis import normalize_axis
    return normalize_axis(axis, ndim)


def plan_segments(b, arrs, off, m, op, init, dtype, transform=None):
    """The launch of ``segmented_reduce(..., deterministic='gpu_to_gpu')`` (op plus) of
    value fields ``arrs`` (several, or generated ones, with a ``transform`` to one float):
    returns the output placeholder."""
    from ..ops import plus
    from .segmented import _item_type, _value_type
    if op is not plus:
        raise ValueError("cufold: deterministic='gpu_to_gpu' applies to sums (op=cufold.plus), not %s"
                         % getattr(op, "name", op))
    if init is not None:
        raise ValueError("cufold: deterministic='gpu_to_gpu' segmented sums take no init")
    in_vt = _value_type(arrs)
    item_vt = _item_type(in_vt, transform)
    if item_vt.is_tuple:
        raise ValueError("cufold: deterministic='gpu_to_gpu' segmented sums take one value array (or a "
                         "transform= to one value); got %s" % item_vt)
    item_dt = item_vt.dtype
    bin_dt = binning_dtype(item_dt)
    out_dt = np.dtype(dtype) if dtype is not None else item_dt
    if bin_dt is None or item_dt.kind != "f" or out_dt.kind != "f":
        raise TypeError("cufold: deterministic='gpu_to_gpu' segmented sums need float values and a float "
                        "result; got %s -> %s%s" % (item_dt, out_dt, " (what transform %s returns)"
                                                    % transform.name if transform is not None else ""))
    xs = tuple(b.input(a) for a in arrs)
    o = b.input(off)
    stored = [x for x in xs if x.library != "generated"]
    out = b.output(stored[0] if stored else o, (m,), out_dt)
    if m > 0:
        plain = transform is None and len(arrs) == 1 and arrs[0].library != "generated"
        item = _item_for(item_dt, bin_dt) if plain else items_of(in_vt, transform, bin_dt)
        tile = tile_for(bin_dt)
        nt, vt = (128, min(tile.vt, 8)) if not SIMULATOR else (64, 2)
        spec = Spec(bin_dt, item, Tile(nt, vt), "sum", out_dt)
        grid = max(1, min(-(-m // (nt // 32)), _reduce_mod._resident_blocks(b.device_id, nt)))
        b.launch(segments_kernel(spec), ("binned_segments", spec), grid, nt,
                 (xs if len(xs) > 1 else xs[0], o, np.int64(arrs[0].size), np.int64(m), out))
    return out


# --- the public state helpers -----------------------------------------------------------------

def _state_plan(key, *arrays):
    _, h, given_stream, tile, grid, wide, transform = key
    transform = as_transform(transform)
    like = _arrays.first_stored(arrays)
    in_vt = InputType.of(tuple(a.dtype for a in arrays) if len(arrays) > 1 else arrays[0].dtype,
                         tuple(getattr(a, "source", "array") for a in arrays))
    item_vt = ValueType.of(in_vt) if transform is None else transform.result_type(in_vt)
    item_dt = None if item_vt.is_tuple else item_vt.dtype
    bin_dt = binning_dtype(item_dt) if item_dt is not None else None
    contiguous = all(a.c_contiguous for a in arrays)
    if bin_dt is None or item_dt.kind != "f" or not contiguous:
        raise TypeError("cufold: sum_state takes a contiguous float16/float32/float64 array (or arrays and a "
                        "transform= to one such value); got %s%s" % (item_vt, "" if contiguous else
                                                                     " (non-contiguous)"))
    if any(a.size != like.size for a in arrays):
        raise ValueError("cufold: sum_state's arrays must have equally many items; got %s"
                         % [a.size for a in arrays])
    b = _programs.Builder(like.device_id, h, h if given_stream else None)
    xs = []
    for a in arrays:
        x = b.input(a)
        xs.append(_arrays.window(x, 0, (a.size,), (1,)) if a.ndim != 1 else x)
    first = _arrays.first_stored(xs)
    out = b.output(first, (STATE_WORDS,), np.int64)
    plain = transform is None and len(arrays) == 1 and arrays[0].library != "generated"
    item = _item_for(item_dt, bin_dt) if plain else items_of(in_vt, transform, bin_dt)
    sum_plan(b, tuple(xs) if len(xs) > 1 else xs[0], like.size, out, dtype=bin_dt, finish="state", item=item,
             tile=tile, grid=grid, wide=wide)
    return b.build()


_STATES = _programs.Programs(_state_plan, "cufold.reproducible.sum_state")


def sum_state(x, *, stream=None, tile=None, grid=None, wide=None, transform=None):
    """The binned state of ``x``'s sum: a device int64 array of :data:`STATE_WORDS`
    words (``x``'s library), to combine with others (:func:`combine_states`) and
    finalise (:func:`finalise`). float16 items are binned as float32.

    ``transform``: a function of one item (of the tuple of items where ``x`` is a tuple
    of equally long arrays, zipped; generated inputs too) returning one float, fused as
    in ``cufold.sum(x, transform=...)``: the state of the sum of what it returns (a
    piece of a reproducible dot product: ``sum_state((x0, y0), transform=lambda v: v[0]
    * v[1])``, the same state as ``cufold.dot``'s).

    ``tile=(threads, items_per_thread)``, ``grid=blocks`` and ``wide`` (8-byte loads
    of float32 items) change the launch (for tests and study): the state never changes
    with them.

    Example (a sum over two GPUs' pieces, the same bits as one sum)::

        >>> s = [cufold.reproducible.sum_state(piece) for piece in (x0, x1)]   # one per GPU
        >>> both = torch.stack([t.to("cuda:0") for t in s])
        >>> cufold.reproducible.finalise(cufold.reproducible.combine_states(both), torch.float32)
    """
    arrs = _arrays.describe_many(x) if x.__class__ is tuple else (_arrays.describe(x),)
    h = _arrays.stream_handle(arrs if x.__class__ is tuple else arrs[0], stream)
    return _STATES.run((tuple(map(_programs.signature, arrs)), h, stream is not None, tile, grid, wide, transform),
                       *arrs)


def _combine_kernel_plan(key, *arrays):
    _, h, given_stream, finish, out_dtype, bin_dtype = key
    (a,) = arrays
    if a.dtype != np.int64 or a.size % STATE_WORDS or not a.c_contiguous or a.size == 0:
        raise ValueError("cufold: states are contiguous int64 arrays of shape (m, %d), m >= 1; got %s %s"
                         % (STATE_WORDS, a.dtype, a.shape))
    b = _programs.Builder(a.device_id, h, h if given_stream else None)
    s = b.input(a)
    count = a.size // STATE_WORDS
    if finish == "state":
        out = b.output(s, (STATE_WORDS,), np.int64)
        dt = np.dtype(np.float64)
    else:
        out = b.output(s, (), out_dtype)
        out = _arrays.window(out, 0, (1,), (1,))
        dt = bin_dtype
    spec = (binning(dt), finish, None if finish == "state" else np.dtype(out_dtype))
    b.launch(_combine_kernel(spec), ("binned_combine", spec), 1, 32,
             (_arrays.window(s, 0, (count, STATE_WORDS), (STATE_WORDS, 1)), np.int64(count), out))
    return b.build()


@functools.lru_cache(maxsize=None)
def _combine_kernel(spec):
    bn, finish, out_dtype = spec
    merge = MERGE.combine(STATE_VT)
    warp_reduce = warp.reduce(MERGE, STATE_VT)
    store_result = _store_result(bn, finish, out_dtype)

    def kernel(states, count, out):
        lane = cuda.laneid
        z = np.int64(0)
        acc = (z, z, z, z, np.float64(0.0))
        j = lane
        while j < count:
            acc = merge(acc, (states[j, 0], states[j, 1], states[j, 2], states[j, 3],
                              states[j, 4].view(np.float64)))
            j += 32
        total = warp_reduce(acc)
        if lane == 0:
            store_result(total, out, np.int64(1))

    return kernel


_COMBINE = _programs.Programs(_combine_kernel_plan, "cufold.reproducible.combine")


def combine_states(states, *, stream=None):
    """One state from ``states``, a device int64 array of shape ``(m, STATE_WORDS)``
    (states of pieces, stacked on one device): exactly the state of the whole.

    Example: ``cufold.reproducible.combine_states(torch.stack([s0, s1]))``
    """
    a = _arrays.describe(states, "states")
    h = _arrays.stream_handle(a, stream)
    return _COMBINE.run((_programs.signature(a), h, stream is not None, "state", None, None), a)


def finalise(state, dtype, *, stream=None):
    """The sum a state (of items binned as ``dtype``'s binning: float32 for float16 or
    float32 items, float64 for float64) stands for, as a 0-d device array of ``dtype``.

    Example: ``cufold.reproducible.finalise(cufold.reproducible.sum_state(x), numpy.float32)``
    """
    a = _arrays.describe(state, "state")
    dt = _dtype_of(dtype)
    bin_dt = binning_dtype(dt)
    if bin_dt is None or dt.kind != "f":
        raise TypeError("cufold: finalise gives a float16/float32/float64 result, not %s" % dt)
    h = _arrays.stream_handle(a, stream)
    return _COMBINE.run((_programs.signature(a), h, stream is not None, "sum", dt, bin_dt), a)


def _dtype_of(dtype):
    """A NumPy dtype from a NumPy/CuPy dtype or type, or a torch dtype."""
    if type(dtype).__module__ == "torch":
        return np.dtype(str(dtype).split(".")[-1])
    return np.dtype(dtype)


# --- the same arithmetic on the host (NumPy): the reference of the tests ----------------------

def host_state(x, dtype=None):
    """The state (5 Python ints / float) of host array ``x``'s binned sum, item by item as
    the kernels compute it (binned as ``dtype``, default ``binning_dtype(x.dtype)``)."""
    x = np.asarray(x).ravel()
    bn = binning(dtype if dtype is not None else binning_dtype(x.dtype))
    F = bn.F
    x = x.astype(F)
    finite = np.isfinite(x)
    sp = 0.0
    for v in x[~finite]:
        sp = sp + float(v)
    ax = np.abs(x)
    ax = ax[~np.isnan(ax)]
    m = ax.max() if ax.size else F(0)
    T = max(frame_of(bn, int(np.array(m, F).view(bn.I)) >> bn.mant), bn.floor_frame)
    if sp != 0.0 or math.isnan(sp):
        return (T, 0, 0, 0, sp)
    r = x
    sums = []
    for k in (T, T - 1, T - 2):
        g = bin_exponent(bn, k)
        sc = bn.scale if g > bn.scale_at else 0
        sigma, s = F(1.5 * 2.0 ** (bn.mant + g - sc)), F(2.0 ** -sc)
        with np.errstate(under="ignore"):
            t = r * s + sigma
            q = t - sigma
            # r - q, exactly, without forming q (which may be 2^(emax+1)); ldexp is exact
            r = np.where(q == 0, r, np.ldexp(np.ldexp(r, -sc) - q, sc)).astype(F)
        units = np.ldexp(q.astype(np.float64), sc - g).astype(np.int64)
        sums.append(int(units.sum(dtype=np.int64)))
    return (T, sums[0], sums[1], sums[2], sp)


def host_combine(*states):
    """Combine host states (as :data:`MERGE` does on the device)."""
    def shifted(st, t):
        return ([0] * min(t - st[0], K) + list(st[1:4]))[:K]

    acc = (0, 0, 0, 0, 0.0)
    for s in states:
        t = max(acc[0], s[0])
        a, c = shifted(acc, t), shifted(s, t)
        acc = (t, a[0] + c[0], a[1] + c[1], a[2] + c[2], acc[4] + s[4])
    return acc


def host_finalise(state, dtype):
    """The float64 value of a host state binned as ``dtype`` (as the kernels compute it)."""
    bn = binning(binning_dtype(dtype))
    T, S0, S1, S2, sp = state
    if sp != 0.0 or math.isnan(sp):
        return float(sp)
    e0, e1, e2 = (bin_exponent(bn, k) for k in (T, T - 1, T - 2))
    c = S2 >> (e1 - e2)
    S2 -= c << (e1 - e2)
    S1 += c
    c = S1 >> (e0 - e1)
    S1 -= c << (e0 - e1)
    S0 += c
    v = float((np.float64(S0) * np.float64(2.0 ** (e0 - e2)) + np.float64(S1 << (e1 - e2))) + np.float64(S2))
    h = e2 >> 1
    return float(np.float64(v) * np.float64(2.0 ** h) * np.float64(2.0 ** (e2 - h)))
