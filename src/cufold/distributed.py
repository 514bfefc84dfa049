"""Reductions across GPUs: any cufold operator over the ranks of a ``torch.distributed`` group.

NCCL's collectives reduce plain numbers with sum, product, min and max. This module reduces
with any cufold operator, tuple values included (an argmax with its index, Welford's
``(count, mean, M2)``, a user's :class:`cufold.Op`), between the GPUs of a NCCL group, or
between CPU processes of a gloo group under Numba's simulator (how the tests run without a
GPU). One process per GPU, as ``torch.distributed`` is used; arrays are torch tensors (or any
array that ``torch.from_dlpack`` takes without a copy), equally shaped on every rank.

=====================================  ==========================================================
call                                   what every rank gets
=====================================  ==========================================================
``all_reduce(x, op)``                  ``x`` elementwise ``op``-folded over the ranks, in rank
                                       order (in place, or into ``out=``)
``reduce(x, op, axis=...)``            the reduction of the whole array that the ranks' ``x``
``sum``, ``prod``, ``min``, ``max``,   are shards of (concatenated along axis 0, in rank order):
``argmin``, ``argmax``, ``mean``,      a local cufold reduction, then an ``all_reduce`` of the
``var``, ``mean_var``                  partial results; argmin/argmax give global indices
``reduce_by_key_into(k, v, out, op)``  ``out[k[i]] op= v[i]`` over every rank's pairs: a
                                       replicated table, or (``shard=True``) one split by key
                                       range over the ranks
=====================================  ==========================================================

**How ``all_reduce`` runs** (``algorithm=``):

- ``"nccl"``: the operators the backend has (``plus``, ``multiplies``; ``minimum`` and
  ``maximum`` of integers, since the backends do not promise NumPy's NaN propagation),
  field by field for tuples, go straight to ``torch.distributed.all_reduce``;
- ``"gather"``: every rank's ``x`` is gathered (``all_gather_into_tensor``) and folded along
  the rank axis by ``cufold.reduce(axis=0)``: each rank sends ``x``'s bytes and receives
  ``W - 1`` times them, and folds ``W`` values an item (small arrays);
- ``"scatter"``: a reduce-scatter built of ``all_to_all`` (rank ``r`` receives everyone's
  ``r``-th chunk), the fold of that chunk, then an ``all_gather`` of the folded chunks: each
  rank sends and receives ``2 (W - 1) / W`` of ``x``'s bytes, as a ring all-reduce, and folds
  ``1 / W`` of it (large arrays). Folds are in rank order, so a non-commutative operator
  combines rank 0's value first;
- ``"sums"``: Welford states (``cufold.welford`` on floating fields) merged by two backend
  sums, ``(count, count * mean)`` and then ``M2 + count * (mean - merged mean)^2``: the bytes
  of one NCCL all-reduce of the states, plus elementwise passes.

- ``"p2p"``: every rank's GPU maps every other's staging buffers (CUDA IPC, one host;
  :mod:`cufold.host.peers`). Each rank copies ``x`` into every other rank's staging (copy
  engines over NVLink; up to :data:`P2P_PUSH_MAX_BYTES`, a kernel), the ranks wait for one
  another (flags that a kernel sets in the other ranks' memory and polls in its own: no host
  wait, no torch collective), and one kernel folds the ``W`` values of each item in rank order
  from local memory: a custom-operator all-reduce in about the time of NCCL's own. A barrier
  that waits over a minute gives up and marks the call; the next ``check=True`` call raises
  on every rank. Each
  rank sends ``W - 1`` times ``x`` (a ring: ``2 (W - 1) / W`` times); operands above
  :data:`P2P_SLOT_MAX_BYTES` go a slot at a time. Not inside CUDA-graph capture (the slots
  take turns call by call): there the default takes the next algorithm.

``algorithm=None`` takes ``"nccl"`` where it applies; else ``"p2p"`` in groups of
:data:`P2P_DEFAULT_WORLD` ranks whose memory is mapped; else ``"sums"`` for Welford states,
``"gather"`` below :data:`SCATTER_MIN_ITEMS` items and ``"scatter"`` from there. (At two
ranks ``"gather"`` sends the bytes of a ring all-reduce in one step, but NCCL's all-gather of
192 MiB took 820-831 us on 2 x H200 where its all-reduce took 718-761: it stays the choice
for small arrays only.) A small tuple gathers in one collective (its fields packed in one
buffer); from :data:`PACK_MAX_BYTES` on, field by field (no copies in and out of a pack).

**Checks and synchronisation.** With ``check=True`` (the default) the ranks first exchange a
short description of their call (function, operator, shapes, dtypes, and for keys their range)
and every rank raises the same clear ``ValueError`` if any rank's differs or failed locally, where
a collective of mismatched sizes would hang or corrupt memory. That exchange reads the
description back to the host: **it synchronises the host** once per call. ``check=False`` skips
it: no synchronisation (loops, CUDA graphs), and the caller answers for equal shapes.
``"p2p"`` synchronises once more where it first maps a group's staging, or grows it for a
larger operand than before (the ranks exchange the buffers' handles), never afterwards.
``reduce_by_key_into(shard=True)`` always synchronises once more, for the sizes of the pairs it
sends each rank.

**Reproducible sums.** ``sum``/``mean`` with ``deterministic="gpu_to_gpu"`` combine each rank's
binned state (:mod:`cufold.device.reproducible`): the same bits for 1, 2 or N ranks and any
sharding, and the same as ``cufold.sum`` of the whole array on one GPU.

Example (one process per GPU, ``torchrun --nproc-per-node 2 script.py``)::

    import torch, torch.distributed as dist, cufold
    import cufold.distributed as cd
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank())
    x = torch.randn(1 << 20, device="cuda")
    i = cd.argmax(x)                                 # the index in the concatenated array
    m, v = cd.mean_var(x)                            # one pass, Welford states merged
    count, mean, m2 = (torch.zeros(64, dtype=torch.float64, device="cuda") for _ in range(3))
    cd.reduce_by_key_into(keys, x, (count, mean, m2), cufold.welford)   # by key, over all ranks
"""

import builtins as _builtins
import contextlib
import functools
import zlib

import numba
import numpy as np
from numba import config, cuda

from . import device as _device
from .ops import argmax as _argmax_op, argmin as _argmin_op, as_op, maximum, minimum, multiplies, plus, welford
from .values import ValueType
from . import _codegen
from .host import arrays as _arrays, launch as _launch, peers as _peers, programs as _programs, readback as _readback
from .device import reproducible as _reproducible

__all__ = ["all_reduce", "reduce", "sum", "prod", "min", "max", "argmin", "argmax", "mean", "var",
           "mean_var", "reduce_by_key_into", "SCATTER_MIN_ITEMS", "PACK_MAX_BYTES", "P2P_DEFAULT_WORLD",
           "P2P_SLOT_MAX_BYTES", "P2P_PUSH_MAX_BYTES"]

SIMULATOR = bool(config.ENABLE_CUDASIM)

#: ``all_reduce(algorithm=None)`` of a non-native operator folds scattered chunks from this
#: many items on (fewer: gathered whole, one collective instead of two).
SCATTER_MIN_ITEMS = 1 << 16
#: A tuple's fields gather packed in one buffer (one collective) up to this many bytes a
#: rank; larger ones gather field by field, sparing the pack's copies.
PACK_MAX_BYTES = 1 << 20


def _torch():
    global _TORCH
    if _TORCH is None:
        import torch
        import torch.distributed as dist
        _TORCH = (torch, dist)
    return _TORCH


_TORCH = None                                  # (torch, torch.distributed), imported on first use


def _all_gather(output, input, group):
    """Every rank's ``input`` into flat ``output``, in rank order (``all_gather_single`` where
    torch has it; ``all_gather_into_tensor``, its older name, elsewhere)."""
    _, dist = _torch()
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, input, group=group)


# --- tensors ------------------------------------------------------------------------------------

def _tensor(x, name):
    """``x`` as a torch tensor sharing its memory (torch tensors as they are; other CUDA
    arrays through DLPack; simulator arrays through their host memory)."""
    torch, _ = _torch()
    if x.__class__ is torch.Tensor and x.is_cuda:      # the common case first: a call's host time
        return x
    if isinstance(x, torch.Tensor):
        if not (x.is_cuda or SIMULATOR):
            raise TypeError(_arrays.HOST_MESSAGE.format(name=name, kind="CPU torch.Tensor"))
        return x
    if SIMULATOR and hasattr(x, "_ary"):
        return torch.from_numpy(x._ary)
    if isinstance(x, (np.ndarray, np.generic)):
        raise TypeError(_arrays.HOST_MESSAGE.format(name=name, kind="NumPy"))
    if hasattr(x, "__dlpack__"):
        return torch.from_dlpack(x)
    raise TypeError("cufold: %s must be a torch tensor (or a CUDA array torch.from_dlpack takes); got %s"
                    % (name, type(x).__name__))


