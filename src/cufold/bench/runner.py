"""Run a suite: sizes x cases x candidates -> records (plain dicts).

Per (case, size, candidate):

1. ``make`` the candidate (a Skip -> status ``skipped``);
2. call it once on buffer 0 (compilation happens here), synchronize, fetch
   the result and check it against the NumPy reference; a wrong result is
   status ``mismatch`` (printed at once) and is **not** timed;
3. ``warmup`` more untimed calls; time ``est_reps`` calls with events to
   estimate; time ``reps`` calls (:func:`~.timing.choose_reps`) with events,
   rotating over the buffers: ``gpu_us`` = median;
4. for sizes <= ``2**call_max_log2``: ``call_us`` = median over
   ``call_repeats`` wall-clock loops of back-to-back calls (of
   ``Prepared.call_fn`` where the call a user makes is not the timed one:
   cuda.compute's one-shot functions). The loops of a
   case's candidates at one size take turns (A B C A B C ...), so a drift of
   the host's speed (clocks, other processes) falls on all of them alike and
   their ratios hold.

The backend (array library, clock) is injected, so this runs on the CPU in
the tests with NumPy "device" arrays.
"""

from __future__ import annotations

import datetime
import sys
import time
import traceback
import warnings

import numpy as np

from . import suites as S
from .backends import Skip
from .timing import choose_calls, choose_reps, rotation_count, rotation_note, summarize

__all__ = ["Inputs", "DataCache", "measure_candidate", "measure_calls", "run_suite", "Progress", "measure_copy_ceiling"]


def measure_orders(orders, cands, make_ctx, measure_one, backend, progress=True, log=None):
    """The records of every candidate on every key order (the by-key suites): ``make_ctx(order)``
    makes an order's data, ``measure_one(cand, ctx)`` one record; a mismatch or error is
    reported as it happens; each order's device data is released before the next."""
    records = []
    bar = Progress(len(orders) * len(cands), enabled=progress, stream=log or sys.stderr)
    for order in orders:
        ctx = make_ctx(order)
        for c in cands:
            bar.describe("%s %s" % (order, c.label))
            rec = measure_one(c, ctx)
            if rec["status"] in ("mismatch", "error"):
                bar.write("!! %s: %s %s: %s" % (rec["status"].upper(), order, c.label, rec["note"]))
            records.append(rec)
            bar.update()
        del ctx
        backend.release()
    bar.close()
    return records


def suite_meta(suite, env, backend, info, settings, started, **extra):
    """The ``meta`` of a suite with its own driver: what ran where, with which libraries."""
    meta = {"suite": suite, "date": started.isoformat(timespec="seconds"), "device": info,
            "l2_bytes": info.get("l2_bytes"), "versions": dict(getattr(env, "versions", {})),
            "skipped_libs": dict(getattr(env, "skipped", {})), "notes": list(getattr(env, "notes", [])),
            "backend": backend.name, "cufold_input": getattr(backend, "cufold_input", None),
            "clock": getattr(backend.clock, "name", None), "settings": settings.as_dict()}
    meta.update(extra)
    return meta


def add_run_options(p, suite, full=None, dry_run="print what would run and exit (no GPU needed)"):
    """The options of a suite with its own driver: ``--quick`` (and, with ``full`` as its
    help, ``--full``, one or the other), ``--out``, ``--no-progress``, ``--dry-run``, ``--seed``,
    ``--no-raw`` (see :func:`apply_run_options`)."""
    mode = p.add_mutually_exclusive_group() if full else p
    if full:
        mode.add_argument("--full", action="store_true", help=full)
    mode.add_argument("--quick", action="store_true", help="few reps (a smoke run)")
    p.add_argument("--out", default=None, help="output directory (default bench/results/%s-<gpu>-<date>)" % suite)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--dry-run", action="store_true", help=dry_run)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-raw", action="store_true", help="do not keep every event sample in the JSON")
    return p


