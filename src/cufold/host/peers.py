"""Memory that the ranks of one host read from each other: the staging buffers of
``cufold.distributed.all_reduce(algorithm="p2p")``.

Each rank of a ``torch.distributed`` group allocates :data:`SLOTS` buffers once (per group and
device, grown by doubling), shares them, and maps every other rank's: on GPUs through CUDA IPC
(``cuIpcGetMemHandle`` / ``cuIpcOpenMemHandle``: a copy, or a kernel, on one GPU then writes
another GPU's memory over NVLink), under Numba's simulator through files in ``/dev/shm``
(the simulator's device memory is host memory, so the same algorithm runs, and is tested,
between CPU processes).

A call uses the slots in turn: it copies its operand into every other rank's slot, then
every rank waits for every other (:meth:`Staging.barrier`: a kernel of one warp that stores
the call's number into every other rank's flags and waits until every other rank's number is
in its own: stream-ordered, no host synchronisation, and no torch collective, whose host time
is ~46 us), then its kernel folds what its own slot received. A rank writes into a slot again
only :data:`SLOTS` calls later, after a barrier that no rank passes before it has finished the
kernel that read that slot.

Making or growing a group's staging is collective (every rank calls :func:`staging` with the
same size, as every rank makes the same all-reduce call) and **synchronises the host** once,
to exchange the handles; later calls do not.

Public API
----------
``staging(group, device, nbytes) -> Staging | None`` (None: the ranks cannot map each
other's memory -- several hosts, no driver, no IPC -- and say so together)
``Staging``: ``follow(stream)``, ``next_slot()``, ``tensor(slot, rank, offset, dtype, n)`` (a
torch view of any rank's slot), ``array(slot, rank, offset, dtype, n)`` (an
:class:`~cufold.host.arrays.Arr` of any rank's slot), ``barrier(stream)``, ``next_epoch()``,
``failed()``, ``close()``
``arrive_and_wait(flags, me, epoch, polls)``: the barrier's device function (for kernels that
write into other ranks' memory and then meet them, as distributed's small p2p calls do)
``existing(group, device) -> Staging | None`` (the staging made so far; makes none)
``release()`` (every group's staging freed; collective)
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import socket
import uuid

import numpy as np
from numba import config, cuda

from . import arrays as _arrays, launch as _launch
from .launch import BoundedCache

__all__ = ["staging", "Staging", "release", "SLOTS", "MIN_BYTES"]

SIMULATOR = bool(config.ENABLE_CUDASIM)

#: Buffers a rank's staging cycles through (two: a slot is refilled one barrier after the
#: calls that read it).
SLOTS = 2
#: The smallest slot allocated (a group's slots grow by doubling from here).
MIN_BYTES = 1 << 20
#: Byte alignment of every field in a slot (16: the kernels' signatures see aligned arrays).
ALIGN = 16
#: int64 flags after a rank's slots: ``flags[r]`` the last barrier rank ``r`` reached, the last
#: one a barrier that timed out (so groups of at most ``FLAGS - 1`` ranks).
FLAGS = 64
FAILED = FLAGS - 1
#: Bytes a buffer holds after its slots for the flags: a whole 2 MiB page, so that the buffer
#: stays a whole number of large pages. (2 x H200: with 512 bytes of flags past the slots,
#: copies into another rank's slot ran at 289 GB/s instead of 386.)
FLAG_BYTES = 2 << 20
#: Polls of a barrier before it gives up on a rank (about a minute): it then records the call
#: in ``flags[FAILED]`` (:meth:`Staging.failed`; ``distributed``'s ``check=True`` reports it).
BARRIER_POLLS = 1 << 26

_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class _CudaMemory:
    """One rank's buffer in its GPU's memory, shared through a CUDA IPC handle."""

    def __init__(self, nbytes, device_id):
        self.lib = lib = _arrays._driver_lib()
        if lib is None:
            raise RuntimeError("libcuda is not loadable")
        lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
        ptr = ctypes.c_uint64()
        _check(lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc")
        self.ptr, self.device_id = ptr.value, device_id
        h = _IpcHandle()
        rc = lib.cuIpcGetMemHandle(ctypes.byref(h), ctypes.c_uint64(self.ptr))
        if rc != 0:
            self.free()
            _check(rc, "cuIpcGetMemHandle")
        self.handle = bytes(h)

    def open(self, handle):
        """The address in this process of the buffer whose handle another rank sent."""
        p = ctypes.c_uint64()
        _check(self.lib.cuIpcOpenMemHandle_v2(ctypes.byref(p), _IpcHandle.from_buffer_copy(handle),
                                              _CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle")
        return p.value

    def unmap(self, address):
        self.lib.cuIpcCloseMemHandle(ctypes.c_uint64(address))

    def free(self):
        if self.ptr:
            self.lib.cuMemFree_v2(ctypes.c_uint64(self.ptr))
            self.ptr = 0


class _ShmMemory:
    """The simulator's stand-in: a file in /dev/shm that every rank maps."""

    def __init__(self, nbytes, device_id):
        self.path = "/dev/shm/cufold-peers-%s" % uuid.uuid4().hex
        self.device_id, self._maps = device_id, {}
        with open(self.path, "wb+") as f:
            f.truncate(nbytes)
            self._own = mmap.mmap(f.fileno(), nbytes)
        self.buf = np.frombuffer(self._own, dtype=np.uint8)
        self.ptr = self.buf.ctypes.data
        self.handle = self.path.encode()

    def open(self, handle):
        with open(handle.decode(), "rb+") as f:
            m = mmap.mmap(f.fileno(), 0)
        a = np.frombuffer(m, dtype=np.uint8)
        self._maps[a.ctypes.data] = (m, a)
        return a.ctypes.data

    def opened(self, address):
        return self._maps[address][1] if address in self._maps else self.buf

    def shared(self):
        """Every rank has mapped the file: its name can go (no file outlives the processes)."""
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def unmap(self, address):
        self._maps.pop(address, None)          # the mapping closes with its last view

    def free(self):
        self.shared()
        self.buf = None


