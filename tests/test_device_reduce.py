"""cufold.reduce and its shortcuts (sum, prod, min, max, argmin, argmax, minmax,
mean, var, mean_var): every algorithm, dtype promotion, user and tuple-valued
operators, init/out/stream, errors, array libraries, determinism.

Runs in the simulator (tiles of 64 threads x 2 items, at most 4 resident
blocks, so the sizes below cross tile, block and grid-stride boundaries) and
on a GPU (tiles of 4096 elements for 4-byte inputs, 2048 for 8-byte ones, and
inputs up to 2**24 + 3).
"""

import functools
import importlib

import numpy as np
import pytest
from numba import cuda

from conftest import SIMULATOR, gpu_only, run_sm90_script, to_host

import cufold

reduce_mod = importlib.import_module("cufold.device.reduce")   # (cufold.device.reduce is the function)
launch_mod = importlib.import_module("cufold.host.launch")

ALGORITHMS = tuple(cufold.algorithms("reduce"))
ATOMIC = tuple(a for a in ALGORITHMS if a.startswith("atomic"))
ORDERED = tuple(a for a in ALGORITHMS if a not in ATOMIC)   # usable by any operator

if SIMULATOR:
    # tile = 128 elements, 4 resident blocks: 600 and 1100 make the grid-stride
    # loop and the last-block fold go round.
    # Each simulated block of 64 threads costs ~0.1-0.2 s: only int32 sums take
    # the whole size list; the other tests take one or a few sizes.
    SIZES = (1, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257, 600, 1100)
    ORDER_SIZES = (1, 65, 257, 600, 1100)   # ordered folds: 1100 gives each block 3 tiles
    SMALL_SIZES = (1, 257)
    MATRIX_SIZES = (129,)
    ONE_SIZE = 200
else:
    SIZES = (1, 2, 31, 32, 33, 255, 256, 257, 2047, 2048, 2049, 4095, 4096, 4097, 8193,
             3 * 4096 + 5, 2**20 + 1, 2**24, 2**24 + 3)
    ORDER_SIZES = (1, 2049, 4097, 2**20 + 7, 2**24 + 3)
    SMALL_SIZES = (1, 4097, 2**22 + 3)
    MATRIX_SIZES = (1, 4097, 2**22 + 3)
    ONE_SIZE = 2**20 + 3


# --- helpers -------------------------------------------------------------------------

def dev(h):
    return cuda.to_device(np.ascontiguousarray(h))


host = to_host


def random(rng, dtype, n):
    dt = np.dtype(dtype)
    if dt == np.uint32:
        # mostly above 2**31: exercises the signed reinterpretation in shuffles
        return rng.integers(2**31 - 2**20, 2**32, n, dtype=np.uint32)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, endpoint=True, dtype=dt)
    return rng.standard_normal(n).astype(dt)


def check_float_sum(got, x, dtype):
    x64 = x.astype(np.float64)
    ref = np.sum(x64)
    scale = np.sum(np.abs(x64))
    if np.dtype(dtype) == np.float16:
        tol = 2.0**-10 * abs(ref) + 1e-5 * scale + 1e-3
    elif np.dtype(dtype) == np.float32:
        tol = 1e-5 * scale + 1e-6
    else:
        tol = 1e-12 * scale + 1e-12
    assert abs(float(got) - ref) <= tol, (float(got), ref, tol)


def atomic_refusal(dtype, op, deterministic=True):
    """The message fragment of the ValueError an atomic algorithm raises, or None."""
    dt = np.dtype(dtype)
    if dt == np.float16 or (dt.itemsize < 4 and op is not cufold.plus):
        return "hardware atomic"       # no atomic of that width (or acc != result dtype)
    if dt.kind == "f" and op is cufold.plus and deterministic:
        return "deterministic=False"
    return None


NUMPY_OF = {"plus": np.sum, "maximum": np.max, "minimum": np.min}


# --- the algorithm list -------------------------------------------------------------

def test_algorithm_names():
    assert set(ALGORITHMS) == {"single_pass", "two_pass", "tiles", "single_block", "atomic_warp",
                               "atomic_block"}
    with pytest.raises(ValueError, match="reduce"):
        cufold.algorithms("nonsense")


# --- int32 sum: every algorithm at every size -------------------------------------------

@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_int32_sum_every_algorithm_every_size(rng, algorithm):
    for n in SIZES:
        x = random(rng, np.int32, n)  # full int32 range: the sum overflows int32
        r = cufold.sum(dev(x), algorithm=algorithm)
        assert r.shape == () and r.dtype == np.int64
        got = host(r)
        assert got == np.sum(x), (n, algorithm)


# --- dtypes x operators x algorithms ----------------------------------------------------

DTYPES = (np.int32, np.float32, np.float64, np.int8, np.uint32, np.float16)
OPS = (cufold.plus, cufold.maximum, cufold.minimum)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_dtype_op_algorithm(rng, algorithm, dtype, op):
    dt = np.dtype(dtype)
    deterministic = True
    if algorithm in ATOMIC:
        refusal = atomic_refusal(dt, op)
        if refusal == "deterministic=False":
            with pytest.raises(ValueError, match="deterministic=False"):
                cufold.reduce(dev(random(rng, dt, 8)), op, algorithm=algorithm)
            deterministic = False
        elif refusal is not None:
            with pytest.raises(ValueError, match=refusal):
                cufold.reduce(dev(random(rng, dt, 8)), op, algorithm=algorithm)
            return
    for n in MATRIX_SIZES:
        x = random(rng, dt, n)
        r = cufold.reduce(dev(x), op, algorithm=algorithm, deterministic=deterministic)
        got = host(r)
        ref_dtype = NUMPY_OF[op.name](x).dtype
        assert r.dtype == ref_dtype and got.shape == ()
        if op is cufold.plus and dt.kind == "f":
            check_float_sum(got, x, dt)
        else:
            assert got == NUMPY_OF[op.name](x), (n, got)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # the simulator's int8 wrap
