"""Device layer: host-callable algorithms over whole arrays.

Inputs are CUDA arrays of any library (CuPy, PyTorch, Numba, JAX, or anything
with ``__cuda_array_interface__``/DLPack); a tuple-valued input is a tuple of
equally long arrays. Results are 0-d device arrays of the input's own
library (a tuple of them for tuple values), computed on the input library's
current stream (or ``stream=``), without synchronising the host.
"""

import warnings

import numpy as np

from ..ops import argmax as _argmax_op, argmin as _argmin_op, as_op, maximum, minimum, minmax as _minmax_op
from ..ops import multiplies, plus, welford
from ..values import ValueType
from . import _arrays, _launch, _types
from . import axis as _axis
from . import reduce as _reduce_mod
from ._dispatch import algorithms
from .scan import cummax, cummin, cumprod, cumsum, exclusive_scan, inclusive_scan
from .segmented import reduce_by_key, segmented_reduce
from .histogram import bincount, histogram
from .bykey import reduce_by_key_into

__all__ = ["reduce", "sum", "prod", "min", "max", "argmin", "argmax", "minmax", "mean", "var",
           "mean_var", "algorithms", "inclusive_scan", "exclusive_scan", "cumsum", "cumprod", "cummax",
           "cummin", "segmented_reduce", "reduce_by_key", "reduce_by_key_into", "histogram", "bincount"]


def _inputs(x):
    if x.__class__ is tuple:
        return _arrays.describe_many(x)
    return (_arrays.describe(x),)


def _flat(a):
    """A C-contiguous N-D array as its 1-D sequence of elements."""
    return _arrays.window(a, 0, (a.size,), (1,))


def _vector(a):
    """``a`` (one element) as a 1-element 1-D array, as the kernels write it."""
    return _arrays.window(a, 0, (1,), (1,))


def _outputs(like, out_vt, out, stream):
    """(kernel views, objects to return): new 0-d arrays of the input's library,
    or the caller's ``out`` array(s)."""
    if out is None:
        objs, vecs = [], []
        for f in out_vt.fields:
            obj, arr = _arrays.empty(like, (), f, stream)
            objs.append(obj)
            vecs.append(_vector(arr))
    else:
        objs = list(out) if out.__class__ is tuple else [out]
        if len(objs) != out_vt.arity:
            raise ValueError("cufold: out= needs %d array(s) for a result of type %s" % (out_vt.arity, out_vt))
        vecs = []
        for o, f in zip(objs, out_vt.fields):
            a = _arrays.describe(o, "out")
            if a.size != 1:
                raise ValueError("cufold: out= must hold exactly one element, it has %d" % a.size)
            if a.dtype != f:
                raise TypeError("cufold: out= has dtype %s, the result is %s" % (a.dtype, f))
            vecs.append(_vector(a))
    return (tuple(vecs) if out_vt.is_tuple else vecs[0]), objs


class _Prepared:
    """What a reduction needs that does not depend on the data: value types,
    checked once per (operator, input dtypes, options)."""

    __slots__ = ("op", "in_vt", "acc_vt", "out_vt")

    def __init__(self, op, in_dtypes, is_tuple, dtype, acc, result):
        self.op = op
        self.in_vt = ValueType.of(in_dtypes if is_tuple else in_dtypes[0])
        if acc is None:
            fields = _types.result_fields(op, self.in_vt, dtype)
            self.acc_vt, self.out_vt = _types.value_types(fields)
        else:
            self.acc_vt, self.out_vt = ValueType.of(acc), ValueType.of(result)
        op.check(self.acc_vt)


_prepared = {}


