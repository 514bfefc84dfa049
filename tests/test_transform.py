"""Fused transforms (transform=, post=), generated inputs (counting, constant) and the
shortcuts built on them (dot, norm, logsumexp, count_nonzero, all, any), against NumPy
in float64."""

import math

import numpy as np
import pytest
from numba import cuda

import cufold
from cufold.ops import as_transform
from conftest import SIMULATOR, to_device, to_host

N = 1000 if SIMULATOR else 1 << 20          # crosses tiles and blocks in the simulator's tiny tiles
SHAPE = (5, 7, 6) if SIMULATOR else (37, 129, 65)


def poisoned(shape, dtype):
    """An out= array filled with garbage (NaN or the dtype's largest value)."""
    dt = np.dtype(dtype)
    fill = np.nan if dt.kind == "f" else (True if dt.kind == "b" else np.iinfo(dt).max)
    return cuda.to_device(np.full(shape, fill, dt))


def close(got, ref, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=rtol, atol=atol)


def square(v):
    return v * v


# --- transform= and post= ------------------------------------------------------------------

def test_sum_of_transform(rng):
    h = rng.standard_normal(N).astype(np.float32)
    got = cufold.sum(to_device(h), transform=square)
    assert to_host(got).dtype == np.float32
    close(to_host(got), (h.astype(np.float64) ** 2).sum())


def test_transform_of_zipped_inputs_into_out(rng):
    a, b = rng.integers(-50, 50, N).astype(np.int32), rng.integers(-50, 50, N).astype(np.int32)
    out = poisoned((), np.int64)
    got = cufold.reduce(to_device((a, b)), transform=lambda v: v[0] * v[1], out=out)
    assert got is out
    assert to_host(out)[()] == int((a.astype(np.int64) * b).sum())


def test_transform_to_a_tuple_with_user_operator(rng):
    h = rng.standard_normal(N).astype(np.float64)

    def pair(v):
        return (v, v * v)

    s, q = cufold.reduce(to_device(h), cufold.Op(lambda a, b: (a[0] + b[0], a[1] + b[1]), commutative=True),
                         transform=pair)
    close(to_host(s), h.sum(), rtol=1e-12, atol=1e-9)
    close(to_host(q), (h * h).sum(), rtol=1e-12)


def test_post_norm_and_mean_of_transform(rng):
    h = rng.standard_normal(N).astype(np.float32)
    d = to_device(h)
    close(to_host(cufold.sum(d, transform=square, post=math.sqrt)), np.linalg.norm(h.astype(np.float64)))
    close(to_host(cufold.mean(d, transform=abs)), np.abs(h.astype(np.float64)).mean())
    m, v = cufold.mean_var(d, transform=square)
    close(to_host(m), (h.astype(np.float64) ** 2).mean())
    close(to_host(v), (h.astype(np.float64) ** 2).var(), rtol=1e-4)


def test_argmax_argmin_of_transform(rng):
    h = rng.standard_normal(N).astype(np.float32)
    d = to_device(h)
    assert to_host(cufold.argmax(d, transform=abs))[()] == np.argmax(np.abs(h))
    assert to_host(cufold.argmin(d, transform=lambda v: (v - 0.5) ** 2))[()] == np.argmin((h - 0.5) ** 2)


@pytest.mark.parametrize("axis,keepdims", [(0, False), (2, True), ((0, 2), False), (None, True)])
def test_axes_with_transform_and_post(rng, axis, keepdims):
    h = rng.standard_normal(SHAPE).astype(np.float32)
    got = to_host(cufold.sum(to_device(h), axis=axis, keepdims=keepdims, transform=square, post=math.sqrt))
    ref = np.sqrt((h.astype(np.float64) ** 2).sum(axis=axis, keepdims=keepdims))
    assert got.shape == ref.shape
    close(got, ref)