@pytest.mark.parametrize("algorithm", (None, "single_pass", "atomic_block"))
def test_sum_promotion_and_dtype_override(rng, algorithm):
    n = ONE_SIZE
    x8 = random(rng, np.int8, n)
    r = cufold.sum(dev(x8), algorithm=algorithm)
    assert r.dtype == np.int64 and host(r) == np.sum(x8)
    if algorithm not in ATOMIC:  # no 1-byte atomics
        r = cufold.sum(dev(x8), dtype=np.int8, algorithm=algorithm)
        ref = np.sum(x8, dtype=np.int8)  # wraps around
        assert r.dtype == np.int8 and host(r) == ref
        r = cufold.sum(dev(x8), dtype=np.int8, algorithm=algorithm)
        assert host(r) == ref
    xu = random(rng, np.uint32, n)
    r = cufold.sum(dev(xu), algorithm=algorithm)
    assert r.dtype == np.uint64 and host(r) == np.sum(xu)
    xi = random(rng, np.int32, n)
    r = cufold.sum(dev(xi), dtype=np.float64, algorithm=algorithm, deterministic=False)
    assert r.dtype == np.float64
    assert host(r) == np.sum(xi, dtype=np.float64)  # exact: |sum| < 2**53
    xh = random(rng, np.float16, n)
    if algorithm not in ATOMIC:
        r = cufold.sum(dev(xh), algorithm=algorithm)
        assert r.dtype == np.float16
        check_float_sum(host(r), xh, np.float16)
    else:
        with pytest.raises(ValueError, match="cufold: "):
            cufold.sum(dev(xh), algorithm=algorithm, deterministic=False)


def test_float_atomic_sum_needs_nondeterministic(rng):
    x = dev(random(rng, np.float32, 100))
    for alg in ATOMIC:
        with pytest.raises(ValueError, match="deterministic=False"):
            cufold.sum(x, algorithm=alg)
        with pytest.raises(ValueError, match="deterministic=False"):
            cufold.reduce(x, cufold.plus, algorithm=alg)
        # min/max of floats are exact in any order: allowed
        assert host(cufold.reduce(x, cufold.maximum, algorithm=alg)) == np.max(x.copy_to_host())


def test_float16_sum_accumulates_in_float32(rng):
    # 2048 + 1 + 1 + ... : float16 accumulation would be stuck at 2048
    n = ONE_SIZE if SIMULATOR else 20_000   # the sum stays below float16's 65504
    x = np.ones(n, np.float16)
    x[0] = 2048
    r = cufold.sum(dev(x))
    assert r.dtype == np.float16
    assert host(r) == np.float16(np.sum(x.astype(np.float32)))


# --- odd tile shapes (CUFOLD_TILE) ----------------------------------------------------

@pytest.mark.parametrize("tile", ["48x3", "32x1"])
def test_odd_tiles(rng, monkeypatch, tile):
    """A block of 48 threads (a partial warp) and a one-warp block of 32 x 1,
    whose tiny tiles make the tiles algorithm recurse three levels."""
    monkeypatch.setenv("CUFOLD_TILE", tile)
    nt, vt_items = (int(v) for v in tile.split("x"))
    nv = nt * vt_items
    if tile == "32x1":
        sizes, algorithms = ((1100,) if SIMULATOR else (3 * 2**16 + 5,)), ("tiles",)
    else:
        sizes, algorithms = ((5 * nv + 7,) if SIMULATOR else (1, nv + 1, 3 * 2**16 + 5)), ALGORITHMS
    vt = cufold.ValueType.of(np.int32)
    p = reduce_mod.plan(cufold.plus, vt, cufold.ValueType.of(np.int64), cufold.ValueType.of(np.int64),
                        sizes[-1], 0, "tiles")
    assert tuple(p.spec.tile) == (nt, vt_items), "the plan ignored CUFOLD_TILE"
    for n in sizes:
        x = random(rng, np.int32, n)
        pairs = affine_input(rng, n)
        for alg in algorithms:
            assert host(cufold.sum(dev(x), algorithm=alg)) == np.sum(x), (tile, n, alg)
            if alg in ("single_pass", "tiles"):
                got = host(cufold.reduce(tuple(dev(p) for p in pairs), affine, algorithm=alg))
                assert tuple(int(g) for g in got) == affine_reference(pairs), (tile, n, alg)


# --- shortcuts ----------------------------------------------------------------------

@pytest.mark.parametrize("n", SMALL_SIZES)
def test_sum_prod(rng, n):
    x = random(rng, np.float32, n)
    r = cufold.sum(dev(x))
    assert r.dtype == np.float32
    check_float_sum(host(r), x, np.float32)
    # products of small integers: +-1 with a few 2s and 3s, no overflow
    xi = rng.choice(np.array([1, -1], np.int32), n)
    xi[rng.choice(n, size=min(n, 20), replace=False)] = rng.choice(np.array([2, 3, -2], np.int32), min(n, 20))
    r = cufold.prod(dev(xi))
    assert r.dtype == np.int64 and host(r) == np.prod(xi)
    xf = rng.uniform(0.999, 1.001, n)
    r = cufold.prod(dev(xf))
    assert r.dtype == np.float64 and np.isclose(host(r), np.prod(xf), rtol=1e-12)


@pytest.mark.parametrize("algorithm,dtype", [(None, np.int32), (None, np.float64), (None, np.uint32),
                                             (None, np.int8)] + [(a, np.float32) for a in ORDERED],
                         ids=lambda v: v if isinstance(v, str) else np.dtype(v).name if v else "default")
def test_min_max(rng, algorithm, dtype):
    n = ONE_SIZE
    x = random(rng, dtype, n)
    lo, hi = cufold.min(dev(x), algorithm=algorithm), cufold.max(dev(x), algorithm=algorithm)
    assert lo.dtype == x.dtype and hi.dtype == x.dtype
    assert host(lo) == np.min(x) and host(hi) == np.max(x)
    mm = cufold.minmax(dev(x), algorithm=algorithm)
    assert isinstance(mm, tuple) and len(mm) == 2 and mm[0].dtype == mm[1].dtype == x.dtype
    assert host(mm) == (np.min(x), np.max(x))


