"""Feature rows (values of shape (n, F)) in reduce_by_key_into, segmented_reduce and
reduce_by_key, against NumPy in float64: ``np.add.at`` / ``np.maximum.at`` on rows,
``np.add.reduceat`` on rows (where a segment is empty NumPy gives the next row, cufold the
identity or ``init``), sequential folds for operators NumPy lacks.

In the simulator a span is 8 rows (a group of P lanes owns one: ``32 / P`` spans a warp),
so a few dozen rows cross many spans, groups and warps, and the piece levels run; F of 1,
3, 16, 31, 32, 33 and 1024 cover one and several features a lane in sub-warp groups, one
warp per row and several feature chunks. Outputs are poisoned when allocated.
"""

import inspect
import itertools
import types

import numpy as np
import pytest
from numba import cuda

from conftest import SIMULATOR, poison_allocations, to_device, to_host

import cufold

INT_DTYPES = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)
FEATURES = (1, 3, 16, 32, 33)
N = 90 if SIMULATOR else 20_000
M = 11 if SIMULATOR else 3000

#: the first non-zero value: associative, not commutative, identity 0
FIRST_NONZERO = cufold.Op(lambda a, b: a if a != 0 else b, identity=0, name="first_nonzero")


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every array the library allocates starts full of a value no result holds."""
    poison_allocations(monkeypatch)


def power_keys(rng, n, m, dtype=np.int32, shuffled=False):
    """Keys in [0, m) with power-law counts (a few long runs, many short), sorted or not."""
    weights = 1.0 / np.arange(1, m + 1) ** 1.2
    keys = np.sort(rng.choice(m, size=n, p=weights / weights.sum()))
    if shuffled:
        keys = rng.permutation(keys)
    return keys.astype(dtype)


def add_at_rows(out, keys, values, ufunc=np.add):
    ref = out.astype(np.float64)
    ufunc.at(ref, keys.astype(np.int64), values.astype(np.float64))
    return ref


# --- reduce_by_key_into -------------------------------------------------------------------------

@pytest.mark.parametrize("F", FEATURES)
@pytest.mark.parametrize("shuffled", [False, True])
def test_into_sum_and_max(rng, F, shuffled):
    keys = power_keys(rng, N, M, shuffled=shuffled)
    values = rng.standard_normal((N, F)).astype(np.float32)
    start = rng.standard_normal((M, F)).astype(np.float32)
    got = cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start))
    np.testing.assert_allclose(to_host(got), add_at_rows(start, keys, values), rtol=1e-5, atol=1e-4)
    got = cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start), cufold.maximum)
    np.testing.assert_array_equal(to_host(got), add_at_rows(start, keys, values, np.maximum).astype(np.float32))


def test_into_1024_features(rng):
    n, m, F = 24, 5, 1024
    keys = power_keys(rng, n, m)
    values = rng.standard_normal((n, F))
    start = rng.standard_normal((m, F))
    got = cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start))
    np.testing.assert_allclose(to_host(got), add_at_rows(start, keys, values), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("key_dt", INT_DTYPES)
def test_into_every_key_width(rng, key_dt):
    m = 7
    keys = rng.integers(0, m, N).astype(key_dt)
    values = rng.integers(-50, 50, (N, 3)).astype(np.int32)
    start = rng.integers(-9, 9, (m, 3)).astype(np.int64)
    got = cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start))
    np.testing.assert_array_equal(to_host(got), add_at_rows(start, keys, values).astype(np.int64))


def test_into_strided_rows(rng):
    """Views: every other row and feature of a bigger array, F-ordered values, a strided out."""
    F = 5
    keys = power_keys(rng, N, M)
    big = rng.standard_normal((2 * N, 2 * F)).astype(np.float32)
    values = cuda.to_device(big)[::2, 1::2]
    fortran = cuda.to_device(np.asfortranarray(big[::2, :F]))
    start = rng.standard_normal((M, 3 * F)).astype(np.float32)
    out = cuda.to_device(start)[:, ::3]
    cufold.reduce_by_key_into(to_device(keys), values, out)
    np.testing.assert_allclose(to_host(out), add_at_rows(start[:, ::3], keys, big[::2, 1::2]), rtol=1e-5, atol=1e-4)
    out2 = to_device(start[:, :F])
    cufold.reduce_by_key_into(to_device(keys), fortran, out2, cufold.maximum)
    np.testing.assert_array_equal(to_host(out2), add_at_rows(start[:, :F], keys, big[::2, :F], np.maximum))
    # reversed rows
    rev = cuda.to_device(big)[::-2, :F]
    out3 = to_device(start[:, :F])
    cufold.reduce_by_key_into(to_device(keys), rev, out3)
    np.testing.assert_allclose(to_host(out3), add_at_rows(start[:, :F], keys, big[::-2, :F]), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("F", [1, 3, 16, 33])
def test_into_deterministic(rng, F):
    keys = power_keys(rng, N, M, shuffled=True, dtype=np.int64)
    values = rng.standard_normal((N, F)).astype(np.float32)
    start = rng.standard_normal((M, F)).astype(np.float32)
    runs = [to_host(cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start),
                                              deterministic=True)) for _ in range(2)]
    np.testing.assert_array_equal(runs[0].view(np.int32), runs[1].view(np.int32))
    np.testing.assert_allclose(runs[0], add_at_rows(start, keys, values), rtol=1e-5, atol=1e-4)


def test_into_in_order_and_cas(rng):
    """A non-commutative operator folds in input order (grouped first); multiplies and a
    float minimum take compare-and-swap loops."""
    m, F = 6, 4
    keys = rng.integers(0, m, N).astype(np.int16)
    values = rng.integers(-1, 3, (N, F)).astype(np.int64) * rng.integers(0, 2, (N, F))
    start = np.zeros((m, F), np.int64)
    start[0, :] = 7                     # already non-zero: stays
    got = to_host(cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start), FIRST_NONZERO))
    ref = start.copy()
    for k, row in zip(keys, values):
        for f in range(F):
            if ref[k, f] == 0:
                ref[k, f] = row[f]
    np.testing.assert_array_equal(got, ref)
    small = rng.choice([0.5, 1.0, 2.0], (N, F))
    got = cufold.reduce_by_key_into(to_device(keys), to_device(small), to_device(np.ones((m, F))), cufold.multiplies)
    np.testing.assert_allclose(to_host(got), add_at_rows(np.ones((m, F)), keys, small, np.multiply))
    bigger = cufold.Op(lambda a, b: a if a > b else b, commutative=True, name="bigger")     # no identity
    x = rng.standard_normal((N, F))
    got = cufold.reduce_by_key_into(to_device(keys), to_device(x), to_device(np.full((m, F), -9.0)), bigger)
    np.testing.assert_array_equal(to_host(got), add_at_rows(np.full((m, F), -9.0), keys, x, np.maximum))
    with pytest.raises(ValueError, match="needs an operator with an identity"):
        cufold.reduce_by_key_into(to_device(keys), to_device(x), to_device(np.zeros((m, F))), bigger,
                                  deterministic=True)
    x[5, 1] = np.nan
    got = cufold.reduce_by_key_into(to_device(keys), to_device(x), to_device(np.zeros((m, F))), cufold.minimum)
    np.testing.assert_array_equal(to_host(got), add_at_rows(np.zeros((m, F)), keys, x, np.minimum))
    # 32-bit words, 8 features: a quad a lane, out's four words read at once ('cas4'; sorted
    # keys: the adaptive call takes the atomic rows)
    signs = rng.choice(np.array([-1, 1], np.int32), (N, 8))
    got = cufold.reduce_by_key_into(to_device(np.sort(keys)), to_device(signs), to_device(np.ones((m, 8), np.int32)),
                                    cufold.multiplies)
    np.testing.assert_array_equal(to_host(got), add_at_rows(np.ones((m, 8)), np.sort(keys), signs, np.multiply))
    x32 = rng.standard_normal((N, 8)).astype(np.float32)
    got = cufold.reduce_by_key_into(to_device(keys), to_device(x32), to_device(np.full((m, 8), -9, np.float32)), bigger)
    np.testing.assert_array_equal(to_host(got), add_at_rows(np.full((m, 8), -9.0), keys, x32, np.maximum))


@pytest.mark.parametrize("F", [3, 40])
def test_into_bad_keys(rng, F):
    keys = rng.integers(0, M, N).astype(np.int32)
    keys[17] = -3
    keys[40] = M
    values = rng.standard_normal((N, F))
    out = to_device(np.zeros((M, F)))
    with pytest.raises(IndexError, match="key -3 at position 17"):
        cufold.reduce_by_key_into(to_device(keys), to_device(values), out)
    out = to_device(np.zeros((M, F)))
    cufold.reduce_by_key_into(to_device(keys), to_device(values), out, check=False)
    ok = (keys >= 0) & (keys < M)
    np.testing.assert_allclose(to_host(out), add_at_rows(np.zeros((M, F)), keys[ok], values[ok]))
    with pytest.raises(IndexError, match="key %d at position 0 is out of range for out of length 0" % keys[0]):
        cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(np.zeros((0, F))))
    with pytest.raises(IndexError, match="key %d at position 40" % M):
        cufold.reduce_by_key_into(to_device(np.where(keys < 0, 0, keys)), to_device(values),
                                  to_device(np.zeros((M, F))), deterministic=True)


def test_into_adaptive_sums_in_l2(rng, monkeypatch):
    """Sums whose table fits in L2 take the adaptive path from ``CUFOLD_ROWS_ADAPTIVE_HW_F``
    features on (32 by default; 0: off), sorted and shuffled keys."""
    import importlib
    rows = importlib.import_module("cufold.device.rows")
    looks = []
    kernel = rows.unsorted_kernel
    monkeypatch.setattr(rows, "unsorted_kernel", lambda: looks.append(1) or kernel())
    n, m, F = (N, 6, 4) if SIMULATOR else (70_000, 500, 64)
    values = rng.standard_normal((n, F)).astype(np.float32)
    start = rng.standard_normal((m, F)).astype(np.float32)
    try:
        for knob, adaptive in ((0, False), (F, True)):
            monkeypatch.setattr(rows, "ADAPTIVE_HW_FEATURES", knob)
            rows._into_programs.clear()
            looks.clear()
            for shuffled in (False, True):          # (one plan: the look is planned once)
                keys = power_keys(rng, n, m, shuffled=shuffled)
                out = to_device(start)
                cufold.reduce_by_key_into(to_device(keys), to_device(values), out)
                np.testing.assert_allclose(to_host(out), add_at_rows(start, keys, values), rtol=1e-4, atol=2e-3)
            assert bool(looks) == adaptive
    finally:
        monkeypatch.undo()
        rows._into_programs.clear()


def test_into_path_hints(rng, monkeypatch):
    """An adaptive signature's later calls launch only the path the previous call's look
    chose (its hint, read without waiting): keys sorted, shuffled, shuffled, sorted, sorted
    take the gated pair of paths, then atomic (the hint of the sorted call), grouped,
    grouped (a sorted call grouped: the hint is one call late, the result still right) and
    atomic; ``CUFOLD_ROWS_PATH_HINTS=0``: the gated pair every call. A checked call's bad
    key is reported whichever path runs."""
    import importlib
    rows = importlib.import_module("cufold.device.rows")
    n, m, F = (N, 40, 8) if SIMULATOR else (70_000, 5000, 40)
    values = rng.standard_normal((n, F)).astype(np.float32)
    start = rng.standard_normal((m, F)).astype(np.float32)
    dev_values = to_device(values)
    ran = []
    run = rows._into_programs.run
    monkeypatch.setattr(rows, "_into_programs", types.SimpleNamespace(
        run=lambda key, *a: ran.append(key[-1]) or run(key, *a)))
    try:
        for hints, want_paths in ((True, [None, "atomic", "grouped", "grouped", "atomic"]), (False, [None] * 5)):
            monkeypatch.setattr(rows, "PATH_HINTS", hints)
            rows._path_hints.clear()
            ran.clear()
            for shuffled in (False, True, True, False, False):
                keys = power_keys(rng, n, m, shuffled=shuffled)
                out = to_device(start)
                cufold.reduce_by_key_into(to_device(keys), dev_values, out, cufold.maximum, check=False)
                if not SIMULATOR:
                    cuda.synchronize()      # (so that the hint has landed: the test's order)
                np.testing.assert_array_equal(to_host(out), add_at_rows(start, keys, values, np.maximum))
            assert ran == want_paths
        monkeypatch.setattr(rows, "PATH_HINTS", True)
        ran.clear()
        for shuffled, bad in ((True, False), (True, True), (False, False), (False, True)):   # checked calls
            keys = power_keys(rng, n, m, shuffled=shuffled)
            if bad:
                keys[n // 2] = m
                with pytest.raises(IndexError, match="key %d at position %d" % (m, n // 2)):
                    cufold.reduce_by_key_into(to_device(keys), dev_values, to_device(start), cufold.maximum)
            else:
                cufold.reduce_by_key_into(to_device(keys), dev_values, to_device(start), cufold.maximum)
            if not SIMULATOR:
                cuda.synchronize()
        assert ran == [None, "grouped", "grouped", "atomic"]
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("F", [8, 33])
@pytest.mark.parametrize("order", ["sorted", "shuffled", "sorted_bad", "shuffled_bad"])
def test_into_adaptive(rng, F, order):
    """The default's two paths chosen on the GPU (rows.ADAPTIVE_MIN_*: a compare-and-swap
    operator, or a table larger than L2): atomic runs where the keys are sorted, grouped
    first where not; the results, and a bad key reported once, either way."""
    # (F = 33: the sums' float32 table is larger than L2 here (16 KiB in the simulator, 50-60
    # MiB on an H100/H200), so both operators go either way; F = 8: the maxima (in the
    # simulator; on a GPU 8 features take the atomic path alone)
    n, m = (N, 160) if SIMULATOR else (70_000, 520_000)
    keys = power_keys(rng, n, m, shuffled=order.startswith("shuffled"))
    if order.endswith("bad"):
        keys[n // 2] = m + 5
    values = rng.standard_normal((n, F)).astype(np.float32)
    start = rng.standard_normal((m, F)).astype(np.float32)
    ok = keys < m
    for op, ufunc in ((cufold.plus, np.add), (cufold.maximum, np.maximum)):
        if order.endswith("bad"):
            with pytest.raises(IndexError, match="key %d at position %d" % (m + 5, n // 2)):
                cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start), op)
        out = to_device(start)
        cufold.reduce_by_key_into(to_device(keys), to_device(values), out, op, check=False)
        want = add_at_rows(start, keys[ok], values[ok], ufunc)
        if op is cufold.plus:
            np.testing.assert_allclose(to_host(out), want, rtol=1e-5, atol=1e-4)
        else:
            np.testing.assert_array_equal(to_host(out), want.astype(np.float32))


@pytest.mark.parametrize("F", [4, 12, 16, 64, 132])
@pytest.mark.parametrize("shuffled", [False, True])
def test_into_quads(rng, monkeypatch, F, shuffled):
    """Float32 sums of F = 4k features: four consecutive features a lane, one 16-byte
    reduction each (``rows.quads_for``: 'load4' where the values' quads are 16-byte aligned,
    'scalar' where not, none where out's are not), with a transform and a bad key; the
    ordered rows' quad loads (``CUFOLD_ROWS_QUADS_ORDERED``, on and off) grouped by key and
    over segments; a float maximum's compare-and-swap rows a quad a lane
    (``CUFOLD_ROWS_QUADS_CAS``, on and off), reading the four words of out at once where
    out's quads are aligned, then a compare-and-swap ('cas4') or an integer reduction
    ('red4', ``CUFOLD_ROWS_FLOAT_RED``) for each word that changes (where they are not
    aligned, a feature every P lanes)."""
    import importlib
    rows = importlib.import_module("cufold.device.rows")
    seen, flushes = [], []
    kernel = rows.rows_kernel
    monkeypatch.setattr(rows, "PATH_HINTS", False)   # (an adaptive plan's both paths, every call)
    monkeypatch.setattr(rows, "rows_kernel",
                        lambda spec: seen.append(spec.quads) or flushes.append(spec.flush4) or kernel(spec))
    rows._into_programs.clear()
    rows._segment_programs.clear()
    try:
        n, m = (N, M) if SIMULATOR else (40_000, 700)
        keys = power_keys(rng, n, m, shuffled=shuffled)
        big = rng.standard_normal((n, F + 4)).astype(np.float32)
        start = rng.standard_normal((m, F + 4)).astype(np.float32)
        dev_big = to_device(big)
        cases = ((dev_big[:, :F], big[:, :F], start[:, :F], "load4"),
                 (dev_big[:, 1:F + 1], big[:, 1:F + 1], start[:, :F], "scalar"),
                 (dev_big[:, :F], big[:, :F], start[:, 1:F + 1], None))
        for dev_values, values, start_view, quads in cases:
            out = to_device(np.ascontiguousarray(start)) if quads is None else to_device(start_view)
            if quads is None:
                out = out[:, 1:F + 1]
            seen.clear()
            cufold.reduce_by_key_into(to_device(keys), dev_values, out)
            assert quads in seen
            # (float32 sums of up to a few thousand rows a hot key, in any order)
            np.testing.assert_allclose(to_host(out), add_at_rows(start_view, keys, values), rtol=1e-4, atol=2e-3)
        out = to_device(start[:, :F])
        cufold.reduce_by_key_into(to_device(keys), dev_big[:, :F], out, transform=lambda x: x * x)
        np.testing.assert_allclose(to_host(out), add_at_rows(start[:, :F], keys, big[:, :F] ** 2), rtol=1e-4,
                                   atol=2e-3)
        bad = keys.copy()
        bad[n // 3] = -1
        with pytest.raises(IndexError, match="key -1 at position %d" % (n // 3)):
            cufold.reduce_by_key_into(to_device(bad), dev_big[:, :F], to_device(start[:, :F]))
        # ordered rows (grouped by key; over segments) load a quad at once (where on: the default)
        off = make_offsets(rng, 9, n)
        for on in (True, False):
            monkeypatch.setattr(rows, "QUADS_ORDERED", on)
            rows._into_programs.clear()          # (the plans hold the kernels chosen)
            rows._segment_programs.clear()
            seen.clear()
            out = to_device(start[:, :F])
            cufold.reduce_by_key_into(to_device(keys), dev_big[:, :F], out, deterministic=True)
            assert ("load4" if on else None) in seen and ("load4" in seen) == on
            np.testing.assert_allclose(to_host(out), add_at_rows(start[:, :F], keys, big[:, :F]), rtol=1e-4,
                                       atol=2e-3)
            seen.clear()
            got = cufold.segmented_reduce(dev_big[:, :F], to_device(off), cufold.maximum)
            assert ("load4" in seen) == on
            np.testing.assert_array_equal(to_host(got), reduceat_rows(big[:, :F], off, np.maximum, -np.inf))
        # a compare-and-swap operator's atomic rows a quad a lane (where on: the default),
        # values aligned or not, out's words read four at once where out's quads are aligned
        dev_start = to_device(start)
        for on, red, dev_values, values, quads, out, flush4 in (
                (True, True, dev_big[:, :F], big[:, :F], "load4", dev_start[:, :F], "red4"),
                (True, True, dev_big[:, 1:F + 1], big[:, 1:F + 1], "scalar", dev_start[:, :F], "red4"),
                (True, False, dev_big[:, :F], big[:, :F], "load4", dev_start[:, :F], "cas4"),
                (True, True, dev_big[:, :F], big[:, :F], None, dev_start[:, 1:F + 1], None),
                (False, True, dev_big[:, :F], big[:, :F], None, dev_start[:, :F], None)):
            monkeypatch.setattr(rows, "QUADS_CAS", on)
            monkeypatch.setattr(rows, "FLOAT_RED", red)
            rows._into_programs.clear()          # (the plans hold the kernels chosen)
            rows._segment_programs.clear()
            seen.clear()
            flushes.clear()
            start_view = to_host(out)
            cufold.reduce_by_key_into(to_device(keys), dev_values, out, cufold.maximum)
            assert quads in seen and flush4 in flushes
            np.testing.assert_array_equal(to_host(out), add_at_rows(start_view, keys, values, np.maximum))
    finally:
        monkeypatch.undo()
        rows._into_programs.clear()
        rows._segment_programs.clear()


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_into_float_extremes_nan(rng, name):
    """A float32 maximum or minimum of 8 features ('red4': integer reductions of the
    floats' bits): NaN values of either sign propagate, a NaN already in out stays, signed
    zeros and infinities compare as floats, keys sorted and shuffled."""
    ufunc = getattr(np, name)
    m = 40
    keys = power_keys(rng, N, m, shuffled=False)
    values = rng.standard_normal((N, 8)).astype(np.float32)
    values[rng.random((N, 8)) < 0.2] = 0.0
    values[rng.random((N, 8)) < 0.2] *= -0.0
    values[rng.random((N, 8)) < 0.05] = np.inf
    values[rng.random((N, 8)) < 0.05] = -np.inf
    values[3, 2] = np.nan
    values[N // 2, 5] = np.float32(-np.nan)                 # a NaN with its sign bit set
    values[N // 3, 5] = np.array([0xFFC00001], np.uint32).view(np.float32)[0]
    start = rng.standard_normal((m, 8)).astype(np.float32)
    start[1, 1] = np.nan
    start[2, 3] = np.float32(-np.nan)
    start[4, :] = -0.0
    for order in (keys, rng.permutation(keys)):
        got = to_host(cufold.reduce_by_key_into(to_device(order), to_device(values), to_device(start),
                                                getattr(cufold, name)))
        np.testing.assert_array_equal(got, add_at_rows(start, order, values, ufunc))


def test_bad_shapes():
    k, v2, o2 = to_device(np.zeros(4, np.int32)), to_device(np.zeros((4, 3))), to_device(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="cufold: values have 3 features per row .* but out has 2"):
        cufold.reduce_by_key_into(k, v2, to_device(np.zeros((2, 2))))
    with pytest.raises(ValueError, match=r"cufold: reduce_by_key_into takes .* values has shape \(4, 3, 1\)"):
        cufold.reduce_by_key_into(k, to_device(np.zeros((4, 3, 1))), o2)
    with pytest.raises(ValueError, match=r"cufold: .* out has shape \(2,\)"):
        cufold.reduce_by_key_into(k, v2, to_device(np.zeros(2)))
    with pytest.raises(ValueError, match="cufold: reduce_by_key_into takes 1-D keys"):
        cufold.reduce_by_key_into(to_device(np.zeros((4, 1), np.int32)), v2, o2)
    with pytest.raises(ValueError, match="cufold: keys and values must be equally long"):
        cufold.reduce_by_key_into(to_device(np.zeros(5, np.int32)), v2, o2)
    with pytest.raises(ValueError, match="cufold: segmented reductions take values of shape"):
        cufold.segmented_reduce(to_device(np.zeros((4, 3, 2))), to_device(np.array([0, 4])))
    with pytest.raises(ValueError, match="cufold: segmented reductions take values of shape"):
        cufold.reduce_by_key(k, to_device(np.zeros((4, 3, 2))))
    with pytest.raises(ValueError, match="cufold: keys and values must be equally long"):
        cufold.reduce_by_key(k, to_device(np.zeros((5, 3))))
    if "deterministic" in inspect.signature(cufold.segmented_reduce).parameters:
        with pytest.raises(ValueError, match="cufold: deterministic='gpu_to_gpu' takes 1-D values"):
            cufold.segmented_reduce(v2, to_device(np.array([0, 4])), deterministic="gpu_to_gpu")


# --- spans of sub-warp groups (rows of fewer than 32 features) ----------------------------------

SMALL_F = (3, 16, 31)
#: 14 spans of 8 rows (simulator): the last warp of 16-lane or narrower groups holds groups
#: past the last span, which must write nothing
ODD_N = 107


@pytest.mark.parametrize("F", SMALL_F)
def test_into_long_sorted_runs(rng, F):
    """Sorted keys whose runs cross steps, spans, groups and warps (each span's part of a
    run is one update a feature): every operator kind of the atomic rows, the ordered rows
    of deterministic=True and the CSR rows over the same runs, against NumPy in float64."""
    m = 11
    keys = np.sort(rng.choice([1, 4, 5, 9], size=ODD_N, p=[0.5, 0.1, 0.3, 0.1])).astype(np.int64)
    values = rng.standard_normal((ODD_N, F)).astype(np.float32)
    start = rng.standard_normal((m, F)).astype(np.float32)
    for op, ufunc in ((cufold.plus, np.add), (cufold.maximum, np.maximum), (cufold.minimum, np.minimum)):
        got = to_host(cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start), op))
        ref = add_at_rows(start, keys, values, ufunc)
        if op is cufold.plus:
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
        else:
            np.testing.assert_array_equal(got, ref.astype(np.float32))
    ints = rng.integers(-1000, 1000, (ODD_N, F)).astype(np.int32)
    got = cufold.reduce_by_key_into(to_device(keys), to_device(ints), to_device(np.zeros((m, F), np.int64)))
    np.testing.assert_array_equal(to_host(got), add_at_rows(np.zeros((m, F)), keys, ints).astype(np.int64))
    halves = rng.choice([0.5, 2.0], (ODD_N, F))
    got = cufold.reduce_by_key_into(to_device(keys), to_device(halves), to_device(np.ones((m, F))), cufold.multiplies)
    np.testing.assert_array_equal(to_host(got), add_at_rows(np.ones((m, F)), keys, halves, np.multiply))
    runs = [to_host(cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start),
                                              deterministic=True)) for _ in range(2)]
    np.testing.assert_array_equal(runs[0].view(np.int32), runs[1].view(np.int32))
    np.testing.assert_allclose(runs[0], add_at_rows(start, keys, values), rtol=1e-5, atol=1e-4)
    off = np.searchsorted(keys, np.arange(m + 1)).astype(np.int64)
    got = cufold.segmented_reduce(to_device(values), to_device(off))
    np.testing.assert_allclose(to_host(got), reduceat_rows(values, off, np.add, 0.0), rtol=1e-5, atol=1e-4)
    got = cufold.segmented_reduce(to_device(values), to_device(off), cufold.maximum)
    np.testing.assert_array_equal(to_host(got), reduceat_rows(values, off, np.maximum, -np.inf))


@pytest.mark.parametrize("F", [3, 16])
def test_into_hot_keys_shuffled(rng, F):
    """A few hot keys in random order (most of a window's rows: merged across the warp's
    groups before one update), next to rare ones; operators with an identity, one without
    (the groups' folds combine by who holds rows), integers, and a checked call."""
    m = 40
    hot = rng.choice(4, size=ODD_N, p=[0.55, 0.25, 0.1, 0.1])
    keys = np.where(rng.random(ODD_N) < 0.8, hot, rng.integers(4, m, ODD_N)).astype(np.int32)
    values = rng.standard_normal((ODD_N, F))
    start = rng.standard_normal((m, F))
    got = cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start))
    np.testing.assert_allclose(to_host(got), add_at_rows(start, keys, values), rtol=1e-12, atol=1e-12)
    got = cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start), cufold.maximum,
                                    check=False)
    np.testing.assert_array_equal(to_host(got), add_at_rows(start, keys, values, np.maximum))
    bigger = cufold.Op(lambda a, b: a if a > b else b, commutative=True, name="bigger")     # no identity
    got = cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(start), bigger)
    np.testing.assert_array_equal(to_host(got), add_at_rows(start, keys, values, np.maximum))
    ints = rng.integers(-50, 50, (ODD_N, F)).astype(np.int64)
    got = cufold.reduce_by_key_into(to_device(keys), to_device(ints), to_device(np.zeros((m, F), np.int64)))
    np.testing.assert_array_equal(to_host(got), add_at_rows(np.zeros((m, F)), keys, ints).astype(np.int64))
    bad = keys.copy()
    bad[50] = m + 3
    with pytest.raises(IndexError, match="key %d at position 50" % (m + 3)):
        cufold.reduce_by_key_into(to_device(bad), to_device(values), to_device(start))


