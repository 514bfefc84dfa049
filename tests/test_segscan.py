"""segmented_scan (CSR offsets, merge-path tiles) and inclusive/exclusive_scan_by_key
(runs of equal adjacent keys), against NumPy (per-segment ``np.cumsum``,
``np.maximum.accumulate``) or a sequential loop (non-commutative operators).

In the simulator the tiles are tiny (32 threads x 4 items for most tests, 32 x 1
for the huge segment, the library's 64 x 2 for one), so a few hundred values cross
many tiles and segments span several; on a GPU the same tests use the library's
tiles and larger inputs. Outputs are poisoned when allocated, so an element left
unwritten fails the comparison.
"""

import importlib

import numpy as np
import pytest
from conftest import AFFINE, AFFINE_NO_IDENTITY, SIMULATOR, gpu_only, poison_allocations
from conftest import affine as _affine
from conftest import to_device as dev
from conftest import to_host as host
from numba import cuda

import cufold
from cufold.values import ValueType

S = importlib.import_module("cufold.device.segscan")

INT_DTYPES = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)
LENGTHS = (0, 1, 31, 33, 1025)
#: Random segments per test: a few in the simulator (tiny tiles), thousands on a GPU
#: (tiles of 2048 path items), so that both cross many tiles.
MANY = 1 if SIMULATOR else 300


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every array the library allocates starts full of a value no result holds."""
    poison_allocations(monkeypatch)


# --- references ---------------------------------------------------------------------------------

def offsets_of(lengths, start=0, dtype=np.int64):
    return (start + np.concatenate([[0], np.cumsum(lengths)])).astype(dtype)


def heads_from_offsets(off, n):
    """The scan restarts at every offset (and at 0)."""
    heads = np.zeros(n, bool)
    if n:
        heads[0] = True
    o = np.clip(np.asarray(off).astype(np.int64), 0, n)
    heads[o[o < n]] = True
    return heads


def heads_from_keys(keys):
    fields = keys if isinstance(keys, tuple) else (keys,)
    n = len(fields[0])
    heads = np.zeros(n, bool)
    if n:
        heads[0] = True
        for f in fields:
            heads[1:] |= f[1:] != f[:-1]               # NaN != NaN: a run of its own
    return heads


def pieces(heads):
    """[(lo, hi)] of the segments a head-flag array cuts."""
    starts = np.nonzero(heads)[0]
    ends = np.append(starts[1:], len(heads))
    return list(zip(starts, ends))


def ref_ufunc(ufunc, v, heads, exclusive=False, init=None, dtype=None):
    """Per segment ``ufunc.accumulate`` (``np.cumsum`` for add) in ``dtype``; exclusive:
    shifted by one, ``init`` first; ``init`` folded in front where given."""
    dtype = np.dtype(dtype or v.dtype)
    out = np.empty(len(v), dtype)
    for lo, hi in pieces(heads):
        seg = v[lo:hi].astype(dtype)
        if init is not None:
            seg = np.concatenate([[dtype.type(init)], seg])
        acc = ufunc.accumulate(seg)
        if init is not None:
            acc = acc[1:]
        if exclusive:
            first = dtype.type(init) if init is not None else ufunc.identity
            acc = np.concatenate([[first], acc[:-1]])
        out[lo:hi] = acc
    return out


def ref_fold(fold, values, heads, exclusive, init):
    """A sequential loop: ``fold(acc, item)`` from ``init`` (or the first item)."""
    out = []
    acc = None
    for i in range(len(heads)):
        item = tuple(int(f[i]) for f in values)
        if heads[i]:
            acc = init
        if exclusive:
            out.append(acc)
            acc = fold(acc, item)
        else:
            acc = item if acc is None else fold(acc, item)
            out.append(acc)
    return out


def mixed_lengths(rng, count):
    return rng.choice(np.array(LENGTHS), size=count, p=[0.3, 0.25, 0.2, 0.2, 0.05])


# --- segmented_scan: sums, maxima, lengths ---------------------------------------------------------

@pytest.mark.parametrize("exclusive", (False, True))
def test_sum_lengths(exclusive, rng, seg_small_tiles):
    """Segments of 0, 1, 31, 33 and 1025 values, with and without init."""
    lens = np.concatenate([np.array(LENGTHS), mixed_lengths(rng, 10 * MANY)])
    rng.shuffle(lens)
    off = offsets_of(lens)
    n = int(off[-1])
    v = rng.integers(-50, 50, n).astype(np.int32)
    heads = heads_from_offsets(off, n)
    r = host(cufold.segmented_scan(dev(v), dev(off), exclusive=exclusive))
    assert r.dtype == np.int32 and r.shape == (n,)
    assert np.array_equal(r, ref_ufunc(np.add, v, heads, exclusive))
    r = host(cufold.segmented_scan(dev(v), dev(off), exclusive=exclusive, init=7))
    assert np.array_equal(r, ref_ufunc(np.add, v, heads, exclusive, init=7))


def test_float_sums_and_maxima(rng, seg_small_tiles):
    lens = mixed_lengths(rng, 14 * MANY)
    off = offsets_of(lens)
    n = int(off[-1])
    v = rng.standard_normal(n).astype(np.float32)
    heads = heads_from_offsets(off, n)
    r = host(cufold.segmented_scan(dev(v), dev(off)))
    ref = ref_ufunc(np.add, v, heads, dtype=np.float64)
    scale = ref_ufunc(np.add, np.abs(v), heads, dtype=np.float64) + 1
    assert r.dtype == np.float32 and np.all(np.abs(r - ref) <= 1e-5 * scale)
    v[rng.random(n) < 0.01] = np.nan
    for op, uf in ((cufold.maximum, np.maximum), (cufold.minimum, np.minimum)):
        r = host(cufold.segmented_scan(dev(v), dev(off), op))
        assert np.array_equal(r, ref_ufunc(uf, v, heads), equal_nan=True), op.name
    r = host(cufold.segmented_scan(dev(v), dev(off), cufold.maximum, exclusive=True, init=-1.5))
    assert np.array_equal(r, ref_ufunc(np.maximum, v, heads, True, init=-1.5), equal_nan=True)


def test_default_tiles_multiwarp(rng):
    """The simulator's default tiles (64 threads: two warps in the block scan)."""
    off = offsets_of(rng.choice(np.array([0, 1, 31, 33, 90]), size=9))
    n = int(off[-1])
    v = rng.integers(-9, 10, n).astype(np.int64)
    heads = heads_from_offsets(off, n)
    assert np.array_equal(host(cufold.segmented_scan(dev(v), dev(off))), ref_ufunc(np.add, v, heads))
    assert np.array_equal(host(cufold.segmented_scan(dev(v), dev(off), exclusive=True)),
                          ref_ufunc(np.add, v, heads, True))