def test_strided_view_with_transform(rng):
    h = rng.integers(-9, 9, (40, 30)).astype(np.int32)
    d = to_device(h)[::2, ::-3]
    got = to_host(cufold.max(d, axis=1, transform=lambda v: v * v - v))
    np.testing.assert_array_equal(got, (h[::2, ::-3].astype(np.int64) ** 2 - h[::2, ::-3]).max(axis=1))


def test_empty_with_post():
    d = to_device(np.zeros(0, np.float32))
    assert to_host(cufold.sum(d, transform=square, post=lambda s: s + 1))[()] == 1
    got = to_host(cufold.sum(to_device(np.zeros((3, 0), np.float32)), axis=1, post=lambda s: s - 2))
    np.testing.assert_array_equal(got, [-2, -2, -2])


# --- generated inputs ------------------------------------------------------------------------

def test_counting_and_constant():
    assert to_host(cufold.sum(cufold.counting(N)))[()] == N * (N - 1) // 2
    assert to_host(cufold.sum(cufold.counting(N, start=-5, dtype=np.int32)))[()] == N * (N - 1) // 2 - 5 * N
    assert to_host(cufold.sum(cufold.constant(N, 2.5)))[()] == 2.5 * N
    assert to_host(cufold.max(cufold.counting(N, 0.5, np.float32)))[()] == N - 0.5
    out = poisoned((), np.int64)
    cufold.sum(cufold.constant(N, 3, np.int8), out=out)
    assert to_host(out)[()] == 3 * N


def test_argmax_of_a_transform_of_counting():
    got = cufold.argmax(cufold.counting(N), transform=lambda i: -(i - 321) ** 2)
    assert to_host(got)[()] == 321


def test_counting_zipped_with_an_array(rng):
    h = rng.standard_normal(N).astype(np.float32)
    v, i = cufold.reduce((to_device(h), cufold.counting(N)), cufold.argmin)
    assert to_host(i)[()] == np.argmin(h) and to_host(v)[()] == h.min()
    # the index-weighted sum: a transform of (item, index)
    got = cufold.sum((to_device(h), cufold.counting(N, dtype=np.float64)), transform=lambda t: t[0] * t[1])
    close(to_host(got), (h.astype(np.float64) * np.arange(N)).sum(), rtol=1e-9)


def test_generated_inputs_reduce_whole():
    with pytest.raises(ValueError, match="generated inputs"):
        cufold.sum(cufold.counting(10), keepdims=True)
    with pytest.raises(ValueError, match="equally long"):
        cufold.sum((to_device(np.zeros(5, np.float32)), cufold.counting(6)))
    with pytest.raises(TypeError, match="bool"):
        cufold.counting(5, dtype=np.bool_)


# --- shortcuts -------------------------------------------------------------------------------

@pytest.mark.parametrize("dts", [(np.float32, np.float32), (np.float32, np.float64), (np.int32, np.int32),
                                 (np.int8, np.int16), (np.bool_, np.bool_)])
def test_dot(rng, dts):
    a = rng.integers(-20, 20, N).astype(dts[0]) if dts[0] != np.float32 else rng.standard_normal(N).astype(dts[0])
    b = rng.integers(-20, 20, N).astype(dts[1]) if dts[1] not in (np.float32, np.float64) \
        else rng.standard_normal(N).astype(dts[1])
    got = to_host(cufold.dot(to_device(a), to_device(b)))
    res = np.result_type(a, b)
    assert got.dtype == (np.int64 if res == np.bool_ else res)
    ref = np.dot(a.astype(np.float64), b.astype(np.float64))
    if got.dtype.kind == "f":
        close(got, ref, rtol=1e-4, atol=1e-4)
    else:
        assert got[()] == np.dot(a.astype(got.dtype), b.astype(got.dtype))


