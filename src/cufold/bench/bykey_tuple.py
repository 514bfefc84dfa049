"""``python -m cufold bench bykey-tuple``: tuple values by key (``reduce_by_key_into`` with
tuple outputs), cufold against the peers, issue 25's shapes.

E = 2^22 float32 values (float64 for the sums and Welford) into N = 200 000 keys with
power-law frequencies (key of rank ``r`` drawn with probability ~ ``1 / (r + 1)``, ranks
mapped to keys by a random permutation), int64 keys for everyone (torch's
``scatter_reduce_`` needs them), two orders: ``sorted`` and ``shuffled``. Three tasks:

``argmax``   the maximum of each key and its first position:
             cufold ``reduce_by_key_into(keys, x, (vmax, pos), cufold.argmax)`` (the packed
             64-bit atomic; also ``algorithm='grouped'``), cufold's one-field
             ``maximum`` by key in the same run, PyG ``scatter(reduce='max')`` +
             ``torch_geometric.utils._scatter.scatter_argmax`` (where torch_geometric
             imports), and torch's two passes: ``scatter_reduce_('amax')``, then
             ``'amin'`` of the positions holding each key's maximum (both into new
             arrays each call, as that method needs).
``sums``     a count (int32 ones into int64) and three float64 sums by key: cufold in one
             call (tuple values; also ``algorithm='warp'``, ``'atomic'`` and ``deterministic=True``)
             against four one-field cufold calls, and torch's four ``index_add_``.
``welford``  count, mean and M2 by key of float64 values: cufold ``welford`` by key (the
             two-pass path; also ``deterministic=True``) against torch's three
             ``index_add_`` (count, sum, sum of squares; the squares computed in the call).
             Accuracy (checked once, not timed): values 1e6 + U(-1, 1), the variance
             of every key with 2+ values to 1e-6 relative.

cufold's reductions accumulate into their ``out`` (argmax and Welford repeat harmlessly);
every result is first checked against NumPy. Times are CUDA-event medians. Targets (per
order): argmax >= 3x the faster of the two peer methods and <= 1.5x cufold's one-field max;
the one-call sums faster than the four one-field calls; Welford >= 2x torch; the accuracy.

Examples::

    python -m cufold bench bykey-tuple --no-progress --out DIR
    python -m cufold bench bykey-tuple --quick --orders shuffled --tasks argmax
    python -m cufold bench bykey-tuple --dry-run
"""

from __future__ import annotations

import argparse
import collections
import datetime
import sys
import traceback

import numpy as np

from . import report as R
from .backends import SharedCopies, Skip
from .runner import add_run_options, apply_run_options, run_and_save, time_events
from .timing import Settings, estimate_seconds

__all__ = ["ORDERS", "TASKS", "power_law_keys", "candidates", "run", "evaluate", "format_results", "main"]

ORDERS = ("sorted", "shuffled")
TASKS = ("argmax", "sums", "welford")
E_DEFAULT, N_DEFAULT = 1 << 22, 200_000
ARGMAX, MAX1 = "cufold argmax by key", "cufold max by key (one field)"
SUMS1, SUMS4 = "cufold count+3 sums, one call", "cufold count+3 sums, 4 one-field calls"
WELFORD, TORCH_W = "cufold welford by key", "torch 3x index_add_ (count, sum, sum of squares)"
PYG, TORCH_ARG = "PyG scatter max + scatter_argmax", "torch scatter_reduce_ amax, then amin of positions"

Cand = collections.namedtuple("Cand", "task label lib role make")
Prepared = collections.namedtuple("Prepared", "call result note")


# --- data -------------------------------------------------------------------------------------