def _check(rc, what):
    if rc != 0:
        raise RuntimeError("cufold: %s failed (CUDA error %d)" % (what, rc))


class Staging:
    """One group's staging on this rank (see the module doc): :data:`SLOTS` slots of
    ``capacity`` bytes on every rank, ``addresses[r]`` rank ``r``'s buffer in this process."""

    def __init__(self, group, world, rank, capacity, memory, addresses):
        self.group, self.world, self.rank, self.capacity = group, world, rank, capacity
        self.memory, self.addresses = memory, addresses
        self._calls = self._epoch = 0
        self._stream = None
        self._views = BoundedCache(256)
        self.flags = tuple(self._flags(r) for r in range(world))

    def follow(self, stream):
        """Order this call, on raw stream ``stream``, after the group's previous one where that
        ran on another stream: the slots' turns hold for one order of calls (a rank's second
        stream would otherwise refill a slot that its first stream's fold, or another rank's,
        still reads)."""
        last = self._stream
        if last is not None and last != stream:
            _arrays._order_after(last, stream, self.memory.device_id)
        self._stream = stream

    def next_slot(self):
        """The slot of this call (every rank counts the same calls, so all agree)."""
        s = self._calls % SLOTS
        self._calls += 1
        return s

    def _address(self, slot, rank, offset):
        return self.addresses[rank] + slot * self.capacity + offset

    def tensor(self, slot, rank, offset, dtype, n):
        """Rank ``rank``'s slot from byte ``offset`` on as a 1-D torch tensor of ``n``
        ``dtype`` (a torch dtype) items, in this rank's device's view: where a call copies
        its operand (another rank's memory: a copy over NVLink, by a copy engine)."""
        key = (slot, rank, offset, dtype, n)
        t = self._views.get(key)
        if t is None:
            t = self._views.put(key, _torch_view(self, self._address(slot, rank, offset), dtype, n))
        return t

    def array(self, slot, rank, offset, dtype, n):
        """Rank ``rank``'s slot from byte ``offset`` on as an Arr of ``n`` ``dtype`` (NumPy)
        items, for a kernel on this rank's device."""
        key = ("arr", slot, rank, offset, dtype, n)
        a = self._views.get(key)
        if a is None:
            address = self._address(slot, rank, offset)
            if SIMULATOR:
                a = _arrays.describe(_sim_array(self, address, dtype, n))
            else:
                a = _arrays.Arr(address, (n,), (1,), np.dtype(dtype), n, "cai", self, self.memory.device_id)
            a = self._views.put(key, a)
        return a

    def _flags(self, rank):
        address = self.addresses[rank] + SLOTS * self.capacity
        if SIMULATOR:
            return _arrays.describe(_sim_array(self, address, np.int64, FLAGS))
        return _arrays.Arr(address, (FLAGS,), (1,), np.dtype(np.int64), FLAGS, "cai", self, self.memory.device_id)

    def next_epoch(self):
        """The number of this call's barrier (every rank counts the same barriers)."""
        self._epoch += 1
        return self._epoch

    def barrier(self, stream):
        """Every rank has reached this point of its stream ``stream`` (a raw handle): a
        kernel waits for it there; the host does not wait."""
        _launch.launch(_barrier_kernel(), ("peers_barrier",), 1, 32, stream,
                       (self.flags, np.int64(self.rank), np.int64(self.next_epoch()), np.int64(BARRIER_POLLS)))

    def failed(self):
        """A 0-d torch view of this rank's ``flags[FAILED]``: the number of a barrier that gave
        up waiting, else 0 (``distributed``'s agreement step reads it with its exchange, so
        that ``check=True`` reports a timed-out call on every rank, with no wait of its own)."""
        import torch
        t = self._views.get("failed")
        if t is None:
            address = self.addresses[self.rank] + SLOTS * self.capacity + 8 * FAILED
            t = self._views.put("failed", _torch_view(self, address, torch.int64, 1).reshape(()))
        return t

    def close(self):
        """Unmap the other ranks' buffers and free this rank's (no rank may still use them:
        :func:`staging` synchronises every rank first)."""
        for r, address in enumerate(self.addresses):
            if r != self.rank:
                self.memory.unmap(address)
        self.memory.free()
        self._views.clear()
        self.flags = ()