def test_dot_out_and_errors(rng):
    a = rng.standard_normal(N).astype(np.float64)
    out = poisoned((), np.float64)
    assert cufold.dot(to_device(a), to_device(a), out=out) is out
    close(to_host(out), a @ a, rtol=1e-12)
    with pytest.raises(ValueError, match="equally shaped"):
        cufold.dot(to_device(a), to_device(a[:-1]))
    m = rng.standard_normal((7, 9))
    with pytest.raises(ValueError, match="cufold: dot takes 1-D arrays; got shapes"):
        cufold.dot(to_device(m), to_device(m))          # numpy.dot: a matrix product
    close(to_host(cufold.vdot(to_device(m), to_device(m * 2))), np.vdot(m, m * 2), rtol=1e-12)
    close(to_host(cufold.vdot(to_device(m.T), to_device(m.T))), np.vdot(m.T, m.T), rtol=1e-12)
    with pytest.raises(TypeError, match="cufold: vdot of complex arrays"):
        cufold.vdot(to_device(m.astype(np.complex128)), to_device(m.astype(np.complex128)))


@pytest.mark.parametrize("n", [N + 1, 129])
def test_zipped_4_byte_fields_read_in_pairs(rng, n):
    """Tuple inputs of 4-byte fields are read 8 bytes a load (odd lengths: the last item alone)."""
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    close(to_host(cufold.dot(to_device(a), to_device(b))), np.dot(a.astype(np.float64), b), rtol=1e-4)
    i = rng.integers(-9, 9, n).astype(np.int32)
    got = cufold.reduce(to_device((i, i, i)), transform=lambda t: t[0] * t[1] + t[2])
    assert to_host(got)[()] == (i.astype(np.int64) ** 2 + i).sum()


@pytest.mark.parametrize("ord", [2, 1, np.inf, -np.inf, 0, 3])
def test_norm_vector(rng, ord):
    h = rng.standard_normal(N).astype(np.float32)
    got = to_host(cufold.norm(to_device(h), ord))
    assert got.dtype == np.float32
    close(got, np.linalg.norm(h.astype(np.float64), ord), rtol=1e-5)


@pytest.mark.parametrize("axis,keepdims", [(0, False), (-1, True), ((0, 1), False)])
def test_norm_axes(rng, axis, keepdims):
    h = rng.integers(-9, 9, SHAPE).astype(np.int32)
    got = to_host(cufold.norm(to_device(h), axis=axis, keepdims=keepdims))
    ref = np.sqrt((h.astype(np.float64) ** 2).sum(axis=axis, keepdims=keepdims))
    assert got.dtype == np.float64 and got.shape == ref.shape
    close(got, ref, rtol=1e-12)
    with pytest.raises(ValueError, match="ord"):
        cufold.norm(to_device(h[0]), ord="fro")
    # numpy.linalg.norm's matrix norms (an ord over two axes) are refused, not replaced
    for ord_, ax in [(1, None), (2, (0, 1)), (np.inf, None), ("fro", None)]:
        with pytest.raises(ValueError, match="is a matrix norm in numpy.linalg.norm"):
            cufold.norm(to_device(h), ord_, axis=ax)
    close(to_host(cufold.norm(to_device(h), 1, axis=1)), np.linalg.norm(h.astype(np.float64), 1, axis=1),
          rtol=1e-12)


def test_logsumexp(rng):
    h = (rng.standard_normal(N) * 30).astype(np.float32)
    ref = np.log(np.exp(h.astype(np.float64) - h.max()).sum()) + h.max()
    close(to_host(cufold.logsumexp(to_device(h))), ref, rtol=1e-5)
    x = rng.standard_normal(SHAPE)
    for axis in (0, 2, (1, 2)):
        got = to_host(cufold.logsumexp(to_device(x), axis=axis, keepdims=True))
        close(got, np.log(np.exp(x).sum(axis=axis, keepdims=True)), rtol=1e-12)


@pytest.mark.parametrize("case,ref", [([1000, 1000, -np.inf], 1000 + np.log(2)), ([np.inf, np.inf, 1], np.inf),
                                      ([-np.inf, -np.inf], -np.inf), ([1, np.nan, 2], np.nan),
                                      ([], -np.inf), ([5], 5.0)])