class _Express:
    """The common call of one reduction -- a whole contiguous array, no
    ``init``, ``out``, ``stream``, ``dtype`` or ``axis`` -- made cheap.

    A small reduction is all host time (torch.sum: ~6 us per call). Per
    (input dtype, length, stream, device, library) this finds the plan, the
    result dtype and a bound launch once (:func:`reduce.runner`); a call then
    reads the input's pointer, takes a result array (:func:`_arrays.scalar_results`)
    and launches. Anything else (``None`` from the call) goes the general way.
    ``options(dtype)`` gives the configuration's ``_reduce`` keywords that
    depend on the input dtype (accumulator, result, lift, project).
    """

    __slots__ = ("op", "options", "name", "needs_items", "runs", "torch_runs")

    def __init__(self, op, options=None, name="reduce", needs_items=False):
        self.op = as_op(op)
        self.options = options or (lambda dt: {})
        self.name, self.needs_items = name, needs_items
        self.runs = _launch.BoundedCache(1024)
        self.torch_runs = _launch.BoundedCache(1024)    # torch tensors: keyed by their own attributes

    def reduce(self, x, init, dtype, out, stream, algorithm, deterministic, axis, keepdims):
        """The reduction this object is: the express path for a plain call, else
        the general one (``_reduce``) with the same configuration."""
        if (init is None and dtype is None and out is None and stream is None and axis is None
                and not keepdims and algorithm is None and deterministic):
            r = self(x)
            if r is not None:
                return r
        return _reduce(x, self.op, init, dtype, out, stream, algorithm, deterministic, axis=axis,
                       keepdims=keepdims, options=self.options, name=self.name, needs_items=self.needs_items)

    def __call__(self, x):
        if x.__class__ is _arrays.TORCH_TENSOR[0] and _launch._nvtx_annotate is None:
            # The commonest input, read directly (half the cost of describe()):
            # only its pointer changes from call to call.
            dev = x.get_device()
            if dev >= 0 and x.is_contiguous():
                n = x.numel()
                h = _arrays._torch_raw_stream(dev)
                key = (x.dtype, n, h, dev, _reduce_mod.tile_override())
                run = self.torch_runs.get(key)
                if run is None:
                    like = _arrays.describe(x)
                    run = self.torch_runs.put(key, self._make(_flat(like) if like.ndim != 1 else like, n, h,
                                                              torch_direct=True))
                if run:
                    return run(x.data_ptr())
        if x.__class__ is tuple or _launch._nvtx_annotate is not None:
            return None
        like = _arrays.describe(x)
        if not like.c_contiguous:     # the bound launches write pointers and lengths only
            return None
        if like.ndim != 1:
            like = _flat(like)
        n = like.size
        h = _arrays.stream_handle(like)
        key = (like.dtype, n, h, like.device_id, like.library, _reduce_mod.tile_override())
        run = self.runs.get(key)
        if run is None:
            run = self.runs.put(key, self._make(like, n, h))
        return run(like.ptr) if run else None

    def _make(self, like, n, h, torch_direct=False):
        """``run(x_ptr) -> result``, or False where this call shape goes the
        general way. ``torch_direct``: for tensors read without ``describe``,
        which would reject a lazily conjugated complex one, so complex is not taken."""
        if n == 0 or like.library == "jax" or (torch_direct and like.dtype.kind == "c"):
            return False
        o = self.options(like.dtype)
        prep = _prepare(self.op, (like,), False, None, o.get("acc"), o.get("result"))
        p = _reduce_mod.plan(prep.op, prep.in_vt, prep.acc_vt, prep.out_vt, n, like.device_id, None,
                             lift=o.get("lift", "value"), project=o.get("project", "value"),
                             ddof=o.get("ddof", 0), deterministic=True)
        if not _reduce_mod.one_launch(p):
            return False
        dev, out_vt = like.device_id, prep.out_vt
        fields = out_vt.fields if out_vt.is_tuple else (out_vt.dtype,)
        # the results' layout, bound once; each call gives new pointers
        outs = tuple(_arrays.shell(like, f, (1,)) for f in fields)
        outs = outs if out_vt.is_tuple else outs[0]
        # 8-byte-aligned inputs (nearly all) read 8 bytes a load (reduce.Plan.for_input); the
        # other kernel is compiled only if an input needs it (a first call compiles one kernel)
        go_wide = _reduce_mod.runner(p.wide or p, like, outs, h, dev, by_pointer=True)
        layout = _arrays.shell(like)     # (the caller's array is not kept)
        go = go_wide if p.wide is None else _made_on_first_call(
            lambda: _reduce_mod.runner(p, layout, outs, h, dev, by_pointer=True))
        takes = [_arrays.scalar_results(like, f, h) for f in fields]
        if out_vt.is_tuple:
            def run_fields(ptr):
                got = [take() for take in takes]
                (go if ptr & 7 else go_wide)(ptr, *[g[1] for g in got])
                return tuple(g[0] for g in got)

            return run_fields
        take = takes[0]

        def run(ptr):
            obj, out_ptr = take()
            (go if ptr & 7 else go_wide)(ptr, out_ptr)
            return obj

        return run