def _torch_view(st, address, dtype, n):
    import torch
    if SIMULATOR:
        return torch.from_numpy(_sim_array(st, address, _numpy_dtype(dtype), n)._ary)
    holder = _Interface(address, n, np.dtype(_numpy_dtype(dtype)).str)
    return torch.as_tensor(holder, device=torch.device("cuda", st.memory.device_id))


def _numpy_dtype(dtype):
    return np.dtype(str(dtype).rsplit(".", 1)[-1]) if not isinstance(dtype, np.dtype) else dtype


def _sim_array(st, address, dtype, n):
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    dt = np.dtype(dtype)
    base = st.memory.opened(_base_of(st, address))
    start = address - base.ctypes.data
    return FakeCUDAArray(base[start: start + n * dt.itemsize].view(dt))


def _base_of(st, address):
    for a in st.addresses:
        if a <= address < a + SLOTS * st.capacity + FLAG_BYTES:
            return a
    raise ValueError("cufold: address outside the staging")


@cuda.jit(device=True)
def arrive_and_wait(flags, me, epoch, polls):
    """The barrier's device side, for the threads ``r`` of a block (``r < W``): thread ``r``
    stores ``epoch`` into rank ``r``'s ``flags[me]`` (a store over NVLink, after a system-wide
    fence: what this rank wrote into rank ``r``'s memory lands first), then polls this rank's
    ``flags[r]`` until it holds ``epoch``, at most ``polls`` times. The poll is an atomic read
    (L2, where rank ``r``'s store lands): a compare-and-swap that never swaps, since a
    read-modify-write such as ``max(flag, 0)`` writes the value back and, in the simulator,
    may erase a store that lands between its read and its write. Every thread of the block
    that wrote into another rank's memory must have fenced (``threadfence_system``) and met
    the others at ``syncthreads`` first."""
    r = cuda.threadIdx.x
    if r < len(flags) and r != me:
        cuda.threadfence_system()
        theirs = flags[r]
        theirs[me] = epoch
        cuda.threadfence_system()
        mine = flags[me]
        k = 0
        while cuda.atomic.cas(mine, r, -1, -1) < epoch:     # a read (no flag is -1) that never writes
            k += 1
            if k > polls:
                cuda.atomic.max(mine, FAILED, epoch)
                break
            cuda.nanosleep(np.uint32(256))
        cuda.threadfence_system()