def apply_run_options(settings, args):
    """``settings`` with the options of :func:`add_run_options` that change them (``--seed``,
    ``--no-raw``)."""
    if args.seed is not None:
        settings.seed = args.seed
    if args.no_raw:
        settings.raw = False
    return settings


def run_and_save(suite, env, args, argv, out, err, describe, run, format_results, failed):
    """The end of a suite driver's ``main``: opens the GPU, runs ``run(backend, info)`` (the
    results), prints and saves them; the exit status (2: no GPU; 1: a record ``failed``;
    else 0). ``describe``: what runs, for the log line."""
    from . import open_backend
    from . import report as R
    backend = open_backend(env, err)
    if backend is None:
        return 2
    info = backend.device_info()
    out_dir = R.make_out_dir(args.out, suite, info.get("name"))
    err.write("cufold bench %s on %s: %s -> %s\n" % (suite, info.get("name"), describe, out_dir))
    results = run(backend, info)
    results["meta"]["argv"] = list(argv or [])
    text = format_results(results)
    out.write(text + "\n")
    R.save_results(results, text, out_dir)
    err.write("wrote %s: results.json, table.txt\n" % out_dir)
    return 1 if any(failed(r) for r in results["records"]) else 0


class Progress:
    """tqdm on stderr when importable (and enabled), else a plain counter."""

    def __init__(self, total, enabled=True, stream=None):
        self.stream = stream or sys.stderr
        self.total, self.done = total, 0
        self.enabled = enabled
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, file=self.stream, unit="case", dynamic_ncols=True, leave=True)
            except Exception:
                self._bar = None

    def describe(self, text):
        if self._bar is not None:
            self._bar.set_description_str(text[:60])
        elif self.enabled:
            self.stream.write("\r[%*d/%d] %-70s" % (len(str(self.total)), self.done + 1, self.total, text[:70]))
            self.stream.flush()

    def update(self, k=1):
        self.done += k
        if self._bar is not None:
            self._bar.update(k)

    def write(self, msg):
        if self._bar is not None:
            self._bar.write(msg, file=self.stream)
        else:
            if self.enabled:
                self.stream.write("\r")
            self.stream.write(msg + "\n")
            self.stream.flush()

    def close(self):
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            self.stream.write("\n")
            self.stream.flush()


class Inputs:
    """The rotation buffers of one (dtype, dist, size): device primaries,
    host copy of buffer 0, views per library (cached)."""

    def __init__(self, backend, host_buffers):
        self.backend = backend
        self.host0 = np.array(host_buffers[0])     # own copy: the reference input
        self.primaries = [backend.upload(h) for h in host_buffers]
        self._views = {}

    def views(self, kind):
        if kind not in self._views:
            self._views[kind] = [self.backend.view(p, kind) for p in self.primaries]
        return self._views[kind]

    @property
    def count(self):
        return len(self.primaries)


class DataCache:
    """Inputs and references for one size, shared by the cases."""

    def __init__(self, backend, n, l2_bytes, settings, log2n):
        self.backend, self.n, self.l2, self.settings, self.log2n = backend, n, l2_bytes, settings, log2n
        self._inputs, self._refs = {}, {}
        self.sample_idx = S.sample_indices(n)

    def inputs(self, dtype, dist):
        key = (np.dtype(dtype).name, dist)
        if key not in self._inputs:
            it = np.dtype(dtype).itemsize
            count = rotation_count(self.n * it, self.l2, self.settings.l2_factor, self.settings.buffer_cap)
            seed = [self.settings.seed, self.log2n, sum(map(ord, key[0] + key[1]))]
            host = S.generate(dtype, dist, self.n, count, seed)
            self._inputs[key] = Inputs(self.backend, host)
        return self._inputs[key]

    def reference(self, kind, dtype, dist):
        key = (kind, np.dtype(dtype).name, dist)
        if key not in self._refs:
            self._refs[key] = S.reference(kind, self.inputs(dtype, dist).host0)
        return self._refs[key]


