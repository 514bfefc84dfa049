"""``python -m cufold bench SUITE``: cufold against what a user would pick instead.

Suites (``python -m cufold bench list``):

``reduce``     sum f32/f64/i32 vs torch.sum, cupy.sum with CUB, Numba's ``cuda.reduce``,
               ``cuda.compute.reduce_into``; argmax and mean+var f32 vs torch and CuPy
``scan``       inclusive scan / cumsum i32/f32 vs torch.cumsum, cupy.cumsum,
               ``cuda.compute.inclusive_scan``, a device-to-device copy as the ceiling
``hist``       histogram f32 / bincount i32 vs torch and CuPy (:mod:`.hist`)
``segmented``  segmented sum vs torch.segment_reduce, cupyx CSR, ``cuda.compute.segmented_reduce``
``segscan``    segmented_scan / inclusive_scan_by_key f32, short and long segments, 2^20..2^26, vs torch
               cumsum formulations (:mod:`.segscan`)
``bykey``      seed 001's box, reduce_by_key_into vs torch/cupyx (:mod:`.bykey`, its own driver)
``bykey-tuple`` tuple values by key: argmax, count + 3 sums, Welford vs PyG/torch (:mod:`.bykey_tuple`)
``pyg``        feature rows (E x F) by key and over segments vs PyG scatter / torch (:mod:`.pyg`, its own driver)
``axes``       axis reductions over layouts (A, A.T, strided, permuted) vs torch/CuPy (:mod:`.axes`, its own driver)
``scan-axes``  cumsum along axes, the batched affine recurrence vs torch/Triton/JAX (:mod:`.scan_axes`, its own driver)
``calls``      per-call host time of every device function vs torch (:mod:`.calls`)
``fused``      dot, logsumexp, norm, sum(transform=) f32 vs torch/CuPy (:mod:`.fused`; 2^20, 2^24, 2^28)
``distributed`` cufold.distributed (all_reduce of sums and Welford tuples, sharded sum and argmax) vs
               torch.distributed/NCCL, one process per GPU (:mod:`.distributed`, its own driver)

**Default run and --full.** A suite's default run takes under 4 minutes on an
H100/H200: sizes 2^10, 2^14, 2^18, 2^20, 2^24, 2^28 (``hist`` 2^20 and 2^26,
``segmented`` up to 2^24, ``calls`` 2^10, 2^12, ..., 2^20), no studies, 0.1 s of
CUDA events per (candidate, size) (at most 1000 calls) and per-call loops of
0.03 s. ``--full`` is the full sweep: every size from 2^10 to 2^28 (``calls`` to
2^20, ``segmented`` to 2^24), the studies (every ``cufold.algorithms(...)`` on
reduce, scan and the histograms) and 0.25 s of events (at most 2000 calls); tens
of minutes a suite. ``--dry-run`` prints what would run and an estimate of the
time (:data:`~.timing.ESTIMATE`: first calls, events, per-call loops, inputs).
``cuda.compute`` is timed as cuda-cccl 1.1.1 is called (keyword arguments only):
the GPU time of the object ``make_*`` builds with its temp storage allocated once,
the per-call time of the one-shot function.

Examples::

    python -m cufold bench reduce                     # the default run (< 4 minutes)
    python -m cufold bench reduce --full              # 2^10..2^28, every algorithm
    python -m cufold bench scan --quick               # default sizes, few reps
    python -m cufold bench reduce --sizes 20:28:2 --dtypes float32 --only cufold,torch
    python -m cufold bench reduce --full --cases alg --sizes 20,24   # one study
    python -m cufold bench calls --dry-run            # what would run, and for how long; no GPU needed
    python -m cufold bench report bench/results/reduce-...   # re-print and re-plot a results.json

Output: a progress bar on stderr; on stdout a table per case (µs per call,
GB/s, ratio to the best peer; see :mod:`cufold.bench.report` for which time
is used) and the suite's targets (PASS/MISS); in ``--out`` (default
``bench/results/<suite>-<gpu>-<date>``): ``results.json`` (every number,
device, versions, L2 size, copy bandwidth, the estimate), ``table.txt``,
``bandwidth.png`` and ``call.png``.

Exit status: 0, or 1 if any result mismatched its reference, 2 on usage
errors or when there is no GPU to run on.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from . import report as R
from . import suites as S
from .timing import Settings, estimate_seconds, parse_list, parse_sizes, rotation_count

__all__ = ["main", "build_parser", "estimate", "DEFAULT_BUDGET_S"]

#: What a suite's default run may take on an H100/H200 (its dry run's estimate).
DEFAULT_BUDGET_S = 240.0
#: The L2 size the dry run assumes (an H100's, about an H200's).
PLAN_L2_BYTES = 50 << 20


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m cufold bench",
        description="Time cufold against torch, CuPy (CUB), Numba and cuda.compute.",
        epilog="Also: 'python -m cufold bench report PATH' re-prints and re-plots a results.json; "
               "'python -m cufold bench list' lists suites and cases.")
    p.add_argument("suite", choices=sorted(S.SUITES), help="what to time")
    p.add_argument("--sizes", default=None,
                   help="log2 element counts: 10:28, 10:28:2, or 10,16,20 (default: the suite's, "
                        "see 'list'; --full: 10:28, calls 10:20)")
    p.add_argument("--dtypes", default=None, help="comma list of float32,float64,int32 (default: the suite's)")
    p.add_argument("--cases", default=None,
                   help="comma list of case ops: sum, argmax, mean_var (var), reduce-alg, scan, scan-alg, alg")
    p.add_argument("--only", default=None,
                   help="comma list of libraries (cufold, torch, cupy, numba, cuda.compute) or label "
                        "prefixes (cufold.reduce[); the copy ceiling is always kept")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true",
                      help="the full sweep: every size, every cufold algorithm (the studies), "
                           "0.25 s of events per point (tens of minutes)")
    mode.add_argument("--quick", action="store_true", help="the default sizes with few reps (a smoke run)")
    p.add_argument("--out", default=None, help="output directory (default bench/results/<suite>-<gpu>-<date>)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--dry-run", action="store_true", help="print what would run and exit (no GPU needed)")
    p.add_argument("--cupy-accelerators", default="cub", metavar="ROUTINE[:REDUCTION]",
                   help="CuPy accelerators: cub (default: CUB for routines and reductions), cub:none, none")
    p.add_argument("--cufold-input", choices=("torch", "cupy", "numba"), default=None,
                   help="array library of cufold's inputs (default: torch if usable, else cupy, else numba)")
    g = p.add_argument_group("timing")
    g.add_argument("--target-time", type=float, default=None,
                   help="event-timed seconds per (candidate, size) (default 0.1; full 0.25; quick 0.03; "
                        "calls 0.01)")
    g.add_argument("--min-reps", type=int, default=None, help="at least this many timed calls (default 20)")
    g.add_argument("--max-reps", type=int, default=None,
                   help="at most this many timed calls (default 1000; full 2000)")
    g.add_argument("--call-max", type=int, default=None,
                   help="measure wall-clock per-call time up to 2^CALL_MAX elements (default 20)")
    g.add_argument("--buffers-cap", type=int, default=None, help="max rotation buffers (default 64)")
    g.add_argument("--seed", type=int, default=None, help="input data seed")
    g.add_argument("--no-raw", action="store_true", help="do not keep every event sample in the JSON")
    g.add_argument("--no-ceiling", action="store_true", help="do not measure the 256 MiB copy ceiling")
    return p


def _settings(args, suite=None):
    """The run's settings: the mode's (default, --full, --quick), then the suite's own,
    then the options given."""
    s = Settings.quick() if args.quick else Settings() if args.full else Settings.short()
    for attr, val in (suite.settings if suite else {}).items():
        setattr(s, attr, val)
    for attr, val in (("target_s", args.target_time), ("min_reps", args.min_reps), ("max_reps", args.max_reps),
                      ("call_max_log2", args.call_max), ("buffer_cap", args.buffers_cap), ("seed", args.seed)):
        if val is not None:
            setattr(s, attr, val)
    if args.no_raw:
        s.raw = False
    return s


def _data_bytes(cases, sizes, settings, l2=PLAN_L2_BYTES):
    """Bytes of the rotation buffers the run generates (one set per dtype and distribution)."""
    kinds = {(np.dtype(c.dtype).itemsize, c.dtype, c.dist) for c in cases}
    return sum(rotation_count(it << k, l2, settings.l2_factor, settings.buffer_cap) * (it << k)
               for k in sizes for it, _, _ in kinds)


def estimate(cases, sizes, settings):
    """:func:`~.timing.estimate_seconds` of a run of ``cases`` at ``sizes``. Every candidate
    counts, also one this machine cannot run (the GPU machine has its library)."""
    cands = [(c, cand) for c in cases for cand in c.candidates]
    first_calls = {(cand.lib, cand.label, c.dtype) for c, cand in cands}
    calls = sum(1 for k in sizes if k <= settings.call_max_log2)
    return estimate_seconds(settings, len(sizes) * len(cands), calls * len(cands),
                            [lib for lib, _, _ in first_calls], _data_bytes(cases, sizes, settings))


def format_estimate(parts):
    return "estimate: %.0f s on an H100/H200 (%s; model: cufold.bench.timing.ESTIMATE)\n" % (
        parts["total"], ", ".join("%s %.0f" % (k, v) for k, v in parts.items() if k != "total"))


def _print_plan(suite, cases, env, sizes, settings, out):
    w = out.write
    w("cufold bench %s: plan (dry run)\n" % suite)
    w("libraries:\n" + "\n".join(env.summary_lines()) + "\n")
    if env.simulator:
        w("note: NUMBA_ENABLE_CUDASIM=1 -- a real run needs a GPU\n")
    w("sizes: %s\n" % ", ".join("2^%d" % k for k in sizes))
    l2 = PLAN_L2_BYTES
    w("buffers per size (float32, for a 50 MiB L2): %s\n" % ", ".join(
        "2^%d:%d" % (k, rotation_count(4 << k, l2, settings.l2_factor, settings.buffer_cap)) for k in sizes))
    total = 0
    for c in cases:
        w("case %s (%s, %s inputs, %d B/elem moved%s):\n" % (
            c.id, c.title, c.dist, c.bytes_per_elem, ", peers from %s" % c.peers_from if c.peers_from else ""))
        for cand in c.candidates:
            state = ("skipped: %s" % cand.skip) if cand.skip else "will run"
            w("  %-8s %-32s %s\n" % (cand.role, cand.label, state))
            total += len(sizes)
    w("measurements: %d\n" % total)
    w(format_estimate(estimate(cases, sizes, settings)))
    tg = S.SUITES[suite].targets
    if tg:
        w("targets:\n" + "".join("  %s (%s %s)\n" % (t["name"], t["cmp"], t["threshold"]) for t in tg))


def _report_main(argv):
    p = argparse.ArgumentParser(prog="python -m cufold bench report",
                                description="Re-print the table and targets of a results.json; re-plot.")
    p.add_argument("path", help="results.json or the directory holding it")
    p.add_argument("--out", default=None, help="where to write the plots (default: next to the JSON)")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    try:
        results = R.load_json(args.path)
    except (OSError, ValueError) as e:
        sys.stderr.write("cufold bench report: %s\n" % e)
        return 2
    suite = results.get("meta", {}).get("suite", "")
    print(R.format_table(results))
    t = R.format_targets(R.evaluate_targets(results), suite)
    if t:
        print("\n" + t)
    if not args.no_plot:
        d = args.out or (args.path if os.path.isdir(args.path) else os.path.dirname(os.path.abspath(args.path)))
        _plots(results, d, sys.stderr)
    return 0


def _plots(results, out_dir, err):
    os.makedirs(out_dir, exist_ok=True)
    try:
        paths = [R.plot_bandwidth(results, os.path.join(out_dir, "bandwidth.png")),
                 R.plot_calls(results, os.path.join(out_dir, "call.png"))]
        return [p for p in paths if p]
    except ImportError as e:
        err.write("plots skipped: matplotlib not importable (%s)\n" % e)
    except Exception as e:
        err.write("plots failed: %s: %s\n" % (type(e).__name__, e))
    return []


def open_backend(env, err, *backend_args):
    """The GPU backend for timing, or None after saying on ``err`` why not
    (the CPU simulator, where timings would mean nothing, or no GPU library)."""
    if env.simulator:
        err.write("cufold bench: NUMBA_ENABLE_CUDASIM=1 (the CPU simulator): timings would mean nothing; "
                  "run on a GPU without it (or use --dry-run)\n")
        return None
    from .backends import Backend, Skip
    try:
        return Backend(env, *backend_args)
    except Skip as e:
        err.write("cufold bench: %s\n" % e)
        return None


def main(argv=None, stdout=None, stderr=None):
    """Entry point of ``python -m cufold bench ...``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    if argv and argv[0] == "report":
        return _report_main(argv[1:])
    if argv and argv[0] == "axes":  # layouts x axes, not log2 sizes: its own driver
        from .axes import main as axes_main
        return axes_main(argv[1:], stdout=out, stderr=err)
    if argv and argv[0] == "scan-axes":  # fixed shapes x axes: its own driver
        from .scan_axes import main as scan_axes_main
        return scan_axes_main(argv[1:], stdout=out, stderr=err)
    if argv and argv[0] == "bykey":  # seed 001's fixed box, not log2 sizes: its own driver
        from .bykey import main as bykey_main
        return bykey_main(argv[1:], stdout=out, stderr=err)
    if argv and argv[0] == "bykey-tuple":  # issue 25's fixed shapes: its own driver too
        from .bykey_tuple import main as tuple_main
        return tuple_main(argv[1:], stdout=out, stderr=err)
    if argv and argv[0] == "pyg":  # issue 19's PyG shapes: its own driver
        from .pyg import main as pyg_main
        return pyg_main(argv[1:], stdout=out, stderr=err)
    if argv and argv[0] == "distributed":  # one process per GPU: its own driver
        from .distributed import main as distributed_main
        return distributed_main(argv[1:], stdout=out, stderr=err)
    if argv and argv[0] == "list":
        for name, s in S.SUITES.items():
            sizes = "" if s.build is None else "; sizes 2^(%s), --full 2^(%s)" % (s.default_sizes, s.full_sizes)
            out.write("%-9s %s%s\n" % (name, s.doc, sizes))
        return 0
    parser = build_parser()
    args = parser.parse_args(argv)
    suite = S.SUITES[args.suite]
    try:
        sizes = parse_sizes(args.sizes or (suite.full_sizes if args.full else suite.default_sizes))
        settings = _settings(args, suite)
        from . import backends
        env = backends.probe(cupy_accelerators=args.cupy_accelerators)
        cases = S.build_cases(args.suite, env, parse_list(args.dtypes), parse_list(args.cases),
                              parse_list(args.only), full=args.full)
    except ValueError as e:
        err.write("%s\n" % e)
        return 2
    if not cases:
        err.write("cufold bench %s: nothing to run (check --dtypes/--cases/--only; the algorithm "
                  "studies run with --full)\n" % args.suite)
        return 2
    if args.dry_run:
        _print_plan(args.suite, cases, env, sizes, settings, out)
        return 0
    backend = open_backend(env, err, args.cufold_input)
    if backend is None:
        return 2

    from .runner import run_suite
    info = backend.device_info()
    out_dir = R.make_out_dir(args.out, args.suite, info.get("name"))
    err.write("cufold bench %s on %s: %d sizes x %d candidates -> %s\n" % (
        args.suite, info.get("name"), len(sizes), sum(len(c.candidates) for c in cases), out_dir))
    for lib, why in sorted(env.skipped.items()):
        err.write("  skipped: %s\n" % why)
    def save(results):
        text = R.format_table(results)
        tgt = R.format_targets(R.evaluate_targets(results), args.suite)
        if tgt:
            text += "\n\n" + tgt
        if results["meta"]["partial"]:
            text = "PARTIAL (the run goes on; sizes done: %s)\n" % ",".join(
                str(k) for k in sorted({r["log2n"] for r in results["records"]})) + text
        R.save_results(results, text, out_dir)
        return text

    results = run_suite(args.suite, cases, backend, env, sizes, settings, progress=not args.no_progress,
                        log=err, device_info=info, ceiling=not args.no_ceiling, checkpoint=save,
                        meta_extra={"argv": argv, "command": "python -m cufold bench " + " ".join(argv),
                                    "out_dir": out_dir, "estimate_s": estimate(cases, sizes, settings)})
    out.write(save(results) + "\n")
    files = ["results.json", "table.txt"]
    if not args.no_plot:
        files += [os.path.basename(p) for p in _plots(results, out_dir, err)]
    err.write("wrote %s: %s\n" % (out_dir, ", ".join(files)))
    bad = [r for r in results["records"] if r["status"] == "mismatch"]
    if bad:
        err.write("!! %d result(s) MISMATCHED their reference (not timed): %s\n" % (
            len(bad), ", ".join(sorted({"%s %s" % (r["case"], r["label"]) for r in bad}))))
        return 1
    return 0
