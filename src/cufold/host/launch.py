"""One launch path for cufold's compiled kernels.

Numba's dispatcher costs 14-27 us of host time per launch (typing the
arguments, wrapping foreign arrays, building a launch configuration). cufold
instead launches the compiled function directly: a :class:`Kernel` compiles
once per device (or loads its cubin from the disk cache), and each launch
writes the few changing kernel-parameter fields into a buffer that was laid
out once per kernel, then calls ``cuLaunchKernel``.

Under Numba's CPU simulator (``NUMBA_ENABLE_CUDASIM=1``), and whenever the
direct path is unavailable or switched off (``CUFOLD_LAUNCH=numba`` or
``cufold.host.launch.DIRECT = False``), the same :meth:`Kernel.launch` goes
through the Numba dispatcher: ``dispatcher[grid, block, stream, shared](*views)``.

Kernel parameter ABI (Numba's ``_Kernel._prepare_args``; every field is its
own kernel parameter, so each gets its own 8-byte slot and ``void*``):

* array of ``ndim`` d: ``meminfo, parent, nitems, itemsize, data,
  shape[0..d), strides[0..d)`` (bytes), all 64-bit;
* integer: its own width; ``boolean``: 1 byte; ``float16``: 2 bytes (bits);
  ``float32``/``float64``; ``complex64``/``complex128``: two fields (real, imag);
* tuples (``UniTuple``/``Tuple``): their members in order, flattened.

Public API
----------
``Kernel(py_func, signature, key=None, disk_key=None, name=None, **jit_options)``
``Kernel.launch(grid, block, stream, shared_bytes, *args)``
``Kernel.bind(grid, block, stream, shared_bytes, args, vary) -> go(*new)`` (a call
made again and again with a new input and output: only their fields are written)
``get_kernel(key, factory, disk_key=None, **jit_options) -> Kernel``
``workspace(device_id, stream, nbytes) -> (ptr, Arr)``
``kept_zeros(purpose, device_id, stream, nbytes) -> Arr`` (zeros the kernels leave zero)
``BoundedCache(limit)`` (the per-call caches' dict: bounded, ``get`` / ``put``)
``clear_workspaces()``
``nvtx_range(name)``
``DIRECT`` (module flag; ``CUFOLD_LAUNCH=direct|numba``), ``LAUNCH_API``
(``CUFOLD_LAUNCH_API=auto|bindings|ctypes|compiled``), ``CHECK_CONTEXT``
(``CUFOLD_CHECK_CONTEXT=1|0``), ``NVTX`` (whether ranges are emitted; the
``nvtx`` package, ``CUFOLD_NVTX=0`` switches them off), ``cache_dir()``
(``CUFOLD_CACHE_DIR``; ``CUFOLD_CACHE=0`` disables the disk cache),
``library_disk_key(key)`` (the disk-cache text of a cufold kernel, with a
user's operator where its fingerprint pins it down; on unless ``CUFOLD_CACHE=0``).
``CUFOLD_LTO=0|1``: link-time optimisation off or on for every kernel (each kernel's
factory chooses otherwise, through its ``jit_options``).

Measured on an H200 (tools/gpu_launch_smoke.py, since removed; median of 2000 calls):
cuda.bindings' cuLaunchKernel 3.0 us, ctypes' 3.9 us; ``Kernel.launch`` with
described arguments 3.8 us; Numba's dispatcher 17.5 us (24 us with torch
tensors).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import hashlib
import os
import struct
import sys
import threading
import warnings

import numpy as np
from numba import config, cuda
from numba import types as nbtypes
from numba.np.numpy_support import from_dtype

from . import arrays as _arrays
from .arrays import Arr, as_numba

__all__ = ["Kernel", "get_kernel", "workspace", "kept_zeros", "clear_workspaces", "nvtx_range", "DIRECT",
           "NVTX", "LAUNCH_API", "CHECK_CONTEXT", "cache_dir", "LaunchError"]

SIMULATOR = bool(config.ENABLE_CUDASIM)

try:
    # os.environ.get costs ~0.5 us, a tenth of a small call: tuning knobs are
    # read from the mapping behind it (kept in step by os.environ, and so by
    # pytest's monkeypatch) directly.
    _ENV, _ENCODE, _ENCODED = os.environ._data, os.environ.encodekey, {}

    def knob(name):
        """Environment variable ``name`` (a tuning knob), raw, or None; cheap."""
        key = _ENCODED.get(name)
        if key is None:
            key = _ENCODED[name] = _ENCODE(name)
        return _ENV.get(key)
except AttributeError:  # pragma: no cover - another Python's os.environ
    def knob(name):
        """Environment variable ``name`` (a tuning knob), or None."""
        return os.environ.get(name)

#: Launch through cuLaunchKernel with pre-packed arguments (True), or through
#: Numba's dispatcher (False). ``CUFOLD_LAUNCH=numba|direct`` sets the default.
#: The simulator always uses the dispatcher.
def _direct_from_env(value):
    v = (value or "direct").strip().lower()
    if v not in ("direct", "numba"):
        warnings.warn("cufold: CUFOLD_LAUNCH=%r is neither 'direct' nor 'numba'; using direct" % value)
    return v != "numba"


DIRECT = _direct_from_env(os.environ.get("CUFOLD_LAUNCH"))

ABI_VERSION = "cufold-launch-1"


#: In the simulator a launch has about this many tiles at most (see :func:`simulator_tile`).
SIMULATOR_TILES = 32
SIMULATOR_MAX_VT = 512


def simulator_tile(tile, n):
    """The simulator's ``tile`` (a namedtuple with ``nt`` and ``vt``) for ``n`` items:
    as given while ``n`` spans at most :data:`SIMULATOR_TILES` tiles, else with the
    items per thread doubled until it does (up to :data:`SIMULATOR_MAX_VT`).

    Tiny tiles let small test inputs cross tile boundaries; on large inputs a
    simulated tile costs its barriers and shuffles (a Python thread switch for every
    lane at each), whatever its items, so fewer, fuller tiles run as fast as the
    items allow. Used only under the simulator; a GPU's tiles are its own."""
    vt = tile.vt
    while n > SIMULATOR_TILES * tile.nt * vt and vt < SIMULATOR_MAX_VT:
        vt *= 2
    return tile if vt == tile.vt else tile._replace(vt=vt)