def _fields(x, name):
    """``(tensors, is_tuple)``: a tuple value's fields, or the one array."""
    if isinstance(x, tuple):
        if not x:
            raise ValueError("cufold: %s is an empty tuple" % name)
        torch, _ = _torch()
        if all(f.__class__ is torch.Tensor and f.is_cuda for f in x):     # a call's host time
            return x, True
        return tuple(_tensor(f, "%s[%d]" % (name, i)) for i, f in enumerate(x)), True
    return (_tensor(x, name),), False


def _dev(t):
    """The array cufold computes on for tensor ``t``: ``t`` itself on a GPU; under the
    simulator (CPU tensors of a gloo group) a simulator array over the same memory."""
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        return FakeCUDAArray(t.numpy())
    return t


def _devs(ts):
    return tuple(_dev(t) for t in ts)


def _back(a):
    """A cufold result as a torch tensor (the inverse of :func:`_dev`; tuples too)."""
    if isinstance(a, tuple):
        return tuple(_back(f) for f in a)
    if SIMULATOR:
        torch, _ = _torch()
        return torch.from_numpy(np.asarray(a._ary))
    return a


def _np_dtype(t):
    dt = _NP_DTYPES.get(t.dtype)
    if dt is None:
        dt = _NP_DTYPES[t.dtype] = np.dtype(str(t.dtype).rsplit(".", 1)[-1])
    return dt


_NP_DTYPES = {}                                  # torch dtype -> NumPy dtype (a call's host time)


def _value_type(ts):
    key = tuple(t.dtype for t in ts)
    vt = _VALUE_TYPES.get(key)
    if vt is None:
        dts = tuple(_np_dtype(t) for t in ts)
        vt = _VALUE_TYPES[key] = ValueType.of(dts if len(dts) > 1 else dts[0])
    return vt


_VALUE_TYPES = {}


def _group_info(group):
    """``(world size, this rank)`` of ``group`` (None: the default group), asked of torch once
    per group object (two torch calls cost a small all-reduce ~20 us of host time)."""
    _, dist = _torch()
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("cufold: torch.distributed is not initialised (dist.init_process_group first)")
    key = group if group is not None else dist.group.WORLD
    info = _GROUPS.get(key)
    if info is None:
        info = _GROUPS.put(key, (dist.get_world_size(group), dist.get_rank(group)))
    return info


_GROUPS = _launch.BoundedCache(64)          # process group -> (world size, rank)


def _read(t):
    """``t`` on the host, through cufold's one read-back: **synchronises the host**."""
    a = _arrays.describe(_dev(t), "t")
    return _readback.read_to_host(a, _arrays.stream_handle(a))


# --- the agreement check --------------------------------------------------------------------------

_DTYPE_CHARS = "?bBhHiIlLqQefdgFD"
_SLOTS = 32
_COMMON = 24                                     # slots that must agree on every rank
_FN, _OP, _NFIELDS, _NDIM, _SHAPE, _DTYPES, _EXTRA = 0, 1, 2, 3, 4, 12, 20
_ERROR, _LEN, _ROWS, _KMIN, _KMAX, _P2P_FAILED = 24, 25, 26, 27, 28, 29
_MAX_DIMS = 8


def _crc(s):
    return zlib.crc32(s.encode()) & 0x7FFFFFFF


def _code(dt):
    return _DTYPE_CHARS.index(dt.char) + 1 if dt.char in _DTYPE_CHARS else 99


def _decode(code):
    return "?" if not 1 <= code <= len(_DTYPE_CHARS) else np.dtype(_DTYPE_CHARS[code - 1]).name


class _Call:
    """What a rank says of its call, to be compared with every other rank's."""

    def __init__(self, fn, op, fields, sharded, extra=()):
        self.fn, self.sharded = fn, sharded
        t0 = fields[0]
        if t0.dim() > _MAX_DIMS:
            raise ValueError("cufold: distributed.%s takes at most %d dimensions" % (fn, _MAX_DIMS))
        shape = list(t0.shape)
        v = [0] * _SLOTS
        v[_FN], v[_OP], v[_NFIELDS], v[_NDIM] = _crc(fn), _crc(getattr(op, "name", "op")), len(fields), t0.dim()
        for i in range(_MAX_DIMS):
            v[_SHAPE + i] = -1 if i >= len(shape) or (sharded and i == 0) else shape[i]
        for i, f in enumerate(fields[:_MAX_DIMS]):
            v[_DTYPES + i] = _code(_np_dtype(f))
        for i, e in enumerate(extra[:4]):
            v[_EXTRA + i] = int(e)
        v[_LEN] = shape[0] if shape else 1
        self.vector = v
        self.error = None
        self.device_slots = {}                   # slot -> 0-d device tensor (key range)

    def fail(self, exc):
        self.error = exc
        self.vector[_ERROR] = 1