def power_law_keys(e, n, order, seed=1):
    """``e`` int64 keys in ``[0, n)``: rank ``r`` with probability ~ ``1/(r+1)``, ranks
    permuted to keys; sorted, or in random order."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n + 1)
    ranks = rng.choice(n, size=e, p=p / p.sum())
    keys = rng.permutation(n).astype(np.int64)[ranks]
    return np.sort(keys) if order == "sorted" else keys


class Ctx:
    """What ``Cand.make`` sees: one order's host data, device copies (shared), the backend."""

    def __init__(self, env, backend, order, keys, n, seed):
        self.env, self.backend, self.order, self.keys, self.n = env, backend, order, keys, n
        rng = np.random.default_rng(seed)
        e = keys.size
        self.host = {"keys": keys, "x32": rng.normal(size=e).astype(np.float32),
                     "ones": np.ones(e, np.int32), "positions": np.arange(e, dtype=np.int64)}
        for f in ("a", "b", "c"):
            self.host[f] = rng.normal(size=e)
        self.host["x64"] = self.host["a"]
        self._copies = SharedCopies(backend)

    def mod(self, lib):
        return self.env.get(lib)

    def device(self, what, lib):
        return self._copies.get(what, lib, lambda: self.host[what])

    def new(self, host, lib):
        return self.backend.view(self.backend.upload(np.ascontiguousarray(host)), lib)


def _bykey(ctx):
    ctx.mod("cufold")
    import importlib
    return importlib.import_module("cufold.device.bykey")


# --- references -------------------------------------------------------------------------------

def references(ctx):
    """NumPy's answers per task."""
    k, n, h = ctx.keys, ctx.n, ctx.host
    x = h["x32"]
    vmax = np.full(n, -np.inf, np.float32)
    np.maximum.at(vmax, k, x)
    order = np.lexsort((np.arange(k.size), -x.astype(np.float64), k))       # key, then largest, then first
    first = np.r_[True, k[order][1:] != k[order][:-1]]
    pos = np.full(n, -1, np.int64)
    pos[k[order][first]] = order[first]
    count = np.bincount(k, minlength=n)
    sums = [np.bincount(k, weights=h[f], minlength=n) for f in ("a", "b", "c")]
    mean = sums[0] / np.maximum(count, 1)
    m2 = np.bincount(k, weights=(h["a"] - mean[k]) ** 2, minlength=n)
    return {"argmax": (vmax, pos), "max": vmax, "sums": (count, *sums), "welford": (count, mean, m2)}


def _close(got, ref, what, rtol=1e-9):
    g = np.asarray(got, dtype=np.float64).reshape(-1)
    r = np.asarray(ref, dtype=np.float64)
    bad = np.flatnonzero(~(np.abs(g - r) <= rtol * (1 + np.abs(r))) & ~(np.isnan(g) & np.isnan(r)) & (g != r))
    if bad.size:
        i = bad[0]
        raise AssertionError("%s: %d of %d wrong; first at %d: got %r, expected %r" % (what, bad.size, g.size, i,
                                                                                        g[i], r[i]))


def check(task, got, refs, ctx):
    """Raise AssertionError unless ``got`` (host arrays) answers ``task``."""
    if task == "max":
        _close(got, refs["max"], "max")
    elif task == "argmax":
        vmax, pos = refs["argmax"]
        reached = pos >= 0
        _close(got[0][reached], vmax[reached], "max")
        p = np.asarray(got[1])[reached]
        if np.array_equal(p, pos[reached]):
            return
        # a peer without the first-position rule: its positions must hold the maximum
        x, k = ctx.host["x32"], ctx.keys
        ok = (p >= 0) & (p < k.size)
        if not ok.all() or not np.array_equal(k[p], np.flatnonzero(reached)) or not np.array_equal(
                x[p], vmax[reached]):
            raise AssertionError("argmax: positions do not hold each key's maximum")
        raise AssertionError("argmax: not the first position of each maximum")
    else:
        for f, (g, r) in enumerate(zip(got, refs[task])):
            _close(g, r, "%s field %d" % (task, f), 1e-9)


# --- candidates -------------------------------------------------------------------------------

def _zeros(ctx, lib, dtype, fill=0):
    return ctx.new(np.full(ctx.n, fill, dtype), lib)


