"""``python -m cufold bench axes``: reductions over axes and of non-contiguous views,
cufold against torch and CuPy in the same run (issue #24).

Layouts (float32, values on the 1/256 grid, so sums check tightly):

* ``A`` = (8192, 8192) and its ``A.T``, ``A[:, ::2]``, ``A[::2]``;
* ``y`` = (64, 3, 65536) and its six permutations (``y.permute(p)``; three copies
  rotate, so the 50 MB never sits in L2);
* ``z`` = (2^24, 4) and ``z.T``.

Axes: every axis, every pair (3-D), and None. Reductions: sum, max, argmax (single
axis or None, as torch.argmax) and mean. Peers: ``torch.sum/amax/argmax/mean(dim=)``
and ``cupy.sum/max/argmax/mean(axis=)`` on zero-copy views of the same memory.

Per case the table gives the kernel cufold's planner chose, the CUDA-event medians,
the ratios ``peer / cufold`` (> 1: cufold faster) and the *floor*: the bytes of the
32-byte sectors the view touches (plus the result) at the copy bandwidth measured
in the run (``torch copy_`` of 256 MiB: read + write over time); ``% floor`` =
floor / cufold time.

Targets (``targets`` at the end): every case >= 1.0x torch; where the reduced data
is contiguous (a ``rows`` or ``contiguous`` layout), >= 90% of the floor; every full
reduction of a non-contiguous view within 1.3x of the same reduction of a contiguous
copy of the view (timed too, as ``copy``).

Default run: ~2 minutes on an H100/H200 (plus first compiles, cached on disk after).
``--quick``: few repetitions; ``--layouts A,y`` and ``--reductions sum,max`` select.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import math
import operator
import sys

import numpy as np

from . import report as R
from .report import gpu_us
from .runner import add_run_options, apply_run_options, checked_timing, copy_bandwidth, run_and_save, time_after_warmup
from .timing import Settings

__all__ = ["LAYOUTS", "REDUCTIONS", "cases", "touched_bytes", "main"]

REDUCTIONS = ("sum", "max", "argmax", "mean")
LAYOUTS = ("A", "A.T", "A[:,::2]", "A[::2]") + tuple("y.permute%s" % (p,) for p in
                                                     itertools.permutations(range(3))) + ("z", "z.T")
BASES = {"A": (8192, 8192), "y": (64, 3, 65536), "z": (1 << 24, 4)}
ROTATE = {"A": 1, "y": 3, "z": 1}
TARGET_VS_TORCH = 1.0
TARGET_FLOOR = 0.9
TARGET_FULL_VS_COPY = 1.3


def _base_of(layout):
    return layout[0]


def _axes_of(ndim):
    out = [None] + list(range(ndim))
    if ndim == 3:
        out += [(0, 1), (0, 2), (1, 2)]
    return out


def cases(layouts=LAYOUTS, reductions=REDUCTIONS):
    """(layout, axis, reduction) of a run, in order."""
    out = []
    for lay in layouts:
        ndim = 3 if lay.startswith("y") else 2
        for axis in _axes_of(ndim):
            for red in reductions:
                if red == "argmax" and isinstance(axis, tuple):
                    continue
                out.append((lay, axis, red))
    return out


def _view(t, layout):
    """The view named ``layout`` of base array ``t`` (a torch tensor or a NumPy array)."""
    if layout in ("A", "z", "y.permute(0, 1, 2)"):
        return t
    if layout.endswith(".T"):
        return t.T
    if layout == "A[:,::2]":
        return t[:, ::2]
    if layout == "A[::2]":
        return t[::2]
    if layout.startswith("y.permute"):
        permute = t.permute if hasattr(t, "permute") else t.transpose      # torch / NumPy
        return permute(*eval(layout[len("y.permute"):]))                   # noqa: S307 (our own names)
    raise ValueError(layout)


def touched_bytes(shape, strides, itemsize, sector=32):
    """Bytes of the ``sector``-byte sectors that a view (element ``strides``) touches."""
    dims = sorted(((n, abs(s)) for n, s in zip(shape, strides) if n > 1 and s != 0), key=lambda d: -d[1])
    merged = []
    for n, s in dims:
        if merged and merged[-1][1] == s * n:
            merged[-1] = (merged[-1][0] * n, s)
        else:
            merged.append((n, s))
    if not merged:
        return sector
    n, s = merged[-1]
    outer = math.prod(d[0] for d in merged[:-1])
    if s * itemsize >= sector:
        per = n
    else:
        per = -(-((n - 1) * s * itemsize + itemsize) // sector)
    return outer * per * sector


def _plan_text(shape, strides, axis, reduction, device_id):
    """What cufold's planner runs for this case (kernel, group or tile, split)."""
    try:
        from cufold.device import axis as A
        axes = A.normalize_axis(axis, len(shape))
        lay = A.plan_layout(tuple(shape), tuple(strides), axes, True, reduction == "argmax")
        if lay.kind == "contiguous":
            return "reduce", lay
        s = A.schedule(lay, A.limits(device_id), reduction == "argmax")
        return _schedule_text(s.kernel, s.group, s.tx, s.ty, s.tb, s.split), lay
    except Exception as e:                       # noqa: BLE001 (a description only)
        return "? %s" % type(e).__name__, None


