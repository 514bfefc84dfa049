"""Tests of cufold.ops (operators, identities, validation) and cufold.values
(value types and their generated device routines).

Host-side checks need no kernel; the device routines (cast, load/store,
equal, constant, shuffle) run in small ``@cuda.jit`` kernels compared with
NumPy, in the simulator and on a GPU alike.

Run: PYTHONPATH=src python -m pytest tests/test_ops_values.py -q
"""

import pickle
import re

import numpy as np
import pytest
from numba import cuda

from cufold import ops, warp
from cufold.values import SUPPORTED_DTYPES, ValueType

pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning",
    "ignore:invalid value encountered:RuntimeWarning",
)

DTYPES = [np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                np.uint16, np.uint32, np.uint64, np.float16, np.float32,
                                np.float64)]
SCALAR_OPS = ["plus", "multiplies", "minimum", "maximum", "bit_and", "bit_or", "bit_xor",
              "logical_and", "logical_or"]


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


def sample_values(rng, dt, n=64):
    """Random values of ``dt`` over its whole range, with extremes (and NaN,
    infinities and -0.0 for floats)."""
    if dt.kind == "b":
        return rng.random(n) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        x = rng.integers(info.min, info.max, size=n, dtype=dt, endpoint=True)
        x[:3] = [info.min, info.max, 0]
        return x
    x = (rng.normal(size=n) * 100).astype(dt)
    x[:6] = [np.nan, np.inf, -np.inf, -0.0, np.finfo(dt).max, np.finfo(dt).tiny]
    return x


# ---------------------------------------------------------------------------
# Identities


def expected_identity(name, dt):
    if name in ("plus", "bit_or", "bit_xor", "logical_or"):
        return dt.type(0)
    if name in ("multiplies", "logical_and"):
        return dt.type(1)
    if name == "minimum":
        return dt.type(np.inf if dt.kind == "f" else (True if dt.kind == "b" else np.iinfo(dt).max))
    if name == "maximum":
        return dt.type(-np.inf if dt.kind == "f" else (False if dt.kind == "b" else np.iinfo(dt).min))
    if name == "bit_and":
        return dt.type(True) if dt.kind == "b" else ~dt.type(0)
    raise AssertionError(name)


def applies(name, dt):
    return dt.kind in getattr(ops, name).kinds


@pytest.mark.parametrize("name", SCALAR_OPS)
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_identity_values(name, dt, rng):
    op = getattr(ops, name)
    if not applies(name, dt):
        with pytest.raises(TypeError, match="cufold: operator %s is not defined for dtype %s"
                           % (name, dt)):
            op.combine(ValueType.of(dt))
        return
    ident = op.identity_for(dt)
    exp = expected_identity(name, dt)
    assert type(ident) is dt.type
    assert np.asarray(ident).tobytes() == np.asarray(exp).tobytes()
    # The identity property on the host, on values over the whole range.
    vt = ValueType.of(dt)
    with np.errstate(all="ignore"):
        for x in sample_values(rng, dt):
            for got in (vt.make(op(ident, x)), vt.make(op(x, ident))):
                if name.startswith("logical"):
                    assert bool(got) == bool(x != 0)
                elif dt.kind == "f" and np.isnan(x):
                    assert np.isnan(got)
                elif name == "plus":
                    assert got == x  # 0 + -0.0 is +0.0 (IEEE), equal to -0.0
                else:
                    assert got == x and np.signbit(got) == np.signbit(x), (x, got)


def test_identity_special_values():
    assert ops.bit_and.identity_for(np.uint32) == 0xFFFFFFFF
    assert ops.bit_and.identity_for(np.uint64) == 2**64 - 1
    assert ops.bit_and.identity_for(np.int8) == -1
    assert ops.bit_and.identity_for(np.bool_) is np.True_
    assert ops.minimum.identity_for(np.float16) == np.inf
    assert ops.minimum.identity_for(np.int64) == 2**63 - 1
    assert ops.maximum.identity_for(np.uint16) == 0
    assert ops.maximum.identity_for(np.float32) == -np.inf
    assert ops.plus.identity_for((np.int8, np.float32)) == (0, 0.0)


