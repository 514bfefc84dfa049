"""Binary operators: a function ``(a, b) -> c`` plus, where known, an identity.

Every primitive of cufold takes an operator. It may be one of the built-ins
below, an :class:`Op` made from your own function, or a plain Python function
or lambda (wrapped with :func:`as_op` on the way in). Operators must be
associative; reductions in an unspecified order (atomics, some device
algorithms) also need them commutative, which is said with
``commutative=True``. Scans never need commutativity.

Example::

    import cufold
    welford_like = cufold.Op(lambda a, b: (a[0] + b[0], max(a[1], b[1])),
                             identity=(0.0, -1e300), commutative=True)
    cufold.argmax.identity_for(cufold.ValueType.of((np.float32, np.int64)))
"""

import inspect
import math

import numpy as np

from . import _codegen, _fingerprint
from .values import ValueType


class Op:
    """A binary operator with an optional identity.

    Parameters
    ----------
    fn : callable
        ``fn(a, b)`` returning a value of the same shape (a scalar, or a
        tuple with as many fields). Plain Python: it is compiled as a Numba
        device function, so it may use the subset of Python Numba accepts.
    identity : value, callable or None
        The value ``e`` with ``fn(e, x) == fn(x, e) == x``; or a function of
        the :class:`ValueType` returning it; or None when there is none.
    commutative : bool
        Whether ``fn(a, b) == fn(b, a)``; unlocks orderings that need it.
    kinds : str or None
        For built-ins: the dtype kinds (``'biuf'``) each field may have.
    """

    def __init__(self, fn, identity=None, commutative=False, name=None, kinds=None, atomic=None,
                 fieldwise=False):
        if isinstance(fn, Op):
            raise TypeError("cufold: Op(...) takes a function, not an Op")
        _check_binary(fn)
        self.fn = fn
        self._identity = identity
        self.commutative = bool(commutative)
        self.name = name or getattr(fn, "__name__", "op")
        self.kinds = kinds
        #: name of the ``cuda.atomic`` function implementing this op, if any.
        self.atomic = atomic
        #: A scalar operator applied field by field to tuple values
        #: (``cufold.plus`` on (x, y, z) triples sums each field).
        self.fieldwise = bool(fieldwise)
        self._combine = {}
        self._checked = set()
        # fingerprint() when the first device function was made ("": unpinned; None: none made yet)
        self._first_fingerprint = None
        #: For argmin/argmax/minmax: the device-wide reduction that a call with one
        #: array runs (``cufold.argmax(x)``), set by the device layer.
        self.device_reduction = None

    def __repr__(self):
        return "cufold.Op(%s)" % self.name

    def __call__(self, *args, **kwargs):
        """``op(a, b)`` applies the operator on the host (``cufold.plus(1, 2) == 3``).

        The operators that are also reductions (``argmin``, ``argmax``,
        ``minmax``) reduce a whole device array when given one:
        ``cufold.argmax(x)``.
        """
        if len(args) == 2 and not kwargs:
            py = getattr(self.fn, "py_func", self.fn)
            return py(*args)
        if len(args) == 1 and self.device_reduction is not None:
            return self.device_reduction(args[0], **kwargs)
        raise TypeError("cufold: operator %s takes two values%s" % (
            self.name, " or one device array" if self.device_reduction is not None else ""))

    # --- identity ------------------------------------------------------------
    def identity_for(self, value_type):
        """The identity as a host value of ``value_type``, or None."""
        vt = ValueType.of(value_type)
        ident = self._identity
        if ident is None:
            return None
        if callable(ident):
            ident = ident(vt)
            if ident is None:
                return None
        return vt.make(ident)

    def check(self, value_type):
        """Raise a clear error if this operator cannot combine ``value_type``."""
        vt = ValueType.of(value_type)
        if vt in self._checked:
            return vt
        if self.kinds is not None:
            for f in vt.fields:
                if f.kind not in self.kinds:
                    raise TypeError(
                        "cufold: operator %s is not defined for dtype %s" % (self.name, f))
        if self.fieldwise:
            self._checked.add(vt)
            return vt
        py = getattr(self.fn, "py_func", self.fn)
        sample = vt.sample()
        try:
            with np.errstate(all="ignore"):
                out = py(sample, sample)
        except (TypeError, IndexError) as exc:
            # A structural mismatch (a scalar where a tuple was expected ...).
            raise TypeError(
                "cufold: operator %s cannot combine two values of type %s: %s"
                % (self.name, vt, exc)) from exc
        except Exception:  # noqa: BLE001 - device-only code; typing will tell
            return vt
        if vt.is_tuple != isinstance(out, tuple) or (vt.is_tuple and len(out) != vt.arity):
            raise TypeError(
                "cufold: operator %s must return a value of type %s, it returned %r"
                % (self.name, vt, out))
        self._checked.add(vt)
        return vt

    # --- device code -----------------------------------------------------------
    def fingerprint(self):
        """A stable text of what this operator computes (its function with the
        globals, closure values and defaults it uses, recursively; its identity and
        flags: ``cufold._fingerprint``), the same in every process running the same
        source with the same values; None where something it uses cannot be pinned
        down, or has changed since this process made its first device function
        (Numba compiled that one with the values of then)."""
        now = _fingerprint.fingerprint(self)
        first = self._first_fingerprint
        return now if first is None or now == first else None

    def combine(self, value_type):
        """Device function ``(a, b) -> value`` whose result has ``value_type``."""
        vt = ValueType.of(value_type)
        fn = self._combine.get(vt)
        if fn is None:
            self.check(vt)
            if not self._combine:
                self._first_fingerprint = _fingerprint.fingerprint(self) or ""
            src = "def combine(a, b):\n    return cast(op(a, b))\n"
            if self.fieldwise and vt.is_tuple:
                fields = ", ".join("op(a[%d], b[%d])" % (i, i) for i in range(vt.arity))
                src = "def combine(a, b):\n    return cast((%s,))\n" % fields
            fn = _codegen.build(src, "combine", {"op": _codegen.device(self.fn), "cast": vt.cast})
            self._combine[vt] = fn
        return fn


