"""Tests of the device-wide scans (cufold.device.scan): every algorithm,
inclusive and exclusive, against NumPy or a plain Python fold.

In the simulator the tiles are tiny (64 threads x 2 items; the operator and
value-type matrices use one-warp tiles of 32 x 4, which simulate twice as
fast), so that inputs of a few hundred items cross tile boundaries; on a GPU
the same tests use the library's tiles and add the sizes of real use (up to
~10^6, 2^24 for the recursive spine and 2^22 for the repeat test). Outputs
are poisoned before the launch with a value the result cannot hold, so an
element left unwritten fails the comparison.
"""

import numpy as np
import pytest
from numba import cuda

from conftest import SIMULATOR, to_device, to_host

import cufold
from cufold.device import scan
from cufold.ops import Op
from cufold.values import ValueType

ALGS = scan.ALGORITHMS
KINDS = ("inclusive", "exclusive")

# A size that crosses tile boundaries with a partial last tile (2 tiles in the simulator).
MID = 200 if SIMULATOR else 1_000_003
SMALL_MID = 200 if SIMULATOR else 100_003          # where the reference is a Python loop
SIZES = [0, 1, 2, 127, 128, 129, 300]
if not SIMULATOR:
    SIZES += [1000, 4095, 4096, 4097, 65537, 1_000_000]
SIZE_CASES = [(n, a) for n in SIZES for a in ALGS] + ([(1000, "single_pass")] if SIMULATOR else [])


@pytest.fixture
def small_tiles(monkeypatch):
    """Simulator: one-warp tiles of 32 x 4 items (the library's tiles on a GPU)."""
    if SIMULATOR:
        monkeypatch.setenv("CUFOLD_TILE", "32x4")


# --- helpers -------------------------------------------------------------------------------

def _fn(kind):
    return scan.inclusive_scan if kind == "inclusive" else scan.exclusive_scan


_dev, _host = to_device, to_host


def _exclusive_from(inclusive, first):
    """Shift an inclusive scan right by one, ``first`` in front."""
    out = np.empty_like(inclusive)
    if out.size:
        out[0] = first
        out[1:] = inclusive[:-1]
    return out


