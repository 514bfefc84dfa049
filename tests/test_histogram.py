"""histogram and bincount against NumPy: every algorithm (shared-memory bins,
global atomics, each with and without warp aggregation), inputs of every
integer width and float dtype, skewed data, values on the edges, NaN and
out-of-range values, weights, edge arrays, empty inputs and NumPy's errors.

Simulator: blocks of 64 threads x 2 items, a few hundred items (the grid-stride
loop and the merge of several blocks' bins still run). GPU: the library's
tiles and up to 2^22 items. Outputs are poisoned when allocated.
"""

import importlib

import numpy as np
import pytest
from numba import cuda

from conftest import SIMULATOR, gpu_only

from cufold.host import arrays as _arrays, programs as _programs
# The module (once exported, cufold.device.histogram may be a function of the same name).
H = importlib.import_module("cufold.device.histogram")

ALGS = H.ALGORITHMS
INT_DTYPES = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)
N = 300 if SIMULATOR else 1_000_003


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    real = _arrays.empty

    def empty(like, shape, dtype, stream=None):
        obj, arr = real(like, shape, dtype, stream)
        dt = np.dtype(dtype)
        if arr.size and hasattr(obj, "copy_to_device"):
            if dt.kind == "f":
                bad = dt.type(-777)
            elif dt.kind == "b":
                bad = True
            else:
                bad = dt.type(np.iinfo(dt).max // 3)
            obj.copy_to_device(np.full(arr.shape, bad, dt))
        return obj, arr

    monkeypatch.setattr(_arrays, "empty", empty)


def dev(h):
    return cuda.to_device(np.ascontiguousarray(h))


def host(r):
    if isinstance(r, tuple):
        return tuple(host(v) for v in r)
    return r.copy_to_host()


def skewed(rng, n, top):
    """Mostly one hot value, the rest spread: warps hold many equal bins."""
    x = rng.integers(0, top, n)
    x[rng.random(n) < 0.8] = top // 3
    return x


# --- bincount ------------------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", (None,) + ALGS)
@pytest.mark.parametrize("dtype", INT_DTYPES + (np.bool_,), ids=lambda d: np.dtype(d).name)
def test_bincount_widths(dtype, algorithm, rng):
    if SIMULATOR and algorithm is not None and dtype not in (np.int8, np.uint64, np.bool_):
        pytest.skip("simulator: every algorithm on a few widths")
    dt = np.dtype(dtype)
    x = rng.integers(0, 2 if dt.kind == "b" else 60, N).astype(dt)
    r = host(H.bincount(dev(x), algorithm=algorithm))
    assert r.dtype == np.int64
    assert np.array_equal(r, np.bincount(x.astype(np.int64)))


@pytest.mark.parametrize("algorithm", ALGS)
def test_bincount_skewed_and_minlength(algorithm, rng):
    x = skewed(rng, N, 50).astype(np.int32)
    for minlength in (0, 10, 77):
        r = host(H.bincount(dev(x), minlength=minlength, algorithm=algorithm))
        assert np.array_equal(r, np.bincount(x, minlength=minlength)), minlength


@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("wdt", (np.float64, np.float32, np.int16))
def test_bincount_weights(wdt, algorithm, rng):
    if SIMULATOR and wdt is not np.float64 and algorithm != "shared_match":
        pytest.skip("simulator: weight dtypes with one algorithm")
    x = skewed(rng, N, 40).astype(np.uint16)
    w = (rng.standard_normal(N) * 10).astype(wdt)
    r = host(H.bincount(dev(x), weights=dev(w), algorithm=algorithm))
    ref = np.bincount(x, weights=w)
    assert r.dtype == np.float64 and r.shape == ref.shape
    assert np.allclose(r, ref, rtol=1e-12, atol=1e-9)


def test_bincount_many_bins_global(rng):
    top = 20_000 if SIMULATOR else 3_000_000
    x = rng.integers(0, top, N).astype(np.int64)
    x[0] = top - 1
    for alg in (None, "global", "global_match"):
        assert np.array_equal(host(H.bincount(dev(x), algorithm=alg)), np.bincount(x))
    with pytest.raises(ValueError, match="shared memory"):
        H.bincount(dev(x), algorithm="shared_match")


def test_bincount_empty_and_errors(rng):
    r = host(H.bincount(dev(np.zeros(0, np.int32)), minlength=5))
    assert np.array_equal(r, np.zeros(5, np.int64))
    assert host(H.bincount(dev(np.zeros(0, np.uint8)))).shape == (0,)
    with pytest.raises(ValueError, match="negative"):
        H.bincount(dev(np.array([1, 2, -1, 3], np.int16)))
    with pytest.raises(TypeError, match="integers"):
        H.bincount(dev(np.ones(3, np.float32)))
    with pytest.raises(ValueError, match="minlength"):
        H.bincount(dev(np.ones(3, np.int32)), minlength=-1)
    with pytest.raises(ValueError, match="equally long"):
        H.bincount(dev(np.ones(3, np.int32)), weights=dev(np.ones(4)))
    with pytest.raises(ValueError, match="unknown histogram algorithm"):
        H.bincount(dev(np.ones(3, np.int32)), algorithm="sort")
    with pytest.raises(TypeError, match="host"):
        H.bincount(np.ones(3, np.int32))


# --- histogram: equal-width bins ----------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", (None,) + ALGS)
@pytest.mark.parametrize("dtype", (np.float32, np.float64, np.float16, np.int32, np.uint8),
                         ids=lambda d: np.dtype(d).name)
def test_histogram_uniform(dtype, algorithm, rng):
    if SIMULATOR and algorithm is not None and dtype is not np.float32:
        pytest.skip("simulator: every algorithm on float32")
    dt = np.dtype(dtype)
    if dt.kind == "f":
        x = (rng.standard_normal(N) * 2).astype(dt)
        rng_ = (-2.5, 3.0)
    else:
        x = rng.integers(0, 120, N).astype(dt)
        rng_ = (10, 100)
    for bins, range_ in ((17, rng_), (9, None)):
        c, e = host(H.histogram(dev(x), bins, range=range_, algorithm=algorithm))
        rc, re = np.histogram(x, bins, range=range_)
        assert e.dtype == re.dtype and np.array_equal(e, re), (bins, range_)
        assert c.dtype == np.int64 and np.array_equal(c, rc), (bins, range_)


@pytest.mark.parametrize("dt, bins, range_", ((np.float32, 10, (-1.0, 0.7)), (np.float64, 10, (-1.0, 0.7)),
                                             (np.float32, 997, (-1.0, 0.7)), (np.float32, 70001, (-1.0, 0.7)),
                                             (np.float32, 64, (1000.0, 1000.5)), (np.float16, 9, (-3, 2))),
                         ids=str)
def test_histogram_values_on_edges(dt, bins, range_, rng):
    """Values exactly on the edges (and 1 to 64 ulps off them): NumPy's bin each time;
    the last edge is in the last bin; outside the range and NaN are skipped; many
    bins, a range far from zero, and float16 (edges rounded coarsely) too."""
    _, edges = np.histogram(np.zeros(0, dt), bins, range=range_)
    if edges.size > 200:                               # a sample of them, both ends kept
        edges = np.concatenate([edges[:2], rng.choice(edges, 196), edges[-2:]])
    near = [edges]
    for direction in (np.inf, -np.inf):                # 1, 2, 3, 8 and 64 ulps off each edge
        e = edges.astype(dt)
        for k in range(1, 65):
            e = np.nextafter(e, dt(direction))
            if k in (1, 2, 3, 8, 64):
                near.append(e)
    x = np.concatenate(near + [np.array([np.nan, -5, 5, np.inf, -np.inf])])
    x = np.tile(x.astype(dt), 2)
    x = np.concatenate([x, rng.uniform(*range_, 4000).astype(dt)])       # away from the edges
    c, e = host(H.histogram(dev(x), bins, range=range_))
    rc, re = np.histogram(x, bins, range=range_)
    assert np.array_equal(e, re) and np.array_equal(c, rc), dt


@pytest.mark.parametrize("algorithm", ALGS)
def test_histogram_skewed_nan(algorithm, rng):
    x = (rng.standard_normal(N) * 0.05).astype(np.float32)     # concentrated: hot bins
    x[rng.random(N) < 0.05] = np.nan
    c, e = host(H.histogram(dev(x), 64, range=(-1, 1), algorithm=algorithm))
    rc, re = np.histogram(x, 64, range=(-1, 1))
    assert np.array_equal(c, rc) and np.array_equal(e, re)


def test_histogram_range_from_data(rng):
    x = rng.integers(-50, 50, N).astype(np.int64)
    c, e = host(H.histogram(dev(x), 7))
    rc, re = np.histogram(x, 7)
    assert np.array_equal(c, rc) and np.array_equal(e, re) and e.dtype == np.float64
    const = np.full(40, 3.25, np.float32)                      # min == max: +-0.5
    c, e = host(H.histogram(dev(const), 4))
    rc, re = np.histogram(const, 4)
    assert np.array_equal(c, rc) and np.array_equal(e, re)
    bad = np.array([1.0, np.nan, 2.0], np.float32)
    with pytest.raises(ValueError, match="not finite"):
        H.histogram(dev(bad), 4)
    c, e = host(H.histogram(dev(bad), 4, range=(0, 4)))           # NaN skipped with a range
    assert np.array_equal(c, np.histogram(bad, 4, range=(0, 4))[0])


def test_histogram_many_bins(rng):
    x = rng.random(N).astype(np.float32)
    bins = 9000 if SIMULATOR else 65536
    for alg in (None, "global"):
        c, e = host(H.histogram(dev(x), bins, range=(0, 1), algorithm=alg))
        rc, re = np.histogram(x, bins, range=(0, 1))
        assert np.array_equal(c, rc) and np.array_equal(e, re)


def test_histogram_repeated_range_uses_cached_edges(rng, monkeypatch):
    """A (bins, range, dtype) seen before takes its edges from the cache (NumPy is
    not asked again), and each call still returns its own edges array."""
    x = rng.random(N)
    rc, re = np.histogram(x, 12, range=(0.25, 0.75))
    c, e = H.histogram(dev(x), 12, range=(0.25, 0.75))
    assert np.array_equal(host(c), rc) and np.array_equal(host(e), re)
    e[:] = dev(np.full(13, -7.0))                      # the caller owns what it got

    def not_again(*a, **k):
        raise AssertionError("edges recomputed for a cached (bins, range)")
    monkeypatch.setattr(H.np, "histogram_bin_edges", not_again)
    c, e = host(H.histogram(dev(x), 12, range=(0.25, 0.75)))
    assert np.array_equal(c, rc) and np.array_equal(e, re)


# --- histogram: edge arrays, weights, empty, errors ------------------------------------------------------

@pytest.mark.parametrize("algorithm", (None, "global_match", "shared"))
def test_histogram_edge_array(algorithm, rng):
    x = (rng.standard_normal(N) * 3).astype(np.float32)
    edges = np.array([-4.0, -1.5, -1.5, 0.0, 0.1, 2.0, 7.0])
    x[:len(edges)] = edges                                       # values on the edges
    for given in (edges, list(edges), dev(edges), edges.astype(np.int64)):
        c, e = host(H.histogram(dev(x), given, algorithm=algorithm))
        ref_edges = np.asarray(given.copy_to_host() if hasattr(given, "copy_to_host") else given)
        rc, re = np.histogram(x, ref_edges)
        assert np.array_equal(c, rc) and np.array_equal(e, re) and e.dtype == re.dtype
    with pytest.raises(ValueError, match="monoton"):
        H.histogram(dev(x), np.array([0.0, 2.0, 1.0]))


@pytest.mark.parametrize("wdt", (np.float64, np.float32, np.int32))
def test_histogram_weights(wdt, rng):
    x = rng.standard_normal(N)
    w = (rng.random(N) * 5).astype(wdt)
    c, e = host(H.histogram(dev(x), 11, range=(-2, 2), weights=dev(w)))
    rc, re = np.histogram(x, 11, range=(-2, 2), weights=w)
    assert c.dtype == rc.dtype and np.array_equal(e, re)
    assert np.allclose(c, rc, rtol=1e-6 if wdt is np.float32 else 1e-12)
    c, _ = host(H.histogram(dev(x), np.array([-1.0, 0.0, 0.5, 3.0]), weights=dev(w)))
    rc, _ = np.histogram(x, np.array([-1.0, 0.0, 0.5, 3.0]), weights=w)
    assert np.allclose(c, rc, rtol=1e-5)


def test_histogram_empty_and_errors():
    c, e = host(H.histogram(dev(np.zeros(0, np.float32)), 5))
    rc, re = np.histogram(np.zeros(0, np.float32), 5)
    assert np.array_equal(c, rc) and np.array_equal(e, re)
    x = dev(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="estimators"):
        H.histogram(x, "auto")
    with pytest.raises(ValueError, match="positive"):
        H.histogram(x, 0, range=(0, 1))
    with pytest.raises(ValueError, match="larger than min"):
        H.histogram(x, 3, range=(1, 0))
    with pytest.raises(TypeError, match="integers or floats"):
        H.histogram(dev(np.ones(4, np.bool_)), 3)
    with pytest.raises(ValueError, match="1-D"):
        H.histogram(dev(np.ones((2, 2), np.float32)), 3)


# --- the host path: Programs, synchronisations, results of their own ------------------------------------

@pytest.fixture
def builds(monkeypatch):
    """How many Programs have been planned (a list holding the count)."""
    count = [0]
    real = _programs.Builder.build

    def build(self, finish=None):
        count[0] += 1
        return real(self, finish)

    monkeypatch.setattr(_programs.Builder, "build", build)
    return count


def test_same_signature_reuses_its_program(rng, builds):
    """Each call shape is planned once: later calls with new data (new min/max too)
    plan nothing and give NumPy's results."""
    n = N + 3                                         # a signature no other test has
    edges = [-3.0, -0.5, 0.0, 0.25, 2.0]
    calls = (
        ("range", lambda x, k: H.histogram(dev(x), 29, range=(-2, 2)),
         lambda x, k: np.histogram(x, 29, range=(-2, 2))),
        ("data range", lambda x, k: H.histogram(dev(x), 29), lambda x, k: np.histogram(x, 29)),
        ("edges", lambda x, k: H.histogram(dev(x), edges), lambda x, k: np.histogram(x, edges)),
        ("bincount", lambda x, k: H.bincount(dev(k), minlength=40), lambda x, k: np.bincount(k, minlength=40)),
    )
    for name, ours, numpys in calls:
        before = builds[0]
        for i in range(4):
            x = (rng.standard_normal(n) * (1 + i)).astype(np.float32)
            k = rng.integers(0, 30 + i, n).astype(np.int32)
            if i == 1:
                planned = builds[0]
            got, want = host(ours(x, k)), numpys(x, k)
            for g, r in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert g.dtype == r.dtype and np.array_equal(g, r), (name, i)
        assert planned > before and builds[0] == planned, name


def test_long_edge_array_is_given_per_call(rng, builds, monkeypatch):
    """Past KEYED_EDGES the edges are uploaded on every call, to one Program."""
    monkeypatch.setattr(H, "KEYED_EDGES", 3)
    x = (rng.standard_normal(N + 5) * 3).astype(np.float32)      # a signature no other test has
    before = builds[0]
    for i in range(3):
        edges = np.sort(rng.uniform(-5, 5, 7)) + i
        if i == 1:
            planned = builds[0]
        c, e = host(H.histogram(dev(x), edges))
        rc, re = np.histogram(x, edges)
        assert np.array_equal(c, rc) and np.array_equal(e, re)
    assert planned > before and builds[0] == planned


def test_synchronisations(rng, host_waits):
    """histogram with range= (or host edges) never reads the device back; without
    range=, with device edges, and bincount: exactly one read per call."""
    reads = host_waits
    x = dev(rng.random(N).astype(np.float32))
    k = dev(rng.integers(0, 50, N).astype(np.int16))
    w = dev(rng.random(N))
    cases = ((0, lambda: H.histogram(x, 33, range=(0.25, 0.75))),
             (0, lambda: H.histogram(x, 33, range=(0.25, 0.75), weights=w)),
             (0, lambda: H.histogram(x, [0.0, 0.5, 0.625, 1.0])),
             (0, lambda: H.bincount(dev(np.zeros(0, np.int32)), minlength=3)),
             (1, lambda: H.histogram(x, 33)),
             (1, lambda: H.histogram(x, dev(np.array([0.0, 0.5, 0.625, 1.0])))),
             (1, lambda: H.bincount(k)),
             (1, lambda: H.bincount(k, weights=w, minlength=60)))
    for expected, call in cases:
        for _ in range(2):                           # planned, then found
            reads[0] = 0
            call()
            assert reads[0] == expected


def test_every_call_returns_its_own_edges(rng):
    x = rng.random(N)
    given = dev(np.array([0.0, 0.25, 0.5, 1.0]))
    for make in (lambda: H.histogram(dev(x), 8, range=(0, 1)), lambda: H.histogram(dev(x), 8),
                 lambda: H.histogram(dev(x), [0.0, 0.25, 0.5, 1.0]), lambda: H.histogram(dev(x), given)):
        _, first = make()
        _, second = make()
        want = host(second)
        first[:] = dev(np.full(first.shape, -7.0))       # the caller owns what it got
        assert np.array_equal(host(second), want) and np.array_equal(host(make()[1]), want)
    assert np.array_equal(host(given), [0.0, 0.25, 0.5, 1.0])


# --- GPU: sizes of real use ------------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("algorithm", (None,) + ALGS)
@pytest.mark.parametrize("bins", (64, 1024, 8192, 65536))
def test_gpu_large(bins, algorithm, rng):
    if algorithm is not None and algorithm.startswith("shared") and bins > 8192:
        pytest.skip("does not fit shared memory")
    n = 1 << 22
    for x in (rng.random(n).astype(np.float32), (rng.standard_normal(n) * 0.01 + 0.5).astype(np.float32)):
        c, e = host(H.histogram(dev(x), bins, range=(0, 1), algorithm=algorithm))
        rc, re = np.histogram(x, bins, range=(0, 1))
        assert np.array_equal(c, rc) and np.array_equal(e, re)
        k = (x * bins).astype(np.int32).clip(0, bins - 1)
        assert np.array_equal(host(H.bincount(dev(k), algorithm=algorithm)), np.bincount(k))


# --- one launch, or a zeroing launch first ------------------------------------------------------

@pytest.mark.parametrize("once_max", (1 << 14, 8), ids=("one-launch", "zeroed-first"))
@pytest.mark.parametrize("algorithm", ("shared", "global_match"))
def test_repeated_calls_one_launch_and_zeroed_first(rng, monkeypatch, once_max, algorithm):
    """Up to ONCE_MAX_BINS bins a call is one launch whose scratch accumulator must be
    left zero for the next call; above it, a zeroing launch runs first (and, for
    float32 weights, a converting one after). Several calls of one signature on fresh
    data, with and without weights, must each give NumPy's result."""
    monkeypatch.setattr(H, "ONCE_MAX_BINS", once_max)
    H._count_programs.clear()          # Programs planned under the other setting
    for _ in range(3):
        x = rng.random(N)
        w = rng.standard_normal(N).astype(np.float32)
        got, edges = host(H.histogram(dev(x), 64, (0.1, 0.9), algorithm=algorithm))
        want, want_edges = np.histogram(x, 64, (0.1, 0.9))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(edges, want_edges)
        got_w, _ = host(H.histogram(dev(x), 64, (0.1, 0.9), weights=dev(w), algorithm=algorithm))
        assert got_w.dtype == np.float32
        np.testing.assert_allclose(got_w, np.histogram(x, 64, (0.1, 0.9), weights=w.astype(np.float64))[0],
                                   rtol=1e-4, atol=1e-4)
        k = rng.integers(0, 50, N)
        np.testing.assert_array_equal(host(H.bincount(dev(k), minlength=64, algorithm=algorithm)),
                                      np.bincount(k, minlength=64))


# --- generated inputs (cufold.counting, cufold.constant) for x and weights ---------------------------------

import cufold  # noqa: E402

# (generated input, the NumPy array it stands for)
#: bincount of a counting input has as many bins as items: few enough for every algorithm
#: (the shared-memory ones take at most 8192 int32 bins)
NB = 300 if SIMULATOR else 4000
GEN_INTS = (
    (lambda: cufold.counting(NB, start=5, dtype=np.int32), lambda: np.arange(5, 5 + NB, dtype=np.int32)),
    (lambda: cufold.counting(NB, dtype=np.uint16), lambda: np.arange(NB, dtype=np.uint16)),
    (lambda: cufold.constant(NB, 7, dtype=np.uint8), lambda: np.full(NB, 7, np.uint8)),
)
GEN_VALUES = (
    (lambda: cufold.counting(N, start=-40, dtype=np.float32), lambda: np.arange(-40, N - 40, dtype=np.float32)),
    (lambda: cufold.counting(N, start=3, dtype=np.int16), lambda: np.arange(3, N + 3, dtype=np.int16)),
    (lambda: cufold.counting(N), lambda: np.arange(N)),
    (lambda: cufold.constant(N, 2.5), lambda: np.full(N, 2.5)),
)
GEN_IDS = ("counting-f32", "counting-i16", "counting-i64", "constant-f64")


def _close(got, want):
    # NumPy sums float32 weights in float32 (by differences of a cumulative sum): loose.
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


# Simulator: every algorithm on counting int32 and constant uint8; counting uint16 (the
# load of x, _bin_int(_load(key)), the same for every algorithm) through the default one.
BINCOUNT_GEN_CASES = [(g, a) for g in range(len(GEN_INTS)) for a in (None,) + ALGS
                      if not (SIMULATOR and a is not None and g == 1)]


@pytest.mark.parametrize("gen,algorithm", BINCOUNT_GEN_CASES,
                         ids=["%s-%s" % (("counting-i32", "counting-u16", "constant-u8")[g], a)
                              for g, a in BINCOUNT_GEN_CASES])
def test_bincount_generated(gen, algorithm, rng):
    """bincount of a generated x (counting with a start and a dtype, constant), alone,
    with stored weights and with generated weights; stored x with generated weights.

    Simulator, a named algorithm: counts (int64), generated float32 and float64 weights
    (every adder and output dtype: ``_adder``, the kernel's out dtype); minlength (more
    bins, the same kernel) and stored float32 weights (the weights' load, ``_value_of``,
    the same for every algorithm) through the default algorithm."""
    make, ref = GEN_INTS[gen]
    x = ref()
    r = host(H.bincount(make(), algorithm=algorithm))
    assert r.dtype == np.int64 and np.array_equal(r, np.bincount(x))
    pairwise = SIMULATOR and algorithm is not None
    if not pairwise:
        assert np.array_equal(host(H.bincount(make(), minlength=NB + 50, algorithm=algorithm)),
                              np.bincount(x, minlength=NB + 50))
        w = rng.random(NB).astype(np.float32)
        _close(host(H.bincount(make(), weights=dev(w), algorithm=algorithm)), np.bincount(x, weights=w))
    _close(host(H.bincount(make(), weights=cufold.counting(NB, start=-3, dtype=np.float32), algorithm=algorithm)),
           np.bincount(x, weights=np.arange(-3, NB - 3, dtype=np.float32)))
    k = rng.integers(0, 40, NB)
    _close(host(H.bincount(dev(k), weights=cufold.constant(NB, 0.5), algorithm=algorithm)),
           np.bincount(k, weights=np.full(NB, 0.5)))


def test_bincount_generated_negative_and_bool():
    with pytest.raises(ValueError, match="negative"):
        H.bincount(cufold.counting(N, start=-1, dtype=np.int32))
    assert np.array_equal(host(H.bincount(cufold.constant(N, True))), [0, N])
    with pytest.raises(TypeError, match="integers"):
        H.bincount(cufold.counting(N, dtype=np.float32))


def _modes(ref_x):
    """(bins, range, what NumPy takes as bins) of every histogram path: range=, the
    data's range (the min/max pass), host edges (keyed, and uploaded per call past
    KEYED_EDGES: see the test), a device edge array."""
    lo, hi = float(np.min(ref_x)), float(np.max(ref_x))
    edges = np.array([lo - 1, lo + 0.25 * (hi - lo), lo + 0.5 * (hi - lo) + 0.5, hi + 0.5, hi + 3])
    return (("range", 13, (lo - 2, lo + 0.8 * (hi - lo) + 1), 13),    # some items out on both sides
            ("data", 9, None, 9),
            ("host-edges", edges, None, edges),
            ("device-edges", dev(edges), None, edges))


# Simulator: every algorithm on counting float32 and constant; the other generated x
# through the default algorithm.
HISTOGRAM_GEN_CASES = [(g, a) for g in range(len(GEN_VALUES)) for a in (None,) + ALGS
                       if not (SIMULATOR and a is not None and g not in (0, 3))]


@pytest.mark.parametrize("gen,algorithm", HISTOGRAM_GEN_CASES,
                         ids=["%s-%s" % (GEN_IDS[g], a) for g, a in HISTOGRAM_GEN_CASES])
def test_histogram_generated(gen, algorithm, rng, monkeypatch):
    """histogram of a generated x in every range/edges mode, unweighted, with stored
    and with generated weights; a stored x with generated weights.

    Simulator, a named algorithm: the kernel composes three independent parts, the bin
    of an item (mode and x's load: ``_bin_of``), its weight (``_value_of``) and the add
    (algorithm and weighted: ``_adder``). The default algorithm takes every mode with
    every weighting; a named one takes every mode, and every weighting, once each
    (unweighted, stored, generated weights in turn), and the stored x with generated
    weights in two modes (host edges, and range= or device edges)."""
    monkeypatch.setattr(H, "KEYED_EDGES", 4)         # the 5 host edges: uploaded per call
    make, ref = GEN_VALUES[gen]
    x = ref()
    w = rng.random(N).astype(np.float32)
    ref_w = np.arange(2, N + 2, dtype=np.float64)
    pairwise = SIMULATOR and algorithm is not None
    for k, (name, bins, range_, ref_bins) in enumerate(_modes(x)):
        if not pairwise or k % 3 == 0:
            c, e = host(H.histogram(make(), bins, range_, algorithm=algorithm))
            rc, re = np.histogram(x, ref_bins, range_)
            assert np.array_equal(c, rc) and np.array_equal(e, re) and e.dtype == re.dtype, name
        if not pairwise or k % 3 == 1:
            c, e = host(H.histogram(make(), bins, range_, weights=dev(w), algorithm=algorithm))
            _close(c, np.histogram(x, ref_bins, range_, weights=w)[0])
            if pairwise:
                assert np.array_equal(e, np.histogram(x, ref_bins, range_)[1]), name
        if not pairwise or k % 3 == 2:
            c, e = host(H.histogram(make(), bins, range_, weights=cufold.counting(N, 2, dtype=np.float64),
                                    algorithm=algorithm))
            _close(c, np.histogram(x, ref_bins, range_, weights=ref_w)[0])
            if pairwise:
                assert np.array_equal(e, np.histogram(x, ref_bins, range_)[1]), name
    y = rng.standard_normal(N)
    modes_y = _modes(y)
    if pairwise:
        modes_y = modes_y[gen % 4: gen % 4 + 1] + modes_y[2:3]    # range= / device edges, and host edges
    for name, bins, range_, ref_bins in modes_y:
        c, _ = host(H.histogram(dev(y), bins, range_, weights=cufold.constant(N, 1.5, dtype=np.float32),
                                algorithm=algorithm))
        _close(c, np.histogram(y, ref_bins, range_, weights=np.full(N, 1.5, np.float32))[0])


@pytest.mark.parametrize("once_max", (1 << 14, 8), ids=("one-launch", "zeroed-first"))
@pytest.mark.parametrize("algorithm", ("shared", "global_match"))
def test_generated_one_launch_and_zeroed_first(monkeypatch, once_max, algorithm):
    """Generated x and weights through both launch paths (the zeroed-first one with
    float32 weights also converts), called twice (the one-launch scratch left zero)."""
    monkeypatch.setattr(H, "ONCE_MAX_BINS", once_max)
    H._count_programs.clear()
    x, w = np.arange(-10, N - 10, dtype=np.float32), np.full(N, 0.25, np.float32)
    for _ in range(2):
        c, e = host(H.histogram(cufold.counting(N, -10, np.float32), 64, (0, N / 2), algorithm=algorithm))
        rc, re = np.histogram(x, 64, (0, N / 2))
        assert np.array_equal(c, rc) and np.array_equal(e, re)
        c, _ = host(H.histogram(cufold.counting(N, -10, np.float32), 64, (0, N / 2),
                                weights=cufold.constant(N, 0.25, np.float32), algorithm=algorithm))
        _close(c, np.histogram(x, 64, (0, N / 2), weights=w)[0])
        assert np.array_equal(host(H.bincount(cufold.counting(NB, 1, np.int32), algorithm=algorithm)),
                              np.bincount(np.arange(1, NB + 1)))
    H._count_programs.clear()


def test_generated_through_cufold():
    """The brief's calls, through the package's names."""
    c, e = host(cufold.histogram(cufold.counting(100), 10, range=(0, 100)))
    assert np.array_equal(c, np.full(10, 10)) and np.array_equal(e, np.linspace(0, 100, 11))
    assert np.array_equal(host(cufold.bincount(cufold.counting(100, dtype=np.int32))), np.ones(100, np.int64))
