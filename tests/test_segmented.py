"""segmented_reduce (merge-path CSR segments) and reduce_by_key, against NumPy or
a plain Python fold: empty, tiny and huge segments, offsets and keys of every
integer width, NaN, non-commutative and tuple-valued operators, init, dtypes.

In the simulator the tiles are tiny (one-warp tiles of 32 threads x 4 path
items for most tests, the library's 64 x 2 for some, 32 x 1 for the huge
segment), so a few hundred values cross many tiles and segments span several;
on a GPU the same tests use the library's tiles and larger inputs. Outputs are
poisoned when allocated, so an element left unwritten fails the comparison.
"""

import importlib

import numpy as np
import pytest
from numba import cuda

from conftest import AFFINE, AFFINE_NO_IDENTITY, SIMULATOR, gpu_only, poison_allocations, to_device, to_host
from conftest import affine as _affine

import cufold
# The module (once exported, cufold.device.segmented may be a function of the same name).
seg = importlib.import_module("cufold.device.segmented")
from cufold.values import ValueType

INT_DTYPES = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)
LENGTHS = (0, 1, 3, 40, 300) if SIMULATOR else (0, 1, 3, 10, 40, 300, 5000)
SEGMENTS = 12 if SIMULATOR else 20_000


# --- fixtures and helpers ---------------------------------------------------------------------

@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every array the library allocates starts full of a value no result holds."""
    poison_allocations(monkeypatch)


dev, host = to_device, to_host


def make_offsets(rng, count=SEGMENTS, lengths=LENGTHS, p=None, dtype=np.int64, start=0):
    lens = rng.choice(np.array(lengths), size=count, p=p)
    return (start + np.concatenate([[0], np.cumsum(lens)])).astype(dtype)


def ref_fold(values, off, fold, empty):
    """Per segment: ``fold(values[a:b])``, or ``empty`` for an empty one."""
    off = np.asarray(off).astype(np.int64)
    return [fold(values, a, b) if b > a else empty for a, b in zip(off[:-1], off[1:])]


def ref_reduceat(ufunc, values, off, empty, dtype=None):
    """``ufunc.reduceat`` at the starts of the non-empty segments (consecutive ones
    end where the next starts; the values past ``off[-1]`` are cut off), ``empty``
    for the empty segments (where reduceat would give ``values[offsets[i]]``)."""
    off = np.asarray(off).astype(np.int64)
    dtype = np.dtype(dtype or values.dtype)
    starts, ends = off[:-1], off[1:]
    out = np.full(len(starts), empty, dtype=dtype)
    full = ends > starts
    if full.any():
        out[full] = ufunc.reduceat(values[:off[-1]].astype(dtype), starts[full])
    return out


def wrap_affine(a, b, lo, hi):
    x, y = 1, 0
    for k in range(lo, hi):
        x, y = x * int(a[k]), y * int(a[k]) + int(b[k])
    return (x, y)


# --- segmented_reduce: sums and NumPy's reduceat ---------------------------------------------------

@pytest.mark.parametrize("dtype", (np.float32, np.float64, np.int32, np.int8, np.uint16, np.float16),
                         ids=lambda d: np.dtype(d).name)
def test_sum_mixed_lengths(dtype, rng, seg_small_tiles):
    off = make_offsets(rng)
    n = int(off[-1])
    dt = np.dtype(dtype)
    if dt.kind == "f":
        v = rng.standard_normal(n).astype(dt)
    else:
        v = rng.integers(0, 100, n).astype(dt)
    r = host(seg.segmented_reduce(dev(v), dev(off)))
    ref = ref_reduceat(np.add, v.astype(np.float64) if dt.kind == "f" else v, off, 0,
                       np.float64 if dt.kind == "f" else np.add.reduce(v[:1]).dtype)
    assert r.dtype == np.add.reduce(v[:1]).dtype
    assert r.shape == (len(off) - 1,)
    if dt.kind == "f":
        tol = {np.dtype(np.float16): 2e-2, np.dtype(np.float32): 1e-4}.get(dt, 1e-11)
        scale = ref_reduceat(np.add, np.abs(v.astype(np.float64)), off, 0, np.float64) + 1
        assert np.all(np.abs(r.astype(np.float64) - ref) <= tol * scale)
    else:
        assert np.array_equal(r, ref)


@pytest.mark.parametrize("odt", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_offsets_every_integer_width(odt, rng, seg_small_tiles):
    top = 120 if np.dtype(odt).itemsize == 1 else 500
    lens = rng.choice(np.array([0, 1, 2, 7, 30]), size=200)
    off = np.concatenate([[0], np.cumsum(lens)])
    off = off[off <= top].astype(odt)
    v = rng.integers(-50, 50, int(off[-1])).astype(np.int64)
    r = host(seg.segmented_reduce(dev(v), dev(off), cufold.maximum, init=-1000))
    ref = ref_fold(v, off, lambda x, a, b: max(-1000, int(x[a:b].max())), -1000)
    assert r.tolist() == ref


def test_empty_segments(rng, seg_small_tiles):
    # Only empty segments, with and without values around them; none at all.
    v = rng.standard_normal(50).astype(np.float32)
    for off in (np.zeros(7, np.int64), np.full(130, 20, np.int64), np.array([50, 50], np.int64)):
        r = host(seg.segmented_reduce(dev(v), dev(off)))
        assert np.array_equal(r, np.zeros(len(off) - 1, np.float32))
    r = seg.segmented_reduce(dev(v), dev(np.array([3], np.int64)))
    assert host(r).shape == (0,)
    r = host(seg.segmented_reduce(dev(np.zeros(0, np.float32)), dev(np.zeros(4, np.int32)),
                                  cufold.minimum))
    assert np.array_equal(r, np.full(3, np.inf, np.float32))
    # Many empty segments between a few values: a whole tile of segment ends.
    off = np.concatenate([[0, 2], np.full(300, 2), [5, 5, 9]]).astype(np.int64)
    v = np.arange(9, dtype=np.int32)
    r = host(seg.segmented_reduce(dev(v), dev(off)))
    assert r.dtype == np.int64
    assert r.tolist() == [1] + [0] * 300 + [9, 0, 5 + 6 + 7 + 8]


def test_default_tiles_multiwarp(rng):
    """The simulator's default tiles (64 threads: two warps in the block scan)."""
    off = make_offsets(rng, count=8 if SIMULATOR else SEGMENTS)
    v = rng.integers(-9, 10, int(off[-1])).astype(np.int32)
    r = host(seg.segmented_reduce(dev(v), dev(off)))
    assert np.array_equal(r, ref_reduceat(np.add, v.astype(np.int64), off, 0, np.int64))


