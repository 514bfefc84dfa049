"""Tests of cufold.warp against plain NumPy references.

Every primitive runs in ordinary ``@cuda.jit`` kernels that write into device
arrays; results are compared on the host with a NumPy model of the ordered
fold (``x0 op x1 op ...`` in lane order), so the same tests run in the CPU
simulator (CI) and on a GPU.

To keep the simulator fast, one launch computes many cases: each kernel loops
over rows of input, one row per call of every primitive, and a 32-lane warp of
width ``w`` holds ``32 // w`` independent logical warps.

Run: PYTHONPATH=src python -m pytest tests/test_warp.py -q
"""

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from numba import cuda

import cufold
from cufold import ops, warp
from conftest import run_sm90_script

FULL = 0xFFFFFFFF
POW2_WIDTHS = [1, 2, 4, 8, 16, 32]
ODD_WIDTHS = [5, 24]  # non-powers of two: the first logical warp only
WIDTHS = POW2_WIDTHS + ODD_WIDTHS

# The simulator computes with NumPy scalars, which warn when integer
# arithmetic wraps around; the wrap-around is exactly what is compared.
pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning",
    "ignore:invalid value encountered:RuntimeWarning",
)

HYPO = settings(max_examples=10, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---------------------------------------------------------------------------
# Launching


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
    """Launch with device copies of ``args`` (arrays or tuples of arrays);
    return every argument copied back to the host."""
    dev = [_dev(a) for a in args]
    kernel[nblocks, nthreads](*dev)
    cuda.synchronize()
    return [_host(d) for d in dev]


def pack(vt, fields):
    """Kernel argument for a value type: one array, or a tuple of arrays."""
    return tuple(fields) if vt.is_tuple else fields[0]


def unpack(vt, arg):
    return list(arg) if vt.is_tuple else [arg]


# ---------------------------------------------------------------------------
# Operator cases: an operator, a value type, inputs and a NumPy reference.


class Case:
    """``fold(fields)``: the ordered fold of a non-empty segment, given as one
    1-D array per field, returned as a tuple of NumPy scalars. ``scan`` gives
    the inclusive prefixes (default: fold of each prefix). ``compare``:
    'exact' (NaN equals NaN), 'truth' (logical operators: truth values) or
    'close' (``rtol``)."""

    def __init__(self, name, op, dtype, gen, fold, scan=None, initial=None,
                 compare="exact", rtol=0.0):
        self.name = name
        self.op = op
        self.vt = cufold.ValueType.of(dtype)
        self.gen = gen
        self._fold = fold
        self._scan = scan
        ident = ops.as_op(op).identity_for(self.vt)
        self.identity = None if ident is None else self._tuple(ident)
        self.initial = initial
        self.compare = compare
        self.rtol = rtol

    def __repr__(self):
        return self.name

    def _tuple(self, v):
        return tuple(v) if self.vt.is_tuple else (v,)

    def fold(self, fields):
        return tuple(self._fold([np.asarray(f) for f in fields]))

    def scan(self, fields):
        n = len(fields[0])
        if self._scan is not None:
            cols = self._scan([np.asarray(f) for f in fields])
            return [tuple(c[k] for c in cols) for k in range(n)]
        return [self.fold([f[: k + 1] for f in fields]) for k in range(n)]

    def exclusive(self, fields, start):
        """Exclusive prefixes seeded with ``start`` (a tuple)."""
        seeded = [np.concatenate([np.array([s], dtype=f.dtype), f])
                  for s, f in zip(start, fields)]
        return self.scan(seeded)[:-1]

    def same(self, got, exp):
        for g, e in zip(got, exp):
            if self.compare == "truth":
                if bool(g) != bool(e):
                    return False
            elif self.compare == "close":
                if not np.isclose(float(g), float(e), rtol=self.rtol, atol=self.rtol):
                    return False
            else:
                g_nan = isinstance(g, np.floating) and np.isnan(g)
                e_nan = isinstance(e, (float, np.floating)) and np.isnan(e)
                if g_nan or e_nan:
                    if not (g_nan and e_nan):
                        return False
                elif g != e:
                    return False
        return True


def ufunc_case(name, op, dtype, ufunc, gen, compare="exact", initial=None):
    dt = np.dtype(dtype)

    def fold(fs):
        return (ufunc.reduce(fs[0], dtype=dt),)

    def scan(fs):
        return [ufunc.accumulate(fs[0], dtype=dt)]

    if compare == "truth":
        def fold(fs):  # noqa: F811
            return (ufunc.reduce(fs[0] != 0),)

        def scan(fs):  # noqa: F811
            return [ufunc.accumulate(fs[0] != 0)]

    return Case(name, op, dt, gen, fold, scan, initial=initial, compare=compare)


DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, np.float32, np.float64, np.bool_]


def full_range(rng, dt, shape):
    """Integers over the whole range of ``dt`` (uint32 above 2**31, uint64
    above 2**63 half of the time)."""
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


