"""Scans along an axis and in reverse (cufold.device.scan_axis through the public
scans): NumPy's cumsum / maximum.accumulate along every axis of 2-D and 3-D
arrays and of strided, transposed, permuted and reversed views; every kernel
(lanes, tiles, columns with and without chunks, the gather fallback); reverse
scans against flip(scan(flip(x))); a batch of affine recurrences (tuple values,
not commutative) against a sequential loop; bad axes.

Outputs given with ``out=`` are poisoned first, so an element left unwritten fails.
"""

import numpy as np
import pytest
from conftest import SCAN_VIEW_LAYOUTS, SIMULATOR, strided_view, to_device, to_host
from numba import cuda

import cufold
from cufold.device import scan, scan_axis
from cufold.ops import Op


def flipped(fn, x, axis, reverse):
    """NumPy reference: ``fn(x, axis)``, or flip(fn(flip(x))) along the axis."""
    if not reverse:
        return fn(x, axis)
    ax = 0 if axis is None else axis
    src = x.ravel() if axis is None else x
    return np.flip(fn(np.flip(src, ax), ax), ax)


def np_cumsum(x, axis):
    return np.cumsum(x, axis=axis, dtype=np.float64)


def np_cummax(x, axis):
    return np.maximum.accumulate(x.ravel() if axis is None else x, axis=0 if axis is None else axis)


def layout(kind, lay):
    return lay is not None and lay.kind == kind


# --- the planner ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,strides,axis,kind", [
    ((8, 40), (40, 1), 1, "segments"),
    ((8, 40), (80, 1), 1, "lanes"),            # rows apart: not one run
    ((8, 400), (400, 1), 1, "tiles"),
    ((8, 400), (400, 1), 0, "columns"),
    ((8, 400), (1, 8), 1, "columns"),          # a transposed view: the batch dim is contiguous
    ((8, 400), (1, 8), 0, "lanes"),            # input rows in one run, C-order output rows not
    ((1, 400), (400, 1), 1, "flat"),
    ((3, 4, 5), (20, 5, 1), 1, "columns"),
    ((3, 4, 5), (20, 5, 1), 2, "segments"),
    ((3, 4, 5), (1, 15, 3), 0, "lanes"),       # scanned axis contiguous, two batch groups
])
def test_plan_layout_kinds(shape, strides, axis, kind):
    out = tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))
    lay = scan_axis.plan_layout(shape, strides, out, axis, False)
    assert lay.kind == kind and lay.A * lay.C * lay.L == int(np.prod(shape))


def test_plan_layout_reverse_and_gather():
    lay = scan_axis.plan_layout((4, 10), (20, 1), (10, 1), 1, True)      # rows apart: lanes
    assert lay.kind == "lanes" and lay.inp == (9, (20, -1, 0)) and lay.out == (9, (10, -1, 0))
    lay = scan_axis.plan_layout((4, 10), (10, 1), (10, 1), 1, True)      # one run, walked backwards
    assert lay.kind == "segments" and lay.inp == (39, (0, -1, 0)) and lay.out == (39, (0, -1, 0))
    # four dims permuted so that no two batch dims chain: three groups, gathered first
    assert scan_axis.plan_layout((2, 3, 4, 5), (60, 1, 15, 3), (60, 20, 5, 1), 2, False) is None


# --- cumsum and cummax along every axis of views ----------------------------------------------

# (offset, shape, strides) over a base of 2400 elements.
VIEWS = {
    "c2": (0, (7, 33), (33, 1)),
    "c2_short": (0, (40, 31), (31, 1)),
    "transposed": (0, (33, 7), (1, 33)),
    "strided": (3, (6, 20), (80, 2)),
    "reversed": (2399, (5, 33), (-40, -1)),
    "c3": (0, (3, 5, 33), (165, 33, 1)),
    "permuted": (0, (5, 33, 3), (33, 1, 165)),
    "rows_1": (0, (9, 1), (1, 1)),
    "rows_0": (0, (4, 0), (1, 1)),
    "len_1025": (0, (2, 1025), (1025, 1)),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_cumsum_every_axis(rng, name):
    base = rng.integers(-50, 50, 2400).astype(np.float32)
    offset, shape, strides = VIEWS[name]
    d, x = strided_view(base, offset, shape, strides)
    nd = len(shape)
    axes = list(range(-nd, nd))
    if SIMULATOR:
        # axis and axis - ndim are one scan (scan._scan_axis: axis % ndim): each axis once,
        # odd ones by their negative number (so negative axes still run on every view)
        axes = [a - nd if a % 2 else a for a in range(nd)]
    for axis in [None] + axes:
        for reverse in (False, True):
            got = to_host(cufold.cumsum(d, axis=axis, reverse=reverse))
            want = flipped(np_cumsum, x, axis, reverse)
            assert got.shape == want.shape and got.dtype == np.float32, (name, axis)
            np.testing.assert_array_equal(got, want, err_msg="%s axis=%s reverse=%s" % (name, axis, reverse))


@pytest.mark.parametrize("length", [0, 1, 31, 33, 1025])
@pytest.mark.parametrize("axis", [0, 1])
def test_cummax_row_lengths(rng, length, axis):
    shape = (3, length) if axis == 1 else (length, 3)
    x = rng.integers(-1000, 1000, shape).astype(np.int32)
    d = to_device(x)
    for reverse in (False, True):
        got = to_host(cufold.cummax(d, axis=axis, reverse=reverse))
        np.testing.assert_array_equal(got, flipped(np_cummax, x, axis, reverse))


@pytest.mark.parametrize("length", [2, 4, 8, 16, 32])
@pytest.mark.parametrize("aligned", [True, False])
def test_segments_rows_dividing_a_warp(rng, monkeypatch, length, aligned):
    """Rows of 2..32 items back to back (the segments kernel; its aligned form, a row within
    a step's lanes, and the general one): inclusive, exclusive with init, reversed; enough
    rows for a warp's whole steps and a partial last group; the affine recurrence (not
    commutative) row by row against a loop."""
    monkeypatch.setattr(scan_axis, "ALIGNED_SEGMENTS", aligned)
    scan._programs_of_scans.clear()
    rows = 3 + 2048 // length               # a partial last group of steps
    x = rng.integers(-50, 50, (rows, length)).astype(np.float32)
    d = to_device(x)
    assert layout("segments", scan_axis.plan_layout(x.shape, (length, 1), (length, 1), 1, False))
    for reverse in (False, True):
        got = to_host(cufold.cumsum(d, axis=1, reverse=reverse))
        np.testing.assert_array_equal(got, flipped(np_cumsum, x, 1, reverse))
    want = np.cumsum(x, axis=1) - x + 7
    got = to_host(cufold.exclusive_scan(d, cufold.plus, init=7, axis=1))
    np.testing.assert_array_equal(got, want)
    a = rng.choice(np.array([-1, 1], np.int64), x.shape)       # exact in int64
    b = rng.integers(-3, 4, x.shape).astype(np.int64)
    pair = to_device((a, b))
    for reverse in (False, True):
        got = to_host(cufold.inclusive_scan(pair, AFFINE, axis=1, reverse=reverse))
        want = affine_loop(a, b, 1, reverse)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    got = to_host(cufold.exclusive_scan(pair, AFFINE, init=(1, 2), axis=1))
    np.testing.assert_array_equal(got[1], affine_loop(a, b, 1, False, init=(1, 2))[1])
    scan._programs_of_scans.clear()


def test_cumsum_int32_is_int64_and_3d_axes(rng):
    x = rng.integers(-2**31, 2**31 - 1, (4, 6, 35)).astype(np.int32)
    d = to_device(x)
    for axis in range(3):
        got = to_host(cufold.cumsum(d, axis=axis))
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.cumsum(x, axis=axis))
    np.testing.assert_array_equal(to_host(cufold.cummin(d, axis=1, reverse=True)),
                                  np.flip(np.minimum.accumulate(np.flip(x, 1), axis=1), 1))
    small = rng.choice(np.array([-1, 1, 2], np.int32), (3, 40))
    np.testing.assert_array_equal(to_host(cufold.cumprod(to_device(small), axis=-1)), np.cumprod(small, axis=-1))


