"""Warp-level intrinsics for Numba's CUDA simulator.

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
  caller, lanes of one group waiting at different intrinsics, a lane that
  never arrives) raises a clear exception instead of hanging the process.

Nothing here is used on a real GPU: :func:`install` is a no-op unless the
simulator is active.

Public API: :func:`install`, :func:`is_simulator`, :func:`timeout`, and the
exception classes :class:`WarpSimulatorError`, :class:`WarpMaskError`,
:class:`WarpMismatchError` and :class:`WarpTimeoutError`.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

__all__ = [
    "install",
    "is_simulator",
    "timeout",
    "TIMEOUT_ENV",
    "DEFAULT_TIMEOUT",
    "WarpSimulatorError",
    "WarpMaskError",
    "WarpMismatchError",
    "WarpTimeoutError",
]

#: Environment variable giving the rendezvous timeout in seconds.
TIMEOUT_ENV = "CUFOLD_SIM_TIMEOUT"
#: Rendezvous timeout (seconds) used when :data:`TIMEOUT_ENV` is not set.
DEFAULT_TIMEOUT = 10.0

_WARP = 32
_FULL = 0xFFFFFFFF
# A waiting lane wakes up at least this often (seconds) even without a
# notification, to notice the simulator's abort flag (set when another thread
# of the block raised) and, defensively, lanes that exited without notifying.
_POLL = 0.05


# ---------------------------------------------------------------------------
# Errors
#
# Each class takes a single message argument: the simulator's BlockThread
# re-creates the exception as ``type(e)(msg)`` to prefix the thread/block ids,
# so the class (and hence ``pytest.raises``/``except`` matching) survives.


class WarpSimulatorError(RuntimeError):
    """Base class of the errors raised by the simulated warp intrinsics."""


class WarpMaskError(WarpSimulatorError):
    """A lane called a warp intrinsic with a mask that does not contain it."""


class WarpMismatchError(WarpSimulatorError):
    """Lanes of one group wait at different intrinsics or with different masks."""


class WarpTimeoutError(WarpSimulatorError):
    """A lane waited longer than the timeout for the other lanes of its group."""


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
    """Current rendezvous timeout in seconds (``CUFOLD_SIM_TIMEOUT`` or 10).

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
# Per-warp rendezvous state


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
    """A result slot telling a waiting lane to raise ``exc_type(message)``."""

    __slots__ = ("exc_type", "message")

    def __init__(self, exc_type, message):
        self.exc_type = exc_type
        self.message = message


