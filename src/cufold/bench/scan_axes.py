"""``python -m cufold bench scan-axes``: scans along an axis (issue #19), cufold against
torch, Triton and JAX in the same run.

Cases (float32):

* ``cumsum`` along axis 1 and axis 0 of (4096, 4096), (2^20, 16) and (16, 2^20), and
  ``cumsum(axis=1, reverse=True)`` of (4096, 4096): vs ``torch.cumsum(dim=)`` (reverse:
  ``torch.flip(torch.cumsum(torch.flip(x)))``, what a torch user writes); values are
  small integers, so every partial sum is exact and results must match bit for bit;
* 1-D: ``cumsum`` of int32 at 2^28 into int64 (NumPy's and torch's default) vs
  ``torch.cumsum``, and the affine scan of float32 pairs at 2^26 (vs JAX), whose target is
  its floor (12 bytes an element at copy bandwidth: ``h`` only, below) within 1.5x;
* the batched affine recurrence ``h = a*h + b`` along the rows of 4096 x 2048:
  ``cufold.inclusive_scan((a, b), affine, axis=1, out=(None, h))`` vs a Triton
  ``tl.associative_scan`` kernel with one program per row (:mod:`._triton_affine`; where
  Triton imports) and ``jax.lax.associative_scan(affine, (a, b), axis=1)`` jitted (where JAX
  imports; its time is the wall clock of back-to-back calls over their number, as JAX runs
  on its own stream). Both affine cases time cufold writing ``h`` only (``out=(None, h)``,
  ``h`` allocated in the call as the Triton kernel allocates its own: 12 bytes an element,
  the peer's traffic) in the ``cufold`` column, and writing both fields (the default
  result, 16 bytes) in the ``both`` column, for comparison;
* a transformed scan (issue #20): ``cumsum(x, axis=1, transform=lambda v: v * v)`` of
  (4096, 4096) against cufold's plain ``cumsum(x, axis=1)`` of the same array (the
  ``plain`` column) and torch's unfused ``torch.cumsum(x * x, dim=1)``.

Per case: the CUDA-event medians, ``torch / cufold`` (> 1: cufold faster) and ``% floor``:
the bytes cufold reads and writes at the copy bandwidth measured in the run (``torch
copy_`` of 256 MiB) over cufold's time. ``copy`` is torch moving the same bytes in the
same shape with no scan (``x.clone()`` for a cumsum, ``x.to(torch.int64)`` for int32 ->
int64, ``a + b`` for the affine scans' h only), and ``%copy`` its time over cufold's: what
the shape allows (a 64 MiB array does not reach the 256 MiB copy's bandwidth). cufold's plan (the kernel the axis planner
picks, :mod:`cufold.device.scan_axis`) is printed with each case.

Targets (``targets`` at the end): every cumsum >= 1.0x torch; every cumsum >= 90% of the
floor (where the shape allows: reported for all, and against the same-shape copy too); the affine recurrence (``h`` only) at or
below the Triton kernel's time and >= 5x JAX; the 1-D affine scan (``h`` only) within 1.5x
of its 12-byte floor; the
int32 -> int64 cumsum >= 1.0x torch; the transformed cumsum within 3% of the plain one's time.

Default run: well under 2 minutes on an H100/H200 (first compiles included; cached on
disk after). ``--quick``: few repetitions; ``--cases cumsum,affine`` selects.
"""

from __future__ import annotations

import argparse
import datetime
import operator
import sys
import time
import types

import numpy as np

from . import report as R
from .report import gpu_us
from .runner import add_run_options, apply_run_options, checked_timing, copy_bandwidth, run_and_save
from .timing import Settings

__all__ = ["CASES", "cases", "evaluate", "format_results", "main"]

SHAPES = ((4096, 4096), (1 << 20, 16), (16, 1 << 20))
CASES = tuple(("cumsum", s, ax, False) for s in SHAPES for ax in (1, 0)) + (
    ("cumsum", (4096, 4096), 1, True), ("affine", (4096, 2048), 1, False),
    ("cumsum-int64", (1 << 28,), None, False), ("affine", (1 << 26,), None, False),
    ("cumsum-square", (4096, 4096), 1, False))
TARGET_VS_TORCH = 1.0
TARGET_FLOOR = 0.9
TARGET_VS_TRITON = 1.0
TARGET_VS_JAX = 5.0
TARGET_1D_AFFINE_FLOOR = 1 / 1.5          # the 1-D affine scan within 1.5x of its floor
TARGET_TRANSFORM_VS_PLAIN = 1 / 1.03       # a transformed cumsum within 3% of the plain one's time
_SAMPLE = 4099                             # 1-D results are checked every _SAMPLE-th item


