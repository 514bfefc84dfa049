"""reduce_by_key_into (cufold.device.bykey) and its benchmark (cufold.bench.bykey).

Every algorithm against NumPy's ``np.add.at``/``np.minimum.at``/``np.maximum.at`` on
seed 001's three key orders (a small box in the simulator: 6^3 cells x 3 particles, tiles
of 64 x 2 items, 64-slot shared tables, 4 resident blocks; 20^3 x 10 and the full
100^3 x 10 box on a GPU), keys of every integer width, value and output dtypes, NaN,
out-of-range keys, empty and partial-warp inputs, the deterministic mode and the
compare-and-swap operators.

Run: PYTHONPATH=src python -m pytest tests/test_bykey.py -q
"""

import numpy as np
import pytest
from numba import cuda

from conftest import SIMULATOR, gpu_only, run_sm90_script

import cufold
from cufold.bench import bykey as BB
from cufold.device import bykey as BK

ALGORITHMS = BK.ALGORITHMS
ORDERS = BB.ORDERS
SIDE, PER_CELL = (6, 3) if SIMULATOR else (20, 10)
SMALL = (4, 3) if SIMULATOR else (20, 10)      # the box of the secondary tests
INT_KEYS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")

pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning",
    "ignore:invalid value encountered:RuntimeWarning",
)


# --- helpers -----------------------------------------------------------------------------------

def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def box(order, side=SIDE, per_cell=PER_CELL, seed=3):
    """Seed 001's keys (int64), exact values, and the number of cells."""
    keys = BB.box_keys(side, per_cell, order, seed)
    return keys, BB.box_values(keys.size, seed), side ** 3


def reference(ufunc, out, keys, values, m=None):
    r = np.array(out, copy=True)
    m = r.size if m is None else m
    good = (keys >= 0) & (keys < m) if keys.dtype.kind == "i" else keys < m
    ufunc.at(r, keys[good].astype(np.int64), values[good].astype(r.dtype))
    return r


def run(keys, values, out, op=cufold.plus, **kw):
    d = dev(out)
    got = BK.reduce_by_key_into(dev(keys), dev(values), d, op, **kw)
    assert got is d
    return d.copy_to_host()