def test_columns_chunks_and_spine(rng):
    """Few columns, long ones: upsweep, a row scan of the chunk folds, downsweep."""
    x = rng.integers(-9, 9, (300, 3)).astype(np.int64)
    d = to_device(x)
    lay = scan_axis.plan_layout(x.shape, (3, 1), (3, 1), 0, False)
    assert lay.kind == "columns"
    for reverse in (False, True):
        np.testing.assert_array_equal(to_host(cufold.cumsum(d, axis=0, reverse=reverse)),
                                      flipped(np_cumsum, x, 0, reverse).astype(np.int64))
        got = to_host(cufold.exclusive_scan(d, cufold.maximum, init=-5, axis=0, reverse=reverse))
        ref = flipped(np_cummax, np.concatenate([np.full((1, 3), -5), x[:-1]]), 0, False)
        if reverse:
            ref = np.flip(np.maximum.accumulate(np.concatenate([np.full((1, 3), -5), np.flip(x, 0)[:-1]]), 0), 0)
        np.testing.assert_array_equal(got, ref)


def test_gather_fallback_4d_and_flatten(rng):
    base = rng.integers(-9, 9, 120).astype(np.int32)
    d, x = strided_view(base, 0, (2, 3, 4, 5), (60, 1, 15, 3))
    for axis in (2, None):
        for reverse in (False, True):
            got = to_host(cufold.cumsum(d, axis=axis, reverse=reverse))
            np.testing.assert_array_equal(got, flipped(np_cumsum, x, axis, reverse).astype(np.int64))


# --- exclusive scans, out=, in place ---------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_exclusive_init_out_and_in_place(rng, axis):
    x = rng.integers(-20, 20, (6, 37)).astype(np.int64)
    d = to_device(x)
    out = cuda.to_device(np.full(x.shape, -777777, np.int64))
    res = cufold.exclusive_scan(d, init=100, axis=axis, out=out)
    assert res is out
    inc = np.cumsum(x, axis=axis)
    want = 100 + inc - x
    np.testing.assert_array_equal(to_host(out), want)
    cufold.inclusive_scan(d, axis=axis, reverse=True, out=d)               # in place
    np.testing.assert_array_equal(to_host(d), flipped(np_cumsum, x, axis, True).astype(np.int64))


# --- tuple values: a batch of affine recurrences, reverse ------------------------------------------

def _affine(p, q):
    # x -> p0*x + p1, then q: associative, not commutative, no identity.
    return (p[0] * q[0], p[1] * q[0] + q[1])


AFFINE = Op(_affine, name="affine")


def affine_loop(a, b, axis, reverse, init=None):
    """Sequential reference along ``axis`` (int64), inclusive (or exclusive from ``init``)."""
    a, b = np.moveaxis(a, axis, -1), np.moveaxis(b, axis, -1)
    ra, rb = np.empty_like(a), np.empty_like(b)
    order = range(a.shape[-1] - 1, -1, -1) if reverse else range(a.shape[-1])
    for idx in np.ndindex(a.shape[:-1]):
        acc = init
        for i in order:
            item = (int(a[idx + (i,)]), int(b[idx + (i,)]))
            if init is not None:
                ra[idx + (i,)], rb[idx + (i,)] = acc
                acc = _affine(acc, item)
            else:
                acc = item if acc is None else _affine(acc, item)
                ra[idx + (i,)], rb[idx + (i,)] = acc
    return np.moveaxis(ra, -1, axis), np.moveaxis(rb, -1, axis)


@pytest.mark.parametrize("shape,axis", [((5, 40), -1), ((3, 300), 1), ((40, 4), 0), ((2, 3, 33), 1)])
def test_affine_batch_against_loop(rng, shape, axis):
    # coefficients in {-1, 1} and small offsets: exact in int64
    a = rng.choice(np.array([-1, 1], np.int64), shape)
    b = rng.integers(-3, 4, shape).astype(np.int64)
    d = to_device((a, b))
    for reverse in (False, True):
        got = to_host(cufold.inclusive_scan(d, AFFINE, axis=axis, reverse=reverse))
        want = affine_loop(a, b, axis % len(shape), reverse)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    got = to_host(cufold.exclusive_scan(d, AFFINE, init=(1, 2), axis=axis, reverse=True))
    want = affine_loop(a, b, axis % len(shape), True, init=(1, 2))
    np.testing.assert_array_equal(got[1], want[1])


