"""``python -m cufold bench pyg``: feature rows by key and over segments (issue 19's PyG
shapes), cufold against ``torch_geometric.utils.scatter`` and torch in the same run.

E = 4 000 000 edges of F float32 features (F = 1, 16, 64, 256) into N = 200 000 nodes
whose in-degrees follow a power law (node of rank ``r`` receives an edge with probability
~ ``1 / (r + 1)``, ranks permuted to nodes: ``bykey_tuple.power_law_keys``), int64
destinations, two orders: ``sorted`` (destinations sorted, as a CSR graph's) and the same
``shuffled``. Values are the same rows in both orders. Candidates per (F, order):

=================================  ===========================================================
``cufold sum`` / ``cufold max``    ``reduce_by_key_into(dst, x, out[, cufold.maximum], check=False)``
                                   into an (N, F) ``out`` (sums accumulate; the maximum's ``out`` is
                                   filled with -inf in the call, as torch's below)
``... [deterministic]`` (info)     the sum with ``deterministic=True`` (radix grouping, ordered)
``PyG scatter sum/max``            ``torch_geometric.utils.scatter(x, dst, 0, dim_size=N,
                                   reduce=...)`` (new arrays per call), where it imports
``torch index_add_`` /             ``out.index_add_(0, dst, x)``; ``out.scatter_reduce_(0,
``torch scatter_reduce amax``      dst[:, None].expand(-1, F), x, 'amax')`` (what PyG runs)
``cufold segmented sum/max``       ``segmented_reduce(x, offsets[, cufold.maximum])`` over the
                                   CSR offsets of the sorted destinations (sorted only)
``torch segment_reduce sum/max``   ``torch.segment_reduce(x, reduce, offsets=offsets, axis=0)``
=================================  ===========================================================

Inputs smaller than 3x the L2 cache rotate over copies (F = 1). Every result is checked
against NumPy (float64) on three feature columns first. Times are CUDA-event medians.
Targets (per F and order): sum >= 2x and max >= 3x PyG (torch's where PyG is not
installed); segmented sum and max >= 2x ``torch.segment_reduce``.

Memory: the F = 256 rows are 4 GiB (one copy, shared by every candidate), their (N, F)
outputs 205 MB; one F at a time is on the device.

Examples::

    python -m cufold bench pyg --no-progress --out DIR
    python -m cufold bench pyg --quick --features 1,64 --orders sorted
    python -m cufold bench pyg --dry-run
"""

from __future__ import annotations

import argparse
import collections
import datetime
import sys
import traceback

import numpy as np

from . import report as R
from .backends import Skip
from .bykey_tuple import power_law_keys
from .runner import add_run_options, apply_run_options, run_and_save, time_events
from .timing import Settings, estimate_seconds

__all__ = ["ORDERS", "FEATURES", "candidates", "run", "evaluate", "format_results", "main"]

ORDERS = ("sorted", "shuffled")
FEATURES = (1, 16, 64, 256)
E_DEFAULT, N_DEFAULT = 4_000_000, 200_000
SUM, MAX, DET = "cufold sum", "cufold max", "cufold sum [deterministic]"
PYG_SUM, PYG_MAX = "PyG scatter sum", "PyG scatter max"
T_SUM, T_MAX = "torch index_add_", "torch scatter_reduce amax"
SEG_SUM, SEG_MAX = "cufold segmented sum", "cufold segmented max"
TSEG_SUM, TSEG_MAX = "torch segment_reduce sum", "torch segment_reduce max"

#: (task, label, library, role, sorted order only)
Cand = collections.namedtuple("Cand", "task label lib role sorted_only make")
Prepared = collections.namedtuple("Prepared", "call result note")


# --- data -------------------------------------------------------------------------------------