@pytest.mark.parametrize("F", [3, 16])
def test_segmented_many_segments(rng, F):
    """More segments than rows, many empty, so that each group's search for its span's
    first segment takes several rounds; an init in front of every segment."""
    off = np.sort(rng.integers(0, ODD_N + 1, 150)).astype(np.int64)
    off[0], off[-1] = 0, ODD_N
    values = rng.standard_normal((ODD_N, F)).astype(np.float32)
    got = cufold.segmented_reduce(to_device(values), to_device(off), init=1.5)
    np.testing.assert_allclose(to_host(got), reduceat_rows(values, off, np.add, 0.0) + 1.5, rtol=1e-5, atol=1e-4)
    got = cufold.segmented_reduce(to_device(values), to_device(off), cufold.minimum)
    np.testing.assert_array_equal(to_host(got), reduceat_rows(values, off, np.minimum, np.inf))


# --- segmented_reduce and reduce_by_key ------------------------------------------------------------

def reduceat_rows(values, off, ufunc, empty):
    """``ufunc.reduceat`` over rows in float64, with ``empty`` where a segment is empty
    (NumPy would give the next row there) and for a trailing segment NumPy cannot express."""
    x = values.astype(np.float64)
    out = np.empty((len(off) - 1, x.shape[1]))
    for i, (a, b) in enumerate(itertools.pairwise(off)):
        out[i] = ufunc.reduce(x[a:b], axis=0) if b > a else empty
    inner = np.flatnonzero((off[1:] > off[:-1]) & (off[:-1] < len(x)))
    if len(inner):                 # NumPy's own reduceat agrees on non-empty segments
        red = ufunc.reduceat(x, off[:-1][inner], axis=0)
        last = off[1:][inner]
        keep = [j for j, i in enumerate(inner) if j + 1 < len(inner) and off[inner[j + 1]] == last[j]]
        np.testing.assert_allclose(out[inner[keep]], red[keep], rtol=1e-10, atol=1e-12)
    return out