def test_affine_float32_recurrence(rng):
    """h = a*h + b along each row of float32 (the issue's recurrence), against float64."""
    a = rng.uniform(0.5, 1.0, (4, 70)).astype(np.float32)
    b = rng.uniform(-1, 1, (4, 70)).astype(np.float32)
    _, h = to_host(cufold.inclusive_scan(to_device((a, b)), AFFINE, axis=-1))
    want = np.empty((4, 70))
    hh = np.zeros(4)
    for i in range(70):
        hh = a[:, i] * hh + b[:, i]
        want[:, i] = hh
    np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-5)


def test_reverse_flat_total(rng):
    x = rng.integers(-9, 9, 300).astype(np.int32)
    got, total = cufold.inclusive_scan(to_device(x), reverse=True, total=True)
    np.testing.assert_array_equal(to_host(got), np.flip(np.cumsum(np.flip(x))))
    assert int(to_host(total)) == int(x.sum())


# --- out=(None, h): the fields not wanted are never stored ----------------------------------------

def affine_h(a, b, axis, reverse, h0=None):
    """``h`` of ``h = a*h + b`` along ``axis`` (None: of the flattened arrays) in float64, item
    by item (reversed: from the last): inclusive, ``h`` after each item from 0; with ``h0``,
    exclusive: ``h`` before each item from ``h0``."""
    if axis is None:
        a, b, axis = a.ravel(), b.ravel(), 0
    a = np.moveaxis(np.asarray(a, np.float64), axis, -1)
    b = np.moveaxis(np.asarray(b, np.float64), axis, -1)
    order = range(a.shape[-1] - 1, -1, -1) if reverse else range(a.shape[-1])
    out = np.empty(a.shape)
    h = np.zeros(a.shape[:-1]) if h0 is None else np.full(a.shape[:-1], h0)
    for i in order:
        if h0 is not None:
            out[..., i] = h
        h = a[..., i] * h + b[..., i]
        if h0 is None:
            out[..., i] = h
    return np.moveaxis(out, -1, axis)


def _layout_kind(shape, strides, axis):
    """The kernel the planner picks for a view into C-order outputs ('gather': first gathered)."""
    if axis is None:
        contiguous = strides == tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))
        return "flat" if len(shape) == 1 or contiguous else "gather"
    out = tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))
    lay = scan_axis.plan_layout(shape, strides, out, axis, False)
    return "gather" if lay is None else lay.kind


# (offset, shape, strides) of both inputs over bases of 2400 items, the axis, the layout it takes:
# every kernel's view, and axis=None of a transposed and of a strided 1-D view
H_ONLY_LAYOUTS = SCAN_VIEW_LAYOUTS + [((0, (33, 7), (1, 33)), None, "gather"), ((5, (300,), (2,)), None, "flat")]


@pytest.mark.parametrize("view,axis,kind", H_ONLY_LAYOUTS, ids=[k for _, _, k in H_ONLY_LAYOUTS])
def test_affine_h_only_every_layout(rng, monkeypatch, view, axis, kind):
    """``out=(None, h)`` (and ``(p, None)``) in every layout, inclusive and exclusive,
    forwards and reversed, against a float64 loop; the Program allocates nothing but
    where a view is gathered first (then both fields, internally)."""
    from cufold.device import scan
    from cufold.host import programs
    offset, shape, strides = view
    assert _layout_kind(shape, strides, axis) == kind
    da, a = strided_view(rng.choice(np.array([-1, 1], np.float32), 2400), offset, shape, strides)
    db, b = strided_view(rng.integers(-3, 4, 2400).astype(np.float32), offset, shape, strides)
    made = []                                       # arrays the Programs allocate
    real_output = programs.Builder.output
    monkeypatch.setattr(programs.Builder, "output", lambda self, *args: made.append(args) or real_output(self, *args))
    monkeypatch.setattr(scan, "_programs_of_scans", programs.Programs(scan._plan_key, "cufold.scan"))   # plan anew
    out_shape = shape if axis is not None else (a.size,)
    for kind_, reverse, h0 in (("inclusive", False, None), ("inclusive", True, None), ("exclusive", True, 0.5)):
        h = cuda.to_device(np.full(out_shape, -7777.0, np.float32))
        if kind_ == "inclusive":
            got = cufold.inclusive_scan((da, db), AFFINE, axis=axis, reverse=reverse, out=(None, h))
        else:
            got = cufold.exclusive_scan((da, db), AFFINE, init=(1.0, h0), axis=axis, reverse=reverse, out=(None, h))
        assert got[0] is None and got[1] is h
        np.testing.assert_array_equal(to_host(h), affine_h(a, b, axis, reverse, h0),
                                      err_msg="%s %s reverse=%s" % (kind, kind_, reverse))
    p = cuda.to_device(np.full(out_shape, -7777.0, np.float32))              # the product of the a's only
    assert cufold.inclusive_scan((da, db), AFFINE, axis=axis, out=(p, None))[0] is p
    want = np.cumprod(a.ravel() if axis is None else a, axis=0 if axis is None else axis)
    np.testing.assert_array_equal(to_host(p), want)
    assert len(made) == (8 if kind == "gather" else 0)         # gathered: both fields, each of 4 Programs