def _poison_value(dtype, avoid):
    """A value of ``dtype`` that does not occur in ``avoid`` (NaN for floats)."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.nan
    if dt.kind == "b":
        return None
    info = np.iinfo(dt)
    present = set(np.asarray(avoid).ravel().tolist())
    for v in (info.min + 7, info.max - 5, info.min, info.max, 91, -91 if info.min < 0 else 13):
        if v not in present:
            return v
    raise AssertionError("no poison value available")


def _poisoned(dtype, n, avoid):
    v = _poison_value(dtype, avoid)
    return cuda.to_device(np.full(n, v if v is not None else False, dtype))


def _values(arrays):
    """Python values (scalars or tuples) of the elements of host ``arrays``."""
    if isinstance(arrays, tuple):
        return list(zip(*[a.tolist() for a in arrays]))
    return arrays.tolist()


def _ref_scan(fn, seq, inclusive, init=None):
    out, acc = [], init
    for k, v in enumerate(seq):
        if inclusive:
            acc = v if k == 0 else fn(acc, v)
            out.append(acc)
        else:
            out.append(acc)
            acc = fn(acc, v)
    return out


# --- scalar cases: every algorithm x inclusive/exclusive ---------------------------------------

class Case:
    def __init__(self, name, op, dtype, gen, ref, identity, rtol=0.0):
        self.name, self.op, self.dtype, self.gen = name, op, np.dtype(dtype), gen
        self.ref, self.identity, self.rtol = ref, identity, rtol

    def __repr__(self):
        return self.name


def _f16_ref(x):
    # float32 accumulation of small integers is exact; the result is rounded once.
    return np.cumsum(x.astype(np.float64)).astype(np.float16)


CASES = [
    Case("int32_plus", cufold.plus, np.int32,
         lambda r, n: r.integers(-1000, 1000, n).astype(np.int32),
         lambda x: np.cumsum(x, dtype=np.int32), 0),
    Case("float32_plus", cufold.plus, np.float32,
         lambda r, n: r.random(n).astype(np.float32),
         lambda x: np.cumsum(x.astype(np.float64)), 0.0, rtol=1e-5 if SIMULATOR else 2e-4),
    Case("int8_max", cufold.maximum, np.int8,
         lambda r, n: r.integers(-100, 100, n).astype(np.int8),
         lambda x: np.maximum.accumulate(x), np.int8(-128)),
    # uint64 sums wrap around, as in NumPy.
    Case("uint64_plus_wrap", cufold.plus, np.uint64,
         lambda r, n: r.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True),
         lambda x: np.cumsum(x, dtype=np.uint64), 0),
    Case("float16_plus", cufold.plus, np.float16,
         lambda r, n: r.integers(0, 4, n).astype(np.float16), _f16_ref, 0.0),
]


def _compare(case, got, want):
    if case.rtol:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=case.rtol,
                                   atol=case.rtol)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.filterwarnings("ignore:overflow encountered")   # the simulator's uint64 wrap-around
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_scalar_cases(case, algorithm, kind, rng, small_tiles):
    n = MID if case.dtype != np.float16 else min(MID, 20_000)
    x = case.gen(rng, n)
    inclusive = case.ref(x)
    want = inclusive if kind == "inclusive" else _exclusive_from(inclusive, case.identity)
    out = _poisoned(x.dtype, n, want)
    got, total = _fn(kind)(_dev(x), case.op, out=out, algorithm=algorithm, total=True)
    assert got is out
    got = got.copy_to_host()
    assert got.dtype == x.dtype
    _compare(case, got, want.astype(x.dtype) if not case.rtol else want)
    total = total.copy_to_host()
    assert total.shape == () and total.dtype == x.dtype
    _compare(case, total.reshape(1), inclusive[-1:].astype(x.dtype) if not case.rtol else inclusive[-1:])


@pytest.mark.parametrize("n,algorithm", SIZE_CASES)
def test_sizes(n, algorithm, rng, monkeypatch):
    """Empty, single-item, partial, exact and several-tile inputs (new outputs)."""
    if SIMULATOR and n == 1000:
        monkeypatch.setenv("CUFOLD_TILE", "32x4")      # 8 one-warp tiles
    x = rng.integers(-50, 50, n).astype(np.int32)
    d = _dev(x)
    got, total = scan.inclusive_scan(d, algorithm=algorithm, total=True)
    np.testing.assert_array_equal(got.copy_to_host(), np.cumsum(x, dtype=np.int32))
    assert int(total.copy_to_host()) == int(x.sum())
    if n in (1, 129, 1000, 4097):
        got = scan.exclusive_scan(d, init=5, algorithm=algorithm)
        np.testing.assert_array_equal(got.copy_to_host(),
                                      _exclusive_from(np.cumsum(x, dtype=np.int32) + 5, 5))


# --- seed 002's worked examples ----------------------------------------------------------------

SEED20 = np.array([1, 7, 4, 0, 9, 4, 8, 8, 2, 4, 5, 5, 1, 7, 1, 1, 5, 2, 7, 6], np.int32)
SEED20_EXCLUSIVE = [0, 1, 8, 12, 12, 21, 25, 33, 41, 43, 47, 52, 57, 58, 65, 66, 67, 72, 74, 81]
SEED20_INCLUSIVE = [1, 8, 12, 12, 21, 25, 33, 41, 43, 47, 52, 57, 58, 65, 66, 67, 72, 74, 81, 87]

# The raking example: 20 threads x 5 items, the 5x20 table read row by row
# (thread t holds items 5t..5t+4), and its downsweep (the exclusive scan).
SEED100 = np.array([
    1, 7, 4, 0, 9, 4, 8, 8, 2, 4, 5, 5, 1, 7, 1, 1, 5, 2, 7, 6,
    1, 4, 2, 3, 2, 2, 1, 6, 8, 5, 7, 6, 1, 8, 9, 2, 7, 9, 5, 4,
    3, 1, 2, 3, 3, 4, 1, 1, 3, 8, 7, 4, 2, 7, 7, 9, 3, 1, 9, 8,
    6, 5, 0, 2, 8, 6, 0, 2, 4, 8, 6, 5, 0, 9, 0, 0, 6, 1, 3, 8,
    9, 3, 4, 4, 6, 0, 6, 6, 1, 8, 4, 9, 6, 3, 7, 8, 8, 2, 9, 1], np.int32)
SEED100_UPSWEEP = [21, 26, 19, 21, 12, 22, 31, 27, 12, 17, 27, 30, 21, 20, 20, 18, 26, 21, 29, 28]
SEED100_SPINE = [0, 21, 47, 66, 87, 99, 121, 152, 179, 191, 208, 235, 265, 286, 306, 326, 344, 370,
                 391, 420]
SEED100_EXCLUSIVE = [
    0, 1, 8, 12, 12, 21, 25, 33, 41, 43, 47, 52, 57, 58, 65, 66, 67, 72, 74, 81,
    87, 88, 92, 94, 97, 99, 101, 102, 108, 116, 121, 128, 134, 135, 143, 152, 154, 161, 170, 175,
    179, 182, 183, 185, 188, 191, 195, 196, 197, 200, 208, 215, 219, 221, 228, 235, 244, 247, 248, 257,
    265, 271, 276, 276, 278, 286, 292, 292, 294, 298, 306, 312, 317, 317, 326, 326, 326, 332, 333, 336,
    344, 353, 356, 360, 364, 370, 370, 376, 382, 383, 391, 395, 404, 410, 413, 420, 428, 436, 438, 447]

# DemoScan and DemoMaxReduce (100 random inputs each).
DEMO_SCAN = np.array([
    8, 1, 9, 8, 1, 9, 9, 2, 6, 3, 0, 5, 2, 1, 5, 9, 9, 9, 9, 9,
    1, 7, 9, 9, 9, 1, 4, 7, 8, 2, 1, 0, 4, 1, 9, 6, 7, 8, 9, 5,
    6, 7, 0, 3, 8, 2, 9, 6, 6, 3, 7, 7, 7, 4, 3, 4, 6, 1, 1, 3,
    7, 7, 0, 3, 2, 8, 0, 1, 0, 9, 8, 8, 6, 1, 3, 7, 9, 4, 0, 6,
    4, 1, 3, 2, 7, 0, 7, 0, 1, 4, 4, 4, 4, 4, 6, 7, 7, 9, 7, 8], np.int32)
DEMO_SCAN_EXCLUSIVE = [
    0, 8, 9, 18, 26, 27, 36, 45, 47, 53, 56, 56, 61, 63, 64, 69, 78, 87, 96, 105,
    114, 115, 122, 131, 140, 149, 150, 154, 161, 169, 171, 172, 172, 176, 177, 186, 192, 199, 207, 216,
    221, 227, 234, 234, 237, 245, 247, 256, 262, 268, 271, 278, 285, 292, 296, 299, 303, 309, 310, 311,
    314, 321, 328, 328, 331, 333, 341, 341, 342, 342, 351, 359, 367, 373, 374, 377, 384, 393, 397, 397,
    403, 407, 408, 411, 413, 420, 420, 427, 427, 428, 432, 436, 440, 444, 448, 454, 461, 468, 477, 484]
DEMO_MAX = np.array([
    276, 705, 679, 2, 655, 710, 162, 643, 118, 456, 498, 773, 959, 573, 340, 876, 585, 808, 223, 17,
    751, 821, 255, 820, 505, 940, 699, 412, 890, 423, 959, 580, 547, 158, 138, 761, 149, 230, 257, 809,
    840, 988, 254, 332, 814, 299, 243, 13, 929, 217, 349, 907, 196, 848, 251, 955, 616, 778, 473, 987,
    351, 67, 830, 793, 585, 594, 549, 732, 917, 695, 285, 679, 757, 392, 753, 561, 380, 208, 567, 527,
    75, 404, 53, 352, 530, 592, 779, 356, 934, 964, 129, 154, 568, 394, 469, 387, 11, 726, 337, 388],
    np.int32)
DEMO_MAX_INCLUSIVE = [276, 705, 705, 705, 705] + [710] * 6 + [773] + [959] * 29 + [988] * 59


@pytest.fixture
def seed_tiles(monkeypatch):
    """Simulator: tiles of 64 items, so that the 100-item examples take two tiles."""
    if SIMULATOR:
        monkeypatch.setenv("CUFOLD_TILE", "64x1")


@pytest.mark.parametrize("algorithm", ALGS)
def test_seed_worked_example(algorithm, seed_tiles):
    d = _dev(SEED20)
    incl, total = scan.inclusive_scan(d, algorithm=algorithm, total=True)
    excl, total2 = scan.exclusive_scan(d, algorithm=algorithm, total=True)
    np.testing.assert_array_equal(incl.copy_to_host(), SEED20_INCLUSIVE)
    np.testing.assert_array_equal(excl.copy_to_host(), SEED20_EXCLUSIVE)
    assert int(total.copy_to_host()) == 87 == int(total2.copy_to_host())


@pytest.mark.parametrize("algorithm", ALGS)
def test_seed_raking_example(algorithm, seed_tiles):
    # The table's upsweep and spine are what the downsweep is built from.
    assert SEED100.reshape(20, 5).sum(axis=1).tolist() == SEED100_UPSWEEP
    assert _exclusive_from(np.cumsum(SEED100_UPSWEEP), 0).tolist() == SEED100_SPINE
    got, total = scan.exclusive_scan(_dev(SEED100), algorithm=algorithm, total=True)
    np.testing.assert_array_equal(got.copy_to_host(), SEED100_EXCLUSIVE)
    assert int(total.copy_to_host()) == 448


@pytest.mark.parametrize("algorithm", ALGS)
def test_seed_demos(algorithm, seed_tiles):
    got, total = scan.exclusive_scan(_dev(DEMO_SCAN), algorithm=algorithm, total=True)
    np.testing.assert_array_equal(got.copy_to_host(), DEMO_SCAN_EXCLUSIVE)
    assert int(total.copy_to_host()) == 492
    got, top = scan.inclusive_scan(_dev(DEMO_MAX), cufold.maximum, algorithm=algorithm, total=True)
    np.testing.assert_array_equal(got.copy_to_host(), DEMO_MAX_INCLUSIVE)
    assert int(top.copy_to_host()) == 988


# --- tuple values and non-commutative operators ------------------------------------------------

def _affine(a, b):
    # x -> a0*x + a1, then b: associative, not commutative, no identity.
    return (a[0] * b[0], a[1] * b[0] + b[1])


def _matmul(a, b):
    # 2x2 matrices as row-major 4-tuples.
    return (a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3],
            a[2] * b[0] + a[3] * b[2], a[2] * b[1] + a[3] * b[3])


def _triple(a, b):
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


AFFINE = Op(_affine, name="affine")
MATMUL = Op(_matmul, identity=(1, 0, 0, 1), name="matmul")
TRIPLE = Op(_triple, identity=(0, 0, 0), commutative=True, name="triple")

# The dihedral group of the square as signed permutation matrices: products stay small.
_D4 = np.array([(1, 0, 0, 1), (0, 1, 1, 0), (1, 0, 0, -1), (0, -1, 1, 0),
                (-1, 0, 0, -1), (0, 1, -1, 0), (-1, 0, 0, 1), (0, -1, -1, 0)], np.int64)


class TupleCase:
    def __init__(self, name, op, dtypes, gen, ref, init=None, float_fields=()):
        self.name, self.op, self.vt, self.gen, self.ref = name, op, ValueType.of(dtypes), gen, ref
        self.init, self.float_fields = init, float_fields

    def __repr__(self):
        return self.name


TUPLE_CASES = [
    # Running argmax of (value, index) pairs; few distinct values, so ties happen.
    TupleCase("argmax", cufold.ops.argmax, (np.float32, np.int64),
              lambda r, n: (r.integers(0, 6, n).astype(np.float32), np.arange(n, dtype=np.int64)),
              lambda a, b: cufold.ops.argmax(a, b)),
    TupleCase("triple", TRIPLE, (np.int32, np.float64, np.int16),
              lambda r, n: (r.integers(-50, 50, n).astype(np.int32), r.normal(size=n),
                            r.integers(-9, 9, n).astype(np.int16)),
              _triple, float_fields=(1,)),
    TupleCase("matmul", MATMUL, (np.int64,) * 4,
              lambda r, n: tuple(_D4[r.integers(0, 8, n)].T.copy()), _matmul),
    TupleCase("affine", AFFINE, (np.int64, np.int64),
              lambda r, n: (r.choice(np.array([-1, 1], np.int64), n), r.integers(-3, 4, n)),
              _affine, init=(-1, 5)),
]


def _wrap(v, dt):
    """A Python int reference value wrapped to ``dt`` as the device's arithmetic wraps it."""
    if dt.kind not in "iu":
        return v
    bits = dt.itemsize * 8
    v = int(v) % (1 << bits)
    return v - (1 << bits) if dt.kind == "i" and v >= 1 << (bits - 1) else v