def test_one_huge_segment(rng, monkeypatch):
    """A segment spanning many tiles (about 40 one-warp tiles of 32 in the simulator)
    between small and empty ones: the look-back folds the tiles inside it."""
    if SIMULATOR:
        monkeypatch.setenv("CUFOLD_SEG_TILE", "32x1")
    big = 1200 if SIMULATOR else 10_000_000
    off = offsets_of([3, 0, 1, big, 0, 2, 5])
    n = int(off[-1])
    v = rng.integers(-1000, 1000, n).astype(np.int64)
    heads = heads_from_offsets(off, n)
    assert np.array_equal(host(cufold.segmented_scan(dev(v), dev(off))), ref_ufunc(np.add, v, heads))
    f = v.astype(np.float32)
    r = host(cufold.segmented_scan(dev(f), dev(off), cufold.maximum, exclusive=True))
    assert np.array_equal(r, ref_ufunc(np.maximum, f, heads, True, init=-np.inf))


def test_empty_segments_everywhere(rng, seg_small_tiles):
    """Many empty segments at one position (whole tiles of segment starts only), at
    the start, the end and between values; offsets of one entry; no values."""
    v = rng.integers(-9, 10, 70).astype(np.int64)
    for off in (np.array([0] * 300 + [30] * 200 + [70] * 150), np.array([0, 70]), np.array([0]),
                np.array([70]), np.array([0] + [40] * 400 + [70])):
        heads = heads_from_offsets(off, 70)
        r = host(cufold.segmented_scan(dev(v), dev(off.astype(np.int64))))
        assert np.array_equal(r, ref_ufunc(np.add, v, heads)), off[:3]
        r = host(cufold.segmented_scan(dev(v), dev(off.astype(np.int32)), exclusive=True, init=3))
        assert np.array_equal(r, ref_ufunc(np.add, v, heads, True, init=3)), off[:3]
    empty = cufold.segmented_scan(dev(np.zeros(0, np.float32)), dev(np.zeros(5, np.int64)))
    assert host(empty).shape == (0,) and host(empty).dtype == np.float32