class BoundedCache(dict):
    """Things made on first use under keys of open-ended variety (lengths, streams,
    users' operators): past ``limit`` entries it starts again empty, so its memory
    stays bounded whatever callers pass. Hot paths read it with the plain ``get``
    and add what they made with :meth:`put`."""

    __slots__ = ("limit",)

    def __init__(self, limit):
        super().__init__()
        self.limit = limit

    def put(self, key, value):
        """``self[key] = value`` (after emptying a full cache); returns ``value``."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value


class LaunchError(RuntimeError):
    """A kernel launch failed in the driver."""


class _NoDirect(Exception):
    """This kernel cannot take the direct path (reason in args[0])."""


# ---------------------------------------------------------------------------
# NVTX

NVTX = False
_nvtx_annotate = None
if os.environ.get("CUFOLD_NVTX", "1") != "0":
    try:  # the `nvtx` package (pip install nvtx); absent -> no-op ranges
        import nvtx as _nvtx_mod
        _nvtx_annotate = _nvtx_mod.annotate
        NVTX = True
    except Exception:  # ImportError, or a broken install
        _nvtx_annotate = None

_NULL_CM = contextlib.nullcontext()


def nvtx_range(name):
    """A context manager: an NVTX range ``name`` (domain ``cufold``) when the
    ``nvtx`` package is importable, else a shared no-op."""
    if _nvtx_annotate is None:
        return _NULL_CM
    return _nvtx_annotate(name, domain="cufold")


# ---------------------------------------------------------------------------
# argument layout


_INT_CODES = {(8, True): "b", (8, False): "B", (16, True): "h", (16, False): "H",
              (32, True): "i", (32, False): "I", (64, True): "q", (64, False): "Q"}
_FIELD = 8  # every parameter gets its own 8-byte slot


def _pad(code):
    n = struct.calcsize("=" + code)
    return (code + "%dx" % (_FIELD - n) if n < _FIELD else code), n


class _Plan:
    """How a signature flattens into kernel parameters, as generated source."""

    def __init__(self, signature):
        self.signature = tuple(signature)
        self.codes = []        # struct codes (each parameter padded to an 8-byte slot)
        self.sizes = []        # the parameters' own byte sizes, in order
        self.values = []       # Python expressions, one per written parameter
        self.lines = []        # source lines: bind locals, validate the arguments
        self.env = {}
        self.first_array = None
        self.supported = True
        self.reason = ""
        self._n = 0
        self.arg_slots = []    # the first parameter slot of each argument
        for i, ty in enumerate(self.signature):
            self.arg_slots.append(len(self.sizes))
            self._arg(ty, "a%d" % i, "argument %d" % i)

    def _tmp(self):
        self._n += 1
        return "_v%d" % self._n

    def _arg(self, ty, expr, what):
        if isinstance(ty, nbtypes.Array):
            self._array(ty, expr, what)
        elif isinstance(ty, nbtypes.BaseTuple):
            t = self._tmp()
            self.lines.append("%s = %s" % (t, expr))
            self.lines.append("if len(%s) != %d: _bad_tuple(%r, %s, %d)" % (t, len(ty), what, t, len(ty)))
            for j, sub in enumerate(ty):
                s = self._tmp()
                self.lines.append("%s = %s[%d]" % (s, t, j))
                self._arg(sub, s, "%s[%d]" % (what, j))
        elif isinstance(ty, nbtypes.Boolean):
            self._field("?", "%s" % expr)
        elif isinstance(ty, nbtypes.Integer):
            self._field(_INT_CODES[(ty.bitwidth, ty.signed)], expr)
        elif ty == nbtypes.float16:
            self._field("e", expr)
        elif ty == nbtypes.float32:
            self._field("f", expr)
        elif ty == nbtypes.float64:
            self._field("d", expr)
        elif ty == nbtypes.complex64:
            self._field("f", "%s.real" % expr)
            self._field("f", "%s.imag" % expr)
        elif ty == nbtypes.complex128:
            self._field("d", "%s.real" % expr)
            self._field("d", "%s.imag" % expr)
        elif isinstance(ty, (nbtypes.CPointer, nbtypes.RawPointer)) or ty == nbtypes.voidptr:
            self._field("Q", expr)
        else:
            self.supported = False
            self.reason = "argument type %s is not supported by the direct launch path" % ty
            self._field("Q", "0")

    def _field(self, code, expr):
        padded, size = _pad(code)
        self.codes.append(padded)
        self.sizes.append(size)
        self.values.append(expr)

    def _array(self, ty, expr, what):
        from numba.np.numpy_support import as_dtype
        dt = np.dtype(as_dtype(ty.dtype))
        nd = ty.ndim
        isz = dt.itemsize
        dname = "_D%d" % len(self.env)
        self.env[dname] = dt
        if self.first_array is None:
            self.first_array = expr
        self.lines.append(
            "if %s.__class__ is not _Arr or (%s.dtype is not %s and %s.dtype != %s) or %s.ndim != %d: "
            "_bad_array(%r, %s, %s, %d)" % (expr, expr, dname, expr, dname, expr, nd, what, expr, dname, nd))
        if ty.layout == "C":
            self.lines.append("if not %s.c_contiguous: _bad_layout(%r, %s, 'C')" % (expr, what, expr))
        elif ty.layout == "F":
            self.lines.append("if not %s.f_contiguous: _bad_layout(%r, %s, 'F')" % (expr, what, expr))
        self.codes.append("16x")      # meminfo, parent: NULL
        self.sizes += [8, 8]
        self._field("q", "%s.size" % expr)
        self._field("q", str(isz))
        self._field("Q", "%s.ptr" % expr)
        if nd:
            sh, st = self._tmp(), self._tmp()
            self.lines.append("%s = %s.shape" % (sh, expr))
            self.lines.append("%s = %s.strides" % (st, expr))
            for k in range(nd):
                self._field("q", "%s[%d]" % (sh, k))
            for k in range(nd):
                self._field("q", "%s[%d] * %d" % (st, k, isz) if isz != 1 else "%s[%d]" % (st, k))

    @property
    def fmt(self):
        return "=" + "".join(self.codes)

    @property
    def nparams(self):
        return len(self.sizes)

    def param_sizes(self):
        """Byte size of each kernel parameter, in order (for ABI checks)."""
        return list(self.sizes)

    def build_packer(self, buf):
        """``pack(*args) -> device_id``: validate, write all fields into ``buf``."""
        nargs = len(self.signature)
        params = ", ".join("a%d" % i for i in range(nargs))
        lines = ["def pack(%s):" % params]
        lines += ["    " + ln for ln in self.lines]
        vals = ", ".join(self.values)
        lines.append("    _pack_into(_buf, 0%s)" % ((", " + vals) if vals else ""))
        lines.append("    return %s" % ("%s.device_id" % self.first_array if self.first_array else "0"))
        src = "\n".join(lines) + "\n"
        env = dict(self.env)
        env.update(_pack_into=struct.Struct(self.fmt).pack_into, _buf=buf, _Arr=Arr, _bad_array=_bad_array,
                   _bad_layout=_bad_layout, _bad_tuple=_bad_tuple)
        exec(compile(src, "<cufold-packer>", "exec"), env)
        fn = env["pack"]
        fn.source = src
        return fn


def _bad_array(what, a, dt, nd):
    if not isinstance(a, Arr):
        raise TypeError("cufold: kernel %s must be an Arr descriptor (cufold.host.arrays.describe); "
                        "got %s" % (what, type(a).__name__))
    raise TypeError("cufold: kernel %s must be a %d-d %s array; got %d-d %s"
                    % (what, nd, dt, a.ndim, a.dtype))


def _bad_layout(what, a, layout):
    raise TypeError("cufold: kernel %s must be %s-contiguous; got strides %s"
                    % (what, layout, a.strides))


def _bad_tuple(what, t, n):
    raise TypeError("cufold: kernel %s must be a tuple of %d; got %d" % (what, n, len(t)))


# ---------------------------------------------------------------------------
# the driver (ctypes; nothing is loaded in the simulator)

_drv = None
_drv_lock = threading.Lock()


#: Which binding calls cuLaunchKernel: ``compiled`` (a built-in function compiled with
#: llvmlite that calls the driver by address, :mod:`cufold.host.native`), ``bindings``
#: (cuda.bindings.driver), ``ctypes`` (libcuda through ctypes), or ``auto`` (compiled,
#: else bindings where importable, else ctypes). ``CUFOLD_LAUNCH_API`` sets it.
LAUNCH_API = os.environ.get("CUFOLD_LAUNCH_API", "auto").strip().lower()

#: Check the thread's current CUDA context before every launch (True), or only
#: when a launch fails for want of one (False: saves a driver call per launch).
#: ``None`` (default; ``CUFOLD_CHECK_CONTEXT=1|0`` overrides) checks only on
#: machines with several GPUs, where another device's context may be current.
CHECK_CONTEXT = {"1": True, "0": False}.get(os.environ.get("CUFOLD_CHECK_CONTEXT", ""))
_CUDA_ERROR_INVALID_CONTEXT = 201
_CUDA_ERROR_INVALID_HANDLE = 400
#: What a launch in the wrong context returns: no context current (201), or
#: another context current, where the primary context's CUfunction is no handle (400).
_WRONG_CONTEXT = (_CUDA_ERROR_INVALID_CONTEXT, _CUDA_ERROR_INVALID_HANDLE)


def _cfunc(lib, name, argtypes):
    f = getattr(lib, name)
    f.argtypes = argtypes
    f.restype = ctypes.c_int
    return f


class _Driver:
    """The few driver entry points of the launch path."""

    def __init__(self, api=None):
        lib = _arrays._driver_lib()
        if lib is None:
            raise _NoDirect("libcuda could not be loaded")
        c_uint, c_void_p = ctypes.c_uint, ctypes.c_void_p
        self.lib = lib
        self.ctx_get = _cfunc(lib, "cuCtxGetCurrent", [c_void_p])
        self.ctx_push = _cfunc(lib, "cuCtxPushCurrent_v2", [c_void_p])
        self.ctx_pop = _cfunc(lib, "cuCtxPopCurrent_v2", [c_void_p])
        self.ctx_set = _cfunc(lib, "cuCtxSetCurrent", [c_void_p])
        self._err_name = _cfunc(lib, "cuGetErrorName", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])
        try:  # CUDA 12+
            self.kernel_get_function = _cfunc(lib, "cuKernelGetFunction", [c_void_p, c_void_p])
        except AttributeError:  # pragma: no cover - an older driver
            self.kernel_get_function = None
        self.streams = BoundedCache(1024)
        n = ctypes.c_int(0)
        _cfunc(lib, "cuInit", [ctypes.c_uint])(0)
        _cfunc(lib, "cuDeviceGetCount", [c_void_p])(ctypes.addressof(n))
        self.device_count = n.value
        self.check_ctx = CHECK_CONTEXT if CHECK_CONTEXT is not None else n.value != 1
        api = (api or LAUNCH_API)
        self.api = None
        self.launch_entry = ctypes.cast(lib.cuLaunchKernel, ctypes.c_void_p).value
        # The compiled launcher first: 0.8 us less per launch than cuda.bindings on an
        # H100 host (5.5 vs 6.3 us, tools/launch_costs.py), for ~7 ms once per process.
        if api in ("auto", "compiled"):
            try:
                from . import native
                self.launch = native.launcher(self.launch_entry)
                self._func_type = int
                self._stream_type = _stream_int
                self.ok = 0
                self.api = "compiled"
            except Exception:
                if api == "compiled":
                    raise
        if self.api is None and api in ("auto", "bindings"):
            try:
                from cuda.bindings import driver as cbd
                self.launch = cbd.cuLaunchKernel
                self._stream_type = cbd.CUstream
                self._func_type = cbd.CUfunction
                self.ok = (cbd.CUresult.CUDA_SUCCESS,)
                self.api = "bindings"
            except Exception:
                if api == "bindings":
                    raise
        # For pre-converted arguments (Bound): no argtypes, so ctypes only unwraps them.
        self.launch_raw = lib["cuLaunchKernel"]
        self.launch_raw.restype = ctypes.c_int
        if self.api is None:
            self.launch = _cfunc(lib, "cuLaunchKernel", [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint,
                                                         c_uint, c_uint, c_void_p, c_void_p, c_void_p])
            self._stream_type = self._func_type = int
            self.ok = 0
            self.api = "ctypes"

    def func(self, handle):
        """The function argument of ``launch`` for a CUfunction/CUkernel handle (int)."""
        return self._func_type(handle)

    def stream(self, h):
        """The stream argument of ``launch`` for a raw handle (cached)."""
        s = self.streams.get(h)
        return s if s is not None else self.streams.put(h, self._stream_type(h))

    def function_of(self, kernel, ctx):
        """The CUfunction of CUkernel handle ``kernel`` (int) in context ``ctx``
        (int), or None. Launching the CUfunction is cheaper: given a CUkernel,
        every cuLaunchKernel looks up its function in the current context
        (0.6 of 4.6 us per launch on an H200's host)."""
        if self.kernel_get_function is None:
            return None
        out, popped = ctypes.c_void_p(), ctypes.c_void_p()
        if self.ctx_push(ctx) != 0:
            return None
        try:
            res = self.kernel_get_function(ctypes.addressof(out), kernel)
        finally:
            self.ctx_pop(ctypes.addressof(popped))
        return out.value if res == 0 and out.value else None

    def error_name(self, res):
        rc = _error_code(res)
        out = ctypes.c_char_p()
        if self._err_name(rc, ctypes.byref(out)) == 0 and out.value:
            return "%s (%d)" % (out.value.decode(), rc)
        return "CUDA error %d" % rc


def _stream_int(h):
    return int(h or 0)


def _error_code(res):
    return int(res[0]) if isinstance(res, tuple) else int(res)


def _driver():
    global _drv
    if _drv is None:
        with _drv_lock:
            if _drv is None:
                _drv = _Driver()
    return _drv


_primary = {}


def _primary_context(dev):
    """Handle (int) of device ``dev``'s primary context, as Numba uses it."""
    h = _primary.get(dev)
    if h is None:
        with cuda.gpus[dev]:
            h = int(cuda.current_context().handle)
        _primary[dev] = h
    return h


_cc = {}


def compute_capability(dev):
    """``(major, minor)`` of GPU ``dev`` (9.0 in the simulator)."""
    if SIMULATOR:
        return (9, 0)
    cc = _cc.get(dev)
    if cc is None:
        cc = _cc[dev] = tuple(cuda.gpus[dev].compute_capability)
    return cc


def _numba_device_ctx(dev):
    return _arrays._numba_ctx(dev) or contextlib.nullcontext()


# ---------------------------------------------------------------------------
# disk cache


def _numba_cuda_version():
    try:
        from importlib.metadata import version
        return version("numba-cuda")
    except Exception:  # pragma: no cover
        return "unknown"


def cache_dir():
    """``$CUFOLD_CACHE_DIR`` or ``~/.cache/cufold``, then ``numba-cuda-<version>``."""
    base = os.environ.get("CUFOLD_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "cufold")
    return os.path.join(base, "numba-cuda-%s" % _numba_cuda_version())


def _disk_enabled():
    return os.environ.get("CUFOLD_CACHE", "1") != "0"


_digest = []


def source_digest():
    """A digest of what a kernel's machine code depends on beyond its cache key:
    cufold's own sources (every module, so generated code and device functions
    too), the numba, numba-cuda and NumPy versions and Python's."""
    if not _digest:
        import numba
        h = hashlib.sha256()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for folder, dirs, files in sorted(os.walk(root)):
            dirs.sort()
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    h.update(f.read() + b"\0")
        h.update(repr((numba.__version__, _numba_cuda_version(), np.__version__,
                       tuple(sys.version_info[:2]))).encode())
        _digest.append(h.hexdigest())
    return _digest[0]


def _pinned(obj, fingerprints):
    """Whether ``obj``, part of a kernel's cache key, pins down all of the code
    it stands for: plain data, cufold's own operators (their code is in
    :func:`source_digest`), and users' operators whose :meth:`~cufold.Op.fingerprint`
    is known, which is appended to ``fingerprints`` (an operator named like a
    built-in is a user's operator too)."""
    if obj is None or obj.__class__ in (bool, int, float, str, bytes, np.dtype) or isinstance(obj, np.dtype):
        return True
    if isinstance(obj, tuple):                   # namedtuples too (plans, tiles)
        return all(_pinned(o, fingerprints) for o in obj)
    if isinstance(obj, type):
        return obj.__module__ in ("builtins", "numpy")
    from .. import ops, values
    if isinstance(obj, ops.Op):
        if ops.BUILTINS.get(obj.name) is obj:
            return True
        fingerprint = obj.fingerprint()
        if fingerprint is None:
            return False
        fingerprints.append(fingerprint)
        return True
    if isinstance(obj, values.ValueType):
        return True
    return False


def library_disk_key(key):
    """The disk-cache text of a cufold kernel cached in memory under ``key``
    (a tuple), or None where the key does not pin its code down (see
    :func:`_pinned`) or the library's disk cache is off. The text holds the
    key, the fingerprints of the users' operators in it (in the key's order),
    :func:`source_digest` and every ``CUFOLD_*`` and ``NUMBA_*`` setting in the
    environment (tuning knobs and compiler options). ``CUFOLD_CACHE=0`` turns
    the disk cache off."""
    fingerprints = []
    if not _disk_enabled() or not _pinned(key, fingerprints):
        return None
    settings = sorted((k, v) for k, v in os.environ.items()
                      if k.startswith(("CUFOLD_", "NUMBA_")) and k not in ("CUFOLD_CACHE", "CUFOLD_CACHE_DIR"))
    return "%s\n%r\n%r%s" % (source_digest(), settings, key, "".join("\n" + f for f in fingerprints))


_MAGIC = b"CUFOLDCUBIN1 "


def _cache_path(disk_key, signature, options, cc):
    h = hashlib.sha256()
    for part in (ABI_VERSION, repr(tuple(str(t) for t in signature)), repr(sorted(options.items())),
                 disk_key):
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return os.path.join(cache_dir(), "sm_%d%d" % cc, h.hexdigest() + ".cubin")


def _write_cubin(path, entry, cubin):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = "%s.%d.%d.tmp" % (path, os.getpid(), threading.get_ident())
        with open(tmp, "wb") as f:
            f.write(_MAGIC + entry.encode() + b"\n" + _cubin_bytes(cubin))
        os.replace(tmp, path)
        return True
    except Exception as e:  # noqa: BLE001 - the cache is an optimisation only
        warnings.warn("cufold: could not write the kernel cache %s (%s)" % (path, e), stacklevel=3)
        return False


def _cubin_bytes(c):
    """Bytes of a cubin: Numba-CUDA 0.30 hands a cuda.core ObjectCode."""
    if isinstance(c, (bytes, bytearray, memoryview)):
        return bytes(c)
    code = getattr(c, "code", None)
    if isinstance(code, (bytes, bytearray, memoryview)):
        return bytes(code)
    if isinstance(code, (str, os.PathLike)) and os.path.exists(code):
        with open(code, "rb") as f:
            return f.read()
    raise TypeError("cufold: cannot get the bytes of cubin %r" % (c,))


def _read_cubin(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if not data.startswith(_MAGIC):
        return None
    nl = data.find(b"\n")
    if nl < 0:
        return None
    return data[len(_MAGIC):nl].decode(), data[nl + 1:]


# ---------------------------------------------------------------------------
# Kernel

_STREAMS = BoundedCache(256)


def _numba_stream(h):
    if not h or SIMULATOR:
        return 0
    s = _STREAMS.get(h)
    return s if s is not None else _STREAMS.put(h, cuda.external_stream(h))


def _np_scalar_type(ty):
    from numba.np.numpy_support import as_dtype
    try:
        return as_dtype(ty).type
    except Exception:
        return None


class Kernel:
    """A compiled kernel with a fixed Numba signature and a fast launch.

    ``py_func``: the Python kernel function (the algorithm's closure; the
    simulator runs it as is). ``signature``: tuple of Numba types, e.g.
    ``(types.Array(types.float32, 1, 'A'), types.int64)``. ``key``: the
    in-memory cache key (see :func:`get_kernel`). ``disk_key``: text that
    identifies the kernel's code completely (generated source, operator
    source, tile parameters...): when given, the cubin is cached on disk per
    compute capability and a new process loads it without compiling.
    ``jit_options`` go to ``cuda.jit`` (e.g. ``fastmath``, ``lineinfo``).
    """

    def __init__(self, py_func, signature, key=None, disk_key=None, name=None, **jit_options):
        self.py_func = py_func
        self.signature = tuple(signature)
        self.key = key
        self.disk_key = disk_key
        self.name = name or getattr(py_func, "__name__", "kernel")
        self.jit_options = jit_options
        self.plan = _Plan(self.signature)
        self._nparams = self.plan.nparams
        nbytes = max(_FIELD * self._nparams, _FIELD)
        self._buf = ctypes.create_string_buffer(nbytes)
        base = ctypes.addressof(self._buf)
        self._ptrs = (ctypes.c_void_p * max(self._nparams, 1))(
            *[base + _FIELD * i for i in range(self._nparams)] or [0])
        self._params = ctypes.addressof(self._ptrs)     # (a kernel without parameters reads none of it)
        self._pack = self.plan.build_packer(self._buf)
        self._ctx_out = ctypes.c_void_p()
        self._ctx_addr = ctypes.addressof(self._ctx_out)
        self._lock = threading.Lock()
        self._setup_lock = threading.RLock()
        self._funcs = {}          # device id -> (CUkernel/CUfunction handle, primary context)
        self._keep = []           # objects that keep loaded code alive
        self._dispatcher = None
        self._direct_reason = None if self.plan.supported else self.plan.reason
        self._scalar_types = tuple(
            None if isinstance(t, (nbtypes.Array, nbtypes.BaseTuple)) else _np_scalar_type(t)
            for t in self.signature)
        self._smem_set = {}
        self.loaded_from_disk = {}  # device id -> bool (for tests / diagnostics)

    def __repr__(self):
        return "<cufold Kernel %s %s>" % (self.name, self.key)

    # --- compilation -------------------------------------------------------

    def dispatcher(self):
        """The Numba dispatcher, compiled eagerly for the signature (a fake
        kernel in the simulator)."""
        d = self._dispatcher
        if d is None:
            with self._setup_lock:
                d = self._dispatcher
                if d is None:
                    _target_without_blas()
                    d = cuda.jit(self.signature, **_with_lto_override(self.jit_options))(self.py_func)
                    self._dispatcher = d
        return d

    def compiled(self, device_id=None):
        """Numba's compiled kernel object (``_Kernel``) for the signature."""
        dev = _arrays._current_device_id() if device_id is None else device_id
        with _numba_device_ctx(dev):
            d = self.dispatcher()
            return next(iter(d.overloads.values()))

    def _entry(self, dev):
        """(handle, context) for ``dev``: from the disk cache, else compiled."""
        with self._setup_lock:
            ent = self._funcs.get(dev)
            if ent is not None:
                return ent
            if self._direct_reason is not None:
                raise _NoDirect(self._direct_reason)
            drv = _driver()
            ctx = _primary_context(dev)
            handle = None
            path = None
            if self.disk_key is not None and _disk_enabled():
                cc = compute_capability(dev)
                path = _cache_path(self.disk_key, self.signature, self.jit_options, cc)
                got = _read_cubin(path)
                if got is not None:
                    try:
                        handle = self._load_cubin(*got)
                        self.loaded_from_disk[dev] = True
                    except Exception as e:  # corrupt or incompatible: recompile
                        warnings.warn("cufold: ignoring the cached kernel %s (%s)" % (path, e))
                        handle = None
            if handle is None:
                with _numba_device_ctx(dev):
                    k = self.compiled(dev)
                    why = _direct_unsupported(k)
                    if why:
                        self._direct_reason = why
                        raise _NoDirect(why)
                    k.bind()
                    lib = k._codelibrary
                    cufunc = lib.get_cufunc()
                    handle = int(cufunc.handle)
                    self._keep.append(cufunc)
                    self.loaded_from_disk[dev] = False
                    if path is not None:
                        # The cubin just loaded: Numba caches it under the device's own arch
                        # tuple ((9, 0, "a")); asking for (9, 0) would compile and link again.
                        _write_cubin(path, lib._entry_name, lib.get_cubin())
            # Loaded code comes as a CUkernel (cuda.core's libraries); launch its
            # CUfunction in the device's primary context (see _Driver.function_of).
            function = drv.function_of(handle, ctx)
            ent = (drv.func(handle if function is None else function), ctx)
            self._funcs[dev] = ent
            return ent

    def resident_blocks(self, block, shared_bytes=0, device_id=None):
        """Blocks of ``block`` threads (and ``shared_bytes`` of dynamic shared memory) that
        one SM holds at once for this kernel, from the driver's occupancy calculator (the
        kernel is compiled or loaded first); None where unknown (the simulator, Numba's
        launch path). What a grid that must run in one round is sized by."""
        if SIMULATOR or not DIRECT or self._direct_reason is not None:
            return None
        dev = _arrays._current_device_id() if device_id is None else device_id
        try:
            handle = self._entry(dev)[0]
        except _NoDirect:
            return None
        drv = _driver()
        occupancy = getattr(drv, "occupancy", None)
        if occupancy is None:
            occupancy = drv.occupancy = _cfunc(drv.lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                                               [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t])
        blocks = ctypes.c_int(0)
        with _numba_device_ctx(dev):
            res = occupancy(ctypes.addressof(blocks), int(handle), int(block), int(shared_bytes))
        return blocks.value if res == 0 and blocks.value > 0 else None

    def _load_cubin(self, entry, cubin):
        from cuda.core import ObjectCode
        obj = ObjectCode.from_cubin(cubin, name=self.name)
        kern = obj.get_kernel(entry)
        self._keep.append((obj, kern))
        h = kern.handle
        return int(h)

    # --- launching -----------------------------------------------------------

    def launch(self, grid, block, stream, shared_bytes, *args):
        """Launch on ``grid`` x ``block`` (ints or 1-3 tuples) on raw stream
        ``stream`` (int) with ``shared_bytes`` of dynamic shared memory.

        ``args`` follow the signature: :class:`Arr` descriptors for arrays,
        tuples of them for tuple types, Python/NumPy scalars for scalars. The
        launch is asynchronous; a driver error raises :class:`LaunchError`.
        """
        if SIMULATOR or not DIRECT or self._direct_reason is not None:
            return self._launch_numba(grid, block, stream, shared_bytes, args)
        if grid.__class__ is int:
            gx = grid
            gy = gz = 1
        else:
            gx, gy, gz = _dim3(grid)
        if block.__class__ is int:
            bx = block
            by = bz = 1
        else:
            bx, by, bz = _dim3(block)
        with self._lock:
            try:
                dev = self._pack(*args)
            except Exception as e:
                raise self._arg_error(e) from None
            ent = self._funcs.get(dev)
            if ent is None:
                try:
                    ent = self._entry(dev)
                except _NoDirect as e:
                    self._direct_reason = str(e)
            if ent is not None:
                func, ctx = ent
                if shared_bytes > 49152:
                    self._allow_smem(dev, func, shared_bytes)
                drv = _drv
                cs = drv.streams.get(stream)
                if cs is None:
                    cs = drv.stream(stream)
                if not drv.check_ctx:
                    # one GPU: the current context is its primary one, or none at all
                    res = drv.launch(func, gx, gy, gz, bx, by, bz, shared_bytes, cs, self._params, 0)
                    if res != drv.ok and _error_code(res) in _WRONG_CONTEXT:
                        res = self._launch_in(ctx, drv, func, gx, gy, gz, bx, by, bz, shared_bytes, cs)
                else:
                    res = self._launch_in(ctx, drv, func, gx, gy, gz, bx, by, bz, shared_bytes, cs)
        if ent is None:
            return self._launch_numba(grid, block, stream, shared_bytes, args)
        if res != drv.ok:
            raise LaunchError(
                "cufold: launching kernel %s failed: %s; grid=%s block=%s shared=%d stream=%#x"
                % (self.name, drv.error_name(res), grid, block, shared_bytes, stream or 0))

    def _launch_in(self, ctx, drv, func, gx, gy, gz, bx, by, bz, shared_bytes, cs):
        """Launch with ``ctx`` current: as is when it already is; adopting it in
        a thread without a context; pushed for this launch only when another
        device's (or a foreign) context is current."""
        drv.ctx_get(self._ctx_addr)
        cur = self._ctx_out.value
        if cur == ctx:
            return drv.launch(func, gx, gy, gz, bx, by, bz, shared_bytes, cs, self._params, 0)
        if cur is None:
            drv.ctx_set(ctx)
            return drv.launch(func, gx, gy, gz, bx, by, bz, shared_bytes, cs, self._params, 0)
        drv.ctx_push(ctx)
        try:
            return drv.launch(func, gx, gy, gz, bx, by, bz, shared_bytes, cs, self._params, 0)
        finally:
            drv.ctx_pop(self._ctx_addr)

    def _arg_error(self, e):
        if isinstance(e, TypeError) and str(e).startswith("cufold:"):
            return e
        return TypeError("cufold: the arguments of kernel %s do not match its signature (%s): %s: %s"
                         % (self.name, ", ".join(str(t) for t in self.signature),
                            type(e).__name__, e))

    def _allow_smem(self, dev, func, nbytes, is_kernel=False):
        """Let ``func`` (a CUfunction handle, or with ``is_kernel`` a CUkernel)
        use ``nbytes`` of dynamic shared memory on ``dev``."""
        if self._smem_set.get((dev, func), 0) >= nbytes:
            return
        from cuda.bindings import driver as cbd
        attr = cbd.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        if is_kernel:
            (err,) = cbd.cuKernelSetAttribute(attr, nbytes, cbd.CUkernel(int(func)), dev)
        else:
            (err,) = cbd.cuFuncSetAttribute(cbd.CUfunction(int(func)), attr, nbytes)
        if int(err):
            raise LaunchError("cufold: kernel %s cannot use %d bytes of dynamic shared memory (%s)"
                              % (self.name, nbytes, err))
        self._smem_set[(dev, func)] = nbytes

    def _view(self, a, i):
        if isinstance(a, Arr):
            return as_numba(a)
        if isinstance(a, tuple):
            return tuple(as_numba(x) if isinstance(x, Arr) else x for x in a)
        t = self._scalar_types[i]
        return a if t is None else t(a)

    def _launch_numba(self, grid, block, stream, shared_bytes, args):
        with self._lock:
            try:
                self._pack(*args)  # the same argument checks as the direct path
            except Exception as e:
                raise self._arg_error(e) from None
        views = [self._view(a, i) for i, a in enumerate(args)]
        if SIMULATOR:
            d = self.dispatcher()
            d[grid, block, 0, shared_bytes](*views)
            return
        dev = next((a.device_id for a in _iter_arrs(args)), None)
        if dev is None:
            dev = _arrays._current_device_id()
        with _numba_device_ctx(dev):
            d = self.dispatcher()
            if shared_bytes > 49152:
                k = next(iter(d.overloads.values()))
                self._allow_smem(dev, int(k._codelibrary.get_cufunc().handle), shared_bytes, is_kernel=True)
            d[grid, block, _numba_stream(stream), shared_bytes](*views)

    def bind(self, grid, block, stream, shared_bytes, args, vary):
        """``go(*new)``: this launch with the arguments at positions ``vary``
        replaced by ``new`` (same types and layouts; 1-D arrays for arrays),
        everything else packed once. A position given as ``(i, "ptr")`` takes
        a bare device pointer (int) for array ``i``, whose length stays;
        ``(i, "ptr", j)`` the pointer of array ``j`` of a tuple argument ``i``.
        For a call made many times with a new
        input and output each time, it skips :meth:`launch`'s per-call checks
        and descriptor reads (a microsecond or two of host time, all of a small
        call's cost). Thread-safe; see :class:`Bound`."""
        return Bound(self, grid, block, stream, shared_bytes, args, vary).go

    # --- introspection -----------------------------------------------------------

    @property
    def direct(self):
        """False once the direct path was found unusable for this kernel."""
        return self._direct_reason is None

    def packed_params(self, *args):
        """The packed parameter bytes for ``args`` (one 8-byte slot per
        parameter), for ABI tests."""
        with self._lock:
            self._pack(*args)
            return bytes(self._buf.raw[:_FIELD * self._nparams])


class Bound:
    """One kernel, one launch configuration, one parameter buffer of its own
    (see :meth:`Kernel.bind`). ``go(*new)`` writes the varying arguments'
    fields (a 1-D array's length, pointer and extent; a scalar's value) into
    the buffer and launches. Where the direct path is unavailable (the
    simulator, ``CUFOLD_LAUNCH=numba``) ``go`` calls :meth:`Kernel.launch`
    with the arguments substituted, so callers run the same code everywhere.
    """

    def __init__(self, kernel, grid, block, stream, shared_bytes, args, vary):
        self.kernel = kernel
        self.vary = tuple(vary)
        # What is kept of the arguments given on every call is their layout
        # (the fallback's template): a cached launch must not keep the
        # caller's first arrays alive.
        varied = {(i[0], i[2]) if i.__class__ is tuple and len(i) == 3 else i[0] if i.__class__ is tuple else i
                  for i in self.vary}
        self.args = [_arrays.shell(a) if i in varied and a.__class__ is Arr else
                     tuple(_arrays.shell(m) if (i, j) in varied else m for j, m in enumerate(a))
                     if a.__class__ is tuple else a
                     for i, a in enumerate(args)]
        lock = threading.Lock()
        n = max(kernel._nparams, 1)
        self._buf = buf = ctypes.create_string_buffer(_FIELD * n)
        base = ctypes.addressof(buf)
        self._ptrs = (ctypes.c_void_p * n)(*[base + _FIELD * i for i in range(n)])
        with kernel._lock:
            try:
                dev = kernel._pack(*args)
            except Exception as e:
                raise kernel._arg_error(e) from None
            ctypes.memmove(buf, kernel._buf, _FIELD * kernel._nparams)
        ent = None
        if not (SIMULATOR or not DIRECT or kernel._direct_reason is not None):
            try:
                ent = kernel._funcs.get(dev) or kernel._entry(dev)
            except _NoDirect as e:
                kernel._direct_reason = str(e)
        if ent is None:
            self.go = self._fallback(grid, block, stream, shared_bytes, lock)
            return
        func, ctx = ent
        if shared_bytes > 49152:
            kernel._allow_smem(dev, func, shared_bytes)
        gx, gy, gz = (grid, 1, 1) if grid.__class__ is int else _dim3(grid)
        bx, by, bz = (block, 1, 1) if block.__class__ is int else _dim3(block)
        drv = _driver()
        if drv.api == "compiled":
            launch, ok = drv.launch, 0
            cfg = (int(func), gx, gy, gz, bx, by, bz, shared_bytes, stream or 0, ctypes.addressof(self._ptrs), 0)
        elif drv.api == "ctypes" and not drv.check_ctx:
            # Every argument converted once: the call only unwraps them (the
            # cheapest way into the driver from Python).
            u, vp = ctypes.c_uint, ctypes.c_void_p
            launch, ok = drv.launch_raw, 0
            cfg = (vp(int(func)), u(gx), u(gy), u(gz), u(bx), u(by), u(bz), u(shared_bytes), vp(stream or None),
                   vp(ctypes.addressof(self._ptrs)), vp(None))
        else:
            launch, ok = drv.launch, drv.ok
            cfg = (func, gx, gy, gz, bx, by, bz, shared_bytes, drv.stream(stream), ctypes.addressof(self._ptrs), 0)
        env = {"_kernel": kernel, "_ctx": ctx, "_drv": drv, "_launch_in_ctx": _launch_in_ctx,
               "_lock": lock, "_s": (ctypes.c_int64 * n).from_buffer(buf), "_launch": launch,
               "_ok": ok, "_fail": self._failed, "_cfg": cfg}
        params = ", ".join("v%d" % i for i in range(len(self.vary)))
        lines = ["def go(%s):" % params, "    with _lock:"]
        for j, i in enumerate(self.vary):
            if i.__class__ is tuple:             # (index, "ptr"[, field]): only the pointer, as an int
                lines.append("        _s[%d] = v%d" % (_pointer_slot(kernel, i), j))
                continue
            first, ty = kernel.plan.arg_slots[i], kernel.signature[i]
            if isinstance(ty, nbtypes.Array):
                if ty.ndim != 1:
                    raise ValueError("cufold: Kernel.bind varies 1-D arrays only")
                lines.append("        _s[%d] = _s[%d] = v%d.size" % (first + 2, first + 5, j))
                lines.append("        _s[%d] = v%d.ptr" % (first + 4, j))
                if ty.layout != "C":
                    lines.append("        _s[%d] = v%d.strides[0] * %d" % (first + 6, j, _itemsize(ty)))
            elif isinstance(ty, nbtypes.Integer):
                # every parameter has its own 8-byte slot: a narrower integer is the
                # slot's low bytes (little-endian), whatever its sign (two's complement)
                lines.append("        _s[%d] = v%d" % (first, j) if ty.bitwidth == 64 else
                             "        _s[%d] = int(v%d) & %d" % (first, j, (1 << ty.bitwidth) - 1))
            else:
                raise ValueError("cufold: Kernel.bind varies 1-D arrays and integers only, not %s" % ty)
        # Several GPUs: make this device's context current first (Kernel.launch does the same).
        lines.append("        res = _launch_in_ctx(_launch, _ctx, _drv, _cfg)" if drv.check_ctx else
                     "        res = _launch(*_cfg)")
        lines.append("    if res != _ok:")
        lines.append("        _fail(res)")
        exec(compile("\n".join(lines) + "\n", "<cufold-bound>", "exec"), env)
        self._ctx, self._cfg, self._lock, self._launch = ctx, env["_cfg"], lock, launch
        self._grid_text = "grid=%s block=%s stream=%#x" % (grid, block, stream or 0)
        self.go = env["go"]

    def _failed(self, res):
        drv = _drv
        if _error_code(res) in _WRONG_CONTEXT and not drv.check_ctx:
            # this thread has no (or another device's) context current: adopt or push it
            with self._lock:
                res = _launch_in_ctx(self._launch, self._ctx, drv, self._cfg)
            if res == drv.ok:
                return
        raise LaunchError("cufold: launching kernel %s failed: %s; %s"
                          % (self.kernel.name, drv.error_name(res), self._grid_text))

    def _fallback(self, grid, block, stream, shared_bytes, lock):
        kernel, args, vary = self.kernel, self.args, self.vary

        def go(*new):
            with lock:
                call = list(args)
                for i, v in zip(vary, new):
                    if i.__class__ is tuple and len(i) == 3:      # a new pointer for field i[2] of a tuple
                        fields = list(call[i[0]])
                        fields[i[2]] = _arrays.rebase(args[i[0]][i[2]], v)
                        i, v = i[0], tuple(fields)
                    elif i.__class__ is tuple:   # a new pointer into the same kind of array
                        i, v = i[0], _arrays.rebase(args[i[0]], v)
                    call[i] = v
            kernel.launch(grid, block, stream, shared_bytes, *call)

        return go


def _slots(ty):
    """Kernel parameter slots that an argument of Numba type ``ty`` takes (see the ABI above)."""
    if isinstance(ty, nbtypes.Array):
        return 5 + 2 * ty.ndim
    if isinstance(ty, nbtypes.BaseTuple):
        return sum(_slots(t) for t in ty)
    if isinstance(ty, nbtypes.Complex):
        return 2
    return 1


def _pointer_slot(kernel, vary):
    """The parameter slot of the data pointer that ``vary`` names: ``(i, "ptr")``
    for array argument ``i``, ``(i, "ptr", j)`` for array ``j`` of tuple argument
    ``i`` (any number of dimensions)."""
    i = vary[0]
    ty = kernel.signature[i]
    first = kernel.plan.arg_slots[i]
    if len(vary) == 2 and isinstance(ty, nbtypes.Array):
        return first + 4
    if len(vary) == 3 and isinstance(ty, nbtypes.BaseTuple) and isinstance(ty[vary[2]], nbtypes.Array):
        return first + sum(_slots(t) for t in list(ty)[:vary[2]]) + 4
    raise ValueError("cufold: Kernel.bind takes pointers of arrays (or of arrays in a tuple), not %r of %s"
                     % (vary, ty))


def _itemsize(ty):
    """Bytes per element of Numba array type ``ty``."""
    from numba.np.numpy_support import as_dtype
    return np.dtype(as_dtype(ty.dtype)).itemsize


def _launch_in_ctx(launch, ctx, drv, cfg):
    """``launch(*cfg)`` with ``ctx`` current (as :meth:`Kernel._launch_in`)."""
    out = ctypes.c_void_p()
    drv.ctx_get(ctypes.addressof(out))
    cur = out.value
    if cur == ctx:
        return launch(*cfg)
    if cur is None:
        drv.ctx_set(ctx)
        return launch(*cfg)
    drv.ctx_push(ctx)
    try:
        return launch(*cfg)
    finally:
        drv.ctx_pop(ctypes.addressof(out))


def _dim3(d):
    if isinstance(d, (tuple, list)):
        d = tuple(int(v) for v in d) + (1, 1)
        return d[0], d[1], d[2]
    return int(d), 1, 1


def _iter_arrs(args):
    for a in args:
        if isinstance(a, Arr):
            yield a
        elif isinstance(a, tuple):
            for x in a:
                if isinstance(x, Arr):
                    yield x


def _direct_unsupported(k):
    """Why Numba's compiled kernel ``k`` needs Numba's own launcher, or ''."""
    if getattr(k, "cooperative", False):
        return "the kernel needs a cooperative launch (grid sync)"
    if getattr(k, "debug", False):
        return "debug kernels report exceptions through Numba's launcher"
    if getattr(k, "launch_config_sensitive", False):
        return "the kernel was compiled for its launch configuration"
    if getattr(k, "extensions", None):
        return "the kernel has argument extensions"
    lib = getattr(k, "_codelibrary", None)
    if lib is None or not hasattr(lib, "get_cufunc"):
        return "Numba's compiled kernel has no code library"
    if getattr(lib, "_setup_functions", None) or getattr(lib, "_teardown_functions", None):
        return "the kernel's module needs Numba's set-up (NRT)"
    return ""


_KERNELS = {}
_KERNELS_LOCK = threading.Lock()


def get_kernel(key, factory, disk_key=None, **jit_options):
    """The :class:`Kernel` cached under ``key`` (hashable, e.g. ``('reduce',
    op, value type, algorithm, tile)``), made on first use from
    ``factory() -> (py_func, signature)``. ``disk_key`` may also be a
    callable returning the text (evaluated only on a miss)."""
    k = _KERNELS.get(key)
    if k is not None:
        return k
    with _KERNELS_LOCK:
        k = _KERNELS.get(key)
        if k is None:
            py_func, signature = factory()
            dk = disk_key() if callable(disk_key) else disk_key
            k = Kernel(py_func, signature, key=key, disk_key=dk, **jit_options)
            _KERNELS[key] = k
    return k


# ---------------------------------------------------------------------------
# compiling kernels for their arguments, launching them

@functools.lru_cache(maxsize=None)
def sm_count(device_id):
    """Multiprocessors of GPU ``device_id`` (4 in the simulator): what grids are sized by."""
    if SIMULATOR:
        return 4
    return cuda.gpus[device_id].MULTIPROCESSOR_COUNT


@functools.lru_cache(maxsize=None)
def l2_bytes(device_id):
    """L2 cache bytes of GPU ``device_id`` (16 KiB in the simulator, so that small tests
    take the paths chosen for data larger than L2)."""
    if SIMULATOR:
        return 16 << 10
    return cuda.gpus[device_id].L2_CACHE_SIZE


#: A launch shape: threads per block (``nt``) and items per thread (``vt``).
Tile = collections.namedtuple("Tile", "nt vt")


def _nbtype(arg):
    """The Numba type of a launch argument (an Arr, a tuple of them, or a scalar)."""
    if isinstance(arg, tuple):
        return nbtypes.BaseTuple.from_types([_nbtype(a) for a in arg])
    if isinstance(arg, _arrays.Arr):
        layout = "C" if arg.c_contiguous else "A"
        return nbtypes.Array(from_dtype(arg.dtype), arg.ndim, layout)
    if isinstance(arg, (bool, np.bool_)):
        return nbtypes.boolean
    return from_dtype(np.asarray(arg).dtype)


def _layout(arg):
    """What of an argument decides the compiled code: cheap to compute per call."""
    if arg.__class__ is tuple:
        return tuple(_layout(a) for a in arg)
    if arg.__class__ is _arrays.Arr:
        return arg.layout
    return arg.__class__


_kernels = {}


def kernel_for(fn, key, args):
    """The compiled kernel of ``fn`` for these arguments' types (cached by
    ``key`` and the argument layout)."""
    k = (key, tuple(_layout(a) for a in args))
    kernel = _kernels.get(k)
    if kernel is None:
        sig = tuple(_nbtype(a) for a in args)
        kernel = _kernels[k] = Kernel(fn, sig, key=repr(k), disk_key=library_disk_key(k), **jit_options_of(fn))
    return kernel


_blas_lock = threading.Lock()
_blas_checked = False


def _target_without_blas():
    """Load Numba-CUDA's array math (which its target loads on its first compile) without
    the BLAS it looks for. The module asks whether SciPy's BLAS imports, so that ``np.dot``
    may call it; no CUDA kernel can, but the import loads SciPy's OpenBLAS, whose thread a
    core then spins through the rest of the cold compile (0.3-0.9 s of a first call on a
    many-core GPU host; 0.1-0.2 s on 2 cores). The question is answered "no" for that one
    import (``ensure_blas`` raising ImportError, then restored), so ``np.dot`` in a kernel
    takes Numba's own loop; nothing else changes, SciPy imports as before for its users,
    and a process whose array math loaded already is left as it is."""
    global _blas_checked
    if _blas_checked:                   # (every kernel's first compile asks)
        return
    with _blas_lock:
        if _blas_checked:
            return
        _blas_checked = True
        if SIMULATOR or "numba.cuda.np.arraymath" in sys.modules:
            return
        import importlib
        try:
            linalg = importlib.import_module("numba.cuda.np.linalg")
            ensure_blas = linalg.ensure_blas
        except (ImportError, AttributeError):     # another Numba-CUDA: its target loads as it would
            return

        def no_blas():
            raise ImportError("cufold: no BLAS for CUDA kernels")

        linalg.ensure_blas = no_blas
        try:                    # (arraymath imports it by name: it gets the real one back too)
            importlib.import_module("numba.cuda.np.arraymath").ensure_blas = ensure_blas
        except Exception:       # the module failed here: the target's own load retries it, and says why
            pass
        finally:
            linalg.ensure_blas = ensure_blas


def _with_lto_override(options):
    """``options`` with ``CUFOLD_LTO=0|1`` applied: link-time optimisation off or on for
    every kernel (to measure it; each kernel's own choice otherwise). The disk key holds the
    setting, as it holds every ``CUFOLD_*`` variable."""
    forced = os.environ.get("CUFOLD_LTO")
    if SIMULATOR or forced not in ("0", "1"):
        return options
    return dict(options, lto=forced == "1")


def jit_options_of(fn):
    """The ``cuda.jit`` options a kernel factory attached to its kernel (``fn.jit_options``,
    e.g. ``launch_bounds`` to cap registers for occupancy); none in the simulator."""
    return {} if SIMULATOR else getattr(fn, "jit_options", {})


def launch(fn, key, grid, nt, stream, args):
    """Launch ``fn`` through the one launch path, compiling it once per argument layout."""
    kernel_for(fn, key, args).launch(grid, nt, stream, 0, *args)


@functools.lru_cache(maxsize=None)
def fill_kernel(vt):
    """Kernel ``(outs, count, value)``: ``outs[k] = value`` for ``k < count`` (``outs`` as
    ``vt.store`` takes it); grid-stride. Launched by :func:`fill`."""
    store, cast = vt.store, vt.cast

    def fill(outs, count, value):
        k = np.int64(cuda.grid(1))
        while k < count:
            store(outs, k, cast(value))
            k += cuda.gridsize(1)

    return fill


def fill(b, vt, outs, count, value):
    """Add to Program builder ``b`` the launch that sets ``outs[:count]`` to ``value`` (of
    ``vt``): an empty input's result, the start of an atomic reduction, scratch to fill."""
    nt = min(256, 32 * -(-count // 32)) or 32
    b.launch(fill_kernel(vt), ("fill", vt), max(1, min(-(-count // nt), 1024)), nt,
             (outs, np.int64(count), vt.make(value)))


# ---------------------------------------------------------------------------
# gates: kernels that run or not by a flag on the GPU (the host cannot look without waiting)

@cuda.jit(device=True, inline="always")
def gated_off(gate, gate_on):
    """Whether a gated kernel returns at once: ``gate_on >= 0`` and ``gate[0] != gate_on``
    (the launch arguments :func:`gate_args` gives). Call it first, before any barrier."""
    return gate_on >= 0 and gate[0] != gate_on


def gate_args(b, gate):
    """The launch arguments ``(flag, value)`` of a gated kernel for Program builder ``b``:
    ``gate`` is None (the kernel always runs: a flag it never reads, and -1) or ``(flag,
    value)`` (an int32 device array: it runs where ``flag[0] == value``)."""
    if gate is None:
        return workspace(b.device_id, b.stream, 4)[1].view(np.int32, (1,), 0), np.int32(-1)
    return gate[0], np.int32(gate[1])


# ---------------------------------------------------------------------------
# workspace

_WS = {}
_WS_LOCK = threading.Lock()
_WS_MIN = 4096


def workspace(device_id, stream, nbytes):
    """A zero-initialised device buffer of at least ``nbytes`` bytes, cached
    per (device, stream) and grown geometrically (never shrunk); returns
    ``(ptr, Arr)`` with the whole buffer as a 1-d uint8 :class:`Arr` (carve it
    with ``Arr.view(dtype, shape, offset)``).

    Kernels on one stream run in order, so one buffer per stream is safe.
    Kernels that rely on zeros (counters, flags) must leave them zero. A grown
    buffer replaces the old one for new calls, but the old one is kept alive
    (at most as much memory again), so views carved from it earlier stay valid
    and kernels still queued on it are unaffected. Allocation synchronises the
    device once (the new buffer is zeroed before any later launch).
    """
    key = (device_id, stream)
    w = _WS.get(key)
    if w is not None and w.size >= nbytes:
        return w.ptr, w
    with _WS_LOCK:
        w = _WS.get(key)
        if w is None or w.size < nbytes:
            cap = max(nbytes, _WS_MIN, 2 * w.size if w is not None else 0)
            cap = (cap + 255) & ~255
            if w is not None:
                _WS_OLD.append(w)
            w = zeros(device_id, stream, cap)
            _WS[key] = w
    return w.ptr, w


_WS_OLD = []  # superseded workspaces: earlier views and queued kernels may use them


_KEPT = BoundedCache(1024)
_KEPT_LOCK = threading.Lock()


def kept_zeros(purpose, device_id, stream, nbytes):
    """A zeroed device buffer of ``nbytes`` (a 1-D uint8 :class:`Arr`) for the kernels
    named by ``purpose`` on raw stream ``stream``, cached per (purpose, device, stream,
    size) and made by :func:`zeros` (capture-aware) when first asked for. The contract:
    every launch that uses it leaves it zero again (arrival counters reset by the last
    block, accumulators drained by it), so it is zero at the start of every launch
    without a zeroing launch per call; launches on one stream run in order."""
    key = (purpose, device_id, stream, nbytes)
    got = _KEPT.get(key)
    if got is None:
        with _KEPT_LOCK:
            got = _KEPT.get(key)
            if got is None:
                got = _KEPT.put(key, zeros(device_id, stream, nbytes))
    return got


def zeros(device_id, stream, nbytes):
    """A zeroed device buffer of ``nbytes`` (a 1-D uint8 :class:`Arr`) for use on raw
    stream ``stream``: the per-stream scratch of the Programs (workspace, look-back
    states, counters), allocated when a Program is planned.

    Numba memory, zeroed, with one device synchronisation; but where ``stream`` is
    being captured into a CUDA graph (a call planned inside ``torch.cuda.graph``),
    memory of the graph's pool, zeroed by a node of the graph (nothing else may
    synchronise or allocate then), so every replay starts from zeros too."""
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        return _arrays.describe(FakeCUDAArray(np.zeros(nbytes, np.uint8)), "workspace")
    if capturing(stream):
        return _zeros_in_capture(device_id, stream, nbytes)
    with _numba_device_ctx(device_id):
        a = cuda.device_array(nbytes, dtype=np.uint8)
        a.gpu_data.memset(0)
        cuda.synchronize()
    return _arrays.describe(a, "workspace")


def capturing(stream):
    """Whether raw stream ``stream`` is being captured into a CUDA graph now."""
    if SIMULATOR or not stream:          # the legacy default stream is never captured
        return False
    from cuda.bindings import driver as cbd
    err, status = cbd.cuStreamIsCapturing(cbd.CUstream(stream))
    return int(err) == 0 and status == cbd.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE


def _zeros_in_capture(device_id, stream, nbytes):
    try:
        import torch
        with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=torch.device("cuda", device_id))):
            t = torch.zeros(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_id))
        return _arrays.describe(t, "workspace")
    except Exception as e:                                       # noqa: BLE001
        raise RuntimeError(
            "cufold: a call was planned while stream %#x is being captured into a CUDA graph, and its "
            "scratch memory could not be allocated there (%s: %s). Capture with torch.cuda.graph, or "
            "make the same call once on the capture stream before capturing." % (stream, type(e).__name__, e)
        ) from None


def clear_workspaces():
    """Drop every cached workspace (after synchronising the devices). Views
    carved from them must not be used afterwards."""
    with _WS_LOCK:
        if not SIMULATOR:
            for dev in {d for d, _ in _WS}:
                with _numba_device_ctx(dev):
                    cuda.synchronize()
        _WS.clear()
        del _WS_OLD[:]