@pytest.mark.parametrize("index", [np.int32, np.int64, np.uint32, np.uint16])
@pytest.mark.parametrize("value", [np.float16, np.float32, np.float64, np.int8, np.uint64])
def test_arg_identities(value, index):
    vt = ValueType.of((value, index))
    imax = np.iinfo(index).max
    lo, hi = (-np.inf, np.inf) if np.dtype(value).kind == "f" else \
        (np.iinfo(value).min, np.iinfo(value).max)
    amax = ops.argmax.identity_for(vt)
    amin = ops.argmin.identity_for(vt)
    assert amax == (lo, imax) and amin == (hi, imax)
    assert [type(v) for v in amax] == [np.dtype(value).type, np.dtype(index).type]
    # The identity loses every comparison, also ties at the extreme value.
    for x in [(np.dtype(value).type(lo), np.dtype(index).type(3)),
              (np.dtype(value).type(1), np.dtype(index).type(0))]:
        assert vt.make(ops.argmax(amax, x)) == x and vt.make(ops.argmax(x, amax)) == x
    for x in [(np.dtype(value).type(hi), np.dtype(index).type(3)),
              (np.dtype(value).type(1), np.dtype(index).type(0))]:
        assert vt.make(ops.argmin(amin, x)) == x and vt.make(ops.argmin(x, amin)) == x


def test_argmax_host_semantics():
    f = np.float32
    # Ties: the lowest index wins, whatever the order of the operands.
    assert ops.argmax((f(2), 7), (f(2), 3)) == (2, 3)
    assert ops.argmax((f(2), 3), (f(2), 7)) == (2, 3)
    assert ops.argmin((f(-1), 9), (f(-1), 4)) == (-1, 4)
    # NaN wins (numpy.argmax returns the first NaN), the first NaN by index.
    r = ops.argmax((f(5), 1), (f(np.nan), 8))
    assert np.isnan(r[0]) and r[1] == 8
    r = ops.argmax((f(np.nan), 9), (f(np.nan), 2))
    assert np.isnan(r[0]) and r[1] == 2
    r = ops.argmin((f(np.nan), 4), (f(-np.inf), 0))
    assert np.isnan(r[0]) and r[1] == 4


def test_other_identities():
    assert ops.minmax.identity_for((np.float32, np.int16)) == (np.inf, -32768)
    assert ops.welford.identity_for((np.float32,) * 3) == (0, 0, 0)
    assert ops.Op(lambda a, b: a).identity_for(np.float32) is None
    assert ops.Op(lambda a, b: a, identity=lambda vt: None).identity_for(np.int8) is None
    ident = ops.Op(lambda a, b: a, identity=lambda vt: vt.fields[0].itemsize).identity_for(np.int16)
    assert ident == 2 and type(ident) is np.int16
    with pytest.raises(TypeError, match="cufold: expected a 2-tuple"):
        ops.Op(lambda a, b: a, identity=5).identity_for((np.int8, np.int8))


def test_builtins():
    assert set(ops.BUILTINS) == set(SCALAR_OPS) | {"argmin", "argmax", "minmax", "welford"}
    for name, op in ops.BUILTINS.items():
        assert op.name == name and repr(op) == "cufold.Op(%s)" % name
        assert op.commutative
    assert ops.plus.atomic == "add" and ops.minimum.atomic == "min" and ops.multiplies.atomic is None
    assert ops.plus(np.int8(100), np.int8(27)) == 127
    assert ops.maximum(1.0, np.nan) != ops.maximum(1.0, np.nan)  # NaN propagates
    assert np.isnan(ops.minimum(np.nan, 1.0)) and np.isnan(ops.minimum(1.0, np.nan))
    n, mean, m2 = ops.welford((2.0, 1.0, 2.0), (2.0, 3.0, 0.0))
    assert (n, mean, m2) == (4.0, 2.0, 6.0)  # values 0, 2, 3, 3


# ---------------------------------------------------------------------------
# as_op and Op validation


def my_add(a, b):
    return a + b


def one_arg(a):
    return a


def three_args(a, b, c):
    return a


def test_as_op_caching():
    op = ops.as_op(my_add)
    assert isinstance(op, ops.Op) and op.fn is my_add and op.name == "my_add"
    assert ops.as_op(my_add) is op
    assert ops.as_op(op) is op
    assert ops.as_op(ops.plus) is ops.plus
    with_id = ops.as_op(my_add, identity=0)
    assert with_id is not op and ops.as_op(my_add, identity=0) is with_id
    assert with_id.identity_for(np.int32) == 0 and op.identity_for(np.int32) is None
    # An unhashable identity still works, without caching.
    a = ops.as_op(my_add, identity=[0])
    assert isinstance(a, ops.Op) and a is not ops.as_op(my_add, identity=[0])
    # Primitives made from the same plain function share the Op (and cache).
    assert warp.reduce(my_add, np.int32) is warp.reduce(my_add, np.int32)
    assert op.combine(ValueType.of(np.int32)) is op.combine(ValueType.of(np.int32))