@pytest.mark.parametrize("before", (3, 2, 1))
def test_start_at_a_tile_edge(before, rng, seg_small_tiles):
    """A segment start that ends a tile's path (``before == 2``: start 0, then
    ``NV - 2`` values, then the start at ``NV - 2`` as the tile's last path item)
    while its value opens the next tile; and its neighbours."""
    nt, vt = S.tile_for(ValueType.of(np.int64), 3000)
    cut = nt * vt - before
    n = 2 * nt * vt + 100
    off = np.array([0, cut, cut + 40, n], np.int64)
    v = rng.integers(-9, 10, n).astype(np.int64)
    heads = heads_from_offsets(off, n)
    assert np.array_equal(host(cufold.segmented_scan(dev(v), dev(off))), ref_ufunc(np.add, v, heads))


def test_offsets_subrange(rng, seg_small_tiles):
    """offsets[0] > 0 and offsets[-1] < len(values): the values before and after form
    two more segments (the scan restarts at every offset)."""
    off = offsets_of(mixed_lengths(rng, 6 * MANY), start=17)
    n = int(off[-1]) + 23
    v = rng.integers(-5, 5, n).astype(np.int64)
    heads = heads_from_offsets(off, n)
    r = host(cufold.segmented_scan(dev(v), dev(off), exclusive=True))
    assert np.array_equal(r, ref_ufunc(np.add, v, heads, True))