def gen_scalar(dtype, opname):
    dt = np.dtype(dtype)

    def gen(rng, shape):
        if dt.kind == "b":
            x = rng.random(shape) < 0.7
            x[0] = True  # a row of all-true
            return [x]
        if opname == "multiplies":
            if dt.kind in "iu":
                choices = [1, 3, 5, 7, 9] if dt.kind == "u" else [1, 3, 5, -1, -3, -7]
                x = rng.choice(choices, size=shape).astype(dt)
                x[rng.random(shape) < 0.08] = 2
                return [x]
            # +-1 with a few 2s and 0.5s: every product is exact, even in float16.
            x = rng.choice([1.0, -1.0], size=shape)
            for r in range(shape[0]):
                for val in (2.0, 0.5, 3.0):
                    x[r, rng.choice(shape[1], size=min(3, shape[1]), replace=False)] = val
            return [x.astype(dt)]
        if opname in ("logical_and", "logical_or"):
            x = full_range(rng, dt, shape) if dt.kind in "iu" else rng.normal(0, 4, shape).astype(dt)
            x[rng.random(shape) < 0.3] = 0
            x[0, rng.integers(shape[1])] = 0
            if shape[0] > 1:
                x[1] = np.where(x[1] == 0, 1, x[1])  # a row without zeros
                if dt.kind == "f":
                    x[1, rng.integers(shape[1])] = np.nan
            return [x]
        if dt.kind in "iu":
            return [full_range(rng, dt, shape)]
        if opname == "plus":
            # Exactly representable partial sums in any order.
            if dt == np.float16:
                return [rng.integers(-30, 31, size=shape).astype(dt)]
            return [(rng.integers(-8000, 8001, size=shape) / 8).astype(dt)]
        # minimum / maximum: many ties; the second row holds NaN and infinities.
        x = (rng.integers(-40, 40, size=shape) / 4).astype(dt)
        if shape[0] > 1:
            x[1, rng.integers(shape[1])] = np.nan
            x[1, rng.integers(shape[1])] = np.inf
            x[1, rng.integers(shape[1])] = -np.inf
        if shape[0] > 2:
            x[2, rng.choice(shape[1], size=3, replace=False)] = np.nan
        return [x]

    return gen


UFUNCS = {
    "plus": np.add, "multiplies": np.multiply, "minimum": np.minimum, "maximum": np.maximum,
    "bit_and": np.bitwise_and, "bit_or": np.bitwise_or, "bit_xor": np.bitwise_xor,
    "logical_and": np.logical_and, "logical_or": np.logical_or,
}


def scalar_case(dtype, opname):
    dt = np.dtype(dtype)
    compare = "truth" if opname.startswith("logical") else "exact"
    return ufunc_case("%s-%s" % (opname, dt), getattr(ops, opname), dt, UFUNCS[opname],
                      gen_scalar(dt, opname), compare=compare)


def scalar_matrix():
    out = []
    for dt in DTYPES:
        kind = np.dtype(dt).kind
        ops = ["plus", "multiplies", "minimum", "maximum"]
        if kind in "biu":
            ops += ["bit_and", "bit_or", "bit_xor"]
        if dt in (np.int8, np.uint32, np.uint64, np.float16, np.float32, np.bool_):
            ops += ["logical_and", "logical_or"]
        out += [(dt, o) for o in ops]
    return out


# --- tuple-valued and non-commutative operators ---------------------------


def arg_case(which, dtype, index_dtype):
    """argmin/argmax over (value, index): ties go to the lowest index, NaN
    wins as in numpy.argmax (the first NaN by index)."""
    dt, it = np.dtype(dtype), np.dtype(index_dtype)
    np_arg = np.argmax if which == "argmax" else np.argmin

    def fold(fs):
        vals, idx = fs
        order = np.argsort(idx, kind="stable")
        j = order[np_arg(vals[order])]
        return vals[j], idx[j]

    def gen(rng, shape):
        if dt.kind == "f":
            vals = (rng.integers(-6, 6, size=shape) / 2).astype(dt)  # many ties
            if shape[0] > 1:
                vals[1, rng.choice(shape[1], size=3, replace=False)] = np.nan
        else:
            lo = 0 if dt.kind == "u" else -2
            vals = (rng.integers(lo, lo + 5, size=shape) << (8 * dt.itemsize - 3)).astype(dt)
        # Indices are not in lane order, so the tie-break is by index.
        idx = np.stack([rng.permutation(shape[1]) for _ in range(shape[0])]).astype(it) * 3 + 7
        return [vals, idx]

    return Case("%s-(%s,%s)" % (which, dt, it), getattr(ops, which), (dt, it), gen, fold,
                initial=(dt.type(0.5 if dt.kind == "f" else 1), it.type(5)))


def gen_matrices(rng, shape):
    """Elementary 2x2 integer matrices (entries -1..1, determinant +-1): they
    do not commute, and products of 32 of them stay far below 2**62."""
    basis = np.array([[1, 1, 0, 1], [1, -1, 0, 1], [1, 0, 1, 1], [1, 0, -1, 1],
                      [0, 1, 1, 0], [-1, 0, 0, 1], [1, 0, 0, 1]], np.int64)
    pick = rng.integers(0, len(basis), size=shape)
    return [basis[pick, k] for k in range(4)]


def fold_matrices(fs):
    m = np.eye(2, dtype=np.int64)
    for a, b, c, d in zip(*fs):
        m = m @ np.array([[a, b], [c, d]], np.int64)
    return tuple(np.int64(v) for v in m.ravel())


def _matmul(x, y):
    return (x[0] * y[0] + x[1] * y[2], x[0] * y[1] + x[1] * y[3],
            x[2] * y[0] + x[3] * y[2], x[2] * y[1] + x[3] * y[3])


MATMUL = ops.Op(_matmul, identity=(1, 0, 0, 1), name="matmul")


def _affine(f, g):
    # x -> a*x + b, then x -> c*x + d
    return (f[0] * g[0], f[1] * g[0] + g[1])


AFFINE = ops.Op(_affine, identity=(1.0, 0.0), name="affine")


def gen_affine(rng, shape):
    a = rng.choice([-2.0, -1.0, 1.0, 2.0], size=shape)
    b = rng.integers(-8, 9, size=shape).astype(np.float64)
    return [a, b]


def fold_affine(fs):
    a, b = 1.0, 0.0
    for c, d in zip(*fs):
        a, b = a * c, b * c + d
    return np.float64(a), np.float64(b)


def _triple(p, q):
    return (p[0] + q[0], p[1] + q[1], p[2] + q[2])


TRIPLE_T = (np.int16, np.float32, np.uint8)


def gen_triple(rng, shape):
    return [full_range(rng, np.int16, shape),
            rng.integers(-1000, 1000, size=shape).astype(np.float32),
            full_range(rng, np.uint8, shape)]