def _argmax(algorithm=None):
    def make(ctx):
        into, cufold = _bykey(ctx).reduce_by_key_into, ctx.mod("cufold")
        keys, x = ctx.device("keys", "cufold"), ctx.device("x32", "cufold")
        out = (_zeros(ctx, "cufold", np.float32, -np.inf), _zeros(ctx, "cufold", np.int64, np.iinfo(np.int64).max))
        return Prepared(lambda: into(keys, x, out, cufold.argmax, algorithm=algorithm, check=False),
                        lambda: out, "out = (float32, int64)")
    return make


def _max1(ctx):
    into, cufold = _bykey(ctx).reduce_by_key_into, ctx.mod("cufold")
    keys, x = ctx.device("keys", "cufold"), ctx.device("x32", "cufold")
    out = _zeros(ctx, "cufold", np.float32, -np.inf)
    return Prepared(lambda: into(keys, x, out, cufold.maximum, check=False), lambda: out, "float32")


def _pyg(ctx):
    torch = ctx.mod("torch")
    try:
        from torch_geometric.utils import scatter
        from torch_geometric.utils._scatter import scatter_argmax
    except Exception as e:  # noqa: BLE001 - any import failure: not installed here
        raise Skip("torch_geometric not importable: %s" % e) from None
    keys, x, n = ctx.device("keys", "torch"), ctx.device("x32", "torch"), ctx.n
    box = {}

    def call():
        box["v"] = scatter(x, keys, dim=0, dim_size=n, reduce="max")
        box["p"] = scatter_argmax(x, keys, dim_size=n)
    del torch
    return Prepared(call, lambda: (box["v"], box["p"]), "new arrays per call")


def _torch_two_pass(ctx):
    torch = ctx.mod("torch")
    keys, x, n = ctx.device("keys", "torch"), ctx.device("x32", "torch"), ctx.n
    positions = ctx.device("positions", "torch")
    e = x.shape[0]
    box = {}

    def call():
        vmax = torch.full((n,), -float("inf"), dtype=x.dtype, device=x.device)
        vmax.scatter_reduce_(0, keys, x, reduce="amax")
        held = torch.where(x == vmax[keys], positions, e)
        pos = torch.full((n,), e, dtype=torch.int64, device=x.device)
        pos.scatter_reduce_(0, keys, held, reduce="amin")
        box["r"] = (vmax, pos)
    return Prepared(call, lambda: box["r"], "new arrays per call")


def _sums_data(ctx):
    """(reduce_by_key_into, keys, the four value fields, the four zeroed outputs) of the sums task."""
    keys = ctx.device("keys", "cufold")
    vals = tuple(ctx.device(f, "cufold") for f in ("ones", "a", "b", "c"))
    out = (_zeros(ctx, "cufold", np.int64),) + tuple(_zeros(ctx, "cufold", np.float64) for _ in range(3))
    return _bykey(ctx).reduce_by_key_into, keys, vals, out


def _sums(algorithm=None, deterministic=False):
    def make(ctx):
        into, keys, vals, out = _sums_data(ctx)

        def call():
            into(keys, vals, out, algorithm=algorithm, deterministic=deterministic, check=False)
        return Prepared(call, lambda: out, "out = (int64, float64 x3)")
    return make


def _sums4(ctx):
    into, keys, vals, out = _sums_data(ctx)

    def call():
        for v, o in zip(vals, out):
            into(keys, v, o, check=False)
    return Prepared(call, lambda: out, "four calls")


def _torch_sums(ctx):
    ctx.mod("torch")
    keys = ctx.device("keys", "torch")
    vals = tuple(ctx.device(f, "torch") for f in ("ones", "a", "b", "c"))
    out = (_zeros(ctx, "torch", np.int64),) + tuple(_zeros(ctx, "torch", np.float64) for _ in range(3))

    def call():
        out[0].index_add_(0, keys, vals[0].long())
        for v, o in zip(vals[1:], out[1:]):
            o.index_add_(0, keys, v)
    return Prepared(call, lambda: out, "4x index_add_ (ones as int64 in the call)")