def test_one_huge_segment(rng, monkeypatch):
    """A segment spanning many tiles (40 in the simulator: 32-item tiles), between
    small ones; the look-back folds the tiles inside it."""
    if SIMULATOR:
        monkeypatch.setenv("CUFOLD_SEG_TILE", "32x1")
    big = 1200 if SIMULATOR else 10_000_000
    lens = np.array([3, 0, 1, big, 0, 2, 5])
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    v = rng.integers(-1000, 1000, int(off[-1])).astype(np.int64)
    r = host(seg.segmented_reduce(dev(v), dev(off)))
    assert np.array_equal(r, ref_reduceat(np.add, v, off, 0))
    f = v.astype(np.float32)
    r = host(seg.segmented_reduce(dev(f), dev(off), cufold.maximum))
    assert np.array_equal(r, ref_reduceat(np.maximum, f, off, -np.inf))


def test_nan_values(rng, seg_small_tiles):
    off = make_offsets(rng)
    v = rng.standard_normal(int(off[-1])).astype(np.float32)
    v[rng.random(v.size) < 0.02] = np.nan
    for op, uf, empty in ((cufold.plus, np.add, 0), (cufold.maximum, np.maximum, -np.inf),
                          (cufold.minimum, np.minimum, np.inf)):
        r = host(seg.segmented_reduce(dev(v), dev(off), op))
        ref = ref_reduceat(uf, v.astype(np.float64), off, empty, np.float64)
        assert np.array_equal(np.isnan(r), np.isnan(ref)), op.name
        ok = ~np.isnan(ref)
        assert np.allclose(r[ok], ref[ok], rtol=1e-5, atol=1e-4), op.name


# --- operators: order, tuples, init, identities ------------------------------------------------------

@pytest.mark.parametrize("with_identity", (True, False))
def test_noncommutative_affine(with_identity, rng, seg_small_tiles):
    off = make_offsets(rng)
    n = int(off[-1])
    a = rng.choice(np.array([-1, 1], np.int64), n)
    b = rng.integers(-3, 4, n).astype(np.int64)
    if with_identity:
        ra, rb = host(seg.segmented_reduce(dev((a, b)), dev(off), AFFINE))
        init = (1, 0)
    else:
        with pytest.raises(ValueError, match="init="):
            seg.segmented_reduce(dev((a, b)), dev(off), AFFINE_NO_IDENTITY)
        init = (-1, 5)
        ra, rb = host(seg.segmented_reduce(dev((a, b)), dev(off), AFFINE_NO_IDENTITY, init=init))
    assert ra.dtype == np.int64 and rb.dtype == np.int64
    for i, (lo, hi) in enumerate(zip(off[:-1], off[1:])):
        want = _affine(init, wrap_affine(a, b, lo, hi))
        assert (ra[i], rb[i]) == want, i


