"""``python -m cufold bench bykey``: seed 001's reduction by key, cufold against the peers.

Seed 001's test: a box of ``side^3`` cells (100 x 100 x 100), ``per_cell`` particles
per cell (10), the cell index ``x + side*(y + side*z)`` as the key, float64 values,
and three key orders:

``ordered``  sorted by cell (90% of neighbours share a key);
``shifted``  ordered, then each coordinate moved to the next cell (periodically)
             with probability 1/2 (12% of neighbours share a key, but keys stay local);
``random``   a random permutation of the ordered keys.

Every candidate does ``out[key] += value`` for the 10^7 pairs into a zeroed float64
``out`` of ``side^3`` elements:

* cufold: ``reduce_by_key_into`` automatic (``check=False``: no synchronisation, as
  the peers), the same with ``check=True`` (one stream synchronisation to report bad
  keys), with ``deterministic=True`` (a stable radix sort by key, then one update per
  key: the same bits every run), and every ``algorithm=`` of
  ``cufold.device.bykey.ALGORITHMS``;
* peers: ``torch.Tensor.index_add_`` (also under ``torch.use_deterministic_algorithms``:
  the peer of ``deterministic=True``), ``torch.Tensor.scatter_reduce_(reduce='sum')``
  (needs int64 keys: it gets its own int64 copy), ``cupyx.scatter_add`` and, for
  sorted keys only, ``torch.segment_reduce`` (given the run lengths, computed outside
  the timing, and writing a new array rather than accumulating into ``out``: both in
  its favour).

Times are CUDA-event medians (the suite harness's clock, rotation-free: the 120 MB
read per call is more than twice the L2). Every result is first checked against
``numpy.bincount`` (values are multiples of 1/256, so every order of summation is
exact). Targets: ordered and shifted >= 2x the best peer, random >= 1x.

Examples::

    python -m cufold bench bykey
    python -m cufold bench bykey --quick --orders random
    python -m cufold bench bykey --side 50 --only cufold,cupyx --key-dtype int64
    python -m cufold bench bykey --dry-run
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
from .runner import time_events
from .timing import Settings, estimate_seconds

__all__ = ["ORDERS", "TARGETS", "box_keys", "box_values", "candidates", "measure", "format_results",
           "evaluate", "estimate", "main", "build_parser"]

ORDERS = ("ordered", "shifted", "random")
#: speedup of cufold's automatic choice over the best peer, per order.
TARGETS = {"ordered": 2.0, "shifted": 2.0, "random": 1.0}
AUTO = "cufold.reduce_by_key_into"


# --- data ------------------------------------------------------------------------------------

def box_keys(side=100, per_cell=10, order="ordered", seed=1):
    """Seed 001's keys (int64): ``per_cell`` particles in each of ``side^3`` cells."""
    cells = np.repeat(np.arange(side ** 3, dtype=np.int64), per_cell)
    rng = np.random.default_rng(seed)
    if order == "ordered":
        return cells
    if order == "random":
        return rng.permutation(cells)
    if order == "shifted":
        x, y, z = cells % side, (cells // side) % side, cells // (side * side)
        n = cells.size
        x = (x + rng.integers(0, 2, n)) % side
        y = (y + rng.integers(0, 2, n)) % side
        z = (z + rng.integers(0, 2, n)) % side
        return x + side * (y + side * z)
    raise ValueError("cufold bench bykey: unknown order %r (%s)" % (order, ", ".join(ORDERS)))


def box_values(n, seed=2):
    """float64 multiples of 1/256 in [-1, 1]: every sum of them is exact."""
    k = np.random.default_rng(seed).integers(-256, 256, size=n, endpoint=True)
    return k.astype(np.float64) / 256


def equal_neighbours(keys):
    return float(np.mean(keys[1:] == keys[:-1])) if keys.size > 1 else 0.0


# --- candidates ---------------------------------------------------------------------------------

Cand = collections.namedtuple("Cand", "label lib role make")
Prepared = collections.namedtuple("Prepared", "call result note")


class Ctx:
    """What ``Cand.make`` sees: the order's host data and the backend."""

    def __init__(self, env, backend, order, keys, values, m, key_dtype):
        self.env, self.backend, self.order = env, backend, order
        self.keys, self.values, self.m, self.key_dtype = keys, values, m, np.dtype(key_dtype)
        self._copies = SharedCopies(backend)

    def mod(self, lib):
        return self.env.get(lib)

    def device(self, what, lib):
        """Device copies (shared by the candidates): 'keys', 'keys64', 'values', 'lengths'."""
        return self._copies.get(what, lib, lambda: self._host(what))

    def _host(self, what):
        if what == "keys":
            return self.keys.astype(self.key_dtype)
        if what == "keys64":
            return self.keys.astype(np.int64)
        if what == "values":
            return self.values
        if what == "lengths":
            starts = np.flatnonzero(np.r_[True, self.keys[1:] != self.keys[:-1]])
            return np.diff(np.r_[starts, self.keys.size]).astype(np.int64)
        raise ValueError(what)

    def zeros_out(self, lib):
        return self.backend.view(self.backend.upload(np.zeros(self.m, np.float64)), lib) if lib \
            else self.backend.upload(np.zeros(self.m, np.float64))


def _bykey_module(env):
    env.get("cufold")
    import importlib
    try:
        return importlib.import_module("cufold.device.bykey")
    except ImportError as e:  # pragma: no cover
        raise Skip("cufold.device.bykey not importable: %s" % e)


def _cufold(algorithm=None, check=False, deterministic=False):
    def make(ctx):
        bk = _bykey_module(ctx.env)
        keys, values = ctx.device("keys", "cufold"), ctx.device("values", "cufold")
        out = ctx.zeros_out("cufold")
        f = bk.reduce_by_key_into

        def call():
            f(keys, values, out, algorithm=algorithm, check=check, deterministic=deterministic)
        return Prepared(call, lambda: out, "")
    return make


def _index_add(ctx):
    ctx.mod("torch")
    keys, values = ctx.device("keys", "torch"), ctx.device("values", "torch")
    out = ctx.zeros_out("torch")

    def call():
        out.index_add_(0, keys, values)
    return Prepared(call, lambda: out, "%s keys" % ctx.key_dtype)


def _index_add_deterministic(ctx):
    torch = ctx.mod("torch")
    keys, values = ctx.device("keys", "torch"), ctx.device("values", "torch")
    out = ctx.zeros_out("torch")
    switch = torch.use_deterministic_algorithms

    def call():
        switch(True)
        try:
            out.index_add_(0, keys, values)
        finally:
            switch(False)
    return Prepared(call, lambda: out, "torch.use_deterministic_algorithms(True): the peer of "
                    "deterministic=True")


def _scatter_reduce(ctx):
    ctx.mod("torch")
    keys, values = ctx.device("keys64", "torch"), ctx.device("values", "torch")
    out = ctx.zeros_out("torch")

    def call():
        out.scatter_reduce_(0, keys, values, reduce="sum")
    return Prepared(call, lambda: out, "int64 keys (required)" if ctx.key_dtype != np.int64 else "")


def _segment_reduce(ctx):
    torch = ctx.mod("torch")
    if np.any(ctx.keys[1:] < ctx.keys[:-1]):
        raise Skip("keys not sorted")
    if np.unique(ctx.keys).size != ctx.m:
        raise Skip("some cell has no particle")  # pragma: no cover - not with seed 001's box
    values, lengths = ctx.device("values", "torch"), ctx.device("lengths", "torch")
    seg = torch.segment_reduce
    box = {}

    def call():
        box["r"] = seg(values, "sum", lengths=lengths)
    return Prepared(call, lambda: box["r"], "run lengths given; writes a new array (no accumulate)")


def _scatter_add(ctx):
    ctx.mod("cupy")
    try:
        import cupyx
    except ImportError as e:
        raise Skip("cupyx not importable: %s" % e)
    keys, values = ctx.device("keys", "cupy"), ctx.device("values", "cupy")
    out = ctx.zeros_out("cupy")
    add = cupyx.scatter_add

    def call():
        add(out, keys, values)
    return Prepared(call, lambda: out, "%s keys" % ctx.key_dtype)


def candidates(algorithms):
    """cufold (auto, auto with check, every algorithm), then the peers."""
    cands = [Cand(AUTO, "cufold", "cufold", _cufold()),
             Cand(AUTO + "(check=True)", "cufold", "cufold", _cufold(check=True)),
             Cand(AUTO + "(deterministic=True)", "cufold", "cufold", _cufold(deterministic=True))]
    cands += [Cand("cufold[%s]" % a, "cufold", "cufold", _cufold(a)) for a in algorithms]
    cands += [Cand("torch.index_add_", "torch", "peer", _index_add),
              Cand("torch.index_add_(deterministic)", "torch", "peer", _index_add_deterministic),
              Cand("torch.scatter_reduce_", "torch", "peer", _scatter_reduce),
              Cand("cupyx.scatter_add", "cupy", "peer", _scatter_add),
              Cand("torch.segment_reduce", "torch", "peer", _segment_reduce)]
    return cands


# --- measuring ------------------------------------------------------------------------------------

def _check(got, ref):
    g = np.asarray(got, dtype=np.float64).reshape(-1)
    if g.shape != ref.shape:
        return False, "shape %s, expected %s" % (g.shape, ref.shape)
    bad = np.flatnonzero(~(np.abs(g - ref) <= 1e-9 * (1 + np.abs(ref))))
    if bad.size:
        k = bad[0]
        return False, "%d of %d wrong; first at %d: got %r, expected %r" % (bad.size, g.size, k, g[k], ref[k])
    return True, ""


def measure(cand, ctx, ref, settings, bytes_moved):
    """One record: make, call once and check, then time (CUDA events)."""
    rec = {"case": ctx.order, "label": cand.label, "lib": cand.lib, "role": cand.role, "n": int(ctx.keys.size),
           "bytes": bytes_moved, "status": "ok", "note": ""}
    backend = ctx.backend
    try:
        prep = cand.make(ctx)
        rec["note"] = prep.note
        prep.call()
        backend.sync()
        got = backend.fetch(prep.result())
        if cand.label == "torch.segment_reduce":
            ref = ref[np.unique(ctx.keys)]
        ok, why = _check(got, ref)
    except Skip as e:
        rec.update(status="skipped", note=str(e))
        return rec
    except Exception as e:
        rec.update(status="error", note="%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:300]
                                                     if str(e).strip() else ""),
                   traceback=traceback.format_exc(limit=6))
        return rec
    if not ok:
        rec.update(status="mismatch", note=why)
        return rec
    try:
        clock = backend.clock
        call = prep.call
        args = [None]

        def fn(_):
            call()
        for _ in range(settings.warmup):
            call()
        backend.sync()
        st = time_events(clock, fn, args, settings, rec)
        if st["median"]:
            rec["GBps"] = bytes_moved / st["median"] / 1e3
    except Exception as e:
        rec.update(status="error", note="while timing: %s: %s" % (type(e).__name__, e),
                   traceback=traceback.format_exc(limit=6))
    return rec