def _welford(deterministic=False, algorithm=None):
    def make(ctx):
        into, cufold = _bykey(ctx).reduce_by_key_into, ctx.mod("cufold")
        keys, x = ctx.device("keys", "cufold"), ctx.device("x64", "cufold")
        out = tuple(_zeros(ctx, "cufold", np.float64) for _ in range(3))
        return Prepared(lambda: into(keys, x, out, cufold.welford, algorithm=algorithm, deterministic=deterministic,
                                     check=False), lambda: out, "float64 (count, mean, M2)")
    return make


def _torch_welford(ctx):
    torch = ctx.mod("torch")
    keys, x = ctx.device("keys", "torch"), ctx.device("x64", "torch")
    ones = torch.ones_like(x)
    out = tuple(_zeros(ctx, "torch", np.float64) for _ in range(3))

    def call():
        out[0].index_add_(0, keys, ones)
        out[1].index_add_(0, keys, x)
        out[2].index_add_(0, keys, x * x)

    def result():
        c = out[0].cpu().numpy()
        mean = out[1].cpu().numpy() / np.maximum(c, 1)
        return (c, mean, out[2].cpu().numpy() - c * mean * mean)
    return Prepared(call, result, "float64; M2 = sum of squares - count * mean^2")


def candidates():
    return [Cand("argmax", ARGMAX, "cufold", "cufold", _argmax()),
            Cand("argmax", ARGMAX + " [grouped]", "cufold", "info", _argmax("grouped")),
            Cand("max", MAX1, "cufold", "cufold", _max1),
            Cand("argmax", PYG, "torch", "peer", _pyg),
            Cand("argmax", TORCH_ARG, "torch", "peer", _torch_two_pass),
            Cand("sums", SUMS1, "cufold", "cufold", _sums()),
            Cand("sums", SUMS1 + " [warp]", "cufold", "info", _sums("warp")),
            Cand("sums", SUMS1 + " [atomic]", "cufold", "info", _sums("atomic")),
            Cand("sums", SUMS1 + " [deterministic]", "cufold", "info", _sums(deterministic=True)),
            Cand("sums", SUMS4, "cufold", "cufold", _sums4),
            Cand("sums", "torch 4x index_add_", "torch", "info", _torch_sums),
            Cand("welford", WELFORD, "cufold", "cufold", _welford()),
            Cand("welford", WELFORD + " [deterministic]", "cufold", "info", _welford(True)),
            Cand("welford", TORCH_W, "torch", "peer", _torch_welford)]


# --- measuring --------------------------------------------------------------------------------

def _fetch(backend, got):
    return tuple(backend.fetch(g) for g in got) if isinstance(got, tuple) else backend.fetch(got)


def measure(cand, ctx, refs, settings):
    rec = {"case": ctx.order, "task": cand.task, "label": cand.label, "lib": cand.lib, "role": cand.role,
           "status": "ok", "note": ""}
    backend = ctx.backend
    try:
        prep = cand.make(ctx)
        rec["note"] = prep.note
        prep.call()
        backend.sync()
        check(cand.task, _fetch(backend, prep.result()), refs, ctx)
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
        call = prep.call
        for _ in range(settings.warmup):
            call()
        backend.sync()
        time_events(backend.clock, lambda _: call(), [None], settings, rec)
    except Exception as e:  # noqa: BLE001
        rec.update(status="error", note="while timing: %s: %s" % (type(e).__name__, e))
    return rec


