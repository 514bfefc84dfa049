"""Reductions along axes of N-D arrays, with NumPy's semantics.

The host collapses the array into ``kept`` and ``reduced`` index spaces
(merging adjacent axes whose strides chain, so most cases become one kept and
one reduced axis), then one of two kernels runs:

* ``columns``: a thread per output element folds its reduced items in order
  (column sums of a C array: neighbouring threads read neighbouring
  addresses, so every load is coalesced);
* ``rows``: a warp per output element (row sums: the warp reads a row's
  contiguous items together); lanes take strided items for commutative
  operators and contiguous chunks for the others, then a warp reduce.

Few outputs over a long reduced axis (``x.sum(axis=0)`` of a tall narrow
array) use the whole-array reduce once per output, so the GPU stays full.
"""

import functools

import numpy as np
from numba import cuda

from .. import warp
from ..host import arrays as _arrays
from . import reduce as _reduce_mod

#: Per-output whole-array reductions when there are at most this many outputs
#: and each reduces at least FEW_OUTPUTS_MIN_ITEMS items.
FEW_OUTPUTS = 16
FEW_OUTPUTS_MIN_ITEMS = 1 << 16


def normalize_axis(axis, ndim):
    """A sorted tuple of distinct non-negative axes, with NumPy's errors."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError("cufold: axis must be an integer or a tuple of integers, got %r" % (a,))
        if not -ndim <= a < ndim:
            raise np.exceptions.AxisError(int(a), ndim)
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError("cufold: duplicate value in 'axis'")
    return tuple(sorted(out))


def _collapse(shape, strides):
    """Merge neighbouring axes whose strides chain (outer = inner * inner_len)."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    merged = []
    for n, s in dims:
        if merged and merged[-1][1] == s * n:
            pn, _ = merged.pop()
            merged.append((pn * n, s))
        else:
            merged.append((n, s))
    if not merged:
        merged = [(1, 1)]
    return tuple(m[0] for m in merged), tuple(m[1] for m in merged)


@functools.lru_cache(maxsize=None)
def _unravel(nd):
    """Device function ``(i, shape, strides) -> element offset`` for ``nd`` axes."""
    if nd == 1:
        @cuda.jit(device=True)
        def unravel1(i, shape, strides):
            return i * strides[0]
        return unravel1

    @cuda.jit(device=True)
    def unravel(i, shape, strides):
        off = 0
        for d in range(nd - 1, -1, -1):
            n = shape[d]
            off += (i % n) * strides[d]
            i //= n
        return off
    return unravel


@functools.lru_cache(maxsize=None)
def axis_kernel(spec, kind, nd_keep, nd_red):
    """``kind`` is 'columns' or 'rows'. Arguments: (xs, origin, m_count, k_count,
    keep_shape, keep_strides, red_shape, red_strides, outs, init, has_init);
    ``origin`` is the offset of element (0, ..., 0) in ``xs``."""
    start, update, finish = _reduce_mod._protocol(spec)
    combine = spec.op.combine(spec.acc_vt)
    project = _reduce_mod._project(spec.project, spec.ddof, spec.out_vt)
    load, store = spec.in_vt.load, spec.out_vt.store
    keep_at, red_at = _unravel(nd_keep), _unravel(nd_red)
    ordered = spec.ordered

    if kind == "columns":
        def columns(xs, origin, m_count, k_count, keep_shape, keep_strides, red_shape, red_strides, outs, init,
                    has_init):
            m = cuda.grid(1)
            if m >= m_count:
                return
            base = origin + keep_at(m, keep_shape, keep_strides)
            state = start(load(xs, base), 0)
            for k in range(1, k_count):
                state = update(state, load(xs, base + red_at(k, red_shape, red_strides)), k)
            total = finish(state)
            if has_init:
                total = combine(init, total)
            store(outs, m, project(total))
        return columns

    warp_reduce = warp.partial_reduce(spec.op, spec.acc_vt)

    def rows(xs, origin, m_count, k_count, keep_shape, keep_strides, red_shape, red_strides, outs, init,
             has_init):
        lane = cuda.laneid
        warp_id = cuda.grid(1) // 32
        warps = cuda.gridsize(1) // 32
        chunk = (k_count + 31) // 32
        for m in range(warp_id, m_count, warps):  # uniform per warp: collectives see every lane
            base = origin + keep_at(m, keep_shape, keep_strides)
            state = start(load(xs, base), 0)
            have = False
            if ordered:  # contiguous chunks keep the lanes' operands in order
                lo = lane * chunk
                for k in range(lo, min(lo + chunk, k_count)):
                    x = load(xs, base + red_at(k, red_shape, red_strides))
                    state = update(state, x, k) if have else start(x, k)
                    have = True
                valid = (k_count + chunk - 1) // chunk
            else:
                for k in range(lane, k_count, 32):
                    x = load(xs, base + red_at(k, red_shape, red_strides))
                    state = update(state, x, k) if have else start(x, k)
                    have = True
                valid = min(k_count, 32)
            total = warp_reduce(finish(state), valid)
            if lane == 0:
                if has_init:
                    total = combine(init, total)
                store(outs, m, project(total))
    return rows