@functools.lru_cache(maxsize=None)
def _barrier_kernel():
    """``(flags, me, epoch, polls)``: one warp, :func:`arrive_and_wait`."""
    def barrier(flags, me, epoch, polls):
        arrive_and_wait(flags, me, epoch, polls)
    return barrier


class _Interface:
    """A bare ``__cuda_array_interface__`` over a staging address (torch wraps it)."""

    def __init__(self, address, n, typestr):
        self.__cuda_array_interface__ = {"data": (address, False), "shape": (n,), "typestr": typestr,
                                         "strides": None, "version": 3}


_STAGING = {}        # (group, device index) -> Staging, or False where the ranks cannot share


def _group_key(group, device):
    if group is None:
        import torch.distributed as dist
        group = dist.group.WORLD
    return (group, device.index if device.type == "cuda" else -1)


def staging(group, device, nbytes):
    """The staging of ``group`` on this rank's ``device`` (a torch device), with slots of
    at least ``nbytes``; None where the ranks cannot map each other's memory. Collective
    when it makes or grows one (every rank must call it with the same ``nbytes``)."""
    key = _group_key(group, device)
    st = _STAGING.get(key)
    if st is False:
        return None
    if st is not None and st.capacity >= nbytes:
        return st
    capacity = MIN_BYTES
    while capacity < nbytes:
        capacity *= 2
    if st is not None:
        _retire(st)
    st = _make(group, device, capacity)
    _STAGING[key] = st if st is not None else False
    return st


def existing(group, device):
    """The staging of ``group`` on ``device`` if one was made (never makes one)."""
    return _STAGING.get(_group_key(group, device)) or None


def _retire(st):
    """Free a staging every rank holds: after every rank's device has finished with it."""
    import torch
    import torch.distributed as dist
    if not SIMULATOR:
        torch.cuda.synchronize()
    dist.barrier(group=st.group)
    st.close()


def _make(group, device, capacity):
    import torch.distributed as dist
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    memory, failure = None, None
    try:
        if not SIMULATOR and device.type != "cuda":
            raise RuntimeError("not a CUDA device")
        if world > FAILED:
            raise RuntimeError("more ranks than flags")
        with _on(device):
            memory = (_ShmMemory if SIMULATOR else _CudaMemory)(SLOTS * capacity + FLAG_BYTES, device.index or 0)
            _zero_flags(memory, SLOTS * capacity)
    except Exception as exc:            # the ranks decide together below
        failure = repr(exc)
    mine = (failure is None, socket.gethostname(), memory.handle if memory is not None else b"")
    every = [None] * world
    with _on(device):
        dist.all_gather_object(every, mine, group=group)
    ok = all(e[0] for e in every) and len({e[1] for e in every}) == 1
    addresses = [0] * world
    if ok:
        try:
            with _on(device):
                for r, e in enumerate(every):
                    addresses[r] = memory.ptr if r == rank else memory.open(e[2])
        except Exception:
            ok = False
        agreed = [None] * world
        with _on(device):
            dist.all_gather_object(agreed, ok, group=group)
        ok = all(agreed)
    if not ok:
        if memory is not None:
            for r, a in enumerate(addresses):
                if a and r != rank:
                    memory.unmap(a)
            memory.free()
        return None
    if SIMULATOR:
        memory.shared()
    return Staging(group, world, rank, capacity, memory, addresses)


def _zero_flags(memory, offset):
    """A new buffer's flags, zeroed before any rank can see the buffer (its handle goes out
    only after this: the exchange synchronises)."""
    if SIMULATOR:
        memory.buf[offset: offset + 8 * FLAGS] = 0
        return
    _check(memory.lib.cuMemsetD8_v2(ctypes.c_uint64(memory.ptr + offset), ctypes.c_ubyte(0),
                                    ctypes.c_size_t(8 * FLAGS)), "cuMemsetD8")
    _check(memory.lib.cuCtxSynchronize(), "cuCtxSynchronize")


def _on(device):
    """The CUDA device context of ``device`` for the driver calls (nothing in the simulator)."""
    if SIMULATOR or device.type != "cuda":
        return contextlib.nullcontext()
    import torch
    return torch.cuda.device(device)


def release():
    """Free every group's staging (collective over each group that has one)."""
    for key, st in list(_STAGING.items()):
        if st:
            _retire(st)
        del _STAGING[key]