def make_offsets(rng, count, n, start=0):
    """``count`` segments over rows ``[start, n)``: empty ones at the start, middle and end,
    short and long ones."""
    cuts = np.sort(rng.integers(start, n + 1, count - 3))
    return np.concatenate([[start, start], cuts, [n, n]]).astype(np.int64)


@pytest.mark.parametrize("F", FEATURES + (130,))
def test_segmented_sum(rng, F):
    values = rng.standard_normal((N, F)).astype(np.float32)
    off = make_offsets(rng, 14, N)
    got = cufold.segmented_reduce(to_device(values), to_device(off))
    assert got.shape == (len(off) - 1, F)
    np.testing.assert_allclose(to_host(got), reduceat_rows(values, off, np.add, 0.0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("off_dt", [np.int32, np.uint16, np.int64])
def test_segmented_max_init_and_offsets(rng, off_dt):
    """Offsets of other widths, not starting at 0 (rows outside the segments are ignored),
    an init folded in front of every segment, integer rows."""
    values = rng.integers(-100, 100, (N, 3)).astype(np.int32)
    off = make_offsets(rng, 9, N - 7, start=5).astype(off_dt)
    got = cufold.segmented_reduce(to_device(values), to_device(off), cufold.maximum, init=-50)
    ref = reduceat_rows(values, off.astype(np.int64), np.maximum, -50)
    np.testing.assert_array_equal(to_host(got), np.maximum(ref, -50))
    assert to_host(got).dtype == np.int32


def test_segmented_long_segment_and_empty_values(rng):
    """One segment over every row (the piece levels fold it); no rows at all."""
    values = rng.standard_normal((3 * N, 33))
    off = np.array([0, 1, 3 * N])
    got = cufold.segmented_reduce(to_device(values), to_device(off))
    np.testing.assert_allclose(to_host(got), reduceat_rows(values, off, np.add, 0.0), rtol=1e-12, atol=1e-13)
    got = cufold.segmented_reduce(to_device(np.zeros((0, 4), np.float32)), to_device(np.zeros(6, np.int64)),
                                  cufold.minimum)
    np.testing.assert_array_equal(to_host(got), np.full((5, 4), np.inf, np.float32))


def test_segmented_strided_and_dtype(rng):
    big = rng.integers(0, 100, (2 * N, 6)).astype(np.int16)
    values = cuda.to_device(big)[::2, ::2]
    off = make_offsets(rng, 12, N)
    got = cufold.segmented_reduce(values, to_device(off))
    assert to_host(got).dtype == np.int64       # sums of small integers widen as cufold.sum
    np.testing.assert_array_equal(to_host(got), reduceat_rows(big[::2, ::2], off, np.add, 0))
    column = cuda.to_device(big)[::2, 3:4]       # one feature, strided: the 1-D kernels
    got = cufold.segmented_reduce(column, to_device(off), cufold.maximum, init=7)
    assert got.shape == (len(off) - 1, 1)
    np.testing.assert_array_equal(to_host(got), np.maximum(reduceat_rows(big[::2, 3:4], off, np.maximum, 7), 7))


@pytest.mark.parametrize("F", [1, 3, 33])
def test_reduce_by_key_rows(rng, F):
    keys = power_keys(rng, N, 6)
    keys[::7] = 2                      # runs that come back
    values = rng.standard_normal((N, F))
    uk, totals = cufold.reduce_by_key(to_device(keys), to_device(values))
    heads = np.concatenate([[True], keys[1:] != keys[:-1]])
    starts = np.flatnonzero(heads)
    np.testing.assert_array_equal(to_host(uk), keys[starts])
    assert totals.shape == (len(starts), F)
    np.testing.assert_allclose(to_host(totals), np.add.reduceat(values, starts, axis=0), rtol=1e-12,
                               atol=1e-13)   # (sums that cancel to ~1e-5: another order's last bits)
    uk, mx = cufold.reduce_by_key(to_device(keys), to_device(values), cufold.maximum)
    np.testing.assert_array_equal(to_host(mx), np.maximum.reduceat(values, starts, axis=0))


def test_host_waits(rng, host_waits):
    """Feature rows wait for the device as the 1-D functions do: only a checked
    reduce_by_key_into (one synchronisation) and reduce_by_key (the number of runs)."""
    keys = to_device(power_keys(rng, N, M))
    values = to_device(rng.standard_normal((N, 5)).astype(np.float32))
    out = to_device(np.zeros((M, 5), np.float32))
    off = to_device(make_offsets(rng, 10, N))
    calls = [(0, lambda: cufold.reduce_by_key_into(keys, values, out, check=False)),
             (0, lambda: cufold.reduce_by_key_into(keys, values, out, check=False, deterministic=True)),
             (1, lambda: cufold.reduce_by_key_into(keys, values, out)),
             (0, lambda: cufold.segmented_reduce(values, off)),
             (1, lambda: cufold.reduce_by_key(keys, values))]
    for expected, call in calls:
        call()                  # plans
        host_waits[0] = 0
        call()
        assert host_waits[0] == expected


@pytest.mark.parametrize("knob, value, F", [("PEERS", False, 40), ("LANES_MIN", 32, 3)])
def test_into_tuning_knobs(rng, monkeypatch, knob, value, F):
    """CUFOLD_ROWS_PEERS=0: the atomic rows without the window's peer merging;
    CUFOLD_ROWS_LANES=32: three features a row on a warp (idle lanes, one row a step)."""
    import importlib
    rows = importlib.import_module("cufold.device.rows")

    def forget():
        rows.rows_kernel.cache_clear()
        rows._into_programs.clear()
        rows._segment_programs.clear()
    monkeypatch.setattr(rows, knob, value)
    forget()
    try:
        keys = power_keys(rng, N, M, shuffled=True)
        values = rng.standard_normal((N, F))
        got = cufold.reduce_by_key_into(to_device(keys), to_device(values), to_device(np.zeros((M, F))))
        np.testing.assert_allclose(to_host(got), add_at_rows(np.zeros((M, F)), keys, values), rtol=1e-12,
                                   atol=1e-12)
        off = make_offsets(rng, 9, N)
        got = cufold.segmented_reduce(to_device(values), to_device(off), cufold.maximum)
        np.testing.assert_array_equal(to_host(got), reduceat_rows(values, off, np.maximum, -np.inf))
    finally:
        monkeypatch.undo()
        forget()
