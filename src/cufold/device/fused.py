"""Shortcuts built on fused transforms: dot, norm, logsumexp, count_nonzero, all, any.

Each is one reduction (:class:`cufold.device._Reduction`) with a ``transform`` applied
to every item as it is loaded and, where the result needs one, a ``post`` map applied
to each result, in the same kernel: nothing transformed is ever written. So each reads
its input once, and runs at the plain reduction's bandwidth wherever the transform's
arithmetic hides under the loads (every layout of ``cufold.sum`` applies, ``axis``
included: ``device/reduce.py`` for whole arrays, ``device/axis.py`` for axes).

=================  ==========================================  ==================================
shortcut           transform (item -> operand), operator       post (result ->)
=================  ==========================================  ==================================
``dot(x, y)``      ``x * y`` in the accumulator dtype, plus     --
``norm(x, 2)``     ``x * x`` in the accumulator dtype, plus     ``sqrt``
``norm(x, 1)``     ``abs(x)``, plus                             --
``norm(x, inf)``   ``abs(x)``, maximum (-inf: minimum)          --
``norm(x, 0)``     ``x != 0``, plus                             --
``norm(x, p)``     ``abs(x) ** p``, plus                        ``** (1 / p)``
``logsumexp(x)``   ``(x, 1)``, online (max, sum) operator        ``max + log(sum)``
``count_nonzero``  ``x != 0``, plus (int64)                     --
``all`` / ``any``  ``x != 0``, logical_and / logical_or         --
=================  ==========================================  ==================================

The online (max, sum) operator of logsumexp combines ``(m1, s1)`` and ``(m2, s2)`` as
``(m, s_hi + s_lo * exp(m_lo - m))`` with ``m`` the larger maximum: one ``exp`` per
item, no second pass (torch's logsumexp reads its input twice).
"""

import functools
import math

import numpy as np
from numba import config, cuda

from ..host import arrays as _arrays, types as _types
from ..ops import Op, logical_and, logical_or, maximum, minimum, plus

__all__ = ["dot", "vdot", "norm", "logsumexp", "count_nonzero", "all", "any"]


def _reductions():
    from . import _Reduction
    return _Reduction


def _float_result(dt):
    """The dtype of a norm or a logsumexp of ``dt`` items (NumPy's: floats keep theirs)."""
    return dt if dt.kind == "f" else np.dtype(np.float64)


# --- dot ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _product(acc):
    """The transform ``(a, b) -> a * b`` computed in accumulator dtype ``acc``."""
    t = acc.type

    def product(v):
        return t(v[0]) * t(v[1])

    return product


@functools.lru_cache(maxsize=None)
def _dot_reduction():
    return _reductions()(plus, name="dot")


def dot(x, y, out=None, *, dtype=None, stream=None, algorithm=None, deterministic=True):
    """The dot product ``sum(x * y)`` of two 1-D arrays in one pass (``numpy.dot`` of 1-D
    arrays). The result has NumPy's dtype (``numpy.result_type(x, y)``; bool: int64);
    ``dtype=`` sets the accumulator and result, as for ``sum``. Float16 multiplies and
    accumulates in float32. ``out``: a one-element array to write into. Arrays of more
    dimensions raise (NumPy's ``dot`` of matrices is a matrix product): :func:`vdot` takes
    them whole.

    ``deterministic="gpu_to_gpu"`` (float results): the products are summed by the binned
    reproducible sum (:mod:`cufold.device.reproducible`, its error bound with ``M`` the
    largest ``|x * y|``), fused as the plain dot is: the same bits on any GPU, launch
    shape, order or split of the items. Each product is rounded once to the
    accumulator's dtype (float32 for float16/float32 items), as the plain dot's.

    Example::

        >>> cufold.dot(cupy.arange(3.), cupy.ones(3))
        array(3.)
        >>> cufold.dot(x, y, deterministic="gpu_to_gpu")      # the same bits on any GPU
    """
    return _whole_dot(x, y, out, dtype, stream, algorithm, "dot", deterministic)


def vdot(x, y, out=None, *, dtype=None, stream=None, algorithm=None, deterministic=True):
    """``sum(x * y)`` over every item of two equally shaped real arrays of any dimensions
    (``numpy.vdot``, which flattens; views are read in place, not copied). Otherwise as
    :func:`dot` (``deterministic="gpu_to_gpu"`` takes C-contiguous arrays).

    Example::

        >>> cufold.vdot(cupy.ones((2, 3)), cupy.full((2, 3), 2.))
        array(12.)
    """
    return _whole_dot(x, y, out, dtype, stream, algorithm, "vdot", deterministic)