class Ctx:
    """One (F, order): host keys and checked columns, device copies, the backend."""

    def __init__(self, env, backend, F, order, keys, x_dev, x_cols, n, copies):
        self.env, self.backend, self.F, self.order, self.n = env, backend, F, order, n
        self.keys, self.x_cols = keys, x_cols
        self.keys_dev = [backend.upload(keys) for _ in range(copies)]
        self.x_dev = x_dev
        self.offsets = None
        if order == "sorted":
            self.offsets = np.concatenate([[0], np.cumsum(np.bincount(keys, minlength=n))]).astype(np.int64)
            self.offsets_dev = backend.upload(self.offsets)
        self.refs = references(self)

    def mod(self, lib):
        return self.env.get(lib)

    def sets(self, lib):
        """(keys, values) per rotating copy, as library ``lib`` sees them."""
        view = self.backend.view
        return [(view(k, lib), view(x, lib)) for k, x in zip(self.keys_dev, self.x_dev)]

    def new(self, host, lib):
        return self.backend.view(self.backend.upload(np.ascontiguousarray(host)), lib)


def checked_columns(F):
    return sorted({0, F // 2, F - 1})


def references(ctx):
    """Per checked column: (sum, sum of |x|, max) by key in float64 (empty keys: 0, 0, -inf)."""
    k, n = ctx.keys, ctx.n
    refs = {}
    order = np.argsort(k, kind="stable")
    ks = k[order]
    starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    for c, col in ctx.x_cols.items():
        x = col.astype(np.float64)
        vmax = np.full(n, -np.inf)
        vmax[ks[starts]] = np.maximum.reduceat(x[order], starts)
        refs[c] = (np.bincount(k, weights=x, minlength=n), np.bincount(k, weights=np.abs(x), minlength=n), vmax)
    return refs


def check(task, got, ctx):
    """Raise AssertionError unless ``got`` (host (N, F)) answers ``task`` on the checked columns."""
    got = np.asarray(got)
    if got.shape != (ctx.n, ctx.F):
        raise AssertionError("shape %s, expected %s" % (got.shape, (ctx.n, ctx.F)))
    for c, (s, a, m) in ctx.refs.items():
        g = got[:, c].astype(np.float64)
        if task == "sum":
            bad = np.flatnonzero(~(np.abs(g - s) <= 1e-4 * (1 + a)))
            ref = s
        else:
            # an empty segment / key: -inf (cufold, amax into -inf), 0 (PyG) or whatever
            # segment_reduce's default gives (-inf, 0 or NaN): conventions, not errors
            empty = np.isinf(m)
            bad = np.flatnonzero(~((g == m) | (empty & ((g == 0) | np.isnan(g)))))
            ref = m
        if bad.size:
            i = bad[0]
            raise AssertionError("%s column %d: %d of %d wrong; first at key %d: got %r, expected %r"
                                 % (task, c, bad.size, g.size, i, g[i], ref[i]))


# --- candidates -------------------------------------------------------------------------------

def _filled(ctx, lib, fill, copies):
    return [ctx.new(np.full((ctx.n, ctx.F), fill, np.float32), lib) for _ in range(copies)]


def _refill(a, value):
    """Fill device array ``a`` with ``value`` (torch, CuPy, or Numba by a copy)."""
    if hasattr(a, "fill_"):
        a.fill_(value)
    elif hasattr(a, "fill"):
        a.fill(value)
    else:
        a.copy_to_device(np.full(a.shape, value, a.dtype))


def _cufold_into(op_name, deterministic=False):
    def make(ctx):
        cufold = ctx.mod("cufold")
        op = getattr(cufold, op_name)
        sets = ctx.sets("cufold")
        outs = _filled(ctx, "cufold", -np.inf if op_name == "maximum" else 0.0, len(sets))
        args = [(k, x, o) for (k, x), o in zip(sets, outs)]
        into = cufold.reduce_by_key_into

        if op_name == "maximum":
            # into a fresh -inf each call: a maximum already there would skip most updates
            def call(a):
                _refill(a[2], -np.inf)
                into(a[0], a[1], a[2], op, deterministic=deterministic, check=False)
            return Prepared(call, lambda: outs[0], "out (N, F) float32 filled with -inf in the call"), args

        def call(a):
            into(a[0], a[1], a[2], op, deterministic=deterministic, check=False)
        return Prepared(call, lambda: outs[0], "out (N, F) float32, accumulating"), args
    return make


def _pyg(reduce):
    def make(ctx):
        ctx.mod("torch")
        try:
            from torch_geometric.utils import scatter
        except Exception as e:  # noqa: BLE001 - any import failure: not installed here
            raise Skip("torch_geometric not importable: %s" % e) from None
        n = ctx.n
        box = {}

        def call(a):
            box["r"] = scatter(a[1], a[0], 0, dim_size=n, reduce=reduce)
        return Prepared(call, lambda: box["r"], "new arrays per call"), ctx.sets("torch")
    return make


def _torch_sum(ctx):
    ctx.mod("torch")
    sets = ctx.sets("torch")
    outs = _filled(ctx, "torch", 0.0, len(sets))
    args = [(k, x, o) for (k, x), o in zip(sets, outs)]

    def call(a):
        a[2].index_add_(0, a[0], a[1])
    return Prepared(call, lambda: outs[0], "into (N, F), accumulating"), args


def _torch_amax(ctx):
    ctx.mod("torch")
    sets = ctx.sets("torch")
    outs = _filled(ctx, "torch", -np.inf, len(sets))
    F = ctx.F
    args = [(k.view(-1, 1).expand(-1, F), x, o) for (k, x), o in zip(sets, outs)]

    def call(a):
        a[2].fill_(-np.inf)
        a[2].scatter_reduce_(0, a[0], a[1], reduce="amax")
    return Prepared(call, lambda: outs[0], "into (N, F) filled with -inf in the call, index expanded"), args


def _segmented(op_name):
    def make(ctx):
        cufold = ctx.mod("cufold")
        op = getattr(cufold, op_name)
        off = ctx.backend.view(ctx.offsets_dev, "cufold")
        args = [(x, off) for _, x in ctx.sets("cufold")]
        box = {}

        def call(a):
            box["r"] = cufold.segmented_reduce(a[0], a[1], op)
        return Prepared(call, lambda: box["r"], "new (N, F) per call"), args
    return make


def _torch_segment(reduce):
    def make(ctx):
        torch = ctx.mod("torch")
        if not hasattr(torch, "segment_reduce"):
            raise Skip("this torch has no segment_reduce")
        off = ctx.backend.view(ctx.offsets_dev, "torch")
        args = [(x, off) for _, x in ctx.sets("torch")]
        box = {}

        def call(a):
            box["r"] = torch.segment_reduce(a[0], reduce, offsets=a[1], axis=0)
        return Prepared(call, lambda: box["r"], "new (N, F) per call; empty segments 0 (max)"), args
    return make


def candidates():
    return [Cand("sum", SUM, "cufold", "cufold", False, _cufold_into("plus")),
            Cand("sum", DET, "cufold", "info", False, _cufold_into("plus", True)),
            Cand("sum", PYG_SUM, "torch", "peer", False, _pyg("sum")),
            Cand("sum", T_SUM, "torch", "peer", False, _torch_sum),
            Cand("max", MAX, "cufold", "cufold", False, _cufold_into("maximum")),
            Cand("max", PYG_MAX, "torch", "peer", False, _pyg("max")),
            Cand("max", T_MAX, "torch", "peer", False, _torch_amax),
            Cand("segsum", SEG_SUM, "cufold", "cufold", True, _segmented("plus")),
            Cand("segsum", TSEG_SUM, "torch", "peer", True, _torch_segment("sum")),
            Cand("segmax", SEG_MAX, "cufold", "cufold", True, _segmented("maximum")),
            Cand("segmax", TSEG_MAX, "torch", "peer", True, _torch_segment("max"))]


# --- measuring --------------------------------------------------------------------------------

def measure(cand, ctx, settings):
    rec = {"case": ctx.order, "F": ctx.F, "task": cand.task, "label": cand.label, "lib": cand.lib,
           "role": cand.role, "status": "ok", "note": ""}
    backend = ctx.backend
    try:
        prep, args = cand.make(ctx)
        rec["note"] = prep.note + ("; %d rotating copies" % len(args) if len(args) > 1 else "")
        prep.call(args[0])
        backend.sync()
        check("sum" if cand.task in ("sum", "segsum") else "max", backend.fetch(prep.result()), ctx)
    except Skip as e:
        rec.update(status="skipped", note=str(e))
        return rec
    except AssertionError as e:
        rec.update(status="mismatch", note=str(e))
        return rec
    except Exception as e:  # noqa: BLE001 - a candidate's failure is a record, not the end of the run
        rec.update(status="error", note="%s: %s" % (type(e).__name__, str(e).strip()[:300]),
                   traceback=traceback.format_exc(limit=6))
        return rec
    try:
        for i in range(settings.warmup):
            prep.call(args[i % len(args)])
        backend.sync()
        time_events(backend.clock, prep.call, args, settings, rec)
    except Exception as e:  # noqa: BLE001
        rec.update(status="error", note="while timing: %s: %s" % (type(e).__name__, e))
    return rec


def rotating_copies(e, n, F, l2_bytes, cap=8):
    """Copies of (keys, values) so that the rotation exceeds 3x the L2 cache."""
    per = e * (8 + 4 * F) + n * 4 * F
    return int(max(1, min(cap, -(-3 * l2_bytes // per))))


def run(env, backend, orders, features, e, n, settings, progress=True, log=None, device_info=None, cands=None):
    from .runner import Progress, suite_meta
    cands = cands or candidates()
    started = datetime.datetime.now()
    info = device_info if device_info is not None else backend.device_info()
    l2 = info.get("l2_bytes") or (64 << 20)
    records = []
    total = sum(1 for _ in features for o in orders for c in cands if o == "sorted" or not c.sorted_only)
    bar = Progress(total, enabled=progress, stream=log or sys.stderr)
    keys = {o: power_law_keys(e, n, o, settings.seed) for o in orders}
    for F in features:
        rng = np.random.default_rng(settings.seed + F)
        x = rng.random((e, F), dtype=np.float32)
        x *= 2
        x -= 1
        cols = {c: np.ascontiguousarray(x[:, c]) for c in checked_columns(F)}
        copies = rotating_copies(e, n, F, l2)
        x_dev = [backend.upload(x) for _ in range(copies)]
        del x
        for order in orders:
            ctx = Ctx(env, backend, F, order, keys[order], x_dev, cols, n, copies)
            for c in cands:
                if c.sorted_only and order != "sorted":
                    continue
                bar.describe("F=%d %s %s" % (F, order, c.label))
                rec = measure(c, ctx, settings)
                if rec["status"] in ("mismatch", "error"):
                    bar.write("!! %s: F=%d %s %s: %s" % (rec["status"].upper(), F, order, c.label, rec["note"]))
                records.append(rec)
                bar.update()
            del ctx
            backend.release()
        del x_dev
        backend.release()
    bar.close()
    meta = suite_meta("pyg", env, backend, info, settings, started, orders=list(orders), features=list(features),
                      e=e, n=n)
    results = {"meta": meta, "cases": [], "records": records}
    results["targets_evaluated"] = evaluate(results)
    return results


# --- targets and the table --------------------------------------------------------------------

def _us(recs, F, order, label):
    r = next((r for r in recs if r["F"] == F and r["case"] == order and r["label"] == label), None)
    return r["gpu_us"] if r and r["status"] == "ok" and r.get("gpu_us") else None


def _target(name, threshold, mine, peer, peer_label):
    value = peer / mine if mine and peer else None
    e = {"name": name, "kind": "ratio", "cmp": ">=", "threshold": threshold, "value": value, "status": "n/a",
         "detail": ("%s us vs %s %s us" % (R._fmt_us(mine), peer_label, R._fmt_us(peer)) if value
                    else "not measured")}
    if value is not None:
        e["status"] = "PASS" if value >= threshold else "MISS"
    return e


def evaluate(results):
    recs, m = results["records"], results["meta"]
    out = []
    for F in m["features"]:
        for order in m["orders"]:
            for task, mine, pyg, torch, need in (("sum", SUM, PYG_SUM, T_SUM, 2.0), ("max", MAX, PYG_MAX, T_MAX, 3.0)):
                peer, label = _us(recs, F, order, pyg), pyg
                if peer is None:
                    peer, label = _us(recs, F, order, torch), torch
                out.append(_target("F=%d %s: %s by key vs %s" % (F, order, task, label), need,
                                   _us(recs, F, order, mine), peer, label))
            if order == "sorted":
                for mine, peer in ((SEG_SUM, TSEG_SUM), (SEG_MAX, TSEG_MAX)):
                    out.append(_target("F=%d: %s vs %s" % (F, mine, peer), 2.0, _us(recs, F, order, mine),
                                       _us(recs, F, order, peer), peer))
    return out


def format_results(results):
    m = results["meta"]
    head = [ln for ln in R.format_header(results).splitlines() if not ln.startswith(("us:", "GB/s ="))]
    lines = head + ["E = %s edges of F float32 features into N = %s nodes (power-law in-degrees), int64 "
                    "destinations; us = CUDA-event median; GB/s = the values' bytes / us; x = us / the task's "
                    "first row's us" % ("{:,}".format(m["e"]), "{:,}".format(m["n"]))]
    recs = results["records"]
    w = max([len(r["label"]) for r in recs] + [24])
    for F in m["features"]:
        for order in m["orders"]:
            lines += ["", "== F = %d, %s destinations" % (F, order)]
            for task in ("sum", "max", "segsum", "segmax"):
                rs = [r for r in recs if r["F"] == F and r["case"] == order and r["task"] == task]
                if not rs:
                    continue
                lines += R.task_rows(rs, w, lambda r: m["e"] * F * 4 / (r["gpu_us"] * 1e3))
    t = R.format_targets(evaluate(results), "pyg")
    if t:
        lines += ["", t]
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(prog="python -m cufold bench pyg",
                                description="Feature rows by key and over segments (PyG shapes) vs PyG and torch.")
    p.add_argument("--edges", type=int, default=E_DEFAULT, help="E, rows of values (default 4000000)")
    p.add_argument("--nodes", type=int, default=N_DEFAULT, help="N, keys (default 200000)")
    p.add_argument("--features", default=",".join(map(str, FEATURES)), help="comma list of F (default 1,16,64,256)")
    p.add_argument("--orders", default=",".join(ORDERS), help="comma list of %s" % ", ".join(ORDERS))
    p.add_argument("--only", default=None, help="comma list of candidate labels (substrings) to run")
    return add_run_options(p, "pyg", full="the same as the default (the issue's shapes)")


def main(argv=None, stdout=None, stderr=None):
    """``python -m cufold bench pyg ...``; the exit status (1 on a mismatch; 2 usage/no GPU)."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    orders = [o for o in args.orders.split(",") if o]
    try:
        features = [int(f) for f in args.features.split(",") if f]
    except ValueError:
        features = []
    if not orders or not features or any(o not in ORDERS for o in orders) or min(features) < 1 \
            or args.edges < 1 or args.nodes < 1:
        err.write("cufold bench pyg: bad --orders (%s), --features (positive integers), --edges or --nodes\n"
                  % ", ".join(ORDERS))
        return 2
    settings = Settings.quick() if args.quick else Settings.short()
    apply_run_options(settings, args)
    cands = candidates()
    if args.only:
        want = [s.strip() for s in args.only.split(",") if s.strip()]
        cands = [c for c in cands if any(s in c.label for s in want)]
    from . import backends
    env = backends.probe()
    if args.dry_run:
        out.write("cufold bench pyg: plan (dry run)\n")
        out.write("libraries:\n" + "\n".join(env.summary_lines()) + "\n")
        out.write("E = %d edges, N = %d nodes; features: %s; orders: %s\n"
                  % (args.edges, args.nodes, ", ".join(map(str, features)), ", ".join(orders)))
        points = 0
        for c in cands:
            k = len(features) * sum(1 for o in orders if o == "sorted" or not c.sorted_only)
            points += k
            out.write("  %-7s %-7s %-30s x%-3d %s\n" % (c.role, c.task, c.label, k, env.plan_note(c.lib)))
        from . import format_estimate
        out.write(format_estimate(estimate_seconds(settings, points, 0, [c.lib for c in cands] * 2,
                                                   args.edges * sum(4 * f + 16 for f in features))))
        return 0
    return run_and_save(
        "pyg", env, args, argv, out, err, "E=%d, N=%d, F=%s" % (args.edges, args.nodes, ",".join(map(str, features))),
        lambda backend, info: run(env, backend, orders, features, args.edges, args.nodes, settings,
                                  progress=not args.no_progress, log=err, device_info=info, cands=cands),
        format_results, lambda r: r["status"] == "mismatch")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
