"""cufold.quads: a thread's 16-byte float32 loads and atomic adds, in a user's kernel,
against NumPy (np.add.at over rows of 4); 16-byte reads of 32-bit words; float32 maxima
and minima by integer reductions."""

import numpy as np
from numba import cuda

from conftest import SIMULATOR, to_device, to_host

import pytest

from cufold.quads import add4, load4, read4, red_max, red_min


@cuda.jit
def scatter_rows(keys, x, out):
    r = cuda.grid(1)
    if r < keys.size:
        a, b, c, d = load4(x, 4 * r)
        add4(out, 4 * keys[r], a, b, c, d)


def test_scatter_rows_of_four(rng):
    n, m = (200, 7) if SIMULATOR else (100_000, 300)
    keys = rng.integers(0, m, n).astype(np.int64)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    start = rng.standard_normal((m, 4)).astype(np.float32)
    out = to_device(start.reshape(-1))
    scatter_rows[-(-n // 64), 64](to_device(keys), to_device(x.reshape(-1)), out)
    want = start.astype(np.float64)
    np.add.at(want, keys, x.astype(np.float64))
    np.testing.assert_allclose(to_host(out).reshape(m, 4), want, rtol=1e-4, atol=1e-3)


@cuda.jit
def copy_quads(x, y):
    q = cuda.grid(1)
    if 4 * q < x.size:
        a, b, c, d = read4(x, 4 * q)
        y[4 * q], y[4 * q + 1], y[4 * q + 2], y[4 * q + 3] = d, c, b, a


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint32])
def test_read4_words(rng, dtype):
    x = rng.integers(0, 1 << 30, 4 * 50).astype(dtype) * dtype(3)
    y = to_device(np.full(x.size, 7, dtype))
    copy_quads[4, 16](to_device(x), y)
    np.testing.assert_array_equal(to_host(y), x.reshape(-1, 4)[:, ::-1].reshape(-1))


@cuda.jit
def scatter_extremes(keys, x, hi, lo):
    i = cuda.grid(1)
    if i < keys.size:
        red_max(hi, keys[i], x[i])
        red_min(lo, keys[i], x[i])


def test_red_max_min(rng):
    n, m = (300, 7) if SIMULATOR else (200_000, 300)
    keys = rng.integers(0, m, n).astype(np.int64)
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.random(n) < 0.3] *= -0.0
    x[rng.random(n) < 0.02] = -np.inf
    x[keys == 3] = np.abs(x[keys == 3])             # one key of non-negative values only
    x[np.flatnonzero(keys == 5)[:1]] = np.float32(-np.nan)
    start_hi = np.full(m, -np.inf, np.float32)
    start_lo = np.full(m, np.inf, np.float32)
    hi, lo = to_device(start_hi), to_device(start_lo)
    scatter_extremes[-(-n // 128), 128](to_device(keys), to_device(x), hi, lo)
    want_hi, want_lo = start_hi.copy(), start_lo.copy()
    with np.errstate(invalid="ignore"):         # (the NaN, on purpose)
        np.maximum.at(want_hi, keys, x)
        np.minimum.at(want_lo, keys, x)
    np.testing.assert_array_equal(to_host(hi), want_hi)
    np.testing.assert_array_equal(to_host(lo), want_lo)