def test_logsumexp_edges(case, ref):
    got = to_host(cufold.logsumexp(to_device(np.array(case, np.float32))))
    np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_count_nonzero(rng):
    h = rng.integers(-2, 3, SHAPE).astype(np.float32)
    h[0, 0, 0] = np.nan
    d = to_device(h)
    assert to_host(cufold.count_nonzero(d))[()] == np.count_nonzero(h)
    for axis in (0, (1, 2)):
        got = to_host(cufold.count_nonzero(d, axis=axis))
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.count_nonzero(h, axis=axis))


def test_all_any(rng):
    h = (rng.random(SHAPE) < 0.9).astype(np.int16)
    d = to_device(h)
    for f, ref in ((cufold.all, np.all), (cufold.any, np.any)):
        assert to_host(f(d))[()] == ref(h)
        for axis in (0, 2, (0, 1)):
            got = to_host(f(d, axis=axis, keepdims=True))
            assert got.dtype == np.bool_
            np.testing.assert_array_equal(got, ref(h, axis=axis, keepdims=True))
    assert to_host(cufold.all(to_device(np.ones(N, np.float32))))[()]
    assert not to_host(cufold.any(to_device(np.zeros(N, np.float32))))[()]
    assert to_host(cufold.any(to_device(np.array([0, np.nan], np.float32))))[()]   # NaN is true
    e = to_device(np.zeros(0, np.float32))
    assert to_host(cufold.all(e))[()] and not to_host(cufold.any(e))[()]


# --- clear errors, caching ----------------------------------------------------------------------

def test_errors_name_the_function():
    d = to_device(np.ones(8, np.float32))

    def takes_a_field(v):
        return v[0]

    with pytest.raises(TypeError, match="transform function takes_a_field does not compile.*float32"):
        cufold.sum(d, transform=takes_a_field)

    def bad_post(s):
        return s.nothing

    with pytest.raises(TypeError, match="post function bad_post does not compile"):
        cufold.sum(d, post=bad_post)
    with pytest.raises(TypeError, match="function of one value"):
        cufold.sum(d, transform=lambda a, b: a)

    def two(v):
        return (v, v)

    with pytest.raises(TypeError, match="argmax reduces single values.*two"):
        cufold.argmax(d, transform=two)
    with pytest.raises(TypeError, match="transform two"):
        cufold.reduce(d, cufold.Op(lambda a, b: a[0] + b[0]), transform=two)

    with pytest.raises(ValueError, match="gpu_to_gpu"):           # a tuple is not a reproducible sum
        cufold.sum(d, transform=two, deterministic="gpu_to_gpu")
    with pytest.raises(ValueError, match="gpu_to_gpu"):
        cufold.segmented_reduce(d, to_device(np.array([0, 8])), transform=two, deterministic="gpu_to_gpu")

    def text(v):
        return "x"

    with pytest.raises(TypeError, match="text returns"):
        cufold.sum(d, transform=text)


def test_kernels_cached_by_function():
    from cufold import device
    d = to_device(np.arange(100, dtype=np.float32))
    before = len(device._SUM.programs)
    a = to_host(cufold.sum(d, transform=square))
    b = to_host(cufold.sum(d, transform=square))
    assert a == b == (np.arange(100.0) ** 2).sum()
    assert len(device._SUM.programs) == before + 1
    assert to_host(cufold.sum(d, transform=lambda v: v + 1))[()] == np.arange(100.0).sum() + 100
    t = as_transform(square)
    assert t is as_transform(square) and t.fingerprint() is not None
    assert as_transform(abs).fingerprint() is not None


# --- scans, segmented reductions, reductions by key -----------------------------------------------

