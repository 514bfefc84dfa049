"""Reductions along axes: NumPy's semantics for axis, keepdims, strides and dtypes."""

import numpy as np
import pytest
from numba import cuda

import cufold
from conftest import SIMULATOR, strided_view, to_host

SHAPE = (5, 7, 6) if SIMULATOR else (37, 129, 65)
AXES = [None, 0, 1, 2, -1, (0, 2), (1, 2), (0, 1), (0, 1, 2)]


host = to_host


@pytest.fixture
def x(rng):
    return rng.integers(-9, 9, SHAPE).astype(np.int32)


@pytest.fixture
def axis_keys(monkeypatch):
    """``keys(kind)``: the keys of the ``kind`` axis kernels ("axis_rows", "axis_columns",
    ...) asked of the launch path from now on (a Program asks as it is planned: clear a
    reduction's programs to plan it again)."""
    from cufold.host import launch as launch_mod
    seen = []
    real = launch_mod.kernel_for
    monkeypatch.setattr(launch_mod, "kernel_for", lambda fn, key, args: seen.append(key) or real(fn, key, args))
    return lambda kind: [k for k in seen if isinstance(k, tuple) and k[0] == kind]


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


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
def test_mean_axis_as_sum_over_count(rng, dtype):
    """Means along axes fold a one-field sum and divide by the items per output as they
    store (along the contiguous axis, with 8-byte loads where the rows allow; along an
    outer axis, split across blocks); NumPy's result dtype, float64 reference."""
    x = (rng.standard_normal((6, 40, 10)) * 3 + 7).astype(dtype)
    d = cuda.to_device(x)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    for axis in (0, 1, 2, (0, 2), -1):
        got = host(cufold.mean(d, axis=axis))
        assert got.dtype == x.mean(axis=axis).dtype
        np.testing.assert_allclose(got, x.astype(np.float64).mean(axis=axis), rtol=tol, atol=tol)
    if dtype == np.float32:                    # asked for float64: accumulated in float64, no compensation
        near_zero = rng.standard_normal((37, 45)).astype(np.float32)
        got = host(cufold.mean(cuda.to_device(near_zero), axis=0, dtype=np.float64))
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, near_zero.astype(np.float64).mean(axis=0), rtol=1e-12, atol=1e-15)
    got = host(cufold.mean(d, axis=0, transform=lambda v: v * v, keepdims=True))
    np.testing.assert_allclose(got, (x.astype(np.float64) ** 2).mean(axis=0, keepdims=True), rtol=tol * 10)


@pytest.mark.parametrize("row", [1, 2, 3, 4])
def test_mean_of_thin_rows_in_float32(rng, row):
    """Rows of at most 4 items along the contiguous axis (a thread a row) fold a compensated
    float32 sum, with no float64: within 2 * eps32 * mean(|x|) of the exact mean, as every
    float32 mean; an odd row count and offsets that cancel included."""
    x = (rng.standard_normal((301, row)) * 3 + rng.choice([-1e4, 1e4, 1.0], (301, 1))).astype(np.float32)
    got = host(cufold.mean(cuda.to_device(x), axis=1))
    assert got.dtype == np.float32
    exact = x.astype(np.float64).mean(axis=1)
    bound = 2 * np.finfo(np.float32).eps * np.abs(x.astype(np.float64)).mean(axis=1)
    assert (np.abs(got - exact) <= bound).all(), np.max(np.abs(got - exact) / bound)


