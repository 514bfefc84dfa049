"""transform= and generated inputs on scans along an axis, reversed, strided and zipped
(issue #20 on cufold.device.scan_axis): every layout the planner picks (segments,
lanes, tiles with one tile a row and with look-backs, columns with and without chunks,
the gather fallback, a flat row), forwards and reversed, against NumPy in float64;
tuple inputs zipped into a scalar and into a tuple (a batch of affine recurrences);
the result dtype from what the transform returns; generated inputs reversed; errors.

Items are small integers (or exact binary fractions) so that every reference is exact.
Outputs given with ``out=`` are poisoned first, so an element left unwritten fails.
"""

import itertools

import numpy as np
import pytest
from conftest import SCAN_VIEW_LAYOUTS, strided_view, to_device, to_host
from numba import cuda

import cufold
from cufold.device import scan_axis
from cufold.ops import Op


def square_plus_self(v):
    return v * v + v


def flipped(fn, x, axis, reverse):
    """``fn(x, axis)`` (axis None: of the flattened x), or flip(fn(flip(x))) along the axis."""
    if axis is None:
        x, axis = x.ravel(), 0
    if not reverse:
        return fn(x, axis)
    return np.flip(fn(np.flip(x, axis), axis), axis)


def cumsum64(x, axis):
    return np.cumsum(x.astype(np.float64), axis=axis)


def _kind(x_shape, strides, axis):
    out = tuple(int(np.prod(x_shape[d + 1:])) for d in range(len(x_shape)))
    lay = scan_axis.plan_layout(x_shape, strides, out, axis, False)
    return "gather" if lay is None else lay.kind


LAYOUTS = SCAN_VIEW_LAYOUTS


@pytest.mark.parametrize("view,axis,kind", LAYOUTS, ids=[k for _, _, k in LAYOUTS])
def test_cumsum_transform_every_layout(rng, view, axis, kind):
    offset, shape, strides = view
    assert _kind(shape, strides, axis) == kind
    base = rng.integers(-9, 9, 2400).astype(np.float32)
    d, x = strided_view(base, offset, shape, strides)
    for reverse in (False, True):
        got = to_host(cufold.cumsum(d, axis=axis, reverse=reverse, transform=square_plus_self))
        want = flipped(cumsum64, x.astype(np.float64) ** 2 + x, axis, reverse)
        assert got.dtype == np.float32 and got.shape == x.shape
        np.testing.assert_array_equal(got, want, err_msg="%s reverse=%s" % (kind, reverse))


def test_whole_array_of_views_with_transform(rng):
    """axis=None of a non-contiguous N-D view: gathered (transformed on the way), then scanned."""
    base = rng.integers(-9, 9, 2400).astype(np.int32)
    d, x = strided_view(base, 0, (33, 7), (1, 33))                # transposed
    for reverse in (False, True):
        got = to_host(cufold.cumsum(d, reverse=reverse, transform=abs))
        np.testing.assert_array_equal(got, flipped(np.cumsum, np.abs(x).astype(np.int64), None, reverse))
        assert got.dtype == np.int64


def test_one_tile_rows(rng, monkeypatch):
    """Rows of one tile each: the tiles kernel without look-backs."""
    monkeypatch.setenv("CUFOLD_TILE", "64x8")                      # 512 items a tile
    assert scan_axis.row_tile(cufold.ValueType.of(np.int32), cufold.ValueType.of(np.int64), 300).nt * 8 >= 300
    x = rng.integers(-9, 9, (3, 300)).astype(np.int32)
    for reverse in (False, True):
        got = to_host(cufold.cummax(to_device(x), axis=1, reverse=reverse, transform=lambda v: -v))
        np.testing.assert_array_equal(got, flipped(lambda a, ax: np.maximum.accumulate(a, axis=ax), -x, 1, reverse))