def _failed(rec, cand, e):
    """A candidate that raised: NotImplementedError, or a peer's ValueError, is a case
    it does not support (skipped); anything else, a cufold ValueError included, is an
    error (a scan's express path once raised one at some sizes, shown as a skip)."""
    if isinstance(e, NotImplementedError) or (cand.lib != "cufold" and isinstance(e, ValueError)):
        rec.update(status="skipped", note=_short_exc(e))
    else:
        rec.update(status="error", note=_short_exc(e), traceback=traceback.format_exc(limit=6))
    return rec


def _dtype_name(obj):
    """'int64' for a torch/CuPy/Numba array result, else None."""
    dt = getattr(obj, "dtype", None)
    if dt is None:
        return None
    name = str(dt)
    return name[len("torch."):] if name.startswith("torch.") else name


def _short_exc(e):
    lines = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, lines[0][:300] if lines else "")


def measure_candidate(backend, env, case, cand, data, settings, log=None, call_turns=None):
    """One record (dict) for ``cand`` of ``case`` at ``data.n``. ``call_turns``: a
    list to leave the wall-clock loops in, for :func:`measure_calls` to run in turns
    with other candidates' (None: run them here)."""
    n = data.n
    rec = {"case": case.id, "label": cand.label, "lib": cand.lib, "role": cand.role,
           "log2n": data.log2n, "n": n, "bytes": case.bytes_per_elem * n,
           "status": "ok", "note": ""}
    if cand.skip:
        rec.update(status="skipped", note=cand.skip)
        return rec
    try:
        inputs = data.inputs(case.dtype, case.dist)
        rec["buffers"] = inputs.count
        rnote = rotation_note(inputs.count, n * np.dtype(case.dtype).itemsize, data.l2, settings.l2_factor)
        if rnote:
            rec["rotation"] = rnote
        ctx = S.Ctx(env, backend, case, n, inputs)
        prep = cand.make(ctx)
    except Skip as e:
        rec.update(status="skipped", note=str(e))
        return rec
    except Exception as e:
        return _failed(rec, cand, e)

    fn, args = prep.fn, prep.args
    # -- first call (compiles), result check --------------------------------
    try:
        t0 = time.perf_counter()
        res = (prep.result or fn)(args[0])
        backend.sync()
        rec["first_call_s"] = time.perf_counter() - t0
        out_dt = _dtype_name(res)
        if out_dt:
            rec["out_dtype"] = out_dt
        idx = data.sample_idx if case.sampled else None
        got = backend.fetch(res, idx)
        del res
        if cand.canon is not None:
            got = cand.canon(got)
        cctx = S.CheckCtx(data.reference(case.ref_kind, case.dtype, case.dist), inputs.host0, idx, n,
                          case.dtype)
        ok, note = (cand.check or case.check)(got, cctx)
    except Exception as e:
        return _failed(rec, cand, e)
    if not ok:
        rec.update(status="mismatch", note=note)
        return rec
    if case.sampled and out_dt and out_dt != np.dtype(case.dtype).name and cand.role != "ceiling":
        note = "; ".join(x for x in (note, "writes %s (bytes moved counts %s)" % (out_dt, case.dtype)) if x)
    if note:
        rec["note"] = note

    # -- timing ----------------------------------------------------------------
    try:
        clock = backend.clock
        nb = len(args)
        for i in range(settings.warmup):
            fn(args[(i + 1) % nb])
        backend.sync()
        st = time_events(clock, fn, args, settings, rec)
        if data.log2n <= settings.call_max_log2:
            per_call = prep.call_fn or fn
            pre = clock.wall_per_call_us(per_call, args, 10)
            # a call costs at least its GPU time: loops of about call_target_s
            calls = choose_calls(max(pre, st["median"]) * 1e-6, settings.call_target_s, settings.call_min,
                                 settings.call_max)
            turn = (rec, per_call, args, calls)
            if call_turns is None:
                measure_calls(clock, [turn], settings)
            else:
                call_turns.append(turn)
        if rec["gpu_us"] and rec["gpu_us"] > 0:
            rec["GBps"] = rec["bytes"] / rec["gpu_us"] / 1e3
    except Exception as e:
        rec.update(status="error", note="while timing: " + _short_exc(e),
                   traceback=traceback.format_exc(limit=6))
    return rec