@pytest.mark.parametrize("row", [1, 2, 3, 4])
def test_thin_rows_two_at_a_time(rng, row, monkeypatch):
    """Rows of a few items, a thread a row, folded two rows at a time (``THIN_ROW_PAIRS``):
    threads with three rows (a pair, then one alone) and with two, rows cut from wider
    ones, two kept dimensions, NaN and ties, every reduction and an ``init``."""
    monkeypatch.setattr(axis_mod, "THIN_ROW_PAIRS", True)
    lim = axis_mod.Limits(64, 256, 2, 8, 1, 1)          # a grid of 32 blocks of 64 on any device
    monkeypatch.setattr(axis_mod, "limits", lambda device_id: lim)
    x = rng.integers(0, 5, (7, 601, row + 2)).astype(np.float32)
    x[3, 100, row - 1] = np.nan
    dv, xv = cuda.to_device(x)[:, :, :row], x[:, :, :row]
    layout = axis_mod.plan_layout(xv.shape, tuple(s // 4 for s in xv.strides), (2,), True)
    s = axis_mod.schedule(layout, lim)
    assert (s.kernel, s.group, s.split) == ("rows", 1, 1) and 2 * s.grid * s.nt < 7 * 601 < 3 * s.grid * s.nt
    with np.errstate(invalid="ignore"):
        for name in ("sum", "max", "min", "argmax", "argmin"):
            np.testing.assert_array_equal(host(getattr(cufold, name)(dv, axis=2)), getattr(xv, name)(axis=2))
        np.testing.assert_allclose(host(cufold.mean(dv, axis=-1)), xv.astype(np.float64).mean(axis=2), rtol=1e-6)
        got = cufold.reduce(dv, cufold.plus, axis=2, init=np.float32(10))
        np.testing.assert_array_equal(host(got), xv.sum(axis=2) + 10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_min_max_nan_along_axes(rng, dtype):
    """NaN propagates through max/min along every axis and layout (rows, columns, full
    reductions of a view), and only to the outputs it reaches."""
    x = rng.standard_normal((10, 70)).astype(dtype)
    x[7, 11] = x[0, 69] = x[9, 0] = np.nan
    d = cuda.to_device(x)
    for view, xv in ((d, x), (d.T, x.T)):
        for axis in (None, 0, 1):
            with np.errstate(invalid="ignore"):
                np.testing.assert_array_equal(host(cufold.max(view, axis=axis)), xv.max(axis=axis))
                np.testing.assert_array_equal(host(cufold.min(view, axis=axis)), xv.min(axis=axis))
    ok = np.where(np.isnan(x), 0, x)
    np.testing.assert_array_equal(host(cufold.max(cuda.to_device(ok), axis=0)), ok.max(axis=0))


def test_argmax_axis(rng):
    x = rng.integers(0, 4, SHAPE).astype(np.float32)  # many ties: the first index wins
    d = cuda.to_device(x)
    for axis in (0, 1, 2):
        np.testing.assert_array_equal(host(cufold.argmax(d, axis=axis)), x.argmax(axis=axis))
        np.testing.assert_array_equal(host(cufold.argmin(d, axis=axis)), x.argmin(axis=axis))


@pytest.mark.parametrize("shape, view", [((6, 40), "whole"), ((6, 41), "whole"), ((60, 70), "rows_strided"),
                                         ((9, 300), "transposed"), ((4, 5, 64), "whole")])
def test_argmin_argmax_rising_update(rng, axis_keys, shape, view):
    """Where a thread's items come in rising index order (reduce.Spec.rising), argmin/argmax
    update without the tie test: the first index still wins ties, the first NaN still wins,
    along every axis (rows, columns, full reductions), 4- and 8-byte items. A transposed view
    read in memory order does not rise and keeps the general update: its first maximum in
    memory order is not its first in the view's order."""
    for dtype in (np.float32, np.float64, np.int32):
        x = rng.integers(0, 3, shape).astype(dtype)          # few values: ties everywhere
        if view == "transposed":        # the first in memory order is not the first in the view's
            x[0, 1], x[1, 0] = 9, 9     # (view indices 9 and 1)
            x[0, 2], x[2, 0] = -9, -9
            if dtype == np.float64:
                x[0, 3], x[3, 0] = np.nan, np.nan
        elif dtype != np.int32:
            flat = x.reshape(-1)
            flat[rng.choice(flat.size, 3, replace=False)] = np.nan
        d = cuda.to_device(x)
        dv, xv = {"whole": lambda: (d, x), "rows_strided": lambda: (d[::2], x[::2]),
                  "transposed": lambda: (d.T, x.T)}[view]()
        for name in ("argmax", "argmin"):
            getattr(cufold.device, "_" + name.upper()).programs.clear()
            for axis in [None] + list(range(xv.ndim)):
                np.testing.assert_array_equal(host(getattr(cufold, name)(dv, axis=axis)),
                                              getattr(np, name)(xv, axis=axis), err_msg="%s axis=%s" % (name, axis))
    # The cheap update ran. (Which kernel a transposed view takes depends on the device: the
    # simulator walks it in memory order, not rising; an H200 reads it in the view's order
    # through the device reduce, rising. The ties placed above prove either.)
    specs = [k[1] for kind in ("axis_rows", "axis_columns", "axis_transposed") for k in axis_keys(kind)]
    assert True in {s.rising for s in specs if s.lift == "index"}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_full_argmin_argmax_walking_lines(rng, dtype):
    """A full argmin/argmax of a view that does not collapse, with rows long enough that a
    thread walks them a line at a time (axis._line_fold): each line rises in index and is
    folded on its own with the cheap update, then combined; a reversed line takes the
    general update. Ties everywhere, the first of them in memory order not the first in
    the view's; NaNs in float64."""
    x = rng.integers(0, 3, (5, 1100)).astype(dtype)
    if dtype == np.float64:
        x[3, 7] = x[1, 900] = np.nan
    d = cuda.to_device(x)
    for dv, xv in ((d.T, x.T), (d[::-1], x[::-1]), (d[:, ::-2], x[:, ::-2]), (d[::2], x[::2])):
        for name in ("argmax", "argmin"):
            np.testing.assert_array_equal(host(getattr(cufold, name)(dv)), getattr(np, name)(xv),
                                          err_msg="%s of strides %s" % (name, xv.strides))


def test_index_rises():
    from cufold.device.axis import index_rises
    assert index_rises(((65536, 1, 1),))                                 # rows along the contiguous axis
    assert index_rises(((4096, 16384, 8192), (8192, 1, 1)))              # x[::2] of (8192, 8192)
    assert index_rises(((3, 7, 0), (1, 0, 0), (7, 1, 1))[1:])            # a length-1 dimension
    assert not index_rises(((8192, 8192, 1), (8192, 1, 8192)))           # x.T in memory order
    assert not index_rises(((5, 1, -1),))                                # a reversed dimension
    assert not index_rises(((4, 10, 3), (4, 1, 1)))                      # indices overlap


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


# --- the layout planner: every layout, axis and reduction ----------------------------------

from cufold.device import axis as axis_mod  # noqa: E402


# (offset, shape, strides) over a base of 400 elements: C order, transposed, permuted,
# strided, reversed (negative), broadcast (zero), and mixes of them.
LAYOUT_MATRIX = {
    "contiguous": (0, (4, 5, 6), (30, 6, 1)),
    "transposed": (0, (6, 5, 4), (1, 6, 30)),
    "permuted": (0, (5, 4, 6), (6, 30, 1)),
    "strided": (1, (4, 3, 5), (60, 12, 2)),
    "reversed": (119, (4, 5, 6), (-30, -6, -1)),
    "reversed_inner": (5, (4, 5, 6), (30, 6, -1)),
    "broadcast": (3, (4, 5, 6), (30, 0, 1)),
    "broadcast_reversed": (200, (3, 4, 5), (-7, 0, -40)),
}
ALL_AXES = [None, 0, 1, 2, (0, 1), (0, 2), (1, 2), (0, 1, 2)]
# Simulator: (0, 1, 2) without keepdims normalises to axis=None's (0, 1, 2) (axis.normalize_axis)
# and takes the same path; argmax/argmin run for None only: the same calls twice.
MATRIX_AXES = ALL_AXES[:-1] if SIMULATOR else ALL_AXES


def _check(got, ref, exact):
    got = host(got)
    assert got.shape == np.shape(ref), (got.shape, np.shape(ref))
    if exact:
        np.testing.assert_array_equal(got, ref)
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def _matrix_cell(layout, axis):
    """What one cell of the matrix exercises: the planner's kernel and launch shape (under
    the simulator's limits), dimensions kept and reduced; its layout, axis and keepdims."""
    offset, shape, strides = LAYOUT_MATRIX[layout]
    lay = axis_mod.plan_layout(shape, strides, axis_mod.normalize_axis(axis, len(shape)), True)
    if lay.kind == "contiguous":
        plan = ("contiguous",)
    else:
        s = axis_mod.schedule(lay, axis_mod.SIMULATOR_LIMITS)
        plan = (s.kernel, s.group, s.tx, s.ty, s.split, s.per, len(lay.keep), len(lay.red))
    return {("plan",) + plan, ("layout", layout), ("axis", axis), ("keepdims", axis in (1, (0, 2)))}


def _matrix_turns():
    """Simulator: (layout, axis) -> the halves of the value reductions the cell runs, beside
    sum, the tuple reduction and argmax/argmin (which run in every cell). Half 0: prod
    (int32), max (float64), var (int32); half 1: min (int32), mean (float64), mean_var
    (float64, ddof=1). Cells alternate halves; a cell runs both where a half would
    otherwise miss a planned kernel shape, layout, axis or keepdims, so each half still
    meets everything every reduction met. GPU: every cell runs both."""
    cells = [(layout, axis) for layout in sorted(LAYOUT_MATRIX) for axis in MATRIX_AXES]
    seen = {c: _matrix_cell(*c) for c in cells}
    turns = {c: {(i + j) % 2} for i, layout in enumerate(sorted(LAYOUT_MATRIX))
             for j, axis in enumerate(MATRIX_AXES) for c in [(layout, axis)]}
    every = set().union(*seen.values())
    for half in (0, 1):
        for what in sorted(every, key=repr):
            if not any(what in seen[c] and half in turns[c] for c in cells):
                turns[next(c for c in cells if what in seen[c])] = {0, 1}
    return turns


MATRIX_TURNS = _matrix_turns() if SIMULATOR else {}


@pytest.mark.parametrize("layout", sorted(LAYOUT_MATRIX))
def test_layout_matrix(rng, layout):
    offset, shape, strides = LAYOUT_MATRIX[layout]
    ints = rng.integers(-4, 5, 400).astype(np.int32)
    floats = rng.normal(1, 2, 400)                    # float64: NumPy's reference in float64
    di, xi = strided_view(ints, offset, shape, strides)
    ds, xs = strided_view(np.where(ints > 0, 1, -1).astype(np.int32), offset, shape, strides)
    df, xf = strided_view(floats, offset, shape, strides)
    for axis in MATRIX_AXES:
        keepdims = axis in (1, (0, 2))
        kw = dict(axis=axis, keepdims=keepdims)
        halves = MATRIX_TURNS.get((layout, axis), {0, 1})
        _check(cufold.sum(di, **kw), xi.sum(**kw), True)
        if 0 in halves:
            _check(cufold.prod(ds, **kw), xs.prod(**kw), True)
            _check(cufold.max(df, **kw), xf.max(**kw), True)
            _check(cufold.var(di, **kw), xi.var(**kw), False)
        if 1 in halves:
            _check(cufold.min(di, **kw), xi.min(**kw), True)
            _check(cufold.mean(df, **kw), xf.mean(**kw), False)
            m, v = cufold.mean_var(df, ddof=1, **kw)
            _check(m, xf.mean(**kw), False)
            _check(v, xf.var(ddof=1, **kw), False)
        both = cufold.reduce((di, df), cufold.Op(lambda a, b: (a[0] + b[0], max(a[1], b[1])), commutative=True),
                             **kw)
        _check(both[0], xi.sum(**kw), True)
        _check(both[1], xf.max(**kw), True)
        if axis is None or isinstance(axis, int):
            _check(cufold.argmax(di, axis=axis), xi.argmax(axis=axis), True)    # ties: the first wins
            _check(cufold.argmin(df, axis=axis), xf.argmin(axis=axis), True)


def _affine_fold(a, b, axis):
    """The C-order fold of affine maps (a, b) then (c, d) = (a*c, b*c + d) over ``axis``."""
    to = tuple(range(-len(axis), 0))
    a, b = np.moveaxis(a, axis, to), np.moveaxis(b, axis, to)
    lead = a.shape[:-len(axis)]
    a = a.reshape(lead + (-1,))
    b = b.reshape(lead + (-1,))
    ra, rb = a[..., 0].copy(), b[..., 0].copy()
    for j in range(1, a.shape[-1]):
        ra, rb = ra * a[..., j], rb * a[..., j] + b[..., j]
    return ra, rb


AFFINE = cufold.Op(lambda p, q: (p[0] * q[0], p[1] * q[0] + q[1]))


@pytest.mark.parametrize("layout", ["transposed", "permuted", "reversed", "broadcast"])
def test_non_commutative_views_fold_in_c_order(rng, layout):
    offset, shape, strides = LAYOUT_MATRIX[layout]
    a = rng.choice([-1, 1], 400).astype(np.int64)
    b = rng.integers(-3, 4, 400).astype(np.int64)
    da, xa = strided_view(a, offset, shape, strides)
    db, xb = strided_view(b, offset, shape, strides)
    for axis in [(0,), (2,), (0, 1), (1, 2), (0, 1, 2)]:
        got = cufold.reduce((da, db), AFFINE, axis=axis)
        ra, rb = _affine_fold(xa, xb, axis)
        np.testing.assert_array_equal(host(got[0]), ra)
        np.testing.assert_array_equal(host(got[1]), rb)


# Shapes that reach each kernel under the simulator's limits (axis.limits): groups of 1..16
# lanes, warps and blocks per row, splits across blocks, columns with and without splits.
KERNEL_CASES = [
    ((40, 3), (1,), ("rows", 1, 1)),            # a lane per row
    ((40, 30), (1,), ("rows", 8, 1)),           # sub-warp groups
    ((3, 200), (1,), ("rows", 32, 3)),          # a warp per row, split in 3
    ((2, 700), (1,), ("rows", 64, 2)),          # a block per row, split
    ((3, 2000), (1,), ("rows", 64, 2)),         # ... with runs of 15 items a thread (the unrolled loop)
    ((1500, 3), (0,), ("columns", 4, 4)),       # 4 columns x 16 threads, split
    ((40, 40), (0,), ("columns", 32, 2)),       # 32 columns x 2 threads, split
    ((50, 128), (0,), ("columns", 32, 1)),      # enough column tiles: no split (2 threads a column)
    ((64, 200), (0,), ("columns", 64, 1)),      # columns filling a round of blocks: a thread each
    ((2, 300), (0,), ("columns", 64, 1)),       # 2 items a column: one thread each, 64 columns a block
]


@pytest.fixture
def simulator_limits(monkeypatch):
    """The simulator's launch limits on any device, so that the small shapes below reach
    the same kernels on a GPU (real launches, the GPU's own code paths)."""
    monkeypatch.setattr(axis_mod, "limits", lambda device_id: axis_mod.SIMULATOR_LIMITS)


@pytest.mark.parametrize("shape, axes, expect", KERNEL_CASES)
def test_kernel_choice_and_results(rng, shape, axes, expect, simulator_limits):
    layout = axis_mod.plan_layout(shape, (shape[1], 1), axes, True)
    s = axis_mod.schedule(layout, axis_mod.limits(0))
    assert (s.kernel, s.group or s.tx, s.split) == expect
    x = rng.integers(-50, 50, shape).astype(np.int32)
    d = cuda.to_device(x)
    for _ in range(2):                  # the tickets are reset: a second call is right too
        np.testing.assert_array_equal(host(cufold.sum(d, axis=axes)), x.sum(axis=axes))
    np.testing.assert_array_equal(host(cufold.argmax(d, axis=axes[0])), x.argmax(axis=axes[0]))
    m, v = cufold.mean_var(d, axis=axes)
    np.testing.assert_allclose(host(m), x.mean(axis=axes), rtol=1e-6, atol=1e-12)    # a mean of 0: Welford leaves ~1e-15
    np.testing.assert_allclose(host(v), x.var(axis=axes), rtol=1e-6)
    a = rng.choice([-1, 1], shape).astype(np.int64)
    b = rng.integers(-3, 4, shape).astype(np.int64)
    got = cufold.reduce((cuda.to_device(a), cuda.to_device(b)), AFFINE, axis=axes, init=(1, 0))
    ra, rb = _affine_fold(a, b, axes)
    np.testing.assert_array_equal(host(got[0]), ra)
    np.testing.assert_array_equal(host(got[1]), rb)


@pytest.mark.parametrize("shape, axis, per", [((2, 2048), 0, 2), ((2, 1031), 0, 1), ((4, 2, 512), 1, 2)])
def test_short_columns_take_several_outputs_a_thread(rng, shape, axis, per, simulator_limits):
    """Columns of a few items: a thread folds ``per`` neighbouring outputs (one unravel;
    one each where the kept dimension's length is odd)."""
    strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    layout = axis_mod.plan_layout(shape, strides, (axis,), True)
    s = axis_mod.schedule(layout, axis_mod.limits(0))
    assert (s.kernel, s.ty, s.split, s.per) == ("columns", 1, 1, per)
    x = rng.integers(-50, 50, shape).astype(np.int32)
    d = cuda.to_device(x)
    for _ in range(2):
        np.testing.assert_array_equal(host(cufold.sum(d, axis=axis)), x.sum(axis=axis))
    np.testing.assert_array_equal(host(cufold.argmax(d, axis=axis)), x.argmax(axis=axis))
    m, v = cufold.mean_var(d, axis=axis)
    np.testing.assert_allclose(host(m), x.mean(axis=axis), rtol=1e-6)
    np.testing.assert_allclose(host(v), x.var(axis=axis), rtol=1e-6)
    a = rng.choice([-1, 1], shape).astype(np.int64)
    b = rng.integers(-3, 4, shape).astype(np.int64)
    got = cufold.reduce((cuda.to_device(a), cuda.to_device(b)), AFFINE, axis=(axis,), init=(1, 0))
    ra, rb = _affine_fold(a, b, (axis,))
    np.testing.assert_array_equal(host(got[0]), ra)
    np.testing.assert_array_equal(host(got[1]), rb)


@pytest.mark.parametrize("shape, view, wide", [((9, 3, 100), "whole", True), ((9, 300), "offset", False),
                                               ((9, 301), "whole", None), ((9, 3, 100), "reversed", True)])
def test_neighbouring_columns_read_in_pairs(rng, axis_keys, shape, view, wide, simulator_limits):
    """Columns along one reduced dimension whose neighbouring outputs are neighbours in
    memory: a thread folds two, 8 bytes a load (``wide``), where the data align; two a thread
    4 bytes a load where they do not (an odd start); one a thread where the row is odd
    (``None``). NaN, ties and integer items as NumPy."""
    for dtype in (np.float32, np.int32):
        x = rng.integers(0, 3, shape).astype(dtype)
        if dtype == np.float32:
            x.reshape(-1)[rng.choice(x.size, 2, replace=False)] = np.nan
        d = cuda.to_device(x)
        dv, xv = {"whole": (d, x), "offset": (d[:, 1:-1], x[:, 1:-1]), "reversed": (d[::-1], x[::-1])}[view]
        for name in ("sum", "max", "argmax", "argmin", "mean"):
            if name != "mean":      # (plan again: the launches are recorded when planned)
                getattr(cufold.device, "_" + name.upper()).programs.clear()
            got = host(getattr(cufold, name)(dv, axis=0))
            want = getattr(np, name)(xv.astype(np.float64) if name in ("sum", "mean") else xv, axis=0)
            np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True, err_msg="%s %s" % (name, dtype))
    keys = axis_keys("axis_columns")
    per = {k[7] for k in keys}
    assert per == ({1} if wide is None else {2})
    assert {k[1].wide for k in keys} == {bool(wide)}


@pytest.mark.parametrize("rows", [32, 2])
def test_results_turned_through_shared_memory(rng, rows, simulator_limits, monkeypatch):
    """Where the results run along another kept dimension than the input (x of (2, 20, 3,
    40) viewed as (2, 3, 40, 20) along axis 1), tiles of outputs turn in shared memory
    (``rows`` along the results' dimension: one partial tile, or several and a partial)."""
    monkeypatch.setattr(axis_mod, "TRANSPOSED_ROWS", rows)
    base_shape, perm = (2, 20, 3, 40), (0, 2, 3, 1)
    strides = tuple(int(np.prod(base_shape[i + 1:])) for i in range(4))
    shape, strides = tuple(base_shape[p] for p in perm), tuple(strides[p] for p in perm)
    layout = axis_mod.plan_layout(shape, strides, (1,), True)
    s = axis_mod.schedule(layout, axis_mod.limits(0))
    assert (s.kernel, s.tb) == ("transposed", rows)
    n = int(np.prod(base_shape))
    d, x = strided_view(rng.integers(-50, 50, n).astype(np.int32), 0, shape, strides)
    for _ in range(2):
        np.testing.assert_array_equal(host(cufold.sum(d, axis=1)), x.sum(axis=1))
    np.testing.assert_array_equal(host(cufold.argmax(d, axis=1, keepdims=True)), x.argmax(axis=1, keepdims=True))
    m, v = cufold.mean_var(d, axis=1)
    np.testing.assert_allclose(host(m), x.mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(host(v), x.var(axis=1), rtol=1e-6)
    f, xf = strided_view(rng.normal(1, 2, n).astype(np.float32), 0, shape, strides)
    np.testing.assert_allclose(host(cufold.mean(f, axis=1)), xf.astype(np.float64).mean(axis=1), rtol=1e-5, atol=1e-6)
    da, a = strided_view(rng.choice([-1, 1], n).astype(np.int64), 0, shape, strides)
    db, bb = strided_view(rng.integers(-3, 4, n).astype(np.int64), 0, shape, strides)
    got = cufold.reduce((da, db), AFFINE, axis=1, init=(1, 0))
    ra, rb = _affine_fold(a, bb, (1,))
    np.testing.assert_array_equal(host(got[0]), ra)
    np.testing.assert_array_equal(host(got[1]), rb)


@pytest.mark.parametrize("view, walk", [("transposed", "rows"), ("permuted", "rows"), ("row_strided", "rows"),
                                        ("tall_transposed", "lattice")])
def test_views_walked_by_rows_or_lines(rng, view, walk, simulator_limits):
    """Full reductions of views that do not collapse: rows that give a thread at least
    ROW_WALK_ITEMS items walked row by row (one outer step a row, a chunk's first and last
    rows partial); rows shorter than the threads' step (z.T of a tall (n, 4)) walked as a
    line per thread down the outer dimension. argmax/argmin's ties (few distinct values)
    go to NumPy's index."""
    n = 2 * 3 * 1100
    base = rng.integers(0, 6, n).astype(np.float32)
    shape, strides, axes = {"transposed": ((1100, 6), (1, 1100), (0, 1)),
                            "permuted": ((3, 1100, 2), (1100, 1, 3300), (0, 1, 2)),
                            "row_strided": ((3, 1100), (2200, 1), (0, 1)),
                            "tall_transposed": ((4, 1650), (1, 4), (0, 1))}[view]
    layout = axis_mod.plan_layout(shape, strides, axes, True, True)
    s = axis_mod.schedule(layout, axis_mod.limits(0))
    length = layout.red[-1][0]
    assert s.kernel == "rows" and axis_mod.walk_of(length, s.group, len(layout.red) - 1) == walk
    d, x = strided_view(base, 0, shape, strides)
    for _ in range(2):
        np.testing.assert_array_equal(host(cufold.argmax(d)), x.argmax())
    np.testing.assert_array_equal(host(cufold.argmin(d)), x.argmin())
    np.testing.assert_array_equal(host(cufold.sum(d)), x.astype(np.float64).sum())
    np.testing.assert_allclose(host(cufold.mean(d)), x.astype(np.float64).mean(), rtol=1e-6)
    ia, a = strided_view(rng.choice([-1, 1], n).astype(np.int64), 0, shape, strides)
    ib, b = strided_view(rng.integers(-3, 4, n).astype(np.int64), 0, shape, strides)
    got = cufold.reduce((ia, ib), AFFINE, init=(1, 0))      # (in C order: row_strided's walk)
    ra, rb = _affine_fold(a, b, axes)
    np.testing.assert_array_equal(host(got[0]), ra)
    np.testing.assert_array_equal(host(got[1]), rb)


@pytest.mark.parametrize("view", ["rows_strided", "cols_strided", "transposed"])
def test_full_reduction_of_views_uses_every_block(rng, view, simulator_limits):
    """A full reduction of a view that does not collapse splits over blocks (never one warp)."""
    x = rng.integers(-50, 50, (60, 70)).astype(np.int32)
    d = cuda.to_device(x)
    dv, xv = {"rows_strided": (d[::2], x[::2]), "cols_strided": (d[:, ::3], x[:, ::3]),
              "transposed": (d.T, x.T)}[view]
    layout = axis_mod.plan_layout(xv.shape, tuple(s // 4 for s in xv.strides), (0, 1), False)
    s = axis_mod.schedule(layout, axis_mod.limits(0))
    assert s.kernel == "rows" and s.group == s.nt and s.split > 1
    for _ in range(2):
        assert host(cufold.sum(dv)) == xv.sum()
        assert host(cufold.argmax(dv)) == xv.argmax()
        assert host(cufold.max(dv, keepdims=True)) == xv.max(keepdims=True)
    np.testing.assert_allclose(host(cufold.mean(dv)), xv.mean(), rtol=1e-12)


#: Run lengths for the device reduce over runs: whole tiles, and a partial last tile (the
#: simulator's tiles are 128 items, the GPU's 4096 or 8192)
RUN_WHOLE, RUN_PARTIAL = (384, 1000) if SIMULATOR else (8192, 29672)


@pytest.mark.parametrize("view", ["row_strided", "odd_stride", "partial_tiles", "two_outer", "transposed",
                                  "transposed_partial"])
def test_full_reduction_of_runs_takes_the_device_reduce(rng, axis_keys, view):
    """A full reduction of a view of long contiguous runs (``x[::2]``) by a commutative
    operator is the device reduce over the runs' tiles (``reduce.Spec.runs``): sums and
    maxima through 8-byte loads where every run starts 8-byte aligned, argmin/argmax with
    NumPy's C-order index. Where indices rise along each run but not from run to run
    (two_outer's and the transposed views' argmax, read in memory order) each tile folds
    afresh and merges by the tie-breaking combine (``Spec.retile``); a non-commutative
    operator (in C order) keeps the rows kernel."""
    w, p = RUN_WHOLE, RUN_PARTIAL
    shape, strides = {"row_strided": ((6, w), (2 * w, 1)),
                      "odd_stride": ((5, w), (w + 1, 1)),
                      "partial_tiles": ((4, p), (p + 6, 1)),
                      # (2, 3, w) turned to (3, 2, w): indices step 2w, then w, then 1
                      "two_outer": ((3, 2, w), (w, 3 * w, 1)),
                      # x.T of a (5, w) array: indices step 5 along each run of w
                      "transposed": ((w, 5), (1, w)),
                      "transposed_partial": ((p, 3), (1, p + 6))}[view]
    n = max(sum((k - 1) * s for k, s in zip(shape, strides)) + 1, 6 * w)
    base = rng.integers(0, 9, n).astype(np.float32)     # ties: the index rule matters
    d, x = strided_view(base, 0, shape, strides)
    x64 = x.astype(np.float64)
    one_run = view in ("two_outer", "transposed")       # memory in one run: sums need no runs
    setting = axis_mod.RETILE            # (CUFOLD_AXIS_RETILE: which runs retile)
    indices_turn = view in ("two_outer", "transposed", "transposed_partial")
    if indices_turn:      # (the default retiles runs over one outer dimension only)
        retile = setting in ("all", "every") or (setting == "1" and view != "two_outer")
    else:
        retile = setting == "every"

    def ran():
        return axis_keys("reduce")[-1][1]

    def rows_asked():     # how often the rows kernel was asked for (once a new plan)
        return len(axis_keys("axis_rows"))

    np.testing.assert_allclose(host(cufold.sum(d)), x64.sum(), rtol=1e-6)
    assert ran().runs == (0 if one_run else len(shape) - 1)
    assert ran().wide == (view != "odd_stride")
    np.testing.assert_array_equal(host(cufold.max(d)), x.max())
    before = rows_asked()
    np.testing.assert_array_equal(host(cufold.argmax(d)), x.argmax())
    if indices_turn and not retile:
        assert rows_asked() > before
    else:
        assert rows_asked() == before
        assert ran().runs == len(shape) - 1 and ran().rising and ran().retile == retile
    np.testing.assert_array_equal(host(cufold.argmax(d)), x.argmax())
    np.testing.assert_array_equal(host(cufold.argmin(d)), x.argmin())
    np.testing.assert_allclose(host(cufold.mean(d)), x64.mean(), rtol=1e-6)
    mean, var = cufold.mean_var(d)
    np.testing.assert_allclose((host(mean), host(var)), (x64.mean(), x64.var()), rtol=1e-5)
    assert ran().runs == (0 if one_run else len(shape) - 1)
    ia, a = strided_view(rng.choice([-1, 1], n).astype(np.int64), 0, shape, strides)
    ib, b = strided_view(rng.integers(-3, 4, n).astype(np.int64), 0, shape, strides)
    before = rows_asked()
    got = cufold.reduce((ia, ib), AFFINE, init=(1, 0))
    ra, rb = _affine_fold(a, b, tuple(range(len(shape))))
    np.testing.assert_array_equal(host(got[0]), ra)
    np.testing.assert_array_equal(host(got[1]), rb)
    assert rows_asked() > before


@pytest.mark.parametrize("view", ["transposed", "two_outer"])
def test_retiled_runs_break_ties_by_index(rng, view):
    """The tiles of a retiled argmax/argmin merge in no index order: all-equal items, one
    NaN, and a maximum repeated in several runs still give NumPy's first (C-order) index."""
    w = RUN_WHOLE
    shape, strides = {"transposed": ((w, 5), (1, w)), "two_outer": ((3, 2, w), (w, 3 * w, 1))}[view]
    n = max(sum((k - 1) * s for k, s in zip(shape, strides)) + 1, 6 * w)
    for fill in ("equal", "repeated_max", "nan"):
        base = np.full(n, 3.0, np.float32) if fill == "equal" else rng.integers(0, 4, n).astype(np.float32)
        if fill == "repeated_max":
            base[rng.choice(n, 7, replace=False)] = 9.0
        if fill == "nan":
            base[rng.choice(n, 3, replace=False)] = np.nan
        d, x = strided_view(base, 0, shape, strides)
        np.testing.assert_array_equal(host(cufold.argmax(d)), x.argmax(), err_msg=fill)
        np.testing.assert_array_equal(host(cufold.argmin(d)), x.argmin(), err_msg=fill)


def test_planner_layouts():
    plan = axis_mod.plan_layout
    # x.T reduced whole: one contiguous run (the device-wide reduce)
    assert plan((8, 6), (1, 8), (0, 1), True).kind == "contiguous"
    # ... argmax reads it in memory order too, each item knowing its C-order index
    assert plan((8, 6), (1, 8), (0, 1), True, True) == axis_mod.Layout("rows", (), ((6, 8, 1), (8, 1, 6)), 0)
    # ... and non-commutative operators fold in C order
    assert plan((8, 6), (1, 8), (0, 1), False) == axis_mod.Layout("rows", (), ((8, 1, 0), (6, 8, 0)), 0)
    # x[::2] whole: rows of 8 with an outer stride of 16
    assert plan((4, 8), (16, 1), (0, 1), True) == axis_mod.Layout("rows", (), ((4, 16, 0), (8, 1, 0)), 0)
    # reversed rows flip for commutative operators (an index counts down from the end)
    assert plan((4, 8), (-8, -1), (0, 1), True) == axis_mod.Layout("contiguous", (), ((32, 1, 0),), -31)
    assert plan((4, 8), (-8, -1), (0, 1), True, True) == axis_mod.Layout("rows", (), ((32, 1, -1),), -31, 31)
    # (64, 3, 65536) over (0, 2) permuted: the reduced dims sort by stride
    assert plan((3, 64, 16), (16, 48, 1), (1, 2), True).red == ((64, 48, 0), (16, 1, 0))
    # broadcast dims go outermost; kept dims carry their output strides
    lay = plan((5, 4, 6), (0, 6, 1), (0, 2), True)
    assert lay.kind == "rows" and lay.red == ((5, 0, 0), (6, 1, 0)) and lay.keep == ((4, 6, 1),)
    lay = plan((6, 5, 7), (1, 42, 6), (1,), True)
    assert lay.kind == "columns" and lay.keep == ((7, 6, 1), (6, 1, 7))


def test_one_launch_no_sync(host_waits, rng):
    """A small axis reduction is one launch and no wait of the host (issue #18's rule)."""
    x = rng.integers(-9, 9, (32, 32)).astype(np.int32)
    d = cuda.to_device(x)
    cufold.device._SUM.programs.clear()
    for axis in (0, 1):
        cufold.sum(d, axis=axis)
    assert [p.launches for p in cufold.device._SUM.programs.values()] == [1, 1]
    assert host_waits[0] == 0


try:
    from hypothesis import given, settings, strategies as st
except ImportError:          # pragma: no cover
    given = None


if given is not None:
    @st.composite
    def _views(draw):
        ndim = draw(st.integers(1, 3))
        shape = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
        steps = [draw(st.sampled_from([1, 1, 2, -1, -2, 0])) for _ in range(ndim)]
        order = draw(st.permutations(range(ndim)))
        # element strides of a C array of |step|-spaced elements, permuted, signed, broadcast
        c = [0] * ndim
        size = 1
        for d in reversed(range(ndim)):
            c[d] = size * max(abs(steps[d]), 1)
            size = c[d] * shape[d]
        strides = [c[order[d]] * (0 if steps[order[d]] == 0 else (1 if steps[order[d]] > 0 else -1))
                   for d in range(ndim)]
        shape = tuple(shape[order[d]] for d in range(ndim))
        offset = sum(-(n - 1) * s for n, s in zip(shape, strides) if s < 0)
        axes = draw(st.one_of(st.none(), st.sets(st.integers(0, ndim - 1), min_size=1).map(tuple)))
        return offset, shape, tuple(strides), axes, size + offset

    @settings(max_examples=25, deadline=None)
    @given(view=_views(), dtype=st.sampled_from([np.int32, np.float64]),
           op=st.sampled_from(["sum", "max", "argmax", "affine", "mean"]), seed=st.integers(0, 2**16))
    def test_property_against_numpy(view, dtype, op, seed):
        offset, shape, strides, axes, need = view
        rng = np.random.default_rng(seed)
        base = rng.integers(-3, 4, need + 1).astype(dtype)
        d, x = strided_view(base, offset, shape, strides)
        if op == "argmax":
            axis = axes[0] if axes else None
            np.testing.assert_array_equal(host(cufold.argmax(d, axis=axis)), x.argmax(axis=axis))
        elif op == "affine":
            signs = np.where(base > 0, 1, -1).astype(np.int64)
            da, xa = strided_view(signs, offset, shape, strides)
            db, xb = strided_view(base.astype(np.int64), offset, shape, strides)
            ax = tuple(range(len(shape))) if axes is None else tuple(sorted(axes))
            got = cufold.reduce((da, db), AFFINE, axis=axes)
            ra, rb = _affine_fold(xa, xb, ax)
            np.testing.assert_array_equal(host(got[0]), ra)
            np.testing.assert_array_equal(host(got[1]), rb)
        else:
            got = getattr(cufold, op)(d, axis=axes)
            ref = getattr(np, op)(x, axis=axes)
            np.testing.assert_allclose(host(got), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape, view", [((6, 40), "whole"), ((2, 700), "whole"), ((60, 70), "rows_strided"),
                                         ((6, 41), "offset")])
def test_wide_loads_where_rows_align(rng, axis_keys, shape, view):
    """4-byte rows read 8 bytes a load where every row starts 8-byte aligned; not where
    they cannot (odd rows, an odd start). argmin/argmax too: a pair's second item is one
    index stride past its first (ties among few distinct values go to NumPy's index)."""
    cufold.device._SUM.programs.clear()         # plan again: the launches are made when planned
    x = rng.integers(-50, 50, shape).astype(np.float32)
    d = cuda.to_device(x)
    dv, xv = {"whole": (d, x), "rows_strided": (d[::2], x[::2]), "offset": (d[:, 1:], x[:, 1:])}[view]
    axis = None if view == "rows_strided" else 1
    for _ in range(2):
        np.testing.assert_array_equal(host(cufold.sum(dv, axis=axis)), xv.sum(axis=axis))
    m = host(cufold.mean(dv, axis=axis))
    np.testing.assert_allclose(m, xv.mean(axis=axis, dtype=np.float64), rtol=1e-6)
    ties = rng.integers(0, 4, shape).astype(np.float32)
    dt = cuda.to_device(ties)
    dtv, tv = {"whole": (dt, ties), "rows_strided": (dt[::2], ties[::2]), "offset": (dt[:, 1:], ties[:, 1:])}[view]
    for name in ("argmax", "argmin"):
        getattr(cufold.device, "_" + name.upper()).programs.clear()
        np.testing.assert_array_equal(host(getattr(cufold, name)(dtv, axis=axis)), getattr(np, name)(tv, axis=axis))
    wide = [k[1].wide for k in axis_keys("axis_rows")]
    assert wide and all(wide) == (view != "offset") and any(wide) == (view != "offset")
    assert {k[1].lift for k in axis_keys("axis_rows")} >= {"index", "count"}


def test_tuple_fields_may_differ_in_strides_of_length_one_dimensions(rng):
    """torch keeps whatever stride a dimension of length 1 had: fields of one layout otherwise
    reduce together (a gathered (1, n) block beside a compact copy)."""
    v = rng.standard_normal(24).astype(np.float32)
    i = np.arange(8, dtype=np.int64)
    values, _ = strided_view(v, 0, (1, 8), (24, 1))          # row stride 24, never used
    index, _ = strided_view(i, 0, (1, 8), (8, 1))
    got = to_host(cufold.reduce((values, index), cufold.argmax, axis=0))
    assert (got[0] == v[:8]).all() and (got[1] == i).all()
    with pytest.raises(ValueError, match="one layout"):
        wide, _ = strided_view(np.tile(v, 2), 0, (2, 8), (24, 1))
        cufold.reduce((wide, strided_view(np.tile(i, 3), 0, (2, 8), (8, 1))[0]), cufold.argmax, axis=0)


def test_thin_rows_compiled_for_every_thread_an_sm_holds():
    """A thread a row holds only its row's bytes in flight: its kernel is compiled for 8
    blocks of 256 where the accumulator fits in 32 registers without a spill in the loop
    (4-byte items, at most two accumulator fields); wider values and groups keep 4."""
    from types import SimpleNamespace
    from cufold.values import ValueType

    def blocks(group, item, acc):
        return axis_mod.rows_blocks(SimpleNamespace(in_vt=ValueType.of(item), acc_vt=ValueType.of(acc)), group)
    assert blocks(1, np.float32, np.float32) == axis_mod.THIN_ROW_BLOCKS == 8          # sum, max
    assert blocks(1, np.float32, (np.float64, np.float64)) == 8                         # mean: (count, sum)
    assert blocks(1, np.float32, (np.float32, np.int64)) == 8                           # argmax
    assert blocks(1, np.float32, (np.float64,) * 3) == axis_mod.MIN_BLOCKS              # Welford
    assert blocks(1, np.float64, np.float64) == axis_mod.MIN_BLOCKS
    assert blocks(32, np.float32, np.float32) == axis_mod.MIN_BLOCKS


@pytest.mark.parametrize("name", ["sum", "max", "argmax", "mean"])
def test_short_reduced_axis_folds_in_one_batch(rng, monkeypatch, name):
    """An output of a few items (y.sum(axis=1) of (64, 3, 65536): 3) is folded by batches of
    at most its loads (``axis.unroll_of``; a thread's share where threads share an output),
    not the general batch of 8 with its guarded loads."""
    keys = []
    real_launch = cufold.host.programs.Builder.launch

    def record(self, fn, key, grid, block, args, shared=0):
        keys.append(key)
        return real_launch(self, fn, key, grid, block, args, shared)

    monkeypatch.setattr(cufold.host.programs.Builder, "launch", record)
    x = rng.standard_normal((4, 3, 70)).astype(np.float32)
    got = host(getattr(cufold, name)(cuda.to_device(x), axis=1))
    want = getattr(np, name)(x.astype(np.float64), axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    axis_keys = [k for k in keys if k[0] in ("axis_rows", "axis_columns")]
    assert axis_keys and 2 <= axis_keys[0][-1] <= 3, keys
