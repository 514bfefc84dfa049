"""Device layer: host-callable algorithms over whole arrays.

Inputs are CUDA arrays of any library (CuPy, PyTorch, Numba, JAX, or anything
with ``__cuda_array_interface__``/DLPack); a tuple-valued input is a tuple of
equally long arrays. Results are 0-d device arrays of the input's own
library (a tuple of them for tuple values), computed on the input library's
current stream (or ``stream=``), without synchronising the host.
"""

import warnings
from builtins import all as _all, any as _any   # (cufold.all/any are reductions: see __getattr__)

import numpy as np

from ..ops import argmax as _argmax_op, argmin as _argmin_op, as_op, maximum, minimum, minmax as _minmax_op
from ..ops import as_transform, multiplies, plus, welford
from ..values import InputType, ValueType
from ..host import arrays as _arrays, launch as _launch, programs as _programs, types as _types
from . import axis as _axis
from . import reduce as _reduce_mod
from . import reproducible
from ..host.dispatch import algorithms
from .scan import cummax, cummin, cumprod, cumsum, exclusive_scan, inclusive_scan
from .segmented import reduce_by_key, segmented_reduce
from .segscan import exclusive_scan_by_key, inclusive_scan_by_key, segmented_scan
from .histogram import bincount, histogram
from .bykey import reduce_by_key_into
from . import bykey_tuple as _bykey_tuple  # noqa: F401  (tuple values; registers its algorithms)

__all__ = ["reduce", "sum", "prod", "min", "max", "argmin", "argmax", "minmax", "mean", "var",
           "mean_var", "algorithms", "inclusive_scan", "exclusive_scan", "cumsum", "cumprod", "cummax",
           "cummin", "segmented_reduce", "reduce_by_key", "reduce_by_key_into", "histogram", "bincount",
           "segmented_scan", "inclusive_scan_by_key", "exclusive_scan_by_key",
           "dot", "vdot", "norm", "logsumexp", "count_nonzero", "all", "any"]


def _flat(a):
    """A C-contiguous N-D array as its 1-D sequence of elements."""
    return _arrays.window(a, 0, (a.size,), (1,))


def _vector(a):
    """``a`` (one element) as a 1-element 1-D array, as the kernels write it."""
    return _arrays.window(a, 0, (1,), (1,))


class _Prepared:
    """What a reduction needs that does not depend on the data: value types,
    checked once per (operator, input dtypes and sources, options, transform, post).

    ``in_vt`` is what is loaded (an InputType where fields are generated), ``item_vt``
    what the operator's lift sees (the transform's result), ``acc_vt`` the
    accumulator, ``out_vt`` the result (the post-map's, where there is one) and
    ``post`` None or ``(Transform, the result type before it)``."""

    __slots__ = ("op", "in_vt", "item_vt", "acc_vt", "out_vt", "transform", "post")

    def __init__(self, op, in_dtypes, sources, is_tuple, dtype, options, transform, post):
        self.op = op
        self.in_vt = InputType.of(in_dtypes if is_tuple else in_dtypes[0], sources)
        self.transform = transform
        self.item_vt = ValueType.of(self.in_vt) if transform is None else transform.result_type(self.in_vt)
        item = self.item_vt
        o = options(item.fields[0])
        acc, result = o.get("acc"), o.get("result")
        lift = o.get("lift", "value")
        if lift != "value" and item.is_tuple:
            raise TypeError("cufold: %s reduces single values; %s gives %s"
                            % (op.name, "the transform %s" % transform.name if transform else "the input", item))
        if acc is None:
            fields = _types.result_fields(op, item, dtype)
            self.acc_vt, mid_vt = _types.value_types(fields)
        else:
            self.acc_vt, mid_vt = ValueType.of(acc), ValueType.of(result)
        try:
            op.check(self.acc_vt)
        except TypeError as exc:
            if transform is None:
                raise
            raise TypeError("%s (the items are what transform %s returns: %s)" % (exc, transform.name, item)) \
                from None
        self.post = None if post is None else (post, mid_vt)
        self.out_vt = mid_vt if post is None else post.result_type(mid_vt)


def _no_options(dtype):
    return {}


_signature = _programs.signature