def _check_tuple(case, got, want_values):
    assert isinstance(got, tuple) and len(got) == case.vt.arity
    for f, (g, dt) in enumerate(zip(got, case.vt.fields)):
        assert g.dtype == dt
        w = np.array([v[f] if f in case.float_fields else _wrap(v[f], dt) for v in want_values],
                     dtype=np.float64 if f in case.float_fields else dt)
        if f in case.float_fields:
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9)
        else:
            np.testing.assert_array_equal(g, w)


# Non-commutative operators: every algorithm, both kinds; the other tuple
# values: every algorithm, one kind each.
TUPLE_RUNS = [(c, a, k) for c in TUPLE_CASES[2:] for a in ALGS for k in KINDS] + \
    [(c, a, KINDS[(i + j) % 2]) for i, c in enumerate(TUPLE_CASES[:2]) for j, a in enumerate(ALGS)]


def _tuple_run(case, kind, rng):
    """(n, inputs, init, the float64 reference scan) of one tuple-valued case."""
    n = SMALL_MID
    xs = case.gen(rng, n)
    init = case.init if case.init is not None else case.op.identity_for(case.vt)
    init = tuple(np.asarray(v).item() for v in init)
    return n, xs, init, _ref_scan(case.ref, _values(xs), kind == "inclusive", init)


@pytest.mark.parametrize("case,algorithm,kind", TUPLE_RUNS, ids=lambda v: str(v))
def test_tuple_values(case, algorithm, kind, rng, small_tiles):
    n, xs, init, want = _tuple_run(case, kind, rng)
    outs = tuple(cuda.to_device(np.full(n, np.nan if dt.kind == "f" else 77, dt))
                 for dt in case.vt.fields)
    kw = {"init": case.init} if kind == "exclusive" and case.init is not None else {}
    got, total = _fn(kind)(_dev(xs), case.op, out=outs, algorithm=algorithm, total=True, **kw)
    _check_tuple(case, _host(got), want)
    whole = _ref_scan(case.ref, _values(xs), True)[-1]
    _check_tuple(case, tuple(t.reshape(1) for t in _host(total)), [whole])


# out= with None for fields not wanted: those are never stored (one pattern per case: the
# argmax's index only, the triple's middle field, the matrices' diagonal, the affine map's h).
STORED = {"argmax": (False, True), "triple": (False, True, False), "matmul": (True, False, False, True),
          "affine": (False, True)}


@pytest.mark.parametrize("case,algorithm,kind", TUPLE_RUNS, ids=lambda v: str(v))
def test_tuple_values_some_fields_stored(case, algorithm, kind, rng, small_tiles):
    n, xs, init, want = _tuple_run(case, kind, rng)
    stored = STORED[case.name]
    outs = tuple(cuda.to_device(np.full(n, np.nan if dt.kind == "f" else 77, dt)) if kept else None
                 for dt, kept in zip(case.vt.fields, stored))
    kw = {"init": case.init} if kind == "exclusive" and case.init is not None else {}
    got, total = _fn(kind)(_dev(xs), case.op, out=outs, algorithm=algorithm, total=True, **kw)
    assert got is outs                               # returned as given, None in the same places
    whole = _ref_scan(case.ref, _values(xs), True)[-1]
    _check_tuple(case, tuple(t.reshape(1) for t in _host(total)), [whole])       # totals: every field
    for f, (o, dt) in enumerate(zip(outs, case.vt.fields)):
        if o is None:
            continue
        w = np.array([v[f] if f in case.float_fields else _wrap(v[f], dt) for v in want], dtype=dt)
        if f in case.float_fields:
            np.testing.assert_allclose(o.copy_to_host(), w, rtol=1e-9, atol=1e-9)
        else:
            np.testing.assert_array_equal(o.copy_to_host(), w)