def estimate(orders, cands, n, settings):
    """:func:`~.timing.estimate_seconds` of a run: every candidate on every order, with
    int32 and int64 keys, values and run lengths of ``n`` items an order."""
    return estimate_seconds(settings, len(orders) * len(cands), 0, [c.lib for c in cands],
                            len(orders) * n * (4 + 8 + 8 + 8))


def best_peer(records, order):
    best = (None, None)
    for r in records:
        if r["case"] == order and r["role"] == "peer" and r["status"] == "ok" and r.get("gpu_us"):
            if best[1] is None or r["gpu_us"] < best[1]:
                best = (r["label"], r["gpu_us"])
    return best


def evaluate(results):
    """Targets as :func:`cufold.bench.report.format_targets` prints them."""
    out = []
    recs = results["records"]
    for order in results["meta"]["orders"]:
        thr = TARGETS[order]
        e = {"name": "%s keys: %s vs best peer" % (order, AUTO), "kind": "speedup_best", "cmp": ">=",
             "threshold": thr, "value": None, "status": "n/a", "detail": ""}
        mine = next((r for r in recs if r["case"] == order and r["label"] == AUTO), None)
        bl, bt = best_peer(recs, order)
        if mine is None or mine["status"] != "ok" or not mine.get("gpu_us"):
            e["detail"] = "%s: %s" % (AUTO, "not measured" if mine is None else
                                      "%s %s" % (mine["status"], mine.get("note", "")))
        elif bl is None:
            e["detail"] = "no peer measured"
        else:
            e["value"] = bt / mine["gpu_us"]
            e["status"] = "PASS" if e["value"] >= thr else "MISS"
            e["detail"] = "%.1f us vs %s %.1f us" % (mine["gpu_us"], bl, bt)
        out.append(e)
    return out