def fold_triple(fs):
    return tuple(np.add.reduce(f, dtype=f.dtype) for f in fs)


def scan_triple(fs):
    return [np.add.accumulate(f, dtype=f.dtype) for f in fs]


def plus_one(a, b):  # associative, no identity: a plain user function
    return a + b + 1


def fold_plus_one(fs):
    x = fs[0].astype(np.int64)
    return (np.int64(x.sum() + len(x) - 1).astype(np.int32),)


def gen_int32_small(rng, shape):
    return [rng.integers(-10**6, 10**6, size=shape).astype(np.int32)]


def welford_case(dtype):
    dt = np.dtype(dtype)
    tol = 1e-4 if dt == np.float32 else 1e-10

    def gen(rng, shape):
        x = (rng.normal(3.0, 2.0, size=shape)).astype(dt)
        return [np.ones(shape, dt), x, np.zeros(shape, dt)]

    def fold(fs):
        # Merge (count, mean, M2) groups exactly (in float64).
        cnt, mean, m2 = (f.astype(np.float64) for f in fs)
        n = cnt.sum()
        if n == 0:
            return 0.0, 0.0, 0.0
        mu = (cnt * mean).sum() / n
        return n, mu, (m2 + cnt * (mean - mu) ** 2).sum()

    return Case("welford-%s" % dt, ops.welford, (dt, dt, dt), gen, fold,
                compare="close", rtol=tol)


def minmax_case():
    def gen(rng, shape):
        x = (rng.integers(-50, 50, size=shape) / 2).astype(np.float32)
        y = full_range(rng, np.int8, shape)
        if shape[0] > 1:
            x[1, rng.integers(shape[1])] = np.nan
        return [x, y]

    def fold(fs):
        return np.minimum.reduce(fs[0]), np.maximum.reduce(fs[1])

    return Case("minmax-(float32,int8)", ops.minmax, (np.float32, np.int8), gen, fold)


CASES = {
    "plus-int16": ufunc_case("plus-int16", ops.plus, np.int16, np.add,
                             gen_scalar(np.int16, "plus"), initial=np.int16(-30000)),
    "max-uint32": ufunc_case("max-uint32", ops.maximum, np.uint32, np.maximum,
                             gen_scalar(np.uint32, "maximum"), initial=np.uint32(3 << 30)),
    "matmul": Case("matmul", MATMUL, (np.int64,) * 4, gen_matrices, fold_matrices,
                   initial=(np.int64(1), np.int64(1), np.int64(0), np.int64(1))),
    "affine": Case("affine", AFFINE, (np.float64, np.float64), gen_affine, fold_affine,
                   initial=(np.float64(2.0), np.float64(-3.0))),
    "triple": Case("triple", ops.Op(_triple, identity=(0, 0, 0)), TRIPLE_T, gen_triple,
                   fold_triple, scan_triple,
                   initial=(np.int16(-7), np.float32(0.5), np.uint8(250))),
    # A plain lambda (wrapped by as_op), associative, with no identity.
    "lambda": Case("lambda", lambda a, b: a + b + 1, np.int32, gen_int32_small, fold_plus_one,
                   initial=np.int32(11)),
    "argmax": arg_case("argmax", np.float32, np.int32),
    "argmin": arg_case("argmin", np.float64, np.int64),
    "argmax-int": arg_case("argmax", np.int16, np.int64),
    "argmin-uint": arg_case("argmin", np.uint32, np.uint32),
    "minmax": minmax_case(),
    "welford32": welford_case(np.float32),
    "welford64": welford_case(np.float64),
}


# ---------------------------------------------------------------------------
# Checking


class Errors:
    def __init__(self, case):
        self.case = case
        self.items = []
        self.count = 0

    def check(self, what, got, exp):
        self.count += 1
        if not self.case.same(got, exp):
            self.items.append("%s: got %r, expected %r" % (what, got, exp))

    def done(self):
        assert self.count > 0
        if self.items:
            head = "\n  ".join(self.items[:12])
            pytest.fail("%s: %d of %d results wrong:\n  %s" % (
                self.case.name, len(self.items), self.count, head))


def lane(fields, r, t):
    return tuple(f[r, t] for f in fields)


def groups(n, width, ncall):
    """The logical warps of ``n`` threads that call a primitive of ``width``
    (threads below ``ncall`` call): (first thread, size) pairs; and the threads
    that must get their input back (outside the logical warps or not calling)."""
    out, passthrough = [], []
    pow2 = width & (width - 1) == 0
    for base in range(0, n, 32):
        if pow2:
            for first in range(base, min(base + 32, n), width):
                if first < ncall:
                    out.append((first, width))
                else:
                    passthrough += range(first, min(first + width, n))
        else:
            out.append((base, width))
            passthrough += range(base + width, min(base + 32, n))
    return out, passthrough


def expect_slot(case, errs, kind, width, xf, of, r, grp, valid=None, flags=None):
    """Check one slot's results (``of``: output fields, ``xf``: inputs) on the
    lanes of one logical warp ``grp`` for row ``r``."""
    first, size = grp
    seg = [f[r, first:first + size] for f in xf]
    what = "%s w=%d row %d lanes %d..%d" % (kind, width, r, first, first + size - 1)
    if kind in ("reduce", "all", "inc_total", "exc_total", "exci_total"):
        total = case.fold(seg)
        lanes = [first] if kind == "reduce" else range(first, first + size)
        for t in lanes:
            errs.check("%s lane %d" % (what, t), lane(of, r, t), total)
    elif kind == "partial":
        k = max(1, min(int(valid[r, first]), size))
        errs.check("%s valid_items=%d" % (what, valid[r, first]), lane(of, r, first),
                   case.fold([f[:k] for f in seg]))
    elif kind == "inc":
        for j, e in enumerate(case.scan(seg)):
            errs.check("%s lane %d" % (what, first + j), lane(of, r, first + j), e)
    elif kind in ("exc", "exci"):
        if case.identity is None or (kind == "exci" and case.initial is not None):
            start = case._tuple(case.initial)
        else:
            start = case.identity
        for j, e in enumerate(case.exclusive(seg, start)):
            errs.check("%s lane %d" % (what, first + j), lane(of, r, first + j), e)
    elif kind == "seg":
        heads = [j for j in range(size) if j == 0 or flags[r, first + j]]
        for h, nxt in zip(heads, heads[1:] + [size]):
            errs.check("%s head %d..%d" % (what, first + h, first + nxt - 1),
                       lane(of, r, first + h), case.fold([f[h:nxt] for f in seg]))
    else:  # pragma: no cover
        raise AssertionError(kind)