def affine_h(a, b, reverse=False, h0=None):
    """``h = a*h + b`` item by item in float64 (reversed: from the last item): inclusive,
    ``h`` after each item from 0; with ``h0``, exclusive: ``h`` before each item from ``h0``."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    order = range(len(a) - 1, -1, -1) if reverse else range(len(a))
    out, h = np.empty(len(a)), 0.0 if h0 is None else h0
    for i in order:
        if h0 is not None:
            out[i] = h
        h = a[i] * h + b[i]
        if h0 is None:
            out[i] = h
    return out


@pytest.mark.parametrize("algorithm", ALGS)
def test_affine_h_only(algorithm, rng, small_tiles):
    """The issue's recurrence over a whole array: ``inclusive_scan((a, b), affine, out=(None, h))``
    writes ``h`` only (float32 against a float64 loop), forwards and reversed, exclusive from an
    init, with total=; in place over ``b`` it leaves ``a`` as it was."""
    n = 300 if SIMULATOR else 1_000_003
    a = rng.uniform(0.5, 1.0, n).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    d = _dev((a, b))
    for reverse in (False, True):
        h = cuda.to_device(np.full(n, np.nan, np.float32))
        got = scan.inclusive_scan(d, AFFINE, out=(None, h), reverse=reverse, algorithm=algorithm)
        assert got[0] is None and got[1] is h
        np.testing.assert_allclose(h.copy_to_host(), affine_h(a, b, reverse), rtol=1e-5, atol=1e-5)
    h = cuda.to_device(np.full(n, np.nan, np.float32))
    (_, h), (ta, th) = scan.exclusive_scan(d, AFFINE, init=(1.0, 0.5), out=[None, h], algorithm=algorithm,
                                           total=True)
    np.testing.assert_allclose(h.copy_to_host(), affine_h(a, b, h0=0.5), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(th.copy_to_host(), affine_h(a, b)[-1], rtol=1e-5, atol=1e-5)
    # (a product of a million factors below 1 underflows: float32 0 where float64 keeps a denormal)
    np.testing.assert_allclose(ta.copy_to_host(), np.prod(a.astype(np.float64)), rtol=1e-4, atol=1e-37)
    da, db = _dev((a, b))
    scan.inclusive_scan((da, db), AFFINE, out=(None, db), algorithm=algorithm)       # in place
    np.testing.assert_array_equal(da.copy_to_host(), a)
    np.testing.assert_allclose(db.copy_to_host(), affine_h(a, b), rtol=1e-5, atol=1e-5)


def test_exclusive_without_identity_needs_init():
    xs = _dev((np.ones(4, np.int64), np.zeros(4, np.int64)))
    with pytest.raises(ValueError, match="no identity"):
        scan.exclusive_scan(xs, AFFINE)
    got = _host(scan.inclusive_scan(xs, AFFINE))          # inclusive needs no identity
    np.testing.assert_array_equal(got[0], np.ones(4))


# --- the look-back itself: windows of aggregates, stopping at a prefix ----------------------------

def _look_back_kernel(vt, poll="volatile"):
    look_back = scan._look_back(AFFINE, vt, "wide", poll)
    stash_storage = cufold.block.temp_storage(vt, 2)

    @cuda.jit
    def kernel(tile, flags, flags_f, tag, aggs, pres, aggregate, init, has_init, result, stash_out):
        stash = stash_storage()
        drawn = cuda.shared.array(2, np.int64)          # (ticket, tag), as scan.draw leaves them
        if cuda.threadIdx.x == 0:
            drawn[0] = tile
            drawn[1] = tag
        cuda.syncthreads()
        r = look_back(aggregate, (tile, (flags, flags_f, aggs, pres), drawn, init, has_init, stash))
        if cuda.threadIdx.x == 0:
            result[0] = r[0]
            result[1] = r[1]
            stash_out[0] = stash[0][0]
            stash_out[1] = stash[1][0]

    return kernel


@pytest.mark.filterwarnings("ignore:overflow encountered")   # lanes before `stop` fold garbage
@pytest.mark.parametrize("stop,poll", [(0, "volatile"), (10, "atomic"), (40, "volatile"),
                                       (69, "volatile")])
def test_look_back_windows(stop, poll, rng):
    """Tile 70 looks back over tiles 69..0, 32 at a time (windows 38..69,
    6..37, -26..5). Every predecessor has published its aggregate only (the
    simulator runs blocks in order, so end-to-end tests always find a prefix
    at once) except ``stop`` (tile 0 at the latest), which published its
    inclusive prefix: the look-back combines that prefix and the aggregates
    after it, in order; what was published before it (garbage here) is not
    used."""
    vt = ValueType.of((np.int64, np.int64))
    tile, epoch = 70, 5
    tag = np.uint32(epoch << 2)
    a = rng.choice(np.array([-1, 1], np.int64), tile + 1)
    b = rng.integers(-3, 4, tile + 1).astype(np.int64)
    seq = list(zip(a.tolist(), b.tolist()))[:tile]
    flags = np.full(tile + 1, epoch << 2 | scan.AGGREGATE, np.uint32)
    flags[tile] = (epoch - 1) << 2 | scan.PREFIX     # an older epoch's flag reads as EMPTY
    flags[stop] = epoch << 2 | scan.PREFIX
    prefix = _ref_scan(_affine, seq[:stop + 1], True)[-1]
    pres = (np.full(tile + 1, 99, np.int64), np.full(tile + 1, 99, np.int64))
    pres[0][stop], pres[1][stop] = prefix
    aggs = (a.copy(), b.copy())
    for arr in aggs:
        arr[:stop] = 1234567                         # before the prefix: never read
    want = prefix
    for v in seq[stop + 1:]:
        want = _affine(want, v)
    aggregate = (np.int64(-1), np.int64(2))
    init = (np.int64(1), np.int64(-7))
    d_flags = cuda.to_device(flags)
    d_aggs, d_pres = _dev(aggs), _dev(pres)
    result, stash = cuda.to_device(np.zeros(2, np.int64)), cuda.to_device(np.zeros(2, np.int64))
    d_flags_f = d_flags.view(np.float32)             # the same memory, for the volatile read
    _look_back_kernel(vt, poll)[1, 32](tile, d_flags, d_flags_f, tag, d_aggs, d_pres, aggregate,
                                       init, True, result, stash)
    assert tuple(stash.copy_to_host()) == want                       # the exclusive prefix
    assert tuple(result.copy_to_host()) == _affine(init, want)       # init in front
    h_pres, h_aggs = _host(d_pres), _host(d_aggs)
    assert (h_pres[0][tile], h_pres[1][tile]) == _affine(want, (-1, 2))   # inclusive published
    assert (h_aggs[0][tile], h_aggs[1][tile]) == (-1, 2)                  # aggregate published
    assert d_flags.copy_to_host()[tile] == epoch << 2 | scan.PREFIX


def _mat8(x, y):
    """2x2 matrices of integers mod 256, one byte per entry of a uint32
    (``a | b << 8 | c << 16 | d << 24``): associative, not commutative, and a
    value that fits beside its flag in a packed state word."""
    a, b, c, d = x & 255, (x >> 8) & 255, (x >> 16) & 255, (x >> 24) & 255
    e, f, g, h = y & 255, (y >> 8) & 255, (y >> 16) & 255, (y >> 24) & 255
    return (((a * e + b * g) & 255) | (((a * f + b * h) & 255) << 8)
            | (((c * e + d * g) & 255) << 16) | (((c * f + d * h) & 255) << 24))


MAT8 = Op(_mat8, identity=np.uint32(0x01000001), name="mat8")


def _mat8_values(rng, n):
    return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)


def _packed_look_back_kernel(op, vt, poll):
    look_back = scan._look_back(op, vt, "packed", poll)
    stash_storage = cufold.block.temp_storage(vt, 2)

    @cuda.jit
    def kernel(tile, words, words_f, tag, aggregate, init, has_init, result, stash_out):
        stash = stash_storage()
        drawn = cuda.shared.array(2, np.int64)          # (ticket, tag), as scan.draw leaves them
        if cuda.threadIdx.x == 0:
            drawn[0] = tile
            drawn[1] = tag
        cuda.syncthreads()
        r = look_back(aggregate, (tile, (words, words_f), drawn, init, has_init, stash))
        if cuda.threadIdx.x == 0:
            result[0] = r
            stash_out[0] = stash[0]

    return kernel


@pytest.mark.parametrize("stop,poll", [(0, "volatile"), (10, "atomic"), (69, "volatile")])
def test_look_back_windows_packed(stop, poll, rng):
    """As test_look_back_windows, with (status, value) packed in one 64-bit
    word per tile and a non-commutative operator on uint32 values."""
    vt = ValueType.of(np.uint32)
    tile, epoch = 70, 5
    tag = np.uint32(epoch << 2)
    vals = _mat8_values(rng, tile + 1)
    seq = [np.uint32(v) for v in vals[:tile]]
    prefix = _ref_scan(_mat8, seq[:stop + 1], True)[-1]

    def word(e, state, value):
        return np.uint64((e << 2 | state) << 32 | int(value))

    words = np.array([word(epoch, scan.AGGREGATE, v) for v in vals], np.uint64)
    words[:stop] = [word(epoch, scan.AGGREGATE, 0x12345678)] * stop   # before the prefix: unused
    words[stop] = word(epoch, scan.PREFIX, prefix)
    words[tile] = word(epoch - 1, scan.PREFIX, 7)      # an older epoch's word reads as EMPTY
    want = prefix
    for v in seq[stop + 1:]:
        want = _mat8(want, v)
    aggregate, init = np.uint32(0x03020105), np.uint32(0x01020304)
    d_words = cuda.to_device(words)
    result, stash = cuda.to_device(np.zeros(1, np.uint32)), cuda.to_device(np.zeros(1, np.uint32))
    _packed_look_back_kernel(MAT8, vt, poll)[1, 32](
        tile, d_words, d_words.view(np.float64), tag, aggregate, init, True, result, stash)
    assert stash.copy_to_host()[0] == want                           # the exclusive prefix
    assert result.copy_to_host()[0] == _mat8(init, want)             # init in front
    got = int(d_words.copy_to_host()[tile])
    assert got >> 32 == epoch << 2 | scan.PREFIX                     # inclusive published
    assert got & 0xFFFFFFFF == _mat8(want, aggregate)


# --- single pass: state layouts, variants; tile layouts ------------------------------------------

# Accumulators of at most 4 bytes publish (status, value) in one 64-bit word; of 8 bytes from inputs
# of 4 (int32 summed as int64), in two (the pair layout: each half beside its own status).
LAYOUT_CASES = [
    (np.int8, cufold.maximum), (np.int16, cufold.minimum), (np.int32, cufold.plus),
    (np.uint8, cufold.maximum), (np.uint16, cufold.maximum), (np.uint32, cufold.plus),
    (np.float32, cufold.plus), (np.bool_, cufold.logical_or),
    (np.int64, cufold.plus), (np.float64, cufold.plus),
]


def _layout_values(rng, dtype, n):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(n) < 0.01
    if dt.kind == "f":
        return rng.normal(size=n).astype(dt)                # negative values: the sign bit
    info = np.iinfo(dt)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), n).astype(dt)


_NUMPY_ACCUMULATE = {"plus": np.add, "maximum": np.maximum, "minimum": np.minimum,
                     "logical_or": np.logical_or}


@pytest.mark.parametrize("dtype,op", LAYOUT_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_single_pass_state_layout(dtype, op, rng, small_tiles):
    vt = ValueType.of(dtype)
    p = scan.plan(op, vt, vt, vt, 1000, "inclusive", "single_pass")
    assert p.spec.variant.states == ("packed" if vt.itemsize <= 4 else "wide")     # pair: 4-byte inputs
    if vt.itemsize > 4:
        i32 = ValueType.of(np.int32)
        assert scan.plan(op, i32, vt, vt, 1000, "inclusive", "single_pass").spec.variant.states == "pair"
    n = SMALL_MID
    x = _layout_values(rng, dtype, n)
    ufunc = _NUMPY_ACCUMULATE[op.name]
    want = ufunc.accumulate(x, dtype=np.float64 if vt.dtype.kind == "f" else x.dtype)
    got, total = scan.inclusive_scan(_dev(x), op, algorithm="single_pass", total=True)
    got, total = got.copy_to_host(), total.copy_to_host()
    if vt.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(total, want[-1], rtol=1e-5, atol=1e-4)
    else:
        np.testing.assert_array_equal(got, want)
        assert total == want[-1]
    if op is cufold.plus and vt.dtype.kind != "f":
        got = scan.exclusive_scan(_dev(x), op, init=3, algorithm="single_pass").copy_to_host()
        np.testing.assert_array_equal(got, _exclusive_from(want + x.dtype.type(3), 3))


@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("kind", KINDS)
def test_noncommutative_packed(algorithm, kind, rng, small_tiles):
    """A non-commutative operator on uint32 (packed look-back states)."""
    n = SMALL_MID
    x = _mat8_values(rng, n)
    seq = [np.uint32(v) for v in x]
    init = np.uint32(0x00020301)
    want = _ref_scan(_mat8, seq, kind == "inclusive", init if kind == "exclusive" else None)
    kw = {"init": init} if kind == "exclusive" else {}
    got, total = _fn(kind)(_dev(x), MAT8, algorithm=algorithm, total=True, **kw)
    np.testing.assert_array_equal(got.copy_to_host(), np.array(want, np.uint32))
    assert total.copy_to_host() == _ref_scan(_mat8, seq, True)[-1]


@pytest.mark.parametrize("words", ["wide", "atomic", "plain", "blockid", "overlap", "wide,atomic,plain,blockid",
                                   "wide,overlap", "packed,volatile,stream,ticket"])
def test_single_pass_variants(words, monkeypatch, rng, small_tiles):
    """Every CUFOLD_SCAN_VARIANT choice gives the same results."""
    monkeypatch.setenv("CUFOLD_SCAN_VARIANT", words)
    v = scan.variant()
    for w in words.split(","):
        assert w in v
    n = SMALL_MID
    x = rng.integers(-100, 100, n).astype(np.int32)
    got, total = scan.inclusive_scan(_dev(x), algorithm="single_pass", total=True)
    np.testing.assert_array_equal(got.copy_to_host(), np.cumsum(x, dtype=np.int32))
    assert int(total.copy_to_host()) == int(x.sum())
    y = _mat8_values(rng, n)
    got = scan.exclusive_scan(_dev(y), MAT8, init=np.uint32(1), algorithm="single_pass")
    want = _ref_scan(_mat8, [np.uint32(v) for v in y], False, np.uint32(1))
    np.testing.assert_array_equal(got.copy_to_host(), np.array(want, np.uint32))
    f = rng.random(n).astype(np.float64)                     # the wide layout whatever asked
    got = scan.inclusive_scan(_dev(f), algorithm="single_pass").copy_to_host()
    np.testing.assert_allclose(got, np.cumsum(f), rtol=1e-12)


@pytest.mark.parametrize("words", ["", "ticket", "overlap"])
def test_single_pass_tile_ids(words, small_tiles):
    """``auto`` ids (the default): the overlapped draw for packed states but bool's, tickets
    for the others; a named ids is kept for every layout."""
    var = scan.variant(words)
    for dt, acc in ((np.float32, np.float32), (np.int32, np.int32), (np.uint8, np.uint8), (np.bool_, np.bool_),
                    (np.int32, np.int64), (np.float64, np.float64)):
        p = scan.plan(cufold.plus if acc != np.bool_ else cufold.logical_or, ValueType.of(dt), ValueType.of(acc),
                      ValueType.of(acc), 10000, "inclusive", "single_pass", var)
        auto = "overlap" if p.spec.variant.states == "packed" and acc != np.bool_ else "ticket"
        assert p.spec.variant.ids == (words or auto), (dt, acc, p.spec.variant)


def test_variant_parsing(monkeypatch):
    assert scan.variant("") == scan.DEFAULT_VARIANT
    assert scan.variant("wide, Atomic") == scan.DEFAULT_VARIANT._replace(states="wide",
                                                                          poll="atomic")
    with pytest.raises(ValueError, match="unknown scan variant"):
        scan.variant("fast")
    monkeypatch.setenv("CUFOLD_SCAN_VARIANT", "plain")
    assert scan.variant().hints == "plain"


@pytest.mark.parametrize("tile", ["32x3", "32x6", "64x1", "32x8"])
@pytest.mark.parametrize("algorithm", ALGS)
def test_tile_layouts(tile, algorithm, monkeypatch, rng):
    """Shared-memory layouts of a tile: odd items per thread (no padding), a
    divisor of 32 (a slot per 32) and others (a slot per thread); full and
    partial tiles."""
    monkeypatch.setenv("CUFOLD_TILE", tile)
    nt, vt = (int(v) for v in tile.split("x"))
    n = 3 * nt * vt + 37
    x = rng.integers(-100, 100, n).astype(np.int32)
    got, total = scan.inclusive_scan(_dev(x), algorithm=algorithm, total=True)
    np.testing.assert_array_equal(got.copy_to_host(), np.cumsum(x, dtype=np.int32))
    assert int(total.copy_to_host()) == int(x.sum())
    y = _mat8_values(rng, n)
    got = scan.exclusive_scan(_dev(y), MAT8, algorithm=algorithm)
    want = _ref_scan(_mat8, [np.uint32(v) for v in y], False, np.uint32(0x01000001))
    np.testing.assert_array_equal(got.copy_to_host(), np.array(want, np.uint32))


def test_single_pass_layouts_share_state(rng):
    """Packed and wide launches alternate on one stream's look-back state: a
    state of an earlier launch, of either layout, reads as EMPTY."""
    sizes = [300, 129, 300] if SIMULATOR else [1 << 22, 4097, 1 << 22]
    for n in sizes:
        for dtype in (np.int32, np.int64):
            x = rng.integers(-9, 9, n).astype(dtype)
            got = scan.inclusive_scan(_dev(x), algorithm="single_pass").copy_to_host()
            np.testing.assert_array_equal(got, np.cumsum(x, dtype=dtype))


# --- in place, out=, totals, init, dtypes --------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", ALGS)
def test_in_place(algorithm, kind, rng, small_tiles):
    n = 300 if SIMULATOR else 1_000_003
    x = rng.integers(-100, 100, n).astype(np.int64)
    d = _dev(x)
    got = _fn(kind)(d, out=d, algorithm=algorithm)
    assert got is d
    want = np.cumsum(x) if kind == "inclusive" else _exclusive_from(np.cumsum(x), 0)
    np.testing.assert_array_equal(d.copy_to_host(), want)


@pytest.mark.parametrize("algorithm", ALGS)
def test_in_place_tuple_noncommutative(algorithm, rng, small_tiles):
    n = SMALL_MID
    case = TUPLE_CASES[2]                        # matmul
    xs = case.gen(rng, n)
    d = _dev(xs)
    got = scan.inclusive_scan(d, MATMUL, out=d, algorithm=algorithm)
    assert all(g is o for g, o in zip(got, d))
    _check_tuple(case, _host(d), _ref_scan(_matmul, _values(xs), True))


@pytest.mark.parametrize("algorithm", ALGS)
def test_exclusive_init_and_total_without_init(algorithm, rng, small_tiles):
    n = SMALL_MID
    x = rng.random(n).astype(np.float64)
    got, total = scan.exclusive_scan(_dev(x), init=100.0, algorithm=algorithm, total=True)
    np.testing.assert_allclose(got.copy_to_host(), _exclusive_from(100.0 + np.cumsum(x), 100.0),
                               rtol=1e-10)
    np.testing.assert_allclose(total.copy_to_host(), x.sum(), rtol=1e-10)   # init not included


@pytest.mark.filterwarnings("ignore:overflow encountered")   # int8 wraps in the simulator
def test_dtype_argument(rng):
    x = rng.integers(0, 100, 150).astype(np.int8)
    got = scan.inclusive_scan(_dev(x), dtype=np.int64)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got.copy_to_host(), np.cumsum(x, dtype=np.int64))
    got = scan.inclusive_scan(_dev(x))             # a generic scan keeps the dtype (wraps)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got.copy_to_host(), np.cumsum(x, dtype=np.int8))


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_, np.float16, np.float64])
def test_cumsum_numpy_dtypes(dtype, rng):
    n = 150
    x = (rng.integers(0, 3, n) if dtype != np.float64 else rng.normal(size=n)).astype(dtype)
    got = scan.cumsum(_dev(x)).copy_to_host()
    want = np.cumsum(x) if dtype != np.float16 else _f16_ref(x)
    assert got.dtype == want.dtype
    if dtype == np.float64:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    else:
        np.testing.assert_array_equal(got, want)


def test_cumprod_cummax_cummin(rng):
    n = 150
    x = rng.choice(np.array([-1, 1, 2], np.int32), n)
    x[n // 2:] = 1                                 # keep the products small
    got = scan.cumprod(_dev(x)).copy_to_host()
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.cumprod(x))
    y = rng.normal(size=n).astype(np.float32)
    y[77] = np.nan                                 # NaN propagates, as numpy.maximum.accumulate
    got = scan.cummax(_dev(y)).copy_to_host()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.maximum.accumulate(y))
    got = scan.cummin(_dev(y)).copy_to_host()
    np.testing.assert_array_equal(got, np.minimum.accumulate(y))
    z = rng.integers(-1000, 1000, n).astype(np.int16)
    np.testing.assert_array_equal(scan.cummin(_dev(z)).copy_to_host(), np.minimum.accumulate(z))


def test_bool_logical_scan(rng):
    x = rng.random(150) < 0.02
    got, any_ = scan.inclusive_scan(_dev(x), cufold.logical_or, algorithm="single_pass", total=True)
    np.testing.assert_array_equal(got.copy_to_host(), np.logical_or.accumulate(x))
    assert bool(any_.copy_to_host()) == bool(x.any())


def test_empty_input():
    d = _dev(np.zeros(0, np.int32))
    got = scan.inclusive_scan(d)
    assert got.shape == (0,) and got.dtype == np.int32
    got, total = scan.exclusive_scan(d, init=5, total=True)
    assert got.shape == (0,)
    assert int(total.copy_to_host()) == 0          # the total of no items: the identity
    got, total = scan.inclusive_scan(d, cufold.maximum, total=True)
    assert int(total.copy_to_host()) == np.iinfo(np.int32).min
    assert scan.cumsum(d).dtype == np.int64
    empty_pair = _dev((np.zeros(0, np.int64), np.zeros(0, np.int64)))
    assert scan.inclusive_scan(empty_pair, AFFINE)[0].shape == (0,)
    with pytest.raises(ValueError, match="identity"):
        scan.inclusive_scan(empty_pair, AFFINE, total=True)


def test_stream_argument(rng):
    x = rng.integers(0, 10, 150).astype(np.int32)
    s = cuda.stream()
    got, total = scan.inclusive_scan(_dev(x), stream=s, total=True, algorithm="single_pass")
    s.synchronize()
    np.testing.assert_array_equal(got.copy_to_host(), np.cumsum(x, dtype=np.int32))
    assert int(total.copy_to_host()) == x.sum()


def test_single_pass_state_is_reused(rng):
    """Flags carry a launch epoch (no clearing between calls) kept on the device
    with the tile counter, which the last draw resets: back-to-back launches of
    different sizes on one stream stay correct and allocate nothing new."""
    sizes = [300, 129, 300, 1] if SIMULATOR else [1 << 22, 4097, 1 << 22, 1]
    xs = [rng.integers(-9, 9, n).astype(np.int32) for n in sizes]
    ds = [_dev(x) for x in xs]
    scan.inclusive_scan(ds[0], algorithm="single_pass")
    states = dict(scan._look_back_states)
    for x, d in zip(xs, ds):
        got = scan.inclusive_scan(d, algorithm="single_pass").copy_to_host()
        np.testing.assert_array_equal(got, np.cumsum(x, dtype=np.int32))
    for key, st in states.items():
        assert scan._look_back_states[key] is st
        assert st.counter.size == 1


@pytest.mark.parametrize("kind", KINDS if not SIMULATOR else ("exclusive",))
def test_deep_spine(kind, monkeypatch, rng):
    """reduce_then_scan with its spine scanned recursively (three levels; the
    spine levels are inclusive scans whatever the top level's kind)."""
    monkeypatch.setattr(scan, "SPINE_BLOCK_TILES", 0)
    if SIMULATOR:
        monkeypatch.setenv("CUFOLD_TILE", "32x1")
        n = 1100                                   # 35 tiles -> 2 spine tiles -> 1
    else:
        n = (1 << 24) + 5                          # 4097 tiles -> 2 spine tiles -> 1
    p = scan.plan(cufold.plus, ValueType.of(np.int32), ValueType.of(np.int32),
                  ValueType.of(np.int32), n, kind, "reduce_then_scan")
    assert p.spine.spine is not None and p.spine.spine.spine is None
    x = rng.integers(-9, 9, n).astype(np.int32)
    got, total = _fn(kind)(_dev(x), algorithm="reduce_then_scan", total=True)
    inclusive = np.cumsum(x, dtype=np.int32)
    want = inclusive if kind == "inclusive" else _exclusive_from(inclusive, 0)
    np.testing.assert_array_equal(got.copy_to_host(), want)
    assert int(total.copy_to_host()) == int(x.sum())


# --- errors ------------------------------------------------------------------------------------

def test_errors():
    d = _dev(np.arange(10, dtype=np.int32))
    with pytest.raises(TypeError, match="host"):
        scan.inclusive_scan(np.arange(10))
    with pytest.raises(TypeError, match="host"):
        scan.cumsum(np.arange(10))
    with pytest.raises(ValueError, match="unknown scan algorithm"):
        scan.inclusive_scan(d, algorithm="nope")
    with pytest.raises(TypeError, match="dtype"):
        scan.inclusive_scan(d, out=_dev(np.zeros(10, np.float32)))
    with pytest.raises(TypeError, match="dtype"):
        scan.cumsum(d, out=_dev(np.zeros(10, np.int32)))         # cumsum of int32 is int64
    with pytest.raises(ValueError, match="10 elements"):
        scan.inclusive_scan(d, out=_dev(np.zeros(9, np.int32)))
    with pytest.raises(TypeError, match="host"):
        scan.inclusive_scan(d, out=np.zeros(10, np.int32))
    with pytest.raises(np.exceptions.AxisError):                # N-D scans: tests/test_scan_axis.py
        scan.inclusive_scan(_dev(np.zeros((2, 5), np.int32)), axis=2)
    with pytest.raises(ValueError, match="no identity"):
        scan.exclusive_scan(_dev((np.ones(3, np.int64), np.ones(3, np.int64))), AFFINE)
    with pytest.raises(ValueError, match="tuple of 2 arrays"):
        scan.inclusive_scan(_dev((np.ones(3, np.int64), np.ones(3, np.int64))), AFFINE,
                            out=_dev(np.ones(3, np.int64)))
    pair, one = _dev((np.ones(3, np.int64), np.ones(3, np.int64))), _dev(np.ones(3, np.int64))
    with pytest.raises(ValueError, match="cufold: out= holds None for every field"):
        scan.inclusive_scan(pair, AFFINE, out=(None, None))
    with pytest.raises(ValueError, match=r"cufold: out= holds None, but the scan's result \(int32\) is not a tuple"):
        scan.inclusive_scan(d, out=(None,))
    with pytest.raises(ValueError, match=r"result \(int64\) is not a tuple"):       # zipped into a scalar
        scan.cumsum(pair, out=(None, one), transform=lambda t: t[0] * t[1])
    with pytest.raises(ValueError, match="cufold: out= needs a tuple of 2 entries .* it has 3"):
        scan.inclusive_scan(pair, AFFINE, out=(None, one, one))
    with pytest.raises(ValueError, match="cufold: out= needs a tuple of 2 entries .* it has 1"):
        scan.inclusive_scan(pair, AFFINE, out=(None,))
    with pytest.raises(TypeError, match="cufold: out= has dtype float32, the scan's result is int64"):
        scan.inclusive_scan(pair, AFFINE, out=(None, _dev(np.ones(3, np.float32))))


def test_algorithms_listed():
    assert cufold.algorithms("scan") == ALGS == ("single_pass", "reduce_then_scan", "single_block")


# --- GPU only: the look-back under real concurrency ------------------------------------------------

@pytest.mark.skipif(SIMULATOR, reason="needs a real GPU (blocks run one at a time in the simulator)")
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.int64])
def test_single_pass_repeatable(dtype, rng):
    """20 single-pass scans of one 2^22 input, each correct; the integer ones
    identical (a race in the look-back shows as an error that moves from run to
    run). Floating-point runs may differ in the last bits (the look-back's
    association depends on timing), so each is checked against the reference.
    int64: int32 summed as int64 (the ``pair`` tile states), past 2^32, so that both
    halves of a state matter."""
    n = 1 << 22
    x = (rng.integers(-100, 100, n) if dtype != np.float32 else rng.random(n)).astype(dtype)
    if dtype == np.int64:
        x = rng.integers(2**31 - 1000, 2**31 - 1, n).astype(np.int32)
    d = _dev(x)
    want = np.cumsum(x.astype(np.float64)) if dtype == np.float32 else np.cumsum(x, dtype=dtype)
    first = None
    for run in range(20):
        got = scan.inclusive_scan(d, algorithm="single_pass", dtype=dtype).copy_to_host()
        if dtype != np.float32:
            if first is None:
                np.testing.assert_array_equal(got, want.astype(dtype))
                first = got
            bad = np.flatnonzero(got != first)
            assert bad.size == 0, "run %d differs at %d items, first at %d" % (run, bad.size, bad[0])
        else:
            np.testing.assert_allclose(got, want, rtol=1e-4, err_msg="run %d" % run)