class _Reduction:
    """One configured reduction -- an operator, and what depends on the input's
    dtype (``options(dtype)``: accumulator, result, lift, projection, ddof) --
    called per array: the host path of ``reduce`` and every shortcut.

    Per call signature (:mod:`cufold.host.programs`) the first call plans a
    Program; later calls describe their arrays and run it (a small reduction is
    all host time: torch.sum costs ~8 us per call).
    """

    __slots__ = ("op", "options", "name", "needs_items", "programs")

    def __init__(self, op, options=None, name="reduce", needs_items=False):
        self.op = op                     # as given: a plain function becomes an Op when planned
        self.options = options or _no_options
        self.name, self.needs_items = name, needs_items
        self.programs = _programs.Programs(self._plan, "cufold." + name, 1024)

    def __call__(self, x, init=None, dtype=None, out=None, stream=None, algorithm=None, deterministic=True,
                 axis=None, keepdims=False, transform=None, post=None):
        is_tuple = x.__class__ is tuple
        arrs = _arrays.describe_many(x) if is_tuple else (_arrays.describe(x),)
        h = _arrays.stream_handle(arrs if is_tuple else arrs[0], stream)
        if out is None:
            return self.programs.run((tuple(map(_signature, arrs)), h, init, dtype, axis, keepdims, algorithm,
                                      deterministic, is_tuple, (), stream is not None, _reduce_mod.tile_override(),
                                      transform, post), *arrs)
        given = tuple(_arrays.describe(o, "out") for o in (out if out.__class__ is tuple else (out,)))
        self.programs.run((tuple(map(_signature, arrs)), h, init, dtype, axis, keepdims, algorithm, deterministic,
                           is_tuple, tuple(map(_signature, given)), stream is not None,
                           _reduce_mod.tile_override(), transform, post), *arrs, *given)
        return out

    def _plan(self, key, *arrays):
        """The Program of call signature ``key`` (see :meth:`__call__`), for ``arrays``:
        the input(s), then out='s."""
        (sigs, h, init, dtype, axis, keepdims, algorithm, deterministic, is_tuple, out_sigs, given_stream, _,
         transform, post) = key
        arrs, given = arrays[:len(sigs)], arrays[len(sigs):]
        alloc_stream = h if given_stream else None
        like = _arrays.first_stored(arrs)
        prep = _prepare(self.op, self.options, arrs, is_tuple, dtype, transform, post)
        o = self.options(prep.item_vt.fields[0])
        lift, project, ddof = o.get("lift", "value"), o.get("project", "value"), o.get("ddof", 0)
        stored = tuple(a for a in arrs + given if a.library != "generated")
        b = _programs.Builder(stored[0].device_id if stored else like.device_id, h, alloc_stream)
        xs = tuple(b.input(a) for a in arrs)
        first = _arrays.first_stored(xs)
        ys = tuple(b.input(a) for a in given)
        out_vt = prep.out_vt
        if deterministic.__class__ is str:
            route = _gpu_to_gpu(deterministic, prep, project)
            if route is not None:
                return reproducible.plan_reduction(b, arrs, xs, ys, route, prep, init, axis, keepdims)
        if given and stored:
            _arrays.same_device(stored, "x and out")
        if like.ndim != 1 or axis is not None or keepdims or not _all(a.c_contiguous for a in arrs):
            axes = _axis.normalize_axis(axis, like.ndim)
            whole = len(axes) == like.ndim and not keepdims and _all(a.c_contiguous for a in arrs)
            if not whole and _any(a.library == "generated" for a in arrs):
                raise ValueError("cufold: generated inputs (counting, constant) reduce whole: axis=None, "
                                 "keepdims=False")
            if lift == "index" and not whole and len(axes) != 1 and len(axes) != like.ndim:
                raise ValueError("cufold: %s takes a single axis (or None)" % self.name)
            if not whole:
                _axis.plan_axes(b, xs, ys, is_tuple, axes, keepdims, prep, init, algorithm, lift, project, ddof,
                                self.needs_items, self.name)
                return b.build(_results(out_vt, given))
            xs = tuple(_flat(a) for a in xs)
        outs = _scalar_outputs(b, first, out_vt, ys)
        n = like.size
        if n == 0 and lift in _reduce_mod.NAN_WHEN_EMPTY:
            # NumPy: the mean (and variance) of nothing is NaN, with a warning (at every call).
            nan = tuple(np.nan for _ in out_vt.fields)
            _launch.fill(b, out_vt, outs, 1, nan if out_vt.is_tuple else nan[0])
            b.after(lambda arrays, values: warnings.warn("Mean of empty slice", RuntimeWarning, stacklevel=4))
        elif n == 0:
            value = init if init is not None else prep.op.identity_for(prep.acc_vt)
            if self.needs_items or value is None:
                raise ValueError("cufold: zero-size array to reduction operation %s which has no identity"
                                 % (self.name if self.needs_items else prep.op.name))
            if prep.post is not None:     # the identity through the post-map
                _reduce_mod.fill_projected(b, prep.acc_vt, out_vt, prep.post, outs, 1, value)
            else:
                _launch.fill(b, out_vt, outs, 1, value)
        else:
            p = _reduce_mod.plan(prep.op, prep.in_vt, prep.acc_vt, out_vt, n, like.device_id, algorithm,
                                 lift=lift, project=project, ddof=ddof, deterministic=deterministic,
                                 transform=prep.transform, post=prep.post)
            _reduce_mod.run(b, p, xs if is_tuple else xs[0], n, outs, init)
        return b.build(_results(out_vt, given))