def cases(select=None):
    """The (kind, shape, axis, reverse) of a run, ``select``: kinds to keep."""
    return tuple(c for c in CASES if select is None or c[0] in select)


def _affine(p, q):
    return (p[0] * q[0], p[1] * q[0] + q[1])


def _square(v):
    return v * v


def _plan_text(shape, axis):
    if axis is None:
        return "flat (1-D scan)"
    try:
        from cufold.device import scan_axis as SA
        strides = (shape[1], 1)
        lay = SA.plan_layout(shape, strides, strides, axis, False)
        kind = lay.kind
        if kind == "columns":               # which columns kernel (it depends on the GPU's SMs)
            try:
                route = SA._columns_route(types.SimpleNamespace(device_id=0), lay, None, True)  # float32
                kind = {"one": "columns", "tiles": "col-tiles"}.get(route, route)
            except Exception:               # noqa: BLE001 (no GPU: --dry-run)
                pass
        return "%s %dx%dx%d" % (kind, lay.A, lay.L, lay.C)
    except Exception as e:                       # noqa: BLE001 (a description only)
        return "? %s" % type(e).__name__


def _time_jax(fn, arg, settings, rec):
    """JAX runs on its own stream: the wall clock of back-to-back calls, over their number."""
    for _ in range(settings.warmup + 1):
        _block(fn(arg))
    calls = max(settings.min_reps, 20)
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            got = fn(arg)
        _block(got)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    rec.update(gpu_us=float(np.median(samples)), wall_samples_us=samples, reps=calls * 5,
               note="wall clock per call of %d back-to-back calls" % calls)


def _block(got):
    for g in (got if isinstance(got, tuple) else (got,)):
        g.block_until_ready()


def _same_as(want):
    """The check of a ``copy`` record: ``got`` equals ``want`` (the same bytes moved)."""
    def check(got):
        return np.array_equal(np.asarray(got), want), "the copy differs from its input"
    return check


def _affine_reference(a, b):
    h = np.zeros(a.shape[0])
    out = np.empty(a.shape)
    for i in range(a.shape[1]):
        h = a[:, i] * h + b[:, i]
        out[:, i] = h
    return out