def test_init_folded_in_front(rng, seg_small_tiles):
    off = make_offsets(rng)
    v = rng.integers(0, 9, int(off[-1])).astype(np.int32)
    r = host(seg.segmented_reduce(dev(v), dev(off), init=100))
    assert np.array_equal(r, ref_reduceat(np.add, v.astype(np.int64), off, 0, np.int64) + 100)
    r = host(seg.segmented_reduce(dev(v), dev(off), cufold.maximum, init=5))
    assert r.dtype == np.int32
    ref = ref_fold(v, off, lambda x, lo, hi: max(5, int(x[lo:hi].max())), 5)
    assert r.tolist() == ref


def test_tuple_argmin(rng, seg_small_tiles):
    off = make_offsets(rng)
    n = int(off[-1])
    v = rng.integers(0, 20, n).astype(np.float32)         # ties: the first index wins
    idx = np.arange(n, dtype=np.int64)
    rv, ri = host(seg.segmented_reduce(dev((v, idx)), dev(off), cufold.argmin))
    for i, (lo, hi) in enumerate(zip(off[:-1], off[1:])):
        if hi > lo:
            k = lo + int(np.argmin(v[lo:hi]))
            assert (rv[i], ri[i]) == (v[k], k)
        else:
            assert rv[i] == np.inf and ri[i] == np.iinfo(np.int64).max


def test_plain_function_and_dtype(rng, seg_small_tiles):
    off = make_offsets(rng)
    v = rng.standard_normal(int(off[-1])).astype(np.float32)
    r = host(seg.segmented_reduce(dev(v), dev(off), dtype=np.float64))
    assert r.dtype == np.float64
    assert np.allclose(r, ref_reduceat(np.add, v.astype(np.float64), off, 0, np.float64),
                       rtol=1e-12, atol=1e-12)
    r = host(seg.segmented_reduce(dev(v), dev(off), lambda a, b: a + b, init=0.0))
    assert np.allclose(r, ref_reduceat(np.add, v.astype(np.float64), off, 0, np.float64), atol=1e-4)
    b = rng.random(v.size) < 0.3
    r = host(seg.segmented_reduce(dev(b), dev(off), cufold.logical_or))
    assert r.dtype == np.bool_
    assert r.tolist() == ref_fold(b, off, lambda x, lo, hi: bool(x[lo:hi].any()), False)


def test_offsets_subrange(rng, seg_small_tiles):
    """offsets[0] > 0 and offsets[-1] < len(values): the values outside are ignored."""
    off = make_offsets(rng, start=17)
    v = rng.integers(-5, 5, int(off[-1]) + 23).astype(np.int64)
    r = host(seg.segmented_reduce(dev(v), dev(off)))
    assert np.array_equal(r, ref_reduceat(np.add, v, off, 0))


def test_strided_values(rng, seg_small_tiles):
    """A non-contiguous values view (every other element) and strided offsets."""
    off = make_offsets(rng, count=6)
    v = rng.integers(-9, 10, 2 * int(off[-1])).astype(np.int64)
    o2 = np.repeat(off, 2)
    r = host(seg.segmented_reduce(dev(v)[::2], dev(o2)[::2]))
    assert np.array_equal(r, ref_reduceat(np.add, v[::2].copy(), off, 0))


def test_repeated_calls_reuse_state(rng, seg_small_tiles):
    """The look-back flags are reused launch after launch (a new epoch each)."""
    for count in (3, 9, 5):
        off = make_offsets(rng, count=count)
        v = rng.integers(-5, 5, int(off[-1])).astype(np.int64)
        assert np.array_equal(host(seg.segmented_reduce(dev(v), dev(off))),
                              ref_reduceat(np.add, v, off, 0))


def test_errors():
    v = cuda.to_device(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="integer dtype"):
        seg.segmented_reduce(v, cuda.to_device(np.array([0., 2.])))
    with pytest.raises(ValueError, match="1-D"):
        seg.segmented_reduce(v, cuda.to_device(np.zeros((2, 2), np.int64)))
    with pytest.raises(ValueError, match="len"):
        seg.segmented_reduce(v, cuda.to_device(np.zeros(0, np.int64)))
    with pytest.raises(TypeError, match="host"):
        seg.segmented_reduce(np.ones(4), cuda.to_device(np.array([0, 4])))
    with pytest.raises(ValueError, match="no identity"):
        seg.segmented_reduce(v, cuda.to_device(np.array([0, 4])), lambda a, b: a - b)
    with pytest.raises(ValueError, match="equally long"):
        seg.reduce_by_key(v, cuda.to_device(np.ones(3)))