_STATUS = {"mismatch": "MISMATCH", "error": "ERROR", "skipped": "skip"}


def format_results(results):
    """The header, one table per order, and the targets."""
    m = results["meta"]
    box = m["box"]
    head = [ln for ln in R.format_header(results).splitlines()
            if not ln.startswith("us:") and not ln.startswith("GB/s =")]
    lines = head + [
        "seed 001 box: %d^3 cells x %d particles = %s float64 values, %s keys (%s per call); "
        "us = CUDA-event median; x = best peer us / us (> 1: faster than the best peer)"
        % (box["side"], box["per_cell"], "{:,}".format(box["n"]), box["key_dtype"],
           R.human_bytes(box["bytes"]))]
    recs = results["records"]
    w = max([len(r["label"]) for r in recs] + [20])
    for order in m["orders"]:
        rs = [r for r in recs if r["case"] == order]
        bl, bt = best_peer(recs, order)
        lines.append("")
        lines.append("== %s keys (%.0f%% of neighbours equal)" % (order, 100 * m["equal_neighbours"][order]))
        lines.append("  %-*s %9s %8s %7s  %s" % (w, "candidate", "us", "GB/s", "x", "note"))
        for r in rs:
            if r["status"] != "ok":
                lines.append("  %-*s %9s %8s %7s  %s" % (w, r["label"], _STATUS.get(r["status"], r["status"]),
                                                         "", "", r.get("note", "")))
                continue
            x = (bt / r["gpu_us"]) if bt else None
            lines.append("  %-*s %9s %8s %7s  %s" % (w, r["label"], R._fmt_us(r["gpu_us"]),
                                                      R._fmt_gbps(r.get("GBps")),
                                                      "-" if x is None else "%.2f" % x, r.get("note", "")))
        lines.append("  best peer: %s" % ("%s (%s us)" % (bl, R._fmt_us(bt)) if bl else "-"))
    t = R.format_targets(evaluate(results), "bykey")
    if t:
        lines += ["", t]
    return "\n".join(lines)