def check_passthrough(errs, xf, of, r, threads, what):
    for t in threads:
        errs.check("%s row %d thread %d (input back)" % (what, r, t), lane(of, r, t), lane(xf, r, t))


def out_fields(vt, nslots, n):
    """Output arrays: ``nslots`` blocks of ``n`` values, flat (vt.store takes one index)."""
    return [np.zeros(nslots * n, f) for f in vt.fields]


def slot(of, s, shape):
    size = shape[0] * shape[1]
    return [f[s * size:(s + 1) * size].reshape(shape) for f in of]


# ---------------------------------------------------------------------------
# Kernels


# Slots of the full kernel: every primitive of one width.
FULL_SLOTS = ["reduce", "partial", "all", "inc", "inc", "inc_total", "exc", "exc", "exc_total",
              "exci", "exci", "exci_total", "seg"]


@functools.lru_cache(maxsize=None)
def full_kernel(case, width):
    """A kernel computing every warp primitive of ``width`` for ``case``,
    one row of inputs after the other; threads at and past ``ncall`` do not
    call the primitives and store their input."""
    vt, op = case.vt, case.op
    load, store = vt.load, vt.store
    red = warp.reduce(op, vt, width)
    part = warp.partial_reduce(op, vt, width)
    allr = warp.all_reduce(op, vt, width)
    inc = warp.inclusive_scan(op, vt, width)
    inca = warp.inclusive_scan(op, vt, width, aggregate=True)
    if case.identity is not None:
        exc = warp.exclusive_scan(op, vt, width)
        exca = warp.exclusive_scan(op, vt, width, aggregate=True)
    else:
        exc = warp.exclusive_scan(op, vt, width, initial=case.initial)
        exca = warp.exclusive_scan(op, vt, width, initial=case.initial, aggregate=True)
    exci = warp.exclusive_scan(op, vt, width, initial=case.initial)
    excia = warp.exclusive_scan(op, vt, width, initial=case.initial, aggregate=True)
    seg = warp.segmented_reduce(op, vt, width)

    @cuda.jit
    def k_full(x, valid, flags, ncall, out):
        t = cuda.grid(1)
        n = cuda.gridDim.x * cuda.blockDim.x
        m = valid.shape[0] * n  # outputs: one block of rows * n per slot
        for r in range(valid.shape[0]):
            i = r * n + t
            v = load(x, i)
            if t < ncall:
                store(out, i, red(v))
                store(out, 1 * m + i, part(v, valid[r, t]))
                store(out, 2 * m + i, allr(v))
                store(out, 3 * m + i, inc(v))
                s, total = inca(v)
                store(out, 4 * m + i, s)
                store(out, 5 * m + i, total)
                store(out, 6 * m + i, exc(v))
                s, total = exca(v)
                store(out, 7 * m + i, s)
                store(out, 8 * m + i, total)
                store(out, 9 * m + i, exci(v))
                s, total = excia(v)
                store(out, 10 * m + i, s)
                store(out, 11 * m + i, total)
                store(out, 12 * m + i, seg(v, flags[r, t]))
            else:
                for k in range(13):
                    store(out, k * m + i, v)

    return k_full


def run_full(case, width, xf, valid, flags, nthreads, nblocks=1, ncall=None):
    rows, n = xf[0].shape
    assert n == nthreads * nblocks
    ncall = n if ncall is None else ncall
    vt = case.vt
    x = pack(vt, [f.ravel() for f in xf])
    out = pack(vt, out_fields(vt, len(FULL_SLOTS), rows * n))
    res = launch(full_kernel(case, width), nblocks, nthreads, x, valid, flags, ncall, out)
    of = unpack(vt, res[-1])
    errs = Errors(case)
    grps, passthrough = groups(n, width, ncall)
    for s, kind in enumerate(FULL_SLOTS):
        so = slot(of, s, (rows, n))
        for r in range(rows):
            for g in grps:
                expect_slot(case, errs, kind, width, xf, so, r, g, valid, flags)
            check_passthrough(errs, xf, so, r, passthrough, "slot %d (%s)" % (s, kind))
    errs.done()


def make_valid_flags(rng, rows, n, width):
    """valid_items, the same on the lanes of each logical warp (0 and values
    above the width are clamped to 1..width); random head flags."""
    valid = np.zeros((rows, n), np.int32)
    step = width if width & (width - 1) == 0 else 32
    for r in range(rows):
        for first in range(0, n, step):
            valid[r, first:first + step] = rng.integers(0, width + 3)
    flags = rng.random((rows, n)) < 0.3
    return valid, flags


# ---------------------------------------------------------------------------
# Every primitive x every width x tuple / user / non-commutative operators


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["plus-int16", "matmul", "affine", "triple", "lambda", "argmax"])
def test_all_primitives_by_width(name, width, rng):
    case = CASES[name]
    rows = 2
    n = 32
    xf = case.gen(rng, (rows, n))
    valid, flags = make_valid_flags(rng, rows, n, width)
    valid[0, :] = width  # a full partial warp
    run_full(case, width, xf, valid, flags, n)