def _made_on_first_call(make):
    """A function that makes the real one, ``make()``, at its first call, then calls it."""
    made = []

    def call(*args):
        if not made:
            made.append(make())
        return made[0](*args)

    return call


def _reduce(x, op, init, dtype, out, stream, algorithm, deterministic, *, axis=None, keepdims=False,
            lift="value", project="value", ddof=0, acc=None, result=None, name="reduce", needs_items=False,
            options=None):
    """The general reduction. ``options``: ``dtype -> {keyword: value}``, those of
    ``lift``, ``project``, ``ddof``, ``acc``, ``result`` that depend on the input's
    dtype (read here, from the one description of ``x``)."""
    with _launch.nvtx_range(name):
        arrs = _inputs(x)
        like = arrs[0]
        if options is not None:
            o = options(like.dtype)
            lift, project, ddof = o.get("lift", lift), o.get("project", project), o.get("ddof", ddof)
            acc, result = o.get("acc", acc), o.get("result", result)
        if like.ndim != 1 or axis is not None or keepdims:
            axes = _axis.normalize_axis(axis, like.ndim)
            whole = len(axes) == like.ndim and not keepdims and all(a.c_contiguous for a in arrs)
            if not whole:
                return _by_axes(arrs, x, op, init, dtype, out, stream, algorithm, axes, keepdims, lift, project,
                                ddof, acc, result, name, needs_items)
            arrs = tuple(_flat(a) for a in arrs)
            like = arrs[0]
        is_tuple = x.__class__ is tuple
        prep = _prepare(op, arrs, is_tuple, dtype, acc, result)
        op = prep.op
        n = like.size
        handle = _arrays.stream_handle(like, stream)
        outs, objs = _outputs(like, prep.out_vt, out, None if stream is None else handle)
        if n == 0 and lift == "welford":
            # NumPy: the mean (and variance) of nothing is NaN, with a warning.
            warnings.warn("Mean of empty slice", RuntimeWarning, stacklevel=3)
            nan = tuple(np.nan for _ in prep.out_vt.fields)
            _reduce_mod.launch(_reduce_mod.fill_kernel(prep.out_vt), ("fill", prep.out_vt), 1, 1, handle,
                               (outs, prep.out_vt.make(nan if prep.out_vt.is_tuple else nan[0])))
        elif n == 0:
            value = init if init is not None else op.identity_for(prep.acc_vt)
            if needs_items or value is None:
                raise ValueError("cufold: zero-size array to reduction operation %s which has no identity"
                                 % (name if needs_items else op.name))
            _reduce_mod.launch(_reduce_mod.fill_kernel(prep.out_vt), ("fill", prep.out_vt), 1, 1, handle,
                               (outs, prep.out_vt.make(value)))
        else:
            p = _reduce_mod.plan(op, prep.in_vt, prep.acc_vt, prep.out_vt, n, like.device_id, algorithm,
                                 lift=lift, project=project, ddof=ddof, deterministic=deterministic)
            _reduce_mod.run(p, arrs if is_tuple else like, n, outs, handle, like.device_id, init)
        result_objs = [_arrays.to_library(o, like) for o in objs] if out is None else objs
        return tuple(result_objs) if prep.out_vt.is_tuple else result_objs[0]


def _prepare(op, arrs, is_tuple, dtype, acc, result):
    in_dtypes = tuple(a.dtype for a in arrs)
    key = (op, in_dtypes, is_tuple, dtype, acc, result)
    prep = _prepared.get(key)
    if prep is None:
        prep = _prepared[key] = _Prepared(as_op(op), in_dtypes, is_tuple, dtype, acc, result)
    return prep