def run(env, backend, orders, side, per_cell, key_dtype, settings, only=None, progress=True, log=None,
        device_info=None, cands=None):
    """Measure every candidate (default :func:`candidates`) on every order; returns the results dict."""
    from .runner import measure_orders, suite_meta
    if cands is None:
        cands = candidates(_bykey_module(env).ALGORITHMS)
    cands = [c for c in cands if not only or any(c.lib == o or c.label.startswith(o) for o in only)]
    started = datetime.datetime.now()
    info = device_info if device_info is not None else backend.device_info()
    m = side ** 3
    n = m * per_cell
    key_dtype = np.dtype(key_dtype)
    bytes_moved = n * (key_dtype.itemsize + 8)
    values = box_values(n, settings.seed)
    neighbours = {}

    def make_ctx(order):
        keys = box_keys(side, per_cell, order, settings.seed)
        neighbours[order] = equal_neighbours(keys)
        ctx = Ctx(env, backend, order, keys, values, m, key_dtype)
        ctx.ref = np.bincount(keys, weights=values, minlength=m)
        return ctx

    records = measure_orders(orders, cands, make_ctx, lambda c, ctx: measure(c, ctx, ctx.ref, settings, bytes_moved),
                             backend, progress, log)
    meta = suite_meta("bykey", env, backend, info, settings, started, orders=list(orders),
                      equal_neighbours=neighbours,
                      box={"side": side, "per_cell": per_cell, "n": n, "m": m, "key_dtype": key_dtype.name,
                           "bytes": bytes_moved})
    results = {"meta": meta, "cases": [], "records": records}
    results["targets_evaluated"] = evaluate(results)
    return results