def _check_binary(fn):
    if not callable(fn):
        raise TypeError("cufold: an operator must be a function of two values, got %r" % (fn,))
    py = getattr(fn, "py_func", fn)
    try:
        sig = inspect.signature(py)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(0, 0)
    except TypeError:
        raise TypeError(
            "cufold: an operator must be a function of two values; %s%s is not"
            % (getattr(py, "__name__", "function"), sig)) from None


_wrapped = {}


def as_op(op, identity=None):
    """Return ``op`` as an :class:`Op` (a plain function is wrapped once and cached)."""
    if isinstance(op, Op):
        return op
    key = (op, identity) if identity is not None else op
    try:
        cached = _wrapped.get(key)
    except TypeError:  # unhashable identity
        return Op(op, identity=identity)
    if cached is None:
        cached = _wrapped[key] = Op(op, identity=identity)
    return cached


# --- identities by dtype -------------------------------------------------------

def _lowest(dt):
    return -np.inf if dt.kind == "f" else (False if dt.kind == "b" else np.iinfo(dt).min)


def _highest(dt):
    return np.inf if dt.kind == "f" else (True if dt.kind == "b" else np.iinfo(dt).max)


def _each(fn):
    def ident(vt):
        vals = tuple(fn(f) for f in vt.fields)
        return vals if vt.is_tuple else vals[0]
    return ident


# --- built-in operators ----------------------------------------------------------
# Minimum and maximum propagate NaN as NumPy's min and max do.

def _plus(a, b):
    return a + b


def _multiplies(a, b):
    return a * b


def _minimum(a, b):
    return a if (a < b or a != a) else b


def _maximum(a, b):
    return a if (a > b or a != a) else b


def _bit_and(a, b):
    return a & b


def _bit_or(a, b):
    return a | b


def _bit_xor(a, b):
    return a ^ b


def _logical_and(a, b):
    return (a != 0) and (b != 0)


def _logical_or(a, b):
    return (a != 0) or (b != 0)


def _argmin(a, b):
    # (value, index) pairs; ties and NaN as numpy.argmin: the first NaN, else the smallest
    # value at the lowest index. Written with & and |, not and/or or branches: selects on
    # predicates, where branches cost a warp divergence point per combine.
    a_nan = a[0] != a[0]
    b_nan = b[0] != b[0]
    same = (b[0] == a[0]) | (a_nan & b_nan)
    take_b = (b_nan & (not a_nan)) | (b[0] < a[0]) | (same & (b[1] < a[1]))
    return b if take_b else a


