"""Tests of cufold.thread: sequential reduce and scans over one thread's items.

Each thread of an ordinary ``@cuda.jit`` kernel folds its own row of items
(a ``cuda.local.array`` for scalars, rows of global arrays for tuple values)
and the results are compared on the host with a NumPy ordered fold. No warp
intrinsics: these run fast in the simulator and unchanged on a GPU.

Run: PYTHONPATH=src python -m pytest tests/test_thread.py -q
"""

import functools

import numpy as np
import pytest
from numba import cuda

import cufold
from cufold import ops, thread

pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning",
    "ignore:invalid value encountered:RuntimeWarning",
)

NTHREADS = 32


def _dev(a):
    if isinstance(a, tuple):
        return tuple(_dev(x) for x in a)
    if isinstance(a, np.ndarray):
        return cuda.to_device(a)
    return a


def _host(d):
    if isinstance(d, tuple):
        return tuple(_host(x) for x in d)
    if hasattr(d, "copy_to_host"):
        return d.copy_to_host()
    return d


def launch(kernel, nblocks, nthreads, *args):
    dev = [_dev(a) for a in args]
    kernel[nblocks, nthreads](*dev)
    cuda.synchronize()
    return [_host(d) for d in dev]


# ---------------------------------------------------------------------------
# Operators with a NumPy reference fold over a sequence (one array per field)


def _affine(f, g):
    return (f[0] * g[0], f[1] * g[0] + g[1])


def _matmul(x, y):
    return (x[0] * y[0] + x[1] * y[2], x[0] * y[1] + x[1] * y[3],
            x[2] * y[0] + x[3] * y[2], x[2] * y[1] + x[3] * y[3])


def _triple(p, q):
    return (p[0] + q[0], p[1] + q[1], p[2] + q[2])


def _last(a, b):  # associative, not commutative
    return b