def _gpu_to_gpu(deterministic, prep, project):
    """Which reproducible reduction ``deterministic="gpu_to_gpu"`` runs ("sum", "mean"), or
    None where the ordinary one is already the same on any GPU (integer sums, min, max).
    The items are what the operator sees: a transform's results (of zipped or generated
    inputs too)."""
    if deterministic != "gpu_to_gpu":
        raise ValueError("cufold: deterministic must be True, False or 'gpu_to_gpu'; got %r" % (deterministic,))
    item = prep.item_vt
    floats = _any(f.kind in "fc" for f in item.fields)
    if project == "count_mean":                 # cufold.mean (before plus: it reduces with plus)
        return "mean"
    if prep.op is plus and not item.is_tuple and item.dtype.kind == "f":
        return "sum"
    if floats and prep.op not in (minimum, maximum):
        raise ValueError("cufold: deterministic='gpu_to_gpu' applies to float sums and means (and exact "
                         "operators: min, max, integer ops), not %s on %s" % (prep.op.name, item))
    return None


def _scalar_outputs(b, like, out_vt, given):
    """The results as 1-element arrays: new 0-d outputs of the Program, or out= (checked)."""
    if not given:
        vecs = [_vector(b.output(like, (), f)) for f in out_vt.fields]
    else:
        if len(given) != out_vt.arity:
            raise ValueError("cufold: out= needs %d array(s) for a result of type %s" % (out_vt.arity, out_vt))
        vecs = []
        for a, f in zip(given, out_vt.fields):
            if a.size != 1:
                raise ValueError("cufold: out= must hold exactly one element, it has %d" % a.size)
            if a.dtype != f:
                raise TypeError("cufold: out= has dtype %s, the result is %s" % (a.dtype, f))
            vecs.append(_vector(a))
    return tuple(vecs) if out_vt.is_tuple else vecs[0]


def _results(out_vt, given):
    """The Program's finish: the new result(s) (none where out= was given: the caller returns it)."""
    if out_vt.is_tuple and not given:
        return tuple          # a 1-field tuple value still returns a tuple
    return None


_prepared = _launch.BoundedCache(4096)


def _prepare(op, options, arrs, is_tuple, dtype, transform, post):
    in_dtypes = tuple(a.dtype for a in arrs)
    sources = tuple("array" if a.library != "generated" else a.source for a in arrs)
    key = (op, options, in_dtypes, sources, is_tuple, dtype, transform, post)
    prep = _prepared.get(key)
    if prep is None:
        prep = _prepared.put(key, _Prepared(as_op(op), in_dtypes, sources, is_tuple, dtype, options,
                                            as_transform(transform), as_transform(post, "post")))
    return prep