@pytest.mark.parametrize("name", ["max-uint32", "argmin", "argmax-int", "argmin-uint", "minmax",
                                  "welford32", "welford64"])
def test_all_primitives_more_operators(name, rng):
    case = CASES[name]
    width = 16 if name != "welford64" else 32
    xf = case.gen(rng, (2, 32))
    valid, flags = make_valid_flags(rng, 2, 32, width)
    run_full(case, width, xf, valid, flags, 32)


@pytest.mark.parametrize(
    "nthreads,nblocks,width,ncall",
    [(64, 1, 32, None), (96, 1, 8, None), (96, 1, 24, None), (64, 2, 4, None),
     # A partial last warp: 50 threads; only whole logical warps call.
     (50, 1, 2, None), (50, 1, 5, None), (50, 1, 16, 48), (50, 1, 1, None)])
@pytest.mark.parametrize("name", ["plus-int16", "affine"])
def test_several_warps(name, nthreads, nblocks, width, ncall, rng):
    case = CASES[name]
    n = nthreads * nblocks
    xf = case.gen(rng, (1, n))
    valid, flags = make_valid_flags(rng, 1, n, width)
    run_full(case, width, xf, valid, flags, nthreads, nblocks, ncall)


@settings(HYPO, max_examples=12)
@given(name=st.sampled_from(["plus-int16", "matmul", "affine", "triple", "lambda", "argmax",
                             "argmin", "minmax"]),
       width=st.sampled_from(WIDTHS), seed=st.integers(0, 2**32 - 1),
       nthreads=st.sampled_from([32, 64]))
def test_random_primitives(name, width, seed, nthreads):
    rng = np.random.default_rng(seed)
    case = CASES[name]
    xf = case.gen(rng, (1, nthreads))
    valid, flags = make_valid_flags(rng, 1, nthreads, width)
    run_full(case, width, xf, valid, flags, nthreads)


# ---------------------------------------------------------------------------
# Every dtype x every built-in operator (reduce, all_reduce and both scans)

SWEEP_SLOTS = [("reduce", 32), ("all", 16), ("inc", 32), ("exc", 8)]


@functools.lru_cache(maxsize=None)
def sweep_kernel(case):
    vt, op = case.vt, case.op
    load, store = vt.load, vt.store
    red = warp.reduce(op, vt)
    allr = warp.all_reduce(op, vt, 16)
    inc = warp.inclusive_scan(op, vt, 32)
    exc = warp.exclusive_scan(op, vt, 8)

    @cuda.jit
    def k_sweep(x, rows, out):
        t = cuda.grid(1)
        n = cuda.gridDim.x * cuda.blockDim.x
        m = rows * n
        for r in range(rows):
            i = r * n + t
            v = load(x, i)
            store(out, i, red(v))
            store(out, 1 * m + i, allr(v))
            store(out, 2 * m + i, inc(v))
            store(out, 3 * m + i, exc(v))

    return k_sweep


@pytest.mark.parametrize("dtype,opname", scalar_matrix(),
                         ids=["%s-%s" % (np.dtype(d), o) for d, o in scalar_matrix()])
def test_dtypes_and_builtin_operators(dtype, opname, rng):
    case = scalar_case(dtype, opname)
    vt = case.vt
    if np.dtype(dtype).kind == "f" and opname in ("minimum", "maximum"):
        rows = 3  # rows 1 and 2 hold NaN and infinities
    elif opname.startswith("logical"):
        rows = 2  # with and without zeros
    else:
        rows = 1
    n = 32
    xf = case.gen(rng, (rows, n))
    if np.dtype(dtype) == np.uint32:
        assert (xf[0] >= 2**31).any() or opname == "multiplies"
    out = pack(vt, out_fields(vt, len(SWEEP_SLOTS), rows * n))
    res = launch(sweep_kernel(case), 1, n, pack(vt, [f.ravel() for f in xf]), rows, out)
    of = unpack(vt, res[-1])
    errs = Errors(case)
    for s, (kind, width) in enumerate(SWEEP_SLOTS):
        so = slot(of, s, (rows, n))
        for r in range(rows):
            for g in groups(n, width, n)[0]:
                expect_slot(case, errs, kind, width, xf, so, r, g)
    errs.done()


def test_integer_sums_wrap_like_numpy(rng):
    # 31 x 100 + 120 = 3220 = 148 (mod 256) -> -108 in int8.
    case = scalar_case(np.int8, "plus")
    x = np.full((1, 32), 100, np.int8)
    x[0, 5] = 120
    out = out_fields(case.vt, len(SWEEP_SLOTS), 32)[0]
    out = launch(sweep_kernel(case), 1, 32, x.ravel(), 1, out)[-1].reshape(-1, 32)
    assert out[0, 0] == np.add.reduce(x[0], dtype=np.int8) == -108
    np.testing.assert_array_equal(out[2], np.add.accumulate(x[0], dtype=np.int8))


# ---------------------------------------------------------------------------
# masked_reduce


@functools.lru_cache(maxsize=None)
def masked_kernel(case):
    vt, op = case.vt, case.op
    load, store = vt.load, vt.store
    mred = warp.masked_reduce(op, vt)

    @cuda.jit
    def k_masked(x, masks, everyone, out):
        t = cuda.grid(1)
        n = cuda.gridDim.x * cuda.blockDim.x
        w = t // 32
        lane = cuda.laneid
        # The lanes of this warp that exist (the last warp may be partial).
        in_warp = min(32, cuda.blockDim.x - (cuda.threadIdx.x - lane))
        live = (1 << in_warp) - 1
        for r in range(masks.shape[0]):
            i = r * n + t
            v = load(x, i)
            m = masks[r, w]
            if everyone or ((m >> lane) & 1) == 1:
                store(out, i, mred(v, m))
            else:
                store(out, i, v)
            cuda.syncwarp(live)  # reconverge before the next row's masks

    return k_masked