def accuracy(env, backend, n, e, seed):
    """Welford by key on values 1e6 + U(-1, 1): the largest relative error of a variance
    (keys with 2+ values), cufold's default path and torch's sum of squares."""
    rng = np.random.default_rng(seed)
    keys = power_law_keys(e, n, "shuffled", seed)
    x = 1e6 + rng.uniform(-1, 1, e)
    count = np.bincount(keys, minlength=n)
    mean = np.bincount(keys, weights=x, minlength=n) / np.maximum(count, 1)
    var = np.bincount(keys, weights=(x - mean[keys]) ** 2, minlength=n) / np.maximum(count, 1)
    many = (count >= 2) & (var > 1e-6)       # a relative error needs a variance (two equal values have none)
    out = {}
    import importlib
    env.get("cufold")
    bk = importlib.import_module("cufold.device.bykey")
    import cufold
    d_keys, d_x = backend.view(backend.upload(keys), "cufold"), backend.view(backend.upload(x), "cufold")
    outs = tuple(backend.view(backend.upload(np.zeros(n)), "cufold") for _ in range(3))
    bk.reduce_by_key_into(d_keys, d_x, outs, cufold.welford, check=False)
    c, _, m2 = (np.asarray(backend.fetch(o), np.float64) for o in outs)
    out["cufold"] = float(np.max(np.abs(m2[many] / c[many] - var[many]) / var[many]))
    if env.has("torch"):
        sq = np.bincount(keys, weights=x * x, minlength=n)            # what three index_add_ give (float64)
        naive = sq / np.maximum(count, 1) - mean ** 2
        out["torch"] = float(np.max(np.abs(naive[many] - var[many]) / var[many]))
    return out


def run(env, backend, orders, tasks, e, n, settings, progress=True, log=None, device_info=None, cands=None):
    from .runner import measure_orders, suite_meta
    cands = [c for c in (cands or candidates()) if c.task in tasks or (c.task == "max" and "argmax" in tasks)]
    started = datetime.datetime.now()
    info = device_info if device_info is not None else backend.device_info()
    def make_ctx(order):
        ctx = Ctx(env, backend, order, power_law_keys(e, n, order, settings.seed), n, settings.seed)
        ctx.refs = references(ctx)
        return ctx

    records = measure_orders(orders, cands, make_ctx, lambda c, ctx: measure(c, ctx, ctx.refs, settings),
                             backend, progress, log)
    acc = accuracy(env, backend, n, e, settings.seed) if "welford" in tasks else {}
    meta = suite_meta("bykey-tuple", env, backend, info, settings, started, orders=list(orders),
                      tasks=list(tasks), e=e, n=n, accuracy=acc)
    results = {"meta": meta, "cases": [], "records": records}
    results["targets_evaluated"] = evaluate(results)
    return results


# --- targets and the table --------------------------------------------------------------------

def _us(recs, order, label):
    r = next((r for r in recs if r["case"] == order and r["label"] == label), None)
    return r["gpu_us"] if r and r["status"] == "ok" and r.get("gpu_us") else None


def _target(name, cmp, threshold, value, detail):
    e = {"name": name, "kind": "ratio", "cmp": cmp, "threshold": threshold, "value": value, "status": "n/a",
         "detail": detail}
    if value is not None:
        ok = value >= threshold if cmp == ">=" else value <= threshold
        e["status"] = "PASS" if ok else "MISS"
    return e


def evaluate(results):
    recs, m = results["records"], results["meta"]
    out = []

    def versus(a, b):
        return "%s us vs %s us" % (R._fmt_us(a), R._fmt_us(b)) if a and b else "not measured"
    for order in m["orders"]:
        if "argmax" in m["tasks"]:
            mine, one = _us(recs, order, ARGMAX), _us(recs, order, MAX1)
            peers = [(u, lab) for lab in (PYG, TORCH_ARG) for u in [_us(recs, order, lab)] if u]
            best = min(peers) if peers else None
            out.append(_target("%s: argmax by key vs the faster peer" % order, ">=", 3.0,
                               best[0] / mine if best and mine else None,
                               "%s us vs %s %s us" % (R._fmt_us(mine), best[1], R._fmt_us(best[0])) if best and mine
                               else "not measured"))
            out.append(_target("%s: argmax by key / one-field max by key" % order, "<=", 1.5,
                               mine / one if mine and one else None, versus(mine, one)))
        if "sums" in m["tasks"]:
            one, four = _us(recs, order, SUMS1), _us(recs, order, SUMS4)
            out.append(_target("%s: count+3 sums, 4 calls / one call" % order, ">=", 1.0,
                               four / one if one and four else None, versus(one, four)))
        if "welford" in m["tasks"]:
            mine, torch = _us(recs, order, WELFORD), _us(recs, order, TORCH_W)
            out.append(_target("%s: welford by key vs torch 3x index_add_" % order, ">=", 2.0,
                               torch / mine if mine and torch else None, versus(mine, torch)))
    acc = m.get("accuracy") or {}
    if "cufold" in acc:
        out.append(_target("welford near 1e6 +- 1: variance relative error", "<=", 1e-6, acc["cufold"],
                           "torch's sum of squares: %.2g" % acc["torch"] if "torch" in acc else ""))
    return out