@pytest.mark.parametrize("algorithm", ["single_pass", "reduce_then_scan", "single_block"])
def test_scans_with_transform_and_generated(rng, algorithm):
    h = rng.integers(-9, 9, N).astype(np.int32)
    d = to_device(h)
    got = to_host(cufold.inclusive_scan(d, transform=square, algorithm=algorithm))
    np.testing.assert_array_equal(got, np.cumsum(h.astype(np.int64) ** 2))
    got = to_host(cufold.exclusive_scan(cufold.counting(N, 3), algorithm=algorithm))
    np.testing.assert_array_equal(got, np.concatenate([[0], np.cumsum(np.arange(3, N + 2))]))
    v, i = cufold.inclusive_scan((d, cufold.counting(N)), cufold.argmax, algorithm=algorithm)
    np.testing.assert_array_equal(to_host(v), np.maximum.accumulate(h))
    np.testing.assert_array_equal(to_host(i), [np.argmax(h[:j + 1]) for j in range(N)])


def test_cumulative_shortcuts_with_transform(rng):
    h = rng.standard_normal(N).astype(np.float32)
    d = to_device(h)
    np.testing.assert_array_equal(to_host(cufold.cummax(d, transform=abs)), np.maximum.accumulate(np.abs(h)))
    close(to_host(cufold.cumsum(d, transform=square)), np.cumsum(h.astype(np.float64) ** 2), rtol=1e-4)
    np.testing.assert_array_equal(to_host(cufold.cumsum(cufold.constant(7, 2, np.int8))), 2 * np.arange(1, 8))


def test_segmented_reduce_with_transform_and_generated(rng):
    h = rng.standard_normal(N).astype(np.float32)
    off = np.concatenate([[0, 0], np.sort(rng.integers(0, N, 9)), [N]]).astype(np.int64)
    doff = to_device(off)
    got = to_host(cufold.segmented_reduce(to_device(h), doff, transform=square))
    close(got, [(h[a:b].astype(np.float64) ** 2).sum() for a, b in zip(off[:-1], off[1:])], rtol=1e-5)
    got = to_host(cufold.segmented_reduce(cufold.counting(N), doff, cufold.maximum, init=-1))
    np.testing.assert_array_equal(got, [b - 1 if b > a else -1 for a, b in zip(off[:-1], off[1:])])


def test_reduce_by_key_with_transform_and_counting(rng):
    keys = np.sort(rng.integers(0, 30, N)).astype(np.int32)
    h = rng.integers(-9, 9, N).astype(np.int32)
    uk, t = cufold.reduce_by_key(to_device(keys), to_device(h), transform=square)
    u = np.unique(keys)
    np.testing.assert_array_equal(to_host(uk), u)
    np.testing.assert_array_equal(to_host(t), [(h[keys == k].astype(np.int64) ** 2).sum() for k in u])
    _, first = cufold.reduce_by_key(to_device(keys), cufold.counting(N), cufold.minimum)
    np.testing.assert_array_equal(to_host(first), np.searchsorted(keys, u))


@pytest.mark.parametrize("algorithm", [None, "atomic", "warp", "adaptive", "table"])
def test_reduce_by_key_into_first_occurrences_and_transform(rng, algorithm):
    m = 40
    keys = rng.integers(0, m, N).astype(np.int32)
    first = cuda.to_device(np.full(m, np.iinfo(np.int64).max, np.int64))
    cufold.reduce_by_key_into(to_device(keys), cufold.counting(N), first, cufold.minimum, algorithm=algorithm)
    np.testing.assert_array_equal(to_host(first), [np.nonzero(keys == k)[0][0] for k in range(m)])
    h = rng.standard_normal(N).astype(np.float32)
    out = cuda.to_device(np.zeros(m, np.float64))
    cufold.reduce_by_key_into(to_device(keys), to_device(h), out, transform=square, algorithm=algorithm)
    ref = np.zeros(m)
    np.add.at(ref, keys, h.astype(np.float64) ** 2)
    close(to_host(out), ref, rtol=1e-5)


