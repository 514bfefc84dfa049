"""Warp-level intrinsics, and a faster block engine, for Numba's CUDA simulator.

Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) runs every CUDA thread of a
block as a Python thread, but it implements none of the warp-level intrinsics
(shuffles, votes, match, ``activemask``, ``syncwarp``...).  Kernels that use
them -- which includes every cufold primitive -- therefore cannot be debugged
without a GPU.  :func:`install` adds them to the simulator with the hardware's
semantics:

* warps are formed from the linear thread id within a block
  (``tid = x + bx * (y + by * z)``; warp ``tid // 32``, lane ``tid % 32``);
* a collective call is a rendezvous: every *live* lane named in ``mask``
  (it exists in the block and has not exited) must arrive at the same
  intrinsic with the same mask before any of them gets a result;
* misuse that is undefined behaviour or a hang on hardware (a mask without the
  caller, lanes of one group waiting at different intrinsics, a deadlock)
  raises a clear exception instead of hanging the process.

It also replaces the simulator's block engine, whose cost grew erratically with
the input (a launch thread polling every CUDA thread while holding the
interpreter lock; a lock taken twice per device-function call; new Python
threads for every block). Here:

* one Python thread per thread index serves every block of a launch;
* a thread that waits (``cuda.syncthreads()``, a warp collective) parks on a
  lock of its own and is woken by whoever completes the barrier or group, never
  by polling;
* the block counts its running threads: when none runs and some wait, no
  barrier or collective can ever complete, which is a deadlock, reported at once
  with what every thread waits for (:class:`WarpDeadlockError`). A thread that is
  merely slow is waited for, however long it takes;
* device functions see the simulator's ``cuda`` module through one swap of
  their globals per launch, not a locked swap per call.

Nothing here is used on a real GPU: :func:`install` is a no-op unless the
simulator is active.

Public API: :func:`install`, :func:`is_simulator`, :func:`timeout`, and the
exception classes :class:`WarpSimulatorError`, :class:`WarpMaskError`,
:class:`WarpMismatchError`, :class:`WarpTimeoutError` and
:class:`WarpDeadlockError`, and the warning :class:`WarpWaitWarning`.
"""

from __future__ import annotations

import fractions
import math
import os
import sys
import threading
import time
import warnings

import numpy as np

__all__ = [
    "install",
    "is_simulator",
    "timeout",
    "TIMEOUT_ENV",
    "WarpSimulatorError",
    "WarpMaskError",
    "WarpMismatchError",
    "WarpTimeoutError",
    "WarpDeadlockError",
    "WarpWaitWarning",
    "DEFAULT_TIMEOUT",
    "PIN_ENV",
]

#: Environment variable: every this many seconds, a thread still waiting at a
#: barrier or a collective warns (:class:`WarpWaitWarning`) whom it waits for.
TIMEOUT_ENV = "CUFOLD_SIM_TIMEOUT"
#: Seconds between such warnings when :data:`TIMEOUT_ENV` is not set.
DEFAULT_TIMEOUT = 60.0

_WARP = 32
_FULL = 0xFFFFFFFF


# ---------------------------------------------------------------------------
# Errors
#
# Each class takes a single message argument: a failing thread's exception is
# re-created as ``type(e)(msg)`` to prefix the thread/block ids, so the class
# (and hence ``pytest.raises``/``except`` matching) survives.


class WarpSimulatorError(RuntimeError):
    """Base class of the errors raised by the simulated warp intrinsics."""


class WarpMaskError(WarpSimulatorError):
    """A lane called a warp intrinsic with a mask that does not contain it."""


class WarpMismatchError(WarpSimulatorError):
    """Lanes of one group wait at different intrinsics or with different masks."""


class WarpTimeoutError(WarpSimulatorError):
    """Base class of :class:`WarpDeadlockError`; what earlier releases raised after
    a timeout, before the simulator could tell a deadlock from slow threads."""


class WarpDeadlockError(WarpTimeoutError):
    """Every live thread of a block waits, at barriers or warp collectives that can
    never complete."""


class WarpWaitWarning(RuntimeWarning):
    """A thread has waited ``CUFOLD_SIM_TIMEOUT`` seconds (again) for threads that
    are still running. Turn it into an error to stop such kernels:
    ``warnings.simplefilter("error", cufold.simulator.WarpWaitWarning)``."""


# ---------------------------------------------------------------------------
# Small helpers


def is_simulator() -> bool:
    """Return True when Numba's CUDA simulator is active.

    numba-cuda reads ``NUMBA_ENABLE_CUDASIM`` into its own config module
    (``numba.cuda.core.config``); older releases use ``numba.config``.
    """
    try:
        from numba.cuda.core import config
    except ImportError:  # pragma: no cover - older numba-cuda / numba
        from numba import config
    return bool(getattr(config, "ENABLE_CUDASIM", False))