def _schedule_text(kernel, group=0, tx=0, ty=0, tb=0, split=1):
    """An axis kernel's schedule as the table prints it."""
    if kernel == "rows":
        return "rows g%d x%d" % (group, split)
    if kernel == "transposed":
        return "turn %dx%d" % (tx, tb)
    return "cols %dx%d x%d" % (tx, ty, split)


def launched_plan(call):
    """What cufold launched for ``call()``, as text ("rows g256 x5, 960 blocks"), where this
    call plans (its first: the launches are recorded as the Program is built), else None.
    Unlike :func:`_plan_text` (the planner's schedule) it shows the splits after they were
    fitted to the blocks the GPU holds of the compiled kernel (``axis.fit_rounds``)."""
    from cufold.device import axis as A
    from cufold.host import programs
    seen = []
    real = programs.Builder.launch

    def record(self, fn, key, grid, block, args, shared=0):
        seen.append((key, grid, args))
        return real(self, fn, key, grid, block, args, shared)
    programs.Builder.launch = record
    try:
        call()
    finally:
        programs.Builder.launch = real
    for key, grid, args in reversed(seen):        # the reduction's own launch is the last
        kind = key[0] if isinstance(key, tuple) else str(key)
        if kind == "axis_rows":
            kind = _schedule_text("rows", group=key[2], split=args[A.SPLITS_ARG])
        elif kind == "axis_columns":
            kind = _schedule_text("columns", tx=key[2], ty=key[3], split=args[A.SPLITS_ARG])
        elif kind == "axis_transposed":
            kind = _schedule_text("transposed", tx=key[3], tb=key[4])
        elif kind == "reduce" and key[1].runs:      # the device reduce over a view's runs
            kind = "reduce runs=%d%s" % (key[1].runs, " wide" if key[1].wide else "")
        return "%s, %d blocks" % (kind, grid)
    return None


def _reference(x, axis, reduction):
    """NumPy's result in float64 (``x``: the view of the float64 copy)."""
    if reduction == "sum":
        return x.sum(axis=axis)
    if reduction == "max":
        return x.max(axis=axis)
    if reduction == "mean":
        return x.mean(axis=axis)
    return x.max(axis=axis)     # argmax: checked by the value at the returned index


def _check(got, ref, h, axis, reduction):
    got = np.asarray(got)
    if reduction == "argmax":
        idx = got.astype(np.int64)
        if axis is None:
            vals = h.reshape(-1)[int(idx)]
        else:
            vals = np.take_along_axis(h, np.expand_dims(idx, axis), axis).squeeze(axis)
        ok = np.array_equal(vals.astype(np.float64), ref)
        return ok, "" if ok else "argmax picks a value that is not the maximum"
    if got.shape != np.shape(ref):
        return False, "shape %s, expected %s" % (got.shape, np.shape(ref))
    tol = 1e-5 * (1 + np.abs(ref)) if reduction == "mean" else 1e-6 * (1 + np.abs(ref))
    bad = np.abs(got.astype(np.float64) - ref) > tol
    ok = not bad.any()
    return ok, "" if ok else "%d of %d differ (first at %s)" % (bad.sum(), bad.size, np.argwhere(bad)[0])