def _by_axes(arrs, x, op, init, dtype, out, stream, algorithm, axes, keepdims, lift, project, ddof, acc,
             result, name, needs_items):
    prep = _prepare(op, arrs, x.__class__ is tuple, dtype, acc, result)
    if lift == "index" and len(axes) != 1 and len(axes) != arrs[0].ndim:
        raise ValueError("cufold: %s takes a single axis (or None)" % name)
    return _axis.reduce_axes(arrs, x.__class__ is tuple, axes, keepdims, prep, init, out, stream, algorithm,
                             lift, project, ddof, needs_items, name)


def reduce(x, op=plus, init=None, *, axis=None, keepdims=False, dtype=None, out=None, stream=None,
           algorithm=None, deterministic=True):
    """Reduce a whole array with a binary operator.

    Parameters
    ----------
    x : CUDA array, or tuple of equally long CUDA arrays (a tuple value type)
    op : cufold.Op or function ``(a, b) -> c``; must be associative. A plain
        function is taken as non-commutative (an ordered fold, a little slower);
        wrap it in ``cufold.Op(fn, commutative=True)`` when it commutes.
    init : optional value folded in front (NumPy's ``initial``); also the
        result of an empty input.
    dtype : accumulator and result dtype (default: NumPy's rules; sums of
        small integers are int64/uint64, float16 accumulates in float32).
    out : a one-element device array (a tuple of them) to write into.
    stream : the library's stream object or a raw ``CUstream`` handle.
    algorithm : one of ``cufold.algorithms("reduce")``; None lets the dispatcher choose.
    deterministic : False allows floating-point atomic algorithms.

    Returns a 0-d device array of ``x``'s library (a tuple for tuple values);
    the host is not synchronised.

    Example::

        >>> x = cupy.arange(10, dtype=cupy.int32)
        >>> cufold.reduce(x, cufold.maximum)
        array(9, dtype=int32)
        >>> cufold.reduce((x, x * 2), lambda a, b: (a[0] + b[0], max(a[1], b[1])))
        (array(45, dtype=int32), array(18, dtype=int32))
    """
    ex = _express_by_op.get(op)
    if ex is None:
        ex = _express_by_op.put(op, _Express(op))
    return ex.reduce(x, init, dtype, out, stream, algorithm, deterministic, axis, keepdims)


_express_by_op = _launch.BoundedCache(256)
_SUM, _PROD = _Express(plus, name="sum"), _Express(multiplies, name="prod")
_MIN, _MAX = _Express(minimum, name="min", needs_items=True), _Express(maximum, name="max", needs_items=True)


def sum(x, *, axis=None, keepdims=False, dtype=None, out=None, stream=None, algorithm=None, deterministic=True):  # noqa: A001
    """Sum of all elements (``numpy.sum``'s dtype rules). Example: ``cufold.sum(torch.ones(5, device='cuda'))``."""
    return _SUM.reduce(x, None, dtype, out, stream, algorithm, deterministic, axis, keepdims)


def prod(x, *, axis=None, keepdims=False, dtype=None, out=None, stream=None, algorithm=None):
    """Product of all elements (``numpy.prod``'s dtype rules). Example: ``cufold.prod(x)``."""
    return _PROD.reduce(x, None, dtype, out, stream, algorithm, True, axis, keepdims)


def min(x, *, axis=None, keepdims=False, out=None, stream=None, algorithm=None):  # noqa: A001
    """Smallest element; NaN propagates; an empty array raises, as ``numpy.min``. Example: ``cufold.min(x)``."""
    return _MIN.reduce(x, None, None, out, stream, algorithm, True, axis, keepdims)


def max(x, *, axis=None, keepdims=False, out=None, stream=None, algorithm=None):  # noqa: A001
    """Largest element; NaN propagates; an empty array raises, as ``numpy.max``. Example: ``cufold.max(x)``."""
    return _MAX.reduce(x, None, None, out, stream, algorithm, True, axis, keepdims)


def _arg_options(dt):
    return {"lift": "index", "project": "index", "acc": (_types.accumulate(dt), np.int64), "result": np.int64}


_ARGMIN = _Express(_argmin_op, _arg_options, name="argmin", needs_items=True)
_ARGMAX = _Express(_argmax_op, _arg_options, name="argmax", needs_items=True)