def test_affine_h_only_one_tile_rows_strided_out_in_place(rng, monkeypatch):
    """Rows of one tile (the tiles kernel without look-backs), exclusive too; ``h`` a strided
    view whose neighbours stay as they were; in place over ``b``, ``a`` untouched."""
    monkeypatch.setenv("CUFOLD_TILE", "64x8")                      # 512 items a tile
    a = rng.uniform(0.5, 1.0, (4, 300)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, (4, 300)).astype(np.float32)
    d = to_device((a, b))
    for reverse in (False, True):
        poison = np.full((4, 600), -7777.0, np.float32)
        buf = cuda.to_device(poison)
        h = buf[:, ::2]
        cufold.inclusive_scan(d, AFFINE, axis=1, reverse=reverse, out=(None, h))
        np.testing.assert_allclose(to_host(buf)[:, ::2], affine_h(a, b, 1, reverse), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(to_host(buf)[:, 1::2], poison[:, 1::2])
        h = cuda.to_device(np.full((4, 300), -7777.0, np.float32))
        cufold.exclusive_scan(d, AFFINE, init=(2.0, 0.25), axis=-1, reverse=reverse, out=(None, h))
        np.testing.assert_allclose(to_host(h), affine_h(a, b, 1, reverse, 0.25), rtol=1e-5, atol=1e-5)
    da, db = to_device((a, b))
    cufold.inclusive_scan((da, db), AFFINE, axis=1, out=(None, db))          # in place
    np.testing.assert_array_equal(to_host(da), a)
    np.testing.assert_allclose(to_host(db), affine_h(a, b, 1, False), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(SIMULATOR, reason="GPU tile sizes: rows of one 2048-item tile, rows of many, 2^18 items")
def test_gpu_affine_h_only_sizes(rng):
    """``out=(None, h)`` where the library's tiles apply: the bench's rows of 2048 (one tile a
    row), rows of many tiles (look-backs), and a 1-D scan, against float64 loops."""
    for shape, axis in (((64, 2048), 1), ((3, 20_001), 1), (((1 << 18) + 3,), None)):
        a = rng.uniform(0.5, 1.0, shape).astype(np.float32)
        b = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
        for reverse in (False, True):
            h = cuda.to_device(np.full(shape, np.nan, np.float32))
            cufold.inclusive_scan(to_device((a, b)), AFFINE, axis=axis, reverse=reverse, out=(None, h))
            np.testing.assert_allclose(to_host(h), affine_h(a, b, axis, reverse), rtol=1e-4, atol=1e-4)


# --- bad input ---------------------------------------------------------------------------------

def test_bad_axes_and_shapes():
    d = to_device(np.zeros((3, 4), np.float32))
    with pytest.raises(np.exceptions.AxisError):
        cufold.cumsum(d, axis=2)
    with pytest.raises(np.exceptions.AxisError):
        cufold.cummax(d, axis=-3)
    with pytest.raises(TypeError, match="cufold: a scan's axis"):
        cufold.cumsum(d, axis=(0, 1))
    with pytest.raises(TypeError, match=r"the axis goes by keyword only: cumsum\(x, axis=1\)"):
        cufold.cumsum(d, 1)                  # NumPy's positional axis
    with pytest.raises(TypeError, match=r"cummax takes the axis by keyword only"):
        cufold.cummax(d, 0)
    with pytest.raises(ValueError, match="cufold: total="):
        cufold.inclusive_scan(d, axis=0, total=True)
    with pytest.raises(ValueError, match="cufold: out= must have the result's shape"):
        cufold.cumsum(d, axis=0, out=to_device(np.zeros(12, np.float32)))
    with pytest.raises(ValueError, match="cufold: out= must have the result's shape"):
        cufold.cumsum(d, out=to_device(np.zeros((3, 4), np.float32)))       # axis=None: 1-D result
    with pytest.raises(ValueError, match="cufold: the arrays of x must be equally long"):
        cufold.inclusive_scan((d, to_device(np.zeros((4, 3), np.float32))), AFFINE, axis=0)


# --- the bench suite (python -m cufold bench scan-axes): cases, targets, table, dry run ---------

def test_bench_scan_axes_targets_and_dry_run():
    import io

    from cufold import bench
    from cufold.bench import scan_axes as B
    assert len(B.cases()) == 11 and len(B.cases({"affine"})) == 2
    rows = [{"kind": "cumsum", "shape": [4096, 4096], "axis": 0, "reverse": False, "plan": "columns",
             "floor_us": 30.0, "cufold": {"status": "ok", "gpu_us": 40.0}, "torch": {"status": "ok", "gpu_us": 80.0}},
            {"kind": "affine", "shape": [4096, 2048], "axis": 1, "reverse": False, "plan": "tiles",
             "floor_us": 24.0, "floor_both_us": 32.0, "cufold": {"status": "ok", "gpu_us": 45.0},
             "both": {"status": "ok", "gpu_us": 50.0}, "triton": {"status": "ok", "gpu_us": 40.0},
             "jax": {"status": "ok", "gpu_us": 277.0}}]
    res = {"meta": {"device": {"name": "H200"}, "copy_GBps": 4200.0}, "records": rows}
    res["targets_evaluated"] = B.evaluate(res)
    # (the same-shape copy's target: n/a, no copy timed here; tests/test_bench.py has it)
    assert [t["status"] for t in res["targets_evaluated"]] == ["PASS", "MISS", "n/a", "MISS", "PASS", "n/a", "n/a",
                                                               "n/a"]
    text = B.format_results(res)
    assert "targets:" in text and "cumsum 4096x4096 axis=0" in text
    assert "both fields written (16 B)" in text and "64% of their floor: h only takes 0.900x" in text
    out = io.StringIO()
    assert bench.main(["scan-axes", "--dry-run"], stdout=out) == 0
    assert out.getvalue().count("axis=") == 11 and "plan=columns" in out.getvalue()


def test_columns_with_a_tiles_spine(rng, monkeypatch):
    """More chunks than LANE_ROW: the chunk folds are scanned by the tiles kernel;
    and an exclusive scan with init along rows of several tiles (a look-back per row)."""
    monkeypatch.setattr(scan_axis, "LANE_ROW", 8)
    x = rng.integers(-9, 9, (291, 3)).astype(np.int32)
    d = to_device(x)
    lay = scan_axis.plan_layout(x.shape, (3, 1), (3, 1), 0, False)
    assert lay.kind == "columns"
    for reverse in (False, True):
        got = to_host(cufold.cumsum(d, axis=0, reverse=reverse))
        np.testing.assert_array_equal(got, flipped(np_cumsum, x, 0, reverse).astype(np.int64))
    xt = np.ascontiguousarray(x.T)
    got = to_host(cufold.exclusive_scan(to_device(xt), axis=1, init=7))
    np.testing.assert_array_equal(got, 7 + np.cumsum(xt, axis=1) - xt)


# --- the column tiles: a look-back down each strip of columns ----------------------------------------

@pytest.fixture
def column_kernels_ran(request, monkeypatch):
    """The names of the narrow columns' and column tiles' kernels that plans take, in
    order (from a fresh plan cache: plans are cached per call signature)."""
    ran = []
    scan._programs_of_scans.clear()
    request.addfinalizer(scan._programs_of_scans.clear)
    for name in ("narrow_columns_kernel", "column_tiles_kernel"):
        kernel = getattr(scan_axis, name)
        monkeypatch.setattr(scan_axis, name, lambda *a, _k=kernel, _n=name: ran.append(_n) or _k(*a))
    return ran


@pytest.fixture(params=[32, 0], ids=["narrow", "column-tiles"])
def few_columns(request, monkeypatch, column_kernels_ran):
    """Columns layouts of at most 32 columns through the narrow columns (forced for every
    width and every value size) or, with them off, the column tiles; ``ran``: the kernels
    that ran."""
    monkeypatch.setattr(scan_axis, "NARROW_COLUMNS", request.param)
    monkeypatch.setattr(scan_axis, "NARROW_BYTES", 64)
    return request.param, column_kernels_ran


def _ran_few_columns(few_columns):
    narrow, ran = few_columns
    assert ran and set(ran) == {"narrow_columns_kernel" if narrow else "column_tiles_kernel"}


@pytest.mark.parametrize("shape,reverse", [((300, 3), False), ((61, 20), True), ((40, 16), False)])
def test_column_tiles_against_loop(rng, few_columns, shape, reverse):
    """Few long columns: the single-pass narrow columns and column tiles (many tiles down
    each column; C not a power of two; several strips), a non-commutative operator
    without an identity, exclusive from init; and the same through ``reduce_then_scan``'s
    3-launch form. (Column tiles are 8 columns wide at most.)"""
    a = rng.choice(np.array([-1, 1], np.int64), shape)
    b = rng.integers(-3, 4, shape).astype(np.int64)
    d = to_device((a, b))
    lay = scan_axis.plan_layout(shape, (shape[1], 1), (shape[1], 1), 0, reverse)
    assert lay.kind == "columns"
    for algorithm in (None, "reduce_then_scan"):
        got = to_host(cufold.inclusive_scan(d, AFFINE, axis=0, reverse=reverse, algorithm=algorithm))
        want = affine_loop(a, b, 0, reverse)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    got = to_host(cufold.exclusive_scan(d, AFFINE, init=(1, 2), axis=0, reverse=reverse))
    want = affine_loop(a, b, 0, reverse, init=(1, 2))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    _ran_few_columns(few_columns)


@pytest.mark.parametrize("few_columns", [32], indirect=True, ids=["narrow"])
@pytest.mark.parametrize("cols", [2, 3, 5, 8, 12, 16, 17, 31, 32])
def test_narrow_columns_widths(rng, few_columns, cols):
    """Every row width the narrow columns take (a row across the power of two >= C lanes:
    32 // width rows a warp step), columns many tiles long with a partial last tile, into
    a poisoned ``out``: int32 summed as int64 (pair states), forwards and in reverse; float64
    (wide states) exclusive from init; float32 maxima with a transform."""
    rows = 37 * 32 // scan_axis.narrow_width(cols) + 5
    x = rng.integers(-9, 9, (rows, cols)).astype(np.int32)
    for reverse in (False, True):
        out = to_device(np.full(x.shape, -77, np.int64))
        cufold.cumsum(to_device(x), axis=0, reverse=reverse, out=out)
        np.testing.assert_array_equal(to_host(out), flipped(np_cumsum, x, 0, reverse).astype(np.int64))
    f = x.astype(np.float64) / 4
    got = to_host(cufold.exclusive_scan(to_device(f), axis=0, init=0.5))
    np.testing.assert_array_equal(got, 0.5 + np.cumsum(f, axis=0) - f)
    m = rng.standard_normal(x.shape).astype(np.float32)
    got = to_host(cufold.inclusive_scan(to_device(m), cufold.maximum, axis=0, transform=lambda v: -v))
    np.testing.assert_array_equal(got, np.maximum.accumulate(-m, axis=0))
    _ran_few_columns(few_columns)


@pytest.mark.parametrize("few_columns", [32], indirect=True, ids=["narrow"])
def test_narrow_columns_views_and_groups(rng, few_columns):
    """Columns that are not back to back (a strided view), several row groups (a 3-D input:
    tiles of every group by ticket), and columns of a transposed view."""
    base = rng.integers(-9, 9, 9000).astype(np.int32)
    dev, host = strided_view(base, 3, (260, 6), (30, 2))
    np.testing.assert_array_equal(to_host(cufold.cumsum(dev, axis=0)), np.cumsum(host, axis=0, dtype=np.int64))
    x = rng.integers(-9, 9, (3, 150, 7)).astype(np.int32)
    for reverse in (False, True):
        got = to_host(cufold.exclusive_scan(to_device(x), axis=1, init=4, reverse=reverse))
        want = flipped(lambda v, ax: 4 + np.cumsum(v, axis=ax) - v, x, 1, reverse)
        np.testing.assert_array_equal(got, want)
    t = rng.integers(-9, 9, (5, 300)).astype(np.int32)
    got = to_host(cufold.cumsum(to_device(t).T, axis=0))
    np.testing.assert_array_equal(got, np.cumsum(t.T, axis=0, dtype=np.int64))
    _ran_few_columns(few_columns)


def _forced_look_back(rng, kind, rows, chains, cols, stops, launch):
    """The last tile (70) of ``chains`` look-back chains (column ``x``'s states together at
    ``x*71 + tile``, wide layout) over ``cols`` columns of affine maps (int64 pairs): every
    tile above has published its column totals only (the simulator runs blocks in order, so
    an end-to-end test finds a prefix at once) except ``stops[x]``, which published column
    ``x``'s inclusive prefix; what lies before it (garbage here) must never be read.
    ``launch(xs, outs, tiles, counter, flags, aggs, pres, init)`` runs the one block, which
    draws the last ticket; its rows ``rows`` a tile are checked against a loop, and so are
    the prefixes it publishes and that no other tile's rows are written."""
    from cufold.device import scan as S
    tiles, epoch, init = 71, 5, (1, 2)
    length = tiles * rows
    ga = rng.choice(np.array([-1, 1], np.int64), (1, length, cols))
    gb = rng.integers(-3, 4, (1, length, cols)).astype(np.int64)
    flags = np.full(chains * tiles, epoch << 2 | S.AGGREGATE, np.uint32)
    aggs = tuple(np.full(tiles * chains, 1234567, np.int64) for _ in range(2))
    pres = tuple(np.full(tiles * chains, 99, np.int64) for _ in range(2))
    want_before = []
    for x in range(chains):
        stop = stops[x]
        flags[x * tiles + stop] = epoch << 2 | S.PREFIX
        flags[x * tiles + tiles - 1] = (epoch - 1) << 2 | S.PREFIX     # an older epoch's flag reads as EMPTY
        acc = (int(rng.choice([-1, 1])), int(rng.integers(-9, 9)))
        pres[0][x * tiles + stop], pres[1][x * tiles + stop] = acc
        for j in range(stop + 1, tiles - 1):
            v = (int(rng.choice([-1, 1])), int(rng.integers(-3, 4)))
            aggs[0][x * tiles + j], aggs[1][x * tiles + j] = v
            acc = _affine(acc, v)
        want_before.append(acc)
    counter = np.array([epoch << 32 | (tiles - 1)], np.uint64)   # this block draws the last ticket
    poison = -777777
    outs = tuple(cuda.to_device(np.full((1, length, cols), poison, np.int64)) for _ in range(2))
    d_flags = cuda.to_device(flags)
    d_aggs, d_pres = tuple(map(cuda.to_device, aggs)), tuple(map(cuda.to_device, pres))
    launch((cuda.to_device(ga), cuda.to_device(gb)), outs, tiles, cuda.to_device(counter),
           (d_flags, d_flags.view(np.float32)), d_aggs, d_pres, init)
    got = tuple(o.copy_to_host() for o in outs)
    h_pres = tuple(p.copy_to_host() for p in d_pres)
    h_flags = d_flags.copy_to_host()
    last = slice((tiles - 1) * rows, length)
    for x in range(cols):
        acc = _affine(init, want_before[x]) if kind == "exclusive" else want_before[x]
        want = []
        for i in range(last.start, length):
            item = (int(ga[0, i, x]), int(gb[0, i, x]))
            if kind == "exclusive":
                want.append(acc)
                acc = _affine(acc, item)
            else:
                acc = _affine(acc, item)
                want.append(acc)
        np.testing.assert_array_equal(got[0][0, last, x], [w[0] for w in want])
        np.testing.assert_array_equal(got[1][0, last, x], [w[1] for w in want])
        total = want_before[x]
        for i in range(last.start, length):
            total = _affine(total, (int(ga[0, i, x]), int(gb[0, i, x])))
        assert (h_pres[0][x * tiles + tiles - 1], h_pres[1][x * tiles + tiles - 1]) == total  # inclusive published
        assert h_flags[x * tiles + tiles - 1] == epoch << 2 | S.PREFIX
    assert (got[0][0, :last.start] == poison).all()                # no other tile's rows written


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("cols,kind", [(3, "inclusive"), (3, "exclusive"), (12, "inclusive"), (32, "exclusive")])
def test_narrow_columns_look_back_windows(rng, cols, kind):
    """The narrow columns' last tile looks back for all its columns at once, each column
    over its own window of ``32 // width`` tiles a round, each column's prefix at another
    tile (0, 9, 40 or 69: some columns stop in the first round, others go on)
    (:func:`_forced_look_back`)."""
    from cufold.device import scan as S
    from cufold.values import ValueType
    vt = ValueType.of((np.int64, np.int64))
    assert S.state_layout("packed", vt, vt) == "wide"
    width, warps, steps, _ = scan_axis.narrow_tiles(scan_axis.Layout("columns", 1, 10**6, cols, None, None), vt, vt)
    fn = cuda.jit(scan_axis.narrow_columns_kernel(AFFINE, vt, vt, vt, kind, width, warps, steps, "wide", "volatile"))
    _forced_look_back(rng, kind, warps * steps * (32 // width), cols, cols, [(69, 0, 40, 9)[x % 4] for x in range(cols)],
                      lambda xs, outs, tiles, counter, flags, aggs, pres, init: fn[1, 32 * warps](
                          xs, outs, tiles, counter, flags, aggs, pres, init, kind == "exclusive"))


@pytest.fixture(params=scan_axis.STRIP_WIDTHS)
def strips_everywhere(request, monkeypatch):
    """Columns layouts take the column strips of each width the planner may pick, however
    few their strips (the simulator's GPU is small); the strips kernel is checked to have
    run at that width (``ran``: its (width, rows a thread) pairs)."""
    ran = []
    kernel = scan_axis.column_strips_kernel
    monkeypatch.setattr(scan_axis, "STRIP_FILL", 0)
    monkeypatch.setattr(scan_axis, "STRIP_WIDTHS", (request.param,))
    # plans are cached per call signature, which the width is not part of: plan afresh
    scan._programs_of_scans.clear()
    request.addfinalizer(scan._programs_of_scans.clear)
    monkeypatch.setattr(scan_axis, "column_strips_kernel", lambda *a: ran.append(a[5:7]) or kernel(*a))
    return ran


@pytest.mark.parametrize("shape", [(33, 7), (63, 5), (64, 4), (65, 9), (130, 3)])
def test_column_strips_against_numpy(rng, strips_everywhere, shape):
    """Many columns (forced here): a block down each strip, its carry from chunk to chunk;
    rows of 1 chunk, a chunk and one row; a last strip of fewer columns; forwards and in
    reverse, inclusive and exclusive from init, a transform, into a poisoned out."""
    x = rng.integers(-9, 9, shape).astype(np.int32)
    for reverse in (False, True):
        got = to_host(cufold.cumsum(to_device(x), axis=0, reverse=reverse))
        np.testing.assert_array_equal(got, flipped(np_cumsum, x, 0, reverse).astype(np.int64))
        out = to_device(np.full(shape, -77, np.int64))
        cufold.exclusive_scan(to_device(x), axis=0, init=5, reverse=reverse, out=out,
                              transform=lambda v: v * v)
        want = flipped(lambda y, ax: 5 + np.cumsum(y, axis=ax) - y, x.astype(np.int64) ** 2, 0, reverse)
        np.testing.assert_array_equal(to_host(out), want)
    m = rng.standard_normal(shape).astype(np.float32)
    got = to_host(cufold.inclusive_scan(to_device(m), cufold.maximum, axis=0))
    np.testing.assert_array_equal(got, np.maximum.accumulate(m, axis=0))
    assert strips_everywhere and all(tc == scan_axis.STRIP_WIDTHS[0] for tc, _ in strips_everywhere)


def test_column_strips_views_and_tuples(rng, strips_everywhere):
    """Strips of two batch groups (a 3-D input), of a strided view, and of a tuple value
    whose operator is not commutative (affine maps, no identity; exclusive from init)."""
    x = rng.integers(-9, 9, (3, 70, 5)).astype(np.int32)
    got = to_host(cufold.cumsum(to_device(x), axis=1))
    np.testing.assert_array_equal(got, np.cumsum(x, axis=1, dtype=np.int64))
    base = rng.integers(-9, 9, 2000).astype(np.int32)
    dev, host = strided_view(base, 3, (66, 7), (21, 2))
    np.testing.assert_array_equal(to_host(cufold.cumsum(dev, axis=0)), np.cumsum(host, axis=0, dtype=np.int64))
    shape = (67, 5)
    a = rng.choice(np.array([-1, 1], np.int64), shape)
    b = rng.integers(-3, 4, shape).astype(np.int64)
    for reverse in (False, True):
        got = to_host(cufold.inclusive_scan(to_device((a, b)), AFFINE, axis=0, reverse=reverse))
        want = affine_loop(a, b, 0, reverse)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        got = to_host(cufold.exclusive_scan(to_device((a, b)), AFFINE, init=(1, 2), axis=0, reverse=reverse))
        want = affine_loop(a, b, 0, reverse, init=(1, 2))
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    assert len(strips_everywhere) >= 3


def test_column_tiles_three_strips(rng, few_columns):
    """Three strips of columns (the last with 3 of its 8 columns), int32 summed as int64."""
    x = rng.integers(-9, 9, (35, 19)).astype(np.int32)
    for reverse in (False, True):
        got = to_host(cufold.cumsum(to_device(x), axis=0, reverse=reverse))
        np.testing.assert_array_equal(got, flipped(np_cumsum, x, 0, reverse).astype(np.int64))
    _ran_few_columns(few_columns)


def test_narrow_columns_by_default(rng, column_kernels_ran):
    """The planner's default: up to NARROW_COLUMNS columns take the narrow columns where
    they pay (:func:`scan_axis.narrow_pays`: accumulators of up to 8 bytes, whatever their
    look-back states: packed, pair or wide); more columns, or tuples of more than 8 bytes,
    the column tiles (where the strips would not fill the GPU)."""
    cols = scan_axis.NARROW_COLUMNS
    cases = [(np.float32, np.float32, cols, "narrow_columns_kernel"),
             (np.int32, np.int32, cols, "narrow_columns_kernel"),
             (np.float32, np.float32, cols + 1, "column_tiles_kernel"),
             (np.float64, np.float64, cols, "narrow_columns_kernel"),
             (np.int32, np.int64, cols, "narrow_columns_kernel")]
    for in_dtype, out_dtype, c, _ in cases:
        x = rng.integers(-9, 9, (60, c)).astype(in_dtype)
        got = to_host(cufold.exclusive_scan(to_device(x), axis=0, init=3, dtype=out_dtype))
        assert got.dtype == out_dtype
        np.testing.assert_array_equal(got, 3 + np.cumsum(x, axis=0, dtype=out_dtype) - x)
    a = rng.choice(np.array([-1, 1], np.int64), (60, cols))
    b = rng.integers(-3, 4, (60, cols)).astype(np.int64)
    got = to_host(cufold.inclusive_scan(to_device((a, b)), AFFINE, axis=0))
    want = affine_loop(a, b, 0, False)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert column_kernels_ran == [kernel for *_, kernel in cases] + ["column_tiles_kernel"]


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("stop,kind", [(0, "inclusive"), (10, "exclusive"), (40, "inclusive"), (69, "inclusive")])
def test_column_tiles_look_back_windows(rng, stop, kind):
    """The column tiles' last tile of a strip of 3 columns looks back over tiles 69..0, 32
    at a time, a column at a time, every column's prefix at ``stop`` (:func:`_forced_look_back`)."""
    from cufold.device import scan as S
    from cufold.values import ValueType
    vt = ValueType.of((np.int64, np.int64))
    assert S.state_layout("packed", vt, vt) == "wide"
    tc, ty, per = scan_axis._column_tiles(scan_axis.Layout("columns", 1, 10**6, 3, None, None), vt, vt)[:3]
    fn = cuda.jit(scan_axis.column_tiles_kernel(AFFINE, vt, vt, vt, kind, tc, ty, per, "wide", "volatile"))
    _forced_look_back(rng, kind, ty * per, tc, 3, [stop] * tc,
                      lambda xs, outs, tiles, counter, flags, aggs, pres, init: fn[1, tc * ty](
                          xs, outs, tiles, 1, 1, tiles, counter, flags, aggs, pres, init, kind == "exclusive"))


# --- the pair tile states (8-byte accumulators, pairs of 4-byte fields) ------------------------

def test_pair_states_layouts(rng):
    from cufold.device import scan
    from cufold.values import ValueType
    f32x2, i64 = ValueType.of((np.float32, np.float32)), ValueType.of(np.int64)
    i32 = ValueType.of(np.int32)
    assert scan.state_layout("packed", f32x2, f32x2) == "pair" and scan.state_layout("packed", i64, i32) == "pair"
    assert scan.state_layout("wide", i64, i32) == "wide" and scan.state_layout("packed", i64, i64) == "wide"
    assert scan.state_layout("packed", ValueType.of((np.int64, np.int64))) == "wide"
    assert scan.plan(AFFINE, f32x2, f32x2, f32x2, 10**6, "inclusive", "single_pass").spec.variant.states == "pair"


@pytest.mark.parametrize("dtypes", [(np.int32, np.int32), (np.int64,), (np.uint8, np.int32)])
def test_pair_states_exact(rng, dtypes):
    """Look-back over many tiles with two-word states: values whose halves both matter."""
    n = 700
    if len(dtypes) == 1:                                          # int32 summed as int64, past 2^32
        x = rng.integers(2**31 - 100, 2**31 - 1, n).astype(np.int32)
        got, total = cufold.inclusive_scan(to_device(x), dtype=np.int64, algorithm="single_pass", total=True)
        np.testing.assert_array_equal(to_host(got), np.cumsum(x, dtype=np.int64))
        assert int(to_host(total)) == int(x.sum(dtype=np.int64))
        got = cufold.exclusive_scan(to_device(x), init=5, dtype=np.int64, algorithm="single_pass", reverse=True)
        np.testing.assert_array_equal(to_host(got), 5 + np.flip(np.cumsum(np.flip(x), dtype=np.int64)) - x)
        return
    a = rng.integers(0, 2, n).astype(dtypes[0])
    b = rng.integers(-3, 4, n).astype(dtypes[1])
    # a segmented sum (q[0]: q starts a segment): associative, not commutative
    pick = Op(lambda p, q: (p[0] | q[0], q[1] if q[0] else p[1] + q[1]), name="segmented_sum")
    got = to_host(cufold.inclusive_scan(to_device((a, b)), pick, algorithm="single_pass"))
    acc, want = None, []
    for p in zip(a.tolist(), b.tolist()):
        acc = p if acc is None else (acc[0] | p[0], p[1] if p[0] else acc[1] + p[1])
        want.append(acc)
    np.testing.assert_array_equal(got[1], np.array([w[1] for w in want]))
    np.testing.assert_array_equal(got[0], np.array([w[0] for w in want], dtypes[0]))


# --- GPU sizes: look-backs along long rows, long columns (the simulator's tiles cover these small) ---

@pytest.mark.skipif(SIMULATOR, reason="GPU tile sizes: rows of many 4096-item tiles")
def test_gpu_long_rows_and_columns(rng):
    x = rng.integers(-100, 100, (5, 100_003)).astype(np.int32)
    d = to_device(x)
    for reverse in (False, True):
        got = to_host(cufold.cumsum(d, axis=1, reverse=reverse))                 # int64: pair states
        np.testing.assert_array_equal(got, flipped(lambda v, ax: np.cumsum(v, axis=ax), x, 1, reverse))
        got = to_host(cufold.inclusive_scan(d, axis=1, reverse=reverse))         # int32: packed states
        np.testing.assert_array_equal(got, flipped(lambda v, ax: np.cumsum(v, axis=ax, dtype=np.int32), x, 1,
                                                   reverse))
    got = to_host(cufold.exclusive_scan(d, init=7, axis=1))
    np.testing.assert_array_equal(got, 7 + np.cumsum(x, axis=1, dtype=np.int32) - x)
    a = rng.choice(np.array([-1, 1], np.int64), (3, 20_001))
    b = rng.integers(-3, 4, (3, 20_001)).astype(np.int64)
    for reverse in (False, True):
        got = to_host(cufold.inclusive_scan(to_device((a, b)), AFFINE, axis=1, reverse=reverse))
        want = affine_loop(a, b, 1, reverse)
        np.testing.assert_array_equal(got[1], want[1])
    c = rng.integers(-100, 100, (1 << 16, 3)).astype(np.int32)    # columns: tiles down a strip; a tiles spine
    for reverse in (False, True):
        for algorithm in (None, "reduce_then_scan"):
            got = to_host(cufold.cumsum(to_device(c), axis=0, reverse=reverse, algorithm=algorithm))
            np.testing.assert_array_equal(got, flipped(lambda v, ax: np.cumsum(v, axis=ax), c, 0, reverse))
    a = rng.choice(np.array([-1, 1], np.int64), (200_003, 5))                   # column tiles, not commutative
    b = rng.integers(-3, 4, (200_003, 5)).astype(np.int64)
    want = affine_loop(a, b, 0, False)
    d = to_device((a, b))
    for _ in range(3):                                                          # a race shows as a mismatch
        got = to_host(cufold.inclusive_scan(d, AFFINE, axis=0))
        np.testing.assert_array_equal(got[1], want[1])
    w = rng.integers(-100, 100, (3001, 1000)).astype(np.int32)                 # many strips of 32 columns
    np.testing.assert_array_equal(to_host(cufold.exclusive_scan(to_device(w), init=5, axis=0, dtype=np.int64)),
                                  5 + np.cumsum(w, axis=0) - w)
    s = rng.integers(-100, 100, (1001, 4100)).astype(np.int32)                 # column strips (32 wide)
    for reverse in (False, True):
        got = to_host(cufold.cumsum(to_device(s), axis=0, reverse=reverse))
        np.testing.assert_array_equal(got, flipped(lambda v, ax: np.cumsum(v, axis=ax), s, 0, reverse))
    s = np.ascontiguousarray(s[:, :4097])                                       # a last strip of one column
    got = to_host(cufold.exclusive_scan(to_device(s), init=3, axis=0))
    np.testing.assert_array_equal(got, 3 + np.cumsum(s, axis=0, dtype=np.int32) - s)
    for cols in (2, 3, 4):                           # narrow columns: each window, GPU tiles
        g = rng.integers(-100, 100, (300_001, cols)).astype(np.int32)
        got = to_host(cufold.exclusive_scan(to_device(g), init=5, axis=0, dtype=np.int64))
        np.testing.assert_array_equal(got, 5 + np.cumsum(g, axis=0) - g)
        gd = g.astype(np.float64)
        got = to_host(cufold.cumsum(to_device(gd), axis=0, reverse=True))
        np.testing.assert_array_equal(got, flipped(lambda v, ax: np.cumsum(v, axis=ax), gd, 0, True))
    f = rng.integers(-2, 3, (1 << 20, 16)).astype(np.float32)                   # the bench's shapes, exact
    for axis in (0, 1):
        np.testing.assert_array_equal(to_host(cufold.cumsum(to_device(f), axis=axis)), np.cumsum(f, axis=axis))