def run_masked(case, xf, masks, everyone=False):
    vt = case.vt
    rows, n = xf[0].shape
    out = pack(vt, [np.zeros(rows * n, f) for f in vt.fields])
    res = launch(masked_kernel(case), 1, n, pack(vt, [f.ravel() for f in xf]), masks,
                 np.bool_(everyone), out)
    of = [f.reshape(rows, n) for f in unpack(vt, res[-1])]
    errs = Errors(case)
    for r in range(rows):
        for w in range(n // 32 + (n % 32 > 0)):
            m = int(masks[r, w])
            members = [w * 32 + b for b in range(32) if (m >> b) & 1 and w * 32 + b < n]
            if not members:
                continue
            seg = [f[r, members] for f in xf]
            errs.check("row %d warp %d mask 0x%08x" % (r, w, m), lane(of, r, members[0]),
                       case.fold(seg))
            if everyone:
                others = [t for t in range(w * 32, min(w * 32 + 32, n)) if t not in members]
                check_passthrough(errs, xf, of, r, others, "mask 0x%08x, outside" % m)
    errs.done()


SPECIAL_MASKS = [FULL, 0x1, 0x80000000, 0x00010000, 0x80000001, 0x55555555, 0xAAAAAAAA,
                 0x00FF00F0, 0x12345678, 0xFFFF0000, 0x3]


@pytest.mark.parametrize("name", ["plus-int16", "matmul", "affine", "triple", "argmin", "lambda"])
def test_masked_reduce(name, rng):
    case = CASES[name]
    masks = np.array(SPECIAL_MASKS + [int(rng.integers(1, 2**32))], np.uint32).reshape(-1, 1)
    # Sparse random masks too.
    sparse = [int(sum(1 << int(b) for b in rng.choice(32, size=3, replace=False)))]
    masks = np.concatenate([masks, np.array(sparse, np.uint32).reshape(-1, 1)])
    xf = case.gen(rng, (len(masks), 32))
    run_masked(case, xf, masks)


def test_masked_reduce_two_warps_and_outsiders(rng):
    # Two warps with different masks; every lane calls, lanes outside the
    # mask get their own value back.
    case = CASES["affine"]
    masks = np.array([[0x0000F00F, 0xFFFFFFFF], [0x1, 0x80000000], [0x13579BDF, 0x2]], np.uint32)
    xf = case.gen(rng, (3, 64))
    run_masked(case, xf, masks, everyone=True)


def test_masked_reduce_partial_warp(rng):
    # 50 threads: the second warp has 18 lanes; the masks name existing lanes.
    case = CASES["plus-int16"]
    masks = np.array([[FULL, 0x3FFFF], [0x10, 0x20001], [0xF0F0F0F0, 0x1]], np.uint32)
    xf = case.gen(rng, (3, 50))
    run_masked(case, xf, masks)


@settings(HYPO)
@given(name=st.sampled_from(["plus-int16", "matmul", "affine", "argmax", "triple"]),
       masks=st.lists(st.integers(1, FULL), min_size=1, max_size=3),
       seed=st.integers(0, 2**32 - 1))
@example(name="matmul", masks=[0x1, FULL, 0x80000000], seed=1)
def test_random_masks(name, masks, seed):
    rng = np.random.default_rng(seed)
    case = CASES[name]
    masks = np.array(masks, np.uint32).reshape(-1, 1)
    run_masked(case, case.gen(rng, (len(masks), 32)), masks)


# ---------------------------------------------------------------------------
# peers and reduce_peers


@functools.lru_cache(maxsize=None)
def peers_kernel(case, key_vt, method):
    vt = case.vt
    load, store = vt.load, vt.store
    kload = key_vt.load
    find = warp.peers(key_vt, method)
    rp = warp.reduce_peers(case.op, vt)

    @cuda.jit
    def k_peers(keys, x, rows, peer_out, out):
        t = cuda.grid(1)
        n = cuda.gridDim.x * cuda.blockDim.x
        for r in range(rows):
            i = r * n + t
            p = find(kload(keys, i))
            peer_out[i] = p
            store(out, i, rp(p, load(x, i)))

    return k_peers


def run_peers(case, key_spec, keys, xf, method, check_totals=True):
    vt = case.vt
    kvt = cufold.ValueType.of(key_spec)
    rows, n = xf[0].shape
    peer_out = np.zeros(rows * n, np.uint32)
    out = pack(vt, [np.zeros(rows * n, f) for f in vt.fields])
    res = launch(peers_kernel(case, kvt, method), 1, n,
                 pack(kvt, [k.ravel() for k in keys]), pack(vt, [f.ravel() for f in xf]),
                 rows, peer_out, out)
    got_peers = res[3].reshape(rows, n)
    of = [f.reshape(rows, n) for f in unpack(vt, res[-1])]
    errs = Errors(case)
    for r in range(rows):
        for base in range(0, n, 32):
            lanes = range(base, min(base + 32, n))
            kb = {t: tuple(np.asarray(k[r, t]).tobytes() for k in keys) for t in lanes}
            for t in lanes:
                exp = sum(1 << (s - base) for s in lanes if kb[s] == kb[t])
                if int(got_peers[r, t]) != exp:
                    errs.items.append("peers row %d thread %d: got 0x%08x, expected 0x%08x"
                                      % (r, t, got_peers[r, t], exp))
                errs.count += 1
                if check_totals and t == base + (exp & -exp).bit_length() - 1:
                    members = [base + b for b in range(32) if (exp >> b) & 1]
                    errs.check("reduce_peers row %d group of lane %d" % (r, t), lane(of, r, t),
                               case.fold([f[r, members] for f in xf]))
    errs.done()


def key_rows(rng, dt, rows, n):
    """Row 0: runs of equal keys; row 1: random keys from few values; row 2:
    all equal; row 3: all distinct."""
    dt = np.dtype(dt)
    pool = full_range(rng, dt, 6) if dt.kind in "iu" else \
        (rng.integers(-20, 20, 6) / 4).astype(dt)
    if dt.kind == "b":
        pool = np.array([True, False] * 3)
    keys = np.empty((rows, n), dt)
    runs = np.repeat(np.arange(n), rng.integers(1, 7, size=n))[:n] % len(pool)
    keys[0] = pool[runs]
    if rows > 1:
        keys[1] = pool[rng.integers(0, len(pool), size=n)]
    if rows > 2:
        keys[2] = pool[0]
    if rows > 3:
        keys[3] = (np.arange(n) * 3 - 40).astype(dt) if dt.kind != "b" else pool[np.arange(n) % 2]
    return keys


@pytest.mark.parametrize("method", ["match", "ballot"])
@pytest.mark.parametrize("kdt", [np.int32, np.int8, np.uint64, np.float32, np.float16, np.bool_])
def test_peers_scalar_keys(kdt, method, rng):
    case = CASES["plus-int16"]
    keys = key_rows(rng, kdt, 4, 32)
    if kdt == np.uint64:
        keys |= np.uint64(1 << 63)
    run_peers(case, kdt, [keys], case.gen(rng, (4, 32)), method)


@pytest.mark.parametrize("name", ["matmul", "affine", "triple", "argmax", "lambda"])
def test_reduce_peers_operators(name, rng):
    case = CASES[name]
    keys = key_rows(rng, np.int64, 2, 64)
    run_peers(case, np.int64, [keys], case.gen(rng, (2, 64)), "auto")


@pytest.mark.parametrize("method", ["ballot", "auto"])
def test_peers_tuple_keys(method, rng):
    case = CASES["affine"]
    kt = (np.int32, np.float32, np.uint8)
    k0 = key_rows(rng, np.int32, 3, 32)
    k1 = (k0 % 3).astype(np.float32) * 0.5
    k2 = rng.integers(0, 2, size=(3, 32)).astype(np.uint8)
    run_peers(case, kt, [k0, k1, k2], case.gen(rng, (3, 32)), method)


def test_peers_nan_keys_terminate(rng):
    # NaN != NaN: with the ballot method each NaN lane is its own group (and
    # the loop must still end); other keys group as usual.
    case = CASES["plus-int16"]
    keys = key_rows(rng, np.float32, 1, 32)
    keys[0, [3, 9, 10]] = np.nan
    peer = launch(peers_kernel(case, cufold.ValueType.of(np.float32), "ballot"), 1, 32,
                  keys.ravel(), case.gen(rng, (1, 32))[0].ravel(), 1,
                  np.zeros(32, np.uint32), np.zeros(32, np.int16))[3]
    for t in range(32):
        if np.isnan(keys[0, t]):
            assert peer[t] == 1 << t
        else:
            exp = sum(1 << s for s in range(32) if keys[0, s] == keys[0, t])
            assert peer[t] == exp


@settings(HYPO)
@given(keys=st.lists(st.integers(0, 4), min_size=32, max_size=32),
       method=st.sampled_from(["match", "ballot"]), seed=st.integers(0, 2**32 - 1),
       name=st.sampled_from(["matmul", "plus-int16", "affine"]))
@example(keys=[0] * 32, method="ballot", seed=0, name="matmul")
@example(keys=list(range(32)), method="match", seed=0, name="affine")
def test_random_peers(keys, method, seed, name):
    rng = np.random.default_rng(seed)
    case = CASES[name]
    run_peers(case, np.int16, [np.array([keys], np.int16)], case.gen(rng, (1, 32)), method)


# ---------------------------------------------------------------------------
# lane_info


@pytest.mark.parametrize("width", WIDTHS)
def test_lane_info(width):
    info = warp.lane_info(width)

    @cuda.jit
    def k_info(out):
        t = cuda.threadIdx.x
        logical, mask, first, active = info()
        out[t, 0] = logical
        out[t, 1] = mask
        out[t, 2] = first
        out[t, 3] = active

    out = launch(k_info, 1, 64, np.zeros((64, 4), np.int64))[0]
    for t in range(64):
        lane_ = t % 32
        if width & (width - 1) == 0:
            first = lane_ - lane_ % width
            exp = (lane_ % width, ((1 << width) - 1) << first, first, 1)
        else:
            exp = (lane_, (1 << width) - 1, 0, int(lane_ < width))
        assert tuple(out[t]) == exp, t


# ---------------------------------------------------------------------------
# Bad input: clear errors when the primitive is created


def one_arg(a):
    return a


def three_args(a, b, c):
    return a


ALL_FACTORIES = {
    "reduce": lambda op, dt, w=32: warp.reduce(op, dt, w),
    "partial_reduce": lambda op, dt, w=32: warp.partial_reduce(op, dt, w),
    "all_reduce": lambda op, dt, w=32: warp.all_reduce(op, dt, w),
    "inclusive_scan": lambda op, dt, w=32: warp.inclusive_scan(op, dt, w),
    "exclusive_scan": lambda op, dt, w=32: warp.exclusive_scan(op, dt, w),
    "segmented_reduce": lambda op, dt, w=32: warp.segmented_reduce(op, dt, w),
    "masked_reduce": lambda op, dt, w=32: warp.masked_reduce(op, dt),
    "reduce_peers": lambda op, dt, w=32: warp.reduce_peers(op, dt),
}
WIDTH_FACTORIES = ["reduce", "partial_reduce", "all_reduce", "inclusive_scan",
                   "exclusive_scan", "segmented_reduce"]


@pytest.mark.parametrize("factory", sorted(ALL_FACTORIES))
def test_bad_operator(factory):
    make = ALL_FACTORIES[factory]
    for fn in (one_arg, three_args, lambda x: x):
        with pytest.raises(TypeError, match="cufold: .*two values"):
            make(fn, np.float32)
    with pytest.raises(TypeError, match="cufold: .*function of two values"):
        make(42, np.float32)
    # A 2-tuple for a 3-field value type.
    with pytest.raises(TypeError, match=r"cufold: operator .* must return a value of type"):
        make(lambda a, b: (a[0], a[1]), (np.float32, np.int32, np.int8))
    # A scalar operator on a tuple type.
    with pytest.raises(TypeError, match="cufold: operator"):
        make(ops.Op(lambda a, b: a * b), (np.float32, np.int32))
    # A built-in outside its dtypes.
    with pytest.raises(TypeError, match="bit_and is not defined for dtype float32"):
        make(ops.bit_and, np.float32)


@pytest.mark.parametrize("factory", sorted(ALL_FACTORIES))
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, object, "datetime64[ns]",
                                   "timedelta64[s]", "U3", np.longdouble])