def timeout() -> float:
    """Seconds between the warnings of a thread that keeps waiting for running
    threads (``CUFOLD_SIM_TIMEOUT``, default 60). Waiting never fails: a
    deadlock is detected when it happens, and running threads may take as long
    as they take.

    Read at every collective call, so tests may change it with
    ``monkeypatch.setenv`` between kernel launches.
    """
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"{TIMEOUT_ENV}={raw!r} is not a number of seconds"
        ) from None
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV}={raw!r} must be a positive number")
    return value


def _lanes(mask: int) -> list[int]:
    """Lane numbers of the set bits of a 32-bit mask, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _fmt_lanes(mask: int) -> str:
    lanes = _lanes(mask)
    return "[" + ", ".join(map(str, lanes)) + "]" if lanes else "[]"


def _fmt_threads(ids) -> str:
    """Thread ids as ranges: ``0-31, 40, 64-127``."""
    ids = sorted(ids)
    parts, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else "%d-%d" % (ids[i], ids[j]))
        i = j + 1
    return ", ".join(parts)


def _norm_mask(mask) -> int:
    # Hardware truncates the mask to 32 bits, so -1 (int32) means all lanes.
    return int(mask) & _FULL


def _match_key(value):
    """Key under which match_any/match_all compare values.

    Hardware compares bit patterns, so for floats NaN matches a NaN of the same
    bits and -0.0 does not match 0.0; integers compare by value.  Other objects
    (the simulator accepts anything) fall back to ``==``.
    """
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return ("int", int(value))
    if isinstance(value, (float, np.floating)):
        arr = np.asarray(value)
        if not isinstance(value, np.floating):
            arr = arr.astype(np.float64)
        return ("float", arr.dtype.str, arr.tobytes())
    return ("obj", value)


def _keys_equal(a, b) -> bool:
    if a[0] != "obj" and b[0] != "obj":
        return a == b
    try:
        return bool(a[1] == b[1])
    except Exception:  # noqa: BLE001 - arbitrary objects: unequal if incomparable
        return False


# ---------------------------------------------------------------------------
# What waits: warp posts, barrier posts, failures


class _Post:
    """What one lane posted at a collective: which one, its mask, its operands."""

    __slots__ = ("kind", "mask", "payload")

    def __init__(self, kind, mask, payload):
        self.kind = kind
        self.mask = mask
        self.payload = payload

    def describe(self):
        return f"{self.kind}(mask=0x{self.mask:08x})"


class _Failure:
    """A result telling a woken thread to raise ``exc_type(message)``."""

    __slots__ = ("exc_type", "message")

    def __init__(self, exc_type, message):
        self.exc_type = exc_type
        self.message = message


#: What a thread parked in ``cuda.syncthreads()`` (or ``syncthreads_count`` & co) waits at.
_BARRIER = "barrier"


class _WarpState:
    """Rendezvous state of one warp of one block; guarded by the block's lock.

    A lane has at most one post at a time (it waits until its collective
    completes), so posts are keyed by lane.
    """

    def __init__(self, block, warp, exist_mask):
        self.block = block
        self.warp = warp
        self.exist_mask = exist_mask  # lanes that exist in this block
        self.exited_mask = 0  # lanes whose thread has finished
        self.posts: dict[int, _Post] = {}
        # (kind, mask) -> bit mask of the lanes posted there: a group is complete
        # and a mismatch impossible at a glance (an arrival costs O(1), not O(32)).
        self.groups: dict[tuple, int] = {}
        # Bookkeeping for activemask() (see there): a logical clock ticking at
        # every completed group and every exit, the clock value of each lane's
        # last completed collective and of its exit, and the lanes that called
        # activemask() since their last collective.
        self.clock = 0
        self.last_sync = [0] * _WARP
        self.exit_clock = [0] * _WARP
        self.am_called = 0

    @property
    def live_mask(self) -> int:
        return self.exist_mask & ~self.exited_mask

    def thread(self, lane):
        return self.block.pool.threads[self.warp * _WARP + lane]

    def where(self) -> str:
        return f"{self.block.where()}, warp {self.warp}"

    def post(self, lane, post):
        self.posts[lane] = post
        key = (post.kind, post.mask)
        self.groups[key] = self.groups.get(key, 0) | 1 << lane

    def unpost(self, lane):
        post = self.posts.pop(lane, None)
        if post is not None:
            key = (post.kind, post.mask)
            left = self.groups[key] & ~(1 << lane)
            if left:
                self.groups[key] = left
            else:
                del self.groups[key]
        return post

    def try_complete(self, kind, mask, caller=None):
        """Complete the group (kind, mask) if all its live lanes have posted.

        Computes the results of every lane of the group at once, so each lane
        sees the same snapshot of values, and wakes every lane but ``caller``.
        Returns ``(True, caller's result)`` or ``(False, None)``.
        """
        needed = mask & self.live_mask
        if self.groups.get((kind, mask), 0) != needed:     # posted lanes are live lanes of mask
            return False, None
        posts = self.posts
        group = {lane: posts.pop(lane) for lane in _lanes(needed)}
        del self.groups[(kind, mask)]
        if not group:
            return True, None
        self.clock += 1
        for lane in group:
            self.last_sync[lane] = self.clock
        self.am_called &= ~needed
        try:
            results = _compute(kind, mask, group)
        except Exception as e:  # noqa: BLE001
            # E.g. a predicate without a truth value.  Whoever completes the
            # group (possibly an exiting lane) must not raise here: every lane
            # of the group raises it from its own wait instead.
            results = dict.fromkeys(group, _failure_from(e, kind, self))
        mine = None
        for lane, r in results.items():
            if lane == caller:
                mine = r
            else:
                self.block.wake(self.thread(lane), r)
        return True, mine

    def active_mask(self, lane) -> int:
        """activemask() as seen by ``lane``.

        Live lanes count as active (divergence is invisible here).  Lanes race
        ahead in the simulator, so a lane that has already exited still counts
        if, like the caller, it called activemask() after its last collective
        and it exited after the caller's last collective: on hardware the two
        would have executed activemask() together.  Lanes that exited earlier
        (e.g. an early ``return``) do not count.
        """
        self.am_called |= 1 << lane
        mask = self.live_mask
        ref = self.last_sync[lane]
        for other in _lanes(self.exited_mask & self.am_called):
            if self.exit_clock[other] > ref:
                mask |= 1 << other
        return mask

    def lane_exited(self, lane):
        """Drop a finished lane and complete the groups that waited only for it."""
        self.clock += 1
        self.exit_clock[lane] = self.clock
        self.exited_mask |= 1 << lane
        self.unpost(lane)
        for kind, mask in list(self.groups):
            self.try_complete(kind, mask)

    def lane_state(self, lane) -> str:
        """What a lane this warp waits for is doing."""
        if self.exited_mask >> lane & 1:
            return f"lane {lane}: exited"
        return f"lane {lane}: {self.block.state_of(self.thread(lane))}"


def _failure_from(exc, kind, ws) -> _Failure:
    msg = f"cufold simulator: {kind} failed in {ws.where()}: {exc}"
    try:
        type(exc)(msg)  # keep the type if it takes a single message
        return _Failure(type(exc), msg)
    except Exception:  # noqa: BLE001
        return _Failure(WarpSimulatorError, f"{msg} ({type(exc).__name__})")


def _compute(kind, mask, group):
    """Results, per lane, of one completed collective.

    ``group`` maps each participating lane (live and in mask) to its post.
    """
    if kind in _SHUFFLES:
        out = {}
        for lane, post in group.items():
            value, b = post.payload
            # Hardware uses only the low 5 bits of the lane/offset operand.
            b = int(b) & 31
            if kind == "shfl_sync":
                src = b
            elif kind == "shfl_up_sync":
                src = lane - b
            elif kind == "shfl_down_sync":
                src = lane + b
            else:  # shfl_xor_sync
                src = lane ^ b
            # Out of the 32-lane segment, or not a live participant: keep own.
            source = group.get(src) if 0 <= src < _WARP else None
            out[lane] = value if source is None else source.payload[0]
        return out
    if kind == "syncwarp":
        return dict.fromkeys(group, None)
    if kind in ("ballot_sync", "all_sync", "any_sync", "eq_sync"):
        preds = {lane: bool(post.payload) for lane, post in group.items()}
        if kind == "ballot_sync":
            r = 0
            for lane, p in preds.items():
                if p:
                    r |= 1 << lane
        elif kind == "all_sync":
            r = int(all(preds.values()))
        elif kind == "any_sync":
            r = int(any(preds.values()))
        else:
            r = int(len(set(preds.values())) <= 1)
        return dict.fromkeys(group, r)
    if kind in ("match_any_sync", "match_all_sync"):
        keys = {lane: _match_key(post.payload) for lane, post in group.items()}
        if kind == "match_any_sync":
            out = {}
            for lane, k in keys.items():
                m = 0
                for other, ko in keys.items():
                    if _keys_equal(k, ko):
                        m |= 1 << other
                out[lane] = m
            return out
        first = next(iter(keys.values()))
        same = all(_keys_equal(first, k) for k in keys.values())
        # Hardware returns the participating (non-exited) lanes of the mask,
        # e.g. 0xFF for a full mask in a warp of 8 threads (seen on an H200).
        r = (sum(1 << lane for lane in group) if same else 0, same)
        return dict.fromkeys(group, r)
    raise AssertionError(f"unknown warp collective {kind!r}")  # pragma: no cover


_SHUFFLES = ("shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync")


# ---------------------------------------------------------------------------
# The block engine (stands in for the simulator's BlockManager and BlockThread)


_Dim3 = None  # the simulator's Dim3 (set by install)


class _Block:
    """One block of a launch: its barrier, its warps, and how many of its
    threads run.

    Everything here is guarded by ``lock``. A thread that must wait parks on a
    lock of its own and is woken by the thread that completes what it waits for
    (or that exits, letting a group complete without it). ``running`` counts the
    live threads that are not parked: when it falls to 0 while some are parked,
    nothing can ever wake them.
    """

    def __init__(self, pool, grid_point):
        self.pool = pool
        self.blockIdx = _Dim3(*grid_point)
        self.lock = threading.Lock()
        n = pool.nthreads
        self.live = n  # threads that have not exited
        self.running = n  # live threads that are not parked
        self.barrier = {}  # thread -> (kind, value) posted at cuda.syncthreads() & co
        self.warps = [_WarpState(self, w, _FULL if n - w * _WARP >= _WARP else (1 << (n - w * _WARP)) - 1)
                      for w in range((n + _WARP - 1) // _WARP)]
        self.error = None  # (exception, traceback) of the first thread that raised
        self.over = False
        self.done = threading.Lock()  # released once: every thread exited, or one raised
        self.done.acquire()

    def where(self) -> str:
        f = self.pool.fn
        return f"kernel {getattr(f, '__name__', repr(f))!r}, block {tuple(self.blockIdx)}"

    def state_of(self, t) -> str:
        w = t.waiting
        if t.exited:
            return "exited"
        if w is None:
            return "running (has not reached the call)"
        if w is _BARRIER:
            return "blocked in cuda.syncthreads()"
        return f"waiting at {w.describe()}"

    # -- parking (lock held by the caller) ----------------------------------

    def wake(self, t, result):
        t.waiting = None
        t.result = result
        self.running += 1
        t.park.release()

    def wait(self, t, what, interval):
        """Park ``t`` at ``what`` until woken; returns its result or raises.
        Called with the lock held; returns with it released. Every ``interval``
        seconds of waiting, a :class:`WarpWaitWarning` says for whom."""
        t.waiting = what
        self.running -= 1
        if self.running == 0 and self.error is None:
            self._fail_all(WarpDeadlockError, self._deadlock_message())
        self.lock.release()
        waited = 0.0
        while not t.park.acquire(timeout=interval):
            waited += interval
            with self.lock:
                message = None if t.waiting is None else self._wait_message(t, waited)
            if message is None:
                continue  # woken meanwhile: the park is released
            try:
                warnings.warn(message, WarpWaitWarning, stacklevel=1)
            except BaseException:
                # The warning was made an error: stop waiting, as if never posted.
                with self.lock:
                    if t.waiting is None:
                        t.park.acquire()
                    else:
                        self._unpost(t)
                        t.waiting = None
                        self.running += 1
                raise
        r = t.result
        t.result = None
        if r.__class__ is _Failure:
            raise r.exc_type(r.message)
        return r

    def _unpost(self, t):
        if t.waiting is _BARRIER:
            self.barrier.pop(t, None)
        elif t.waiting is not None:
            self.warps[t.thread_id >> 5].unpost(t.thread_id & 31)

    def _fail_all(self, exc_type, message):
        """Wake every parked thread with an error."""
        failure = _Failure(exc_type, message)
        for t in self.pool.threads:
            if t.waiting is not None:
                self._unpost(t)
                self.wake(t, failure)

    # -- the barrier ----------------------------------------------------------

    def try_barrier(self, caller=None):
        """Release the barrier if every live thread is at it; wakes all but
        ``caller``. Returns ``(True, caller's result)`` or ``(False, None)``."""
        posts = self.barrier
        if not posts or len(posts) < self.live:
            return False, None
        self.barrier = {}
        truths = [bool(v) for _, v in posts.values()]
        results = {"syncthreads": None, "count": sum(truths), "and": int(all(truths)), "or": int(any(truths))}
        mine = None
        for t, (kind, _) in posts.items():
            if t is caller:
                mine = results[kind]
            else:
                self.wake(t, results[kind])
        return True, mine

    # -- ends of threads --------------------------------------------------------

    def exited(self, t):
        with self.lock:
            t.exited = True
            self.live -= 1
            self.running -= 1
            self.warps[t.thread_id >> 5].lane_exited(t.thread_id & 31)
            self.try_barrier()
            if self.live == 0:
                self._finish()
            elif self.running == 0 and self.error is None:
                self._fail_all(WarpDeadlockError, self._deadlock_message())

    def failed(self, exc, tb):
        with self.lock:
            if self.error is None:
                self.error = (exc, tb)
                self._finish()

    def _finish(self):
        if not self.over:
            self.over = True
            self.done.release()

    def abort(self):
        """After a thread raised: the others raise at their next barrier or collective."""
        with self.lock:
            for t in self.pool.threads:
                t.abort = True
            self._fail_all(RuntimeError, "cufold simulator: aborted, another thread of the block raised")

    # -- what the errors say ----------------------------------------------------

    def _deadlock_message(self) -> str:
        parts = []
        for ws in self.warps:
            groups = {}
            for lane, p in ws.posts.items():
                groups.setdefault((p.kind, p.mask), []).append(lane)
            for (kind, mask), lanes in groups.items():
                waiting = sum(1 << lane for lane in lanes)
                missing = mask & ws.live_mask & ~waiting
                states = "; ".join(ws.lane_state(lane) for lane in _lanes(missing))
                parts.append(f"warp {ws.warp}: lanes {_fmt_lanes(waiting)} wait at "
                             f"{_Post(kind, mask, None).describe()} for missing lanes "
                             f"{_fmt_lanes(missing)} ({states})")
        if self.barrier:
            others = [t.thread_id for t in self.pool.threads
                      if not t.exited and t not in self.barrier]
            parts.append(f"threads {_fmt_threads(t.thread_id for t in self.barrier)} wait in "
                         f"cuda.syncthreads() for threads {_fmt_threads(others)}, which wait at warp "
                         f"collectives")
        return (f"cufold simulator: deadlock in {self.where()}: every live thread waits and none "
                f"can proceed. " + "; ".join(parts))

    def _wait_message(self, t, waited) -> str:
        """Whom ``t``, parked for ``waited`` seconds, still waits for, and what they do."""
        what = t.waiting
        if what is _BARRIER:
            missing = [u for u in self.pool.threads if not u.exited and u not in self.barrier]
            states = "; ".join(f"thread {u.thread_id}: {self.state_of(u)}" for u in missing[:8])
            return (f"cufold simulator: thread {t.thread_id} has waited {waited:g} s in cuda.syncthreads() "
                    f"in {self.where()} for threads {_fmt_threads(u.thread_id for u in missing)} ({states})")
        ws = self.warps[t.thread_id >> 5]
        missing = what.mask & ws.live_mask & ~sum(
            1 << lane for lane, p in ws.posts.items() if p.kind == what.kind and p.mask == what.mask)
        states = "; ".join(ws.lane_state(lane) for lane in _lanes(missing))
        return (f"cufold simulator: lane {t.thread_id & 31} has waited {waited:g} s at {what.describe()} in "
                f"{ws.where()} for lanes {_fmt_lanes(missing)} ({states})")


class _SimThread(threading.Thread):
    """A CUDA thread index of one launch, run for every block in turn (a new
    Python thread per CUDA thread per block cost more than small kernels do).

    Has what the simulator's ``cuda`` module reads from the current thread:
    ``threadIdx``, ``blockIdx``, ``thread_id`` and the ``syncthreads`` family.
    """

    def __init__(self, pool, index, thread_id):
        super().__init__(daemon=True, name="cufold-sim-thread-%d" % thread_id)
        self.pool = pool
        self.threadIdx = _Dim3(*index)
        self.thread_id = thread_id
        self.blockIdx = None
        self.block = None
        self.abort = False
        self.exited = False
        self.waiting = None  # what the thread is parked at: a _Post, _BARRIER, or None
        self.result = None  # what the waker left for it
        self.go = threading.Lock()  # released by the pool to run the next block
        self.go.acquire()
        self.park = threading.Lock()  # released by whoever wakes the parked thread
        self.park.acquire()

    def begin(self, block):
        self.block = block
        self.blockIdx = block.blockIdx
        self.abort = self.exited = False
        self.waiting = self.result = None

    def run(self):
        pool = self.pool
        if pool.debug:
            np.seterr(divide="raise")
        if pool.cpu is not None:
            try:
                os.sched_setaffinity(0, {pool.cpu})     # this thread only (Linux)
            except OSError:
                pass
        while True:
            self.go.acquire()
            if pool.closed:
                return
            block = self.block
            try:
                pool.fn(*pool.args)
            except BaseException as e:  # noqa: BLE001 - the launch re-raises it
                block.failed(self._located(e), sys.exc_info()[2])
            block.exited(self)

    def _located(self, e):
        """``e`` with the thread and block ids in front of its message, as Numba's
        simulator reports it (the class is kept where it takes one message)."""
        where = "tid=%s ctaid=%s" % (list(self.threadIdx), list(self.blockIdx))
        msg = where if str(e) == "" else "%s: %s" % (where, e)
        try:
            return type(e)(msg)
        except Exception:  # noqa: BLE001
            return e

    def _barrier(self, kind, value):
        block = self.block
        interval = timeout()
        block.lock.acquire()
        if self.abort:
            block.lock.release()
            raise RuntimeError("abort flag set on syncthreads call")
        block.barrier[self] = (kind, value)
        done, mine = block.try_barrier(caller=self)
        if done:
            block.lock.release()
            return mine
        return block.wait(self, _BARRIER, interval)

    def syncthreads(self):
        self._barrier("syncthreads", None)

    def syncthreads_count(self, value):
        return self._barrier("count", value)

    def syncthreads_and(self, value):
        return self._barrier("and", value)

    def syncthreads_or(self, value):
        return self._barrier("or", value)


#: Environment variable: ``0`` leaves the simulated threads on every core (see :func:`_pin_cpu`).
PIN_ENV = "CUFOLD_SIM_PIN"


def _pin_cpu():
    """The core to run a launch's threads on: the launching thread's current one, or
    None (``CUFOLD_SIM_PIN=0``, or not Linux).

    The interpreter lock lets one simulated thread run at a time anyway, and each
    barrier or collective hands it from thread to thread: on one core a handoff is
    a plain context switch, across cores a wake-up of another core (a warp-heavy
    kernel ran 2.9x faster pinned). Taken afresh at every launch, so parallel
    processes (pytest-xdist workers) keep to their own cores."""
    if os.environ.get(PIN_ENV, "1") == "0" or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        with open("/proc/thread-self/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[36])    # field 39: the processor
    except (OSError, ValueError, IndexError):
        return None


class _Pool:
    """The threads of one launch, one per thread index, started at its first block."""

    def __init__(self, fn, block_dim, debug, args):
        self.fn, self.debug, self.args = fn, debug, args
        self.cpu = _pin_cpu()
        bx, by, bz = block_dim
        self.nthreads = bx * by * bz
        self.threads = [_SimThread(self, (x, y, z), x + bx * (y + by * z))
                        for z in range(bz) for y in range(by) for x in range(bx)]
        self.threads.sort(key=lambda t: t.thread_id)
        self.closed = False
        self.started = False

    def run_block(self, grid_point):
        block = _Block(self, grid_point)
        for t in self.threads:
            t.begin(block)
        if not self.started:
            self.started = True
            for t in self.threads:
                t.start()
        for t in self.threads:
            t.go.release()
        block.done.acquire()
        if block.error is not None:
            block.abort()
            exc, tb = block.error
            raise exc.with_traceback(tb)

    def close(self):
        """Let the threads return (those still running an aborted block return after it)."""
        self.closed = True
        if not self.started:
            return
        for t in self.threads:
            try:
                t.go.release()
            except RuntimeError:  # not yet taken for the current block: it will see `closed`
                pass


class _BlockRunner:
    """What the simulator's kernel launch creates per block (its ``BlockManager``):
    runs the block on the launch's pool of threads."""

    def __init__(self, f, grid_dim, block_dim, debug):
        self._f, self._block_dim, self._debug = f, block_dim, debug

    def run(self, grid_point, *args):
        global _pool
        if _pool is None:
            _pool = _Pool(self._f, self._block_dim, self._debug, args)
        _pool.run_block(grid_point)


_pool = None  # the running launch's pool (the simulator runs one launch at a time)


# ---------------------------------------------------------------------------
# Device functions: one swap of their globals per launch

_swap_lock = threading.Lock()
_swaps = {}  # id(globals) -> (globals, {name: the real cuda module}) for the running launch
_real_cuda = None


def _swap_in(g, fake):
    """Point the names of ``g`` that hold the real ``cuda`` module at the launch's
    simulated one, until the launch ends (:func:`_end_launch`)."""
    with _swap_lock:
        if id(g) in _swaps:
            return
        orig = {k: v for k, v in g.items() if v is _real_cuda}
        for k in orig:
            g[k] = fake
        _swaps[id(g)] = (g, orig)


def _end_launch():
    global _pool
    with _swap_lock:
        for g, orig in _swaps.values():
            g.update(orig)
        _swaps.clear()
    if _pool is not None:
        _pool.close()
        _pool = None


def _current():
    t = threading.current_thread()
    if t.__class__ is not _SimThread:
        raise WarpSimulatorError(
            "warp intrinsics can only be called from a simulated CUDA kernel"
        )
    return t


def _collective(kind, mask, payload):
    """Post this lane at collective ``kind`` and wait until its group completes."""
    t = _current()
    block = t.block
    lane = t.thread_id & 31
    ws = block.warps[t.thread_id >> 5]
    mask = _norm_mask(mask)
    if not mask >> lane & 1:
        raise WarpMaskError(
            f"cufold simulator: {kind} called by lane {lane} "
            f"(thread {tuple(t.threadIdx)}) in {ws.where()} "
            f"with mask 0x{mask:08x}, which does not contain "
            f"the calling lane (undefined behaviour on hardware)"
        )
    interval = timeout()
    post = _Post(kind, mask, payload)
    block.lock.acquire()
    if t.abort:
        block.lock.release()
        raise RuntimeError(f"abort flag set while waiting in {kind}")
    # Two lanes that each name the other but wait at different collectives (or
    # with different masks) can never both proceed: report it now.  (A lane of
    # my mask waiting at another collective that does *not* include me is fine:
    # it may finish that one and then join mine.) Only lanes posted elsewhere
    # than my (kind, mask) can disagree.
    groups = ws.groups
    if groups and (len(groups) > 1 or (kind, mask) not in groups):
        for (okind, omask), posted in list(groups.items()):
            if (okind == kind and omask == mask) or not omask >> lane & 1 or not posted & mask:
                continue
            other = _lanes(posted & mask)[0]
            op = ws.posts[other]
            msg = (
                f"cufold simulator: warp collective mismatch in "
                f"{ws.where()}: lane {lane} called {post.describe()} "
                f"while lane {other} waits at "
                f"{op.describe()}; both masks contain both lanes, so "
                f"neither can proceed (deadlock/undefined on hardware)"
            )
            ws.unpost(other)
            block.wake(ws.thread(other), _Failure(WarpMismatchError, msg))
            block.lock.release()
            raise WarpMismatchError(msg)
    ws.post(lane, post)
    done, mine = ws.try_complete(kind, mask, caller=lane)
    if not done:
        return block.wait(t, post, interval)
    block.lock.release()
    if mine.__class__ is _Failure:
        raise mine.exc_type(mine.message)
    return mine


# ---------------------------------------------------------------------------
# The intrinsics, as methods of the simulator's FakeCUDAModule.


def shfl_sync(self, mask, value, src_lane):
    """Value of lane ``src_lane & 31`` (own value if that lane is not taking part)."""
    return _collective("shfl_sync", mask, (value, src_lane))


def shfl_up_sync(self, mask, value, delta):
    """Value of lane ``lane - delta`` (own value if below 0 or not taking part)."""
    return _collective("shfl_up_sync", mask, (value, delta))


def shfl_down_sync(self, mask, value, delta):
    """Value of lane ``lane + delta`` (own value if above 31 or not taking part)."""
    return _collective("shfl_down_sync", mask, (value, delta))


def shfl_xor_sync(self, mask, value, lane_mask):
    """Value of lane ``lane ^ lane_mask`` (own value if not taking part)."""
    return _collective("shfl_xor_sync", mask, (value, lane_mask))


def ballot_sync(self, mask, predicate):
    """Bit mask (non-negative int) of participating lanes whose predicate is true."""
    return _collective("ballot_sync", mask, predicate)


def all_sync(self, mask, predicate):
    """1 if the predicate is true on every participating lane, else 0."""
    return _collective("all_sync", mask, predicate)


def any_sync(self, mask, predicate):
    """1 if the predicate is true on any participating lane, else 0."""
    return _collective("any_sync", mask, predicate)


def eq_sync(self, mask, predicate):
    """1 if the predicate has the same truth value on all participating lanes."""
    return _collective("eq_sync", mask, predicate)


def match_any_sync(self, mask, value):
    """Mask of participating lanes whose ``value`` equals the caller's."""
    return _collective("match_any_sync", mask, value)


def match_all_sync(self, mask, value):
    """``(lanes, True)`` if all participating lanes hold equal values, else
    ``(0, False)``.

    ``lanes`` is the mask of the participating lanes (``mask`` minus exited
    or missing lanes), as hardware returns.
    """
    return _collective("match_all_sync", mask, value)


def syncwarp(self, mask=_FULL):
    """Rendezvous of the live lanes of ``mask``."""
    _collective("syncwarp", mask, None)


def activemask(self):
    """Mask of the caller's warp lanes that exist and have not exited.

    The simulator cannot see branch divergence, so lanes that are merely on
    another branch still count as active (an over-approximation).  Lanes that
    exited right after calling activemask() themselves still count (see
    ``_WarpState.active_mask``).
    """
    t = _current()
    with t.block.lock:
        return t.block.warps[t.thread_id >> 5].active_mask(t.thread_id & 31)


def lanemask_lt(self):
    """Mask of the lanes below the caller's."""
    return (1 << (_current().thread_id & 31)) - 1


# Cache-hinted loads and stores (``cuda.ldcg``, ``cuda.stcg``, ...) choose where a
# line is cached on the GPU; the simulator has one coherent memory, so they are
# plain element accesses (the simulator lacks them altogether otherwise).
def _cache_hinted_load(name):
    def load(self, array, i):
        return array[i]
    load.__name__ = name
    return load


def _cache_hinted_store(name):
    def store(self, array, i, value):
        array[i] = value
    store.__name__ = name
    return store


_CACHE_HINTS = [_cache_hinted_load(n) for n in ("ldca", "ldcg", "ldcs", "ldlu", "ldcv")] + [
    _cache_hinted_store(n) for n in ("stcg", "stcs", "stwb", "stwt")]

def fma(self, a, b, c):
    """``a * b + c`` rounded once, as the GPU's ``fma`` (the simulator's own rounds the
    product first and overflows where the exact sum would not): float32 operands through
    float64 (their product is exact there), float64 ones through exact fractions."""
    kind = type(a)
    if kind is np.float32 or kind is np.float16:
        with np.errstate(over="ignore", invalid="ignore"):
            return kind(np.float64(a) * np.float64(b) + np.float64(c))
    if not all(math.isfinite(v) for v in (a, b, c)):
        return a * b + c
    exact = fractions.Fraction(float(a)) * fractions.Fraction(float(b)) + fractions.Fraction(float(c))
    try:
        value = float(exact)          # correctly rounded
    except OverflowError:
        value = math.inf if exact > 0 else -math.inf
    return np.float64(value) if kind is np.float64 else value


def nanosleep(self, ns):
    """``cuda.nanosleep``: a hint on the GPU (the warp may sleep up to ``ns``); here a
    yield of the interpreter, so a polling thread lets the others run."""
    time.sleep(0)


_INTRINSICS = {
    f.__name__: f
    for f in tuple(_CACHE_HINTS) + (
        fma,
        nanosleep,
        shfl_sync,
        shfl_up_sync,
        shfl_down_sync,
        shfl_xor_sync,
        ballot_sync,
        all_sync,
        any_sync,
        eq_sync,
        match_any_sync,
        match_all_sync,
        syncwarp,
        activemask,
        lanemask_lt,
    )
}


# ---------------------------------------------------------------------------
# Installation


def _fast_shared_array(orig):
    """``cuda.shared.array`` keyed by its caller's line from one frame lookup (the
    simulator extracts the whole stack, with source lines, at every call)."""

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or (shape.__class__ is int and shape == 0):
            return orig(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        res = self._allocations.get(key)
        if res is None:
            from numba.cuda import types
            from numba.cuda.np import numpy_support
            if isinstance(dtype, types.Type):
                dtype = numpy_support.as_dtype(dtype)
            # setdefault: the block's threads arrive together, and all must get one array
            res = self._allocations.setdefault(key, np.empty(shape, dtype))
        return res

    array._cufold_patched = True
    return array


def _launch_or_call(orig):
    """``FakeCUDAKernel.__call__``: inside a launch, a device function runs with
    its globals swapped once for the launch; a launch cleans up after itself."""
    from numba.cuda.simulator import kernel

    def call(self, *args):
        fake = kernel._kernel_context
        if fake is not None:
            g = self.fn.__globals__
            if id(g) not in _swaps:
                _swap_in(g, fake)
            return self.fn(*args)
        if self._device:
            return orig(self, *args)
        try:
            return orig(self, *args)
        finally:
            _end_launch()

    call._cufold_patched = True
    return call


_installed = False
_install_lock = threading.Lock()


def install() -> bool:
    """Add the warp intrinsics and the block engine to Numba's CUDA simulator.

    Patches the simulator's ``FakeCUDAModule`` (the object injected as
    ``cuda`` into simulated kernels) with the intrinsics, runs blocks on
    cufold's engine (the simulator's ``BlockManager`` is replaced), calls
    device functions without a locked swap of globals per call, and finds
    ``cuda.shared.array`` allocations without extracting the stack.
    Idempotent. Does nothing (and imports nothing from the simulator) unless
    the simulator is active.

    Returns True if the intrinsics are installed after the call.
    """
    global _installed, _real_cuda, _Dim3
    if not is_simulator():
        return False
    with _install_lock:
        if _installed:
            return True
        from numba import cuda
        from numba.cuda.simulator import kernel, kernelapi

        _real_cuda, _Dim3 = cuda, kernelapi.Dim3
        for name, fn in _INTRINSICS.items():
            setattr(kernelapi.FakeCUDAModule, name, fn)
        kernel.BlockManager = _BlockRunner
        if not getattr(kernel.FakeCUDAKernel.__call__, "_cufold_patched", False):
            kernel.FakeCUDAKernel.__call__ = _launch_or_call(kernel.FakeCUDAKernel.__call__)
        if not getattr(kernelapi.FakeCUDAShared.array, "_cufold_patched", False):
            kernelapi.FakeCUDAShared.array = _fast_shared_array(kernelapi.FakeCUDAShared.array)
        _installed = True
        return True