def _whole_dot(x, y, out, dtype, stream, algorithm, name, deterministic=True):
    ax, ay = _arrays.describe(x, "x"), _arrays.describe(y, "y")
    if name == "dot" and (ax.ndim != 1 or ay.ndim != 1):
        raise ValueError("cufold: dot takes 1-D arrays; got shapes %s and %s (numpy.dot of matrices is a "
                         "matrix product; cufold.vdot sums x * y over every item)" % (ax.shape, ay.shape))
    if ax.shape != ay.shape:
        raise ValueError("cufold: %s needs equally shaped arrays; got %s and %s" % (name, ax.shape, ay.shape))
    if ax.dtype.kind == "c" or ay.dtype.kind == "c":
        raise TypeError("cufold: %s of complex arrays is not supported" % name)
    res = np.dtype(dtype) if dtype is not None else np.result_type(ax.dtype, ay.dtype)
    if res.kind == "b":
        res = np.dtype(np.int64)
    return _dot_reduction()((ax, ay), None, res, out, stream, algorithm, deterministic, None, False,
                            _product(_types.accumulate(res)), None)


# --- norm -------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _norm_functions(ord_, acc, res):
    """(operator, transform, post) of the vector norm of order ``ord_`` accumulated in
    ``acc`` with results of ``res``."""
    t, r = acc.type, res.type
    if ord_ == 2:
        def square(v):
            w = t(v)
            return w * w

        def root(s):
            return r(math.sqrt(s))

        return plus, square, root
    if ord_ == 0:
        def nonzero(v):
            return t(v != 0)

        def as_result(s):
            return r(s)

        return plus, nonzero, as_result

    def magnitude(v):
        return t(abs(v))

    def cast(s):
        return r(s)

    if ord_ == 1:
        return plus, magnitude, cast
    if ord_ == math.inf:
        return maximum, magnitude, cast
    if ord_ == -math.inf:
        return minimum, magnitude, cast
    p, inv = t(ord_), t(1.0 / ord_)

    def power(v):
        return abs(t(v)) ** p

    def root_p(s):
        return r(s ** inv)

    return plus, power, root_p


@functools.lru_cache(maxsize=None)
def _norm_reduction(op, name):
    return _reductions()(op, name=name, needs_items=op is not plus)


def norm(x, ord=None, axis=None, keepdims=False, *, out=None, stream=None, algorithm=None,  # noqa: A002
         deterministic=True):
    """The vector norm of ``x`` (over all items, or over ``axis``: an int or a tuple of
    ints), as ``torch.linalg.vector_norm`` and ``numpy.linalg.norm`` of a vector:
    ``ord`` 2 (``None``, the default: also NumPy's Frobenius norm of a matrix)
    ``sqrt(sum(x*x))``, 1 ``sum(|x|)``, ``inf`` ``max(|x|)``, ``-inf`` ``min(|x|)``, 0
    the number of non-zeros, any other ``p`` ``sum(|x|**p)**(1/p)``. Float results keep
    ``x``'s dtype (float16 accumulates in float32), others are float64. NumPy's matrix
    norms are not computed: an ``ord`` over two axes (or ``axis=None`` of a matrix)
    raises, where ``numpy.linalg.norm`` would take a matrix norm; flatten first for
    the vector norm of every item (``cufold.norm(x.reshape(-1), 1)``).

    ``deterministic="gpu_to_gpu"``: the same bits on any GPU, launch shape, order or
    split: ``ord=2`` is the square root of the binned sum of squares
    (:mod:`cufold.device.reproducible`; each square rounded once to the accumulator's
    dtype), ``ord=1`` the binned sum of ``|x|`` (likewise 0 and other ``p``: their sum
    is binned, then the ``1/p`` power taken of it), ``inf``/``-inf`` a maximum/minimum,
    which is exact in any order already. Whole C-contiguous arrays only (``axis=None``
    or every axis; no ``keepdims``), as every ``gpu_to_gpu`` reduction.

    Example::

        >>> cufold.norm(torch.tensor([3., 4.], device="cuda"))
        tensor(5., device='cuda:0')
        >>> cufold.norm(x, deterministic="gpu_to_gpu")
    """
    a = _arrays.describe(x, "x")
    axes = (a.ndim if axis is None else 1 if axis.__class__ is int else len(axis))
    if ord is not None and axes >= 2 and a.ndim >= 2:
        raise ValueError("cufold: norm with ord=%r over %d axes is a matrix norm in numpy.linalg.norm, which "
                         "cufold does not compute; for the vector norm of every item flatten first "
                         "(cufold.norm(x.reshape(-1), %r))" % (ord, axes, ord))
    if ord is None:
        ord = 2  # noqa: A001
    try:
        ord_ = float(ord)
    except (TypeError, ValueError):
        raise ValueError("cufold: norm's ord must be a number (1, 2, inf, -inf, 0, p); got %r" % (ord,)) from None
    if ord_ != ord_:
        raise ValueError("cufold: norm's ord must not be NaN")
    res = _float_result(a.dtype)
    acc = _types.accumulate(res)
    op, tf, post = _norm_functions(ord_, acc, res)
    r = _norm_reduction(op, "norm")
    return r(a, None, acc, out, stream, algorithm, deterministic, axis, keepdims, tf, post)