@contextlib.contextmanager
def _local_errors(call):
    """A rank's errors in its own arguments: raised at once where no exchange follows (``call``
    None: nothing for the other ranks to wait on), else held for :func:`_agree`, which raises
    on every rank."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        if call is None:
            raise
        call.fail(exc)


def _agree(call, group, device):
    """Exchange ``call``'s description; raise the same error on every rank where any rank's
    differs or failed. Returns the (W, _SLOTS) table of every rank's description.
    **Synchronises the host** (one read-back)."""
    torch, dist = _torch()
    v = torch.tensor(call.vector, dtype=torch.int64).to(device, non_blocking=True)
    staging = _peers.existing(group, device)
    if staging is not None:                 # a p2p barrier that gave up, reported on every rank
        call.device_slots[_P2P_FAILED] = staging.failed()
    for slot, value in call.device_slots.items():
        v[slot] = value
    w, rank = _group_info(group)
    table = torch.empty(w * _SLOTS, dtype=torch.int64, device=device)
    _all_gather(table, v, group)
    rows = _read(table).reshape(w, _SLOTS)
    if call.error is not None:
        raise call.error
    gave_up = [r for r in range(w) if rows[r, _P2P_FAILED]]
    if gave_up:
        raise RuntimeError("cufold: a p2p all-reduce on rank %s waited over a minute for another rank and "
                           "gave up: its results, and those of the calls after it, are wrong "
                           "(cufold.host.peers.release() starts afresh)" % ", ".join(map(str, gave_up)))
    bad = [r for r in range(w) if rows[r, _ERROR]]
    if bad:
        raise ValueError("cufold: distributed.%s failed on rank %s (its own error says why); no rank ran it"
                         % (call.fn, ", ".join(map(str, bad))))
    for r in range(w):
        if (rows[r, :_COMMON] != rows[0, :_COMMON]).any():
            raise ValueError("cufold: distributed.%s: ranks 0 and %d disagree: %s" % (call.fn, r, _difference(
                rows[0], rows[r], call.sharded)))
    return rows


def _difference(a, b, sharded):
    def shape(v):
        dims = ["n" if (sharded and i == 0) else str(v[_SHAPE + i]) for i in range(v[_NDIM])]
        return "(%s)" % (dims[0] + "," if len(dims) == 1 else ", ".join(dims))
    if a[_FN] != b[_FN]:
        return "they called different functions"
    if a[_OP] != b[_OP]:
        return "different operators"
    if a[_NFIELDS] != b[_NFIELDS]:
        return "%d fields against %d" % (a[_NFIELDS], b[_NFIELDS])
    if a[_NDIM] != b[_NDIM] or (a[_SHAPE:_DTYPES] != b[_SHAPE:_DTYPES]).any():
        return "shape %s against %s%s" % (shape(a), shape(b), " (n: each rank's own shard length)" if sharded
                                          else "")
    if (a[_DTYPES:_EXTRA] != b[_DTYPES:_EXTRA]).any():
        def names(v):
            return ", ".join(_decode(c) for c in v[_DTYPES:_DTYPES + v[_NFIELDS]])
        return "dtypes (%s) against (%s)" % (names(a), names(b))
    return "options %s against %s" % (list(a[_EXTRA:_COMMON]), list(b[_EXTRA:_COMMON]))


def _shard_offset(n_local, rows, group, device):
    """Items held by earlier ranks (where this rank's shard starts along axis 0): a host int
    from the agreement table, or a 0-d device tensor from a gather of lengths (no wait)."""
    torch, dist = _torch()
    w, rank = _group_info(group)
    if rows is not None:
        return int(rows[:rank, _LEN].sum())
    lens = torch.empty(w, dtype=torch.int64, device=device)
    _all_gather(lens, torch.full((1,), n_local, dtype=torch.int64, device=device), group)
    return lens[:rank].sum()


# --- all_reduce -------------------------------------------------------------------------------------

def _native(op, ts):
    """The ``ReduceOp`` that does ``op`` on ``ts`` field by field, or None."""
    _, dist = _torch()
    if op is plus:
        return dist.ReduceOp.SUM
    if op is multiplies:
        return dist.ReduceOp.PRODUCT
    if op in (minimum, maximum) and all(_np_dtype(t).kind in "iub" for t in ts):
        return dist.ReduceOp.MIN if op is minimum else dist.ReduceOp.MAX
    return None


ALGORITHMS = ("nccl", "gather", "scatter", "sums", "p2p")


def all_reduce(x, op=plus, *, out=None, group=None, algorithm=None, check=True):
    """Elementwise reduction of ``x`` over the ranks of ``group``: every rank gets
    ``x_0 op x_1 op ... op x_{W-1}`` (rank order), in place into ``x`` (as
    ``torch.distributed.all_reduce``) or into ``out``.

    Parameters
    ----------
    x : torch tensor (contiguous, the same shape and dtype on every rank), or a tuple of
        them (tuple values: one tensor per field of the operator's value).
    op : any cufold operator or function ``(a, b) -> c`` (associative; a non-commutative one
        combines in rank order).
    out : tensor(s) like ``x`` to write into instead of ``x``.
    group : the ``torch.distributed`` process group (default: the world).
    algorithm : ``"nccl"``, ``"gather"``, ``"scatter"``, ``"sums"``, ``"p2p"`` or None (see the
        module doc; ``"p2p"`` raises ValueError on every rank where the ranks cannot map
        each other's memory).
    check : exchange and compare the ranks' shapes, dtypes and operators first (a clear
        error on every rank instead of a hang); **synchronises the host** once. False: no wait.

    Returns ``out`` (or ``x``).

    Example::

        >>> t = (count, mean, m2)                        # per-rank Welford states, float64
        >>> cufold.distributed.all_reduce(t, cufold.welford)     # merged over the ranks
    """
    op = as_op(op)
    ts, is_tuple = _fields(x, "x")
    outs = ts if out is None else _fields(out, "out")[0]
    call = _Call("all_reduce", op, ts, sharded=False, extra=(ALGORITHMS.index(algorithm) + 1
                                                              if algorithm in ALGORITHMS else 0,)) if check else None
    with _local_errors(call):
        _check_fields(ts, "x")
        if outs is not ts and (len(outs) != len(ts) or
                               any(o.shape != t.shape or o.dtype != t.dtype for o, t in zip(outs, ts))):
            raise ValueError("cufold: out must match x field by field (shape and dtype)")
        if not all(t.is_contiguous() for t in ts) or (outs is not ts and not all(o.is_contiguous() for o in outs)):
            raise ValueError("cufold: distributed.all_reduce takes contiguous tensors (x.contiguous())")
        if algorithm is not None and algorithm not in ALGORITHMS:
            raise ValueError("cufold: algorithm must be one of %s or None; got %r" % (ALGORITHMS, algorithm))
        op.check(_value_type(ts))
        if algorithm == "nccl" and _native(op, ts) is None:
            raise ValueError("cufold: operator %s is not one the backend reduces; use 'gather' or 'scatter'"
                             % op.name)
        if algorithm == "sums" and not _welford_sums_apply(op, ts):
            raise ValueError("cufold: algorithm 'sums' merges Welford states (cufold.welford) of floating "
                             "fields of one dtype")
    if check:
        _agree(call, group, ts[0].device)
    _all_reduce(ts, op, outs, group, algorithm)
    return (outs if is_tuple else outs[0]) if out is not None else x


def _check_fields(ts, name):
    if len(ts) == 1:
        return
    shape = ts[0].shape
    if any(t.shape != shape for t in ts):
        raise ValueError("cufold: %s's fields differ in shape: %s" % (name, [tuple(t.shape) for t in ts]))
    dev = ts[0].device
    if any(t.device != dev for t in ts):
        raise ValueError("cufold: %s's fields are on different devices" % name)


def _all_reduce(ts, op, outs, group, algorithm=None):
    """The exchange and fold of :func:`all_reduce` (arguments checked)."""
    torch, dist = _torch()
    w, rank = _group_info(group)
    native = _native(op, ts)
    n = ts[0].numel()
    staging = None
    if w > 1 and n and (algorithm == "p2p" or (algorithm is None and native is None and w == P2P_DEFAULT_WORLD)) \
            and not _capturing(algorithm):
        itemsizes = tuple(t.element_size() for t in ts)
        step, slot_bytes = _p2p_sizes(n, itemsizes, w)
        staging = _peers.staging(group, ts[0].device, slot_bytes)
        if staging is None and algorithm == "p2p":
            raise ValueError("cufold: algorithm 'p2p' needs every rank's memory mapped by every other "
                             "(one host, CUDA IPC between the GPUs); use 'gather' or 'scatter'")
        if staging is not None:
            algorithm = "p2p"
    if algorithm is None:
        algorithm = ("nccl" if native is not None else "sums" if _welford_sums_apply(op, ts) else
                     "scatter" if n >= SCATTER_MIN_ITEMS and w > 1 else "gather")
    if algorithm == "nccl":
        for t, o in zip(ts, outs):
            if o is not t:
                o.copy_(t)
            dist.all_reduce(o, op=native, group=group)
        return
    if w == 1 or n == 0:
        for t, o in zip(ts, outs):
            if o is not t:
                o.copy_(t)
        return
    flat_in = [t if t.dim() == 1 else t.reshape(-1) for t in ts]
    flat_out = flat_in if outs is ts else [o if o.dim() == 1 else o.reshape(-1) for o in outs]
    if algorithm == "p2p":
        _p2p(flat_in, op, flat_out, staging, step, itemsizes)
        return
    dtypes = tuple(_np_dtype(t) for t in ts)
    if algorithm == "gather":
        _fold(_gather_fields(flat_in, group), op, dtypes, flat_out)
        return
    if algorithm == "sums":
        _welford_sums(flat_in, flat_out, group)
        return
    # scatter: rank r folds everyone's r-th chunk, then the folded chunks are gathered
    chunk = -(-n // w)
    sizes = [_builtins.max(0, _builtins.min(chunk, n - j * chunk)) for j in range(w)]
    mine = sizes[rank]
    stacks = []
    for f in flat_in:
        s = torch.empty((w, mine), dtype=f.dtype, device=f.device)
        dist.all_to_all_single(s.reshape(-1), f, output_split_sizes=[mine] * w, input_split_sizes=sizes,
                               group=group)
        stacks.append(s)
    even = n == chunk * w
    gathered = flat_out if even else [torch.empty(chunk * w, dtype=f.dtype, device=f.device) for f in flat_in]
    _fold(stacks, op, dtypes, [g[rank * chunk: rank * chunk + mine] for g in gathered])
    for g, o in zip(gathered, flat_out):
        _all_gather(g, g[rank * chunk: (rank + 1) * chunk], group)
        if not even:
            o.copy_(g[:n])


# --- p2p: every rank's operand copied into the others' mapped memory, folded there -----------------

#: ``all_reduce(algorithm=None)`` of an operator the backend lacks takes ``"p2p"`` in groups of
#: this many ranks, where they can map each other's memory. (A one-shot fold reads ``W - 1``
#: times the operand a rank, where a ring moves ``2 (W - 1) / W`` times it: at two ranks the
#: same bytes. Larger groups keep gather/scatter until measured.)
P2P_DEFAULT_WORLD = 2
#: A staging slot's most bytes: larger operands go a slot at a time (each rank holds
#: ``peers.SLOTS`` slots of up to this size a group, for as long as the process runs).
P2P_SLOT_MAX_BYTES = 256 << 20


def _capturing(algorithm):
    """Whether the current stream is being captured into a CUDA graph, where ``"p2p"`` cannot
    go: its slots take turns call by call, and a graph replays one call's turn (raises for an
    explicit ``"p2p"``; the default then takes another algorithm, every rank alike)."""
    if SIMULATOR:
        return False
    torch, _ = _torch()
    if not torch.cuda.is_current_stream_capturing():
        return False
    if algorithm == "p2p":
        raise ValueError("cufold: algorithm 'p2p' cannot be captured into a CUDA graph (its staging slots "
                         "take turns call by call); use 'gather' or 'scatter' there, or the default")
    return True


@functools.lru_cache(maxsize=256)
def _slot_layout(itemsizes, n):
    """Byte offsets of fields of ``itemsizes`` bytes an item (n items each) in a staging slot,
    and the slot's bytes."""
    offsets, size = [], 0
    for itemsize in itemsizes:
        offsets.append(size)
        size += -(-n * itemsize // _peers.ALIGN) * _peers.ALIGN
    return tuple(offsets), size


def _p2p_sizes(n_items, itemsizes, world):
    """``(step, bytes)``: the items of fields of ``itemsizes`` bytes an item that a staging slot
    takes at once from each of ``world - 1`` other ranks (at most :data:`P2P_SLOT_MAX_BYTES`
    in all), and the slot's bytes for them."""
    return _chunk_sizes(n_items, itemsizes, world, P2P_SLOT_MAX_BYTES)


@functools.lru_cache(maxsize=256)
def _chunk_sizes(n_items, itemsizes, world, slot_max):
    per_item = (world - 1) * _builtins.sum(itemsizes)
    aligned = (slot_max // per_item // 16 - 1) * 16     # chunks start 16 items apart
    step = _builtins.max(1, _builtins.min(n_items, aligned))
    return step, (world - 1) * _slot_layout(itemsizes, step)[1]


def _p2p(flat, op, outs, staging, step, itemsizes):
    """``outs`` = the rank-order fold of every rank's ``flat``, ``step`` items (a staging
    slot, :func:`_p2p_sizes`) at a time (see :func:`_p2p_fold`)."""
    n = flat[0].numel()
    if step >= n:
        _p2p_fold(flat, op, outs, staging, itemsizes)
        return
    for start in range(0, n, step):
        stop = _builtins.min(n, start + step)
        _p2p_fold([f[start:stop] for f in flat], op, [o[start:stop] for o in outs], staging, itemsizes)


def _p2p_fold(flat, op, outs, staging, itemsizes):
    """One chunk of :func:`_p2p`: this rank's ``flat`` goes into every other rank's slot (its
    section of it: one per other rank), every rank waits for every other (a barrier kernel on
    the stream), then one kernel folds this rank's ``flat`` and the sections its own slot
    received, in rank order, all in local memory.

    Up to :data:`P2P_PUSH_MAX_BYTES` one kernel of one block writes the operand into the
    other ranks' memory and meets them (a small call's time is launches and host time: one
    Program of two launches); above it, ``copy_`` into the mapped memory sends it (a copy
    engine over NVLink, which moves another GPU's bytes faster than a kernel does: 2 x H200,
    192 MiB, 553 us where a kernel's loads take 677-719: ``tools/p2p_probe.py``), then the
    barrier kernel and the fold."""
    n = flat[0].numel()
    mine = _describe(_devs(flat))
    in_place = outs is flat
    targets = mine if in_place else _describe(_devs(outs))      # in place: described once
    stream = _arrays.stream_handle(mine[0])
    staging.follow(stream)
    slot = staging.next_slot()
    offsets, section = _slot_layout(itemsizes, n)
    if section <= P2P_PUSH_MAX_BYTES:
        # The slot's arrays are constants of this Program (a Program per slot and layout): a
        # call passes only its own arrays.
        sig = _programs.signature
        key = (op, staging, slot, in_place, stream) + tuple(sig(a) for a in mine) + \
            (() if in_place else tuple(sig(a) for a in targets))
        _P2P_SMALL.run(key, *(mine if in_place else mine + targets), np.int64(staging.next_epoch()),
                       np.int64(_peers.BARRIER_POLLS))
        return
    me, world = staging.rank, staging.world
    received = _received(staging, slot, mine, offsets, section)
    for r in range(world):
        if r != me:
            base = _section(me, r) * section
            for f, off in zip(flat, offsets):
                staging.tensor(slot, r, base + off, f.dtype, n).copy_(f)
    staging.barrier(stream)
    _fold_ranks(op, world, received, targets, stream)


def _fold_ranks(op, world, sources, targets, stream):
    """``targets`` (Arrs of the result's fields) = the rank-order fold of ``sources`` (every
    rank's field Arrs, rank major), on raw stream ``stream``: the rank fold's Program."""
    arrays = tuple(sources) + tuple(targets)
    key = (op, world, len(targets)) + tuple(_programs.signature(a) for a in arrays) + (stream,)
    _RANKS_FOLD.run(key, *arrays)


#: Operands of at most this many bytes (a rank's slot section) go to the other ranks by one
#: kernel of one block that also meets them (no copy-engine copies, no separate barrier).
P2P_PUSH_MAX_BYTES = 64 << 10
_PUSH_THREADS = 32 if SIMULATOR else 256


@functools.lru_cache(maxsize=None)
def _push_kernel(fields, others):
    """Kernel ``(srcs, dests, flags, me, epoch, polls, n)`` of one block: every field of
    ``srcs`` (this rank's operand, ``fields`` arrays) written into ``dests`` (each other rank's
    section of this call's slot, rank-major: ``others`` x ``fields`` arrays, mapped here), then
    the barrier (:func:`cufold.host.peers.arrive_and_wait`)."""
    nt = _PUSH_THREADS
    lines = ["def push(srcs, dests, flags, me, epoch, polls, n):",
             "    i = cuda.threadIdx.x",
             "    while i < n:"]
    lines += ["        v%d = srcs[%d][i]" % (f, f) for f in range(fields)]
    lines += ["        dests[%d][i] = v%d" % (j * fields + f, f) for j in range(others) for f in range(fields)]
    lines += ["        i += %d" % nt,
              "    cuda.threadfence_system()     # this thread's stores land before any flag does",
              "    cuda.syncthreads()",
              "    arrive(flags, me, epoch, polls)"]
    return _codegen.build("\n".join(lines) + "\n", "push", {"arrive": _peers.arrive_and_wait}, device=False)


def _received(staging, slot, mine, offsets, section):
    """Every rank's operand for this rank's fold, rank major: its own ``mine``, the others'
    sections of its ``slot``."""
    me, n, received = staging.rank, mine[0].size, []
    for r in range(staging.world):
        received.extend(mine if r == me else (staging.array(slot, me, _section(r, me) * section + off, a.dtype, n)
                                              for off, a in zip(offsets, mine)))
    return received


def _p2p_small_plan(key, *args):
    """The Program of a small :func:`_p2p_fold` (``key``: see there; ``args``: this rank's
    operand's fields, then the targets' unless in place, then the call's barrier number and
    poll limit): the push-and-meet kernel, then the fold."""
    staging, slot, in_place, stream = key[1], key[2], key[3], key[4]
    op, world, me = key[0], staging.world, staging.rank
    arrays = args[:-2]
    fields = len(arrays) if in_place else len(arrays) // 2
    b = _programs.Builder(arrays[0].device_id, stream)
    placed = tuple(b.input(a) for a in arrays)
    epoch, polls = b.value(args[-2]), b.value(args[-1])
    mine = placed[:fields]
    targets = mine if in_place else placed[fields:]
    offsets, section = _slot_layout(tuple(a.dtype.itemsize for a in arrays[:fields]), mine[0].size)
    sends = tuple(staging.array(slot, r, _section(me, r) * section + off, a.dtype, a.size)
                  for r in range(world) if r != me for off, a in zip(offsets, mine))
    received = _received(staging, slot, mine, offsets, section)
    b.launch(_push_kernel(fields, world - 1), ("p2p_push", fields, world - 1), 1, _PUSH_THREADS,
             (mine, sends, staging.flags, np.int64(me), epoch, polls, np.int64(mine[0].size)))
    _launch_ranks_fold(b, op, world, tuple(received), targets)
    return b.build()


_P2P_SMALL = _programs.Programs(_p2p_small_plan, "cufold.distributed.p2p_small", 256)


def _section(source, receiver):
    """Where in ``receiver``'s slot rank ``source``'s operand goes (a section per other rank)."""
    return source if source < receiver else source - 1


#: The rank fold's blocks and items a thread (the simulator: small tiles for its tests).
_FOLD_THREADS, _FOLD_ITEMS = (32 if SIMULATOR else 256), 4


@functools.lru_cache(maxsize=None)
def _ranks_fold_kernel(op, vt, world):
    """Kernel ``(sources, outs, n)``: ``outs[i] = s_0[i] op s_1[i] op ... op s_{W-1}[i]`` for
    ``i < n``, in rank order. ``sources``: a flat tuple of every rank's field arrays (rank
    major); ``outs``: the result's fields. A block's tile is contiguous, each thread's items
    a block apart, and every load of a full tile is issued before its first store (``outs``
    may be this rank's own source)."""
    fields = vt.arity if vt.is_tuple else 1

    def value(r, i):
        arrays = ["sources[%d]" % (r * fields + f) for f in range(fields)]
        where = "(%s,)" % ", ".join(arrays) if vt.is_tuple else arrays[0]
        return "load(%s, %s)" % (where, i)

    def folded(i):
        expr = value(0, i)
        for r in range(1, world):
            expr = "combine(%s, %s)" % (expr, value(r, i))
        return expr

    dest = "outs" if vt.is_tuple else "outs[0]"
    nt, items = _FOLD_THREADS, _FOLD_ITEMS
    lines = ["def fold_ranks(sources, outs, n):",
             "    base = cuda.blockIdx.x * %d + cuda.threadIdx.x" % (nt * items),
             "    if base + %d < n:" % ((items - 1) * nt)]
    lines += ["        v%d = %s" % (k, folded("base + %d" % (k * nt))) for k in range(items)]
    lines += ["        store(%s, base + %d, v%d)" % (dest, k * nt, k) for k in range(items)]
    lines += ["    else:",
              "        for k in range(%d):" % items,
              "            i = base + k * %d" % nt,
              "            if i < n:",
              "                store(%s, i, %s)" % (dest, folded("i"))]
    env = {"load": vt.load, "store": vt.store, "combine": op.combine(vt)}
    return _codegen.build("\n".join(lines) + "\n", "fold_ranks", env, device=False)


def _launch_ranks_fold(b, op, world, sources, targets):
    """Add the rank fold of ``sources`` into ``targets`` (placeholders or constant arrays of
    Program builder ``b``; see :func:`_ranks_fold_kernel`) to ``b``."""
    vt = ValueType.of(tuple(a.dtype for a in targets) if len(targets) > 1 else targets[0].dtype)
    n = targets[0].size
    grid = _builtins.max(1, -(-n // (_FOLD_THREADS * _FOLD_ITEMS)))
    b.launch(_ranks_fold_kernel(op, vt, world), ("ranks_fold", op, vt, world), grid, _FOLD_THREADS,
             (sources, targets, np.int64(n)))


def _ranks_fold_plan(key, *arrays):
    """The Program of :func:`_fold_ranks` for these arrays (``key``: see there)."""
    op, world, fields = key[0], key[1], key[2]
    b = _programs.Builder(arrays[-1].device_id, key[-1])
    placed = tuple(b.input(a) for a in arrays)
    _launch_ranks_fold(b, op, world, placed[:-fields], placed[-fields:])
    return b.build()


_RANKS_FOLD = _programs.Programs(_ranks_fold_plan, "cufold.distributed.ranks_fold", 256)


def _gather_fields(flat, group, same_layout=True):
    """Every rank's 1-D fields ``flat`` (equally long), gathered: a list of (W, n) tensors, one
    per field. Up to :data:`PACK_MAX_BYTES` a rank, several fields travel packed in one byte
    buffer (each at an offset aligned to its item size), so a small tuple costs one collective,
    not one per field; larger ones go field by field, without the pack's copies. Packed fields
    of different item sizes are made contiguous (one layout, as a tuple's fields share) unless
    ``same_layout`` is False."""
    torch, _ = _torch()
    w, _ = _group_info(group)
    n, dev = flat[0].numel(), flat[0].device
    if len(flat) == 1 or n * _builtins.sum(f.element_size() for f in flat) > PACK_MAX_BYTES:
        stacks = []
        for f in flat:
            s = torch.empty(w * n, dtype=f.dtype, device=dev)
            _all_gather(s, f, group)
            stacks.append(s.view(w, n))
        return stacks
    offsets, size = [], 0
    for f in flat:
        size = -(-size // f.element_size()) * f.element_size()
        offsets.append(size)
        size += n * f.element_size()
    size = -(-size // 8) * 8                      # rows stay aligned for every field's view
    mine = torch.empty(size, dtype=torch.uint8, device=dev)
    for f, off in zip(flat, offsets):
        mine[off: off + n * f.element_size()].view(f.dtype).copy_(f)
    every = torch.empty((w, size), dtype=torch.uint8, device=dev)
    _all_gather(every.view(-1), mine, group)
    stacks = [every[:, off: off + n * f.element_size()].view(f.dtype) for f, off in zip(flat, offsets)]
    if same_layout and len({f.element_size() for f in flat}) > 1:    # a tuple's fields: one layout (strides)
        stacks = [s.contiguous() for s in stacks]
    return stacks


def _welford_sums_apply(op, ts):
    """Whether ``op`` on ``ts`` is Welford's merge of floating states of one dtype, which
    :func:`_welford_sums` does with the backend's sums."""
    return op is welford and len(ts) == 3 and ts[0].dtype.is_floating_point and \
        all(t.dtype == ts[0].dtype and t.is_contiguous() for t in ts)


def _welford_sums(flat, outs, group):
    """Welford states ``(count, mean, M2)`` merged over the ranks by two all-reduce sums
    (Chan's formula, in the order that needs only sums): first ``(count, count * mean)``,
    giving the merged count ``C`` and mean ``mu``; then ``M2 + count * (mean - mu)^2``, which
    sums to the merged ``M2`` -- deviations from the merged mean, so no sum of squares
    cancels. The bytes of one NCCL all-reduce of the states, plus two elementwise kernels
    (``_merge_kernels``: 4 and 8 field-passes, at copy bandwidth), in place in ``outs``.

    (Pipelined in 2 or 4 chunks, each chunk's kernel overlapping another chunk's
    all-reduce, it measured slower on 2 x H200: 1270 and 1288 us against 1206 whole; the
    kernels and NCCL share the SMs and the memory.)"""
    torch, dist = _torch()
    for t, o in zip(flat, outs):
        if o is not t:
            o.copy_(t)
    count = outs[0]
    sums = torch.empty((2, count.numel()), dtype=count.dtype, device=count.device)
    fields, key = _merge_args(outs, sums)
    _MERGE.run(("prepare",) + key, *fields)
    dist.all_reduce(sums, group=group)
    _MERGE.run(("finish",) + key, *fields)
    dist.all_reduce(outs[2], group=group)


def _merge_args(outs, sums):
    """The arrays of the Welford merge's kernels ``(c, m, m2, s0, s1)`` (``s0``, ``s1``: the
    rows of ``sums``), described, and their Programs' key (layouts and the stream)."""
    fields = _describe(_devs(outs) + (_dev(sums[0]), _dev(sums[1])))
    return fields, tuple(_programs.signature(a) for a in fields) + (_arrays.stream_handle(fields[0]),)


def _describe(arrays):
    return tuple(_arrays.describe(a) for a in arrays)


#: The merge kernels' blocks and items a thread: a block's tile is contiguous, each thread's
#: items a block apart, every load of a full tile issued before its first store. (The
#: simulator runs a thread per Python thread: blocks of 32 keep its tests' tiles small.)
_MERGE_THREADS, _MERGE_ITEMS = (32 if SIMULATOR else 256), 4


@functools.lru_cache(maxsize=None)
def _merge_kernels(dtype):
    """The elementwise halves of :func:`_welford_sums` for states of ``dtype``:
    ``prepare(c, m, m2, s0, s1, n)`` writes ``(s0, s1) = (c, c * m)``; ``finish`` reads the
    summed ``(C, C * mu)`` and leaves ``c = C``, ``m = mu`` and ``m2 = m2 + c * (m - mu)^2``
    (to be summed). Each thread touches its own items only, so the states are updated in
    place. (On one H200, 2^24 float32 items, ``tools/dist_probe.py``: a tile a block with
    every load first, 66.6 us for the prepare, against 88.9 for a grid-stride loop of one item
    a step; a copy of one field, 2 passes, 34.2 us. The whole merge across 2 x H200 moved
    within its run-to-run spread, 9-13 us faster in alternate runs.)"""
    zero = np.dtype(dtype).type(0)
    item = numba.from_dtype(np.dtype(dtype))
    nt, items = _MERGE_THREADS, _MERGE_ITEMS
    tile = nt * items

    @cuda.jit(device=True, inline=True)
    def merged(total, weighted, c, m, m2):
        mu = weighted / total if total > zero else zero
        d = m - mu
        return mu, m2 + c * d * d

    def prepare(c, m, m2, s0, s1, n):
        base = cuda.blockIdx.x * tile + cuda.threadIdx.x
        if base + (items - 1) * nt < n:
            cs = cuda.local.array(items, item)
            ms = cuda.local.array(items, item)
            for k in range(items):
                cs[k] = c[base + k * nt]
                ms[k] = m[base + k * nt]
            for k in range(items):
                s0[base + k * nt] = cs[k]
                s1[base + k * nt] = cs[k] * ms[k]
        else:
            for k in range(items):
                i = base + k * nt
                if i < n:
                    s0[i] = c[i]
                    s1[i] = c[i] * m[i]

    def finish(c, m, m2, s0, s1, n):
        base = cuda.blockIdx.x * tile + cuda.threadIdx.x
        if base + (items - 1) * nt < n:
            totals = cuda.local.array(items, item)
            weighted = cuda.local.array(items, item)
            cs = cuda.local.array(items, item)
            ms = cuda.local.array(items, item)
            m2s = cuda.local.array(items, item)
            for k in range(items):
                i = base + k * nt
                totals[k], weighted[k], cs[k], ms[k], m2s[k] = s0[i], s1[i], c[i], m[i], m2[i]
            for k in range(items):
                i = base + k * nt
                m[i], m2[i] = merged(totals[k], weighted[k], cs[k], ms[k], m2s[k])
                c[i] = totals[k]
        else:
            for k in range(items):
                i = base + k * nt
                if i < n:
                    m[i], m2[i] = merged(s0[i], s1[i], c[i], m[i], m2[i])
                    c[i] = s0[i]

    return prepare, finish


def _merge_plan(key, c, m, m2, s0, s1):
    """The Program of one half (``key[0]``) of :func:`_welford_sums` for these arrays."""
    half = key[0]
    b = _programs.Builder(c.device_id, key[-1])
    args = tuple(b.input(a) for a in (c, m, m2, s0, s1))
    n = c.size
    grid = _builtins.max(1, -(-n // (_MERGE_THREADS * _MERGE_ITEMS)))
    fn = _merge_kernels(c.dtype)[half == "finish"]
    b.launch(fn, ("welford_merge", half, c.dtype), grid, _MERGE_THREADS, args + (np.int64(n),))
    return b.build()


_MERGE = _programs.Programs(_merge_plan, "cufold.distributed.welford_merge", 64)


def _fold(stacks, op, dtypes, outs):
    """``outs`` = the fold of ``stacks`` (tensors of shape (W, m)) along the rank axis, in order."""
    if stacks[0].shape[1] == 0:
        return
    if len(stacks) == 1:
        _device.reduce(_dev(stacks[0]), op, axis=0, dtype=dtypes[0], out=_dev(outs[0]))
    else:
        _device.reduce(_devs(stacks), op, axis=0, dtype=dtypes, out=_devs(outs))


# --- reduce: a sharded array ------------------------------------------------------------------------

def _reduced_axes(axis, ndim):
    """``(normalised axes, whether axis 0 -- the sharded one -- is among them)``."""
    if axis is None:
        return None, True
    axes = axis if isinstance(axis, tuple) else (axis,)
    norm = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < ndim:
            raise ValueError("cufold: axis %d is out of bounds for an array of dimension %d" % (a, ndim))
        norm.append(a % ndim)
    return tuple(norm), 0 in norm


def _prepare_shard(fn, op, x, axis, group, check, extra=(), empty_needs_identity=False):
    """Fields of ``x``, its reduced axes, the agreement table (or None). Errors a rank finds
    in its own arguments are raised on every rank (with ``check``), before any collective
    that they would leave waiting."""
    ts, is_tuple = _fields(x, "x")
    call = _Call(fn, op, ts, sharded=True, extra=(-2 if axis is None else hash(axis) & 0xFFFF,) + tuple(extra)) \
        if check else None
    axes = None
    with _local_errors(call):
        _check_fields(ts, "x")
        if ts[0].dim() == 0:
            raise ValueError("cufold: distributed.%s takes shards along axis 0: arrays of 1 or more "
                             "dimensions; got a 0-d array" % fn)
        axes, _ = _reduced_axes(axis, ts[0].dim())
        if empty_needs_identity and ts[0].shape[0] == 0 and op.identity_for(_value_type(ts)) is None:
            raise ValueError("cufold: this rank's shard is empty and operator %s has no identity to stand for it"
                             % op.name)
    rows = _agree(call, group, ts[0].device) if check else None
    return ts, is_tuple, axes, rows


def _partial_combine(partial, op, group, reduces_shards):
    """All-reduce a local partial result (a tensor or tuple of them) where the reduced axes
    span the shards; otherwise the local result is already this rank's shard of the answer."""
    if not reduces_shards:
        return partial
    fields = partial if isinstance(partial, tuple) else (partial,)
    fields = tuple(f if f.is_contiguous() else f.contiguous() for f in fields)
    _all_reduce(fields, op, fields, group)
    return fields if isinstance(partial, tuple) else fields[0]


def reduce(x, op=plus, *, axis=None, keepdims=False, dtype=None, group=None, deterministic=True, check=True):
    """Reduce the array whose shards (along axis 0, in rank order) the ranks hold:
    every rank gets the result of ``cufold.reduce`` of the concatenated array.

    A local cufold reduction, then an :func:`all_reduce` of the partial results with ``op``
    (in rank order: any associative operator). Where ``axis`` does not include axis 0, the
    result is sharded along axis 0 as ``x`` is: this rank's part, with no communication.

    Parameters as :func:`cufold.reduce`; ``group`` and ``check`` as :func:`all_reduce`
    (``check`` also lets shard lengths differ: only the other dimensions must agree).
    A rank's shard may be empty where ``op`` has an identity.

    Example::

        >>> cufold.distributed.reduce(x, cufold.maximum)          # the global maximum
        >>> cufold.distributed.reduce((a, b), affine)              # a fold in rank order
    """
    op = as_op(op)
    ts, is_tuple, axes, rows = _prepare_shard("reduce", op, x, axis, group, check, empty_needs_identity=True)
    xs = _devs(ts) if is_tuple else _dev(ts[0])
    partial = _back(_device.reduce(xs, op, axis=axis, keepdims=keepdims, dtype=dtype,
                                   deterministic=deterministic))
    return _partial_combine(partial, op, group, axes is None or 0 in axes)


def _shortcut(name, local, combine_op, needs_items=False):
    def fn(x, *, axis=None, keepdims=False, group=None, check=True, **kwargs):
        ts, _, axes, rows = _prepare_shard(name, combine_op, x, axis, group, check)
        t = ts[0]
        spans = axes is None or 0 in axes
        if needs_items and spans and t.shape[0] == 0:      # an empty shard stands aside
            if rows is not None and not rows[:, _LEN].any():
                raise ValueError("cufold: zero-size array to reduction operation %s, which has no identity" % name)
            return _partial_combine(_identity_partial(t, axes, keepdims, combine_op), combine_op, group, True)
        partial = _back(local(_dev(t), axis=axis, keepdims=keepdims, **kwargs))
        return _partial_combine(partial, combine_op, group, spans)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = ("``cufold.%s`` of the array whose shards (along axis 0) the ranks hold, on every rank: "
                  "a local ``cufold.%s``, then an all-reduce of the partial results with ``cufold.%s``. "
                  "Keywords as ``cufold.%s``; ``group``, ``check`` as :func:`all_reduce`.\n\n"
                  "Example: ``cufold.distributed.%s(x, axis=0)``" % (name, name, combine_op.name, name, name))
    return fn


def _identity_partial(t, axes, keepdims, op):
    """What an empty shard contributes: the identity, in the partial result's shape."""
    torch, _ = _torch()
    reduced = range(t.dim()) if axes is None else axes
    shape = tuple(1 if i in reduced else s for i, s in enumerate(t.shape) if keepdims or i not in reduced)
    return torch.full(shape, op.identity_for(_np_dtype(t)).item(), dtype=t.dtype, device=t.device)


prod = _shortcut("prod", _device.prod, multiplies)
min = _shortcut("min", _device.min, minimum, needs_items=True)          # noqa: A001
max = _shortcut("max", _device.max, maximum, needs_items=True)          # noqa: A001


def sum(x, *, axis=None, keepdims=False, dtype=None, group=None, deterministic=True, check=True):  # noqa: A001
    """``cufold.sum`` of the array whose shards (along axis 0) the ranks hold, on every rank.

    ``deterministic="gpu_to_gpu"`` (floats, ``axis=None``): the ranks' binned states are
    combined exactly, so the result has the same bits for any number of ranks and any
    sharding, and equals ``cufold.sum(whole, deterministic="gpu_to_gpu")`` on one GPU.

    Example: ``total = cufold.distributed.sum(x, deterministic="gpu_to_gpu")``
    """
    ts, _, axes, _ = _prepare_shard("sum", plus, x, axis, group, check, extra=(deterministic == "gpu_to_gpu",))
    if deterministic == "gpu_to_gpu":
        state = _combined_state(ts[0], axis, keepdims, group, "sum")
        return _back(_reproducible.finalise(_dev(state), dtype if dtype is not None else _np_dtype(ts[0])))
    partial = _back(_device.sum(_dev(ts[0]), axis=axis, keepdims=keepdims, dtype=dtype, deterministic=deterministic))
    return _partial_combine(partial, plus, group, axes is None or 0 in axes)


def _combined_state(t, axis, keepdims, group, name):
    """The binned state of the whole sharded array (gathered states, combined exactly)."""
    torch, dist = _torch()
    if axis is not None or keepdims:
        raise ValueError("cufold: distributed.%s(deterministic='gpu_to_gpu') reduces whole arrays "
                         "(axis=None)" % name)
    w, _ = _group_info(group)
    local = _back(_reproducible.sum_state(_dev(t if t.is_contiguous() else t.contiguous())))
    states = torch.empty(w * local.numel(), dtype=local.dtype, device=local.device)
    _all_gather(states, local.reshape(-1), group)
    return _back(_reproducible.combine_states(_dev(states.view(w, local.numel()))))


def _mean_item(v):
    return (1.0, np.float64(v))


def _welford_item(v):
    return (1.0, np.float64(v), 0.0)


def _result_dtype(t, dtype):
    torch, _ = _torch()
    if dtype is not None:
        return getattr(torch, np.dtype(dtype).name)
    return t.dtype if t.dtype.is_floating_point else torch.float64


def mean(x, *, axis=None, keepdims=False, dtype=None, group=None, deterministic=True, check=True):
    """``cufold.mean`` of the array whose shards (along axis 0) the ranks hold, on every rank:
    local ``(count, sum)`` pairs in float64, summed over the ranks, divided once.
    ``deterministic="gpu_to_gpu"``: the exact binned sum over the ranks (see :func:`sum`)
    divided by the count.

    Example: ``cufold.distributed.mean(x, axis=0)``
    """
    ts, _, axes, rows = _prepare_shard("mean", plus, x, axis, group, check,
                                       extra=(deterministic == "gpu_to_gpu",))
    t = ts[0]
    res = _result_dtype(t, dtype)
    if deterministic == "gpu_to_gpu":
        torch, _ = _torch()
        state = _combined_state(t, axis, keepdims, group, "mean")
        total = _back(_reproducible.finalise(_dev(state), _np_dtype(t) if t.dtype.is_floating_point else np.float64))
        count = _global_count(t, None, rows, group)
        return (total.to(torch.float64) / count).to(res)
    pair = _back(_device.reduce(_dev(t), plus, axis=axis, keepdims=keepdims, transform=_mean_item,
                                deterministic=deterministic))
    count, total = _partial_combine(pair, plus, group, axes is None or 0 in axes)
    return (total / count).to(res)


def _global_count(t, axes, rows, group):
    """Items of the whole array along the reduced axes (None: all of them)."""
    torch, dist = _torch()
    per_row = int(np.prod(t.shape[1:], dtype=np.int64))
    if rows is not None:
        return float(rows[:, _LEN].sum() * per_row)
    c = torch.full((), t.shape[0] * per_row, dtype=torch.float64, device=t.device)
    dist.all_reduce(c, group=group)
    return c


def _moments(name, x, axis, keepdims, ddof, dtype, group, check):
    ts, _, axes, _ = _prepare_shard(name, welford, x, axis, group, check, extra=(ddof,))
    t = ts[0]
    state = _back(_device.reduce(_dev(t), welford, axis=axis, keepdims=keepdims, transform=_welford_item))
    count, m, m2 = _partial_combine(state, welford, group, axes is None or 0 in axes)
    res = _result_dtype(t, dtype)
    return m.to(res), (m2 / (count - ddof)).to(res)


def var(x, *, axis=None, keepdims=False, ddof=0, dtype=None, group=None, check=True):
    """``cufold.var`` of the array whose shards (along axis 0) the ranks hold, on every rank:
    local Welford states ``(count, mean, M2)`` merged over the ranks (Chan's formula), so it
    stays accurate where a sum of squares cancels.

    Example: ``cufold.distributed.var(x, ddof=1)``
    """
    return _moments("var", x, axis, keepdims, ddof, dtype, group, check)[1]


def mean_var(x, *, axis=None, keepdims=False, ddof=0, dtype=None, group=None, check=True):
    """``(mean, var)`` of the sharded array in one pass (as :func:`var`): synchronised batch
    normalisation's statistics.

    Example: ``m, v = cufold.distributed.mean_var(x, axis=0)``
    """
    return _moments("mean_var", x, axis, keepdims, ddof, dtype, group, check)


def _arg(name, local, op):
    def fn(x, *, axis=None, keepdims=False, group=None, check=True):
        torch, _ = _torch()
        ts, _, axes, rows = _prepare_shard(name, op, x, axis, group, check)
        t = ts[0]
        if axes is not None and (len(axes) != 1 or axis.__class__ is tuple):
            raise ValueError("cufold: distributed.%s takes one axis or None, as numpy.%s" % (name, name))
        if axes is not None and axes[0] != 0:      # along another axis: each rank's own rows
            return _back(local(_dev(t), axis=axis, keepdims=keepdims))
        value, index = _local_pair(t, axis, local, op)
        per_row = 1 if axis is not None else int(np.prod(t.shape[1:], dtype=np.int64))
        value, index = _global_arg(value, index, t.shape[0] * per_row, op, group)
        if keepdims:
            index = index.reshape((1,) * t.dim() if axis is None else tuple(1 if i == axes[0] else s
                                                                             for i, s in enumerate(t.shape)))
        return index
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = ("``numpy.%s`` of the array whose shards (along axis 0) the ranks hold, on every rank: the "
                  "index in the concatenated array (axis=None: flat, C order; axis=0: along it) of the first "
                  "%s (NaN first, as NumPy). Local (value, index) pairs with global indices, folded over the "
                  "ranks in order with ``cufold.%s``. An empty shard takes no part. ``group``, ``check`` as "
                  ":func:`all_reduce`.\n\nExample: ``i = cufold.distributed.%s(x)``"
                  % (name, "minimum" if "min" in name else "maximum", name, name))
    return fn


def _global_arg(value, index, items, op, group):
    """Fold every rank's (value, local index) pairs in rank order, each index moved past the
    ``items`` (flat, or rows along axis 0) of the ranks before it: one packed gather carries
    the pairs and the shard sizes together, one kernel moves the indices and folds."""
    torch, _ = _torch()
    shape = value.shape
    flat_value, flat_index = value.reshape(-1), index.reshape(-1)
    sizes = _shard_sizes(flat_value.numel(), items, value.device)
    vals, idx, counts = _gather_fields([flat_value, flat_index, sizes], group, same_layout=False)
    value, index = torch.empty_like(flat_value), torch.empty_like(flat_index)
    arrays = _describe(_devs((vals, idx, counts, value, index)))
    key = (op,) + tuple(_programs.signature(a) for a in arrays) + (_arrays.stream_handle(arrays[3]),)
    _GLOBAL_ARG.run(key, *arrays)
    return value.reshape(shape), index.reshape(shape)


def _shard_sizes(m, items, device):
    """``m`` copies of this rank's shard size ``items`` (int64, on ``device``): what the pairs'
    gather carries beside them; made once per size (read only)."""
    key = (m, items, device)
    t = _SHARD_SIZES.get(key)
    if t is None:
        torch, _ = _torch()
        t = _SHARD_SIZES.put(key, torch.full((m,), items, dtype=torch.int64, device=device))
    return t


_SHARD_SIZES = _launch.BoundedCache(64)
_GLOBAL_ARG_THREADS = 32 if SIMULATOR else 128


@functools.lru_cache(maxsize=None)
def _global_arg_kernel(op, vt, world):
    """Kernel ``(vals, idx, counts, value, index)``: for each position ``j``, every rank's
    ``(vals[r, j], idx[r, j])`` (a local index, or the operator's empty index) with the index
    moved past ``counts[0..r-1, j]``, folded in rank order into ``(value[j], index[j])``."""
    combine = op.combine(vt)
    none = np.int64(op.identity_for(vt)[1])

    def global_arg(vals, idx, counts, value, index):
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if j < value.shape[0]:
            best = (vals[0, j], idx[0, j])
            start = counts[0, j]
            for r in range(1, world):
                i = idx[r, j]
                if i != none:
                    i += start
                best = combine(best, (vals[r, j], i))
                start += counts[r, j]
            value[j] = best[0]
            index[j] = best[1]
    return global_arg


def _global_arg_plan(key, *arrays):
    """The Program of :func:`_global_arg`'s kernel for these arrays."""
    b = _programs.Builder(arrays[0].device_id, key[-1])
    vals, idx, counts, value, index = (b.input(a) for a in arrays)
    vt = ValueType.of((value.dtype, np.dtype(np.int64)))
    m = value.size
    b.launch(_global_arg_kernel(key[0], vt, vals.shape[0]), ("global_arg", key[0], vt, vals.shape[0]),
             _builtins.max(1, -(-m // _GLOBAL_ARG_THREADS)), _GLOBAL_ARG_THREADS, (vals, idx, counts, value, index))
    return b.build()


_GLOBAL_ARG = _programs.Programs(_global_arg_plan, "cufold.distributed.global_arg", 256)


def _local_pair(t, axis, local, op):
    """This rank's (value, index) of the first extreme (the identity where the shard is empty)."""
    torch, _ = _torch()
    shape = () if axis is None else tuple(t.shape[1:])
    if t.shape[0] == 0:
        ident = op.identity_for(ValueType.of((_np_dtype(t), np.int64)))
        return (torch.full(shape, ident[0].item(), dtype=t.dtype, device=t.device),
                torch.full(shape, int(ident[1]), dtype=torch.int64, device=t.device))
    index = _back(local(_dev(t), axis=axis))
    if axis is None:          # take: a gather on the device (indexing by a 0-d tensor reads it to the host)
        value = torch.take(t, index)
    else:
        value = torch.take_along_dim(t, index.unsqueeze(0), 0).squeeze(0).contiguous()
    return value, index.to(torch.int64).contiguous()


argmin = _arg("argmin", _device.argmin, _argmin_op)
argmax = _arg("argmax", _device.argmax, _argmax_op)


# --- reduce_by_key_into over the ranks --------------------------------------------------------------

_POSITIONS = (_argmin_op, _argmax_op)


def reduce_by_key_into(keys, values, out, op=plus, *, group=None, shard=False, check=True):
    """``out[keys[i]] = op(out[keys[i]], values[i])`` over every rank's pairs
    (``cufold.reduce_by_key_into`` with the pairs of all ranks).

    Replicated (``shard=False``): ``out`` holds the whole table, the same on every rank
    before the call and after it. Each rank scatters its pairs into a table of the operator's
    identity (rank 0 into ``out`` itself, so that what ``out`` held is folded in once), then
    the tables are all-reduced (:func:`all_reduce`). argmin/argmax lifted from one value field
    give positions in the concatenation of the ranks' ``values`` (rank order).

    Sharded (``shard=True``): a table too large to replicate is split by key range: rank
    ``r``'s ``out`` holds rows ``[start_r, start_r + len(out_r))``, ranges in rank order
    (``start_0 = 0``). Each rank sends every pair to the owner of its key (``all_to_all``),
    which scatters what it receives into its part. **Synchronises the host** once for the
    sizes sent (and once more with ``check``).

    ``values``, ``out`` and ``op`` as ``cufold.reduce_by_key_into`` (tuples, feature rows of
    shape (n, F)); ``op`` must be commutative. ``check``: the ranks agree on shapes and
    operator, and every key lies in the table (a clear error on every rank otherwise);
    **synchronises the host** once. ``check=False`` (replicated): no wait.

    Example::

        >>> vmax = torch.full((m,), -float("inf"), device="cuda")
        >>> where = torch.full((m,), -1, dtype=torch.int64, device="cuda")
        >>> cufold.distributed.reduce_by_key_into(keys, x, (vmax, where), cufold.argmax)
    """
    torch, dist = _torch()
    op = as_op(op)
    k = _tensor(keys, "keys")
    vs, v_tuple = _fields(values, "values")
    outs, o_tuple = _fields(out, "out")
    w, rank = _group_info(group)
    call = None
    if check or shard:                             # shard: the sizes of the ranges are exchanged anyway
        call = _Call("reduce_by_key_into", op, (k,) + vs, sharded=True,
                     extra=(bool(shard), len(outs), -1, outs[0].shape[1] if outs[0].dim() == 2 else 0))
        if not shard:                              # a replicated table has one length
            call.vector[_EXTRA + 2] = outs[0].shape[0] if outs[0].dim() else -1
        call.vector[_ROWS] = outs[0].shape[0] if outs[0].dim() else 0
        call.vector[_KMIN], call.vector[_KMAX] = 0, -1
    lifted_positions = op in _POSITIONS and not v_tuple
    with _local_errors(call):
        if k.dim() != 1 or _np_dtype(k).kind not in "iu":
            raise TypeError("cufold: keys must be a 1-D integer tensor; got %s of shape %s"
                            % (k.dtype, tuple(k.shape)))
        if any(v.shape[0] != k.shape[0] for v in vs):
            raise ValueError("cufold: keys and values differ in length: %d and %s"
                             % (k.shape[0], [v.shape[0] for v in vs]))
        if not op.commutative:
            raise ValueError("cufold: reduce_by_key_into over ranks needs a commutative operator; %s is not"
                             % op.name)
        if lifted_positions and len(outs) != 2:
            raise ValueError("cufold: %s by key writes (value, position): out takes two arrays" % op.name)
        if check and k.shape[0]:
            lo, hi = _back(_device.minmax(_dev(k)))
            call.device_slots = {_KMIN: lo, _KMAX: hi}
    rows = None
    if call is not None:
        rows = _agree(call, group, k.device)
        m_total = int(rows[:, _ROWS].sum()) if shard else int(rows[0, _ROWS])
        if check:
            used = rows[rows[:, _KMAX] >= rows[:, _KMIN]]
            if len(used) and (used[:, _KMIN].min() < 0 or used[:, _KMAX].max() >= m_total):
                raise ValueError("cufold: a key lies outside the table [0, %d): keys span [%d, %d] over the ranks"
                                 % (m_total, used[:, _KMIN].min(), used[:, _KMAX].max()))
    if shard:
        _by_key_sharded(k, vs, v_tuple, outs, o_tuple, op, rows, group, lifted_positions)
    else:
        _by_key_replicated(k, vs, v_tuple, outs, o_tuple, op, rows, group, lifted_positions)
    return out


def _values_arg(vs, v_tuple):
    return _devs(vs) if v_tuple else _dev(vs[0])


def _out_arg(outs, o_tuple):
    return _devs(outs) if o_tuple else _dev(outs[0])


def _by_key_replicated(k, vs, v_tuple, outs, o_tuple, op, rows, group, lifted_positions):
    torch, _ = _torch()
    w, rank = _group_info(group)
    vt = _value_type(outs)
    ident = op.identity_for(vt)
    if rank != 0:
        if ident is None:
            raise ValueError("cufold: operator %s has no identity to start the other ranks' tables" % op.name)
        for o, e in zip(outs, ident if vt.is_tuple else (ident,)):
            o.fill_(e.item())
    if k.shape[0]:
        _device.reduce_by_key_into(_dev(k), _values_arg(vs, v_tuple), _out_arg(outs, o_tuple), op, check=False)
    if lifted_positions and rank != 0:           # local positions -> positions over all ranks
        offset = _shard_offset(k.shape[0], rows, group, k.device)
        pos = outs[1]
        pos.add_(torch.where(pos != int(ident[1]), offset, 0))
    elif lifted_positions:
        _shard_offset(k.shape[0], rows, group, k.device)        # every rank joins the gather
    _all_reduce(tuple(o if o.is_contiguous() else o.contiguous() for o in outs), op, outs, group)


def _by_key_sharded(k, vs, v_tuple, outs, o_tuple, op, rows, group, lifted_positions):
    torch, dist = _torch()
    w, rank = _group_info(group)
    starts = np.concatenate([[0], np.cumsum(rows[:, _ROWS])])
    bounds = torch.as_tensor(starts[1:-1], dtype=k.dtype, device=k.device)
    owner = torch.bucketize(k, bounds, right=True)
    order = torch.argsort(owner, stable=True)
    send = torch.bincount(owner, minlength=w)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    both = _read(torch.stack([send, recv]))      # the one wait: sizes of what is sent
    send_sizes, recv_sizes = both[0].tolist(), both[1].tolist()
    got = _builtins.sum(recv_sizes)

    def exchange(t):
        moved = t.index_select(0, order)
        r = torch.empty((got,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        dist.all_to_all_single(r, moved, output_split_sizes=recv_sizes, input_split_sizes=send_sizes, group=group)
        return r

    local_keys = exchange(k) - int(starts[rank])
    moved = [exchange(v) for v in vs]
    if lifted_positions:                          # the pairs move: positions must travel with them
        offset = int(rows[:rank, _LEN].sum())
        positions = torch.arange(offset, offset + k.shape[0], dtype=torch.int64, device=k.device)
        moved.append(exchange(positions))
        v_tuple = True
    if got:
        _device.reduce_by_key_into(_dev(local_keys), _values_arg(moved, v_tuple), _out_arg(outs, o_tuple), op,
                                   check=False)