def run(env, backend, todo, settings, progress=True, log=None):
    import cufold

    from .runner import Progress
    torch = env.get("torch")
    log = log or sys.stderr
    info = backend.device_info()
    rng = np.random.default_rng(settings.seed)
    copy_bw = copy_bandwidth(torch, backend, settings)
    affine = cufold.Op(_affine, name="affine")
    records = []
    bar = Progress(len(todo), enabled=progress, stream=log)
    for kind, shape, axis, reverse in todo:
        bar.describe("%s %s axis=%s%s" % (kind, shape, axis, " reverse" if reverse else ""))
        n = int(np.prod(shape))
        row = {"kind": kind, "shape": list(shape), "axis": axis, "reverse": reverse,
               "plan": _plan_text(shape, axis)}
        calls, checks = {}, {}                      # checks: a label's own check (default: check)
        if kind == "cumsum":
            h = rng.integers(-2, 3, size=shape).astype(np.float32)
            ref = np.cumsum(np.flip(h, axis), axis=axis) if reverse else np.cumsum(h, axis=axis)
            ref = np.flip(ref, axis) if reverse else ref
            args = [torch.from_numpy(h).to("cuda")]
            row["floor_us"] = 8 * n / copy_bw * 1e6
            calls["cufold"] = lambda x, ax=axis, rev=reverse: cufold.cumsum(x, axis=ax, reverse=rev)
            if reverse:
                calls["torch"] = lambda x, ax=axis: torch.flip(torch.cumsum(torch.flip(x, (ax,)), dim=ax), (ax,))
            else:
                calls["torch"] = lambda x, ax=axis: torch.cumsum(x, dim=ax)

            def check(got, ref=ref):
                return np.array_equal(np.asarray(got), ref), "differs from NumPy's cumsum (exact here)"
            calls["copy"] = lambda x: x.clone()
            checks["copy"] = _same_as(h)
        elif kind == "cumsum-square":               # transform= fused into the scan's loads
            h = rng.integers(-2, 3, size=shape).astype(np.float32)
            ref = np.cumsum(h * h, axis=axis)       # small integers: exact
            args = [torch.from_numpy(h).to("cuda")]
            row["floor_us"] = 8 * n / copy_bw * 1e6
            calls["cufold"] = lambda x, ax=axis: cufold.cumsum(x, axis=ax, transform=_square)
            calls["plain"] = lambda x, ax=axis: cufold.cumsum(x, axis=ax)
            calls["torch"] = lambda x, ax=axis: torch.cumsum(x * x, dim=ax)

            def check(got, ref=ref):
                return np.array_equal(np.asarray(got), ref), "differs from NumPy's cumsum of x * x (exact here)"

            plain_ref = np.cumsum(h, axis=axis)

            def check_plain(got, ref=plain_ref):
                return np.array_equal(np.asarray(got), ref), "differs from NumPy's cumsum (exact here)"
            checks["plain"] = check_plain
        elif kind == "cumsum-int64":                # NumPy's and torch's default result: int64
            h = rng.integers(-1000, 1000, size=shape, dtype=np.int32)
            ref = np.cumsum(h)[::_SAMPLE]
            args = [torch.from_numpy(h).to("cuda")]
            row["floor_us"] = 12 * n / copy_bw * 1e6
            calls["cufold"] = lambda x: cufold.cumsum(x)
            calls["torch"] = lambda x: torch.cumsum(x, dim=0)

            def check(got, ref=ref):
                got = np.asarray(got)
                return got.dtype == np.int64 and np.array_equal(got[::_SAMPLE], ref), "differs from NumPy's cumsum"
            calls["copy"] = lambda x: x.to(torch.int64)
            checks["copy"] = _same_as(h.astype(np.int64))
        elif len(shape) == 1:                       # the 1-D affine scan: a window of 400 is exact enough
            ha = rng.uniform(0.5, 0.9, size=shape).astype(np.float32)
            hb = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
            at = np.arange(0, n, _SAMPLE)
            idx = at[:, None] + np.arange(-400, 1)[None, :]          # the 401 items up to each sample
            inside = idx >= 0
            wa = np.where(inside, ha[np.maximum(idx, 0)], 1.0)        # before item 0: h -> 1*h + 0
            wb = np.where(inside, hb[np.maximum(idx, 0)], 0.0)
            ref = _affine_reference(wa.astype(np.float64), wb.astype(np.float64))[:, -1]
            args = [(torch.from_numpy(ha).to("cuda"), torch.from_numpy(hb).to("cuda"))]
            row["floor_us"] = 12 * n / copy_bw * 1e6                # h only: read a, b, write h
            row["floor_both_us"] = 16 * n / copy_bw * 1e6
            calls["cufold"] = lambda p: cufold.inclusive_scan(p, affine, out=(None, torch.empty_like(p[1])))[1]
            calls["both"] = lambda p: cufold.inclusive_scan(p, affine)[1]
            calls["copy"] = lambda p: p[0] + p[1]                   # h only's bytes: read a, b, write one
            checks["copy"] = _same_as(ha + hb)

            def check(got, ref=ref, at=at):
                err = np.abs(np.asarray(got)[at].astype(np.float64) - ref).max()
                return err < 1e-4, "max error %.3g against a float64 loop" % err
        else:
            ha = rng.uniform(0.5, 1.0, size=shape).astype(np.float32)
            hb = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
            ref = _affine_reference(ha.astype(np.float64), hb.astype(np.float64))
            args = [(torch.from_numpy(ha).to("cuda"), torch.from_numpy(hb).to("cuda"))]
            row["floor_us"] = 12 * n / copy_bw * 1e6                # h only, as the Triton kernel
            row["floor_both_us"] = 16 * n / copy_bw * 1e6
            calls["cufold"] = lambda p: cufold.inclusive_scan(p, affine, axis=1,
                                                              out=(None, torch.empty_like(p[1])))[1]
            calls["both"] = lambda p: cufold.inclusive_scan(p, affine, axis=1)[1]
            calls["copy"] = lambda p: p[0] + p[1]
            checks["copy"] = _same_as(ha + hb)
            try:
                from ._triton_affine import affine_rows
                calls["triton"] = affine_rows
            except Exception as e:                  # noqa: BLE001 (no Triton: no peer)
                row["triton"] = {"label": "triton", "status": "n/a", "note": "%s: %s" % (type(e).__name__, e)}

            def check(got, ref=ref):
                err = np.abs(np.asarray(got, dtype=np.float64) - ref).max()
                return err < 1e-3, "max error %.3g against a float64 loop" % err
        for label, fn in calls.items():
            row[label] = checked_timing(backend, label, fn, args, checks.get(label, check), settings)
        if kind == "affine":
            row["jax"] = _run_jax(args[0], check, settings, 0 if axis is None else axis)
        records.append(row)
        del args
        bar.update()
    bar.close()
    meta = {"suite": "scan-axes", "date": datetime.datetime.now().isoformat(timespec="seconds"), "device": info,
            "versions": dict(env.versions), "copy_GBps": copy_bw / 1e9, "settings": settings.as_dict()}
    results = {"meta": meta, "records": records}
    results["targets_evaluated"] = evaluate(results)
    return results