@pytest.mark.parametrize("fn", [one_arg, three_args, lambda: 0, lambda a: a,
                                lambda a, b, c, d=1: a, lambda *, a, b: a])
def test_op_not_a_function_of_two_values(fn):
    with pytest.raises(TypeError, match="cufold: an operator must be a function of two values"):
        ops.Op(fn)
    with pytest.raises(TypeError, match="two values"):
        ops.as_op(fn)


def test_op_accepts_two_value_signatures():
    for fn in (my_add, lambda a, b=0: a, lambda *args: args[0], lambda a, b, c=1: a):
        ops.Op(fn)
    ops.Op(cuda.jit(device=True)(my_add))  # a device function works too


@pytest.mark.parametrize("bad", [42, None, "plus", (1, 2)])
def test_op_not_callable(bad):
    with pytest.raises(TypeError, match="cufold: an operator must be a function of two values"):
        ops.Op(bad)


def test_op_of_op():
    with pytest.raises(TypeError, match="cufold: Op.* takes a function, not an Op"):
        ops.Op(ops.plus)


def test_op_wrong_result_shape():
    three = ValueType.of((np.float32, np.int32, np.int8))
    pair = ops.Op(lambda a, b: (a[0] + b[0], a[1] + b[1]), name="pair")
    with pytest.raises(TypeError, match=r"cufold: operator pair must return a value of type "
                                        r"\(float32, int32, int8\)"):
        pair.check(three)
    with pytest.raises(TypeError, match="cufold: operator pair must return"):
        pair.combine(three)
    with pytest.raises(TypeError, match="cufold: operator pair must return"):
        warp.reduce(pair, three)
    # A tuple result for a scalar type, and a scalar for a tuple type.
    with pytest.raises(TypeError, match="cufold: operator .* must return a value of type int32"):
        ops.Op(lambda a, b: (a, b)).check(np.int32)
    with pytest.raises(TypeError, match="cufold: operator .* must return a value of type"):
        ops.Op(lambda a, b: a[0] + b[0]).check((np.int32, np.int32))
    # Indexing a scalar, or arithmetic on tuples.
    with pytest.raises(TypeError, match="cufold: operator .* cannot combine two values of type"):
        ops.argmax.check(np.float32)
    with pytest.raises(TypeError, match="cufold: operator .* cannot combine two values of type"):
        ops.Op(lambda a, b: a * b).check((np.float32, np.float32))
    assert pair.check((np.float64, np.int8)) is ValueType.of((np.float64, np.int8))


@pytest.mark.parametrize("name,dt", [("bit_and", np.float32), ("bit_or", np.float16),
                                     ("bit_xor", np.float64), ("welford", np.int32)])
def test_op_outside_its_dtypes(name, dt):
    op = getattr(ops, name)
    vt = (dt,) * 3 if name == "welford" else dt
    with pytest.raises(TypeError, match="cufold: operator %s is not defined for dtype %s"
                       % (name, np.dtype(dt))):
        op.check(vt)
    with pytest.raises(TypeError, match="is not defined for dtype"):
        warp.reduce(op, vt)


# ---------------------------------------------------------------------------
# Value types


@pytest.mark.parametrize("spec", [np.complex64, np.complex128, object, "datetime64",
                                  "datetime64[ns]", "timedelta64[s]", "U4", "S2", "V8",
                                  np.longdouble, np.dtype([("a", np.int32)])])
def test_unsupported_dtypes(spec):
    name = str(np.dtype(spec))
    pattern = re.escape("cufold: values of dtype %s cannot be shuffled or reduced; supported" % name)
    with pytest.raises(TypeError, match=pattern):
        ValueType.of(spec)
    with pytest.raises(TypeError, match="cufold: values of dtype"):
        ValueType.of((np.float32, spec))
    with pytest.raises(TypeError, match="cufold: values of dtype"):
        warp.all_reduce(ops.plus, spec)