def test_reduce_by_key_into_deterministic_transform_and_errors(rng):
    keys = rng.integers(0, 20, N).astype(np.int32)
    h = rng.standard_normal(N).astype(np.float32)
    out = cuda.to_device(np.zeros(20, np.float64))
    cufold.reduce_by_key_into(to_device(keys), to_device(h), out, transform=abs, deterministic=True)
    ref = np.zeros(20)
    np.add.at(ref, keys, np.abs(h.astype(np.float64)))
    close(to_host(out), ref, rtol=1e-9)
    with pytest.raises(ValueError, match="needs them stored"):
        cufold.reduce_by_key_into(to_device(keys), cufold.constant(N, 1.0), out, deterministic=True)
    with pytest.raises(TypeError, match="single values"):
        cufold.reduce_by_key_into(to_device(keys), to_device(h), out, transform=lambda v: (v, v))
    with pytest.raises(TypeError, match="same_kind"):
        cufold.reduce_by_key_into(to_device(keys), to_device(h), cuda.to_device(np.zeros(20, np.int64)),
                                  transform=square)


def test_segmented_scans_with_transform_and_generated(rng):
    h = rng.integers(-9, 9, N).astype(np.int32)
    off = np.concatenate([[0, 0], np.sort(rng.integers(0, N, 7)), [N]]).astype(np.int64)
    got = to_host(cufold.segmented_scan(to_device(h), to_device(off), transform=square))
    ref = np.concatenate([np.cumsum(h[a:b].astype(np.int64) ** 2) for a, b in zip(off[:-1], off[1:])])
    np.testing.assert_array_equal(got, ref)
    got = to_host(cufold.segmented_scan(cufold.counting(N), to_device(off), exclusive=True))
    ref = np.concatenate([np.concatenate([[0], np.cumsum(np.arange(a, b))[:-1]]) if b > a else []
                          for a, b in zip(off[:-1], off[1:])])
    np.testing.assert_array_equal(got, ref)
    keys = np.sort(rng.integers(0, 9, N)).astype(np.int32)
    got = to_host(cufold.inclusive_scan_by_key(to_device(keys), to_device(h), cufold.maximum, transform=abs))
    ref = np.concatenate([np.maximum.accumulate(np.abs(h[keys == k])) for k in np.unique(keys)])
    np.testing.assert_array_equal(got, ref)


def test_scan_transform_reversed_and_along_axes(rng):
    """(Every axis layout: tests/test_scan_transform.py.)"""
    h = rng.integers(-9, 9, N).astype(np.int32)
    got = to_host(cufold.inclusive_scan(to_device(h), transform=square, reverse=True))
    np.testing.assert_array_equal(got, np.cumsum((h.astype(np.int64) ** 2)[::-1])[::-1])
    got = to_host(cufold.cumsum(to_device(h.reshape(-1, 8)), axis=1, transform=square))
    np.testing.assert_array_equal(got, np.cumsum(h.reshape(-1, 8).astype(np.int64) ** 2, axis=1))
    got = to_host(cufold.cumsum(cufold.counting(10), reverse=True))
    np.testing.assert_array_equal(got, np.cumsum(np.arange(10)[::-1])[::-1])


def test_result_type_when_typing_alone_fails(monkeypatch):
    """Where Numba's typing without its rewrites fails (Python 3.12: ``v[0]`` of a tuple of
    mixed types), the result type comes from a CPU compile; a function that does not
    compile at all still gets the clear error."""
    from numba.core import compiler
    from cufold.values import ValueType

    def no_typing(*args, **kwargs):
        raise TypeError("No implementation of function getitem")

    monkeypatch.setattr(compiler, "run_frontend", no_typing)      # the typing-only path

    def mixed_product(v):
        return np.float64(v[0]) * np.float64(v[1])

    t = as_transform(mixed_product)
    assert t.result_type(ValueType.of((np.float32, np.float64))) == ValueType.of(np.float64)

    def takes_a_field(v):
        return v[0]
    with pytest.raises(TypeError, match="transform function takes_a_field does not compile"):
        as_transform(takes_a_field).result_type(ValueType.of(np.float32))


