"""cufold.device.radix: the stable grouping by key behind reduce_by_key_into's
deterministic mode, against NumPy's stable argsort.

Keys of every integer width, bad keys (negative, too large: they sort last, as ``m``),
one to several digit passes (4-bit digits in the simulator, 8 on a GPU), partial tiles,
values of several dtypes, and keys that need 64-bit sort keys.

Run: PYTHONPATH=src python -m pytest tests/test_radix.py -q
"""

import numpy as np
import pytest
from numba import cuda

from conftest import SIMULATOR, gpu_only

from cufold.host import arrays as _arrays
from cufold.device import radix

INT_KEYS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def group(keys, values, m, **kw):
    k = _arrays.describe(cuda.to_device(keys), "keys")
    v = _arrays.describe(cuda.to_device(values), "values")
    gk, gv = radix.group_by_key(k, v, m, 0, **kw)
    assert gk.dtype == radix.sort_key_dtype(m) and gv.dtype == values.dtype
    return _arrays.as_numba(gk).copy_to_host(), _arrays.as_numba(gv).copy_to_host()


def expected(keys, values, m):
    k = keys.astype(np.int64) if keys.dtype != np.uint64 else keys.astype(np.float64)
    sk = np.where((k < 0) | (k >= m), m, k).astype(np.int64)
    order = np.argsort(sk, kind="stable")
    return sk[order], values[order]


@pytest.mark.parametrize("key_dtype", INT_KEYS)
def test_stable_against_numpy(key_dtype, rng):
    dt = np.dtype(key_dtype)
    m = min(100, np.iinfo(dt).max)
    n = 300 if SIMULATOR else 100_003
    lo = -3 if dt.kind == "i" else 0
    keys = rng.integers(lo, m + 3, n).astype(dt)          # a few bad keys at both ends
    values = rng.permutation(n).astype(np.float64)         # distinct: the order shows
    gk, gv = group(keys, values, m)
    want_k, want_v = expected(keys, values, m)
    np.testing.assert_array_equal(gk, want_k)
    np.testing.assert_array_equal(gv, want_v)


@pytest.mark.parametrize("m", [1, 15, 16, 300, 4097])
def test_passes_and_partial_tiles(m, rng):
    """m = 1 and 15: one pass; 16: the bad key m needs a second digit; 4097: four passes in
    the simulator (three on a GPU). The input ends in a partial tile and a partial warp."""
    tile = radix.TILE.nt * radix.TILE.vt
    n = 2 * tile + 37
    keys = rng.integers(0, m, n).astype(np.int32)
    keys[5] = m                                            # one bad key
    values = np.arange(n, dtype=np.int32)
    gk, gv = group(keys, values, m)
    want_k, want_v = expected(keys, values, m)
    np.testing.assert_array_equal(gk, want_k)
    np.testing.assert_array_equal(gv, want_v)
    assert radix.passes(m) == max(1, -(-m.bit_length() // radix.DIGIT_BITS))


@pytest.mark.parametrize("val_dtype", ["bool", "int8", "float32", "uint64"])
def test_value_dtypes(val_dtype, rng):
    n, m = 200, 37
    keys = rng.integers(0, m, n).astype(np.int64)
    values = rng.integers(0, 2 if val_dtype == "bool" else 100, n).astype(val_dtype)
    gk, gv = group(keys, values, m)
    want_k, want_v = expected(keys, values, m)
    np.testing.assert_array_equal(gk, want_k)
    np.testing.assert_array_equal(gv, want_v)


def test_sorted_and_reversed_keys():
    n, m = 260, 64
    up = (np.arange(n) * m // n).astype(np.int32)
    for keys in (up, up[::-1].copy(), np.full(n, 7, np.int32)):
        values = np.arange(n, dtype=np.float64)
        gk, gv = group(keys, values, m)
        want_k, want_v = expected(keys, values, m)
        np.testing.assert_array_equal(gk, want_k)
        np.testing.assert_array_equal(gv, want_v)


def test_wide_sort_keys(rng):
    """m >= 2**32 - 1: keys travel as uint64 (and the digit passes cover 33+ bits)."""
    m = 2**32 + 5
    keys = np.concatenate([rng.integers(0, 40, 60), [2**32 + 4, 2**32, 2**32 - 1, m, -1, 3]]).astype(np.int64)
    values = np.arange(keys.size, dtype=np.float32)
    assert radix.sort_key_dtype(m) == np.uint64 and radix.sort_key_dtype(2**32 - 2) == np.uint32
    gk, gv = group(keys, values, m, digit_bits=8)
    want_k, want_v = expected(keys, values, m)
    np.testing.assert_array_equal(gk, want_k)
    np.testing.assert_array_equal(gv, want_v)


def test_one_program_per_signature(rng):
    """A second grouping of the same signature runs the first one's Program, into new
    arrays (the first results stay)."""
    radix._groupings.clear()
    n, m = 300, 100
    results = []
    for _ in range(2):
        keys = rng.integers(0, m + 2, n).astype(np.int32)
        values = rng.standard_normal(n)
        k = _arrays.describe(cuda.to_device(keys), "keys")
        v = _arrays.describe(cuda.to_device(values), "values")
        results.append((radix.group_by_key(k, v, m, 0), expected(keys, values, m)))
    assert len(radix._groupings) == 1
    for (gk, gv), (want_k, want_v) in results:
        np.testing.assert_array_equal(_arrays.as_numba(gk).copy_to_host(), want_k)
        np.testing.assert_array_equal(_arrays.as_numba(gv).copy_to_host(), want_v)


@pytest.mark.parametrize("m", [1, 300, 4097])
def test_positions_made_by_the_first_pass(m, rng):
    """``values=Positions(dtype)``: each pair's input position, made by the first pass as
    it moves the keys (no array of positions is read): the stable argsort, in every
    later pass's order too (m = 300, 4097: several passes)."""
    from cufold.host import programs
    tile = radix.TILE.nt * radix.TILE.vt
    n = 2 * tile + 37
    keys = rng.integers(-1, m + 1, n).astype(np.int64)       # bad keys both sides
    k = _arrays.describe(cuda.to_device(keys), "keys")
    last = 2 * ((radix.passes(m) - 1) % 2)                  # the pair the last pass wrote
    want_k, want_pos = expected(keys, np.arange(n), m)
    for dt in (np.int32, np.uint64):
        b = programs.Builder(k.device_id, 0)
        kk = b.input(k)
        at = radix.Positions(np.dtype(dt))
        radix.group(b, kk, at, m, 0, radix.group_buffers(b, kk, at, m))
        got = b.build(lambda outs: outs)(k)
        np.testing.assert_array_equal(_arrays.as_numba(_arrays.describe(got[last], "k")).copy_to_host(), want_k)
        pos = _arrays.as_numba(_arrays.describe(got[last + 1], "p")).copy_to_host()
        assert pos.dtype == dt
        np.testing.assert_array_equal(pos, want_pos)


@gpu_only
def test_large_input_three_passes(rng):
    n, m = 10_000_019, 1_000_000
    keys = rng.integers(0, m, n).astype(np.int32)
    values = rng.standard_normal(n)
    gk, gv = group(keys, values, m)
    want_k, want_v = expected(keys, values, m)
    np.testing.assert_array_equal(gk, want_k)
    np.testing.assert_array_equal(gv, want_v)