@pytest.mark.skipif(SIMULATOR, reason="needs a real GPU")
def test_reduce_then_scan_bitwise_reproducible(rng):
    """The deterministic algorithm gives the same float32 bits every time."""
    x = rng.random(1 << 22).astype(np.float32)
    d = _dev(x)
    first = scan.inclusive_scan(d, algorithm="reduce_then_scan").copy_to_host()
    for _ in range(5):
        got = scan.inclusive_scan(d, algorithm="reduce_then_scan").copy_to_host()
        assert np.array_equal(got.view(np.uint32), first.view(np.uint32))


# --- the express path: repeated plain calls ------------------------------------------------

@pytest.mark.parametrize("name", ["cumsum", "inclusive_scan", "exclusive_scan", "cummax"])
@pytest.mark.parametrize("n", [100, 1000] + ([] if SIMULATOR else [(1 << 16) + 3]))   # GPU: single-pass
def test_express_repeated_calls_fresh_inputs(rng, name, n):
    """Plain calls of one length reuse one bound launch (and, single-pass, take
    a new look-back epoch each): every call must scan its own input into its
    own output, and earlier outputs must survive later calls."""
    fn = getattr(cufold, name)
    ref = {"cumsum": np.cumsum, "inclusive_scan": np.cumsum, "cummax": np.maximum.accumulate,
           "exclusive_scan": lambda h: np.concatenate([[0], np.cumsum(h)[:-1]])}[name]
    hs = [rng.integers(-100, 100, n).astype(np.int32) for _ in range(4)]
    outs = [fn(to_device(h)) for h in hs]
    for h, o in zip(hs, outs):
        np.testing.assert_array_equal(to_host(o), ref(h.astype(np.int64)))