def test_not_a_dtype():
    with pytest.raises(TypeError, match="cufold: 'nonsense' is not a NumPy dtype"):
        ValueType.of("nonsense")
    with pytest.raises(TypeError, match="needs at least one field"):
        ValueType.of(())


def test_supported_dtypes():
    assert set(SUPPORTED_DTYPES) == set(DTYPES)
    for dt in DTYPES:
        vt = ValueType.of(dt)
        assert not vt.is_tuple and vt.arity == 1 and vt.dtype == dt and vt.itemsize == dt.itemsize
        assert repr(vt) == str(dt)
        assert ValueType.of(dt.type) is vt and ValueType.of(str(dt)) is vt and ValueType.of(vt) is vt


def test_tuple_value_types():
    vt = ValueType.of((np.float32, "int64", np.dtype(np.uint8)))
    assert vt.is_tuple and vt.arity == 3 and vt.itemsize == 13
    assert vt.fields == (np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.uint8))
    assert repr(vt) == "(float32, int64, uint8)"
    assert ValueType.of([np.float32, np.int64, np.uint8]) is vt
    assert pickle.loads(pickle.dumps(vt)) is vt
    assert pickle.loads(pickle.dumps(ValueType.of(np.int16))) is ValueType.of(np.int16)
    with pytest.raises(TypeError, match="cufold: .* several fields, not one dtype"):
        vt.dtype
    one = ValueType.of((np.int32,))
    assert one.is_tuple and one.arity == 1 and one is not ValueType.of(np.int32)
    assert str(vt.numba_type) == "Tuple(float32, int64, uint8)"
    assert str(ValueType.of(np.float16).numba_type) == "float16"


def test_make():
    vt = ValueType.of((np.float32, np.int8))
    v = vt.make((1.5, 3))
    assert v == (1.5, 3) and type(v[0]) is np.float32 and type(v[1]) is np.int8
    with pytest.raises(TypeError, match="cufold: expected a 2-tuple for"):
        vt.make(1.5)
    with pytest.raises(TypeError, match="cufold: expected a 2-tuple for"):
        vt.make((1.5, 3, 4))
    with pytest.raises(TypeError, match="cufold: expected a scalar for int32"):
        ValueType.of(np.int32).make((1,))
    assert type(ValueType.of(np.uint64).make(2**64 - 1)) is np.uint64


def test_constant_widens_float16():
    c = ValueType.of(np.float16).constant(1.5)
    assert type(c) is np.float32 and c == 1.5
    c = ValueType.of(np.float16).constant(np.inf)
    assert type(c) is np.float32 and c == np.inf
    c = ValueType.of((np.float16, np.int8, np.float16, np.uint64)).constant((0.25, -3, 65504, 2**64 - 1))
    assert [type(x) for x in c] == [np.float32, np.int8, np.float32, np.uint64]
    assert c == (0.25, -3, 65504.0, 2**64 - 1)
    for dt in DTYPES:
        if dt != np.float16:
            assert type(ValueType.of(dt).constant(1)) is dt.type


@pytest.mark.parametrize("width", [0, 33, 2.5, True, -1, None, "4"])
def test_widths_rejected_at_creation(width):
    for make in (warp.reduce, warp.all_reduce, warp.inclusive_scan, warp.partial_reduce,
                 warp.segmented_reduce, warp.exclusive_scan):
        with pytest.raises(ValueError, match="cufold: a logical warp width must be an integer "
                                             r"in 1\.\.32, got"):
            make(ops.plus, np.float32, width)
    with pytest.raises(ValueError, match="logical warp width"):
        warp.lane_info(width)


# ---------------------------------------------------------------------------
# Device routines of value types