# --- command line --------------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m cufold bench bykey",
        description="Seed 001's reduction by key (out[key] += value): cufold.reduce_by_key_into against "
                    "torch.index_add_, torch.scatter_reduce_, cupyx.scatter_add, torch.segment_reduce.")
    p.add_argument("--side", type=int, default=100, help="cells per box side (default 100: 10^6 cells)")
    p.add_argument("--per-cell", type=int, default=10, help="particles per cell (default 10)")
    p.add_argument("--orders", default=",".join(ORDERS), help="comma list of %s" % ", ".join(ORDERS))
    p.add_argument("--key-dtype", choices=("int32", "int64"), default="int32",
                   help="keys of cufold, index_add_ and cupyx (scatter_reduce_ always gets int64)")
    p.add_argument("--only", default=None, help="comma list of libraries (cufold, torch, cupy) or label prefixes")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", help="the same as the default (one box, every candidate)")
    mode.add_argument("--quick", action="store_true", help="few reps (a smoke run)")
    p.add_argument("--out", default=None, help="output directory (default bench/results/bykey-<gpu>-<date>)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="print what would run and exit (no GPU needed)")
    p.add_argument("--target-time", type=float, default=None, help="event-timed seconds per candidate")
    p.add_argument("--min-reps", type=int, default=None)
    p.add_argument("--max-reps", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-raw", action="store_true", help="do not keep every event sample in the JSON")
    return p


def _settings(args):
    s = Settings.quick() if args.quick else Settings()
    for attr, val in (("target_s", args.target_time), ("min_reps", args.min_reps),
                      ("max_reps", args.max_reps), ("seed", args.seed)):
        if val is not None:
            setattr(s, attr, val)
    if args.no_raw:
        s.raw = False
    return s


def main(argv=None, stdout=None, stderr=None):
    """``python -m cufold bench bykey ...``; returns the exit status (0; 1 on a mismatch; 2 usage/no GPU)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]
    bad = [o for o in orders if o not in ORDERS]
    if bad or not orders or args.side < 1 or args.per_cell < 1:
        err.write("cufold bench bykey: bad --orders/--side/--per-cell (orders: %s)\n" % ", ".join(ORDERS))
        return 2
    only = [o.strip() for o in args.only.split(",") if o.strip()] if args.only else None
    settings = _settings(args)
    from . import backends
    env = backends.probe()
    if args.dry_run:
        try:
            algs = _bykey_module(env).ALGORITHMS
        except Skip as e:
            algs, why = (), str(e)
        else:
            why = None
        n = args.side ** 3 * args.per_cell
        out.write("cufold bench bykey: plan (dry run)\n")
        out.write("libraries:\n" + "\n".join(env.summary_lines()) + "\n")
        if env.simulator:
            out.write("note: NUMBA_ENABLE_CUDASIM=1 -- a real run needs a GPU\n")
        out.write("box: %d^3 cells x %d = %d float64 values, %s keys; orders: %s\n"
                  % (args.side, args.per_cell, n, args.key_dtype, ", ".join(orders)))
        if why:
            out.write("cufold: %s\n" % why)
        cands = [c for c in candidates(algs) if not only or any(c.lib == o or c.label.startswith(o) for o in only)]
        for c in cands:
            state = env.plan_note(c.lib)
            out.write("  %-7s %-40s %s\n" % (c.role, c.label, state))
        from . import format_estimate
        out.write(format_estimate(estimate(orders, cands, n, settings)))
        out.write("targets:\n" + "".join("  %s keys: %s vs best peer (>= %g)\n" % (o, AUTO, TARGETS[o])
                                         for o in orders))
        return 0
    from . import open_backend
    backend = open_backend(env, err)
    if backend is None:
        return 2
    info = backend.device_info()
    out_dir = R.make_out_dir(args.out, "bykey", info.get("name"))
    err.write("cufold bench bykey on %s: %d^3 cells x %d, orders %s -> %s\n"
              % (info.get("name"), args.side, args.per_cell, ",".join(orders), out_dir))
    results = run(env, backend, orders, args.side, args.per_cell, args.key_dtype, settings, only=only,
                  progress=not args.no_progress, log=err, device_info=info)
    results["meta"]["argv"] = list(argv or [])
    results["meta"]["out_dir"] = out_dir
    text = format_results(results)
    out.write(text + "\n")
    R.save_results(results, text, out_dir)
    err.write("wrote %s: results.json, table.txt\n" % out_dir)
    bad = [r for r in results["records"] if r["status"] == "mismatch"]
    if bad:
        err.write("!! %d result(s) MISMATCHED numpy.bincount (not timed): %s\n"
                  % (len(bad), ", ".join(sorted({"%s %s" % (r["case"], r["label"]) for r in bad}))))
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
