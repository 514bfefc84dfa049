"""Reading results back to the host: the few, documented synchronisations of cufold.

Every device function that waits for the GPU (a result whose size depends on the
data, a check the caller asked for) does it through :func:`read_to_host` or
:func:`synchronize`, so that what synchronises is in one place (and countable:
``tests/test_sync.py``).

``read_to_host`` copies with one ``cuMemcpyDtoHAsync`` into this thread's
page-locked buffer (into the new NumPy array itself beyond 4 KiB) and one
``cuStreamSynchronize``: no Numba stream or array objects per call. In the
simulator, device memory is host memory and kernels have already run.
"""

import ctypes
import threading

import numpy as np
from numba import config, cuda

from . import arrays as _arrays, launch as _launch

__all__ = ["read_to_host", "synchronize", "hint_slot"]

SIMULATOR = bool(config.ENABLE_CUDASIM)
_PINNED_BYTES = 4096
_CU_MEMHOSTALLOC_PORTABLE = 1


class _ReadCalls:
    """The driver calls of :func:`read_to_host` (ctypes, bound on first use)."""

    def __init__(self):
        self.drv = drv = _launch._driver()
        c_void_p, c_size_t = ctypes.c_void_p, ctypes.c_size_t
        self.copy = _launch._cfunc(drv.lib, "cuMemcpyDtoHAsync_v2",
                                   [c_void_p, ctypes.c_uint64, c_size_t, c_void_p])
        self.wait = _launch._cfunc(drv.lib, "cuStreamSynchronize", [c_void_p])
        self.host_alloc = _launch._cfunc(drv.lib, "cuMemHostAlloc", [c_void_p, c_size_t, ctypes.c_uint])
        self.host_free = _launch._cfunc(drv.lib, "cuMemFreeHost", [c_void_p])

    def copy_and_wait(self, dst, src, nbytes, stream):
        res = self.copy(dst, src, nbytes, stream)
        return res if res != 0 else self.wait(stream)

    def in_context(self, device_id, fn, *args):
        """``fn(*args)`` with ``device_id``'s primary context current (pushed for the call)."""
        drv, popped = self.drv, ctypes.c_void_p()
        res = drv.ctx_push(_launch._primary_context(device_id))
        if res != 0:
            return res
        try:
            return fn(*args)
        finally:
            drv.ctx_pop(ctypes.addressof(popped))


_read_calls = []


def _calls():
    if not _read_calls:
        _read_calls.append(_ReadCalls())
    return _read_calls[0]


class _PinnedBuffer:
    """Page-locked host memory (portable: pinned for every context), freed with its object."""

    def __init__(self, calls, device_id, nbytes):
        ptr = ctypes.c_void_p()
        res = calls.in_context(device_id, calls.host_alloc, ctypes.addressof(ptr), nbytes,
                               _CU_MEMHOSTALLOC_PORTABLE)
        if res != 0:
            raise RuntimeError("cufold: cuMemHostAlloc of %d bytes failed: %s"
                               % (nbytes, calls.drv.error_name(res)))
        self.calls, self.ptr = calls, ptr.value
        self.bytes = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(self.ptr))

    def __del__(self):
        try:
            self.calls.host_free(self.ptr)
        except Exception:           # the driver may be gone at exit
            pass


_landing = threading.local()        # this thread's _PinnedBuffer: concurrent reads never share one