def reduce(x, op=plus, init=None, *, axis=None, keepdims=False, dtype=None, out=None, stream=None,
           algorithm=None, deterministic=True, transform=None, post=None):
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
    deterministic : False allows floating-point atomic algorithms; True (the
        default): the same bits from run to run on one GPU and launch shape;
        ``"gpu_to_gpu"``: the same bits on any GPU, launch shape, order or split
        of the items (float sums: binned summation, see
        :mod:`cufold.device.reproducible`, with its error bound).
    transform : a function of one item (of the tuple of items for tuple inputs),
        applied to every item before ``op``, in the same kernel (nothing is
        written in between). The items ``op`` combines, and so the accumulator's
        dtype rules, are what Numba infers it returns.
    post : a function of one result, applied to each result in the kernel
        (CuPy's post-map: ``math.sqrt`` for a norm); the result's dtype is its own.

    ``x`` (or a field of a tuple) may be a generated input, ``cufold.counting(n)``
    or ``cufold.constant(n, value)``: no memory, the item is computed from its index.

    Returns a 0-d device array of ``x``'s library (a tuple for tuple values);
    the host is not synchronised.

    Example::

        >>> x = cupy.arange(10, dtype=cupy.int32)
        >>> cufold.reduce(x, cufold.maximum)
        array(9, dtype=int32)
        >>> cufold.reduce((x, x * 2), lambda a, b: (a[0] + b[0], max(a[1], b[1])))
        (array(45, dtype=int32), array(18, dtype=int32))
        >>> cufold.reduce((x, y), transform=lambda v: v[0] * v[1])      # a dot product, fused
    """
    r = _by_op.get(op)
    if r is None:
        r = _by_op.put(op, _Reduction(op))
    return r(x, init, dtype, out, stream, algorithm, deterministic, axis, keepdims, transform, post)


_by_op = _launch.BoundedCache(256)     # reductions by operator (users' too: bounded)
_SUM, _PROD = _Reduction(plus, name="sum"), _Reduction(multiplies, name="prod")
_MIN, _MAX = _Reduction(minimum, name="min", needs_items=True), _Reduction(maximum, name="max", needs_items=True)


def sum(x, *, axis=None, keepdims=False, dtype=None, out=None, stream=None, algorithm=None, deterministic=True,  # noqa: A001
        transform=None, post=None):
    """Sum of all elements (``numpy.sum``'s dtype rules; ``transform``/``post`` as :func:`reduce`).
    Example: ``cufold.sum(torch.ones(5, device='cuda'))``; ``cufold.sum(x, transform=lambda v: v * v)``.

    ``deterministic="gpu_to_gpu"``: the same bits on any GPU, launch shape, item order
    or split (binned summation of float16/32/64 items; whole contiguous arrays; error
    bound in :mod:`cufold.device.reproducible`): ``cufold.sum(x, deterministic="gpu_to_gpu")``.
    """
    return _SUM(x, None, dtype, out, stream, algorithm, deterministic, axis, keepdims, transform, post)


def prod(x, *, axis=None, keepdims=False, dtype=None, out=None, stream=None, algorithm=None, transform=None,
         post=None):
    """Product of all elements (``numpy.prod``'s dtype rules). Example: ``cufold.prod(x)``."""
    return _PROD(x, None, dtype, out, stream, algorithm, True, axis, keepdims, transform, post)


def min(x, *, axis=None, keepdims=False, out=None, stream=None, algorithm=None, transform=None,  # noqa: A001
        post=None):
    """Smallest element; NaN propagates; an empty array raises, as ``numpy.min``. Example: ``cufold.min(x)``."""
    return _MIN(x, None, None, out, stream, algorithm, True, axis, keepdims, transform, post)


def max(x, *, axis=None, keepdims=False, out=None, stream=None, algorithm=None, transform=None,  # noqa: A001
        post=None):
    """Largest element; NaN propagates; an empty array raises, as ``numpy.max``. Example: ``cufold.max(x)``."""
    return _MAX(x, None, None, out, stream, algorithm, True, axis, keepdims, transform, post)


def _arg_options(dt):
    return {"lift": "index", "project": "index", "acc": (_types.accumulate(dt), np.int64), "result": np.int64}


_ARGMIN = _Reduction(_argmin_op, _arg_options, name="argmin", needs_items=True)
_ARGMAX = _Reduction(_argmax_op, _arg_options, name="argmax", needs_items=True)


def _arg(x, op, name, out, stream, algorithm, axis=None, keepdims=False, transform=None):
    return (_ARGMAX if op is _argmax_op else _ARGMIN)(x, None, None, out, stream, algorithm, True, axis,
                                                      keepdims, transform)


def _argmin(x, *, axis=None, keepdims=False, out=None, stream=None, algorithm=None, transform=None):
    """Index of the first smallest element (the first NaN if any), as ``numpy.argmin``.

    Example: ``i = cufold.argmin(cupy.asarray([3, 1, 1]))  # -> 1``
    """
    return _arg(x, _argmin_op, "argmin", out, stream, algorithm, axis, keepdims, transform)


def _argmax(x, *, axis=None, keepdims=False, out=None, stream=None, algorithm=None, transform=None):
    """Index of the first largest element (the first NaN if any), as ``numpy.argmax``.

    Example: ``i = cufold.argmax(torch.tensor([1., 5., 5.], device='cuda'))  # -> 1``;
    the index of the largest transformed item: ``cufold.argmax(x, transform=abs)``.
    """
    return _arg(x, _argmax_op, "argmax", out, stream, algorithm, axis, keepdims, transform)


def _minmax(x, *, axis=None, keepdims=False, out=None, stream=None, algorithm=None, transform=None):
    """``(min, max)`` in one pass. Example: ``lo, hi = cufold.minmax(x)``."""
    return _MINMAX(x, None, None, out, stream, algorithm, True, axis, keepdims, transform)


def _minmax_options(dt):
    acc = _types.accumulate(dt)
    return {"lift": "pair", "acc": (acc, acc), "result": (dt, dt)}


_MINMAX = _Reduction(_minmax_op, _minmax_options, name="minmax", needs_items=True)


# argmin, argmax and minmax are operators (cufold.argmax(a, b) combines two
# (value, index) pairs) and reductions (cufold.argmax(x)): one object, both uses.
_argmin_op.device_reduction = _argmin
_argmax_op.device_reduction = _argmax
_minmax_op.device_reduction = _minmax
argmin, argmax, minmax = _argmin_op, _argmax_op, _minmax_op


def _moment_options(project, ddof, dtype, in_dtype):
    dt = np.dtype(dtype) if dtype is not None else _types.mean_dtype(in_dtype)
    acc = np.float64 if dt.itemsize > 4 or dt == np.float32 else np.float32
    if project == "mean":
        # a mean alone is (count, sum) under field-wise plus, divided once: two adds per
        # item, where Welford's state took four and a three-field merge (0.7x torch.mean)
        return {"lift": "count", "project": "count_mean", "acc": (acc, acc), "result": dt}
    result = (dt, dt) if project == "mean_var" else dt
    return {"lift": "welford", "project": project, "ddof": ddof, "acc": (acc, acc, acc), "result": result}


_moments_by = _launch.BoundedCache(256)


def _moments(x, project, ddof, out, stream, algorithm, dtype, name, axis, keepdims, deterministic=True,
             transform=None):
    key = (project, ddof, dtype)
    r = _moments_by.get(key)
    if r is None:
        r = _moments_by.put(key, _Reduction(
            plus if project == "mean" else welford, lambda dt: _moment_options(project, ddof, dtype, dt),
            name=name, needs_items=True))
    return r(x, None, None, out, stream, algorithm, deterministic, axis, keepdims, transform)


def mean(x, *, axis=None, keepdims=False, dtype=None, out=None, stream=None, algorithm=None, deterministic=True,
         transform=None):
    """Arithmetic mean (float64 for integer input, as ``numpy.mean``). Example: ``cufold.mean(x)``.

    Accumulation: float64 for float32 input, except along an outer axis (``axis=0`` of a
    C-contiguous matrix), where each thread folds a compensated (Kahan) float32 sum before
    the float64 combine: within ``2 * eps32 * mean(|x|)`` of the exact mean (NumPy's own
    float32 mean: ``log2(n) * eps32 * mean(|x|)``). ``dtype=np.float64`` accumulates in
    float64 throughout.

    ``deterministic="gpu_to_gpu"``: the binned sum (see :func:`sum`) divided by the count,
    the same bits on any GPU: ``cufold.mean(x, deterministic="gpu_to_gpu")``.
    """
    return _moments(x, "mean", 0, out, stream, algorithm, dtype, "mean", axis, keepdims, deterministic, transform)


def var(x, *, axis=None, keepdims=False, ddof=0, dtype=None, out=None, stream=None, algorithm=None,
        transform=None):
    """Variance in one pass (Welford/Chan), ``ddof`` as ``numpy.var``. Example: ``cufold.var(x, ddof=1)``."""
    return _moments(x, "var", ddof, out, stream, algorithm, dtype, "var", axis, keepdims, transform=transform)


def mean_var(x, *, axis=None, keepdims=False, ddof=0, dtype=None, out=None, stream=None, algorithm=None,
             transform=None):
    """``(mean, var)`` in one pass (as ``torch.var_mean``, in the other order).

    Example: ``m, v = cufold.mean_var(x)``
    """
    return _moments(x, "mean_var", ddof, out, stream, algorithm, dtype, "mean_var", axis, keepdims,
                    transform=transform)


from .fused import count_nonzero, dot, logsumexp, norm, vdot  # noqa: E402  (built on _Reduction)


def __getattr__(name):
    """``all`` and ``any`` (device/fused.py) are not bound in this module, whose code
    uses the builtins of those names."""
    if name in ("all", "any"):
        from . import fused
        return getattr(fused, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
