"""Array interop for the device-wide calls: describe any CUDA array, allocate
outputs of the input's own library, find the stream to launch on.

Everything here is on the per-call path of ``cufold.sum(x)`` and friends, so
the common cases are fast paths keyed by the array's exact type (a dict
lookup), and the generic protocols (``__cuda_array_interface__``, DLPack) are
the fallback. No library is imported unless one of its arrays is seen (torch,
cupy and jax are recognised by the module name of the array's type).

Public API
----------
``Arr``                          light descriptor of a device array (``__slots__``)
``describe(x, name="x", stream=None) -> Arr``
``describe_many(xs, name="x") -> tuple[Arr, ...]``   structure-of-arrays inputs
``same_device(arrs, name="x") -> int``
``empty(like, shape, dtype, stream=None) -> (obj, Arr)``
``to_library(obj, like) -> obj``  final hand-back (only JAX outputs change)
``stream_handle(like, stream=None) -> int``
``as_numba(arr)``                a Numba device array (or simulator array) view

Libraries: ``'torch'``, ``'cupy'``, ``'numba'``, ``'jax'``, ``'cai'`` (any
other ``__cuda_array_interface__`` object), ``'dlpack'`` (any other
``__dlpack__`` object) and ``'sim'`` (Numba's CPU simulator arrays).
"""

from __future__ import annotations

import ctypes
import sys
import threading

import numpy as np
from numba import config, cuda

__all__ = [
    "Arr", "describe", "describe_many", "same_device", "empty", "to_library",
    "stream_handle", "as_numba", "HOST_MESSAGE",
]

SIMULATOR = bool(config.ENABLE_CUDASIM)

HOST_MESSAGE = (
    "cufold: {name} is a host ({kind}) array; move it to the GPU first, e.g. "
    "cupy.asarray({name}), torch.as_tensor({name}, device='cuda') or "
    "numba.cuda.to_device({name})"
)

_EMPTY = ()
_ONE = (1,)


def _c_strides(shape):
    """Element strides of a C-contiguous array of ``shape``."""
    n = len(shape)
    if n == 0:
        return _EMPTY
    if n == 1:
        return _ONE
    out = [1] * n
    acc = 1
    for i in range(n - 1, 0, -1):
        acc *= shape[i]
        out[i - 1] = acc
    return tuple(out)


def _dense(shape, strides):
    """Whether dimensions given innermost first, with element ``strides``, lay their items
    out back to back (size-1 dimensions may have any stride)."""
    expect = 1
    for n, s in zip(shape, strides):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