def test_value_type_that_cannot_be_shuffled(factory, dtype):
    name = str(np.dtype(dtype))
    with pytest.raises(TypeError, match=r"cufold: values of dtype %s cannot be shuffled"
                       % name.replace("[", r"\[").replace("]", r"\]")):
        ALL_FACTORIES[factory](ops.plus, dtype)
    with pytest.raises(TypeError, match="cufold: values of dtype %s" % name.split("[")[0]):
        ALL_FACTORIES[factory](ops.minmax, (np.float32, dtype))


@pytest.mark.parametrize("factory", WIDTH_FACTORIES + ["lane_info"])
@pytest.mark.parametrize("width", [0, 33, -1, 64, 2.5, 16.0, True, False, "8", None])
def test_bad_width(factory, width):
    with pytest.raises(ValueError, match=r"cufold: a logical warp width must be an integer "
                       r"in 1\.\.32, got %s" % repr(width).replace(".", r"\.")):
        if factory == "lane_info":
            warp.lane_info(width)
        else:
            ALL_FACTORIES[factory](ops.plus, np.int32, width)


def test_good_widths_accepted():
    for w in list(range(1, 33)) + [np.int32(8), np.int64(32)]:
        warp.reduce(ops.plus, np.float32, w)


def test_exclusive_scan_needs_identity_or_initial():
    with pytest.raises(ValueError, match="cufold: operator plus_one has no identity; pass initial="):
        warp.exclusive_scan(plus_one, np.int32)
    with pytest.raises(TypeError, match="cufold: expected a 2-tuple"):
        warp.exclusive_scan(AFFINE, (np.float64, np.float64), initial=1.0)
    warp.exclusive_scan(plus_one, np.int32, initial=0)