def _calls(env, reduction, axis):
    """{label: fn(view)} of the candidates."""
    import cufold
    out = {"cufold": lambda x: getattr(cufold, reduction)(x, axis=axis)}
    torch = env.get("torch")
    if torch is not None:
        if reduction == "sum":
            out["torch"] = (lambda x: torch.sum(x)) if axis is None else (lambda x: torch.sum(x, dim=axis))
        elif reduction == "max":
            out["torch"] = (lambda x: torch.max(x)) if axis is None else (lambda x: torch.amax(x, dim=axis))
        elif reduction == "argmax":
            out["torch"] = lambda x: torch.argmax(x, dim=axis)
        else:
            out["torch"] = (lambda x: torch.mean(x)) if axis is None else (lambda x: torch.mean(x, dim=axis))
    cupy = env.get("cupy")
    if cupy is not None:
        fn = {"sum": cupy.sum, "max": cupy.max, "argmax": cupy.argmax, "mean": cupy.mean}[reduction]
        out["cupy"] = lambda x: fn(x, axis=axis)
    return out


def run(env, backend, layouts, reductions, settings, progress=True, log=None):
    from .runner import Progress
    torch = env.get("torch")
    cupy = env.get("cupy")
    log = log or sys.stderr
    info = backend.device_info()
    device_id = 0
    rng = np.random.default_rng(settings.seed)
    records = []
    # copy bandwidth: read + write of 256 MiB
    copy_bw = copy_bandwidth(torch, backend, settings)
    todo = cases(layouts, reductions)
    bar = Progress(len(todo), enabled=progress, stream=log)
    bases = {}
    for base in sorted({_base_of(lay) for lay in layouts}):
        shape = BASES[base]
        hosts = [(rng.integers(-256, 257, size=shape, dtype=np.int16).astype(np.float32) / np.float32(256))
                 for _ in range(ROTATE[base])]
        bases[base] = (hosts[0], hosts[0].astype(np.float64), [torch.from_numpy(h).to("cuda") for h in hosts])
        del hosts
    for lay, axis, reduction in todo:
        base = _base_of(lay)
        h0, h64, devs = bases[base]
        views = [_view(t, lay) for t in devs]
        hv = _view(h0, lay)
        shape, strides = tuple(views[0].shape), tuple(views[0].stride())
        plan, layout = _plan_text(shape, strides, axis, reduction, device_id)
        ref = _reference(_view(h64, lay), axis, reduction)
        out_bytes = int(np.prod(np.shape(ref))) * (8 if reduction == "argmax" else 4)
        floor_us = (touched_bytes(shape, strides, 4) + out_bytes) / copy_bw * 1e6
        row = {"layout": lay, "axis": axis, "reduction": reduction, "shape": shape, "strides": strides,
               "plan": plan, "floor_us": floor_us,
               "contiguous_data": layout is not None and layout.kind in ("contiguous", "rows")
               and abs(layout.red[-1][1]) == 1,
               "full_noncontig": axis is None and not views[0].is_contiguous()}
        bar.describe("%s %s %s" % (lay, axis, reduction))
        calls = _calls(env, reduction, axis)
        try:
            row["launched"] = launched_plan(lambda: calls["cufold"](views[0]))
        except Exception as e:                            # noqa: BLE001 (the timing records it)
            row["launched"] = "? %s" % type(e).__name__
        for label, fn in calls.items():
            lib_views = views if label != "cupy" else [cupy.asarray(v) for v in views]
            row[label] = checked_timing(backend, label, fn, lib_views,
                                        lambda got: _check(got, ref, hv, axis, reduction), settings)
        if row["full_noncontig"]:
            copies = [v.contiguous() for v in views]
            rec = {"label": "copy"}
            try:
                time_after_warmup(backend.clock, calls["cufold"], copies, settings, rec)
                rec["status"] = "ok"
            except Exception as e:                        # noqa: BLE001
                rec.update(status="error", note="%s: %s" % (type(e).__name__, e))
            row["copy"] = rec
            del copies
        records.append(row)
        bar.update()
    bar.close()
    meta = {"suite": "axes", "date": datetime.datetime.now().isoformat(timespec="seconds"), "device": info,
            "versions": dict(env.versions), "copy_GBps": copy_bw / 1e9, "settings": settings.as_dict()}
    results = {"meta": meta, "records": records}
    results["targets_evaluated"] = evaluate(results)
    return results