class Arr:
    """Descriptor of a device array.

    ``ptr`` (int, device address of element 0), ``shape`` (tuple), ``strides``
    (tuple, in *elements*), ``byte_strides`` (tuple, bytes), ``dtype``
    (``np.dtype``), ``itemsize``, ``size``, ``ndim``, ``library`` (see the
    module doc), ``obj`` (the original object; ``None`` for a :meth:`view`
    whose Numba array is made on demand), ``device_id`` (CUDA ordinal),
    ``stream`` (the producer's stream declared through
    ``__cuda_array_interface__`` v3, else ``None``).
    """

    __slots__ = ("ptr", "shape", "strides", "dtype", "itemsize", "size", "ndim",
                 "library", "obj", "device_id", "stream", "_nb", "_base", "_offset", "_layout")

    def __init__(self, ptr, shape, strides, dtype, size, library, obj, device_id, stream=None):
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.itemsize = dtype.itemsize
        self.size = size
        self.ndim = len(shape)
        self.library = library
        self.obj = obj
        self.device_id = device_id
        self.stream = stream
        self._nb = None
        self._base = None
        self._offset = 0
        self._layout = None

    @property
    def layout(self):
        """(dtype, ndim, C-contiguous): what of this array decides a kernel's
        compiled code. Memoised: workspace views are described once."""
        lay = self._layout
        if lay is None:
            lay = self._layout = (self.dtype, self.ndim, self.c_contiguous)
        return lay

    @property
    def byte_strides(self):
        isz = self.itemsize
        return tuple(s * isz for s in self.strides)

    @property
    def c_contiguous(self):
        return self.size <= 1 or _dense(reversed(self.shape), reversed(self.strides))

    @property
    def f_contiguous(self):
        return self.size <= 1 or _dense(self.shape, self.strides)

    @property
    def nbytes(self):
        return self.size * self.itemsize

    def view(self, dtype, shape=None, offset=0):
        """A C-contiguous typed view of this (contiguous) buffer's bytes
        ``[offset, offset + prod(shape) * dtype.itemsize)``; for carving a
        workspace into partials, flags and counters. ``shape`` defaults to
        as many items as fit. ``offset`` must be a multiple of the itemsize.
        """
        dtype = np.dtype(dtype)
        if not self.c_contiguous:
            raise ValueError("cufold: view() needs a contiguous buffer")
        total = self.nbytes
        if offset < 0 or offset % dtype.itemsize:
            raise ValueError("cufold: view offset %d is not a multiple of %d" % (offset, dtype.itemsize))
        if shape is None:
            shape = ((total - offset) // dtype.itemsize,)
        elif isinstance(shape, int):
            shape = (shape,)
        else:
            shape = tuple(int(s) for s in shape)
        size = _prod(shape)
        if offset + size * dtype.itemsize > total:
            raise ValueError("cufold: view of %d bytes at offset %d exceeds the buffer's %d bytes"
                             % (size * dtype.itemsize, offset, total))
        v = Arr(self.ptr + offset, shape, _c_strides(shape), dtype, size, self.library,
                None, self.device_id, self.stream)
        root = self._base if self._base is not None else self
        v._base = root
        v._offset = self._offset + offset
        return v

    def __repr__(self):
        return ("Arr(%s, ptr=0x%x, shape=%s, strides=%s, dtype=%s, device=%d)"
                % (self.library, self.ptr, self.shape, self.strides, self.dtype, self.device_id))



class Generated(Arr):
    """A generated input (``cufold.counting``, ``cufold.constant``): an array whose
    items a kernel computes from their index, so it holds no memory (``ptr`` 0,
    ``library`` ``"generated"``, 1-D of length ``n``). ``source`` is ``"counting"``
    (item ``i`` is ``param + i``) or ``"constant"`` (every item is ``param``); kernels
    receive ``param``, a NumPy scalar of ``dtype``, where an array would go."""

    __slots__ = ("source", "param")

    def __init__(self, source, n, param, dtype):
        n = int(n)
        if n < 0:
            raise ValueError("cufold: a generated input's length must be >= 0, got %d" % n)
        dt = np.dtype(dtype)
        super().__init__(0, (n,), (1,), dt, n, "generated", None, _current_device_id() if not SIMULATOR else 0)
        self.source = source
        self.param = dt.type(param)

    def signature(self):
        """What a Program depends on: all of it (the parameter is compiled into the launch)."""
        return ("generated", self.source, self.shape, self.dtype, self.param.tobytes())

    def __repr__(self):
        return "cufold.%s(%d, %r, dtype=%s)" % (self.source, self.size, self.param.item(), self.dtype)

    def __len__(self):
        return self.size


def first_stored(arrs):
    """The first of ``arrs`` (Arrs) that is not generated (``arrs[0]`` where all are):
    the array whose library, device and stream a call's results take."""
    for a in arrs:
        if a.library != "generated":
            return a
    return arrs[0]


# ---------------------------------------------------------------------------
# describe


def _elem_strides(byte_strides, itemsize, name):
    out = []
    for s in byte_strides:
        q, r = divmod(s, itemsize)
        if r:
            raise ValueError("cufold: %s has a byte stride %d that is not a multiple of its "
                             "itemsize %d" % (name, s, itemsize))
        out.append(q)
    return tuple(out)


# --- torch ------------------------------------------------------------------

_TORCH_TO_NP = {}
_NP_TO_TORCH = {}
_TORCH_DEVICES = {}
_torch = None


#: ``[torch.Tensor]`` once torch is in use (else ``[None]``): for exact-type checks.
TORCH_TENSOR = [None]


def _torch_init():
    global _torch
    if _torch is not None:
        return _torch
    import torch
    TORCH_TENSOR[0] = torch.Tensor
    pairs = [("bool", np.bool_), ("uint8", np.uint8), ("int8", np.int8), ("int16", np.int16),
             ("int32", np.int32), ("int64", np.int64), ("float16", np.float16),
             ("float32", np.float32), ("float64", np.float64), ("complex64", np.complex64),
             ("complex128", np.complex128), ("uint16", np.uint16), ("uint32", np.uint32),
             ("uint64", np.uint64)]
    for tname, nt in pairs:
        tt = getattr(torch, tname, None)
        if tt is not None:
            _TORCH_TO_NP[tt] = np.dtype(nt)
            _NP_TO_TORCH[np.dtype(nt)] = tt
    _torch = torch
    return torch


def _torch_device(index):
    d = _TORCH_DEVICES.get(index)
    if d is None:
        d = _TORCH_DEVICES[index] = _torch.device("cuda", index)
    return d


def _describe_torch(x, name, stream):
    dt = _TORCH_TO_NP.get(x.dtype)
    dev = x.get_device()  # -1 for CPU tensors
    if dt is None or dev < 0:
        return _torch_slow(x, name)
    if dt.kind == "c" and x.is_conj():
        raise ValueError("cufold: %s is a lazily conjugated torch tensor; call %s.resolve_conj() "
                         "first" % (name, name))
    return Arr(x.data_ptr(), x.shape, x.stride(), dt, x.numel(), "torch", x, dev)


def _torch_slow(x, name):
    if not x.is_cuda:
        raise TypeError(HOST_MESSAGE.format(name=name, kind="CPU torch.Tensor"))
    raise TypeError("cufold: %s has dtype %s, which cufold does not support (no NumPy "
                    "equivalent)" % (name, x.dtype))


# --- cupy -------------------------------------------------------------------

def _describe_cupy(x, name, stream):
    dt = x.dtype
    mem = x.data
    strides = x.strides
    isz = dt.itemsize
    if len(strides) == 1:
        s = strides[0]
        if s % isz:
            strides = _elem_strides(strides, isz, name)
        else:
            strides = (s // isz,)
    else:
        strides = _elem_strides(strides, isz, name)
    return Arr(mem.ptr, x.shape, strides, dt, x.size, "cupy", x, mem.device_id)


# --- numba ------------------------------------------------------------------

def _describe_numba(x, name, stream):
    dt = x.dtype
    gd = x.gpu_data
    if gd is None:
        ptr = 0
        dev = _current_device_id()
    else:
        ptr = int(gd.device_pointer)
        try:
            dev = gd.context.device.id
        except Exception:  # pragma: no cover - defensive
            dev = _current_device_id()
    return Arr(ptr, x.shape, _elem_strides(x.strides, dt.itemsize, name), dt, x.size,
               "numba", x, dev)


def _current_device_id():
    try:
        return cuda.get_current_device().id
    except Exception:  # pragma: no cover - defensive
        return 0


# --- simulator --------------------------------------------------------------

def _describe_sim(x, name, stream):
    a = x._ary
    dt = a.dtype
    return Arr(a.__array_interface__["data"][0], a.shape,
               _elem_strides(a.strides, dt.itemsize, name), dt, a.size, "sim", x, 0)


# --- generic: __cuda_array_interface__ ----------------------------------------

_TYPESTR = {}


def _typestr_dtype(ts):
    dt = _TYPESTR.get(ts)
    if dt is None:
        dt = _TYPESTR[ts] = np.dtype(ts)
    return dt


def _from_cai(x, name, cai, library):
    if cai.get("mask") is not None:
        raise TypeError("cufold: %s is a masked array (__cuda_array_interface__ mask); "
                        "masked arrays are not supported" % name)
    dt = _typestr_dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    bs = cai.get("strides")
    strides = _c_strides(shape) if bs is None else _elem_strides(bs, dt.itemsize, name)
    ptr = cai["data"][0] or 0
    s = cai.get("stream")
    dev = _pointer_device(ptr) if ptr else _current_device_id()
    return Arr(ptr, shape, strides, dt, _prod(shape), library, x, dev,
               None if s is None else int(s))


def _describe_cai(x, name, stream):
    return _from_cai(x, name, x.__cuda_array_interface__, "cai")


_dev_of_ptr_cache = {}


def _pointer_device(ptr):
    """CUDA ordinal owning ``ptr`` (cuPointerGetAttribute); 0 if unknown."""
    drv = _driver_lib()
    if drv is None:
        return 0
    val = ctypes.c_int(-1)
    # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
    rc = drv.cuPointerGetAttribute(ctypes.byref(val), 9, ctypes.c_uint64(ptr))
    return val.value if rc == 0 and val.value >= 0 else 0


_libcuda = False


def _driver_lib():
    global _libcuda
    if _libcuda is False:
        _libcuda = None
        if not SIMULATOR:
            for nm in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
                try:
                    _libcuda = ctypes.CDLL(nm)
                    break
                except OSError:
                    continue
    return _libcuda


# --- generic: DLPack -----------------------------------------------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13
_DL_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}

_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _describe_dlpack(x, name, stream, library="dlpack"):
    try:
        dev_type, dev_id = x.__dlpack_device__()
    except Exception:
        dev_type, dev_id = _kDLCUDA, None
    if dev_type in (_kDLCPU, _kDLCUDAHost):
        raise TypeError(HOST_MESSAGE.format(name=name, kind=type(x).__name__))
    if dev_type not in (_kDLCUDA, _kDLCUDAManaged):
        raise TypeError("cufold: %s lives on DLPack device type %d, not a CUDA GPU" % (name, dev_type))
    # DLPack streams: None / 1 = legacy default, 2 = per-thread default, else a handle.
    s = None if stream is None else (1 if stream == 0 else stream)
    try:
        cap = x.__dlpack__(stream=s) if s is not None else x.__dlpack__()
    except TypeError:
        cap = x.__dlpack__()
    p = _capsule_get(cap, b"dltensor")
    if not p:
        raise TypeError("cufold: could not read the DLPack capsule of %s" % name)
    t = _DLTensor.from_address(p)
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    kind = _DL_KINDS.get(code)
    if kind is None or lanes != 1:
        raise TypeError("cufold: %s has a DLPack dtype (code %d, %d bits) that cufold does not "
                        "support" % (name, code, bits))
    dt = np.dtype("?") if kind == "b" else np.dtype("%s%d" % (kind, bits // 8))
    nd = t.ndim
    shape = tuple(t.shape[i] for i in range(nd))
    strides = tuple(t.strides[i] for i in range(nd)) if t.strides else _c_strides(shape)
    ptr = (t.data or 0) + t.byte_offset
    dev = t.device.device_id if dev_id is None else dev_id
    del t, cap  # the capsule's deleter releases the export; ``x`` keeps the memory
    return Arr(ptr, shape, strides, dt, _prod(shape), library, x, dev)


def _describe_jax(x, name, stream):
    return _describe_dlpack(x, name, stream, "jax")


# --- classification -------------------------------------------------------------

_FAST = {}          # exact type -> describer
_FAST_LOCK = threading.Lock()


def _classify(t, x, name):
    mod = t.__module__ or ""
    root = mod.split(".", 1)[0]
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        if isinstance(x, FakeCUDAArray):
            return _describe_sim
    if root == "torch" or ("torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor)):
        _torch_init()
        return _describe_torch
    if root == "cupy" or ("cupy" in sys.modules and isinstance(x, sys.modules["cupy"].ndarray)):
        return _describe_cupy
    if root in ("jax", "jaxlib") or ("jax" in sys.modules and isinstance(x, sys.modules["jax"].Array)):
        return _describe_jax
    if not SIMULATOR and root in ("numba", "numba_cuda"):
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
        if isinstance(x, DeviceNDArray):
            return _describe_numba
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        return None
    if hasattr(x, "__cuda_array_interface__"):
        return _describe_cai
    if hasattr(x, "__dlpack__"):
        return _describe_dlpack
    return None


def _is_host(x):
    return (isinstance(x, (np.ndarray, np.generic, list, tuple, int, float, complex, bool,
                           memoryview, bytes, bytearray))
            or hasattr(x, "__array_interface__") or hasattr(x, "__array__"))


def describe(x, name="x", stream=None):
    """Describe a device array (see :class:`Arr`).

    ``stream`` (a raw handle) matters only for DLPack inputs (JAX): the
    producer is asked to make the data ready on that stream. Raises
    ``TypeError`` for host arrays (with a hint how to move them) and for
    unsupported objects.
    """
    f = _FAST.get(x.__class__)
    if f is not None:
        return f(x, name, stream)
    if isinstance(x, Arr):
        return x
    t = x.__class__
    f = _classify(t, x, name)
    if f is None:
        if _is_host(x):
            kind = "NumPy" if isinstance(x, (np.ndarray, np.generic)) else t.__name__
            raise TypeError(HOST_MESSAGE.format(name=name, kind=kind))
        raise TypeError(
            "cufold: %s must be a CUDA device array (CuPy, PyTorch, Numba, JAX, or an object "
            "with __cuda_array_interface__ or __dlpack__); got %s.%s"
            % (name, t.__module__, t.__qualname__))
    with _FAST_LOCK:
        _FAST[t] = f
    return f(x, name, stream)


def same_device(arrs, name="x"):
    """The common device ordinal of ``arrs``; ValueError if they differ."""
    dev = arrs[0].device_id
    for a in arrs:
        if a.device_id != dev:
            raise ValueError("cufold: %s lives on several GPUs (devices %s); put all arrays on one "
                             "device" % (name, sorted({b.device_id for b in arrs})))
    return dev


def describe_many(xs, name="x", stream=None):
    """Describe a tuple-valued input: a tuple (or list) of equally long arrays
    on one device. A single array is accepted as a 1-tuple."""
    if not isinstance(xs, (tuple, list)):
        return (describe(xs, name, stream),)
    if not xs:
        raise ValueError("cufold: %s is an empty tuple of arrays" % name)
    arrs = tuple(describe(x, "%s[%d]" % (name, i), stream) for i, x in enumerate(xs))
    shape = arrs[0].shape
    for a in arrs:
        if a.shape != shape:
            if any(b.__class__ is Generated for b in arrs):
                raise ValueError("cufold: the arrays of %s must be equally long; generated inputs (counting, "
                                 "constant) are 1-D, so the arrays zipped with them must be too; got shapes %s"
                                 % (name, ", ".join(str(b.shape) for b in arrs)))
            raise ValueError(
                "cufold: the arrays of %s must be equally long; got lengths %s"
                % (name, ", ".join(str(b.shape[0] if b.ndim == 1 else b.shape) for b in arrs)))
    same_device(arrs, name)
    return arrs


# ---------------------------------------------------------------------------
# allocation


def _np_dtype(dtype):
    dt = _NPDT.get(dtype)
    if dt is None:
        dt = np.dtype(dtype)
        try:
            _NPDT[dtype] = dt
        except TypeError:  # unhashable
            pass
    return dt


_NPDT = {}


def _torch_raw_stream(dev):
    try:
        return _torch._C._cuda_getCurrentRawStream(dev)
    except Exception:  # pragma: no cover - older / newer torch
        return _torch.cuda.current_stream(dev).cuda_stream


def _empty_torch(like, shape, dt, stream):
    tdt = _NP_TO_TORCH.get(dt)
    if tdt is None:
        raise TypeError("cufold: torch has no dtype for %s" % dt)
    dev = like.device_id
    src = like.obj
    if stream is not None and stream != _torch_raw_stream(dev):
        # Allocate on the launch stream: torch's caching allocator is stream-ordered.
        with _torch.cuda.stream(_torch.cuda.ExternalStream(stream, device=_torch_device(dev))):
            t = _torch.empty(shape, dtype=tdt, device=_torch_device(dev))
    elif src is not None and src.__class__ is _torch.Tensor:
        t = src.new_empty(shape, dtype=tdt)  # same device; cheaper than torch.empty(device=)
    else:
        t = _torch.empty(shape, dtype=tdt, device=_torch_device(dev))
    if shape:
        return t, Arr(t.data_ptr(), shape, _c_strides(shape), dt, _prod(shape), "torch", t, dev)
    return t, Arr(t.data_ptr(), _EMPTY, _EMPTY, dt, 1, "torch", t, dev)


_cupy = None


def _empty_cupy(like, shape, dt, stream):
    global _cupy
    cp = _cupy
    if cp is None:
        import cupy as cp
        _cupy = cp
    dev = like.device_id
    ctx = None
    if cp.cuda.runtime.getDevice() != dev:
        ctx = cp.cuda.Device(dev)
        ctx.__enter__()
    try:
        if stream is not None and stream != cp.cuda.get_current_stream().ptr:
            with cp.cuda.ExternalStream(stream):
                a = cp.empty(shape, dtype=dt)
        else:
            a = cp.empty(shape, dtype=dt)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return a, Arr(a.data.ptr, a.shape, _c_strides(shape), dt, a.size, "cupy", a, dev)


_ngpus = None


def _numba_ctx(dev):
    """A context manager making ``dev`` Numba's current device (or None when
    it already is, or the machine has one GPU)."""
    global _ngpus
    if _ngpus is None:
        _ngpus = len(cuda.gpus)
    if _ngpus == 1 or cuda.get_current_device().id == dev:
        return None
    return cuda.gpus[dev]


def _empty_numba(like, shape, dt, stream):
    dev = like.device_id
    g = _numba_ctx(dev)
    if g is None:
        a = cuda.device_array(shape, dtype=dt)
    else:
        with g:
            a = cuda.device_array(shape, dtype=dt)
    gd = a.gpu_data
    ptr = 0 if gd is None else int(gd.device_pointer)
    return a, Arr(ptr, a.shape, _c_strides(shape), dt, a.size, "numba", a, dev)


def _empty_sim(like, shape, dt, stream):
    a = cuda.device_array(shape, dtype=dt)
    return a, _describe_sim(a, "out", None)


def _empty_jax(like, shape, dt, stream):
    # JAX arrays are immutable: allocate through a mutable library and hand the
    # result over with to_library() after the launch (zero-copy DLPack).
    for lib, fn in (("cupy", _empty_cupy), ("torch", _empty_torch)):
        try:
            if lib == "torch":
                _torch_init()
            else:
                import cupy  # noqa: F401
        except ImportError:
            continue
        obj, a = fn(_Like(like.device_id), shape, dt, stream)
        a.library = "jax"
        return obj, a
    raise TypeError("cufold: results for JAX inputs are allocated through CuPy or PyTorch "
                    "(and handed to JAX with DLPack); install either")


class _Like:
    __slots__ = ("device_id", "obj")

    def __init__(self, device_id):
        self.device_id = device_id
        self.obj = None


_EMPTY_BY_LIB = {"torch": _empty_torch, "cupy": _empty_cupy, "numba": _empty_numba,
                 "generated": _empty_sim if SIMULATOR else _empty_numba,
                 "sim": _empty_sim, "jax": _empty_jax, "cai": _empty_numba, "dlpack": _empty_numba}


def empty(like, shape, dtype, stream=None):
    """Allocate an uninitialised C-contiguous array of ``shape`` (``()`` for a
    0-d result) and ``dtype`` in the library of ``like`` (an :class:`Arr`) on
    its device; returns ``(obj, Arr)``.

    Generic ``__cuda_array_interface__`` / DLPack inputs get a Numba device
    array. JAX inputs get a CuPy (else PyTorch) array whose :class:`Arr` says
    ``library='jax'``: launch into it, then call :func:`to_library` to hand a
    JAX array back. ``stream`` (raw handle): for torch and cupy the memory is
    allocated stream-ordered on it when it is not the library's current stream.
    """
    if shape.__class__ is not tuple:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return _EMPTY_BY_LIB[like.library](like, shape, _np_dtype(dtype), stream)


def shell(a, dtype=None, shape=None):
    """A descriptor of ``a``'s shape, strides, library and device (and
    ``dtype``, default ``a``'s; ``shape``, C-contiguous, default ``a``'s) that
    points nowhere (``ptr`` 0) and holds no array: what a bound launch keeps of
    an argument whose pointer it is given on every call, so that caching the
    launch does not keep the caller's first array alive."""
    dt = a.dtype if dtype is None else _np_dtype(dtype)
    if shape is None:
        return Arr(0, a.shape, a.strides, dt, a.size, a.library, None, a.device_id, a.stream)
    shape = tuple(shape)
    return Arr(0, shape, _c_strides(shape), dt, _prod(shape), a.library, None, a.device_id, a.stream)


def allocator(like, shape, dtype, stream=None):
    """``alloc(obj) -> (new array, its device pointer)``: a new C-contiguous array
    of ``shape`` and ``dtype`` in the library of ``like`` (an :class:`Arr`), on its
    device, stream-ordered on ``stream`` (a raw handle; None: the library's current
    stream), where ``obj`` is this call's input of that library (the same device):
    the per-call allocation of the Programs, for which :func:`empty`'s generality
    costs microseconds (torch on its current stream: ``obj.new_empty`` or
    ``torch.empty_like``, not ``torch.empty(device=)``). ``like``'s own array is
    not kept."""
    dt = _np_dtype(dtype)
    shape = tuple(shape)
    if like.library == "torch" and stream is None:
        tdt = _NP_TO_TORCH.get(dt)
        if tdt is None:
            raise TypeError("cufold: torch has no dtype for %s" % dt)
        if dt == like.dtype and like.shape == shape and like.c_contiguous:
            empty_like = _torch.empty_like        # the cheapest allocation torch has from Python

            def alloc_like(obj):
                t = empty_like(obj)
                return t, t.data_ptr()

            return alloc_like

        def alloc_torch(obj):
            t = obj.new_empty(shape, dtype=tdt)
            return t, t.data_ptr()

        return alloc_torch
    home, make = shell(like), _EMPTY_BY_LIB[like.library]

    def alloc(obj):
        got, a = make(home, shape, dt, stream)
        return got, a.ptr

    return alloc


#: Small torch results are carved from batch allocations (see :func:`small_results`):
#: a batch holds at most SMALL_BATCH results and at most SMALL_BATCH_BYTES, and results
#: of up to SMALL_RESULT_BYTES are carved. A refill costs about 30 us on an H200 host, so a
#: batch must hold many results: with 32 KiB, 4 KiB results (1024 floats) came 8 a batch
#: and cost 4 us each; ``sum(axis=1)`` of (1024, 1024) took 20.8 us a call, 15.3 with
#: 128 KiB (32 a batch), 14.8 with 256 KiB (torch 12.3; tools/host_costs.py).
SMALL_BATCH = 256
SMALL_BATCH_BYTES = 1 << 17
SMALL_RESULT_BYTES = 1 << 12
_small_pools = {}
_small_lock = threading.Lock()


def carves(like, shape, dtype):
    """Whether :func:`small_results` carves results of ``shape`` and ``dtype`` for
    arrays like ``like`` (torch results of at most SMALL_RESULT_BYTES)."""
    return like.library == "torch" and 0 < _prod(shape) * _np_dtype(dtype).itemsize <= SMALL_RESULT_BYTES


def small_results(like, shape, dtype, stream):
    """``take() -> (result, pointer)``: a new C-contiguous torch tensor of ``shape``
    and ``dtype`` on ``like``'s device, and its device pointer, per call (where
    :func:`carves` says so).

    Allocation from Python costs torch 2-3 us, as much as the kernel launch of a
    small reduction, so small results are carved from batches: one ``torch.empty``
    per (device, stream, dtype, shape) for many results, split with ``unbind`` into
    tensors handed out one per call (about 1.2 us each, against 2.3-2.9 us for
    ``new_empty``). Each is an ordinary tensor of its own elements: a view that
    keeps its batch's storage (at most SMALL_BATCH_BYTES) alive, so saving one with
    ``torch.save`` writes the batch too. Results are 16-byte aligned (0-d ones
    excepted), as kernels storing vectors expect; the batch is stream-ordered on
    ``stream`` (the current stream, raw handle), as a single allocation would be.
    """
    dtype = _np_dtype(dtype)
    shape = tuple(shape)
    size, isz = _prod(shape), dtype.itemsize
    # slots of whole 16-byte units (0-d results: one element each)
    slot = size if not shape else -(-size * isz // 16) * 16 // isz
    count = max(1, min(SMALL_BATCH, SMALL_BATCH_BYTES // max(slot * isz, 1)))
    key = (like.device_id, stream, dtype, shape)
    with _small_lock:
        pool = _small_pools.get(key)
        if pool is None:
            pool = _small_pools[key] = []
    pop, home = pool.pop, shell(like)

    def refill():
        with _small_lock:
            if not pool:
                batch, a = _empty_torch(home, (count * slot,), dtype, stream)
                if shape:
                    batch = batch.view(count, slot)[:, :size].view((count,) + shape)
                got = list(zip(batch.unbind(0), range(a.ptr, a.ptr + count * slot * isz, slot * isz)))
                got.reverse()
                pool.extend(got)
            return pop()

    def take():
        try:
            return pop()
        except IndexError:
            return refill()

    return take


def rebase(a, ptr):
    """Descriptor ``a`` moved to device pointer ``ptr`` (same shape, strides,
    library): how a bare pointer handed to a bound launch is described again
    where the launch falls back to the general path. In the simulator ``ptr``
    must be a simulated array's address (``Arr.ptr`` of one)."""
    if ptr == a.ptr:
        return a
    v = Arr(ptr, a.shape, a.strides, a.dtype, a.size, a.library, None, a.device_id, a.stream)
    if SIMULATOR:
        v._nb = _sim_view(ptr, a.shape, a.strides, a.dtype, None)
    return v


def to_library(obj, like):
    """The object to return to the user for an output made by :func:`empty`:
    ``obj`` itself, except for JAX, which gets a JAX array (zero-copy DLPack;
    call it after the kernel was launched on the stream the output library
    considers current)."""
    if like.library != "jax":
        return obj
    import jax.dlpack
    return jax.dlpack.from_dlpack(obj)


# ---------------------------------------------------------------------------
# streams

_STREAM_OF = {}  # exact type of a stream object -> handle extractor


def _stream_from_obj(s):
    t = s.__class__
    f = _STREAM_OF.get(t)
    if f is None:
        f = _stream_extractor(s)
        _STREAM_OF[t] = f
    return f(s)


def _numba_stream_handle(s):
    h = s.handle
    v = getattr(h, "value", None)
    if v is not None or h is None:
        return v or 0
    return int(h)


def _stream_extractor(s):
    if hasattr(s, "cuda_stream"):            # torch.cuda.Stream / ExternalStream
        return lambda s: s.cuda_stream
    mod = (s.__class__.__module__ or "").split(".", 1)[0]
    if mod == "cupy" and hasattr(s, "ptr"):  # cupy.cuda.Stream / ExternalStream
        return lambda s: s.ptr
    if hasattr(s, "__cuda_stream__"):        # cuda.core Stream, numba Stream, ...
        return lambda s: int(s.__cuda_stream__()[1])
    if hasattr(s, "handle"):                 # older numba streams
        return _numba_stream_handle
    if SIMULATOR:                            # the simulator's stream objects
        from numba.cuda.simulator.api import stream as _sim_stream
        if isinstance(s, _sim_stream):
            return lambda s: 0
    try:
        int(s)
    except Exception:
        raise TypeError("cufold: stream= takes a torch, CuPy, Numba or cuda.core stream, or a raw "
                        "CUstream handle (int); got %s" % type(s).__name__) from None
    return int


def _cupy_current(dev):
    cp = _cupy
    if cp is None:
        import cupy as cp
    try:
        return cp.cuda.get_current_stream(dev).ptr
    except TypeError:  # pragma: no cover - older cupy without device argument
        return cp.cuda.get_current_stream().ptr


_events = threading.local()


def _order_after(producer, consumer, device_id):
    """Make ``consumer`` wait (on the device) for work queued so far on ``producer``."""
    if SIMULATOR or producer == consumer:
        return
    from cuda.bindings import driver as drv
    ev = getattr(_events, "ev", None)
    if ev is None:
        err, ev = drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        if int(err):
            raise RuntimeError("cufold: cuEventCreate failed (%s)" % err)
        _events.ev = ev
    (err,) = drv.cuEventRecord(ev, producer)
    if int(err) == 0:
        (err,) = drv.cuStreamWaitEvent(consumer, ev, 0)
    if int(err):
        raise RuntimeError("cufold: could not order stream %#x after %#x (%s)" % (consumer, producer, err))


def stream_handle(like, stream=None):
    """The raw ``CUstream`` (int) to launch on for input(s) ``like`` (an
    :class:`Arr` or a tuple of them).

    ``stream`` may be a torch / CuPy / Numba / cuda.core stream object or an
    int handle. Without it: torch's current stream on the input's device,
    CuPy's current stream, the producer's stream declared through
    ``__cuda_array_interface__``, else 0 (the legacy default stream).
    When an input declared a producer stream other than the chosen one, the
    chosen stream is ordered after it on the device (no host sync).
    """
    first = like[0] if like.__class__ is tuple else like
    if first.library == "generated" and like.__class__ is tuple:
        first = first_stored(like)
    if stream is None:
        lib = first.library
        if lib == "torch":
            h = _torch_raw_stream(first.device_id)
        elif lib == "cupy":
            h = _cupy_current(first.device_id)
        elif first.stream is not None:
            h = first.stream
        else:
            h = 0
    elif stream.__class__ is int:
        h = stream
    else:
        h = _stream_from_obj(stream)
    if like.__class__ is tuple:
        for a in like:
            if a.stream is not None and a.stream != h:
                _order_after(a.stream, h, a.device_id)
    elif first.stream is not None and first.stream != h:
        _order_after(first.stream, h, first.device_id)
    return h


# ---------------------------------------------------------------------------
# Numba views


def as_numba(arr):
    """A Numba device array over the same memory as ``arr`` (the simulator's
    array itself in the simulator). Cached on the descriptor."""
    nb = arr._nb
    if nb is not None:
        return nb
    if arr._base is not None:
        nb = _view_numba(arr)
    elif arr.library in ("numba", "sim") and arr.obj is not None:
        nb = arr.obj
    else:   # foreign memory, or a descriptor made from a bare pointer (rebase)
        desc = {
            "shape": tuple(arr.shape),
            "strides": arr.byte_strides,
            "typestr": arr.dtype.str,
            "data": (arr.ptr, False),
            "version": 3,
        }
        g = _numba_ctx(arr.device_id)
        if g is None:
            nb = cuda.from_cuda_array_interface(desc, owner=arr.obj, sync=False)
        else:
            with g:
                nb = cuda.from_cuda_array_interface(desc, owner=arr.obj, sync=False)
    arr._nb = nb
    return nb


def window(arr, offset, shape, strides):
    """A descriptor of other elements of ``arr``'s memory: element ``offset``
    from ``arr``'s element 0, with ``shape`` and element ``strides`` (which may
    reach outside ``arr``'s own view, within the memory it belongs to). For
    the axis reductions' flat extents, rows and single result elements."""
    shape, strides = tuple(shape), tuple(strides)
    size = _prod(shape)
    v = Arr(arr.ptr + offset * arr.itemsize, shape, strides, arr.dtype, size, arr.library, None,
            arr.device_id, arr.stream)
    if SIMULATOR and (arr.obj is not None or arr._nb is not None or arr._base is not None):
        # The simulator's memory is host memory: address the window directly. (Not for
        # a Program's placeholders, which point nowhere until a call rebases them.)
        v._nb = _sim_view(v.ptr, shape, strides, arr.dtype, as_numba(arr)._ary)
    return v


def _sim_view(ptr, shape, strides, dtype, owner):
    """A simulator array over host memory at ``ptr`` with ``shape`` and element
    ``strides`` (negative ones too); ``owner`` (kept alive with it) holds the memory."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    isz = dtype.itemsize
    size = _prod(shape)
    lo = sum(min(0, (n - 1) * st) for n, st in zip(shape, strides)) if size else 0
    hi = sum(max(0, (n - 1) * st) for n, st in zip(shape, strides)) + 1 if size else 1
    mem = (ctypes.c_byte * ((hi - lo) * isz)).from_address(ptr + lo * isz)
    typed = np.frombuffer(mem, dtype=dtype)[-lo:]
    raw = np.lib.stride_tricks.as_strided(typed, shape=shape, strides=tuple(st * isz for st in strides))
    fake = FakeCUDAArray(raw)
    fake._cufold_owner = owner
    return fake


def _view_numba(arr):
    base = as_numba(arr._base)
    off, n = arr._offset, arr.size * arr.itemsize
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        raw = base._ary.reshape(-1).view(np.uint8)[off:off + n]
        return FakeCUDAArray(raw.view(arr.dtype).reshape(arr.shape))
    desc = {
        "shape": tuple(arr.shape),
        "strides": None,
        "typestr": arr.dtype.str,
        "data": (arr.ptr, False),
        "version": 3,
    }
    g = _numba_ctx(arr.device_id)
    if g is None:
        return cuda.from_cuda_array_interface(desc, owner=base, sync=False)
    with g:
        return cuda.from_cuda_array_interface(desc, owner=base, sync=False)
