"""deterministic="gpu_to_gpu": binned sums with the same bits for any launch shape,
order and split (cufold.device.reproducible), against math.fsum and the host model."""

import math
import warnings

import numpy as np
import pytest
from numba import cuda

import cufold
from cufold import reproducible as R
from conftest import SIMULATOR, to_device, to_host

W = {np.float32: 18, np.float64: 30}


def spread(rng, n, dt, lo=-30, hi=30):
    """Items of both signs over a wide range of exponents (bins cross), some exact ties."""
    x = rng.standard_normal(n) * 2.0 ** rng.integers(lo, hi, n)
    x[::7] = np.round(x[::7])
    return x.astype(dt)


def bound(x, dt):
    """The documented error bound: n 2^(1-2W) max|x|, plus the result's roundings."""
    x64 = np.asarray(x, np.float64)
    m = float(np.max(np.abs(x64))) if x.size else 0.0
    exact = math.fsum(x64)
    return x.size * 2.0 ** (1 - 2 * W[dt]) * m + 2 * abs(exact) * np.finfo(dt).eps + np.finfo(dt).tiny, exact


def host_sum(x, out_dt=None):
    dt = np.dtype(x.dtype)
    return (out_dt or dt.type)(R.host_finalise(R.host_state(x), dt))


def state(x, **kw):
    return tuple(to_host(R.sum_state(to_device(x), **kw)))


def as_tuple(st):
    """A state as the host model writes it (the specials word as a float)."""
    return tuple(int(v) for v in st[:4]) + (float(np.int64(st[4]).view(np.float64)),)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_sum_bits_and_error_bound(rng, dt):
    x = spread(rng, 1500, dt)
    got = to_host(cufold.sum(to_device(x), deterministic="gpu_to_gpu"))
    assert got.dtype == dt and got.shape == ()
    assert got.tobytes() == np.asarray(host_sum(x)).tobytes()        # the host model, bit for bit
    b, exact = bound(x, dt)
    assert abs(float(got) - exact) <= b
    y = spread(rng, 1500, dt)                  # the same Program, new data
    assert to_host(cufold.sum(to_device(y), deterministic="gpu_to_gpu")) == host_sum(y)
    # reduce(plus) is the same sum; out= is written
    out = cuda.to_device(np.full(1, np.nan, dt))
    cufold.reduce(to_device(x), cufold.plus, deterministic="gpu_to_gpu", out=out)
    assert to_host(out)[0] == got


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_state_same_for_every_tile_and_grid(rng, dt):
    x = spread(rng, 700, dt)
    ref = R.host_state(x)
    for tile, grid, wide in (((32, 1), 1, None), ((32, 4), 3, True), ((64, 2), 2, False), ((32, 8), 5, True),
                             ((96, 3), 4, None)):
        assert as_tuple(state(x, tile=tile, grid=grid, wide=wide)) == ref, (tile, grid, wide)


def test_sum_same_under_tile_override(rng, monkeypatch):
    x = to_device(spread(rng, 900, np.float32))
    first = to_host(cufold.sum(x, deterministic="gpu_to_gpu"))
    monkeypatch.setenv("CUFOLD_TILE", "64x8")
    assert to_host(cufold.sum(x, deterministic="gpu_to_gpu")).tobytes() == first.tobytes()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_permutations_and_splits_combine_to_the_same_bits(rng, dt):
    x = spread(rng, 600, dt, -60, 60)
    whole = state(x)
    assert as_tuple(whole) == R.host_state(x)
    assert as_tuple(state(rng.permutation(x))) == as_tuple(whole)
    for _ in range(2):
        cuts = np.sort(rng.choice(np.arange(1, x.size), 4, replace=False))
        pieces = np.split(rng.permutation(x), cuts)
        stacked = np.stack([np.asarray(state(p), np.int64) for p in pieces])
        combined = to_host(R.combine_states(cuda.to_device(stacked)))
        assert tuple(combined) == tuple(whole)
        assert R.host_combine(*(R.host_state(p) for p in pieces)) == R.host_state(x)
        total = to_host(R.finalise(cuda.to_device(stacked), dt))
        assert total.dtype == dt and total.tobytes() == np.asarray(host_sum(x)).tobytes()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_extreme_exponents(rng, dt):
    """Subnormals, the largest finite values (the scaled top bins) and cancellation."""
    fi = np.finfo(dt)
    tiny = fi.smallest_subnormal
    big = fi.max
    x = np.concatenate([np.array([big, -big, big / 2, tiny, -tiny * 3, fi.tiny], dt),
                        (rng.standard_normal(200) * fi.tiny * 2 ** 10).astype(dt)])
    got = to_host(cufold.sum(to_device(rng.permutation(x)), deterministic="gpu_to_gpu"))
    assert got.tobytes() == np.asarray(host_sum(x)).tobytes()
    assert float(got) == math.fsum(x.astype(np.float64)) or dt == np.float64   # tiny parts fall below bin T-2
    small = (rng.standard_normal(300) * fi.smallest_subnormal * 2 ** 20).astype(dt)   # subnormals only: exact
    got = to_host(cufold.sum(to_device(small), deterministic="gpu_to_gpu"))
    assert got.tobytes() == np.asarray(host_sum(small)).tobytes()
    assert float(got) == float(np.asarray(math.fsum(small.astype(np.float64)), dt))