def evaluate(results):
    """The targets: [{name, status, worst, misses}]."""
    rows = results["records"]
    out = []

    def target(name, items, threshold, better):
        out.append(R.case_target(name, items, threshold, better))

    def what(r):
        return "%s axis=%s %s" % (r["layout"], r["axis"], r["reduction"])

    ge, le = operator.ge, operator.le
    target("every case >= %.1fx torch" % TARGET_VS_TORCH,
           [((gpu_us(r, "torch") / gpu_us(r, "cufold")) if gpu_us(r, "torch") and gpu_us(r, "cufold") else None,
             what(r))
            for r in rows], TARGET_VS_TORCH, ge)
    target("reduced data contiguous: >= %d%% of the floor" % (TARGET_FLOOR * 100),
           [((r["floor_us"] / gpu_us(r, "cufold")) if gpu_us(r, "cufold") else None, what(r))
            for r in rows if r["contiguous_data"]], TARGET_FLOOR, ge)
    target("full reduction of a non-contiguous view <= %.1fx its contiguous copy" % TARGET_FULL_VS_COPY,
           [((gpu_us(r, "cufold") / gpu_us(r, "copy")) if gpu_us(r, "cufold") and gpu_us(r, "copy") else None, what(r))
            for r in rows if r["full_noncontig"]], TARGET_FULL_VS_COPY, le)
    return out


def format_results(results):
    m = results["meta"]
    lines = ["cufold bench axes on %s (copy %.0f GB/s)" % (m["device"].get("name"), m["copy_GBps"]), "",
             "%-20s %-7s %-6s %-15s %9s %9s %9s %7s %7s %7s %7s" % (
                 "layout", "axis", "op", "cufold plan", "cufold", "torch", "cupy", "xtorch", "xcupy",
                 "%floor", "xcopy")]
    for r in results["records"]:
        cf, tt, cp, cc = (gpu_us(r, k) for k in ("cufold", "torch", "cupy", "copy"))
        f, flags = R.us_cell, R.failure_flags(r, ("cufold", "torch", "cupy"))

        def ratio(a, b):
            return R.ratio_cell(a, b, 7)
        lines.append("%-20s %-7s %-6s %-15s %s %s %s %s %s %7s %s%s" % (
            r["layout"], str(r["axis"]).replace(" ", ""), r["reduction"], (r.get("launched") or r["plan"])[:15],
            f(cf), f(tt), f(cp),
            ratio(tt, cf), ratio(cp, cf), "%.0f%%" % (100 * r["floor_us"] / cf) if cf else "-",
            ratio(cf, cc) if cc else "", flags))
    lines += ["", "targets:"]
    lines += R.case_target_lines(results["targets_evaluated"])
    return "\n".join(lines)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m cufold bench axes",
                                description="Axis reductions and non-contiguous views vs torch and CuPy.")
    p.add_argument("--layouts", default=None, help="comma list of bases or layouts (A, y, z, A.T, ...)")
    p.add_argument("--reductions", default=",".join(REDUCTIONS))
    return add_run_options(p, "axes", dry_run="print the cases and exit (no GPU needed)")


def _select(spec):
    if not spec:
        return LAYOUTS
    want = [s.strip() for s in spec.split(",") if s.strip()]
    return tuple(lay for lay in LAYOUTS if lay in want or _base_of(lay) in want)


def main(argv=None, stdout=None, stderr=None):
    """``python -m cufold bench axes ...``; 0, 1 on a mismatch or error, 2 without a GPU."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    layouts = _select(args.layouts)
    reductions = tuple(r.strip() for r in args.reductions.split(",") if r.strip() in REDUCTIONS)
    todo = cases(layouts, reductions)
    # ~2 minutes: 0.02 s of events per (case, library), a few reps at least
    settings = Settings.quick() if args.quick else Settings(target_s=0.02, min_reps=10, max_reps=300,
                                                            max_case_s=0.5, warmup=2, est_reps=3)
    apply_run_options(settings, args)
    if args.dry_run:
        out.write("cufold bench axes: %d cases (layout x axis x reduction), each on cufold, torch, cupy\n"
                  % len(todo))
        for c in todo:
            out.write("  %s axis=%s %s\n" % c)
        return 0
    from . import backends
    env = backends.probe()
    if env.get("torch") is None:
        err.write("cufold bench axes: needs torch with CUDA (the data and the copy bandwidth)\n")
        return 2
    return run_and_save("axes", env, args, argv, out, err, "%d cases" % len(todo),
                        lambda backend, info: run(env, backend, layouts, reductions, settings,
                                                  progress=not args.no_progress, log=err),
                        format_results, lambda r: r.get("cufold", {}).get("status") != "ok")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