def test_express_contiguous_then_strided_same_length(rng):
    """As for the reduce: a strided input after a contiguous one of the same length."""
    n = 150
    h = rng.integers(-9, 9, 3 * n).astype(np.int32)
    np.testing.assert_array_equal(to_host(cufold.inclusive_scan(to_device(h[:n]))), np.cumsum(h[:n]))
    np.testing.assert_array_equal(to_host(cufold.inclusive_scan(to_device(h)[1::3])), np.cumsum(h[1::3]))


@pytest.mark.parametrize("n", [100, 1000] + ([] if SIMULATOR else [(1 << 16) + 3]))
def test_express_out_and_in_place(rng, n):
    """``out=`` of the result's dtype takes the express path too: into a fresh
    array, in place (``out`` is ``x``), and after calls without ``out``; an ``out``
    of another dtype or length goes the general way, which explains the error."""
    h = rng.integers(-100, 100, n).astype(np.int32)
    x = to_device(h)
    plain = cufold.inclusive_scan(x)
    dest = to_device(np.full(n, 77, np.int32))                       # poisoned
    assert cufold.inclusive_scan(x, out=dest) is dest
    np.testing.assert_array_equal(to_host(dest), np.cumsum(h))
    np.testing.assert_array_equal(to_host(plain), np.cumsum(h))
    assert cufold.inclusive_scan(x, out=x) is x                       # in place
    np.testing.assert_array_equal(to_host(x), np.cumsum(h))
    with pytest.raises(TypeError, match="dtype int64"):
        cufold.inclusive_scan(to_device(h), out=to_device(np.zeros(n, np.int64)))
    with pytest.raises(ValueError, match="elements"):
        cufold.inclusive_scan(to_device(h), out=to_device(np.zeros(n + 1, np.int32)))