def _argmax(a, b):
    a_nan = a[0] != a[0]
    b_nan = b[0] != b[0]
    same = (b[0] == a[0]) | (a_nan & b_nan)
    take_b = (b_nan & (not a_nan)) | (b[0] > a[0]) | (same & (b[1] < a[1]))
    return b if take_b else a


def _minmax(a, b):
    lo = a[0] if (a[0] < b[0] or a[0] != a[0]) else b[0]
    hi = a[1] if (a[1] > b[1] or a[1] != a[1]) else b[1]
    return (lo, hi)


def _welford(a, b):
    # (count, mean, M2): Chan et al.'s pairwise update, stable in one pass.
    n = a[0] + b[0]
    if n == 0:
        return a
    delta = b[1] - a[1]
    nb_over_n = b[0] / n
    return (n, a[1] + delta * nb_over_n, a[2] + b[2] + delta * delta * a[0] * nb_over_n)


_INT64_MAX = np.iinfo(np.int64).max

plus = Op(_plus, identity=_each(lambda f: 0), commutative=True, name="plus", fieldwise=True, kinds="biuf", atomic="add")
multiplies = Op(_multiplies, identity=_each(lambda f: 1), commutative=True, name="multiplies", fieldwise=True, kinds="biuf")
minimum = Op(_minimum, identity=_each(_highest), commutative=True, name="minimum", fieldwise=True, kinds="biuf", atomic="min")
maximum = Op(_maximum, identity=_each(_lowest), commutative=True, name="maximum", fieldwise=True, kinds="biuf", atomic="max")
bit_and = Op(_bit_and, identity=_each(lambda f: True if f.kind == "b" else ~f.type(0)),
             commutative=True, name="bit_and", fieldwise=True, kinds="biu", atomic="and_")
bit_or = Op(_bit_or, identity=_each(lambda f: 0), commutative=True, name="bit_or", fieldwise=True, kinds="biu", atomic="or_")
bit_xor = Op(_bit_xor, identity=_each(lambda f: 0), commutative=True, name="bit_xor", fieldwise=True, kinds="biu", atomic="xor")
logical_and = Op(_logical_and, identity=_each(lambda f: 1), commutative=True, name="logical_and", fieldwise=True, kinds="biuf")
logical_or = Op(_logical_or, identity=_each(lambda f: 0), commutative=True, name="logical_or", fieldwise=True, kinds="biuf")


def _arg_identity(extreme):
    # (extreme value, largest index of the index field's dtype): an int64
    # maximum would not fit an int32 or uint32 index field.
    def ident(vt):
        if not vt.is_tuple or vt.arity != 2:
            return None
        return (extreme(vt.fields[0]), _highest(vt.fields[1]))
    return ident


argmin = Op(_argmin, identity=_arg_identity(_highest), commutative=True, name="argmin")
argmax = Op(_argmax, identity=_arg_identity(_lowest), commutative=True, name="argmax")
minmax = Op(_minmax, identity=lambda vt: (_highest(vt.fields[0]), _lowest(vt.fields[1])),
            commutative=True, name="minmax")
#: Welford's (count, mean, M2) merge; ``mean``/``var`` are built on it.
welford = Op(_welford, identity=lambda vt: (0, 0, 0), commutative=True, name="welford", kinds="f")

BUILTINS = {op.name: op for op in (plus, multiplies, minimum, maximum, bit_and, bit_or, bit_xor,
                                   logical_and, logical_or, argmin, argmax, minmax, welford)}

del math


# --- unary functions: transforms of items, post-maps of results -----------------------