def _run_jax(pair, check, settings, axis):
    rec = {"label": "jax"}
    import os
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")     # leave torch its memory
    try:
        import jax
        import jax.numpy as jnp
    except Exception as e:                          # noqa: BLE001 (no JAX: no peer)
        rec.update(status="n/a", note="%s: %s" % (type(e).__name__, e))
        return rec
    try:
        a, b = (jnp.asarray(t.cpu().numpy()) for t in pair)
        fn = jax.jit(lambda a, b: jax.lax.associative_scan(_affine, (a, b), axis=axis)[1])
        ok, why = check(np.asarray(fn(a, b)))
        if not ok:
            rec.update(status="mismatch", note=why)
            return rec
        _time_jax(lambda p: fn(*p), (a, b), settings, rec)
        rec["status"] = "ok"
        rec["versions"] = {"jax": jax.__version__}
    except Exception as e:                          # noqa: BLE001
        rec.update(status="error", note="%s: %s" % (type(e).__name__, str(e)[:200]))
    return rec


def _what(r):
    return "%s %s%s%s" % (r["kind"], "x".join(map(str, r["shape"])),
                          "" if r["axis"] is None else " axis=%d" % r["axis"], " reverse" if r.get("reverse") else "")


def evaluate(results):
    """The targets: [{name, status, cases, misses, worst, missed}]."""
    rows = results["records"]
    out = []

    def target(name, items, threshold, better):
        out.append(R.case_target(name, items, threshold, better))

    def ratio(r, num, den):
        a, b = gpu_us(r, num), gpu_us(r, den)
        return a / b if a and b else None

    ge, le = operator.ge, operator.le
    sums = [r for r in rows if r["kind"] == "cumsum"]
    aff = [r for r in rows if r["kind"] == "affine" and len(r["shape"]) == 2]
    flat_aff = [r for r in rows if r["kind"] == "affine" and len(r["shape"]) == 1]
    wide_sums = [r for r in rows if r["kind"] == "cumsum-int64"]
    squares = [r for r in rows if r["kind"] == "cumsum-square"]
    target("cumsum >= %.1fx torch" % TARGET_VS_TORCH, [(ratio(r, "torch", "cufold"), _what(r)) for r in sums],
           TARGET_VS_TORCH, ge)
    target("cumsum >= %d%% of the floor" % (TARGET_FLOOR * 100),
           [((r["floor_us"] / gpu_us(r, "cufold")) if gpu_us(r, "cufold") else None, _what(r)) for r in sums],
           TARGET_FLOOR, ge)
    target("cumsum >= %d%% of the same-shape copy's speed (what the shape allows)" % (TARGET_FLOOR * 100),
           [(ratio(r, "copy", "cufold"), _what(r)) for r in sums], TARGET_FLOOR, ge)
    target("affine recurrence <= %.1fx the Triton kernel's time" % TARGET_VS_TRITON,
           [(ratio(r, "cufold", "triton"), _what(r)) for r in aff], TARGET_VS_TRITON, le)
    target("affine recurrence >= %.0fx jax.lax.associative_scan" % TARGET_VS_JAX,
           [(ratio(r, "jax", "cufold"), _what(r)) for r in aff], TARGET_VS_JAX, ge)
    target("1-D affine scan within %.1fx of its floor" % (1 / TARGET_1D_AFFINE_FLOOR),
           [((r["floor_us"] / gpu_us(r, "cufold")) if gpu_us(r, "cufold") else None, _what(r)) for r in flat_aff],
           TARGET_1D_AFFINE_FLOOR, ge)
    target("cumsum int32 -> int64 >= %.1fx torch.cumsum" % TARGET_VS_TORCH,
           [(ratio(r, "torch", "cufold"), _what(r)) for r in wide_sums], TARGET_VS_TORCH, ge)
    target("transformed cumsum within 3% of the plain cumsum's time",
           [(ratio(r, "plain", "cufold"), _what(r)) for r in squares], TARGET_TRANSFORM_VS_PLAIN, ge)
    return out