class _WarpState:
    """Rendezvous state of one warp of one block.

    All fields are guarded by ``cond``.  A lane has at most one post at a time
    (it blocks until its collective completes), so posts and results are keyed
    by lane.
    """

    def __init__(self, manager, warp, exist_mask):
        self.manager = manager
        self.warp = warp
        self.exist_mask = exist_mask  # lanes that exist in this block
        self.exited_mask = 0  # lanes whose thread has finished
        self.cond = threading.Condition(threading.Lock())
        self.posts: dict[int, _Post] = {}
        self.results: dict[int, object] = {}
        self.threads: dict[int, object] = {}  # lane -> BlockThread (diagnostics)
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

    # -- description helpers for error messages ---------------------------

    def where(self) -> str:
        f = getattr(self.manager, "_f", None)
        name = getattr(f, "__name__", repr(f))
        block = _block_of(self)
        return f"kernel {name!r}, block {block}, warp {self.warp}"

    def lane_state(self, lane) -> str:
        """Short human description of what a (missing) lane is doing."""
        post = self.posts.get(lane)
        if post is not None:
            return f"lane {lane}: waiting at {post.describe()}"
        t = self.threads.get(lane)
        if t is None:
            return f"lane {lane}: not started yet"
        if getattr(t, "syncthreads_blocked", False):
            return f"lane {lane}: blocked in cuda.syncthreads()"
        return f"lane {lane}: running (has not reached the call)"

    # -- group completion ---------------------------------------------------

    def try_complete(self, kind, mask) -> bool:
        """Complete the group (kind, mask) if all its live lanes have posted.

        Called with ``cond`` held.  Computes the results of every lane of the
        group at once, so each lane sees the same snapshot of values.
        """
        needed = mask & self.live_mask
        posts = self.posts
        for lane in _lanes(needed):
            p = posts.get(lane)
            if p is None or p.kind != kind or p.mask != mask:
                return False
        group = {lane: posts.pop(lane) for lane in _lanes(needed)}
        if group:
            self.clock += 1
            for lane in group:
                self.last_sync[lane] = self.clock
            self.am_called &= ~needed
            try:
                results = _compute(kind, mask, group)
            except Exception as e:  # noqa: BLE001
                # E.g. a predicate without a truth value.  Whoever completes
                # the group (possibly an exiting lane) must not raise here:
                # every lane of the group raises it from its own wait instead.
                results = dict.fromkeys(group, _failure_from(e, kind, self))
            self.results.update(results)
            self.cond.notify_all()
        return True

    def active_mask(self, lane) -> int:
        """activemask() as seen by ``lane`` (called with ``cond`` held).

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

    def try_complete_all(self):
        """Re-check every pending group (after a lane exited)."""
        for kind, mask in {(p.kind, p.mask) for p in self.posts.values()}:
            self.try_complete(kind, mask)


def _failure_from(exc, kind, ws) -> _Failure:
    msg = f"cufold simulator: {kind} failed in {ws.where()}: {exc}"
    try:
        type(exc)(msg)  # keep the type if it takes a single message
        return _Failure(type(exc), msg)
    except Exception:  # noqa: BLE001
        return _Failure(WarpSimulatorError, f"{msg} ({type(exc).__name__})")


def _block_of(ws) -> str:
    for t in ws.threads.values():
        return str(tuple(t.blockIdx))
    return "?"


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

# Guards the lazy creation of per-block warp tables (the only shared write).
_create_lock = threading.Lock()


def _warp_state(thread) -> tuple[_WarpState, int]:
    """The calling thread's warp state and lane, created lazily."""
    manager = thread._manager
    warps = getattr(manager, "_cufold_warps", None)
    if warps is None:
        with _create_lock:
            warps = manager.__dict__.setdefault("_cufold_warps", {})
    tid = thread.thread_id
    warp, lane = divmod(tid, _WARP)
    ws = warps.get(warp)
    if ws is None:
        with _create_lock:
            ws = warps.get(warp)
            if ws is None:
                bx, by, bz = manager._block_dim
                n = bx * by * bz - warp * _WARP
                exist = _FULL if n >= _WARP else (1 << n) - 1
                ws = warps[warp] = _WarpState(manager, warp, exist)
    return ws, lane


def _current():
    t = threading.current_thread()
    if not hasattr(t, "_manager") or not hasattr(t, "thread_id"):
        raise WarpSimulatorError(
            "warp intrinsics can only be called from a simulated CUDA kernel"
        )
    return t


def _collective(kind, mask, payload):
    """Post this lane at collective ``kind`` and block until its group completes."""
    thread = _current()
    ws, lane = _warp_state(thread)
    mask = _norm_mask(mask)
    if not mask >> lane & 1:
        raise WarpMaskError(
            f"cufold simulator: {kind} called by lane {lane} "
            f"(thread {tuple(thread.threadIdx)}) in {ws.where()} "
            f"with mask 0x{mask:08x}, which does not contain "
            f"the calling lane (undefined behaviour on hardware)"
        )
    limit = timeout()
    cond = ws.cond
    with cond:
        post = _Post(kind, mask, payload)
        ws.posts[lane] = post
        # Two lanes that each name the other but wait at different collectives
        # (or with different masks) can never both proceed: report it now
        # rather than after the timeout.  (A lane of my mask waiting at another
        # collective that does *not* include me is fine: it may finish that
        # one and then join mine.)
        for other in _lanes(mask & ~(1 << lane)):
            op = ws.posts.get(other)
            if op is None or (op.kind == kind and op.mask == mask):
                continue
            if op.mask >> lane & 1:
                del ws.posts[lane]
                msg = (
                    f"cufold simulator: warp collective mismatch in "
                    f"{ws.where()}: lane {lane} called {post.describe()} "
                    f"while lane {other} waits at "
                    f"{op.describe()}; both masks contain both lanes, so "
                    f"neither can proceed (deadlock/undefined on hardware)"
                )
                # Wake the other lane with the same error.
                del ws.posts[other]
                ws.results[other] = _Failure(WarpMismatchError, msg)
                cond.notify_all()
                raise WarpMismatchError(msg)
        ws.try_complete(kind, mask)
        deadline = time.monotonic() + limit
        while True:
            if lane in ws.results:
                res = ws.results.pop(lane)
                if isinstance(res, _Failure):
                    raise res.exc_type(res.message)
                return res
            if getattr(thread, "abort", False):
                # Another thread of the block failed; the simulator is
                # tearing the block down.
                ws.posts.pop(lane, None)
                raise RuntimeError(f"abort flag set while waiting in {kind}")
            now = time.monotonic()
            if now >= deadline:
                _fail_timeout(ws, lane, post, limit)  # raises
            cond.wait(min(_POLL, deadline - now))
            # Defensive: a lane may have exited without notifying.
            ws.try_complete(kind, mask)