def read_to_host(arr, stream):
    """A NumPy copy of device array ``arr`` (an :class:`Arr`), read after the work
    queued on raw stream ``stream``: **synchronises the host** (once)."""
    if not arr.c_contiguous:
        return _read_strided(arr, stream)
    nbytes = arr.size * arr.itemsize
    if SIMULATOR:
        out = np.empty(arr.shape, arr.dtype)
        if nbytes:
            ctypes.memmove(out.ctypes.data, arr.ptr, nbytes)
        return out
    calls = _calls()
    if nbytes <= _PINNED_BYTES:
        pinned = getattr(_landing, "buffer", None)
        if pinned is None:
            pinned = _landing.buffer = _PinnedBuffer(calls, arr.device_id, _PINNED_BYTES)
        out, dst = None, pinned.ptr
    else:
        out = np.empty(arr.shape, arr.dtype)
        dst = out.ctypes.data
    if calls.drv.check_ctx:         # several GPUs: the copy runs in the array's device's context
        res = calls.in_context(arr.device_id, calls.copy_and_wait, dst, arr.ptr, nbytes, stream)
    else:
        res = calls.copy_and_wait(dst, arr.ptr, nbytes, stream)
        if res in _launch._WRONG_CONTEXT:      # this thread has no context (or another) current
            res = calls.in_context(arr.device_id, calls.copy_and_wait, dst, arr.ptr, nbytes, stream)
    if res != 0:
        raise RuntimeError("cufold: reading %d bytes back from the device failed: %s"
                           % (nbytes, calls.drv.error_name(res)))
    if out is None:
        out = pinned.bytes[:nbytes].view(arr.dtype).reshape(arr.shape).copy()
    return out




def synchronize(stream, device_id):
    """Wait for the work queued on raw stream ``stream`` (0: the legacy default stream)."""
    if SIMULATOR:
        return
    calls = _calls()
    if calls.drv.check_ctx:         # several GPUs: wait in the stream's device's context
        res = calls.in_context(device_id, calls.wait, stream)
    else:
        res = calls.wait(stream)
        if res in _launch._WRONG_CONTEXT:      # this thread has no context (or another) current
            res = calls.in_context(device_id, calls.wait, stream)
    if res != 0:
        raise RuntimeError("cufold: waiting for stream %#x failed: %s" % (stream or 0, calls.drv.error_name(res)))


def _read_strided(arr, stream):
    nb = _arrays.as_numba(arr)
    if SIMULATOR:
        return nb.copy_to_host()
    with _launch._numba_device_ctx(arr.device_id):
        if not stream:
            return nb.copy_to_host()
        s = cuda.external_stream(stream)
        host = nb.copy_to_host(stream=s)
        s.synchronize()
        return host


# --- hints: what a kernel found, read later without waiting --------------------------------------

#: Slots of one page of hints (page-locked, mapped into the device's address space).
HINT_SLOTS = 1024
_hint_pages = {}
_hint_lock = threading.Lock()


class HintSlot:
    """One int32 that kernels write (``arr``, an :class:`Arr` to pass them) and the host
    reads whenever it likes (:meth:`read`), never waiting: ``-1`` until a kernel's value
    has landed, then the latest one. A *hint*: what a Program learnt on an earlier call,
    to steer the next one; a caller must be correct whatever it reads (slots are shared
    round-robin past :data:`HINT_SLOTS` a device, and a replayed CUDA graph writes them
    too).

    Example: ``slot = hint_slot(0)``; a kernel stores ``slot.arr[0] = 1``; later
    ``slot.read()`` is 1 (or still -1 while that kernel has not run)."""

    __slots__ = ("arr", "_host", "_index")

    def __init__(self, arr, host, index):
        self.arr, self._host, self._index = arr, host, index

    def read(self):
        return int(self._host[self._index])


def hint_slot(device_id):
    """A :class:`HintSlot` of device ``device_id`` (the next of its page, round-robin)."""
    with _hint_lock:
        page = _hint_pages.get(device_id)
        if page is None:
            with _launch._numba_device_ctx(device_id):
                mapped = cuda.mapped_array(HINT_SLOTS, np.int32, portable=True)
                if SIMULATOR:           # (the simulator's device memory is this very array)
                    host, device = mapped._ary, mapped
                else:                   # the device's view of the same page, as a Numba device array
                    host = mapped       # (a MappedNDArray is a NumPy array to cufold: a host array)
                    device = cuda.from_cuda_array_interface(mapped.__cuda_array_interface__, owner=mapped,
                                                            sync=False)
            host[:] = -1
            page = _hint_pages[device_id] = [_arrays.describe(device, "hints"), host, 0]
        arr, host, used = page
        page[2] = used + 1
        index = used % HINT_SLOTS
    return HintSlot(arr.view(np.int32, (1,), 4 * index), host, index)