def test_shortcuts_exclusive_init_and_out(rng):
    x = rng.integers(-4, 5, (9, 40)).astype(np.int32)
    d = to_device(x)
    for axis in (0, 1):
        out = cuda.to_device(np.full(x.shape, -777777, np.int64))
        got = cufold.exclusive_scan(d, init=100, axis=axis, out=out, transform=lambda v: v * v)
        assert got is out
        sq = x.astype(np.int64) ** 2
        np.testing.assert_array_equal(to_host(out), 100 + np.cumsum(sq, axis=axis) - sq)
        got = to_host(cufold.cumprod(d, axis=axis, transform=lambda v: 1 if v >= 0 else -1))
        np.testing.assert_array_equal(got, np.cumprod(np.where(x >= 0, 1, -1), axis=axis))
        got = to_host(cufold.cummin(d, axis=axis, reverse=True, transform=abs))
        np.testing.assert_array_equal(got, flipped(lambda a, ax: np.minimum.accumulate(a, axis=ax), np.abs(x),
                                                   axis, True))


def test_result_dtype_follows_the_transform(rng):
    x = rng.integers(-9, 9, (6, 40)).astype(np.int32)
    got = to_host(cufold.cumsum(to_device(x), axis=1, transform=lambda v: v * 0.5))      # float64 items
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.cumsum(x * 0.5, axis=1))
    got = to_host(cufold.cummax(to_device(x), axis=0, transform=lambda v: np.int8(v)))
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, np.maximum.accumulate(x.astype(np.int8), axis=0))


# --- tuple inputs: zipped --------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis", [((20, 16), 1), ((3, 300), 1), ((300, 3), 0), ((6, 40), 0)])
def test_zipped_product(rng, shape, axis):
    x = rng.integers(-5, 5, shape).astype(np.float32)
    y = rng.integers(-5, 5, shape).astype(np.int32)
    d = to_device((x, y))
    for reverse in (False, True):
        got = to_host(cufold.cumsum(d, axis=axis, reverse=reverse, transform=lambda t: t[0] * t[1]))
        want = flipped(cumsum64, x.astype(np.float64) * y, axis, reverse)
        assert got.dtype == np.float64                            # float32 * int32
        np.testing.assert_array_equal(got, want)


def _affine(p, q):
    return (p[0] * q[0], p[1] * q[0] + q[1])


AFFINE = Op(_affine, name="affine")


def affine_loop(a, b, axis, reverse):
    a, b = np.moveaxis(a, axis, -1), np.moveaxis(b, axis, -1)
    ra, rb = np.empty(a.shape), np.empty(b.shape)
    order = range(a.shape[-1] - 1, -1, -1) if reverse else range(a.shape[-1])
    for idx in np.ndindex(a.shape[:-1]):
        acc = None
        for i in order:
            item = (float(a[idx + (i,)]), float(b[idx + (i,)]))
            acc = item if acc is None else _affine(acc, item)
            ra[idx + (i,)], rb[idx + (i,)] = acc
    return np.moveaxis(ra, -1, axis), np.moveaxis(rb, -1, axis)