def format_results(results):
    m = results["meta"]
    head = [ln for ln in R.format_header(results).splitlines() if not ln.startswith(("us:", "GB/s ="))]
    lines = head + ["E = %s values into N = %s keys (power law), int64 keys; us = CUDA-event median; "
                    "x = the task's first row us / us" % ("{:,}".format(m["e"]), "{:,}".format(m["n"]))]
    recs = results["records"]
    w = max([len(r["label"]) for r in recs] + [20])
    for order in m["orders"]:
        lines += ["", "== %s keys" % order]
        for task in TASKS:
            rs = [r for r in recs if r["case"] == order
                  and (r["task"] == task or (task == "argmax" and r["task"] == "max"))]
            if not rs:
                continue
            lines.append("  -- %s" % task)
            lines += R.task_rows(rs, w)
    t = R.format_targets(evaluate(results), "bykey-tuple")
    if t:
        lines += ["", t]
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(prog="python -m cufold bench bykey-tuple",
                                description="Tuple values by key (argmax, count + sums, Welford) vs PyG and torch.")
    p.add_argument("--values", type=int, default=E_DEFAULT, help="E, values (default 2^22)")
    p.add_argument("--keys", type=int, default=N_DEFAULT, help="N, keys (default 200000)")
    p.add_argument("--orders", default=",".join(ORDERS), help="comma list of %s" % ", ".join(ORDERS))
    p.add_argument("--tasks", default=",".join(TASKS), help="comma list of %s" % ", ".join(TASKS))
    return add_run_options(p, "bykey-tuple", full="the same as the default (the issue's shapes)")


def main(argv=None, stdout=None, stderr=None):
    """``python -m cufold bench bykey-tuple ...``; the exit status (1 on a mismatch; 2 usage/no GPU)."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    orders = [o for o in args.orders.split(",") if o]
    tasks = [t for t in args.tasks.split(",") if t]
    if not orders or not tasks or any(o not in ORDERS for o in orders) or any(t not in TASKS for t in tasks) \
            or args.values < 1 or args.keys < 1:
        err.write("cufold bench bykey-tuple: bad --orders (%s), --tasks (%s), --values or --keys\n"
                  % (", ".join(ORDERS), ", ".join(TASKS)))
        return 2
    settings = Settings.quick() if args.quick else Settings.short()
    apply_run_options(settings, args)
    from . import backends
    env = backends.probe()
    cands = [c for c in candidates() if c.task in tasks or (c.task == "max" and "argmax" in tasks)]
    if args.dry_run:
        out.write("cufold bench bykey-tuple: plan (dry run)\n")
        out.write("libraries:\n" + "\n".join(env.summary_lines()) + "\n")
        out.write("E = %d values, N = %d keys; orders: %s; tasks: %s\n" % (args.values, args.keys, ", ".join(orders),
                                                                          ", ".join(tasks)))
        for c in cands:
            state = env.plan_note(c.lib)
            out.write("  %-7s %-8s %-55s %s\n" % (c.role, c.task, c.label, state))
        from . import format_estimate
        out.write(format_estimate(estimate_seconds(settings, len(orders) * len(cands), 0, [c.lib for c in cands],
                                                   len(orders) * args.values * 40)))
        return 0
    return run_and_save(
        "bykey-tuple", env, args, argv, out, err, "E=%d, N=%d" % (args.values, args.keys),
        lambda backend, info: run(env, backend, orders, tasks, args.values, args.keys, settings,
                                  progress=not args.no_progress, log=err, device_info=info),
        format_results, lambda r: r["status"] == "mismatch")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