def _library_array(lib, h):
    """``h`` on the GPU as an array of ``lib`` (skips where it is missing)."""
    if lib == "numba":
        return to_device(h)
    if SIMULATOR:
        pytest.skip("%s arrays need a real GPU" % lib)
    mod = pytest.importorskip(lib)
    return mod.asarray(h, device="cuda") if lib == "torch" else mod.asarray(h)


@pytest.mark.parametrize("lib", ["numba", "torch", "cupy"])
@pytest.mark.parametrize("n", [100, 1000] + ([] if SIMULATOR else [(1 << 16) + 3]))
def test_express_each_library(rng, lib, n):
    """The express path of each array library, through both of its output
    allocations: the input's dtype (cummax, float32) and another (cumsum of
    int32 gives int64); every call's output is its own, poisoned first."""
    for _ in range(3):
        hi = rng.integers(-1000, 1000, n).astype(np.int32)
        hf = rng.standard_normal(n).astype(np.float32)
        xi, xf = _library_array(lib, hi), _library_array(lib, hf)
        si, mf = cufold.cumsum(xi), cufold.cummax(xf)
        assert type(si) is type(xi) and type(mf) is type(xf)
        np.testing.assert_array_equal(to_host(si), np.cumsum(hi.astype(np.int64)))
        np.testing.assert_array_equal(to_host(mf), np.maximum.accumulate(hf))
        poisoned = _library_array(lib, np.full(n, np.nan, np.float32))
        assert cufold.inclusive_scan(xf, cufold.maximum, out=poisoned) is poisoned
        np.testing.assert_array_equal(to_host(poisoned), np.maximum.accumulate(hf))