def test_peers_bad_input():
    with pytest.raises(ValueError, match="cufold: peers method must be"):
        warp.peers(np.int32, "sort")
    with pytest.raises(TypeError, match="method='ballot' for tuple keys"):
        warp.peers((np.int32, np.int32), "match")
    with pytest.raises(TypeError, match="cufold: values of dtype complex64"):
        warp.peers(np.complex64)


def test_factories_are_cached():
    assert warp.reduce(ops.plus, np.float32, 16) is warp.reduce(ops.plus, np.float32, 16)
    assert warp.reduce(ops.plus, np.float32) is not warp.reduce(ops.plus, np.float64)
    assert warp.exclusive_scan(ops.plus, np.int32, 8, initial=3) is \
        warp.exclusive_scan(ops.plus, np.int32, 8, initial=3)
    assert warp.peers(np.int32) is warp.peers(np.int32)


_MASK_PTX_SCRIPT = r"""
from cufold import ops, warp

FULL = 0xFFFFFFFF
masked = warp.masked_reduce(ops.plus, np.float64)
peers_sum = warp.reduce_peers(ops.plus, np.float64)
segmented = warp.segmented_reduce(ops.plus, np.float64)
segmented16 = warp.segmented_reduce(ops.plus, np.float64, 16)
ballot_peers = warp.peers(np.int32, "ballot")
partial = warp.partial_reduce(ops.plus, np.float64)

def k_masked(x, o):
    i = cuda.grid(1)
    o[i] = masked(x[i], cuda.ballot_sync(FULL, x[i] > 0))

def k_peers(x, o):
    i = cuda.grid(1)
    o[i] = peers_sum(cuda.match_any_sync(FULL, np.int32(x[i])), x[i])

def k_segmented(x, o):
    i = cuda.grid(1)
    o[i] = segmented(x[i], x[i] > 0) + segmented16(x[i], x[i] > 1)

def k_ballot_peers(x, o):
    i = cuda.grid(1)
    o[i] = ballot_peers(np.int32(x[i]))

def k_partial(x, o):
    i = cuda.grid(1)
    o[i] = partial(x[i], 20)

found = {}
for k in (k_masked, k_peers, k_segmented, k_ballot_peers, k_partial):
    ptx = compile_sm90(k, (types.float64[::1], types.float64[::1]))
    found[k.__name__] = sorted(set(re.findall(r"\b(?:popc|clz|brev)\.b64|\bbfind\.[us]64", ptx)))
print("OPS", found)
"""


def test_mask_arithmetic_is_32_bit():
    """Lane masks are 32-bit words, but Numba widens ``uint32`` arithmetic (and Python
    ints) to 64 bits, so a mask loop without casts runs on 64-bit words: a 64-bit
    ``popc``/``ffs``/``clz`` costs several instructions where a 32-bit one costs one
    (``masked_reduce`` was 1.6x slower so on an H200). The sm_90 PTX of every primitive
    that loops or searches over a mask has no 64-bit bit counting; the simulator
    computes with NumPy's uint32 and cannot tell."""
    found = run_sm90_script(_MASK_PTX_SCRIPT, "OPS")
    assert len(found) == 5
    assert all(v == [] for v in found.values()), found