def test_specials():
    """NaN and +-inf follow IEEE (which is order free); a finite overflow is inf; a sum whose
    partial sums overflow but whose total does not is finite."""
    f = np.float32
    big = np.finfo(f).max

    def g(v):
        return float(to_host(cufold.sum(to_device(np.array(v, f)), deterministic="gpu_to_gpu")))
    assert g([1, np.inf, 2]) == np.inf
    assert g([1, -np.inf, 2, -np.inf]) == -np.inf
    assert math.isnan(g([np.inf, 1, -np.inf]))
    assert math.isnan(g([1, np.nan, 2]))
    assert g([big, big]) == np.inf
    assert g([big, big, -big]) == big
    st = as_tuple(state(np.array([3, np.inf, 4], f)))
    assert st[1:4] == (0, 0, 0) and st[4] == np.inf


def test_empty_and_mean(rng):
    e = to_device(np.zeros(0, np.float32))
    assert float(to_host(cufold.sum(e, deterministic="gpu_to_gpu"))) == 0.0
    with pytest.warns(RuntimeWarning):
        assert math.isnan(float(to_host(cufold.mean(e, deterministic="gpu_to_gpu"))))
    x = spread(rng, 800, np.float32).reshape(20, 40)
    m = to_host(cufold.mean(to_device(x), deterministic="gpu_to_gpu"))
    assert m.dtype == np.float32
    assert m == np.float32(R.host_finalise(R.host_state(x), np.float32) / x.size)
    i = rng.integers(-1000, 1000, 500).astype(np.int32)
    mi = to_host(cufold.mean(to_device(i), deterministic="gpu_to_gpu"))
    assert mi.dtype == np.float64 and mi == i.sum() / i.size
    h = (rng.standard_normal(300)).astype(np.float16)
    sh = to_host(cufold.sum(to_device(h), deterministic="gpu_to_gpu"))
    assert sh.dtype == np.float16 and sh == np.float16(R.host_finalise(R.host_state(h), np.float32))
    ints = rng.integers(-9, 9, 300).astype(np.int32)          # exact already: the ordinary sum
    assert to_host(cufold.sum(to_device(ints), deterministic="gpu_to_gpu")) == ints.sum()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_segmented_sums(rng, dt):
    lengths = np.array([0, 1, 5, 0, 200, 33, 64, 3, 0, 90])
    x = spread(rng, int(lengths.sum()) + 7, dt)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    got = to_host(cufold.segmented_reduce(to_device(x), to_device(offsets), deterministic="gpu_to_gpu"))
    assert got.dtype == dt
    want = np.array([host_sum(x[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)], dt)
    assert got.tobytes() == want.tobytes()


def test_errors(rng):
    x = to_device(spread(rng, 64, np.float32).reshape(8, 8))
    with pytest.raises(ValueError, match="cufold: deterministic='gpu_to_gpu' reduces whole"):
        cufold.sum(x, axis=0, deterministic="gpu_to_gpu")
    with pytest.raises(ValueError, match="cufold: deterministic must be"):
        cufold.sum(x, deterministic="run_to_run_please")
    with pytest.raises(ValueError, match="cufold: deterministic='gpu_to_gpu' applies"):
        cufold.reduce(x, cufold.multiplies, deterministic="gpu_to_gpu")
    with pytest.raises(ValueError, match="no init"):
        cufold.reduce(x, cufold.plus, 1.0, deterministic="gpu_to_gpu")
    with pytest.raises(ValueError, match="cufold: deterministic='gpu_to_gpu' applies to sums"):
        cufold.segmented_reduce(to_device(np.ones(4, np.float32)), to_device(np.array([0, 4])), cufold.maximum,
                                deterministic="gpu_to_gpu")
    with pytest.raises(ValueError, match="cufold: states are"):
        R.combine_states(cuda.to_device(np.zeros(7, np.int64)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(to_host(cufold.max(x))) == float(np.max(to_host(x)))


@pytest.mark.skipif(SIMULATOR, reason="GPU sizes")
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_gpu_large_launch_shapes(rng, dt):
    """On a GPU: the default launch against small and large tiles and grids, 2^22 items."""
    x = spread(rng, (1 << 22) + 12345, dt, -40, 40)
    ref = state(x)
    assert as_tuple(ref) == R.host_state(x)
    vts = (1, 8, 32) if dt == np.float32 else (1, 4, 16)
    for tile in ((32, vts[0]), (128, vts[1]), (256, vts[2]), (512, vts[1])):   # 1024 x 80 registers: too many
        for grid in (1, 7, 264, 1000):
            assert state(x, tile=tile, grid=grid, wide=grid % 2 == 0) == ref, (tile, grid)
    b, exact = bound(x, dt)
    assert abs(float(to_host(cufold.sum(to_device(x), deterministic="gpu_to_gpu"))) - exact) <= b


@pytest.mark.skipif(SIMULATOR, reason="GPU sizes")
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_gpu_segmented_sums(rng, dt):
    lengths = rng.integers(0, 3000, 2000)
    lengths[::50] = 0
    lengths[7] = 200000
    x = spread(rng, int(lengths.sum()), dt)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    got = to_host(cufold.segmented_reduce(to_device(x), to_device(offsets), deterministic="gpu_to_gpu"))
    want = np.array([host_sum(x[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)], dt)
    assert got.tobytes() == want.tobytes()


@pytest.mark.skipif(SIMULATOR, reason="the driver's occupancy")
def test_gpu_grid_from_the_drivers_occupancy(rng):
    """The sum's grid is the blocks that fit at once, as the driver counts them (else an
    estimate from registers): the query must work on a GPU."""
    from cufold.device import reproducible as M
    from cufold.host import launch as L
    x = to_device(spread(rng, 1 << 22, np.float32))
    cufold.sum(x, deterministic="gpu_to_gpu")
    kernels = [k for key, k in L._kernels.items() if "binned_sum" in repr(key[0])]
    assert kernels
    for k in kernels:
        nt = 256 if "nt=256" in repr(k.key) else None
        if nt:
            assert M.occupancy(k, 0, nt) >= 2, "occupancy query failed or under 2 blocks of 256"


def test_sum_plan_takes_a_fused_item(rng):
    """sum_plan's ``item`` hook (for dot and norm): a reproducible dot product of two
    arrays in one kernel, the same bits as the binned sum of the materialised products."""
    from cufold import _codegen
    from cufold.host import arrays as A, programs as P
    x, y = spread(rng, 900, np.float32), spread(rng, 900, np.float32)
    dx, dy = to_device(x), to_device(y)
    product = _codegen.build("def item(xs, i):\n    return xs[0][np.uint64(i)] * xs[1][np.uint64(i)]\n", "item")
    ax, ay = A.describe(dx), A.describe(dy)
    b = P.Builder(ax.device_id, A.stream_handle(ax, None), None)
    ix, iy = b.input(ax), b.input(ay)
    out = b.output(ix, (), np.float32)
    R.sum_plan(b, (ix, iy), ax.size, A.window(out, 0, (1,), (1,)), dtype=np.float32, out_dtype=np.float32,
               item=product)
    got = to_host(b.build()(ax, ay))
    assert got == host_sum(x * y)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_frames_rising_and_falling(rng, dt):
    """Items sorted by magnitude: each thread's frame rises tile after tile (bins dropped
    on the way), or starts at the top; both give the state of the whole."""
    x = (rng.choice([-1.0, 1.0], 800) * 2.0 ** rng.uniform(-120, 120, 800)).astype(dt)
    up = x[np.argsort(np.abs(x))]
    ref = R.host_state(x)
    assert as_tuple(state(up, tile=(32, 2), grid=2)) == ref
    assert as_tuple(state(up[::-1].copy(), tile=(32, 2), grid=3)) == ref


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's fma")
def test_simulator_fma_rounds_once():
    @cuda.jit
    def k(a, out):
        out[0] = cuda.fma(a[0], a[0], a[1])
        out[1] = cuda.fma(a[2], a[2], a[3])

    a32 = np.array([1 + 2.0 ** -12, -1, 0, 0], np.float32)
    out32 = np.zeros(2, np.float32)
    k[1, 1](a32, out32)
    assert out32[0] == np.float32(2.0 ** -11 + 2.0 ** -24)
    a64 = np.array([1 + 2.0 ** -27, -1, 2.0 ** 1000, -2.0 ** 1023], np.float64)
    out64 = np.zeros(2, np.float64)
    k[1, 1](a64, out64)
    assert out64[0] == 2.0 ** -26 + 2.0 ** -54 and out64[1] == np.inf


# --- fused items: transform=, dot, vdot, norm (issue 20) ---------------------------------------

def product(v):
    return v[0] * v[1]


def square(v):
    return v * v


def bits(a):
    return np.asarray(a).tobytes()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_fused_sums_bits(rng, dt):
    """sum/reduce/mean of a transform (zipped and generated inputs too), post=: the binned
    sum of the transformed items, bit for bit, within the bound."""
    x, y = spread(rng, 1100, dt), spread(rng, 1100, dt)
    dx, dy = to_device(x), to_device(y)
    got = to_host(cufold.sum(dx, transform=square, deterministic="gpu_to_gpu"))
    assert got.dtype == dt and bits(got) == bits(host_sum(x * x))
    b, exact = bound(x * x, dt)                # of the squares as the transform rounds them
    assert abs(float(got) - exact) <= b
    out = cuda.to_device(np.full(1, np.nan, dt))
    cufold.reduce((dx, dy), cufold.plus, transform=product, deterministic="gpu_to_gpu", out=out)
    assert bits(to_host(out)[0]) == bits(host_sum(x * y))
    m = to_host(cufold.mean(dx, transform=abs, deterministic="gpu_to_gpu"))
    assert bits(m) == bits(dt(R.host_finalise(R.host_state(np.abs(x)), dt) / x.size))
    root = to_host(cufold.sum(dx, transform=square, post=math.sqrt, deterministic="gpu_to_gpu"))
    assert root.dtype == dt and root == dt(math.sqrt(float(host_sum(x * x))))    # post sees the dt sum
    ramp = to_host(cufold.sum((dx, cufold.counting(x.size, dtype=dt)), transform=product,
                              deterministic="gpu_to_gpu"))
    assert bits(ramp) == bits(host_sum(x * np.arange(x.size, dtype=dt)))
    half = to_host(cufold.sum(cufold.counting(999, dtype=dt), transform=lambda v: v * dt(0.5),
                              deterministic="gpu_to_gpu"))
    assert half == dt(999 * 998 / 4)
    ints = rng.integers(-99, 99, 500).astype(np.int32)   # an integer transform: the ordinary (exact) sum
    assert to_host(cufold.sum(to_device(ints), transform=square, deterministic="gpu_to_gpu")) == \
        (ints.astype(np.int64) ** 2).sum()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_dot_vdot_norm_bits(rng, dt):
    x, y = spread(rng, 1000, dt, -20, 20), spread(rng, 1000, dt, -20, 20)
    dx, dy = to_device(x), to_device(y)
    d = to_host(cufold.dot(dx, dy, deterministic="gpu_to_gpu"))
    assert d.dtype == dt and bits(d) == bits(host_sum(x * y))
    assert abs(float(d) - math.fsum(x.astype(np.float64) * y)) <= bound(x * y, dt)[0] + \
        2 * 1000 * np.finfo(dt).eps * float(np.abs(x.astype(np.float64) * y).max())   # each product rounded
    v = to_host(cufold.vdot(to_device(x.reshape(25, 40)), to_device(y.reshape(25, 40)), deterministic="gpu_to_gpu"))
    assert bits(v) == bits(d)
    n2 = to_host(cufold.norm(dx, deterministic="gpu_to_gpu"))
    assert n2.dtype == dt and bits(n2) == bits(dt(math.sqrt(host_sum(x * x))))
    n1 = to_host(cufold.norm(dx, 1, deterministic="gpu_to_gpu"))
    assert bits(n1) == bits(host_sum(np.abs(x)))
    assert to_host(cufold.norm(dx, np.inf, deterministic="gpu_to_gpu")) == np.abs(x).max()
    assert to_host(cufold.norm(dx, -np.inf, deterministic="gpu_to_gpu")) == np.abs(x).min()
    assert to_host(cufold.norm(to_device(x.reshape(20, 50)), axis=(0, 1), deterministic="gpu_to_gpu")) == n2
    out = cuda.to_device(np.full(1, np.nan, dt))
    assert cufold.dot(dx, dy, out, deterministic="gpu_to_gpu") is out and bits(to_host(out)[0]) == bits(d)


def test_dot_float16_and_integers(rng):
    h, g = rng.standard_normal(700).astype(np.float16), rng.standard_normal(700).astype(np.float16)
    got = to_host(cufold.dot(to_device(h), to_device(g), deterministic="gpu_to_gpu"))
    p = h.astype(np.float32) * g.astype(np.float32)        # float16 multiplies in float32
    assert got.dtype == np.float16 and bits(got) == bits(np.float16(R.host_finalise(R.host_state(p), np.float32)))
    a, b = rng.integers(-1000, 1000, 700).astype(np.int32), rng.integers(-1000, 1000, 700).astype(np.int32)
    assert to_host(cufold.dot(to_device(a), to_device(b), deterministic="gpu_to_gpu")) == \
        int((a.astype(np.int64) * b).sum())


def test_fused_same_bits_for_every_launch_permutation_and_split(rng, monkeypatch):
    """A dot product's state (sum_state with a transform of zipped pieces) does not change with
    the tile, the grid, the order of the pairs or a split into pieces combined later; the
    combined pieces finalise to cufold.dot's bits."""
    dt = np.float32
    x, y = spread(rng, 800, dt, -40, 40), spread(rng, 800, dt)
    ref = R.host_state(x * y)
    whole = state((to_device(x), to_device(y)), transform=product)
    assert as_tuple(whole) == ref
    for tile, grid in (((32, 1), 1), ((32, 4), 3), ((64, 2), 2), ((96, 3), 5)):
        assert state((to_device(x), to_device(y)), transform=product, tile=tile, grid=grid) == whole, (tile, grid)
    p = rng.permutation(x.size)
    assert state((to_device(x[p]), to_device(y[p])), transform=product) == whole
    d = to_host(cufold.dot(to_device(x), to_device(y), deterministic="gpu_to_gpu"))
    for _ in range(2):
        cuts = np.sort(rng.choice(np.arange(1, x.size), 3, replace=False))
        p = rng.permutation(x.size)
        pieces = [np.asarray(state((to_device(a), to_device(b)), transform=product), np.int64)
                  for a, b in zip(np.split(x[p], cuts), np.split(y[p], cuts), strict=True)]
        assert tuple(to_host(R.combine_states(cuda.to_device(np.stack(pieces))))) == whole
        assert bits(to_host(R.finalise(cuda.to_device(np.stack(pieces)), dt))) == bits(d)
    monkeypatch.setenv("CUFOLD_TILE", "64x8")
    assert bits(to_host(cufold.dot(to_device(x), to_device(y), deterministic="gpu_to_gpu"))) == bits(d)
    assert bits(to_host(cufold.norm(to_device(x), deterministic="gpu_to_gpu"))) == \
        bits(dt(math.sqrt(host_sum(x * x))))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_fused_segmented_sums(rng, dt):
    lengths = np.array([0, 1, 5, 0, 150, 33, 64, 3, 0, 70])
    n = int(lengths.sum()) + 5
    x, y = spread(rng, n, dt), spread(rng, n, dt)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    segs = list(zip(offsets[:-1], offsets[1:], strict=True))
    got = to_host(cufold.segmented_reduce(to_device((x, y)), to_device(offsets), transform=product,
                                          deterministic="gpu_to_gpu"))
    assert got.dtype == dt
    assert bits(got) == bits(np.array([host_sum((x * y)[a:b]) for a, b in segs], dt))
    got = to_host(cufold.segmented_reduce(to_device(x), to_device(offsets), transform=abs,
                                          deterministic="gpu_to_gpu"))
    assert bits(got) == bits(np.array([host_sum(np.abs(x[a:b])) for a, b in segs], dt))
    ramp = np.arange(n, dtype=dt)
    got = to_host(cufold.segmented_reduce(cufold.counting(n, dtype=dt), to_device(offsets), transform=square,
                                          deterministic="gpu_to_gpu"))
    assert bits(got) == bits(np.array([host_sum((ramp * ramp)[a:b]) for a, b in segs], dt))


def test_fused_errors(rng):
    x = to_device(spread(rng, 64, np.float32).reshape(8, 8))
    with pytest.raises(ValueError, match="cufold: deterministic='gpu_to_gpu' reduces whole"):
        cufold.norm(x, axis=0, deterministic="gpu_to_gpu")
    with pytest.raises(ValueError, match="non-contiguous"):
        # (a strided view: Numba's device .T is a transposed copy, contiguous, on a GPU)
        cufold.vdot(x[:, ::2], x[:, 1::2], deterministic="gpu_to_gpu")
    with pytest.raises(TypeError, match="sum_state takes"):
        R.sum_state((x, x), transform=lambda v: (v[0], v[1]))
    with pytest.raises(TypeError, match="transform <lambda>"):
        cufold.sum(x, transform=lambda v: v * 2, dtype=np.int64, deterministic="gpu_to_gpu")
    with pytest.raises(ValueError, match="feature rows"):        # rows: run to run only, never silently
        cufold.segmented_reduce(to_device(np.ones((4, 3), np.int32)), to_device(np.array([0, 4])),
                                transform=lambda v: v * 0.5, deterministic="gpu_to_gpu")
    e = to_device(np.zeros(0, np.float32))
    assert float(to_host(cufold.norm(e, deterministic="gpu_to_gpu"))) == 0.0
    assert float(to_host(cufold.dot(e, e, deterministic="gpu_to_gpu"))) == 0.0
    assert float(to_host(cufold.sum(e, transform=square, post=lambda s: s + 1, deterministic="gpu_to_gpu"))) == 1


@pytest.mark.skipif(SIMULATOR, reason="GPU sizes")
def test_gpu_fused_dot_launch_shapes(rng):
    """On a GPU: a dot product's state (2^22 pairs) for small and large tiles and grids, and
    cufold.dot's bits against the host model."""
    dt = np.float32
    x, y = spread(rng, (1 << 22) + 777, dt, -30, 30), spread(rng, (1 << 22) + 777, dt)
    dx, dy = to_device(x), to_device(y)
    ref = R.host_state(x * y)
    for tile in ((32, 1), (128, 8), (256, 32)):
        for grid in (1, 264, 1000):
            assert as_tuple(state((dx, dy), transform=product, tile=tile, grid=grid)) == ref, (tile, grid)
    assert bits(to_host(cufold.dot(dx, dy, deterministic="gpu_to_gpu"))) == bits(host_sum(x * y))
    assert bits(to_host(cufold.norm(dx, deterministic="gpu_to_gpu"))) == bits(dt(math.sqrt(host_sum(x * x))))