# --- feature rows: the transform applies per item (each feature of a row) ----------------------

@pytest.mark.parametrize("F", [1, 5, 40])
def test_feature_rows_segmented_and_runs_with_transform(rng, F):
    n = 150
    v = rng.standard_normal((n, F)).astype(np.float32)
    dv = to_device(v)
    off = np.array([0, 3, 3, 70, 120, n])
    got = to_host(cufold.segmented_reduce(dv, to_device(off), transform=abs))
    assert got.shape == (5, F) and got.dtype == np.float32
    close(got, [np.abs(v[a:b].astype(np.float64)).sum(0) for a, b in zip(off[:-1], off[1:])])
    got = to_host(cufold.segmented_reduce(dv, to_device(off), cufold.maximum, init=-1.0, transform=square))
    close(got, [(v[a:b].astype(np.float64) ** 2).max(0, initial=-1.0) for a, b in zip(off[:-1], off[1:])])
    keys = np.sort(rng.integers(0, 12, n)).astype(np.int64)
    uk, t = cufold.reduce_by_key(to_device(keys), dv, transform=square)
    u = np.unique(keys)
    np.testing.assert_array_equal(to_host(uk), u)
    close(to_host(t), [(v[keys == k].astype(np.float64) ** 2).sum(0) for k in u])


@pytest.mark.parametrize("F,deterministic", [(1, False), (6, False), (6, True), (36, False)])
def test_feature_rows_reduce_by_key_into_with_transform(rng, F, deterministic):
    n, m = 200, 15
    keys = rng.integers(0, m, n).astype(np.int32)
    v = rng.integers(-50, 50, (n, F)).astype(np.int32)
    out = cuda.to_device(np.full((m, F), 1.0))
    strided = to_device(np.asfortranarray(v))          # any strides: the kernels index flat memory
    cufold.reduce_by_key_into(to_device(keys), strided, out, transform=lambda x: x * 0.5,
                              deterministic=deterministic)
    ref = np.ones((m, F))
    np.add.at(ref, keys, v * 0.5)
    np.testing.assert_array_equal(to_host(out), ref)      # halves of integers: exact in float64


def test_feature_rows_transform_errors(rng):
    v = to_device(np.ones((10, 3), np.float32))
    with pytest.raises(TypeError, match="transform _two.*feature rows"):
        cufold.segmented_reduce(v, to_device(np.array([0, 10])), transform=_two)
    with pytest.raises(TypeError, match="transform _two.*feature rows"):
        cufold.reduce_by_key(to_device(np.zeros(10, np.int32)), v, transform=_two)
    with pytest.raises(TypeError, match="transform _two.*reduce_by_key_into"):
        cufold.reduce_by_key_into(to_device(np.zeros(10, np.int32)), v, cuda.to_device(np.zeros((2, 3))),
                                  transform=_two)
    with pytest.raises(TypeError, match="same_kind"):
        cufold.reduce_by_key_into(to_device(np.zeros(10, np.int32)), v,
                                  cuda.to_device(np.zeros((2, 3), np.int64)), transform=square)


def _two(v):
    return (v, v)


# --- tuple values by key: the transform takes the zipped items, returns the operator's value ----

def _product_and_first(v):
    return (v[0] * v[1], v[0])


@pytest.mark.parametrize("algorithm", [None, "warp", "atomic", "grouped"])
def test_tuple_by_key_with_transform(rng, algorithm):
    n, m = 600, 23
    keys = rng.integers(0, m, n).astype(np.int32)
    x, y = rng.standard_normal(n), rng.standard_normal(n).astype(np.float32)
    out = (cuda.to_device(np.full(m, 0.5)), cuda.to_device(np.full(m, -1.0)))
    got = cufold.reduce_by_key_into(to_device(keys), to_device((x, y)), out, transform=_product_and_first,
                                    algorithm=algorithm)
    assert got is out
    r0, r1 = np.full(m, 0.5), np.full(m, -1.0)
    np.add.at(r0, keys, x * y.astype(np.float64))
    np.add.at(r1, keys, x)
    close(to_host(out[0]), r0, rtol=1e-12, atol=1e-12)
    close(to_host(out[1]), r1, rtol=1e-12, atol=1e-12)