@pytest.mark.parametrize("algorithm,where", [(None, 0), ("two_pass", -1), ("tiles", ONE_SIZE // 2)])
def test_min_max_nan_propagates(rng, algorithm, where):
    n = ONE_SIZE
    x = random(rng, np.float32, n)
    x[where] = np.nan
    assert np.isnan(host(cufold.min(dev(x), algorithm=algorithm)))
    assert np.isnan(host(cufold.max(dev(x), algorithm=algorithm)))
    lo, hi = host(cufold.minmax(dev(x), algorithm=algorithm))
    assert np.isnan(lo) and np.isnan(hi)


@pytest.mark.parametrize("algorithm", (None,) + ORDERED)
def test_argmin_argmax(rng, algorithm):
    n = ONE_SIZE
    ties = rng.integers(0, 4, n).astype(np.int32)      # many ties: the lowest index wins
    nans = random(rng, np.float32, n)
    nans[[n // 3, n // 2, n - 1]] = np.nan                # the first NaN wins, as NumPy
    cases = (ties, nans) if algorithm is not None else (ties, nans, ties.astype(np.float64),
                                                         random(rng, np.float16, n))
    for x in cases:
        for fn, ref in ((cufold.argmin, np.argmin), (cufold.argmax, np.argmax)):
            r = fn(dev(x), algorithm=algorithm)
            assert r.dtype == np.int64 and r.shape == ()
            assert host(r) == ref(x), (fn, x.dtype)
    assert np.argmin(nans) == n // 3


def test_argmin_argmax_single_and_extremes(rng):
    x = np.array([7], np.int8)
    assert host(cufold.argmin(dev(x))) == 0 and host(cufold.argmax(dev(x))) == 0
    # the extreme values of the dtype (equal to the operators' identities)
    x = np.full(ONE_SIZE, np.iinfo(np.int32).max, np.int32)
    assert host(cufold.argmin(dev(x))) == 0
    x = np.full(ONE_SIZE, -np.inf, np.float32)
    assert host(cufold.argmax(dev(x))) == 0


@pytest.mark.parametrize("n", SMALL_SIZES)
def test_mean_var(rng, n):
    xi = rng.integers(-1000, 1000, n).astype(np.int32)
    r = cufold.mean(dev(xi))
    assert r.dtype == np.float64 and np.isclose(host(r), np.mean(xi), rtol=1e-12, atol=1e-12)
    xf = (rng.standard_normal(n) * 3 + 100).astype(np.float32)  # offset: tests the one-pass stability
    r = cufold.mean(dev(xf))
    assert r.dtype == np.float32 and np.isclose(host(r), np.mean(xf.astype(np.float64)), rtol=1e-6)
    for ddof in (0, 1):
        if n - ddof <= 0:
            continue
        r = cufold.var(dev(xf), ddof=ddof)
        ref = np.var(xf.astype(np.float64), ddof=ddof)
        assert r.dtype == np.float32 and np.isclose(host(r), ref, rtol=1e-4, atol=1e-5)
        if ddof == 1:
            r = cufold.var(dev(xi), ddof=ddof)
            assert r.dtype == np.float64 and np.isclose(host(r), np.var(xi, ddof=ddof), rtol=1e-10)
            m, v = cufold.mean_var(dev(xf), ddof=ddof)
            assert m.dtype == v.dtype == np.float32
            assert np.isclose(host(m), np.mean(xf.astype(np.float64)), rtol=1e-6)
            assert np.isclose(host(v), ref, rtol=1e-4, atol=1e-5)
    xd = rng.standard_normal(n) + 1e6
    m, v = host(cufold.mean_var(dev(xd)))
    assert np.isclose(m, np.mean(xd), rtol=1e-14)
    assert np.isclose(v, np.var(xd), rtol=1e-6, atol=1e-9)


def test_mean_alone_of_every_algorithm_and_of_nothing(rng):
    """``mean`` alone reduces (count, sum), not Welford's state: every algorithm, axes,
    and NaN with NumPy's warning for an empty input or an empty axis."""
    x = rng.standard_normal(ONE_SIZE) + 1e3
    for alg in ORDERED:
        assert np.isclose(host(cufold.mean(dev(x), algorithm=alg)), np.mean(x), rtol=1e-13)
    x2 = rng.standard_normal((37, 45)).astype(np.float32)       # means near 0: the sums cancel
    ref = x2.astype(np.float64)
    for axis in (0, 1, None, (0, 1)):
        got, want = host(cufold.mean(dev(x2), axis=axis)), ref.mean(axis=axis)
        # along an outer axis a thread folds a compensated float32 sum: within 2 eps32 of the
        # magnitudes (NumPy's own float32 mean: log2(n) eps32); elsewhere float64
        bound = 2 * np.finfo(np.float32).eps * np.abs(ref).mean(axis=axis)
        assert (np.abs(got - want) <= 1e-6 * np.abs(want) + bound).all(), (axis, got - want)
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        assert np.isnan(host(cufold.mean(dev(np.zeros(0, np.float32)))))
    got = host(cufold.mean(dev(np.zeros((3, 0), np.float32)), axis=1))
    assert got.shape == (3,) and np.isnan(got).all()


@pytest.mark.parametrize("algorithm", ORDERED)
def test_moments_every_algorithm(rng, algorithm):
    x = rng.standard_normal(ONE_SIZE)
    m, v = host(cufold.mean_var(dev(x), ddof=1, algorithm=algorithm))
    assert np.isclose(m, np.mean(x), rtol=1e-12, atol=1e-14)
    assert np.isclose(v, np.var(x, ddof=1), rtol=1e-12)
    assert np.isclose(host(cufold.var(dev(x), algorithm=algorithm)), np.var(x), rtol=1e-12)
    for alg in ATOMIC:
        with pytest.raises(ValueError, match="hardware atomic"):
            cufold.mean(dev(x), algorithm=alg)


# --- user-defined operators ---------------------------------------------------------

plus_lambda = lambda a, b: a + b  # noqa: E731  (non-commutative by default: ordered path)
plus_commutative = cufold.Op(lambda a, b: a + b, commutative=True)
triple_sum = cufold.Op(lambda a, b: (a[0] + b[0], a[1] + b[1], a[2] + b[2]), commutative=True)
first = lambda a, b: a  # noqa: E731  associative, not commutative
last = lambda a, b: b  # noqa: E731


def _affine(p, q):
    # x -> a x + b, then x -> c x + d: (a c, b c + d)
    return (p[0] * q[0], p[1] * q[0] + q[1])


affine = _affine  # a plain function: non-commutative


def affine_input(rng, n):
    a = rng.choice(np.array([1, -1], np.int64), n)
    b = rng.integers(-100, 101, n).astype(np.int64)
    return a, b


def affine_reference(pairs, init=None, sequential=None):
    """The ordered fold: a sequential Python fold (functools.reduce), or for
    large inputs its closed form (with |a| = 1 everything stays exact in int64)."""
    a, b = pairs
    if sequential is None:
        sequential = len(a) <= 20_000
    if sequential:
        items = list(zip((int(v) for v in a), (int(v) for v in b)))
        if init is not None:
            return functools.reduce(_affine, items, init)
        return functools.reduce(_affine, items)
    suffix = np.cumprod(a[::-1])[::-1]                   # suffix[i] = a[i] * ... * a[n-1]
    after = np.append(suffix[1:], 1)                     # a[i+1] * ... * a[n-1]
    big_a, big_b = int(suffix[0]), int(np.sum(b * after))
    if init is not None:
        return (init[0] * big_a, init[1] * big_a + big_b)
    return (big_a, big_b)


def test_affine_reference_closed_form(rng):
    pairs = affine_input(rng, 5000)
    assert affine_reference(pairs, sequential=False) == affine_reference(pairs, sequential=True)
    assert (affine_reference(pairs, (-1, 3), sequential=False)
            == affine_reference(pairs, (-1, 3), sequential=True))


def _matmul(p, q):
    # 2x2 matrices as (m00, m01, m10, m11)
    return (p[0] * q[0] + p[1] * q[2], p[0] * q[1] + p[1] * q[3],
            p[2] * q[0] + p[3] * q[2], p[2] * q[1] + p[3] * q[3])


# the signed permutation matrices: a non-commutative group, entries stay in {-1, 0, 1}
_SIGNED_PERMS = np.array([(s, 0, 0, t) for s in (1, -1) for t in (1, -1)]
                         + [(0, s, t, 0) for s in (1, -1) for t in (1, -1)], np.int64)


@pytest.mark.parametrize("algorithm", ORDERED)
def test_user_scalar_operators(rng, algorithm):
    for n in (ONE_SIZE,):
        x = rng.integers(-1000, 1000, n).astype(np.int32)
        ref = np.sum(x, dtype=np.int32)   # a user op keeps the dtype (wrapping, if ever, alike)
        r = cufold.reduce(dev(x), plus_lambda, algorithm=algorithm)
        assert r.dtype == np.int32 and host(r) == ref
        r = cufold.reduce(dev(x), plus_commutative, algorithm=algorithm)
        assert r.dtype == np.int32 and host(r) == ref
        assert host(cufold.reduce(dev(x), first, algorithm=algorithm)) == x[0]
        assert host(cufold.reduce(dev(x), last, algorithm=algorithm)) == x[-1]


@pytest.mark.parametrize("algorithm", ORDERED)
def test_non_commutative_affine(rng, algorithm):
    for n in ORDER_SIZES:
        pairs = affine_input(rng, n)
        r = cufold.reduce(tuple(dev(p) for p in pairs), affine, algorithm=algorithm)
        assert isinstance(r, tuple) and len(r) == 2 and r[0].dtype == r[1].dtype == np.int64
        assert tuple(int(v) for v in host(r)) == affine_reference(pairs), (n, algorithm)


def matrix_reference(m):
    if len(m) <= 20_000:
        return functools.reduce(_matmul, [tuple(int(v) for v in row) for row in m])
    mats = m.reshape(-1, 2, 2)
    while len(mats) > 1:                                  # a pairwise tree, in order
        if len(mats) % 2:
            mats = np.concatenate([mats, np.eye(2, dtype=np.int64)[None]])
        mats = np.matmul(mats[0::2], mats[1::2])
    return tuple(int(v) for v in mats[0].reshape(4))


@pytest.mark.parametrize("algorithm", ORDERED)
def test_non_commutative_matrix_product(rng, algorithm):
    for n in MATRIX_SIZES:
        m = _SIGNED_PERMS[rng.integers(0, len(_SIGNED_PERMS), n)]
        cols = tuple(np.ascontiguousarray(m[:, k]) for k in range(4))
        ref = matrix_reference(m)
        got = cufold.reduce(tuple(dev(c) for c in cols), _matmul, algorithm=algorithm)
        assert tuple(int(v) for v in host(got)) == ref, (n, algorithm)


@pytest.mark.parametrize("algorithm", (None,) + ALGORITHMS)
def test_tuple_values_triple_sum(rng, algorithm):
    n = ONE_SIZE
    x = rng.integers(-1000, 1000, n).astype(np.int32)
    y = random(rng, np.float32, n)
    z = random(rng, np.float64, n)
    xs = (dev(x), dev(y), dev(z))
    if algorithm in ATOMIC:
        with pytest.raises(ValueError, match="hardware atomic"):
            cufold.reduce(xs, triple_sum, algorithm=algorithm)
        return
    r = cufold.reduce(xs, triple_sum, algorithm=algorithm)
    assert isinstance(r, tuple) and tuple(v.dtype for v in r) == (np.int32, np.float32, np.float64)
    gx, gy, gz = host(r)
    assert gx == np.sum(x)
    check_float_sum(gy, y, np.float32)
    check_float_sum(gz, z, np.float64)


@pytest.mark.parametrize("algorithm", (None, "two_pass"))
def test_builtin_ops_on_tuple_values(rng, algorithm):
    """Built-in scalar operators act field by field on tuple values."""
    n = ONE_SIZE
    x = rng.integers(-1000, 1000, n).astype(np.int32)
    y = random(rng, np.float32, n)
    r = cufold.sum((dev(x), dev(y)), algorithm=algorithm)
    assert isinstance(r, tuple) and tuple(v.dtype for v in r) == (np.int64, np.float32)  # NumPy's promotion
    assert host(r[0]) == np.sum(x)
    check_float_sum(host(r[1]), y, np.float32)
    r = cufold.reduce((dev(x), dev(y)), cufold.maximum, algorithm=algorithm)
    assert tuple(v.dtype for v in r) == (np.int32, np.float32)
    assert host(r) == (np.max(x), np.max(y))


def test_tuple_dtype_per_field(rng):
    """``dtype=`` of tuple values: one dtype per field (or one for every field)."""
    x = rng.integers(-1000, 1000, 200).astype(np.int32)
    y = random(rng, np.float32, 200)
    r = cufold.sum((dev(x), dev(y)), dtype=(np.int32, np.float64))
    assert tuple(v.dtype for v in r) == (np.int32, np.float64)
    assert host(r[0]) == np.sum(x, dtype=np.int32)
    check_float_sum(host(r[1]), y, np.float64)
    m = (dev(x.reshape(8, 25)), dev(y.reshape(8, 25)))
    r = cufold.reduce(m, cufold.maximum, axis=0, dtype=(np.int64, np.float32))
    assert tuple(v.dtype for v in r) == (np.int64, np.float32)
    assert (host(r[0]) == x.reshape(8, 25).max(0)).all() and (host(r[1]) == y.reshape(8, 25).max(0)).all()
    with pytest.raises(ValueError, match="dtype has 3 fields; the values have 2"):
        cufold.sum((dev(x), dev(y)), dtype=(np.int32,) * 3)


def test_user_operators_refused_by_atomics(rng):
    x = dev(rng.integers(-10, 10, 50).astype(np.int32))
    for alg in ATOMIC:
        for op in (plus_lambda, plus_commutative):
            with pytest.raises(ValueError, match="hardware atomic"):
                cufold.reduce(x, op, algorithm=alg)


def test_tuple_input_lengths_must_match(rng):
    with pytest.raises(ValueError, match="equally long"):
        cufold.reduce((dev(np.arange(5)), dev(np.arange(6))), affine)


# --- init, empty and single-element inputs --------------------------------------------

@pytest.mark.parametrize("algorithm", (None,) + ALGORITHMS)
def test_init(rng, algorithm):
    n = ONE_SIZE
    x = random(rng, np.int32, n)
    r = cufold.reduce(dev(x), cufold.plus, 10, algorithm=algorithm)
    assert r.dtype == np.int64 and host(r) == np.sum(x) + 10
    r = cufold.reduce(dev(x), cufold.maximum, init=np.iinfo(np.int32).max, algorithm=algorithm)
    assert host(r) == np.iinfo(np.int32).max
    if algorithm not in ATOMIC:
        pairs = affine_input(rng, n)
        init = (-1, 7)   # folded in front: not commutative, so its place matters
        r = cufold.reduce(tuple(dev(p) for p in pairs), affine, init=init, algorithm=algorithm)
        assert tuple(int(v) for v in host(r)) == affine_reference(pairs, init)


def test_empty_inputs():
    e32 = dev(np.zeros(0, np.int32))
    ef = dev(np.zeros(0, np.float32))
    r = cufold.sum(e32)
    assert r.shape == () and r.dtype == np.int64 and host(r) == 0
    r = cufold.sum(ef)
    assert r.dtype == np.float32 and host(r) == 0
    r = cufold.prod(e32)
    assert r.dtype == np.int64 and host(r) == 1
    r = cufold.reduce(e32, cufold.plus, init=10)
    assert host(r) == 10
    r = cufold.reduce(ef, cufold.maximum)   # the identity, as np.maximum.reduce(..., initial=)
    assert host(r) == -np.inf
    r = cufold.reduce((e32, e32), affine, init=(1, 5))
    assert tuple(host(r)) == (1, 5)
    r = cufold.reduce(e32, plus_lambda, init=3)
    assert r.dtype == np.int32 and host(r) == 3
    with pytest.raises(ValueError, match="identity"):
        cufold.reduce(e32, plus_lambda)
    with pytest.raises(ValueError, match="identity"):
        cufold.reduce((e32, e32), affine)
    for fn in (cufold.min, cufold.max, cufold.argmin, cufold.argmax, cufold.minmax):
        with pytest.raises(ValueError, match="zero-size array"):
            fn(ef)
    with pytest.raises(ValueError):
        np.max(np.zeros(0, np.float32))  # the same as NumPy


@pytest.mark.parametrize("algorithm", (None,) + ALGORITHMS)
def test_single_element(algorithm):
    x = dev(np.array([-5], np.int32))
    assert host(cufold.sum(x, algorithm=algorithm)) == -5
    assert host(cufold.reduce(x, cufold.maximum, algorithm=algorithm)) == -5
    if algorithm is None:
        assert host(cufold.reduce(x, plus_lambda, init=2)) == -3
        assert host(cufold.argmax(x)) == 0
        assert host(cufold.var(x)) == 0.0
        assert host(cufold.mean(x)) == -5.0


# --- out= ---------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", (None,) + ALGORITHMS)
def test_out_overwrites_sentinel(rng, algorithm):
    x = random(rng, np.int32, ONE_SIZE)
    out = dev(np.array([-123456789], np.int64))  # poison
    r = cufold.sum(dev(x), out=out, algorithm=algorithm)
    assert r is out
    assert out.copy_to_host()[0] == np.sum(x)
    # a 0-d out too, and again into the same array
    out0 = cuda.to_device(np.array(-7, np.int64))
    cufold.sum(dev(x[: ONE_SIZE // 2]), out=out0, algorithm=algorithm)
    assert out0.copy_to_host() == np.sum(x[: ONE_SIZE // 2])


def test_out_tuple_and_empty(rng):
    x = random(rng, np.float32, ONE_SIZE)
    lo = dev(np.array([np.nan], np.float32))
    hi = dev(np.array([np.nan], np.float32))
    r = cufold.minmax(dev(x), out=(lo, hi))
    assert r[0] is lo and r[1] is hi
    assert lo.copy_to_host()[0] == np.min(x) and hi.copy_to_host()[0] == np.max(x)
    out = dev(np.array([99], np.int64))
    cufold.sum(dev(np.zeros(0, np.int32)), out=out)
    assert out.copy_to_host()[0] == 0
    cufold.reduce(dev(np.zeros(0, np.int32)), cufold.plus, init=5, out=out)
    assert out.copy_to_host()[0] == 5
    m = dev(np.array([-1.0]))
    v = dev(np.array([-1.0]))
    cufold.mean_var(dev(x.astype(np.float64)), out=(m, v))
    assert np.isclose(m.copy_to_host()[0], np.mean(x.astype(np.float64)))
    assert np.isclose(v.copy_to_host()[0], np.var(x.astype(np.float64)))


def test_out_errors(rng):
    x = dev(random(rng, np.int32, 10))
    with pytest.raises(TypeError, match="dtype"):
        cufold.sum(x, out=dev(np.zeros(1, np.int32)))   # the result is int64
    with pytest.raises(ValueError, match="one element"):
        cufold.sum(x, out=dev(np.zeros(2, np.int64)))
    with pytest.raises(ValueError, match="out="):
        cufold.minmax(x, out=dev(np.zeros(1, np.int32)))  # needs two arrays


# --- strided input, streams -------------------------------------------------------------

@pytest.mark.parametrize("algorithm", (None,) + ALGORITHMS)
def test_strided_input(rng, algorithm):
    h = random(rng, np.int32, 3 * ONE_SIZE + 2)
    d = dev(h)
    assert host(cufold.sum(d[::3], algorithm=algorithm)) == np.sum(h[::3])
    if algorithm is None:
        assert host(cufold.sum(d[5::7])) == np.sum(h[5::7])
        hf = random(rng, np.float64, 3 * ONE_SIZE)
        assert host(cufold.argmin(dev(hf)[1::3], algorithm=algorithm)) == np.argmin(hf[1::3])
        pairs = affine_input(rng, 2 * ONE_SIZE + 1)
        strided = tuple(dev(p)[::2] for p in pairs)
        ref = affine_reference(tuple(p[::2] for p in pairs))
        assert tuple(int(v) for v in host(cufold.reduce(strided, affine, algorithm=algorithm))) == ref


def test_negative_stride(rng):
    h = random(rng, np.int32, 3 * ONE_SIZE + 2)
    if SIMULATOR:
        d = dev(h)
    else:  # a Numba device array view does not start at element 0 when its stride is negative
        d = pytest.importorskip("cupy").asarray(h)
    assert host(cufold.sum(d[::-2])) == np.sum(h[::-2])
    assert host(cufold.reduce(d[::-3], last)) == h[::-3][-1]


def test_stream_argument(rng):
    x = random(rng, np.int32, ONE_SIZE)
    s = cuda.stream()
    r = cufold.sum(dev(x), stream=s)
    s.synchronize()
    assert host(r) == np.sum(x)
    assert host(cufold.sum(dev(x), stream=0)) == np.sum(x)
    with pytest.raises(TypeError, match="stream"):
        cufold.sum(dev(x), stream="fast")


# --- errors -------------------------------------------------------------------------

def test_host_arrays_rejected():
    h = np.arange(10, dtype=np.float32)
    for fn in (cufold.sum, cufold.min, cufold.argmax, cufold.minmax, cufold.mean, cufold.var,
               lambda a: cufold.reduce(a, cufold.plus)):
        with pytest.raises(TypeError, match="GPU"):
            fn(h)
    with pytest.raises(TypeError, match="GPU"):
        cufold.reduce((dev(h), h), triple_sum)


def test_unknown_algorithm_lists_names(rng):
    x = dev(random(rng, np.int32, 10))
    with pytest.raises(ValueError) as e:
        cufold.sum(x, algorithm="quantum")
    for name in ALGORITHMS:
        assert name in str(e.value)


def test_two_dimensional_input_reduces_every_element(rng):
    # N-D inputs and axis= are tested in test_axis.py; without axis a C-contiguous
    # 2-D array reduces to one value, as in NumPy.
    h = rng.integers(-50, 50, (5, 7)).astype(np.int32)
    r = cufold.sum(dev(h))
    assert r.shape == () and r.dtype == np.int64 and host(r) == np.sum(h)
    assert host(cufold.argmin(dev(h))) == np.argmin(h)   # the flat index


def test_operator_dtype_errors(rng):
    x = dev(random(rng, np.float32, 10))
    with pytest.raises(TypeError, match="cufold: "):
        cufold.reduce(x, cufold.bit_xor)          # not defined for floats
    with pytest.raises(TypeError, match="cufold: "):
        cufold.reduce(x, affine)                   # a tuple operator on scalars


# --- determinism --------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", (None,) + ORDERED)
def test_bitwise_deterministic(rng, algorithm):
    """The same input gives the same bits, run after run (GPU: 2**24 values, 20 runs)."""
    if SIMULATOR and algorithm is not None:
        pytest.skip("the simulator runs blocks one after another; the GPU run is the one that matters")
    n, runs = (ONE_SIZE, 2) if SIMULATOR else (2**24, 20)
    x = dev(random(rng, np.float32, n))
    bits = {host(cufold.sum(x, algorithm=algorithm)).tobytes() for _ in range(runs)}
    assert len(bits) == 1
    mv = {tuple(v.tobytes() for v in host(cufold.mean_var(x, algorithm=algorithm)))
          for _ in range(min(runs, 5))}
    assert len(mv) == 1


# --- array libraries (GPU) -------------------------------------------------------------

@gpu_only
def test_torch_inputs_and_streams(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    h = random(rng, np.int32, 100_003)
    x = torch.as_tensor(h, device="cuda")
    r = cufold.sum(x)
    assert isinstance(r, torch.Tensor) and r.shape == () and r.dtype == torch.int64 and r.is_cuda
    assert r.item() == np.sum(h)
    hf = random(rng, np.float32, 100_003)
    xf = torch.as_tensor(hf, device="cuda")
    assert cufold.argmax(xf).item() == np.argmax(hf)
    assert cufold.max(xf[::3]).item() == np.max(hf[::3])
    lo, hi = cufold.minmax(xf)
    assert isinstance(lo, torch.Tensor) and (lo.item(), hi.item()) == (np.min(hf), np.max(hf))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x2 = torch.as_tensor(h, device="cuda")
    r = cufold.sum(x2, stream=s)
    s.synchronize()
    assert r.item() == np.sum(h)
    r = cufold.sum(x2, stream=s.cuda_stream)   # a raw int handle
    s.synchronize()
    assert r.item() == np.sum(h)
    out = torch.full((1,), -1, dtype=torch.int64, device="cuda")
    assert cufold.sum(x, out=out) is out and out.item() == np.sum(h)
    with pytest.raises(TypeError, match="GPU"):
        cufold.sum(torch.as_tensor(h))   # a CPU tensor


@gpu_only
def test_cupy_inputs(rng):
    cp = pytest.importorskip("cupy")
    h = random(rng, np.float64, 100_003)
    x = cp.asarray(h)
    r = cufold.sum(x)
    assert isinstance(r, cp.ndarray) and r.shape == () and r.dtype == np.float64
    check_float_sum(float(r), h, np.float64)
    assert int(cufold.argmin(x[::2])) == np.argmin(h[::2])
    s = cp.cuda.Stream(non_blocking=True)
    r = cufold.max(x, stream=s)
    s.synchronize()
    assert float(r) == np.max(h)
    r = cufold.max(x, stream=s.ptr)
    s.synchronize()
    assert float(r) == np.max(h)
    hi = rng.integers(-100, 100, 5000).astype(np.int32)
    r = cufold.sum((cp.asarray(hi), cp.asarray(hi.astype(np.float32))))
    assert isinstance(r, tuple) and int(r[0]) == np.sum(hi) and float(r[1]) == np.sum(hi)


@gpu_only
def test_jax_inputs(rng):
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("jax without a GPU backend")
    pytest.importorskip("cupy" if _has("cupy") else "torch")   # JAX results are allocated through either
    import jax.numpy as jnp
    h = rng.integers(-1000, 1000, 100_003).astype(np.int32)
    x = jax.device_put(jnp.asarray(h), gpus[0])
    r = cufold.sum(x)
    assert isinstance(r, jax.Array) and r.shape == ()
    assert int(r) == np.sum(h)
    hf = random(rng, np.float32, 100_003)
    r = cufold.max(jax.device_put(jnp.asarray(hf), gpus[0]))
    assert isinstance(r, jax.Array) and r.dtype == np.float32 and float(r) == np.max(hf)


def _has(name):
    import importlib.util
    return importlib.util.find_spec(name) is not None


@gpu_only
def test_numba_device_arrays_returned(rng):
    h = random(rng, np.float32, 5000)
    r = cufold.sum(dev(h))
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    assert isinstance(r, DeviceNDArray) and r.shape == () and r.dtype == np.float32


# --- the express path: repeated whole-array calls -----------------------------------------

@pytest.mark.parametrize("name", ["sum", "max", "argmax", "mean", "var", "mean_var", "minmax"])
def test_express_repeated_calls_fresh_inputs(rng, name):
    """Calls of one length and dtype reuse one bound launch: every call must see
    its own input and write its own result(s), and earlier results must survive
    later calls (tuple results: one new array per field)."""
    n = ONE_SIZE
    fn = getattr(cufold, name)
    ref = {"sum": np.sum, "max": np.max, "argmax": np.argmax, "mean": np.mean, "var": np.var,
           "mean_var": lambda h: (np.mean(h), np.var(h)), "minmax": lambda h: (np.min(h), np.max(h))}[name]
    hs = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]
    results = [fn(dev(h)) for h in hs]
    for h, r in zip(hs, results):
        got = tuple(host(f) for f in r) if isinstance(r, tuple) else host(r)
        np.testing.assert_allclose(got, ref(h.astype(np.float64)), rtol=1e-4, atol=1e-4)
    fields = [f for r in results for f in (r if isinstance(r, tuple) else (r,))]
    assert len({id(f) for f in fields}) == len(fields)


def test_express_follows_tile_override(rng, monkeypatch):
    h = rng.integers(-50, 50, ONE_SIZE).astype(np.int32)
    x = dev(h)
    assert int(host(cufold.sum(x))) == int(h.sum())
    monkeypatch.setenv("CUFOLD_TILE", "32x1")
    p = reduce_mod.plan(cufold.plus, *(cufold.ValueType.of(t) for t in (np.int32, np.int64, np.int64)),
                        ONE_SIZE, 0, None)
    assert tuple(p.spec.tile) == (32, 1)
    assert int(host(cufold.sum(x))) == int(h.sum())


@gpu_only
def test_scalar_results_from_batches_torch(rng):
    """torch results come from batches of SMALL_BATCH 0-d views: more calls than
    a batch holds, every result its own element, all kept valid."""
    torch = pytest.importorskip("torch")
    from cufold.host import arrays as _arrays
    k = _arrays.SMALL_BATCH + 10
    xs = [torch.randn(1000, device="cuda") for _ in range(k)]
    rs = [cufold.sum(x) for x in xs]
    assert all(r.dim() == 0 and r.dtype == torch.float32 for r in rs)
    assert len({r.data_ptr() for r in rs}) == k
    got = torch.stack(rs).cpu().numpy()
    want = np.array([x.double().sum().item() for x in xs])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@gpu_only
@pytest.mark.parametrize("shape,axis", [((40, 33), 1), ((7, 5, 3), 0), ((3, 1030), 0), ((2, 3000), 0)])
def test_small_results_from_batches_torch(rng, shape, axis):
    """Small torch results of any shape (up to SMALL_RESULT_BYTES) are carved from
    batches too: each its own 16-byte-aligned C-contiguous elements, all valid after
    more calls than a batch holds; larger ones are allocated per call."""
    torch = pytest.importorskip("torch")
    from cufold.host import arrays as _arrays
    xs = [torch.randn(*shape, device="cuda") for _ in range(70)]
    rs = [cufold.sum(x, axis=axis, keepdims=axis == 0) for x in xs]
    nbytes = rs[0].numel() * 4
    ptrs = {r.data_ptr() for r in rs}
    assert len(ptrs) == len(rs) and all(p % 16 == 0 for p in ptrs)
    assert all(r.is_contiguous() for r in rs)
    assert all((r._base is not None) == (nbytes <= _arrays.SMALL_RESULT_BYTES) for r in rs)
    for x, r in zip(xs, rs):
        want = x.double().cpu().numpy().sum(axis=axis, keepdims=axis == 0)
        np.testing.assert_allclose(r.cpu().numpy(), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["sum", "argmin", "max"])
def test_express_contiguous_then_strided_same_length(rng, name):
    """A strided input of the length and dtype of an earlier contiguous one must not
    reuse the contiguous call's bound launch (it writes pointers and lengths only)."""
    n = 200
    fn, ref = getattr(cufold, name), getattr(np, name)
    h = rng.standard_normal(3 * n)
    d = dev(h)
    assert host(fn(dev(h[:n]))) == pytest.approx(ref(h[:n]))
    assert host(fn(d[::3])) == pytest.approx(ref(h[::3]))
    assert host(fn(d[1::3])) == pytest.approx(ref(h[1::3]))


def test_express_first_call_makes_one_kernel(rng):
    """The first call with an operator makes (on a GPU: compiles) only the kernel it
    runs: for an 8-byte-aligned input the 8-byte-load one; the kernel for inputs
    that are not aligned is made at the first such input."""
    op = cufold.Op(lambda a, b: a + b, identity=0, commutative=True)
    n = WIDE_SIZES[2]
    h = rng.integers(-50, 50, n + 1).astype(np.float32)
    d = dev(h)

    def made():
        return [k[0][1].wide for k in launch_mod._kernels if k[0][0] == "reduce" and k[0][1].op is op]

    assert host(cufold.reduce(d[:n], op)) == h[:n].sum()
    assert made() == [True]
    assert host(cufold.reduce(d[1:], op)) == h[1:].sum()
    assert sorted(made()) == [False, True]


_FOLD_OVERLOADS = r"""
import collections, importlib
import cufold
from cufold.values import ValueType
from numba.cuda import dispatcher
R = importlib.import_module("cufold.device.reduce")
compiled = collections.defaultdict(list)
compile_device = dispatcher.CUDADispatcher.compile_device

def counted(self, args, return_type=None):
    if args not in self.overloads:
        compiled[(id(self), self.py_func.__name__)].append(tuple(types.unliteral(a) for a in args))
    return compile_device(self, args, return_type)

dispatcher.CUDADispatcher.compile_device = counted
f32 = ValueType.of(np.float32)
arr = lambda t: types.Array(t, 1, "C")
sig = (arr(types.float32), types.int64, arr(types.float32), arr(types.uint32), arr(types.float32), types.float32,
       types.boolean)
op = cufold.Op(lambda a, b: max(a, b), commutative=True)
for wide, ordered in ((True, False), (False, False), (False, True)):
    spec = R.Spec(op, f32, f32, f32, "value", "value", 0, R.Tile(128, 32), "last_block", "warp", ordered, wide)
    compile_sm90(R.reduce_kernel(spec), sig)
folds = {key: sigs for key, sigs in compiled.items() if "fold" in key[1]}   # one key per device function
print("TWICE", (sorted(name for (_, name), sigs in folds.items() if len(sigs) != len(set(sigs))), len(folds)))
"""


def test_tile_folds_compile_once():
    """The tile folds, the largest device functions of a reduce kernel, are compiled
    once per kernel for sm_90: a literal ``have = False`` argument made Numba compile
    them twice (for ``Literal[bool](False)`` and for ``bool``), a third of the first
    call's compile time."""
    twice, folds = run_sm90_script(_FOLD_OVERLOADS, "TWICE")
    assert folds >= 9 and twice == []


def test_reduce_kernel_compiles_without_lto(monkeypatch):
    """The reduce kernel asks ``cuda.jit`` for no link-time optimisation (a user's operator
    compiles a third faster, the kernel runs the same), keeping its other options; the
    rest keep Numba's default. ``CUFOLD_LTO=0|1`` overrides every kernel's choice."""
    f32 = cufold.ValueType.of(np.float32)
    for transform in (None, cufold.ops.as_transform(lambda v: v * v)):
        spec = reduce_mod.Spec(cufold.plus, f32, f32, f32, "value", "value", 0, reduce_mod.Tile(128, 32),
                               "last_block", "warp", False, False, transform=transform)
        options = reduce_mod.reduce_kernel(spec).jit_options
        assert options["lto"] is False and ("launch_bounds" in options) == (transform is not None)
    monkeypatch.setattr(launch_mod, "SIMULATOR", False)
    for forced, want in (("0", False), ("1", True)):
        monkeypatch.setenv("CUFOLD_LTO", forced)
        assert launch_mod._with_lto_override({"lto": not want, "fastmath": True}) == {"lto": want, "fastmath": True}
    monkeypatch.delenv("CUFOLD_LTO")
    assert launch_mod._with_lto_override({"fastmath": True}) == {"fastmath": True}


# --- 8-byte loads of 4-byte items ------------------------------------------------------------

# Simulator: a whole tile (even), one item past it (a tile holding only the odd last item),
# and 4 tiles + 77 (more tiles than the 4 blocks: the grid-stride loop goes round; a last
# partial tile of pairs and the odd item). 257 (2 tiles + the odd item) and 1101 (8 tiles +
# 77) crossed the same boundaries with more simulated blocks.
WIDE_SIZES = (128, 129, 589) if SIMULATOR else (4096, 4097, 8193, 2**20 + 1, 2**22 + 4097)


@pytest.mark.parametrize("dtype", (np.int32, np.uint32, np.float32), ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("offset", (0, 1), ids=("aligned", "misaligned"))
def test_wide_loads_every_lift(rng, dtype, offset):
    """4-byte items read as 8-byte pairs where the input is 8-byte aligned, and
    one by one where it is not (``x[1:]``): sums, min/max and mean/var (argmax,
    which reads 4 bytes a load, beside them), odd and even lengths, one item past a
    whole number of tiles (a block whose tile holds only the odd last item),
    through the express path and the general one (``algorithm=``)."""
    for n in WIDE_SIZES:
        h = random(rng, dtype, n + offset)
        d = dev(h)[offset:]
        x = h[offset:]
        p = reduce_mod.plan(cufold.plus, *_vts(dtype), n, 0, None)
        assert p.wide is not None and p.wide.spec.wide
        from cufold.values import ValueType
        arg_vts = (ValueType.of(np.dtype(dtype)), ValueType.of((np.dtype(dtype), np.int64)), ValueType.of(np.int64))
        assert reduce_mod.plan(cufold.argmax, *arg_vts, n, 0, None, lift="index", project="index").wide is None
        assert reduce_mod.plan(cufold.plus, *_vts(dtype), n, 0, None).for_input(
            cufold.host.arrays.describe(d)) is (p if offset else p.wide)
        if dtype == np.float32:
            check_float_sum(host(cufold.sum(d)), x, np.dtype(dtype))
            check_float_sum(host(cufold.sum(d, algorithm="two_pass")), x, np.dtype(dtype))
            m, v = host(cufold.mean_var(d))
            np.testing.assert_allclose([m, v], [x.astype(np.float64).mean(), x.astype(np.float64).var()],
                                       rtol=1e-5, atol=1e-6)
        else:
            assert host(cufold.sum(d)) == host(cufold.sum(d, algorithm="two_pass")) == np.sum(x)
        for pos in (0, 1, n - 2, n - 1, n // 2):     # the extreme at both halves of a pair, and the odd end
            y = x.copy()
            y[pos] = np.iinfo(dtype).max if dtype != np.float32 else 1e30
            assert host(cufold.argmax(dev(np.concatenate([h[:offset], y]))[offset:])) == np.argmax(y), (n, pos)
        lo, hi = host(cufold.minmax(d))
        assert (lo, hi) == (x.min(), x.max())


def _vts(dtype):
    from cufold.values import ValueType
    f = ValueType.of(np.dtype(dtype))
    acc = ValueType.of(np.float32 if dtype == np.float32 else (np.int64 if dtype == np.int32 else np.uint64))
    return f, acc, acc


def test_wide_loads_can_be_turned_off(monkeypatch):
    """CUFOLD_WIDE_LOADS=0 (read at import) is the module's WIDE_LOADS: plans then have no wide twin."""
    from cufold.values import ValueType
    f32 = cufold.ValueType.of(np.float32)
    monkeypatch.setattr(reduce_mod, "WIDE_LOADS", False)
    reduce_mod._plan.cache_clear()
    try:
        assert reduce_mod.plan(cufold.plus, f32, f32, f32, 1 << 20, 0, None).wide is None
    finally:
        monkeypatch.undo()
        reduce_mod._plan.cache_clear()
    assert reduce_mod.plan(cufold.plus, f32, f32, f32, 1 << 20, 0, None).wide is not None


_HINTED_LOADS = r"""
import importlib
import cufold
from cufold.values import ValueType
R = importlib.import_module("cufold.device.reduce")
f32 = ValueType.of(np.float32)
arr = lambda t: types.Array(t, 1, "C")
sig = (arr(types.float32), types.int64, arr(types.float32), arr(types.uint32), arr(types.float32), types.float32,
       types.boolean)
wide = R.Spec(cufold.plus, f32, f32, f32, "value", "value", 0, R.Tile(256, 16), "last_block", "warp", False, True)
counts = {}
for hint in ("plain", "l2_128", "l2_256"):
    ptx = compile_sm90(R.reduce_kernel(wide._replace(hint=hint)), sig)
    counts[hint] = (len(re.findall(r"ld\.global\.L2::128B\.u64", ptx)), len(re.findall(r"ld\.global\.L2::256B\.u64", ptx)))
print("HINTED", counts)
"""


def test_wide_loads_with_l2_prefetch(rng, monkeypatch):
    """``CUFOLD_REDUCE_LOAD=l2_128|l2_256`` (for study): the 8-byte loads ask L2 for 128- or
    256-byte fetches (``quads.load8_l2_*``; every load of the full and the partial tile for
    sm_90), and the sums they fold are the plain loads' (the simulator reads plainly)."""
    counts = run_sm90_script(_HINTED_LOADS, "HINTED")
    assert counts["plain"] == (0, 0)
    assert counts["l2_128"][0] > 0 and counts["l2_128"][1] == 0
    assert counts["l2_256"][1] == counts["l2_128"][0] and counts["l2_256"][0] == 0
    n = WIDE_SIZES[2]
    h = rng.integers(-50, 50, n).astype(np.float32)
    for hint in ("l2_128", "l2_256"):
        monkeypatch.setattr(reduce_mod, "WIDE_LOAD_HINT", hint)
        reduce_mod._plan.cache_clear()
        try:
            op = cufold.Op(lambda a, b: a + b, identity=0, commutative=True)     # a new op: a new plan
            assert host(cufold.reduce(dev(h), op)) == h.sum()
            ran = [k[0][1] for k in launch_mod._kernels if k[0][0] == "reduce" and k[0][1].op is op]
            assert [(s.wide, s.hint) for s in ran] == [(True, hint)]
        finally:
            monkeypatch.undo()
            reduce_mod._plan.cache_clear()