# --- the look-back: windows of aggregates, stopping at a prefix --------------------------------------

def _look_back_kernel(vt):
    look_back = seg._look_back(AFFINE, vt)

    @cuda.jit
    def kernel(tile, flags, tag, aggs, pres, placeholder, result):
        has, r = look_back(tile, flags, tag, aggs, pres, placeholder)
        if cuda.threadIdx.x == 0:
            result[0] = 1 if has else 0
            result[1] = r[0]
            result[2] = r[1]

    return kernel


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("stop, stop_state", [(-1, None), (0, "prefix"), (10, "none"), (40, "prefix"),
                                              (69, "prefix"), (68, "none")])
def test_look_back_windows(stop, stop_state, rng):
    """Tile 70 looks back over tiles 69..0, 32 at a time. Every predecessor
    published its aggregate only (end to end, the simulator runs blocks in order
    and always finds a prefix at once) except ``stop``, which published a prefix
    (or an empty one); ``stop = -1``: none, the look-back runs off tile 0."""
    vt = ValueType.of((np.int64, np.int64))
    tile, epoch = 70, 5
    tag = np.uint32(epoch << 2)
    a = rng.choice(np.array([-1, 1], np.int64), tile + 1)
    b = rng.integers(-3, 4, tile + 1).astype(np.int64)
    flags = np.full(tile + 1, epoch << 2 | seg.AGGREGATE, np.uint32)
    flags[tile] = (epoch - 1) << 2 | seg.PREFIX         # an older epoch's flag reads as EMPTY
    pres = (np.full(tile + 1, 99, np.int64), np.full(tile + 1, 99, np.int64))
    aggs = (a.copy(), b.copy())
    want = None
    if stop >= 0:
        for arr in aggs:
            arr[:stop + 1] = 1234567                    # at and before the stop: never read
        if stop_state == "prefix":
            flags[stop] = epoch << 2 | seg.PREFIX
            pres[0][stop], pres[1][stop] = want = (-1, 3)
        else:
            flags[stop] = epoch << 2 | seg.PREFIX_NONE
    for k in range(stop + 1, tile):
        want = (int(a[k]), int(b[k])) if want is None else _affine(want, (a[k], b[k]))
    result = cuda.to_device(np.zeros(3, np.int64))
    _look_back_kernel(vt)[1, 32](tile, cuda.to_device(flags), tag, dev(aggs), dev(pres),
                                 (np.int64(7), np.int64(7)), result)
    got = result.copy_to_host()
    assert got[0] == 1 and (got[1], got[2]) == want


# --- reduce_by_key ----------------------------------------------------------------------------------

def runs_of(rng, count, key_dtype, max_len=12):
    dt = np.dtype(key_dtype)
    lo, hi = (0, 2) if dt.kind == "b" else (-3 if dt.kind in "if" else 0, 4)
    keys = rng.integers(lo, hi, count)
    lens = rng.integers(1, max_len, count)
    return np.repeat(keys, lens).astype(dt)


def ref_runs(keys, values, fold):
    heads = np.ones(len(keys), bool)
    heads[1:] = keys[1:] != keys[:-1]
    starts = np.nonzero(heads)[0]
    ends = np.append(starts[1:], len(keys))
    return keys[starts], [fold(values, a, b) for a, b in zip(starts, ends)]


@pytest.mark.parametrize("kdt", INT_DTYPES + (np.bool_,), ids=lambda d: np.dtype(d).name)
def test_reduce_by_key_key_widths(kdt, rng, seg_small_tiles):
    keys = runs_of(rng, 25 if SIMULATOR else 100_000, kdt)
    values = rng.integers(-100, 100, len(keys)).astype(np.int32)
    uk, tot = host(seg.reduce_by_key(dev(keys), dev(values)))
    rk, rt = ref_runs(keys, values, lambda x, lo, hi: int(x[lo:hi].sum()))
    assert uk.dtype == keys.dtype and tot.dtype == np.int64
    assert np.array_equal(uk, rk) and tot.tolist() == rt