@pytest.mark.parametrize("lib", ["numba", "torch"])
def test_express_keeps_no_input_alive(rng, lib):
    """The express paths cache a bound launch per call shape, but not the
    arrays of the call that made it: a caller's input is freed when the caller
    drops it (a cached 1 GB input would be a leak)."""
    import gc
    import weakref
    n = 777
    x = _library_array(lib, rng.integers(0, 9, n).astype(np.int32))
    first = weakref.ref(x)
    dest = _library_array(lib, np.zeros(n, np.int32))
    results = [cufold.cumsum(x), cufold.inclusive_scan(x, out=dest), cufold.sum(x), cufold.mean(x)]
    del x
    gc.collect()
    assert first() is None
    assert len(results) == 4


def test_epochs_advance_on_the_device(rng):
    """A single-pass launch takes its epoch from the counter word it draws tickets
    from (no epoch from the host, so a CUDA graph's replays get new ones): after
    each launch the epoch (high half) has moved on by one and the count (low half)
    is back to 0; the same launch made again gives the same result."""
    n = 1000 if SIMULATOR else (1 << 20) + 3
    x = rng.integers(-9, 9, n).astype(np.int32)
    d = _dev(x)
    scan.inclusive_scan(d, algorithm="single_pass")
    from cufold.host import arrays as _arrays
    a = _arrays.describe(d)
    st = scan._look_back_states[(a.device_id, _arrays.stream_handle(a))]
    word = lambda: int(_arrays.as_numba(st.counter).copy_to_host()[0])          # noqa: E731
    before = word()
    assert before & 0xFFFFFFFF == 0
    for k in range(1, 4):
        got = scan.inclusive_scan(d, algorithm="single_pass").copy_to_host()
        np.testing.assert_array_equal(got, np.cumsum(x, dtype=np.int32))
        assert word() == before + (k << 32)