def measure_calls(clock, turns, settings):
    """``call_us`` of each ``(record, fn, args, calls)``: ``call_repeats`` rounds,
    each one wall-clock loop per candidate, in turns; the median per candidate."""
    loops = [[] for _ in turns]
    for _ in range(settings.call_repeats):
        for (rec, fn, args, calls), mine in zip(turns, loops):
            if rec["status"] == "ok":
                try:
                    mine.append(clock.wall_per_call_us(fn, args, calls))
                except Exception as e:
                    rec.update(status="error", note="while timing calls: " + _short_exc(e),
                               traceback=traceback.format_exc(limit=6))
    for (rec, _, _, calls), mine in zip(turns, loops):
        if rec["status"] == "ok" and mine:
            rec.update(call_us=summarize(mine)["median"], call_loops_us=mine, calls=calls)


def measure_copy_ceiling(backend, env, settings, l2_bytes, log2n=None):
    """Device-to-device copy of float32 buffers of >= max(256 MiB, 4 x L2):
    the bandwidth ceiling (read + write bytes / time)."""
    if log2n is None:
        nbytes = max(256 << 20, 4 * l2_bytes)
        log2n = max(10, int(np.ceil(np.log2(nbytes / 4))))
    case = S.Case("copy/float32", "copy", "copy float32", "float32", "grid", 8, "sum", S.check_copy,
                  [S.copy_candidate()])
    data = DataCache(backend, 1 << log2n, l2_bytes, settings, log2n)
    data.sample_idx = S.sample_indices(1 << log2n)
    case.sampled = True
    rec = measure_candidate(backend, env, case, case.candidates[0], data, settings)
    label, _ = backend.copy_fn()
    rec["label"] = label
    rec.pop("samples_us", None)
    del data
    backend.release()
    return rec


def _run_sizes(suite, cases, backend, env, sizes, settings, l2, bar, records, said, checkpoint):
    for log2n in sizes:
        n = 1 << log2n
        data = DataCache(backend, n, l2, settings, log2n)
        for case in cases:
            turns = []
            for cand in case.candidates:
                bar.describe("%s 2^%d %s" % (case.id, log2n, cand.label))
                rec = measure_candidate(backend, env, case, cand, data, settings, call_turns=turns)
                records.append(rec)
                if rec["status"] in ("mismatch", "error"):
                    key = (cand.label, rec["status"], rec["note"])
                    if key not in said:       # the same failure at other sizes/cases: in the table
                        said.add(key)
                        bar.write("!! %s: %s 2^%d %s: %s" % (rec["status"].upper(), case.id, log2n,
                                                             cand.label, rec["note"]))
                bar.update()
            if turns:
                bar.describe("%s 2^%d per-call loops" % (case.id, log2n))
                measure_calls(backend.clock, turns, settings)
        del data
        backend.release()
        if checkpoint is not None:
            checkpoint(log2n)