@pytest.mark.parametrize("odt", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_offsets_every_integer_width(odt, rng, seg_small_tiles):
    top = 120 if np.dtype(odt).itemsize == 1 else 300
    off = offsets_of(rng.choice(np.array([0, 1, 2, 7, 33]), size=60))
    off = off[off <= top].astype(odt)
    n = int(off[-1])
    v = rng.integers(-50, 50, n).astype(np.int16)
    r = host(cufold.segmented_scan(dev(v), dev(off), cufold.maximum))
    assert np.array_equal(r, ref_ufunc(np.maximum, v, heads_from_offsets(off, n)))


# --- scans by key ------------------------------------------------------------------------------------

def run_keys(rng, kdt, n, mean_run=6):
    """Keys of ``kdt`` in runs (a key may come back later: a new run)."""
    lens = rng.integers(1, 2 * mean_run, n)
    ids = np.repeat(rng.integers(0, 5, lens.size), lens)[:n]
    lo = 0 if np.dtype(kdt).kind == "u" else -2
    return (ids + lo).astype(kdt)


@pytest.mark.parametrize("kdt", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_by_key_every_integer_width(kdt, rng, seg_small_tiles):
    n = 300
    k = run_keys(rng, kdt, n)
    v = rng.integers(-20, 20, n).astype(np.int32)
    heads = heads_from_keys(k)
    r = host(cufold.inclusive_scan_by_key(dev(k), dev(v)))
    assert np.array_equal(r, ref_ufunc(np.add, v, heads))
    r = host(cufold.exclusive_scan_by_key(dev(k), dev(v), init=-4))
    assert np.array_equal(r, ref_ufunc(np.add, v, heads, True, init=-4))


def test_by_key_long_runs_and_float_keys(rng, seg_small_tiles):
    """Runs of 1, 31, 33 and 1025 keys; float keys with NaN (each NaN its own run)."""
    lens = np.array([1, 31, 33, 1025, 1, 1, 33])
    k = np.repeat(np.arange(lens.size) % 3, lens).astype(np.float32)
    k[rng.random(k.size) < 0.01] = np.nan
    v = rng.integers(-9, 10, k.size).astype(np.float64)
    heads = heads_from_keys(k)
    r = host(cufold.inclusive_scan_by_key(dev(k), dev(v), cufold.maximum))
    assert np.array_equal(r, ref_ufunc(np.maximum, v, heads))
    r = host(cufold.exclusive_scan_by_key(dev(k), dev(v)))
    assert np.array_equal(r, ref_ufunc(np.add, v, heads, True))


def test_by_key_tuple_keys(rng, seg_small_tiles):
    """Tuple keys: one key where every field is equal."""
    n = 200
    a = run_keys(rng, np.int32, n, 8)
    b = run_keys(rng, np.int8, n, 5)
    v = rng.integers(0, 9, n).astype(np.int64)
    heads = heads_from_keys((a, b))
    r = host(cufold.inclusive_scan_by_key(dev((a, b)), dev(v)))
    assert np.array_equal(r, ref_ufunc(np.add, v, heads))


# --- operators: order, tuples, identities, dtypes ---------------------------------------------------

@pytest.mark.parametrize("exclusive", (False, True))
def test_noncommutative_tuple_values(exclusive, rng, seg_small_tiles):
    """The affine maps (a, b), combined in sequence order, over offsets and by key."""
    lens = np.concatenate([[33, 0, 1, 31], mixed_lengths(rng, 3 if SIMULATOR else 60)])
    off = offsets_of(lens)
    n = int(off[-1])
    a = rng.choice(np.array([-1, 1], np.int64), n)
    b = rng.integers(-3, 4, n).astype(np.int64)
    heads = heads_from_offsets(off, n)
    init = (1, 0) if exclusive else None
    ra, rb = host(cufold.segmented_scan(dev((a, b)), dev(off), AFFINE, exclusive=exclusive))
    assert ra.dtype == np.int64 and rb.dtype == np.int64
    assert list(zip(ra.tolist(), rb.tolist())) == ref_fold(_affine, (a, b), heads, exclusive, init)
    keys = np.cumsum(heads).astype(np.int16)
    fn = cufold.exclusive_scan_by_key if exclusive else cufold.inclusive_scan_by_key
    ra, rb = host(fn(dev(keys), dev((a, b)), AFFINE))
    assert list(zip(ra.tolist(), rb.tolist())) == ref_fold(_affine, (a, b), heads, exclusive, init)


def test_builtin_operators_on_tuples_and_bools(rng, seg_small_tiles):
    """cufold.argmin over (value, index) pairs (a running argmin, ties to the first) and
    cufold.logical_or over bools (a running "any"), per segment."""
    off = offsets_of(np.concatenate([[0, 33, 1], mixed_lengths(rng, 5 * MANY)]))
    n = int(off[-1])
    heads = heads_from_offsets(off, n)
    v = rng.integers(0, 6, n).astype(np.float32)              # many ties
    idx = np.arange(n, dtype=np.int64)
    rv, ri = host(cufold.segmented_scan(dev((v, idx)), dev(off), cufold.argmin))
    for lo, hi in pieces(heads):
        run = np.minimum.accumulate(v[lo:hi])
        first = np.array([lo + int(np.argmin(v[lo:k + 1])) for k in range(lo, hi)])
        assert np.array_equal(rv[lo:hi], run) and np.array_equal(ri[lo:hi], first)
    b = rng.random(n) < 0.1
    r = host(cufold.inclusive_scan_by_key(dev(np.cumsum(heads)), dev(b), cufold.logical_or))
    assert r.dtype == np.bool_ and np.array_equal(r, ref_ufunc(np.logical_or, b, heads))


def test_operator_without_identity(rng, seg_small_tiles):
    """Inclusive scans need no identity; exclusive ones then need init."""
    off = offsets_of([5, 0, 40, 2])
    n = int(off[-1])
    a = rng.choice(np.array([-1, 1], np.int64), n)
    b = rng.integers(-3, 4, n).astype(np.int64)
    heads = heads_from_offsets(off, n)
    ra, rb = host(cufold.segmented_scan(dev((a, b)), dev(off), AFFINE_NO_IDENTITY))
    assert list(zip(ra.tolist(), rb.tolist())) == ref_fold(_affine, (a, b), heads, False, None)
    with pytest.raises(ValueError, match="init="):
        cufold.segmented_scan(dev((a, b)), dev(off), AFFINE_NO_IDENTITY, exclusive=True)
    with pytest.raises(ValueError, match="init="):
        cufold.exclusive_scan_by_key(dev(np.cumsum(heads)), dev((a, b)), AFFINE_NO_IDENTITY)
    init = (-1, 5)
    ra, rb = host(cufold.segmented_scan(dev((a, b)), dev(off), AFFINE_NO_IDENTITY, exclusive=True, init=init))
    assert list(zip(ra.tolist(), rb.tolist())) == ref_fold(_affine, (a, b), heads, True, init)
    # Inclusive with init: folded in front of every segment.
    ra, rb = host(cufold.segmented_scan(dev((a, b)), dev(off), AFFINE_NO_IDENTITY, init=init))
    want = [_affine(init, p) for p in ref_fold(_affine, (a, b), heads, False, None)]
    assert list(zip(ra.tolist(), rb.tolist())) == want


def test_dtypes_strides_and_plain_functions(rng, seg_small_tiles):
    off = offsets_of(mixed_lengths(rng, 6 * MANY))
    n = int(off[-1])
    heads = heads_from_offsets(off, n)
    h = rng.integers(-8, 8, n).astype(np.float16)
    r = host(cufold.segmented_scan(dev(h), dev(off)))
    assert r.dtype == np.float16          # accumulated in float32 (exact here), rounded once
    assert np.array_equal(r, ref_ufunc(np.add, h, heads, dtype=np.float64).astype(np.float16))
    v = rng.integers(-100, 100, n).astype(np.int8)
    r = host(cufold.segmented_scan(dev(v), dev(off), dtype=np.int64))
    assert r.dtype == np.int64 and np.array_equal(r, ref_ufunc(np.add, v, heads, dtype=np.int64))
    r = host(cufold.segmented_scan(dev(v), dev(off), lambda x, y: x + y, dtype=np.int32))
    assert np.array_equal(r, ref_ufunc(np.add, v, heads, dtype=np.int32))
    # Strided values, offsets and keys (every other element).
    w = rng.integers(-9, 10, 2 * n).astype(np.int64)
    r = host(cufold.segmented_scan(dev(w)[::2], dev(np.repeat(off, 2))[::2]))
    assert np.array_equal(r, ref_ufunc(np.add, w[::2], heads))
    keys = np.repeat(np.cumsum(heads), 2).astype(np.int32)
    r = host(cufold.inclusive_scan_by_key(dev(keys)[::2], dev(w)[::2]))
    assert np.array_equal(r, ref_ufunc(np.add, w[::2], heads))


def test_repeated_calls_reuse_state(rng, seg_small_tiles):
    """The look-back flags are reused launch after launch (a new epoch each)."""
    for count in (3, 9, 5):
        off = offsets_of(rng.choice(np.array([0, 1, 31, 33]), size=count))
        n = int(off[-1])
        v = rng.integers(-5, 5, n).astype(np.int64)
        heads = heads_from_offsets(off, n)
        assert np.array_equal(host(cufold.segmented_scan(dev(v), dev(off))), ref_ufunc(np.add, v, heads))
        assert np.array_equal(host(cufold.inclusive_scan_by_key(dev(np.cumsum(heads)), dev(v))),
                              ref_ufunc(np.add, v, heads))


@gpu_only
def test_large_inputs_repeated(rng):
    """Millions of values in short and long segments, scanned again and again: the
    look-back's races would show as a wrong integer now and then."""
    for lengths in ((0, 1, 2, 5, 31, 33), (1000, 100_000, 1_000_000)):
        off = offsets_of(rng.choice(np.array(lengths), size=max(16, (1 << 22) // int(np.mean(lengths)))))
        n = int(off[-1])
        v = rng.integers(-1000, 1000, n).astype(np.int32)
        heads = heads_from_offsets(off, n)
        c = np.cumsum(v, dtype=np.int64)
        starts = np.maximum.accumulate(np.where(heads, np.arange(n), 0))
        ref = (c - np.concatenate([[0], c])[starts]).astype(np.int32)       # per-segment cumsum
        keys = np.cumsum(heads).astype(np.int64)
        dv, doff, dk = dev(v), dev(off), dev(keys)
        for _ in range(20):
            assert np.array_equal(host(cufold.segmented_scan(dv, doff)), ref)
            assert np.array_equal(host(cufold.inclusive_scan_by_key(dk, dv)), ref)
        r = host(cufold.exclusive_scan_by_key(dk, dev(v.astype(np.float32)), init=0.5))
        assert np.array_equal(r, ref.astype(np.float64) - v + 0.5)          # exact: small integers


def test_listed_and_exported():
    assert cufold.algorithms("segmented_scan") == ("single_pass",)
    for name in ("segmented_scan", "inclusive_scan_by_key", "exclusive_scan_by_key"):
        assert name in cufold.__all__ and getattr(cufold, name).__doc__


def test_errors():
    v = cuda.to_device(np.ones(4, np.float32))
    off = cuda.to_device(np.array([0, 4]))
    with pytest.raises(TypeError, match="integer dtype"):
        cufold.segmented_scan(v, cuda.to_device(np.array([0., 2.])))
    with pytest.raises(ValueError, match="1-D"):
        cufold.segmented_scan(v, cuda.to_device(np.zeros((2, 2), np.int64)))
    with pytest.raises(ValueError, match="len"):
        cufold.segmented_scan(v, cuda.to_device(np.zeros(0, np.int64)))
    with pytest.raises(ValueError, match="1-D values"):
        cufold.segmented_scan(cuda.to_device(np.ones((2, 2), np.float32)), off)
    with pytest.raises(TypeError, match="host"):
        cufold.segmented_scan(np.ones(4), off)
    with pytest.raises(TypeError, match="host"):
        cufold.inclusive_scan_by_key(np.ones(4), v)
    with pytest.raises(ValueError, match="equally long"):
        cufold.inclusive_scan_by_key(v, cuda.to_device(np.ones(3)))
    with pytest.raises(ValueError, match="equally long"):
        cufold.exclusive_scan_by_key(cuda.to_device(np.ones(3, np.int32)), v)
    with pytest.raises(ValueError, match="1-D values"):
        cufold.inclusive_scan_by_key(cuda.to_device(np.ones((2, 2), np.int32)), cuda.to_device(np.ones((2, 2))))
    with pytest.raises(TypeError, match="cufold: expected a 2-tuple"):
        cufold.segmented_scan((v, v), off, AFFINE, exclusive=True, init=5)
    with pytest.raises(ValueError, match="no identity"):
        cufold.segmented_scan(v, off, lambda a, b: a - b, exclusive=True)