def plan_axes(b, arrs, given, is_tuple, axes, keepdims, prep, init, algorithm, lift, project, ddof,
              needs_items, name):
    """Add the reduction of ``arrs`` (placeholders of equally shaped arrays) over
    ``axes`` to Program builder ``b``; ``given``: the placeholders of ``out=``, or
    empty (then the results are new arrays: outputs of the Program, in order)."""
    like = arrs[0]
    shape = like.shape
    for a in arrs[1:]:
        if a.shape != shape:
            raise ValueError("cufold: the arrays of a tuple value must have one shape; got %s and %s"
                             % (shape, a.shape))
    keep = [d for d in range(like.ndim) if d not in axes]
    out_shape = tuple(1 if d in axes else shape[d] for d in range(like.ndim)) if keepdims \
        else tuple(shape[d] for d in keep)
    m_count = int(np.prod([shape[d] for d in keep], dtype=np.int64))
    k_count = int(np.prod([shape[d] for d in axes], dtype=np.int64))
    out_vt = prep.out_vt
    outs = _result_arrays(b, like, out_vt, out_shape, m_count, given)
    if m_count == 0:
        return
    if k_count == 0:
        value = init if init is not None else prep.op.identity_for(prep.acc_vt)
        if needs_items or value is None:
            raise ValueError("cufold: zero-size array to reduction operation %s which has no identity" % name)
        b.launch(_fill_many(out_vt), ("fill_many", out_vt), -(-m_count // 256), 256,
                 (outs, m_count, out_vt.make(value)))
        return
    # Element offsets from the lowest address, so every index is non-negative.
    lowest = sum(s * (n - 1) for n, s in zip(shape, like.strides) if s < 0)
    extent = sum(abs(s) * (n - 1) for n, s in zip(shape, like.strides)) + 1
    flat = tuple(_flat(a, lowest, extent) for a in arrs)
    xs = flat if is_tuple else flat[0]
    keep_shape, keep_strides = _collapse([shape[d] for d in keep], [like.strides[d] for d in keep])
    red_shape, red_strides = _collapse([shape[d] for d in axes], [like.strides[d] for d in axes])
    keep_strides = tuple(int(s) for s in keep_strides)
    red_strides = tuple(int(s) for s in red_strides)
    base_shift = -lowest
    op = prep.op
    tile = _reduce_mod.tile_for(prep.in_vt, prep.acc_vt)
    spec = _reduce_mod.Spec(op, prep.in_vt, prep.acc_vt, out_vt, lift, project, ddof, tile, "final", "warp",
                            not op.commutative)
    has_init = init is not None
    init_value = prep.acc_vt.make(init) if has_init else _reduce_mod._zero(prep.acc_vt)
    few = m_count <= FEW_OUTPUTS and k_count >= FEW_OUTPUTS_MIN_ITEMS and len(red_shape) == 1
    if few:
        _few_outputs(b, arrs, is_tuple, outs, keep_shape, keep_strides, red_shape[0], red_strides[0], prep, init,
                     algorithm, lift, project, ddof, m_count)
        return
    kind = "columns" if (m_count >= 4096 or k_count <= 32) else "rows"
    kernel = axis_kernel(spec, kind, len(keep_shape), len(red_shape))
    keep_arg = tuple(np.int64(v) for v in keep_shape)
    args = (xs, np.int64(base_shift), np.int64(m_count), np.int64(k_count), keep_arg,
            tuple(np.int64(v) for v in keep_strides), tuple(np.int64(v) for v in red_shape),
            tuple(np.int64(v) for v in red_strides), outs, init_value, has_init)
    threads = m_count if kind == "columns" else m_count * 32
    nt = 256
    grid = max(1, min(-(-threads // nt), 65535 * 4))
    b.launch(kernel, ("axis", spec, kind, len(keep_shape), len(red_shape)), grid, nt, args)


def _flat(a, lowest, extent):
    """A 1-D contiguous descriptor over the array's whole extent, starting at
    its lowest-addressed element."""
    return _arrays.window(a, lowest, (extent,), (1,))


def _result_arrays(b, like, out_vt, out_shape, m_count, given):
    """The results' flat views: of new output arrays, or of ``out=``'s placeholders (checked)."""
    vecs = []
    if not given:
        for f in out_vt.fields:
            vecs.append(_arrays.window(b.output(like, out_shape, f), 0, (m_count,), (1,)))
    else:
        if len(given) != out_vt.arity:
            raise ValueError("cufold: out= needs %d array(s) for a result of type %s" % (out_vt.arity, out_vt))
        for a, f in zip(given, out_vt.fields):
            if a.shape != out_shape:
                raise ValueError("cufold: out= has shape %s, the result has shape %s" % (a.shape, out_shape))
            if a.dtype != f:
                raise TypeError("cufold: out= has dtype %s, the result is %s" % (a.dtype, f))
            if not a.c_contiguous:
                raise ValueError("cufold: out= must be C-contiguous")
            vecs.append(_arrays.window(a, 0, (m_count,), (1,)))
    return tuple(vecs) if out_vt.is_tuple else vecs[0]


def _few_outputs(b, arrs, is_tuple, outs, keep_shape, keep_strides, k_count, k_stride, prep, init,
                 algorithm, lift, project, ddof, m_count):
    """One whole-array reduction per output (few outputs, long reduced axis)."""
    unravel = np.unravel_index
    out_fields = outs if prep.out_vt.is_tuple else (outs,)
    for m in range(m_count):
        idx = unravel(m, keep_shape) if keep_shape else ()
        off = int(sum(int(i) * s for i, s in zip(idx, keep_strides)))
        row = tuple(_arrays.window(a, off, (k_count,), (k_stride,)) for a in arrs)
        xs = row if is_tuple else row[0]
        dst = tuple(_arrays.window(o, m, (1,), (1,)) for o in out_fields)
        p = _reduce_mod.plan(prep.op, prep.in_vt, prep.acc_vt, prep.out_vt, k_count, b.device_id,
                             algorithm, lift=lift, project=project, ddof=ddof)
        _reduce_mod.run(b, p, xs, k_count, dst if prep.out_vt.is_tuple else dst[0], init)


@functools.lru_cache(maxsize=None)
def _fill_many(out_vt):
    store, cast = out_vt.store, out_vt.cast

    def fill_many(outs, m, value):
        i = cuda.grid(1)
        if i < m:
            store(outs, i, cast(value))

    return fill_many
