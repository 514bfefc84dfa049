"""Timing: sizes, buffer rotation, repetition counts, CUDA-event and wall clocks.

Two numbers are measured for every (candidate, size):

``gpu_us``
    the median over ``reps`` calls of the CUDA-event time around one call
    (``start.record(); fn(x); end.record()`` on the current stream, which is
    the legacy default stream for torch, CuPy, Numba and cufold alike). A
    busy-wait kernel is queued ahead of each timed call (``torch.cuda._sleep``,
    where torch is present), so the call's launches queue behind it and the
    events measure the GPU time of its kernels and the gaps between them, not
    the host's time to issue them (that is ``call_us``).
``call_us``
    wall-clock time per call of ``N`` back-to-back calls followed by one
    synchronize (``time.perf_counter``), median of a few such loops (taken in
    turns with the case's other candidates). This is what a Python caller
    pays per call: ``max(host overhead, GPU time)``,
    since launches queue asynchronously. Measured for sizes up to
    ``2**call_max_log2`` (default 2^20), where host overhead matters.

Inputs rotate over several pre-generated buffers so that the bytes of the
rotation exceed ``l2_factor`` (3) times the L2 size; the count is capped
(64), so the smallest sizes stay L2-resident. That is unavoidable and fine:
those sizes measure latency, not bandwidth.

Everything here except the clocks' constructors is pure Python (tested on
the CPU).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

__all__ = [
    "Settings", "parse_sizes", "parse_list", "rotation_count", "rotation_note",
    "choose_reps", "choose_calls", "summarize", "EventClock", "WallClock",
    "DEFAULT_L2_BYTES", "ESTIMATE", "estimate_seconds",
]

DEFAULT_L2_BYTES = 64 << 20
MAX_LOG2 = 34


@dataclasses.dataclass
class Settings:
    """Knobs of one run (all recorded in the JSON)."""

    target_s: float = 0.25        # event-timed seconds per (candidate, size)
    min_reps: int = 20            # ... but at least this many calls
    max_reps: int = 2000          # ... and at most this many
    max_case_s: float = 2.0       # slow calls: fewer than min_reps (never < 3)
    warmup: int = 3               # untimed calls after the (compiling) first call
    est_reps: int = 5             # event-timed calls to estimate a call's time
    call_max_log2: int = 20       # measure call_us for sizes <= 2**call_max_log2
    call_target_s: float = 0.08   # seconds per wall-clock loop
    call_min: int = 100
    call_max: int = 20000
    call_repeats: int = 5         # wall-clock loops (in turns with the peers'); the median
    l2_factor: float = 3.0        # rotation bytes > l2_factor * L2 ...
    buffer_cap: int = 64          # ... with at most this many buffers
    seed: int = 12345
    raw: bool = True              # keep every event sample in the JSON

    @classmethod
    def short(cls, **kw):
        """A suite's default run: 0.1 s of events per (candidate, size) and per-call
        loops of 0.03 s (``--full`` takes the class defaults)."""
        base = dict(target_s=0.1, max_reps=1000, max_case_s=1.0, call_target_s=0.03)
        base.update(kw)
        return cls(**base)

    @classmethod
    def quick(cls, **kw):
        """Few reps: a smoke run, not a measurement to quote."""
        base = dict(target_s=0.03, min_reps=5, max_reps=200, max_case_s=0.3, warmup=1,
                    est_reps=3, call_target_s=0.02, call_min=20, call_max=2000, call_repeats=2)
        base.update(kw)
        return cls(**base)

    def as_dict(self):
        return dataclasses.asdict(self)


def _parse_log2(tok):
    t = tok.strip().lower()
    for prefix in ("2^", "2**"):
        if t.startswith(prefix):
            t = t[len(prefix):]
    try:
        k = int(t)
    except ValueError:
        raise ValueError("cufold bench: bad size %r (log2 sizes: 10:28, 10:28:2 or 10,16,20)" % tok) from None
    if not 0 <= k <= MAX_LOG2:
        raise ValueError("cufold bench: size 2^%d out of range 2^0..2^%d" % (k, MAX_LOG2))
    return k


def parse_sizes(spec):
    """log2 sizes from ``"10:28"`` (inclusive), ``"10:28:2"`` (step), ``"10,16,20"``,
    or a mix (``"10:14,20"``); ``2^k`` is accepted for ``k``. Sorted, unique."""
    if isinstance(spec, (list, tuple)):
        out = {int(k) for k in spec}
    else:
        out = set()
        for part in str(spec).split(","):
            part = part.strip()
            if not part:
                continue
            if ":" in part:
                fields = part.split(":")
                if len(fields) not in (2, 3):
                    raise ValueError("cufold bench: bad size range %r" % part)
                lo, hi = _parse_log2(fields[0]), _parse_log2(fields[1])
                step = int(fields[2]) if len(fields) == 3 else 1
                if step < 1 or hi < lo:
                    raise ValueError("cufold bench: bad size range %r" % part)
                out.update(range(lo, hi + 1, step))
            else:
                out.add(_parse_log2(part))
    if not out:
        raise ValueError("cufold bench: no sizes in %r" % (spec,))
    return sorted(out)


def parse_list(spec):
    """``"a,b, c"`` -> ``["a", "b", "c"]``; None -> None."""
    if spec is None:
        return None
    items = [s.strip() for s in str(spec).split(",") if s.strip()]
    return items or None


def rotation_count(buffer_bytes, l2_bytes, factor=3.0, cap=64):
    """How many input buffers to cycle through so that their total exceeds
    ``factor * l2_bytes`` (at least 1, at most ``cap``)."""
    buffer_bytes = max(1, int(buffer_bytes))
    l2_bytes = int(l2_bytes) if l2_bytes else DEFAULT_L2_BYTES
    need = math.floor(factor * l2_bytes / buffer_bytes) + 1
    return int(max(1, min(cap, need)))


def rotation_note(count, buffer_bytes, l2_bytes, factor=3.0):
    """'' when the rotation defeats the L2, else a short note."""
    if count * buffer_bytes > factor * l2_bytes:
        return ""
    return "L2-resident (%d x %s < %gx L2): latency-bound size" % (
        count, human_bytes(buffer_bytes), factor)


def human_bytes(b):
    b = float(b)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if b < 1024 or unit == "TiB":
            return ("%d %s" % (b, unit)) if unit == "B" else ("%.3g %s" % (b, unit))
        b /= 1024.0
    return "%g" % b  # pragma: no cover


def choose_reps(t_est_s, target_s=0.25, min_reps=20, max_reps=2000, max_total_s=2.0, floor=3):
    """Timed calls for a call estimated at ``t_est_s`` seconds: enough for
    ``target_s`` and at least ``min_reps``, at most ``max_reps``; calls so slow
    that ``min_reps`` would exceed ``max_total_s`` get fewer (not below ``floor``)."""
    t = max(float(t_est_s), 1e-7)
    reps = math.ceil(target_s / t)
    reps = max(reps, min_reps)
    reps = min(reps, max_reps)
    if reps * t > max_total_s:
        reps = max(floor, int(max_total_s / t))
    return int(reps)


#: The dry run's model of a run's wall time, from the runs under bench/results (H100 and
#: H200, cold caches). Seconds, except ``data_Bps``.
ESTIMATE = {
    "startup_s": 20.0,     # imports, CUDA context, the copy ceiling
    # first calls, per (library, label, dtype): cufold compiles a few kernels over the
    # sizes (~3 s each), cuda.compute builds once per dtype, the others load libraries
    "compile_s": {"cufold": 6.0, "cuda.compute": 5.0, "other": 0.5},
    "point_s": 0.05,       # per (candidate, size): first call and check, warm-up, estimate
    "hold_s": 100e-6,      # the busy-wait kernel queued ahead of each event-timed call
    "data_Bps": 0.3e9,     # inputs generated, referenced and uploaded
}


def estimate_seconds(settings, points, call_points=0, first_calls=(), data_bytes=0, model=ESTIMATE):
    """Estimated wall time of a run, by part, and its ``total``: ``points`` (candidate,
    size) pairs event-timed (``target_s`` and at most ``max_reps`` holds each),
    ``call_points`` of them with per-call loops, ``first_calls`` the library of each
    (label, dtype) whose first call compiles, ``data_bytes`` of inputs."""
    compile_s = model["compile_s"]
    parts = {
        "startup": model["startup_s"],
        "first calls": sum(compile_s.get(lib, compile_s["other"]) for lib in first_calls),
        "events": points * (model["point_s"] + settings.target_s + settings.max_reps * model["hold_s"]),
        "per-call loops": call_points * settings.call_repeats * settings.call_target_s,
        "data": data_bytes / model["data_Bps"],
    }
    parts["total"] = sum(parts.values())
    return parts


def choose_calls(t_est_s, target_s=0.08, lo=100, hi=20000):
    """Back-to-back calls in one wall-clock loop."""
    t = max(float(t_est_s), 1e-7)
    return int(max(lo, min(hi, math.ceil(target_s / t))))


def _quantile(sorted_xs, q):
    if not sorted_xs:
        return None
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(samples):
    """Median, mean, min, max, p10, p90 and count of a list of numbers."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        return {"n": 0, "median": None, "mean": None, "min": None, "max": None, "p10": None, "p90": None}
    return {"n": len(xs), "median": statistics.median(xs), "mean": statistics.fmean(xs),
            "min": xs[0], "max": xs[-1], "p10": _quantile(xs, 0.1), "p90": _quantile(xs, 0.9)}