UFUNCS = ((cufold.plus, np.add, 0.0), (cufold.minimum, np.minimum, np.inf),
          (cufold.maximum, np.maximum, -np.inf))


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 32 threads x 1 item and 32-slot tables: many tiles, several levels of the
    sorted algorithm, frequent table flushes."""
    monkeypatch.setenv("CUFOLD_BYKEY_TILE", "32x1x32")
    BK.plan.cache_clear()
    yield
    monkeypatch.delenv("CUFOLD_BYKEY_TILE")
    BK.plan.cache_clear()


# --- every algorithm, seed 001's orders ------------------------------------------------------------

# Simulator: min and max take the same path (compare-and-swap on float64 outputs, mirrored
# comparisons): each order takes plus and one of them, every algorithm both over the orders
# (and random keys with max in test_repeated_keys_fill_the_table).
ORDER_OPS = {"ordered": UFUNCS[:2], "shifted": UFUNCS[::2], "random": UFUNCS[:2]} if SIMULATOR else {}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("order", ORDERS)
def test_orders(order, algorithm):
    keys, values, m = box(order)
    keys = keys.astype(np.int32)
    for op, ufunc, init in ORDER_OPS.get(order, UFUNCS):
        out = np.full(m, init)
        out[::7] = 0.5                      # some keys start from a value
        got = run(keys, values, out, op, algorithm=algorithm)
        np.testing.assert_array_equal(got, reference(ufunc, out, keys, values), err_msg=op.name)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_many_tiles_and_levels(small_tiles, algorithm):
    for order in ("shifted", "ordered"):
        keys, values, m = box(order)
        out = np.zeros(m)
        got = run(keys, values, out, algorithm=algorithm)
        np.testing.assert_array_equal(got, reference(np.add, out, keys, values))
    p = BK.plan(cufold.plus, np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.float64), m, keys.size, 0,
                "sorted", False, True)
    assert p.spec.tile.nt * p.spec.tile.vt == 32 and 2 * p.grid > 32   # three levels of pieces


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_repeated_keys_fill_the_table(algorithm, rng):
    """Few keys (duplicates in every warp: the aggregating paths) and ~100 keys per tile
    (more than a simulated 64-slot table holds: the probe limit and the global fallback)."""
    for m, ops in ((5, UFUNCS[::2]), (200, UFUNCS[:2])):
        keys = rng.integers(0, m, 400 if SIMULATOR else 100000).astype(np.int32)
        values = rng.integers(-8, 9, keys.size) / 8.0
        out = rng.integers(-5, 5, m) / 8.0
        for op, ufunc, _ in ops:
            got = run(keys, values, out, op, algorithm=algorithm)
            np.testing.assert_array_equal(got, reference(ufunc, out, keys, values), err_msg="%s m=%d" % (op.name, m))


# --- runs, adaptive and table: rows, spans, carries ---------------------------------------------------

AGGREGATING = ("runs", "runs2", "adaptive", "table")


def runs_keys(rng, n, m, lengths, bad=0.0):
    """Keys in runs of the given lengths (random keys in [0, m)); a fraction ``bad`` of
    the runs has an out-of-range key (negative or >= m)."""
    count = n // min(lengths) + 1                  # enough runs to cover n
    run_keys = rng.integers(0, m, count)
    flawed = rng.random(count) < bad
    run_keys[flawed] = rng.choice([-1, m, m + 7], int(flawed.sum()))
    return np.repeat(run_keys, rng.choice(lengths, count))[:n]


@pytest.mark.parametrize("tile", [None, "32x4x64"])
@pytest.mark.parametrize("algorithm", AGGREGATING)
def test_runs_across_rows_spans_and_tiles(algorithm, tile, rng, monkeypatch):
    """Runs of 1..200 equal keys: runs inside a row, ending at lane 31, crossing rows
    (the carry; with 4 rows per span, whole rows inside one run), spans, warps and
    tiles, a last partial tile, and runs of bad keys."""
    if tile:
        monkeypatch.setenv("CUFOLD_BYKEY_TILE", tile)
    BK.plan.cache_clear()
    n = 1000 if SIMULATOR else 300000
    for i, (lengths, bad) in enumerate((((1, 2, 31, 32, 33, 64, 65, 200), 0.1), ((3, 5, 9, 17), 0.0),
                                        ((1, 1, 2), 0.2))):
        keys = runs_keys(rng, n - 13, 60, lengths, bad).astype(np.int64)
        values = rng.integers(-8, 9, keys.size) / 8.0
        # Simulator: plus, and max (the long runs) or min (the others): min and max take the
        # same compare-and-swap path, mirrored; both meet bad keys on every algorithm and tile
        for op, ufunc, init in ((UFUNCS[0], UFUNCS[2 if i == 0 else 1]) if SIMULATOR else UFUNCS):
            out = np.full(60, init)
            got = run(keys, values, out, op, algorithm=algorithm, check=False)
            np.testing.assert_array_equal(got, reference(ufunc, out, keys, values),
                                          err_msg="%s %s" % (op.name, lengths))
    monkeypatch.delenv("CUFOLD_BYKEY_TILE", raising=False)
    BK.plan.cache_clear()


@pytest.mark.parametrize("runs_max", [0, 31])
def test_row_schemes_forced(runs_max, monkeypatch, rng):
    """CUFOLD_BYKEY_RUNS=0: every row with a repeated neighbour goes to match_any
    (adaptive) or the shared table (table); 31: every such row is reduced by runs."""
    monkeypatch.setenv("CUFOLD_BYKEY_RUNS", str(runs_max))
    BK.plan.cache_clear()
    try:
        for order in ORDERS:
            keys, values, m = box(order, *SMALL)
            for alg in ("adaptive", "table"):
                assert BK.plan(cufold.plus, np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.float64), m,
                               keys.size, 0, alg, False, True).spec.tile.runs_max == runs_max
                for op, ufunc, init in UFUNCS[::2]:
                    out = np.full(m, init)
                    np.testing.assert_array_equal(run(keys, values, out, op, algorithm=alg),
                                                  reference(ufunc, out, keys, values), err_msg="%s %s" % (alg, order))
    finally:
        monkeypatch.delenv("CUFOLD_BYKEY_RUNS")
        BK.plan.cache_clear()


@pytest.mark.parametrize("key_dtype", ["int32", "int64"])
def test_rows_of_heads_that_repeat(key_dtype, rng):
    """Keys unlike their neighbours that still repeat (a power law's hot keys, shuffled) and
    rows of distinct keys, in one input: the default groups the first by match_any and gives
    the others plain updates, row by row; values exact in float64, NaN as numpy.maximum.at."""
    n = 64 * 2 * 4 * 3 + 37                      # three tiles of the simulator's 64 x 2, and a tail
    hot = np.cumsum(1 + rng.integers(0, 6, n)) % 7             # no key equals its neighbour
    spread = np.cumsum(1 + rng.integers(0, 1000, n)) % 50_000  # nor here, and few repeat at all
    keys = np.where((np.arange(n) // 64) % 3 == 1, spread, hot).astype(key_dtype)
    values = rng.integers(-1000, 1000, n).astype(np.float64)
    values[rng.integers(0, n, 3)] = np.nan
    m = 50_000
    assert (keys[1:] != keys[:-1]).all()
    for op, ufunc, init in UFUNCS[::2]:
        out = np.full(m, init)
        np.testing.assert_array_equal(run(keys, values, out, op), reference(ufunc, out, keys, values),
                                      err_msg=op.name)


@pytest.mark.parametrize("algorithm", AGGREGATING)
def test_wide_index_path(algorithm, rng):
    """The int64 index path (``out`` longer than 2**31, too big to allocate here):
    the same plan with ``wide`` forced, launched directly."""
    keys, values, m = box("shifted", *SMALL)
    keys = keys.astype(np.int64)
    keys[[5, 50]] = [-3, m + 2]
    p = BK.plan(cufold.plus, np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.float64), m, keys.size, 0,
                algorithm, False, True)
    p = p._replace(spec=p.spec._replace(wide=True))
    out = dev(np.zeros(m))
    o, k, v = (BK._arrays.describe(a, "x") for a in (out, dev(keys), dev(values)))
    st, epoch = BK._status(o.device_id, 0, True)
    BK.run(p, k, v, o, st.kernel, epoch, 0)
    np.testing.assert_array_equal(out.copy_to_host(), reference(np.add, np.zeros(m), keys, values))
    with pytest.raises(IndexError, match="key -3 at position 5"):
        BK._raise_errors(st, epoch, k, m, 0, o.device_id)


# --- keys, values, outputs -------------------------------------------------------------------------

@pytest.mark.parametrize("key_dtype", INT_KEYS)
def test_key_dtypes(key_dtype):
    """Every key width, for the automatic choice and (in turn) every algorithm."""
    dt = np.dtype(key_dtype)
    for order in ("shifted", "ordered"):
        keys, values, m = box(order, *SMALL)
        m = min(m, int(np.iinfo(dt).max) + 1)
        keys = (keys % m).astype(dt)
        out = np.zeros(m)
        want = reference(np.add, out, keys, values)
        np.testing.assert_array_equal(run(keys, values, out), want)
        alg = ALGORITHMS[(INT_KEYS.index(key_dtype) + (order == "ordered")) % len(ALGORITHMS)]
        np.testing.assert_array_equal(run(keys, values, out, algorithm=alg), want, err_msg=alg)


VALUE_CASES = [
    ("float32", "float32"), ("int32", "int32"), ("uint32", "uint32"), ("int64", "int64"),
    ("uint64", "uint64"), ("int32", "int64"), ("float32", "float64"), ("float64", "float32"),
    ("bool", "int32"), ("float16", "float32"), ("uint8", "uint64"),
]


@pytest.mark.parametrize("val_dtype,out_dtype", VALUE_CASES)
def test_value_and_out_dtypes(val_dtype, out_dtype, rng):
    keys, _, m = box("ordered", *SMALL)
    vd, od = np.dtype(val_dtype), np.dtype(out_dtype)
    if vd.kind == "b":
        values = rng.integers(0, 2, keys.size).astype(bool)
    elif vd.kind == "u":
        values = rng.integers(0, 17, keys.size).astype(vd)
    elif vd.kind == "i":
        values = rng.integers(-8, 9, keys.size).astype(vd)
    else:
        values = (rng.integers(-64, 65, keys.size) / 64).astype(vd)
    ops = UFUNCS if vd == od else UFUNCS[:1]     # casts: plus only
    for i, (op, ufunc, init) in enumerate(ops):
        if od.kind in "iu":
            init = {np.add: 0, np.minimum: np.iinfo(od).max, np.maximum: np.iinfo(od).min}[ufunc]
        out = np.full(m, init, dtype=od)
        alg = ALGORITHMS[(VALUE_CASES.index((val_dtype, out_dtype)) + i) % len(ALGORITHMS)]
        got = run(keys, values, out, op, algorithm=alg)
        assert got.dtype == od
        ref = reference(ufunc, out, keys, values)
        if od.kind == "f":
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6, err_msg="%s %s" % (op.name, alg))
        else:
            np.testing.assert_array_equal(got, ref, err_msg="%s %s" % (op.name, alg))


def test_unsigned_extremes(rng):
    """uint64 values above 2**63 and uint32 above 2**31: unsigned atomics and compares."""
    keys = rng.integers(0, 40, 150).astype(np.uint16)
    for dt in (np.uint32, np.uint64):
        top = np.iinfo(dt).max
        values = np.array(top, dt) - rng.integers(0, 1000, keys.size).astype(dt)
        for i, alg in enumerate(ALGORITHMS):
            for op, ufunc, init in ((cufold.maximum, np.maximum, 0), (cufold.minimum, np.minimum, top))[i % 2::2]:
                out = np.full(40, init, dtype=dt)
                np.testing.assert_array_equal(run(keys, values, out, op, algorithm=alg),
                                              reference(ufunc, out, keys, values), err_msg="%s %s" % (alg, dt))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_nan_propagates_as_numpy(algorithm, rng):
    keys, values, m = box("shifted", *SMALL)
    keys = keys.astype(np.int32)
    values = values.copy()
    values[rng.integers(0, values.size, 6)] = np.nan
    for dt in (np.float64, np.float32):
        for op, ufunc, init in UFUNCS[1:]:
            out = np.full(m, init, dtype=dt)
            out[[1, 5]] = np.nan                 # a NaN already in out stays
            got = run(keys, values.astype(dt), out, op, algorithm=algorithm)
            np.testing.assert_array_equal(got, reference(ufunc, out, keys, values.astype(dt)),
                                          err_msg="%s %s" % (op.name, dt))
            assert np.isnan(got[[1, 5]]).all()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", [1, 31, 33, 37, 100])
def test_partial_last_warp(n, algorithm, rng):
    keys = rng.integers(0, 7, n).astype(np.int32)
    values = rng.integers(-8, 9, n).astype(np.float64)
    out = np.zeros(7)
    np.testing.assert_array_equal(run(keys, values, out, algorithm=algorithm), reference(np.add, out, keys, values))


@pytest.mark.parametrize("algorithm", ALGORITHMS + (None,))
def test_empty_input(algorithm):
    out = np.arange(4.0)
    for check in (True, False):
        got = run(np.zeros(0, np.int32), np.zeros(0), out, algorithm=algorithm, check=check)
        np.testing.assert_array_equal(got, out)


def test_strided_arrays(rng):
    keys = rng.integers(0, 30, 400).astype(np.int64)
    values = rng.integers(-8, 9, 600).astype(np.float64) / 8 + 1
    big = np.full(70, 1.0)
    for alg in ALGORITHMS:
        for op, ufunc in ((cufold.plus, np.add), (cufold.multiplies, np.multiply)):
            dk, dv, dout = dev(keys), dev(values), dev(big)
            BK.reduce_by_key_into(dk[::2], dv[::3], dout[1::2][:30], op, algorithm=alg)
            want = big.copy()
            view = want[1::2][:30]
            ufunc.at(view, keys[::2], values[::3][:200])
            np.testing.assert_allclose(dout.copy_to_host(), want, rtol=1e-12, err_msg="%s %s" % (alg, op.name))


# --- out-of-range keys ---------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_out_of_range_keys(algorithm, rng):
    m = 50
    keys = rng.integers(0, m, 300).astype(np.int64)
    keys[[40, 90, 200]] = [m, -1, 1 << 40]
    values = rng.integers(-8, 9, keys.size).astype(np.float64)
    guard = np.zeros(m + 64)
    dk, dv = dev(keys), dev(values)
    dbig = dev(guard)
    out = dbig[32:32 + m]
    with pytest.raises(IndexError, match=r"key 50 at position 40 is out of range for out of length 50"):
        BK.reduce_by_key_into(dk, dv, out, algorithm=algorithm)
    got = dbig.copy_to_host()
    assert not got[:32].any() and not got[32 + m:].any()          # nothing written outside out
    want = reference(np.add, np.zeros(m), keys, values)
    np.testing.assert_array_equal(got[32:32 + m], want)            # the valid keys were applied
    # check=False: no error, the bad keys are skipped
    BK.reduce_by_key_into(dk, dv, out, algorithm=algorithm, check=False)
    np.testing.assert_array_equal(dbig.copy_to_host()[32:32 + m], 2 * want)
    # a later checked call with good keys does not see the earlier errors
    good = dev(np.clip(keys, 0, m - 1))
    BK.reduce_by_key_into(good, dv, out, algorithm=algorithm)


def test_checked_call_reads_one_flag(monkeypatch):
    """A checked call synchronises and reads the mapped flag; the status words are
    copied back only when the call's kernels recorded a bad key."""
    keys, values, m = box("ordered", *SMALL)
    dk, dv, out = dev(keys), dev(values), dev(np.zeros(m))
    copies = []
    real = BK._arrays.as_numba

    def spy(a):
        copies.append(a)
        return real(a)
    monkeypatch.setattr(BK._arrays, "as_numba", spy)
    BK.reduce_by_key_into(dk, dv, out)
    st = BK._statuses[(0, 0)]
    assert st.flag_host is not None and not st.flagged(st.epoch)
    assert not any(a is st.words for a in copies)
    bad = keys.copy()
    bad[7] = m
    with pytest.raises(IndexError, match="key %d at position 7" % m):
        BK.reduce_by_key_into(dev(bad), dv, out)
    assert st.flagged(st.epoch) and any(a is st.words for a in copies)
    BK.reduce_by_key_into(dk, dv, out)                 # the next checked call starts clean
    assert not st.flagged(st.epoch)


def test_out_of_range_key_dtypes():
    values = np.ones(40)
    for dt, bad in (("uint8", 200), ("int8", -3), ("uint32", 2**32 - 1), ("uint64", 2**64 - 1),
                    ("uint64", 2**63 + 5), ("int64", -(2**63))):
        keys = np.zeros(40, dtype=dt)
        keys[33] = bad
        with pytest.raises(IndexError, match=r"key %d at position 33 is out of range for out of length 10" % bad):
            run(keys, values, np.zeros(10), algorithm="atomic")
        got = run(keys, values, np.zeros(10), check=False, algorithm="atomic")
        assert got[0] == 39 and got[1:].sum() == 0


def test_every_key_bad():
    with pytest.raises(IndexError, match="key 0 at position 0 is out of range for out of length 0"):
        run(np.zeros(5, np.int32), np.ones(5), np.zeros(0))


# --- deterministic mode, operators ------------------------------------------------------------------

def test_deterministic_mode(rng):
    keys, _, m = box("ordered", *SMALL)
    keys = keys.astype(np.int32)
    values = rng.standard_normal(keys.size)
    p = BK.plan(cufold.plus, np.dtype(np.int32), np.dtype(np.float64), np.dtype(np.float64), m, keys.size, 0,
                None, True, True)
    assert p.spec.algorithm == "sorted"
    first = run(keys, values, np.zeros(m), deterministic=True)
    again = run(keys, values, np.zeros(m), deterministic=True)
    assert first.tobytes() == again.tobytes()
    np.testing.assert_allclose(first, reference(np.add, np.zeros(m), keys, values), rtol=1e-12, atol=1e-12)
    # keys in any order: grouped first (a stable sort), the same bits every run
    shuffled = rng.permutation(keys)
    assert BK.plan(cufold.plus, np.dtype(np.int32), np.dtype(np.float64), np.dtype(np.float64), m,
                   keys.size, 0, None, True, True).group
    first = run(shuffled, values, np.zeros(m), deterministic=True)
    assert first.tobytes() == run(shuffled, values, np.zeros(m), deterministic=True).tobytes()
    np.testing.assert_allclose(first, reference(np.add, np.zeros(m), shuffled, values), rtol=1e-12,
                               atol=1e-12)
    # algorithm='sorted' says the keys are grouped already: checked, not sorted
    swapped = keys.copy()
    swapped[[10, 40]] = swapped[[40, 10]]    # keys 3 and 13
    with pytest.raises(ValueError, match=r"deterministic=True needs keys sorted .* keys\[\d+\] = \d+ follows"):
        run(swapped, values, np.zeros(m), deterministic=True, algorithm="sorted")
    # other algorithms are refused for floats, fine for integers (exact, order-free)
    with pytest.raises(ValueError, match="deterministic=True needs algorithm='sorted'"):
        run(keys, values, np.zeros(m), deterministic=True, algorithm="warp")
    ints = rng.integers(-8, 9, keys.size).astype(np.int64)
    got = run(keys, ints, np.zeros(m, np.int64), deterministic=True, algorithm="block")
    np.testing.assert_array_equal(got, reference(np.add, np.zeros(m, np.int64), keys, ints))


def test_non_commutative_operator(rng):
    """'keep the last value': associative, not commutative; 'sorted' folds in sequence order."""
    last = cufold.Op(lambda a, b: b, name="last")
    keys = np.sort(rng.integers(0, 40, 500)).astype(np.int32)
    values = rng.standard_normal(keys.size)
    out = np.full(45, -7.0)
    want = out.copy()
    for k, v in zip(keys, values):
        want[k] = v
    np.testing.assert_array_equal(run(keys, values, out, last), want)
    np.testing.assert_array_equal(run(keys, values, out, last, algorithm="sorted"), want)
    # keys in any order: the automatic choice groups them (stably) first
    order = rng.permutation(keys.size)
    want = out.copy()
    for k, v in zip(keys[order], values[order]):
        want[k] = v
    np.testing.assert_array_equal(run(keys[order], values[order], out, last), want)
    for alg in ALGORITHMS:
        if alg != "sorted":
            with pytest.raises(ValueError, match="commutative"):
                run(keys, values, out, last, algorithm=alg)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_compare_and_swap_operators(algorithm, rng):
    keys, _, m = box("shifted", *SMALL)
    keys = keys.astype(np.int32)
    near_one = 1 + rng.integers(-4, 5, keys.size) / 64
    signs = rng.choice(np.array([1, 1, 1, 2, -1], np.int64), keys.size)
    bits = rng.integers(0, 2**32, keys.size, dtype=np.uint64).astype(np.uint32)
    cases = [
        (cufold.multiplies, np.multiply, np.ones(m), near_one),
        (cufold.multiplies, np.multiply, np.ones(m, np.int64), signs),
        (cufold.bit_or, np.bitwise_or, np.zeros(m, np.uint32), bits),
        (cufold.bit_xor, np.bitwise_xor, np.zeros(m, np.int64), bits.astype(np.int64)),
        (cufold.bit_and, np.bitwise_and, np.full(m, -1, np.int32), bits.astype(np.int32)),
    ]
    for op, ufunc, out, values in cases:
        got = run(keys, values, out, op, algorithm=algorithm)
        ref = reference(ufunc, out, keys, values)
        if out.dtype.kind == "f":
            np.testing.assert_allclose(got, ref, rtol=1e-12, err_msg=op.name)
        else:
            np.testing.assert_array_equal(got, ref, err_msg="%s %s" % (op.name, out.dtype))


def test_user_operators(rng):
    keys, values, m = box("random", *SMALL)
    absmax = cufold.Op(lambda a, b: a if abs(a) >= abs(b) else b, identity=0.0, commutative=True)
    no_identity = cufold.Op(lambda a, b: a if abs(a) >= abs(b) else b, commutative=True)
    values = values * np.where(rng.random(values.size) < 0.5, -1, 1)
    want = np.zeros(m)
    for k, v in zip(keys, values):
        want[k] = want[k] if abs(want[k]) >= abs(v) else v
    # ties between +x and -x make the result order-dependent: compare magnitudes
    for alg in ALGORITHMS:
        np.testing.assert_array_equal(np.abs(run(keys, values, np.zeros(m), absmax, algorithm=alg)),
                                      np.abs(want), err_msg=str(alg))
    assert BK.plan(no_identity, np.dtype(np.int64), np.dtype(np.float64), np.dtype(np.float64), m, 10, 0, None,
                   False, True).spec.algorithm == BK.AUTO_NO_IDENTITY
    np.testing.assert_array_equal(np.abs(run(keys, values, np.zeros(m), no_identity)), np.abs(want))
    for alg in ("block", "table"):
        with pytest.raises(ValueError, match="identity"):
            run(keys, values, np.zeros(m), no_identity, algorithm=alg)


# --- errors ---------------------------------------------------------------------------------------

def test_argument_errors():
    k, v, o = np.zeros(4, np.int32), np.ones(4), np.zeros(3)
    cases = [
        ((k.astype(np.float64), v, o), {}, TypeError, "keys must have an integer dtype"),
        ((k.astype(bool), v, o), {}, TypeError, "keys must have an integer dtype"),
        ((k, v, o.astype(np.float16)), {}, TypeError, "out must have a 32- or 64-bit dtype"),
        ((k, v, o.astype(np.int8)), {}, TypeError, "out must have a 32- or 64-bit dtype"),
        ((k, v, o.astype(np.int32)), {}, TypeError, "same_kind"),
        ((k, v.astype(np.complex128), o), {}, TypeError, "cannot be accumulated"),
        ((k[:3], v, o), {}, ValueError, "equally long"),
        ((k.reshape(2, 2), v.reshape(2, 2), o), {}, ValueError, "1-D"),
        ((k, v, o), {"algorithm": "nope"}, ValueError, "unknown reduce_by_key algorithm"),
    ]
    for args, kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            BK.reduce_by_key_into(*(dev(a) for a in args), **kw)
    with pytest.raises(TypeError, match="bit_or is not defined for dtype float64"):
        BK.reduce_by_key_into(dev(k), dev(v), dev(o), cufold.bit_or)
    with pytest.raises(TypeError, match="host"):
        BK.reduce_by_key_into(k, dev(v), dev(o))


def test_automatic_choice():
    f64, i32 = np.dtype(np.float64), np.dtype(np.int32)

    def auto(op, out=f64, deterministic=False):
        return BK.plan(op, i32, out, out, 100, 1000, 0, None, deterministic, True).spec.algorithm

    assert auto(cufold.plus) == BK.AUTO == "adaptive"
    assert auto(cufold.maximum) == auto(cufold.multiplies) == "adaptive"        # identities
    assert auto(cufold.Op(lambda a, b: a + b, commutative=True)) == BK.AUTO_NO_IDENTITY == "adaptive"
    assert auto(cufold.as_op(lambda a, b: a + b)) == "sorted"                 # not commutative
    assert auto(cufold.plus, deterministic=True) == "sorted"

    def groups(op, out=f64, deterministic=False, algorithm=None):
        return BK.plan(op, i32, out, out, 100, 1000, 0, algorithm, deterministic, True).group

    assert groups(cufold.plus, deterministic=True) and groups(cufold.as_op(lambda a, b: a + b))
    assert not groups(cufold.plus, deterministic=True, algorithm="sorted")   # keys grouped already
    assert not groups(cufold.plus) and not groups(cufold.plus, np.dtype(np.int64), deterministic=True)
    assert auto(cufold.plus, np.dtype(np.int64), deterministic=True) == "adaptive"  # exact anyway
    assert BK.plan(cufold.maximum, i32, f64, f64, 100, 1000, 0, None, False, True).spec.mode == "cas"
    assert BK.plan(cufold.plus, i32, f64, f64, 100, 1000, 0, None, False, True).spec.mode == "hw"


def test_exported():
    if not hasattr(cufold, "reduce_by_key_into"):
        pytest.skip("cufold.reduce_by_key_into not exported yet")
    assert cufold.reduce_by_key_into is BK.reduce_by_key_into
    assert tuple(cufold.algorithms("reduce_by_key")) == ALGORITHMS


# --- one Program per call signature --------------------------------------------------------------

@pytest.fixture
def builds(monkeypatch):
    """Programs built (a call that plans) from here on; the cache starts empty."""
    BK._bykey_programs.clear()
    made = []
    real = BK._programs.Builder.build

    def build(self, finish=None):
        made.append(self)
        return real(self, finish)
    monkeypatch.setattr(BK._programs.Builder, "build", build)
    return made


PROGRAM_CASES = [("adaptive", False), ("block", False), ("sorted", False), (None, True)]


@pytest.mark.parametrize("algorithm,deterministic", PROGRAM_CASES)
def test_program_reused_per_signature(algorithm, deterministic, builds, rng):
    """The first call of a signature plans its Program; later calls with new arrays and
    data of that signature run it without planning, and are right. Another length is
    another signature; forgetting the plans (new tuning) forgets the Programs."""
    m = 37
    for n, planned in ((300, 1), (300, 1), (300, 1), (301, 2)):
        keys = rng.integers(0, m, n).astype(np.int32)
        if algorithm == "sorted":
            keys = np.sort(keys)
        values = rng.standard_normal(n)
        out = rng.standard_normal(m)
        got = run(keys, values, out, algorithm=algorithm, deterministic=deterministic)
        np.testing.assert_allclose(got, reference(np.add, out, keys, values), rtol=1e-12, atol=1e-12)
        assert len(builds) == planned
    BK.plan.cache_clear()
    run(keys, values, out, algorithm=algorithm, deterministic=deterministic)
    assert len(builds) == 3


def test_program_keeps_no_array_alive(builds):
    import gc
    import weakref
    keys, values, m = box("shifted", *SMALL)
    arrays = [dev(keys), dev(values), dev(np.zeros(m))]
    BK.reduce_by_key_into(*arrays, deterministic=True)
    refs = [weakref.ref(a) for a in arrays]
    del arrays
    gc.collect()
    assert len(builds) == 1 and all(r() is None for r in refs)


@pytest.mark.parametrize("deterministic", [False, True])
def test_host_synchronisations(deterministic, monkeypatch, rng):
    """check=False: no host synchronisation and no copy back, planning call or not;
    check=True: exactly one synchronisation (and, with good keys, no copy)."""
    syncs, copies = [], []
    from cufold.host import readback
    real_sync = readback.synchronize
    monkeypatch.setattr(readback, "synchronize", lambda *a: syncs.append(a) or real_sync(*a))
    device_array = type(dev(np.zeros(1)))
    real_copy = device_array.copy_to_host
    monkeypatch.setattr(device_array, "copy_to_host",
                        lambda self, *a, **kw: copies.append(self) or real_copy(self, *a, **kw))
    m = 40
    n0 = 200 if SIMULATOR else 500                               # two simulated tiles: several blocks
    keys = dev(rng.integers(0, m, n0).astype(np.int32))          # any order (grouped first)
    values = dev(rng.standard_normal(n0))
    for n in (n0, n0 - 1):                                       # a new signature, then a planned one
        for check, want in ((False, 0), (True, 1), (False, 0), (True, 1)):
            del syncs[:], copies[:]
            BK.reduce_by_key_into(keys[:n], values[:n], dev(np.zeros(m)), deterministic=deterministic,
                                  check=check)
            assert (len(syncs), len(copies)) == (want, 0), (n, check)


@pytest.mark.parametrize("algorithm,deterministic", PROGRAM_CASES)
def test_checked_program_reports_every_call(algorithm, deterministic, builds, rng):
    """One checked Program, many calls: each call's epoch is its own, so a bad key is
    reported by the call that has it (its position), and not by the calls after it."""
    m, n = 30, 200
    base = rng.integers(0, m, n).astype(np.int64)
    if algorithm == "sorted":
        base = np.sort(base)
    values = dev(rng.standard_normal(n))
    for bad_at in (None, None, 17, None, 150, 3, None):
        keys = base.copy()
        if bad_at is not None:
            keys[bad_at] = m + bad_at
        out = dev(np.zeros(m))
        if bad_at is None:
            BK.reduce_by_key_into(dev(keys), values, out, algorithm=algorithm, deterministic=deterministic)
        else:
            with pytest.raises(IndexError, match="key %d at position %d " % (m + bad_at, bad_at)):
                BK.reduce_by_key_into(dev(keys), values, out, algorithm=algorithm, deterministic=deterministic)
        want = reference(np.add, np.zeros(m), keys, values.copy_to_host())
        np.testing.assert_allclose(out.copy_to_host(), want, rtol=1e-12, atol=1e-12)
    if algorithm == "sorted" and deterministic is False:
        # the order check of algorithm='sorted', deterministic=True, after good calls
        for swap in (False, True, False):
            keys = base.copy()
            if swap:
                keys[[10, 190]] = keys[[190, 10]]
            call = lambda: BK.reduce_by_key_into(dev(keys), values, dev(np.zeros(m)), algorithm="sorted",
                                                 deterministic=True)
            if swap:
                with pytest.raises(ValueError, match="keys sorted"):
                    call()
            else:
                call()
    assert len(builds) == (2 if algorithm == "sorted" and deterministic is False else 1)


def test_renewed_status_plans_again(builds):
    """Epochs run out (EPOCH_LIMIT): the status of the stream is renewed, and the
    Program that bound the old one is planned again (its guard), reporting through the
    new one."""
    keys, values, m = box("ordered", *SMALL)
    dk, dv = dev(keys), dev(values)
    BK.reduce_by_key_into(dk, dv, dev(np.zeros(m)))
    old = BK._statuses[(0, 0)]
    old.epoch = BK.EPOCH_LIMIT
    BK.reduce_by_key_into(dk, dv, dev(np.zeros(m)))
    new = BK._statuses[(0, 0)]
    assert new is not old and new.epoch == 1 and len(builds) == 2
    bad = keys.copy()
    bad[9] = -1
    with pytest.raises(IndexError, match="key -1 at position 9 "):
        BK.reduce_by_key_into(dev(bad), dv, dev(np.zeros(m)))
    assert new.flagged(new.epoch) and len(builds) == 2


# --- GPU: sizes that matter --------------------------------------------------------------------------

@gpu_only
@pytest.mark.parametrize("order", ORDERS)
def test_seed_box_full_size(order):
    keys, values, m = box(order, 100, 10)
    ref = np.bincount(keys, weights=values, minlength=m)
    dk, dv = dev(keys.astype(np.int32)), dev(values)
    for alg in ALGORITHMS + (None,):
        out = dev(np.zeros(m))
        BK.reduce_by_key_into(dk, dv, out, algorithm=alg)
        np.testing.assert_array_equal(out.copy_to_host(), ref, err_msg=str(alg))
    out = dev(np.full(m, -np.inf))
    BK.reduce_by_key_into(dk, dv, out, cufold.maximum)
    want = np.full(m, -np.inf)
    np.maximum.at(want, keys, values)
    np.testing.assert_array_equal(out.copy_to_host(), want)


@gpu_only
@pytest.mark.parametrize("order", ORDERS)
def test_seed_box_deterministic(order):
    """deterministic=True on every key order: grouped by a radix sort of three passes."""
    keys, values, m = box(order, 100, 10)
    values = values + np.random.default_rng(5).standard_normal(values.size) * 1e-3  # inexact sums
    dk, dv = dev(keys.astype(np.int32)), dev(values)
    got = []
    for _ in range(3):
        out = dev(np.zeros(m))
        BK.reduce_by_key_into(dk, dv, out, deterministic=True)
        got.append(out.copy_to_host())
    assert got[0].tobytes() == got[1].tobytes() == got[2].tobytes()
    np.testing.assert_allclose(got[0], np.bincount(keys, weights=values, minlength=m), rtol=1e-12, atol=1e-12)


@gpu_only
def test_one_hot_key_and_long_runs():
    """Every element on one key (all contention on one word; one run over every tile)."""
    n = (1 << 22) + 5
    values = BB.box_values(n)
    for alg in ALGORITHMS:
        for op, want in ((cufold.plus, values.sum()), (cufold.maximum, values.max()),
                         (cufold.multiplies, None)):
            # a CAS loop with every thread on one word is quadratic in the contenders:
            # keep the plain-atomic case small
            cas_n = (1 << 12) if alg == "atomic" else (1 << 18)
            vals = values if op is not cufold.multiplies else 1 + values[:cas_n] / 2**20
            n = vals.size
            out = dev(np.array([0.0 if op is cufold.plus else (-np.inf if op is cufold.maximum else 1.0)]))
            BK.reduce_by_key_into(dev(np.zeros(n, np.int32)), dev(vals), out, op, algorithm=alg)
            ref = want if want is not None else np.prod(vals)
            np.testing.assert_allclose(out.copy_to_host()[0], ref, rtol=1e-8, err_msg="%s %s" % (alg, op.name))


@gpu_only
def test_keys_beyond_int32():
    m = 2**31 + 40
    out = cuda.device_array(m, np.int32)
    out[m - 64:] = np.zeros(64, np.int32)
    keys = np.array([m - 1, m - 2, m - 1, 3, m, 2**31], np.int64)
    for alg in ALGORITHMS:
        out[m - 64:] = np.zeros(64, np.int32)
        BK.reduce_by_key_into(dev(keys[:4]), dev(np.ones(4, np.int32)), out, algorithm=alg)
        tail = out[m - 64:].copy_to_host()
        assert tail[-1] == 2 and tail[-2] == 1, alg
        with pytest.raises(IndexError, match="key %d at position 4" % m):
            BK.reduce_by_key_into(dev(keys), dev(np.ones(6, np.int32)), out, algorithm=alg)
    del out


# --- the benchmark (no GPU needed) ------------------------------------------------------------------

def test_box_keys():
    side, per = 5, 4
    ordered = BB.box_keys(side, per, "ordered")
    assert ordered.size == side ** 3 * per and np.all(np.diff(ordered) >= 0)
    assert abs(BB.equal_neighbours(ordered) - (per - 1) / per) < 0.01
    rnd = BB.box_keys(side, per, "random")
    np.testing.assert_array_equal(np.sort(rnd), ordered)
    sh = BB.box_keys(side, per, "shifted")
    for a, b in ((ordered, sh),):
        d = [((b // side ** k) % side - (a // side ** k) % side) % side for k in range(3)]
        assert all(np.isin(x, (0, 1)).all() for x in d)
        assert all(0.4 < np.mean(x) < 0.6 for x in d)
    assert 0.05 < BB.equal_neighbours(BB.box_keys(20, 10, "shifted")) < 0.2
    with pytest.raises(ValueError):
        BB.box_keys(2, 2, "sideways")
    v = BB.box_values(1000)
    assert np.all(v * 256 == np.round(v * 256)) and np.abs(v).max() <= 1


def test_bench_dry_run_and_no_gpu():
    import io
    from cufold import bench
    out = io.StringIO()
    assert bench.main(["bykey", "--dry-run", "--side", "4"], stdout=out, stderr=io.StringIO()) == 0
    text = out.getvalue()
    for s in ("cufold.reduce_by_key_into", "cufold[block]", "torch.index_add_", "cupyx.scatter_add",
              "torch.segment_reduce", "ordered keys: cufold.reduce_by_key_into vs best peer (>= 2)"):
        assert s in text, s
    assert bench.main(["bykey", "--orders", "nope"], stdout=io.StringIO(), stderr=io.StringIO()) == 2
    if SIMULATOR:
        err = io.StringIO()
        assert bench.main(["bykey", "--side", "3"], stdout=io.StringIO(), stderr=err) == 2
        assert "simulator" in err.getvalue()


class _HostBackend:
    """The bench's backend on simulator arrays, timed by the wall clock."""

    name = "numba"
    cufold_input = "numba"

    def __init__(self):
        from cufold.bench.timing import WallClock
        self.clock = WallClock()

    def upload(self, h):
        return dev(h)

    def view(self, a, kind):
        return a

    def fetch(self, a):
        return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)

    def sync(self):
        pass

    def release(self):
        pass

    def device_info(self):
        return {"name": "simulated", "cc": "0.0", "l2_bytes": 1 << 20}


def test_bench_end_to_end(tmp_path):
    from cufold.bench import backends, report
    from cufold.bench.timing import Settings
    env = backends.Env()
    env.modules["cufold"] = cufold
    settings = Settings(target_s=1e-4, min_reps=1, max_reps=2, warmup=0, est_reps=1, max_case_s=5)

    def host_peer(ctx):
        out = np.zeros(ctx.m)
        return BB.Prepared(lambda: np.add.at(out, ctx.keys, ctx.values), lambda: out, "numpy")

    def wrong_peer(ctx):
        out = np.ones(ctx.m)
        return BB.Prepared(lambda: None, lambda: out, "")

    cands = [c for c in BB.candidates(("warp",)) if c.label in (BB.AUTO, "cufold[warp]")]
    cands += [BB.Cand("numpy.add.at", "numpy", "peer", host_peer),
              BB.Cand("broken", "numpy", "peer", wrong_peer)]
    res = BB.run(env, _HostBackend(), ["random", "ordered"], 2, 2, "int32", settings, progress=False,
                 cands=cands)
    by = {(r["case"], r["label"]): r for r in res["records"]}
    assert by[("random", BB.AUTO)]["status"] == "ok" and by[("random", BB.AUTO)]["gpu_us"] > 0
    assert by[("ordered", "cufold[warp]")]["status"] == "ok"
    assert by[("random", "broken")]["status"] == "mismatch"
    text = BB.format_results(res)
    assert "== random keys" in text and "best peer: numpy.add.at" in text and "targets (bykey):" in text
    evals = BB.evaluate(res)
    assert [e["status"] in ("PASS", "MISS") for e in evals] == [True, True]
    path = report.write_json(res, str(tmp_path / "results.json"))
    assert report.load_json(path)["meta"]["box"]["n"] == 16


# --- what the simulator cannot see: Numba's integer typing ------------------------------------

_PTX_SCRIPT = r"""
import importlib
import cufold
from cufold.host import arrays as _arrays
from cufold.device import bykey as BK
L = importlib.import_module("cufold.host.launch")

def arr(dt, n=1 << 20):
    return _arrays.Arr(0x10000, (n,), (1,), np.dtype(dt), n, "numba", None, 0)

found = {}

class Stub:
    name = "stub"
    def launch(self, *args):
        pass
    def bind(self, *args):
        return lambda *new: None

def fake_kernel_for(fn, key, kargs):
    if key[0] == "bykey":
        ptx = compile_sm90(fn, tuple(L._nbtype(a) for a in kargs))
        found[key[1].algorithm, key[1].wide] = sorted(set(re.findall(r"\bclz\.b\d+", ptx)))
        with open(os.path.join(os.environ["PTX_DIR"], "%s-%d.ptx" % (key[1].algorithm, key[1].wide)), "w") as f:
            f.write(ptx)
    return Stub()

L.kernel_for = fake_kernel_for
for alg in ("runs", "runs2", "adaptive", "table"):
    for m in (1 << 20, 1 << 40):   # the int32 and the int64 (wide) index paths
        p = BK.plan(cufold.plus, np.dtype(np.int32), np.dtype(np.float64), np.dtype(np.float64), m, 1 << 20,
                    0, alg, False, False)
        BK.run(p, arr(np.int32, 1 << 20), arr(np.float64, 1 << 20), arr(np.float64, m),
               (arr(np.int64, 2), arr(np.int64, 1)), 0, 0)
print("CLZ", found)
"""


@pytest.fixture(scope="module")
def sm90_ptx(tmp_path_factory):
    """``({(algorithm, wide): clz instructions}, folder of the PTX files)`` of ``runs``,
    ``runs2``, ``adaptive`` and ``table`` compiled for sm_90 in a subprocess (no
    simulator); skips where there is no NVVM."""
    folder = str(tmp_path_factory.mktemp("ptx"))
    return run_sm90_script(_PTX_SCRIPT, "CLZ", PTX_DIR=folder), folder


def test_runs_ptx_clz_32(sm90_ptx):
    """The run scan's segment start is ``31 - clz(heads & lanes 0..lane)`` on a 32-bit
    ballot. Numba types ``uint32 | uint32`` as uint64 where NumPy (the simulator) keeps
    uint32, so a missing cast compiles to a 64-bit ``clz`` (start off by 32: every lane
    scans across its run head) that only a GPU shows. In the PTX of ``runs``, ``runs2``,
    ``adaptive`` and ``table``: only ``clz.b32`` (their only ``clz`` is the run scan's;
    ``ffs`` of a 64-bit word, as ``warp.reduce_peers`` had, would add one)."""
    found, _ = sm90_ptx
    assert len(found) == 8
    for (alg, wide), clz in found.items():
        assert clz == ["clz.b32"], (alg, wide, clz)


def test_adaptive_match_rows_stay_converged(sm90_ptx):
    """``adaptive``'s match rows: two ``match_any`` per row of 64 (one per half), in the
    SASS too. With the halves chosen by selects on ``lane < 16``, ptxas duplicated the
    second half per half-warp (24 ``MATCH`` for 8 in the PTX), and the diverged
    ``match_any`` made seed 001's shifted keys 2.4x slower on an H200. Needs ``ptxas``
    and ``nvdisasm`` (CUDA toolkit; the GPU machine has them)."""
    import os
    import re
    import shutil
    import subprocess
    _, folder = sm90_ptx
    tools = [shutil.which(t) or (os.path.exists("/usr/local/cuda/bin/" + t) and "/usr/local/cuda/bin/" + t)
             for t in ("ptxas", "nvdisasm")]
    ptx = os.path.join(folder, "adaptive-0.ptx")
    rows = 2 * BK.GPU_TILES["adaptive"][1]                    # full and partial spans
    assert len(re.findall(r"\bmatch\.any", open(ptx).read())) == 2 * rows
    if not all(tools):
        pytest.skip("ptxas and nvdisasm not found: the SASS is not checked")
    cubin = ptx + ".cubin"
    for version in (None, "8.0"):                               # NVVM's PTX may be newer than ptxas
        if version:
            text = re.sub(r"^\.version .*$", ".version " + version, open(ptx).read(), flags=re.M)
            ptx = ptx + ".old.ptx"
            open(ptx, "w").write(text)
        r = subprocess.run([tools[0], "-arch=sm_90", ptx, "-o", cubin], capture_output=True, text=True)
        if r.returncode == 0:
            break
    assert r.returncode == 0, r.stderr[-2000:]
    sass = subprocess.run([tools[1], "-c", cubin], capture_output=True, text=True, check=True).stdout
    assert len(re.findall(r"\bMATCH\.ANY\b", sass)) == 2 * rows