class Transform(Op):
    """A function of one value, fused into a kernel: ``transform=`` (applied to each
    item before the operator; to the tuple of items of zipped inputs) or ``post=``
    (applied to each result). Numba compiles it as it compiles operators; its
    result type is what Numba's typing infers for the value type it is given.

    Example::

        sq = cufold.ops.as_transform(lambda v: v * v)
        sq.result_type(cufold.ValueType.of(np.float32))      # float32
    """

    def __init__(self, fn, role="transform"):
        if isinstance(fn, Op):
            raise TypeError("cufold: %s= takes a function of one value, not an operator" % role)
        if not callable(fn):
            raise TypeError("cufold: %s= must be a function of one value, got %r" % (role, fn))
        py = getattr(fn, "py_func", fn)
        try:
            inspect.signature(py).bind(0)
        except TypeError:
            raise TypeError("cufold: %s= must be a function of one value; %s is not"
                            % (role, getattr(py, "__name__", "the function"))) from None
        except ValueError:
            pass
        if not hasattr(py, "__code__"):
            # A built-in or library function (abs, math.sqrt): called from Python source
            # Numba can type and compile (it has no bytecode of its own).
            fn = _codegen.build("def call_%s(v):\n    return fn(v)\n" % role, "call_" + role, {"fn": fn},
                                device=False)
        self.fn = fn
        self._identity = None
        self.commutative = False
        self.name = getattr(py, "__name__", role)
        self.kinds = None
        self.atomic = None
        self.fieldwise = False
        self.role = role
        self._combine = {}
        self._checked = set()
        self._types = {}
        self._first_fingerprint = None
        self.device_reduction = None

    def __repr__(self):
        return "cufold.Transform(%s, %s)" % (self.role, self.name)

    def __call__(self, value):
        return getattr(self.fn, "py_func", self.fn)(value)

    def result_type(self, value_type):
        """The :class:`ValueType` this function returns for a value of ``value_type``;
        a TypeError naming the function where it does not compile for it."""
        vt = ValueType.of(value_type)
        got = self._types.get(vt)
        if got is None:
            got = self._types[vt] = _infer_result(self, vt)
        return got

    def device(self, value_type):
        """Device function ``(value) -> result``, cast to :meth:`result_type`."""
        vt = ValueType.of(value_type)
        fn = self._combine.get(vt)
        if fn is None:
            out_vt = self.result_type(vt)
            if not self._combine:
                self._first_fingerprint = _fingerprint.fingerprint(self) or ""
            fn = _codegen.build("def apply(v):\n    return cast(f(v))\n", "apply",
                                {"f": _codegen.device(self.fn), "cast": out_vt.cast})
            self._combine[vt] = fn
        return fn


def _infer_result(t, vt):
    """Numba's type of ``t.fn`` applied to a value of ``vt``, as a ValueType (typing
    only: Numba's CPU typing, which types arithmetic, ``math`` and NumPy scalars as
    the CUDA target does, and needs no GPU)."""
    from numba.core import compiler, registry, types as nbtypes
    from numba.core.typed_passes import type_inference_stage
    from numba.np.numpy_support import as_dtype
    py = getattr(t.fn, "py_func", t.fn)
    ctx = registry.cpu_target.typing_context
    ctx.refresh()
    try:
        interp = compiler.run_frontend(py)
        ret = type_inference_stage(ctx, registry.cpu_target.target_context, interp, (vt.numba_type,),
                                   None).return_type
    except Exception as exc:  # noqa: BLE001 - Numba's typing errors have many classes
        # Typing alone skips Numba's rewrites: on Python 3.12 ``v[0]`` of a tuple of mixed
        # types is then a getitem with an unknown index, which does not type. A CPU compile
        # runs them (slower, so only here).
        try:
            import numba
            disp = numba.njit(py)
            disp.compile((vt.numba_type,))
            ret = disp.nopython_signatures[0].return_type
        except Exception:  # noqa: BLE001
            first = str(exc).strip().splitlines()
            raise TypeError("cufold: %s function %s does not compile for a value of type %s: %s"
                            % (t.role, t.name, vt, first[0] if first else type(exc).__name__)) from None
    if isinstance(ret, nbtypes.BaseTuple):
        parts, is_tuple = list(ret), True
    else:
        parts, is_tuple = [ret], False
    fields = []
    for p in parts:
        p = nbtypes.unliteral(p)
        try:
            fields.append(np.dtype(as_dtype(p)))
        except Exception:  # noqa: BLE001
            raise TypeError("cufold: %s function %s returns %s for a value of type %s; it must return "
                            "numbers (or a tuple of them)" % (t.role, t.name, ret, vt)) from None
    try:
        return ValueType.of(tuple(fields) if is_tuple else fields[0])
    except TypeError as exc:
        raise TypeError("cufold: %s function %s returns %s for a value of type %s: %s"
                        % (t.role, t.name, ret, vt, exc)) from None


_transforms = {}


def as_transform(fn, role="transform"):
    """``fn`` as a :class:`Transform` (None stays None; a function is wrapped once
    per role and cached, so kernels are cached by the function as operators are)."""
    if fn is None or isinstance(fn, Transform):
        return fn
    key = (fn, role)
    try:
        got = _transforms.get(key)
    except TypeError:
        return Transform(fn, role)
    if got is None:
        got = _transforms[key] = Transform(fn, role)
    return got