def _arg(x, op, name, out, stream, algorithm, axis=None, keepdims=False):
    return (_ARGMAX if op is _argmax_op else _ARGMIN).reduce(x, None, None, out, stream, algorithm, True,
                                                            axis, keepdims)


def _argmin(x, *, axis=None, keepdims=False, out=None, stream=None, algorithm=None):
    """Index of the first smallest element (the first NaN if any), as ``numpy.argmin``.

    Example: ``i = cufold.argmin(cupy.asarray([3, 1, 1]))  # -> 1``
    """
    return _arg(x, _argmin_op, "argmin", out, stream, algorithm, axis, keepdims)


def _argmax(x, *, axis=None, keepdims=False, out=None, stream=None, algorithm=None):
    """Index of the first largest element (the first NaN if any), as ``numpy.argmax``.

    Example: ``i = cufold.argmax(torch.tensor([1., 5., 5.], device='cuda'))  # -> 1``
    """
    return _arg(x, _argmax_op, "argmax", out, stream, algorithm, axis, keepdims)


def _minmax(x, *, axis=None, keepdims=False, out=None, stream=None, algorithm=None):
    """``(min, max)`` in one pass. Example: ``lo, hi = cufold.minmax(x)``."""
    return _MINMAX.reduce(x, None, None, out, stream, algorithm, True, axis, keepdims)


def _minmax_options(dt):
    acc = _types.accumulate(dt)
    return {"lift": "pair", "acc": (acc, acc), "result": (dt, dt)}


_MINMAX = _Express(_minmax_op, _minmax_options, name="minmax", needs_items=True)


# argmin, argmax and minmax are operators (cufold.argmax(a, b) combines two
# (value, index) pairs) and reductions (cufold.argmax(x)): one object, both uses.
_argmin_op.device_reduction = _argmin
_argmax_op.device_reduction = _argmax
_minmax_op.device_reduction = _minmax
argmin, argmax, minmax = _argmin_op, _argmax_op, _minmax_op


def _moment_options(project, ddof, dtype, in_dtype):
    dt = np.dtype(dtype) if dtype is not None else _types.mean_dtype(in_dtype)
    acc = np.float64 if dt.itemsize > 4 or dt == np.float32 else np.float32
    result = (dt, dt) if project == "mean_var" else dt
    return {"lift": "welford", "project": project, "ddof": ddof, "acc": (acc, acc, acc), "result": result}


_moment_express = _launch.BoundedCache(64)


def _moments(x, project, ddof, out, stream, algorithm, dtype, name, axis, keepdims):
    if dtype is None and ddof.__class__ is int:
        ex = _moment_express.get((project, ddof))
        if ex is None:
            ex = _moment_express.put((project, ddof), _Express(
                welford, lambda dt: _moment_options(project, ddof, None, dt), name=name, needs_items=True))
        return ex.reduce(x, None, None, out, stream, algorithm, True, axis, keepdims)
    return _reduce(x, welford, None, None, out, stream, algorithm, True, axis=axis, keepdims=keepdims,
                   name=name, needs_items=True, options=lambda dt: _moment_options(project, ddof, dtype, dt))


def mean(x, *, axis=None, keepdims=False, dtype=None, out=None, stream=None, algorithm=None):
    """Arithmetic mean (float64 for integer input, as ``numpy.mean``). Example: ``cufold.mean(x)``."""
    return _moments(x, "mean", 0, out, stream, algorithm, dtype, "mean", axis, keepdims)


def var(x, *, axis=None, keepdims=False, ddof=0, dtype=None, out=None, stream=None, algorithm=None):
    """Variance in one pass (Welford/Chan), ``ddof`` as ``numpy.var``. Example: ``cufold.var(x, ddof=1)``."""
    return _moments(x, "var", ddof, out, stream, algorithm, dtype, "var", axis, keepdims)


def mean_var(x, *, axis=None, keepdims=False, ddof=0, dtype=None, out=None, stream=None, algorithm=None):
    """``(mean, var)`` in one pass (as ``torch.var_mean``, in the other order).

    Example: ``m, v = cufold.mean_var(x)``
    """
    return _moments(x, "mean_var", ddof, out, stream, algorithm, dtype, "mean_var", axis, keepdims)