def test_reduce_by_key_float_keys_nan(rng, seg_small_tiles):
    keys = runs_of(rng, 20, np.float32)
    keys[rng.random(len(keys)) < 0.1] = np.nan          # NaN != NaN: each NaN its own run
    values = rng.standard_normal(len(keys))
    uk, tot = host(seg.reduce_by_key(dev(keys), dev(values), cufold.maximum))
    rk, rt = ref_runs(keys, values, lambda x, lo, hi: x[lo:hi].max())
    assert np.array_equal(uk, rk, equal_nan=True)
    assert np.array_equal(tot, np.array(rt))


def test_reduce_by_key_noncommutative_tuple_keys(rng, seg_small_tiles):
    k1 = runs_of(rng, 20, np.int32)
    k2 = (np.arange(len(k1)) // 7).astype(np.int16)     # runs end where either field changes
    n = len(k1)
    a = rng.choice(np.array([-1, 1], np.int64), n)
    b = rng.integers(-3, 4, n).astype(np.int64)
    (u1, u2), (ta, tb) = host(seg.reduce_by_key(dev((k1, k2)), dev((a, b)), AFFINE_NO_IDENTITY))
    heads = np.ones(n, bool)
    heads[1:] = (k1[1:] != k1[:-1]) | (k2[1:] != k2[:-1])
    starts = np.nonzero(heads)[0]
    ends = np.append(starts[1:], n)
    assert np.array_equal(u1, k1[starts]) and np.array_equal(u2, k2[starts])
    assert list(zip(ta.tolist(), tb.tolist())) == [wrap_affine(a, b, s, e) for s, e in zip(starts, ends)]


def test_reduce_by_key_edges(rng, seg_small_tiles):
    # empty, one run, all distinct, a key coming back (a new run, as in thrust)
    uk, tot = host(seg.reduce_by_key(dev(np.zeros(0, np.int32)), dev(np.zeros(0, np.float32))))
    assert uk.shape == (0,) and tot.shape == (0,) and tot.dtype == np.float32
    uk, tot = host(seg.reduce_by_key(dev(np.full(300, 7, np.int64)), dev(np.ones(300, np.float64))))
    assert uk.tolist() == [7] and tot.tolist() == [300.0]
    k = np.arange(200, dtype=np.int32)
    uk, tot = host(seg.reduce_by_key(dev(k), dev(k.astype(np.float32))))
    assert np.array_equal(uk, k) and np.array_equal(tot, k.astype(np.float32))
    k = np.array([1, 1, 2, 1, 1, 1], np.int8)
    uk, tot = host(seg.reduce_by_key(dev(k), dev(np.arange(6, dtype=np.int16))))
    assert uk.tolist() == [1, 2, 1] and tot.tolist() == [1, 2, 12]


# --- GPU: sizes of real use -------------------------------------------------------------------------

@gpu_only
def test_gpu_million_segments_of_ten(rng):
    m = 1_000_000
    off = np.arange(0, 10 * m + 1, 10, dtype=np.int64)
    v = rng.standard_normal(10 * m).astype(np.float32)
    r = host(seg.segmented_reduce(dev(v), dev(off)))
    ref = v.astype(np.float64).reshape(m, 10).sum(axis=1)
    assert np.allclose(r, ref, rtol=1e-5, atol=1e-5)


@gpu_only
@pytest.mark.parametrize("p", [None, (0.5, 0.2, 0.1, 0.1, 0.05, 0.04, 0.01)])
def test_gpu_random_mix(p, rng):
    off = make_offsets(rng, count=200_000, p=p)
    v = rng.integers(-1000, 1000, int(off[-1])).astype(np.int32)
    r = host(seg.segmented_reduce(dev(v), dev(off)))
    assert np.array_equal(r, ref_reduceat(np.add, v.astype(np.int64), off, 0, np.int64))
    r = host(seg.segmented_reduce(dev(v), dev(off.astype(np.int32)), cufold.minimum))
    assert np.array_equal(r, ref_reduceat(np.minimum, v, off, np.iinfo(np.int32).max))


@gpu_only
def test_gpu_reduce_by_key_large(rng):
    keys = runs_of(rng, 300_000, np.int64, max_len=40)
    values = rng.standard_normal(len(keys)).astype(np.float32)
    uk, tot = host(seg.reduce_by_key(dev(keys), dev(values)))
    heads = np.ones(len(keys), bool)
    heads[1:] = keys[1:] != keys[:-1]
    starts = np.nonzero(heads)[0]
    assert np.array_equal(uk, keys[starts])
    assert np.allclose(tot, np.add.reduceat(values.astype(np.float64), starts), rtol=1e-4, atol=1e-4)