def _fail_timeout(ws, lane, post, limit):
    """Fail the whole group of ``post`` with one message, then raise it."""
    group = [
        l
        for l, p in ws.posts.items()
        if p.kind == post.kind and p.mask == post.mask
    ]
    waiting = sum(1 << l for l in group)
    missing = post.mask & ws.live_mask & ~waiting
    states = "; ".join(ws.lane_state(l) for l in _lanes(missing))
    msg = (
        f"cufold simulator: warp collective timed out after {limit:g} s "
        f"in {ws.where()}: "
        f"lanes {_fmt_lanes(waiting)} wait at {post.describe()} for missing "
        f"lanes {_fmt_lanes(missing)} ({states}). Set {TIMEOUT_ENV} to change "
        f"the timeout."
    )
    for l in group:
        del ws.posts[l]
        if l != lane:
            ws.results[l] = _Failure(WarpTimeoutError, msg)
    ws.cond.notify_all()
    raise WarpTimeoutError(msg)


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
    thread = _current()
    ws, lane = _warp_state(thread)
    with ws.cond:
        return ws.active_mask(lane)


def lanemask_lt(self):
    """Mask of the lanes below the caller's."""
    lane = _current().thread_id % _WARP
    return (1 << lane) - 1


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

_INTRINSICS = {
    f.__name__: f
    for f in tuple(_CACHE_HINTS) + (
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
# Thread lifecycle hooks (patched into BlockThread.run)


def _on_start(thread):
    try:
        ws, lane = _warp_state(thread)
    except Exception:  # noqa: BLE001 - never break the simulator itself
        return
    with ws.cond:
        ws.threads[lane] = thread


def _on_exit(thread):
    # A finished lane no longer takes part in collectives: drop it from the
    # warp and complete any group that was only waiting for it.
    try:
        ws, lane = _warp_state(thread)
    except Exception:  # noqa: BLE001
        return
    with ws.cond:
        ws.clock += 1
        ws.exit_clock[lane] = ws.clock
        ws.exited_mask |= 1 << lane
        ws.posts.pop(lane, None)
        ws.try_complete_all()
        ws.cond.notify_all()


_installed = False
_install_lock = threading.Lock()


def install() -> bool:
    """Add the warp intrinsics to Numba's CUDA simulator.

    Patches the simulator's ``FakeCUDAModule`` (the object injected as
    ``cuda`` into simulated kernels) with the intrinsics, and wraps
    ``BlockThread.run`` so that a lane that finishes is dropped from its
    warp's rendezvous.  Idempotent.  Does nothing (and imports nothing from the
    simulator) unless the simulator is active.

    Returns True if the intrinsics are installed after the call.
    """
    global _installed
    if not is_simulator():
        return False
    with _install_lock:
        if _installed:
            return True
        from numba.cuda.simulator import kernel, kernelapi

        for name, fn in _INTRINSICS.items():
            setattr(kernelapi.FakeCUDAModule, name, fn)

        orig_run = kernel.BlockThread.run
        if not getattr(orig_run, "_cufold_patched", False):

            def run(self):
                _on_start(self)
                try:
                    orig_run(self)
                finally:
                    _on_exit(self)

            run._cufold_patched = True
            run.__doc__ = orig_run.__doc__
            kernel.BlockThread.run = run
        _installed = True
        return True