class _ClockBase:
    def wall_per_call_us(self, fn, args, calls):
        """Wall-clock µs per call of ``calls`` back-to-back calls + one sync."""
        nb = len(args)
        seq = [args[i % nb] for i in range(calls)]
        self.sync()
        t0 = time.perf_counter()
        for a in seq:
            fn(a)
        self.sync()
        return (time.perf_counter() - t0) / calls * 1e6


class EventClock(_ClockBase):
    """CUDA-event timing through any library's events.

    ``new_event()`` returns an event with ``.record()`` (on the current
    stream); ``elapsed_ms(a, b)`` the milliseconds between two recorded events;
    ``sync()`` synchronizes the device.
    """

    def __init__(self, name, new_event, elapsed_ms, sync, hold=None):
        self.name = name
        self._hold = hold  # queues GPU work that outlasts the host's issue time
        self._new = new_event
        self._elapsed = elapsed_ms
        self.sync = sync
        self._starts, self._ends = [], []

    def _pool(self, n):
        while len(self._starts) < n:
            self._starts.append(self._new())
            self._ends.append(self._new())
        return self._starts, self._ends

    def event_times_us(self, fn, args, reps):
        starts, ends = self._pool(reps)
        nb = len(args)
        self.sync()
        hold = self._hold
        for i in range(reps):
            if hold is not None:
                hold()
            starts[i].record()
            fn(args[i % nb])
            ends[i].record()
        self.sync()
        el = self._elapsed
        return [el(starts[i], ends[i]) * 1e3 for i in range(reps)]


class WallClock(_ClockBase):
    """Host-clock stand-in for events (CPU tests, or a GPU-less dry check)."""

    name = "wall"

    def __init__(self, sync=None):
        self.sync = sync or (lambda: None)

    def event_times_us(self, fn, args, reps):
        nb = len(args)
        out = []
        pc = time.perf_counter
        for i in range(reps):
            t0 = pc()
            fn(args[i % nb])
            self.sync()
            out.append((pc() - t0) * 1e6)
        return out