@pytest.mark.parametrize("shape,axis", [((20, 16), -1), ((6, 20), -1), ((3, 300), -1), ((40, 4), 0)])
def test_batch_of_affine_recurrences_from_a_transform(rng, shape, axis):
    """The issue's example: ``inclusive_scan((a, x), affine, axis=-1, transform=lambda ab: (ab[0], ab[1] * 2))``."""
    a = rng.choice(np.array([-1.0, 1.0]), shape)                  # exact in float64
    x = rng.integers(-3, 4, shape).astype(np.float64)
    d = to_device((a, x))
    if shape == (6, 20):                                          # strided rows: lanes
        d = tuple(to_device(np.repeat(v, 2, axis=1))[:, ::2] for v in (a, x))
    for reverse in (False, True):
        got = to_host(cufold.inclusive_scan(d, AFFINE, axis=axis, reverse=reverse,
                                            transform=lambda ab: (ab[0], ab[1] * 2)))
        want = affine_loop(a, 2 * x, axis % 2, reverse)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_tuple_in_tuple_out_transform_against_float64(rng):
    """(a, x) float32 -> (a, x * 2) (float32, float64): the result dtypes follow the transform."""
    a = rng.uniform(0.5, 1.0, (4, 70)).astype(np.float32)
    x = rng.uniform(-1, 1, (4, 70)).astype(np.float32)
    ga, gh = to_host(cufold.inclusive_scan(to_device((a, x)), AFFINE, axis=1, transform=lambda ab: (ab[0], ab[1] * 2)))
    assert ga.dtype == np.float32 and gh.dtype == np.float64
    want, h = np.empty((4, 70)), np.zeros(4)
    for i in range(70):
        h = a[:, i].astype(np.float64) * h + 2 * x[:, i].astype(np.float64)
        want[:, i] = h
    np.testing.assert_allclose(gh, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("view,axis,kind", LAYOUTS, ids=[k for _, _, k in LAYOUTS])
def test_affine_h_only_from_a_transform_every_layout(rng, view, axis, kind):
    """``out=(None, h)`` with the transform fused into the loads: ``h`` of ``h = a*h + 2x``
    (the pair a transform makes of the inputs), every layout, forwards and reversed."""
    offset, shape, strides = view
    assert _kind(shape, strides, axis) == kind
    da, a = strided_view(rng.choice(np.array([-1.0, 1.0]), 2400), offset, shape, strides)
    dx, x = strided_view(rng.integers(-3, 4, 2400).astype(np.float64), offset, shape, strides)
    for reverse in (False, True):
        h = cuda.to_device(np.full(shape, -7777.0))
        got = cufold.inclusive_scan((da, dx), AFFINE, axis=axis, reverse=reverse, out=(None, h),
                                    transform=lambda ab: (ab[0], ab[1] * 2))
        assert got[0] is None and got[1] is h
        np.testing.assert_array_equal(to_host(h), affine_loop(a, 2 * x, axis, reverse)[1],
                                      err_msg="%s reverse=%s" % (kind, reverse))


def test_affine_h_only_of_generated_coefficients(rng):
    """A constant coefficient (no memory) and ``h`` only: ``h = 0.5 h + b``."""
    b = rng.integers(-8, 8, 300).astype(np.float32)
    h = cuda.to_device(np.full(300, -7777.0, np.float32))
    for reverse in (False, True):
        cufold.inclusive_scan((cufold.constant(300, 0.5, np.float32), to_device(b)), AFFINE, reverse=reverse,
                              out=(None, h))
        want = affine_loop(np.full(300, 0.5), b.astype(np.float64), 0, reverse)[1]
        np.testing.assert_allclose(to_host(h), want, rtol=1e-5, atol=1e-5)       # float32 against float64


# --- generated inputs -------------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["single_pass", "reduce_then_scan", "single_block"])
def test_generated_inputs_reversed(algorithm):
    n = 300
    got = to_host(cufold.cumsum(cufold.counting(n, 5), reverse=True, algorithm=algorithm))
    np.testing.assert_array_equal(got, np.cumsum(np.arange(5, n + 5)[::-1])[::-1])
    got = to_host(cufold.exclusive_scan(cufold.counting(n, -7, np.int32), reverse=True, algorithm=algorithm,
                                        transform=lambda i: i * i))
    sq = np.arange(-7, n - 7, dtype=np.int64) ** 2
    np.testing.assert_array_equal(got, (np.cumsum(sq[::-1])[::-1] - sq).astype(np.int32))
    v, i = to_host(cufold.inclusive_scan((cufold.constant(n, 2.0), cufold.counting(n)), cufold.argmax,
                                         reverse=True, algorithm=algorithm,
                                         transform=lambda t: (t[0] * (t[1] % 7), t[1])))
    vals = 2.0 * (np.arange(n) % 7)
    np.testing.assert_array_equal(v, np.maximum.accumulate(vals[::-1])[::-1])
    np.testing.assert_array_equal(vals[i], v)                      # where each maximum came from


@pytest.mark.filterwarnings("ignore::RuntimeWarning")              # the simulator's int8 wrap-arounds
def test_generated_inputs_wrap_and_axes(rng):
    got = to_host(cufold.inclusive_scan(cufold.counting(300, 100, np.int8), reverse=True))
    items = np.arange(100, 400).astype(np.int8)                    # counting wraps, as NumPy's astype
    np.testing.assert_array_equal(got, np.cumsum(items[::-1], dtype=np.int8)[::-1])
    got = to_host(cufold.cumsum(cufold.counting(50), axis=0, reverse=True))      # 1-D: axis 0 or -1
    np.testing.assert_array_equal(got, np.cumsum(np.arange(50)[::-1])[::-1])
    x = rng.integers(-9, 9, 50).astype(np.float32)
    got = to_host(cufold.cumsum((to_device(x), cufold.counting(50)), axis=-1, reverse=True,
                                transform=lambda t: t[0] * t[1]))
    np.testing.assert_array_equal(got, np.cumsum((x * np.arange(50))[::-1].astype(np.float64))[::-1])


# --- segmented scans and scans by key: zipped values ---------------------------------------------

def test_segmented_scans_of_zipped_values(rng):
    n = 300
    x = rng.integers(-5, 5, n).astype(np.float32)
    y = rng.integers(-5, 5, n).astype(np.float32)
    off = np.concatenate([[0], np.sort(rng.integers(0, n, 6)), [n]]).astype(np.int64)
    got = to_host(cufold.segmented_scan(to_device((x, y)), to_device(off), transform=lambda t: t[0] * t[1]))
    want = np.concatenate([np.cumsum(x[a:b] * y[a:b]) for a, b in itertools.pairwise(off)])
    np.testing.assert_array_equal(got, want)
    keys = np.repeat(np.arange(len(off) - 1), np.diff(off)).astype(np.int32)
    got = to_host(cufold.exclusive_scan_by_key(to_device(keys), (to_device(x), cufold.counting(n)),
                                               transform=lambda t: t[0] * t[1]))
    prod = x.astype(np.float64) * np.arange(n)
    want = np.concatenate([np.cumsum(prod[a:b]) - prod[a:b] for a, b in itertools.pairwise(off)])
    np.testing.assert_array_equal(got, want)


# --- errors -----------------------------------------------------------------------------------------

def test_errors():
    d = to_device(np.zeros((3, 40), np.float32))
    pair = to_device((np.ones((3, 40)), np.ones((3, 40))))
    with pytest.raises(TypeError, match="transform function no_field does not compile"):
        def no_field(v):
            return v.foo
        cufold.cumsum(d, axis=1, transform=no_field)
    with pytest.raises(TypeError, match="transform= must be a function of one value"):
        cufold.cumsum(d, axis=0, transform=lambda u, v: u)
    with pytest.raises(TypeError, match="operator affine cannot combine"):          # a scalar for a pair
        cufold.inclusive_scan(pair, AFFINE, axis=1, transform=lambda ab: ab[0] * ab[1])
    with pytest.raises(TypeError, match="operator affine must return a value of type"):   # three fields
        cufold.inclusive_scan(pair, AFFINE, axis=1, transform=lambda ab: (ab[0], ab[1], ab[1]))
    with pytest.raises(ValueError, match="generated inputs .* are 1-D"):
        cufold.cumsum((d, cufold.counting(120)), axis=1, transform=lambda t: t[0] * t[1])
    with pytest.raises(np.exceptions.AxisError):
        cufold.cumsum(cufold.counting(10), axis=1)
    with pytest.raises(ValueError, match="reversed scan of a floating-point counting"):
        cufold.cumsum(cufold.counting(10, 0.5, np.float32), reverse=True)


# --- the bench row (python -m cufold bench scan-axes --cases cumsum-square) -------------------------

def test_bench_transformed_cumsum_row():
    from cufold.bench import scan_axes as B
    assert B.cases({"cumsum-square"}) == (("cumsum-square", (4096, 4096), 1, False),)

    def results(transformed_us):
        row = {"kind": "cumsum-square", "shape": [4096, 4096], "axis": 1, "reverse": False, "plan": "tiles",
               "floor_us": 30.0, "cufold": {"status": "ok", "gpu_us": transformed_us},
               "plain": {"status": "ok", "gpu_us": 40.0}, "torch": {"status": "ok", "gpu_us": 90.0}}
        res = {"meta": {"device": {"name": "H200"}, "copy_GBps": 4200.0}, "records": [row]}
        res["targets_evaluated"] = B.evaluate(res)
        return res

    def status(res):
        return [t["status"] for t in res["targets_evaluated"] if "transformed" in t["name"]]
    assert status(results(41.0)) == ["PASS"] and status(results(41.5)) == ["MISS"]     # 3% of 40 us
    text = B.format_results(results(41.0))
    assert "cumsum-square 4096x4096 axis=1" in text and "plain cumsum (no transform) 40.0 us" in text