def test_cast_load_store_equal_constant_on_device(rng):
    """cast wraps like NumPy's astype; constants (float16 widened) come back
    exactly through cast; equal is field-wise ==."""
    vt = ValueType.of((np.int8, np.float16, np.uint32, np.bool_))
    cast, load, store, equal = vt.cast, vt.load, vt.store, vt.equal
    const = vt.constant((-7, 0.333, 2**32 - 2, True))

    @cuda.jit
    def k_routines(wide, x, y, same, out, consts):
        t = cuda.grid(1)
        # An int64 / float64 / int64 / int64 tuple brought to the value type.
        v = cast((wide[0][t], wide[1][t], wide[2][t], wide[3][t]))
        store(out, t, v)
        same[t] = equal(load(x, t), load(y, t))
        store(consts, t, cast(const))

    n = 32
    wide = (rng.integers(-1000, 1000, n), rng.normal(size=n) * 10,
            rng.integers(0, 2**40, n), rng.integers(-2, 3, n))
    x = (rng.integers(-3, 3, n).astype(np.int8), np.full(n, 0.5, np.float16),
         rng.integers(2**32 - 3, 2**32, n, dtype=np.uint32), np.ones(n, bool))
    y = tuple(f.copy() for f in x)
    y[0][::3] += 1
    x[1][5] = y[1][5] = np.nan  # NaN is never equal to itself
    y[3][7] = False
    out = tuple(np.zeros(n, f) for f in vt.fields)
    consts = tuple(np.zeros(n, f) for f in vt.fields)
    same = np.zeros(n, np.bool_)
    same, out, consts = launch(k_routines, 1, n, wide, x, y, same, out, consts)[3:]
    np.testing.assert_array_equal(out[0], wide[0].astype(np.int8))
    np.testing.assert_array_equal(out[1], wide[1].astype(np.float16))
    np.testing.assert_array_equal(out[2], wide[2].astype(np.uint32))
    np.testing.assert_array_equal(out[3], wide[3] != 0)
    exp = np.all([a == b for a, b in zip(x, y)], axis=0)
    assert not exp[5] and not exp[7] and not exp[0]
    np.testing.assert_array_equal(same, exp)
    for f, c, dt in zip(consts, (-7, 0.333, 2**32 - 2, True), vt.fields):
        np.testing.assert_array_equal(f, np.full(n, dt.type(c)))


SHUFFLE_KINDS = ["idx", "up", "down", "xor"]


def make_shuffle_kernel(vt):
    shf = [vt.shuffle(k) for k in SHUFFLE_KINDS]
    load, store = vt.load, vt.store
    s_idx, s_up, s_down, s_xor = shf

    @cuda.jit
    def k_shuffle(x, out):
        t = cuda.grid(1)
        n = cuda.gridDim.x * cuda.blockDim.x
        v = load(x, t)
        store(out, t, s_idx(0xFFFFFFFF, v, 7))
        store(out, n + t, s_up(0xFFFFFFFF, v, 3))
        store(out, 2 * n + t, s_down(0xFFFFFFFF, v, 5))
        store(out, 3 * n + t, s_xor(0xFFFFFFFF, v, 9))

    return k_shuffle


def same_values(got, exp, what):
    """Exactly equal; NaN equals NaN (a GPU may canonicalise its payload
    when float16 is widened and narrowed) and the sign of zero counts."""
    np.testing.assert_array_equal(got, exp, err_msg=str(what))
    if exp.dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(got), np.signbit(exp), err_msg=str(what))


def shuffle_model(x):
    n = len(x)
    lanes = np.arange(n) % 32
    base = np.arange(n) - lanes
    idx = base + 7
    up = np.where(lanes >= 3, np.arange(n) - 3, np.arange(n))
    down = np.where(lanes + 5 < 32, np.arange(n) + 5, np.arange(n))
    xor = base + (lanes ^ 9)
    return [x[idx], x[up], x[down], x[xor]]


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_shuffle_every_dtype_exactly(dt, rng):
    """Narrow fields are widened and unsigned ones reinterpreted for the
    shuffle: every bit pattern comes back (uint32 above 2**31, uint64 above
    2**63, float16 NaN and infinities, -0.0)."""
    vt = ValueType.of(dt)
    x = sample_values(rng, dt, 64)
    if dt.kind == "u":
        x[10:20] |= dt.type(1 << (8 * dt.itemsize - 1))
    out = np.zeros(4 * 64, dt)
    out = launch(make_shuffle_kernel(vt), 1, 64, x, out)[1].reshape(4, 64)
    for k, exp in enumerate(shuffle_model(x)):
        same_values(out[k], exp, SHUFFLE_KINDS[k])


def test_shuffle_tuple(rng):
    vt = ValueType.of((np.uint64, np.float16, np.bool_, np.int8))
    x = tuple(sample_values(rng, f, 32) for f in vt.fields)
    out = tuple(np.zeros(4 * 32, f) for f in vt.fields)
    out = launch(make_shuffle_kernel(vt), 1, 32, x, out)[1]
    for f, o in zip(x, out):
        o = o.reshape(4, 32)
        for k, exp in enumerate(shuffle_model(f)):
            same_values(o[k], exp, (f.dtype, SHUFFLE_KINDS[k]))