def test_tuple_by_key_sorted_cas_and_argmax_of_a_transform(rng):
    n, m = 500, 19
    keys = np.sort(rng.integers(0, m, n)).astype(np.int32)
    x = rng.standard_normal(n)
    # sorted keys: the segments kernel fuses the transform (deterministic, in order)
    out = (cuda.to_device(np.zeros(m)), cuda.to_device(np.zeros(m)))
    cufold.reduce_by_key_into(to_device(keys), to_device(x), out, transform=lambda v: (v, v * v),
                              algorithm="sorted", deterministic=True)
    r0, r1 = np.zeros(m), np.zeros(m)
    np.add.at(r0, keys, x)
    np.add.at(r1, keys, x * x)
    close(to_host(out[0]), r0, rtol=1e-12, atol=1e-12)
    close(to_host(out[1]), r1, rtol=1e-12, atol=1e-12)
    # argmax of |x| by key with positions from counting: 64-bit values take cas, wider grouped
    shuffled = rng.permutation(keys)
    x32 = x.astype(np.float32)
    for val_dt, pos_dt, algorithm in ((np.float32, np.int32, "cas"), (np.float64, np.int64, None)):
        best = (cuda.to_device(np.full(m, -np.inf, val_dt)), cuda.to_device(np.full(m, -1, pos_dt)))
        vals = (to_device(x32 if val_dt == np.float32 else x), cufold.counting(n, dtype=pos_dt))
        cufold.reduce_by_key_into(to_device(shuffled), vals, best, cufold.argmax, algorithm=algorithm,
                                  transform=lambda v: (abs(v[0]), v[1]))
        a = np.abs(x32 if val_dt == np.float32 else x)
        want = [np.flatnonzero(shuffled == k)[np.argmax(a[shuffled == k])] for k in range(m)]
        np.testing.assert_array_equal(to_host(best[1]), want)
        np.testing.assert_array_equal(to_host(best[0]), a[want])


def test_tuple_by_key_generated_fields_and_errors(rng):
    n, m = 400, 11
    keys = rng.integers(0, m, n).astype(np.int32)
    x = rng.standard_normal(n)
    out = (cuda.to_device(np.zeros(m)), cuda.to_device(np.zeros(m, np.int64)))
    cufold.reduce_by_key_into(to_device(keys), (to_device(x), cufold.constant(n, 1)), out)   # sums and counts
    r0 = np.zeros(m)
    np.add.at(r0, keys, x)
    close(to_host(out[0]), r0, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(to_host(out[1]), np.bincount(keys, minlength=m))
    first = (cuda.to_device(np.full(m, np.iinfo(np.int64).max)),)
    cufold.reduce_by_key_into(to_device(keys), (cufold.counting(n),), first, cufold.minimum, algorithm="grouped")
    np.testing.assert_array_equal(to_host(first[0]), [np.flatnonzero(keys == k)[0] for k in range(m)])

    def only_one(v):
        return v[0] * v[1]

    with pytest.raises(TypeError, match="transform only_one returns float64 .1 field.*out has 2"):
        cufold.reduce_by_key_into(to_device(keys), to_device((x, x)), out, transform=only_one)
    with pytest.raises(TypeError, match="same_kind"):
        cufold.reduce_by_key_into(to_device(keys), to_device((x, x)), out, transform=lambda v: (v[0], v[1]))
    with pytest.raises(ValueError, match="generated values"):
        cufold.reduce_by_key_into(to_device(keys), cufold.counting(n, dtype=np.float64),
                                  (cuda.to_device(np.zeros(m)), cuda.to_device(np.zeros(m, np.int64))),
                                  cufold.argmax)