# --- logsumexp ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _logsumexp_functions(acc, res):
    """(online (max, sum) operator, transform, post) for accumulator ``acc``, result ``res``."""
    t, r = acc.type, res.type
    zero, one, lowest = t(0), t(1), t(-np.inf)
    # exp of a difference <= 0: float32 takes the hardware's ex2.approx (libdevice's
    # fast_expf, a few ulp), so that the per-item exp hides under the loads.
    exp = cuda.libdevice.fast_expf if acc == np.float32 and not config.ENABLE_CUDASIM else math.exp

    def online(a, b):
        # The larger maximum stays; the other sum is rescaled to it: one exp. Equal
        # maxima (infinities too) add unscaled; an empty side (-inf) adds nothing.
        hi, lo = (a, b) if a[0] >= b[0] else (b, a)
        w = one if lo[0] == hi[0] else (zero if lo[0] == lowest else exp(lo[0] - hi[0]))
        return (hi[0], hi[1] + lo[1] * w)

    op = Op(online, identity=(lowest, zero), commutative=True, name="logsumexp")

    def lift(v):
        return (t(v), one)

    def finish(s):
        if s[1] == zero:        # nothing summed: the maximum is -inf (log(0) raises in the simulator)
            return r(s[0])
        return r(s[0] + math.log(s[1]))

    return op, lift, finish


@functools.lru_cache(maxsize=None)
def _logsumexp_reduction(op):
    return _reductions()(op, name="logsumexp")


def logsumexp(x, axis=None, *, keepdims=False, out=None, stream=None, algorithm=None):
    """``log(sum(exp(x)))`` without overflow, in one pass (SciPy's ``logsumexp``,
    ``torch.logsumexp``): an online (max, sum) operator keeps the running maximum
    and the sum scaled to it. Float results keep ``x``'s dtype (float16 accumulates
    in float32), others are float64; empty: ``-inf``; NaN propagates.

    Example::

        >>> cufold.logsumexp(torch.tensor([1000., 1000.], device="cuda"))
        tensor(1000.6931, device='cuda:0')
    """
    a = _arrays.describe(x, "x")
    res = _float_result(a.dtype)
    acc = _types.accumulate(res)
    op, lift, finish = _logsumexp_functions(acc, res)
    return _logsumexp_reduction(op)(a, None, None, out, stream, algorithm, True, axis, keepdims, lift, finish)


# --- counting and truth -------------------------------------------------------------------

def _nonzero(v):
    return v != 0


_COUNT = []


def count_nonzero(x, axis=None, *, keepdims=False, out=None, stream=None, algorithm=None):
    """The number of non-zero items (int64), as ``numpy.count_nonzero``; NaN counts.

    Example: ``cufold.count_nonzero(x, axis=0)``
    """
    if not _COUNT:
        _COUNT.append(_reductions()(plus, name="count_nonzero"))
    return _COUNT[0](x, None, np.int64, out, stream, algorithm, True, axis, keepdims, _nonzero, None)


_TRUTH = {}


def _truth(op, name):
    r = _TRUTH.get(name)
    if r is None:
        r = _TRUTH[name] = _reductions()(op, name=name)
    return r


def all(x, axis=None, out=None, keepdims=False, *, stream=None, algorithm=None):  # noqa: A001
    """Whether every item is non-zero (bool), as ``numpy.all``; empty: True.

    Example: ``cufold.all(x > 0)``
    """
    return _truth(logical_and, "all")(x, None, None, out, stream, algorithm, True, axis, keepdims, _nonzero,
                                       None)


def any(x, axis=None, out=None, keepdims=False, *, stream=None, algorithm=None):  # noqa: A001
    """Whether any item is non-zero (bool), as ``numpy.any``; empty: False.

    Example: ``cufold.any(x != x)   # any NaN``
    """
    return _truth(logical_or, "any")(x, None, None, out, stream, algorithm, True, axis, keepdims, _nonzero,
                                      None)
