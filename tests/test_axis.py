"""Reductions along axes: NumPy's semantics for axis, keepdims, strides and dtypes."""

import numpy as np
import pytest
from numba import cuda

import cufold
from conftest import SIMULATOR, to_host

SHAPE = (5, 7, 6) if SIMULATOR else (37, 129, 65)
AXES = [None, 0, 1, 2, -1, (0, 2), (1, 2), (0, 1), (0, 1, 2)]


host = to_host


@pytest.fixture
def x(rng):
    return rng.integers(-9, 9, SHAPE).astype(np.int32)


@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("keepdims", [False, True])
def test_sum_axes(x, axis, keepdims):
    got = host(cufold.sum(cuda.to_device(x), axis=axis, keepdims=keepdims))
    ref = x.sum(axis=axis, keepdims=keepdims)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("view", ["strided", "reversed", "transposed"])
@pytest.mark.parametrize("axis", [0, 1, (0, 2)])
def test_views(x, view, axis):
    d = cuda.to_device(x)
    if view == "strided":
        dv, xv = d[:, ::2, 1:], x[:, ::2, 1:]
    elif view == "reversed":
        dv, xv = d[::-1, :, ::-1], x[::-1, :, ::-1]
    else:  # Numba transposes 2-D device arrays only
        dv, xv = cuda.to_device(np.ascontiguousarray(x[:, :, 0])).T, x[:, :, 0].T
        axis = axis if isinstance(axis, int) else None
    np.testing.assert_array_equal(host(cufold.max(dv, axis=axis)), xv.max(axis=axis))


def test_argmax_axis(rng):
    x = rng.integers(0, 4, SHAPE).astype(np.float32)  # many ties: the first index wins
    d = cuda.to_device(x)
    for axis in (0, 1, 2):
        np.testing.assert_array_equal(host(cufold.argmax(d, axis=axis)), x.argmax(axis=axis))
        np.testing.assert_array_equal(host(cufold.argmin(d, axis=axis)), x.argmin(axis=axis))


def test_mean_var_axis(rng):
    x = rng.normal(3, 2, SHAPE[:2]).astype(np.float32)
    d = cuda.to_device(x)
    for axis in (0, 1):
        m, v = cufold.mean_var(d, axis=axis, ddof=1)
        np.testing.assert_allclose(host(m), x.mean(axis=axis, dtype=np.float64), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(host(v), x.var(axis=axis, ddof=1, dtype=np.float64), rtol=1e-4)


def test_non_commutative_rows(rng):
    # Affine maps compose in order: (a, b) then (c, d) = (a*c, b*c + d).
    a = rng.choice([-1, 1], SHAPE[:2]).astype(np.int64)
    b = rng.integers(-3, 4, SHAPE[:2]).astype(np.int64)
    op = cufold.Op(lambda p, q: (p[0] * q[0], p[1] * q[0] + q[1]))
    got_a, got_b = cufold.reduce((cuda.to_device(a), cuda.to_device(b)), op, axis=1)
    for i in range(SHAPE[0]):
        acc = (a[i, 0], b[i, 0])
        for j in range(1, SHAPE[1]):
            acc = (acc[0] * a[i, j], acc[1] * a[i, j] + b[i, j])
        assert (host(got_a)[i], host(got_b)[i]) == acc


def test_empty_axis():
    x = np.zeros((4, 0), np.float32)
    d = cuda.to_device(x)
    np.testing.assert_array_equal(host(cufold.sum(d, axis=1)), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="zero-size"):
        cufold.max(d, axis=1)


def test_out_and_errors(x):
    d = cuda.to_device(x)
    out = cuda.to_device(np.full(SHAPE[1:], -1, np.int64))
    cufold.sum(d, axis=0, out=out)
    np.testing.assert_array_equal(out.copy_to_host(), x.sum(axis=0))
    with pytest.raises(np.exceptions.AxisError):
        cufold.sum(d, axis=3)
    with pytest.raises(ValueError, match="duplicate"):
        cufold.sum(d, axis=(1, -2))
    with pytest.raises(ValueError, match="shape"):
        cufold.sum(d, axis=0, out=cuda.to_device(np.zeros(3, np.int64)))


def test_full_sum_of_transposed_300x200(rng):
    """A full reduction of a view that is not one contiguous run, large enough that a
    single simulated warp walked it for over a minute (and was taken for a deadlock)."""
    x = rng.integers(-50, 50, (300, 200)).astype(np.int32)
    d = cuda.to_device(x)
    for dv, xv in ((d.T, x.T), (d, x)):
        got = host(cufold.sum(dv))
        assert got.dtype == xv.sum().dtype
        assert got == xv.sum()
    np.testing.assert_array_equal(host(cufold.sum(d.T, axis=1)), x.T.sum(axis=1))