def format_results(results):
    m = results["meta"]
    lines = ["cufold bench scan-axes on %s (copy %.0f GB/s)" % (m["device"].get("name"), m["copy_GBps"]), "",
             "%-34s %-22s %9s %9s %9s %9s %9s %8s %8s %7s %6s" % (
                 "case", "cufold plan", "cufold", "torch", "triton", "jax", "copy", "xtorch", "xjax", "%floor",
                 "%copy")]
    for r in results["records"]:
        libs = ("cufold", "torch", "triton", "jax", "copy")
        cf, tt, tr, jx, cp = (gpu_us(r, k) for k in libs)
        f, flags = R.us_cell, R.failure_flags(r, libs)
        lines.append("%-34s %-22s %s %s %s %s %s %s %s %7s %6s%s" % (
            _what(r), r["plan"][:22], f(cf), f(tt), f(tr), f(jx), f(cp), R.ratio_cell(tt, cf, 8),
            R.ratio_cell(jx, cf, 8), "%.0f%%" % (100 * r["floor_us"] / cf) if cf else "-",
            "%.0f%%" % (100 * cp / cf) if cf and cp else "-", flags))
    for r in results["records"]:
        plain, both, cf = gpu_us(r, "plain"), gpu_us(r, "both"), gpu_us(r, "cufold")
        if plain:
            lines.append("%-34s plain cumsum (no transform) %s us: the transformed one takes %.3fx its time" % (
                _what(r), R.us_cell(plain).strip(), (cf or float("nan")) / plain))
        if both:
            lines.append("%-34s both fields written (16 B) %s us, %.0f%% of their floor: h only takes %.3fx "
                         "that time" % (_what(r), R.us_cell(both).strip(), 100 * r["floor_both_us"] / both,
                                        (cf or float("nan")) / both))
    for r in results["records"]:
        cp, jx = gpu_us(r, "copy"), gpu_us(r, "jax")
        if cp and jx:
            lines.append("%-34s the same bytes with no scan (a + b) take %s us: %.2fx jax" % (
                _what(r), R.us_cell(cp).strip(), jx / cp))
    lines += ["", ("floors: read + write at the copy bandwidth (cumsum 8 B, int32 -> int64 12 B an element; "
                   "affine: h only, out=(None, h), 12 B, as the Triton kernel; both fields 16 B); copy: "
                   "torch moving the same bytes in the same shape (clone, to(int64), a + b), %copy its time "
                   "over cufold's"), "targets:"]
    lines += R.case_target_lines(results["targets_evaluated"])
    return "\n".join(lines)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m cufold bench scan-axes",
                                description="Scans along axes vs torch.cumsum(dim=), Triton and JAX.")
    p.add_argument("--cases", default=None, help="comma list of kinds: cumsum, affine, cumsum-int64, cumsum-square")
    return add_run_options(p, "scan-axes", dry_run="print the cases and exit (no GPU needed)")


def main(argv=None, stdout=None, stderr=None):
    """``python -m cufold bench scan-axes ...``; 0, 1 on a mismatch or error, 2 without a GPU."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    select = None if not args.cases else {c.strip() for c in args.cases.split(",") if c.strip()}
    todo = cases(select)
    settings = Settings.quick() if args.quick else Settings(target_s=0.05, min_reps=10, max_reps=300,
                                                            max_case_s=0.5, warmup=2, est_reps=3)
    apply_run_options(settings, args)
    if args.dry_run:
        out.write("cufold bench scan-axes: %d cases\n" % len(todo))
        for kind, shape, axis, reverse in todo:
            out.write("  %s %s axis=%s%s plan=%s\n" % (kind, shape, axis, " reverse" if reverse else "",
                                                      _plan_text(shape, axis)))
        return 0
    from . import backends
    env = backends.probe()
    if env.get("torch") is None:
        err.write("cufold bench scan-axes: needs torch with CUDA (the data and the copy bandwidth)\n")
        return 2
    return run_and_save("scan-axes", env, args, argv, out, err, "%d cases" % len(todo),
                        lambda backend, info: run(env, backend, todo, settings, progress=not args.no_progress, log=err),
                        format_results, lambda r: r.get("cufold", {}).get("status") != "ok")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