def full_range(rng, dt, shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


def ufunc_fold(ufunc, dt):
    return lambda fs: (ufunc.reduce(fs[0], dtype=dt),)


def fold_affine(fs):
    a, b = 1.0, 0.0
    for c, d in zip(*fs):
        a, b = a * c, b * c + d
    return np.float64(a), np.float64(b)


def fold_matmul(fs):
    m = np.eye(2, dtype=np.int64)
    for a, b, c, d in zip(*fs):
        m = m @ np.array([[a, b], [c, d]], np.int64)
    return tuple(np.int64(v) for v in m.ravel())


def fold_argmax(fs):
    vals, idx = fs
    order = np.argsort(idx, kind="stable")
    j = order[np.argmax(vals[order])]
    return vals[j], idx[j]


def gen_plus_int8(rng, shape):
    return [full_range(rng, np.int8, shape)]


def gen_max_f32(rng, shape):
    x = (rng.integers(-20, 20, size=shape) / 4).astype(np.float32)
    x[::3, -1] = np.nan  # NaN propagates, as numpy.maximum
    x[1::4, 0] = np.nan
    x[2::5, min(1, shape[1] - 1)] = -np.inf
    return [x]


def gen_uint64(rng, shape):
    return [full_range(rng, np.uint64, shape) | np.uint64(1 << 63)]


def gen_last(rng, shape):
    return [rng.normal(size=shape).astype(np.float16)]


def gen_affine(rng, shape):
    return [rng.choice([-2.0, -1.0, 1.0, 2.0], size=shape),
            rng.integers(-8, 9, size=shape).astype(np.float64)]


def gen_matmul(rng, shape):
    basis = np.array([[1, 1, 0, 1], [1, -1, 0, 1], [1, 0, 1, 1], [0, 1, 1, 0], [-1, 0, 0, 1]],
                     np.int64)
    pick = rng.integers(0, len(basis), size=shape)
    return [basis[pick, k] for k in range(4)]


def gen_argmax(rng, shape):
    vals = (rng.integers(-3, 3, size=shape) / 2).astype(np.float32)  # ties
    vals[::4, min(2, shape[1] - 1)] = np.nan
    vals[::8, 0] = np.nan
    idx = np.stack([rng.permutation(shape[1]) for _ in range(shape[0])]).astype(np.int32) + 10
    return [vals, idx]


def gen_triple(rng, shape):
    return [full_range(rng, np.int16, shape),
            rng.integers(-1000, 1000, size=shape).astype(np.float32),
            full_range(rng, np.uint8, shape)]


CASES = {
    # name: (op, value type, generator, fold)
    "plus-int8": (ops.plus, np.int8, gen_plus_int8, ufunc_fold(np.add, np.int8)),
    "max-float32": (ops.maximum, np.float32, gen_max_f32, ufunc_fold(np.maximum, np.float32)),
    "xor-uint64": (ops.bit_xor, np.uint64, gen_uint64, ufunc_fold(np.bitwise_xor, np.uint64)),
    "min-uint64": (ops.minimum, np.uint64, gen_uint64, ufunc_fold(np.minimum, np.uint64)),
    "last-float16": (_last, np.float16, gen_last, lambda fs: (fs[0][-1],)),
    "affine": (ops.Op(_affine, identity=(1.0, 0.0)), (np.float64, np.float64), gen_affine,
               fold_affine),
    "matmul": (_matmul, (np.int64,) * 4, gen_matmul, fold_matmul),
    "argmax": (ops.argmax, (np.float32, np.int32), gen_argmax, fold_argmax),
    "triple": (_triple, (np.int16, np.float32, np.uint8), gen_triple,
               lambda fs: tuple(np.add.reduce(f, dtype=f.dtype) for f in fs)),
}


def _row1(a, t):
    return a[t]


def _row2(a, t):
    return (a[0][t], a[1][t])


def _row3(a, t):
    return (a[0][t], a[1][t], a[2][t])


def _row4(a, t):
    return (a[0][t], a[1][t], a[2][t], a[3][t])


ROWS = {1: _row1, 2: _row2, 3: _row3, 4: _row4}


@functools.lru_cache(maxsize=None)
def rows_kernel(name, n):
    """Every thread folds row ``t`` of the inputs: reduce, inclusive scan
    (with its prefix where ``has_prefix[t]``), exclusive scan, and both scans
    in place."""
    op, spec, _, _ = CASES[name]
    vt = cufold.ValueType.of(spec)
    # Inlined: a device function may not return a view of an array it was passed.
    rows = cuda.jit(device=True, inline="always")(ROWS[vt.arity if vt.is_tuple else 1])
    load, store = vt.load, vt.store
    red = thread.reduce(op, vt, n)
    inc = thread.inclusive_scan(op, vt, n)
    exc = thread.exclusive_scan(op, vt, n)

    @cuda.jit
    def k_rows(x, prefix, has_prefix, totals, inc_out, exc_out, inc_in_place, exc_in_place):
        t = cuda.grid(1)
        items = rows(x, t)
        p = load(prefix, t)
        store(totals, 0 * NTHREADS + t, red(items))
        store(totals, 1 * NTHREADS + t, inc(items, rows(inc_out, t), p, has_prefix[t]))
        store(totals, 2 * NTHREADS + t, exc(items, rows(exc_out, t), p))
        store(totals, 3 * NTHREADS + t, inc(rows(inc_in_place, t), rows(inc_in_place, t), p, has_prefix[t]))
        store(totals, 4 * NTHREADS + t, exc(rows(exc_in_place, t), rows(exc_in_place, t), p))

    return k_rows


def pack(vt, fields):
    return tuple(fields) if vt.is_tuple else fields[0]


def unpack(vt, arg):
    return list(arg) if vt.is_tuple else [arg]


def same(got, exp):
    for g, e in zip(got, exp):
        if isinstance(e, (float, np.floating)) and np.isnan(e):
            if not np.isnan(g):
                return False
        elif g != e:
            return False
    return True


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("name", sorted(CASES))
def test_reduce_and_scans(name, n, rng):
    op, spec, gen, fold = CASES[name]
    vt = cufold.ValueType.of(spec)
    xf = gen(rng, (NTHREADS, n))
    pf = [f[:, 0] for f in gen(rng, (NTHREADS, 1))]
    has_prefix = (np.arange(NTHREADS) % 3) != 1
    totals = [np.zeros(5 * NTHREADS, f) for f in vt.fields]  # vt.store takes one index
    inc_out = [np.zeros_like(f) for f in xf]
    exc_out = [np.zeros_like(f) for f in xf]
    res = launch(rows_kernel(name, n), 1, NTHREADS, pack(vt, xf), pack(vt, pf), has_prefix,
                 pack(vt, totals), pack(vt, inc_out), pack(vt, exc_out),
                 pack(vt, [f.copy() for f in xf]), pack(vt, [f.copy() for f in xf]))
    totals, inc_out, exc_out, inc_ip, exc_ip = (unpack(vt, r) for r in res[3:])
    totals = [f.reshape(5, NTHREADS) for f in totals]
    bad = []

    def check(what, got, exp):
        if not same(got, exp):
            bad.append("%s: got %r, expected %r" % (what, got, exp))

    def at(fields, *idx):
        return tuple(f[idx] for f in fields)

    for t in range(NTHREADS):
        seq = [f[t] for f in xf]
        p = at(pf, t)
        seeded = [np.concatenate([[pv], s]).astype(s.dtype) for pv, s in zip(p, seq)]
        total = fold(seq)
        check("reduce thread %d" % t, at(totals, 0, t), total)
        check("inclusive total thread %d" % t, at(totals, 1, t), total)
        check("inclusive in place total thread %d" % t, at(totals, 3, t), total)
        check("exclusive total thread %d" % t, at(totals, 2, t), fold(seeded))
        check("exclusive in place total thread %d" % t, at(totals, 4, t), fold(seeded))
        for k in range(n):
            if has_prefix[t]:
                inc_exp = fold([s[:k + 2] for s in seeded])
            else:
                inc_exp = fold([s[:k + 1] for s in seq])
            exc_exp = fold([s[:k + 1] for s in seeded])
            check("inclusive thread %d item %d" % (t, k), at(inc_out, t, k), inc_exp)
            check("inclusive in place thread %d item %d" % (t, k), at(inc_ip, t, k), inc_exp)
            check("exclusive thread %d item %d" % (t, k), at(exc_out, t, k), exc_exp)
            check("exclusive in place thread %d item %d" % (t, k), at(exc_ip, t, k), exc_exp)
    assert not bad, "%s n=%d: %d wrong:\n  %s" % (name, n, len(bad), "\n  ".join(bad[:12]))


@functools.lru_cache(maxsize=None)
def local_kernel(dt, n):
    """Items in registers (``cuda.local.array``), as in a real kernel."""
    red = thread.reduce(ops.plus, dt, n)
    inc = thread.inclusive_scan(ops.plus, dt, n)
    exc = thread.exclusive_scan(ops.plus, dt, n)

    @cuda.jit
    def k_local(x, totals, scans):
        t = cuda.grid(1)
        items = cuda.local.array(n, dt)
        for k in range(n):
            items[k] = x[t, k]
        totals[0, t] = red(items)
        out = cuda.local.array(n, dt)
        totals[1, t] = inc(items, out, dt(0), False)
        for k in range(n):
            scans[0, t, k] = out[k]
        totals[2, t] = exc(items, items, dt(100))
        for k in range(n):
            scans[1, t, k] = items[k]

    return k_local


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("dt", [np.int8, np.uint32, np.float32, np.float64, np.bool_])
def test_items_in_local_memory(dt, n, rng):
    if dt == np.bool_:
        x = rng.random((NTHREADS, n)) < 0.3
    elif np.dtype(dt).kind in "iu":
        x = full_range(rng, dt, (NTHREADS, n))
    else:
        x = rng.integers(-100, 100, size=(NTHREADS, n)).astype(dt) / 4
    totals = np.zeros((3, NTHREADS), dt)
    scans = np.zeros((2, NTHREADS, n), dt)
    totals, scans = launch(local_kernel(dt, n), 1, NTHREADS, x, totals, scans)[1:]
    dt = np.dtype(dt)
    start = dt.type(100)
    np.testing.assert_array_equal(totals[0], np.add.reduce(x, axis=1, dtype=dt))
    np.testing.assert_array_equal(totals[1], np.add.reduce(x, axis=1, dtype=dt))
    np.testing.assert_array_equal(scans[0], np.add.accumulate(x, axis=1, dtype=dt))
    seeded = np.concatenate([np.full((NTHREADS, 1), start, dt), x], axis=1)
    acc = np.add.accumulate(seeded, axis=1, dtype=dt)
    np.testing.assert_array_equal(scans[1], acc[:, :-1])
    np.testing.assert_array_equal(totals[2], acc[:, -1])


# ---------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("factory", [thread.reduce, thread.inclusive_scan, thread.exclusive_scan])
def test_bad_input(factory):
    for count in (0, -3, 2.5, "4", None, True, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="cufold: items_per_thread must be a positive integer"):
            factory(ops.plus, np.float32, count)
    with pytest.raises(TypeError, match="cufold: .*two values"):
        factory(lambda a: a, np.float32, 4)
    with pytest.raises(TypeError, match="cufold: .*two values"):
        factory(lambda a, b, c: a, np.float32, 4)
    with pytest.raises(TypeError, match="cufold: values of dtype complex64"):
        factory(ops.plus, np.complex64, 4)
    with pytest.raises(TypeError, match="cufold: operator bit_or is not defined for dtype float64"):
        factory(ops.bit_or, np.float64, 4)
    with pytest.raises(TypeError, match="cufold: operator .* must return a value of type"):
        factory(lambda a, b: (a[0], b[1]), (np.float32, np.int32, np.int8), 4)
    assert factory(ops.plus, np.float32, 4) is factory(ops.plus, np.float32, 4)
    factory(ops.plus, np.float32, np.int64(3))