def run_suite(suite, cases, backend, env, sizes, settings, progress=True, log=None, meta_extra=None,
              ceiling=True, device_info=None, checkpoint=None):
    """Measure everything; returns the results dict (see :mod:`.report`).
    ``ceiling``: measure the copy ceiling (True), not (False), or at 2^ceiling.
    ``checkpoint(results)``: called after each size with the results so far
    (``meta["partial"]`` true), so a run cut short by a time limit leaves them."""
    log = log or sys.stderr
    started = datetime.datetime.now()
    t_start = time.perf_counter()
    info = device_info if device_info is not None else backend.device_info()
    l2 = info.get("l2_bytes") or 64 << 20
    total = len(sizes) * sum(len(c.candidates) for c in cases) + (1 if ceiling else 0)
    bar = Progress(total, enabled=progress, stream=log)
    copy_rec = None
    if ceiling:
        bar.describe("copy ceiling")
        copy_rec = measure_copy_ceiling(backend, env, settings, l2,
                                        None if ceiling is True else int(ceiling))
        if copy_rec["status"] != "ok":
            bar.write("copy ceiling: %s %s" % (copy_rec["status"], copy_rec["note"]))
        bar.update()
    records = []
    said = set()

    def results(partial):
        meta = {
            "suite": suite,
            "date": started.isoformat(timespec="seconds"),
            "elapsed_s": round(time.perf_counter() - t_start, 2),
            "device": info,
            "l2_bytes": l2,
            "versions": dict(env.versions),
            "skipped_libs": dict(env.skipped),
            "notes": list(env.notes),
            "backend": backend.name,
            "cufold_input": backend.cufold_input,
            "clock": getattr(backend.clock, "name", None),
            "sizes_log2": list(sizes),
            "partial": partial,
            "settings": settings.as_dict(),
            "copy": copy_rec,
            "copy_GBps": (copy_rec or {}).get("GBps"),
            "time_basis": ("ratios use call_us (host wall clock per call, back-to-back) for n <= 2^%d "
                           "and gpu_us (CUDA-event median) above; GB/s always from gpu_us"
                           % settings.call_max_log2),
        }
        if meta_extra:
            meta.update(meta_extra)
        return {"meta": meta, "cases": [c.describe() for c in cases], "records": list(records),
                "targets": list(S.SUITES[suite].targets) if suite in S.SUITES else []}

    save = None if checkpoint is None else (lambda log2n: checkpoint(results(log2n != sizes[-1])))
    with warnings.catch_warnings():
        # Numba's "grid size N will likely result in GPU under-utilization" at small sizes
        warnings.filterwarnings("ignore", message=".*under-utilization.*")
        _run_sizes(suite, cases, backend, env, sizes, settings, l2, bar, records, said, save)
    bar.close()
    return results(False)


def time_after_warmup(clock, fn, args, settings, rec):
    """:func:`time_events` after ``settings.warmup`` untimed calls (and a sync)."""
    for _ in range(settings.warmup):
        fn(args[0])
    clock.sync()
    return time_events(clock, fn, args, settings, rec)


def copy_bandwidth(torch, backend, settings):
    """Bytes per second of a 256 MiB device copy (read + write), event-timed."""
    src = torch.empty(1 << 26, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    st = time_after_warmup(backend.clock, lambda p: p[1].copy_(p[0]), [(src, dst)], settings, {})
    return 2 * src.numel() * 4 / (st["median"] * 1e-6)


def checked_timing(backend, label, fn, args, check, settings):
    """The record of library ``label``: ``fn(args[0])`` fetched and checked (``check(got)
    -> (ok, why)``), then event-timed over ``args``; a mismatch or an error is recorded,
    the run goes on."""
    rec = {"label": label}
    try:
        got = backend.fetch(fn(args[0]))
        ok, why = check(got)
        if not ok:
            rec.update(status="mismatch", note=why)
        else:
            time_after_warmup(backend.clock, fn, args, settings, rec)
            rec["status"] = "ok"
    except Exception as e:                        # noqa: BLE001 (reported, the run goes on)
        rec.update(status="error", note="%s: %s" % (type(e).__name__, str(e)[:200]),
                   traceback=traceback.format_exc(limit=4))
    return rec


def time_events(clock, fn, args, settings, rec):
    """Event-time ``fn`` over ``args``: a few calls to estimate, then enough
    repetitions for the settings' time budget; records the median (and the raw
    samples when asked) in ``rec`` and returns the summary."""
    est = summarize(clock.event_times_us(fn, args, settings.est_reps))["median"]
    reps = choose_reps(est * 1e-6, settings.target_s, settings.min_reps, settings.max_reps,
                       settings.max_case_s)
    samples = clock.event_times_us(fn, args, reps)
    st = summarize(samples)
    rec.update(gpu_us=st["median"], gpu=st, reps=reps)
    if settings.raw:
        rec["samples_us"] = [round(x, 3) for x in samples]
    return st
