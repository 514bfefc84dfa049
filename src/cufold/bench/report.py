"""Tables, ratios, targets, JSON and plots from a results dict.

Results dict (what :func:`~.runner.run_suite` returns and ``results.json`` holds)::

    {"meta":    {suite, date, device{name, cc, l2_bytes, ...}, versions, copy_GBps, settings, ...},
     "cases":   [{id, title, dtype, bytes_per_elem, peers_from, labels, roles{label: cufold|peer|ceiling}}],
     "records": [{case, label, lib, role, log2n, n, bytes, status (ok|mismatch|error|skipped), note,
                  gpu_us, call_us, GBps, reps, buffers, gpu{median,min,...}, samples_us, ...}],
     "targets": [{name, kind, case, label, peer, log2n | range, cmp, threshold}]}

**Which time a ratio uses.** ``t`` = ``call_us`` (host wall clock per call of
back-to-back calls, i.e. what a Python caller pays) for sizes up to
``2**settings.call_max_log2`` (2^20) when measured, else ``gpu_us`` (CUDA-event
median). Ratio ``x = t(best peer) / t(cufold)``: **> 1 means cufold is
faster**; for equal bytes moved it equals cufold GB/s / peer GB/s. GB/s
always come from ``gpu_us``: bytes moved / GPU time (input read, plus output
written for scans and copies).

Everything here is pure Python and NumPy-free except the plot (matplotlib,
Agg backend, imported on use).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re

__all__ = ["time_of", "best_peer", "ratio", "format_table", "evaluate_targets", "format_targets",
           "write_json", "make_out_dir", "save_results", "load_json", "plot_bandwidth", "plot_calls", "default_out_dir", "slug",
           "format_header"]


# --- lookups --------------------------------------------------------------------
def _index(results):
    idx = results.get("_index")
    if idx is None or idx[0] is not results["records"] or idx[1] != len(results["records"]):
        table = {}
        for r in results["records"]:
            table[(r["case"], r["label"], r["log2n"])] = r
        idx = (results["records"], len(results["records"]), table)
        results["_index"] = idx
    return idx[2]


def _rec(results, case, label, log2n):
    return _index(results).get((case, label, log2n))


def _ok(r):
    return r is not None and r.get("status") == "ok" and r.get("gpu_us") is not None


def _call_max(results):
    return int(results.get("meta", {}).get("settings", {}).get("call_max_log2", 20))


def time_of(rec, call_max_log2=20):
    """(µs, basis): ``call_us`` for n <= 2^call_max_log2 when measured, else ``gpu_us``."""
    if not _ok(rec):
        return None, None
    if rec["log2n"] <= call_max_log2 and rec.get("call_us") is not None:
        return rec["call_us"], "call"
    return rec["gpu_us"], "gpu"


def _case(results, case_id):
    for c in results["cases"]:
        if c["id"] == case_id:
            return c
    return None


def best_peer(results, case_id, log2n, basis="auto"):
    """(label, µs) of the fastest ok peer at ``log2n`` (from ``peers_from`` for
    algorithm cases); ``basis``: auto (as :func:`time_of`), gpu or call."""
    c = _case(results, case_id)
    src = (c or {}).get("peers_from") or case_id
    sc = _case(results, src)
    if sc is None:
        return None, None
    cm = _call_max(results)
    best = (None, None)
    for label in sc["labels"]:
        if sc["roles"].get(label) != "peer":
            continue
        r = _rec(results, src, label, log2n)
        if not _ok(r):
            continue
        if basis == "gpu":
            t = r["gpu_us"]
        elif basis == "call":
            t = r.get("call_us")
        else:
            t = time_of(r, cm)[0]
        if t is not None and (best[1] is None or t < best[1]):
            best = (label, t)
    return best


def ratio(results, case_id, label, log2n):
    """t(best peer) / t(cufold label) at log2n (> 1: cufold faster), or None."""
    r = _rec(results, case_id, label, log2n)
    t, _ = time_of(r, _call_max(results))
    _, tb = best_peer(results, case_id, log2n)
    if t is None or tb is None or t <= 0:
        return None
    return tb / t


# --- table --------------------------------------------------------------------------
def _fmt_us(t):
    if t is None:
        return "-"
    if t < 10:
        return "%.2f" % t
    if t < 1000:
        return "%.1f" % t
    return "%.0f" % t


def _fmt_gbps(g):
    if g is None:
        return "-"
    return "%.1f" % g if g < 100 else "%.0f" % g


def _fmt_x(x):
    return "-" if x is None else "%.2f" % x


_STATUS = {"mismatch": "MISMATCH", "error": "ERROR", "skipped": "skip"}


def human_bytes(b):
    if b is None:
        return "?"
    b = float(b)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if b < 1024 or unit == "TiB":
            return ("%d %s" % (b, unit)) if unit == "B" else ("%.3g %s" % (b, unit))
        b /= 1024.0


def format_header(results):
    m = results.get("meta", {})
    d = m.get("device") or {}
    lines = ["cufold bench %s -- %s (cc %s, L2 %s%s) -- %s" % (
        m.get("suite", "?"), d.get("name") or "?", d.get("cc") or "?", human_bytes(m.get("l2_bytes")),
        "" if d.get("l2_known", True) else ", assumed", m.get("date", "?"))]
    v = m.get("versions") or {}
    if v:
        lines.append("versions: " + ", ".join("%s %s" % (k, v[k]) for k in sorted(v) if v[k]))
    if m.get("backend"):
        lines.append("arrays: %s (cufold gets %s inputs); clock: %s; all work on the legacy default stream"
                     % (m.get("backend"), m.get("cufold_input"), m.get("clock")))
    cp = m.get("copy") or {}
    if m.get("copy_GBps"):
        lines.append("copy ceiling: %.0f GB/s (%s, %s buffers, read+write bytes / time)" % (
            m["copy_GBps"], cp.get("label", "copy"), human_bytes((cp.get("bytes") or 0) / 2)))
    elif cp:
        lines.append("copy ceiling: not measured (%s: %s)" % (cp.get("status"), cp.get("note")))
    cm = _call_max(results)
    lines.append("us: n <= 2^%d: call_us = host wall clock per call (back-to-back calls + one sync); "
                 "above: gpu_us = CUDA-event median per call" % cm)
    lines.append("GB/s = bytes moved / gpu_us;  x = best peer us / cufold us  (> 1: cufold faster)")
    sk = m.get("skipped_libs") or {}
    for lib in sorted(sk):
        lines.append("skipped: %s" % sk[lib])
    return "\n".join(lines)


def _case_table(results, case):
    cid = case["id"]
    cm = _call_max(results)
    recs = [r for r in results["records"] if r["case"] == cid]
    sizes = sorted({r["log2n"] for r in recs})
    shown, hidden = [], {}
    for label in case["labels"]:
        rs = [r for r in recs if r["label"] == label]
        if rs and all(r["status"] == "skipped" for r in rs):
            hidden[label] = sorted({r["note"] for r in rs})
        elif rs:
            shown.append(label)
    roles = case["roles"]

    cols = []   # (label, [subheaders])
    for label in shown:
        cols.append((label, ["us", "GB/s", "x"] if roles.get(label) == "cufold" else ["us", "GB/s"]))
    sub_w = {"us": 8, "GB/s": 7, "x": 6}

    def cell_width(label, subs):
        return max(len(label), sum(sub_w[s] for s in subs) + len(subs) - 1)

    widths = [cell_width(lab, subs) for lab, subs in cols]
    bp_title = "best peer" + (" (%s)" % case["peers_from"] if case.get("peers_from") else "")
    out = []
    unit = "%d B/elem moved" % case.get("bytes_per_elem", 0)
    out.append("== %s [%s]: %s" % (case.get("title", cid), cid, unit))
    head1 = ["size ", "t   "] + [lab.center(w) for (lab, _), w in zip(cols, widths)] + [bp_title]
    head2 = ["     ", "    "] + [" ".join(s.rjust(sub_w[s]) for s in subs).rjust(w)
                               for (_, subs), w in zip(cols, widths)] + [""]
    if cols:
        out.append(" | ".join(head1).rstrip())
        out.append(" | ".join(head2).rstrip())
    problems = {}
    notes = {}
    for k in (sizes if cols else []):
        row = ["2^%-3d" % k]
        basis = "gpu"
        cells = []
        for (label, subs), w in zip(cols, widths):
            r = _rec(results, cid, label, k)
            if r is None:
                cells.append("".rjust(w))
                continue
            if r["status"] != "ok":
                cells.append(_STATUS.get(r["status"], r["status"]).rjust(w))
                if r["status"] in ("mismatch", "error"):
                    problems.setdefault((label, r["status"], r["note"]), []).append(k)
                elif r["status"] == "skipped":
                    notes.setdefault((label, "skipped: " + r["note"]), []).append(k)
                continue
            t, b = time_of(r, cm)
            if b == "call":
                basis = "call"
            vals = {"us": _fmt_us(t), "GB/s": _fmt_gbps(r.get("GBps")),
                    "x": _fmt_x(ratio(results, cid, label, k))}
            cells.append(" ".join(vals[s].rjust(sub_w[s]) for s in subs).rjust(w))
            if r.get("note"):
                notes.setdefault((label, r["note"]), []).append(k)
        bl, bt = best_peer(results, cid, k)
        row.append("call" if basis == "call" else "gpu ")
        out.append(" | ".join(row + cells + [("%s" % bl) if bl else "-"]).rstrip())
    for label, why in hidden.items():
        out.append("  not run: %s: %s" % (label, "; ".join(why)))
    for (label, status, note), ks in problems.items():
        out.append("  !! %s %s at %s: %s" % (label, status.upper(), _sizes(ks), note))
    for (label, note), ks in notes.items():
        out.append("  note: %s at %s: %s" % (label, _sizes(ks), note))
    rot = sorted({(r["log2n"], r.get("rotation")) for r in recs if r.get("rotation")})
    if rot:
        out.append("  L2-resident sizes (buffer rotation capped): %s" % _sizes([k for k, _ in rot]))
    return "\n".join(out)


def _sizes(ks):
    ks = sorted(set(ks))
    if len(ks) > 2 and ks == list(range(ks[0], ks[-1] + 1)):
        return "2^%d..2^%d" % (ks[0], ks[-1])
    return ",".join("2^%d" % k for k in ks)


def format_table(results):
    """The whole report (header + one block per case), as text."""
    parts = [format_header(results)]
    for case in results["cases"]:
        parts.append(_case_table(results, case))
    return "\n\n".join(parts)


# --- targets ------------------------------------------------------------------------
def _cmp(value, cmp, threshold):
    return value >= threshold if cmp == ">=" else value <= threshold


def _why_missing(results, case, label, log2n):
    r = _rec(results, case, label, log2n)
    if r is None:
        sizes = {x["log2n"] for x in results["records"] if x["case"] == case}
        if sizes and log2n not in sizes:
            return "2^%d not measured" % log2n
        return "%s not measured" % label
    if r["status"] != "ok":
        return "%s %s: %s" % (label, r["status"], r.get("note", ""))
    return "%s: no time" % label


def evaluate_targets(results, targets=None):
    """[{name, status (PASS|MISS|n/a), value, cmp, threshold, detail}]."""
    out = []
    for tg in (results.get("targets") if targets is None else targets) or []:
        e = {"name": tg["name"], "cmp": tg["cmp"], "threshold": tg["threshold"], "value": None,
             "status": "n/a", "detail": "", "kind": tg["kind"]}
        try:
            _evaluate(results, tg, e)
        except Exception as ex:  # never let a report die on a target
            e["detail"] = "could not evaluate: %s: %s" % (type(ex).__name__, ex)
        if e["value"] is not None:
            e["status"] = "PASS" if _cmp(e["value"], tg["cmp"], tg["threshold"]) else "MISS"
        out.append(e)
    return out


def _evaluate(results, tg, e):
    kind, case, label = tg["kind"], tg["case"], tg["label"]
    if kind in ("speedup_best", "time_best", "speedup_vs", "copy_frac"):
        k = tg["log2n"]
        r = _rec(results, case, label, k)
        if not _ok(r):
            e["detail"] = _why_missing(results, case, label, k)
            return
        if kind in ("speedup_best", "time_best"):
            bl, bt = best_peer(results, case, k, basis="gpu")
            if bl is None:
                e["detail"] = "no peer measured at 2^%d" % k
                return
            if kind == "speedup_best":
                e["value"] = bt / r["gpu_us"]
                e["detail"] = "%s %s GB/s vs %s %s GB/s" % (
                    label, _fmt_gbps(r.get("GBps")), bl, _fmt_gbps(_rec(results, case, bl, k).get("GBps")))
            else:
                e["value"] = r["gpu_us"] / bt
                e["detail"] = "%s %s us vs %s %s us" % (label, _fmt_us(r["gpu_us"]), bl, _fmt_us(bt))
        elif kind == "speedup_vs":
            p = _rec(results, case, tg["peer"], k)
            if not _ok(p):
                e["detail"] = _why_missing(results, case, tg["peer"], k)
                return
            e["value"] = p["gpu_us"] / r["gpu_us"]
            e["detail"] = "%s %s us vs %s %s us" % (
                label, _fmt_us(r["gpu_us"]), tg["peer"], _fmt_us(p["gpu_us"]))
        else:  # copy_frac
            copy_label, copy_bw = None, None
            c = _case(results, case) or {}
            for lab in c.get("labels", []):
                if c["roles"].get(lab) == "ceiling":
                    cr = _rec(results, case, lab, k)
                    if _ok(cr) and cr.get("GBps"):
                        copy_label, copy_bw = "%s at 2^%d" % (lab, k), cr["GBps"]
            if copy_bw is None:
                copy_bw = results.get("meta", {}).get("copy_GBps")
                copy_label = "copy ceiling"
            if not copy_bw or not r.get("GBps"):
                e["detail"] = "no copy bandwidth measured"
                return
            e["value"] = r["GBps"] / copy_bw
            e["detail"] = "%s %s GB/s = %.1f%% of %s %s GB/s" % (
                label, _fmt_gbps(r["GBps"]), 100 * e["value"], copy_label, _fmt_gbps(copy_bw))
    elif kind == "call_vs":
        lo, hi = tg["range"]
        ratios = []
        missing = []
        for k in range(lo, hi + 1):
            c = _rec(results, case, label, k)
            p = _rec(results, case, tg["peer"], k)
            if c is None and p is None:
                continue
            if _ok(c) and _ok(p) and c.get("call_us") and p.get("call_us"):
                ratios.append((c["call_us"] / p["call_us"], k, c["call_us"], p["call_us"]))
            else:
                missing.append(k)
        if not ratios:
            e["detail"] = ("no per-call times in 2^%d..2^%d: " % (lo, hi)) + (
                _why_missing(results, case, label, missing[0] if missing else lo)
                if missing else "sizes not measured")
            return
        worst = max(ratios)
        gm = math.exp(sum(math.log(x[0]) for x in ratios) / len(ratios))
        e["value"] = worst[0]
        e["detail"] = "worst at 2^%d: %s us vs %s %s us; geomean %.2f over %d sizes%s" % (
            worst[1], _fmt_us(worst[2]), tg["peer"], _fmt_us(worst[3]), gm, len(ratios),
            ("; not measured at %s" % _sizes(missing)) if missing else "")
    else:
        e["detail"] = "unknown target kind %r" % kind


def format_targets(evals, suite=""):
    if not evals:
        return ""
    lines = ["targets%s:" % (" (%s)" % suite if suite else "")]
    w = max(len(e["name"]) for e in evals)
    for e in evals:
        if e["value"] is None:
            lines.append("  %-4s  %-*s  %s" % (e["status"], w, e["name"], e["detail"]))
            continue
        if e["kind"] == "copy_frac":
            val = "%5.1f%% %s %.0f%%" % (100 * e["value"], e["cmp"], 100 * e["threshold"])
        else:
            val = "%5.2f %s %.2f" % (e["value"], e["cmp"], e["threshold"])
        lines.append("  %-4s  %-*s  %s   %s" % (e["status"], w, e["name"], val, e["detail"]))
    return "\n".join(lines)


def task_rows(rs, width, gbps=None):
    """The lines of one task's records in a by-key suite's table: label, us (or the status),
    GB/s (``gbps(record)``, where given), x = us / the first record's us, note."""
    base = rs[0].get("gpu_us") if rs[0]["status"] == "ok" else None
    lines = []
    for r in rs:
        if r["status"] != "ok":
            blank = ("", "") if gbps else ("",)
            lines.append(("  %-*s %9s" + " %7s" * len(blank) + "  %s")
                         % ((width, r["label"], _STATUS.get(r["status"], r["status"])) + blank + (r.get("note", ""),)))
            continue
        x = "%.2f" % (r["gpu_us"] / base) if base else "-"
        if gbps:
            lines.append("  %-*s %9s %7.0f %7s  %s" % (width, r["label"], _fmt_us(r["gpu_us"]), gbps(r), x,
                                                       r.get("note", "")))
        else:
            lines.append("  %-*s %9s %7s  %s" % (width, r["label"], _fmt_us(r["gpu_us"]), x, r.get("note", "")))
    return lines


def gpu_us(row, label):
    """The GPU time (us) of ``row[label]`` where it ran ok, else None (the suites whose
    records hold one entry per library)."""
    r = row.get(label)
    return r.get("gpu_us") if r and r.get("status") == "ok" else None


def case_target(name, items, threshold, better):
    """One target over cases: ``items`` ``(value, case)`` (None: not measured), each to be
    ``better(value, threshold)``; ``{name, status, cases, misses, worst, missed}``."""
    vals = [(v, w) for v, w in items if v is not None]
    misses = [(v, w) for v, w in vals if not better(v, threshold)]
    worst = (min(vals)[0] if better(2, 1) else max(vals)[0]) if vals else None
    return {"name": name, "status": "PASS" if vals and not misses else ("MISS" if vals else "n/a"),
            "cases": len(vals), "misses": len(misses), "worst": worst,
            "missed": ["%s %.2f" % (w, v) for v, w in sorted(misses)[:8]]}


def us_cell(t):
    """A 9-wide table cell of a time in us (``-``: none)."""
    return "%9.1f" % t if t else "%9s" % "-"


def ratio_cell(a, b, width):
    """A table cell of ``a / b`` (``-`` where either is missing)."""
    return "%*.2f" % (width, a / b) if a and b else "%*s" % (width, "-")


def failure_flags(row, libs):
    """`` [lib: status]`` for each of ``libs`` in ``row`` that did not run ok."""
    return "".join(" [%s: %s]" % (k, row[k]["status"]) for k in libs if k in row and row[k].get("status") != "ok")


def case_target_lines(targets):
    """The lines of :func:`case_target` results."""
    return ["  %-4s %s: %d cases, %d misses, worst %s%s" % (
        t["status"], t["name"], t["cases"], t["misses"], "%.2f" % t["worst"] if t["worst"] else "-",
        ("; missed: " + ", ".join(t["missed"])) if t["missed"] else "") for t in targets]


# --- files ---------------------------------------------------------------------------
def slug(text):
    s = re.sub(r"[^A-Za-z0-9._+-]+", "-", str(text or "unknown-gpu")).strip("-")
    return s or "unknown-gpu"


def default_out_dir(suite, gpu_name, when):
    """``bench/results/<suite>-<gpu-name>-<YYYYmmdd-HHMMSS>`` (relative to the cwd)."""
    return os.path.join("bench", "results", "%s-%s-%s" % (suite, slug(gpu_name), when.strftime("%Y%m%d-%H%M%S")))


def make_out_dir(given, suite, gpu_name):
    """``given`` (``--out``) or :func:`default_out_dir` for now, created."""
    out_dir = given or default_out_dir(suite, gpu_name, datetime.datetime.now())
    os.makedirs(out_dir, exist_ok=True)
    return out_dir


def save_results(results, text, out_dir):
    """A run's files: the table (``text``) as ``table.txt``, ``results`` as ``results.json``."""
    with open(os.path.join(out_dir, "table.txt"), "w") as f:
        f.write(text + "\n")
    write_json(results, os.path.join(out_dir, "results.json"))


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def write_json(results, path):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    clean = {k: v for k, v in results.items() if not k.startswith("_")}
    with open(path, "w") as f:
        json.dump(clean, f, indent=1, default=_jsonable)
        f.write("\n")
    return path


def load_json(path):
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    with open(path) as f:
        return json.load(f)


def _grid(k):
    ncols = 1 if k == 1 else 2
    return (k + ncols - 1) // ncols, ncols


def _style(role):
    if role == "cufold":
        return dict(ls="-", lw=2.0, marker="o", ms=3.5)
    if role == "ceiling":
        return dict(ls=":", lw=1.5, marker=".", ms=3, color="0.45")
    return dict(ls="--", lw=1.2, marker="s", ms=3)


def _series(results, case_id, label, key, max_log2=None):
    pts = []
    for r in results["records"]:
        if r["case"] == case_id and r["label"] == label and _ok(r) and r.get(key) is not None:
            if max_log2 is None or r["log2n"] <= max_log2:
                pts.append((r["log2n"], r[key]))
    pts.sort()
    return [p[0] for p in pts], [p[1] for p in pts]


def _log2_ticks(ax, sizes):
    if not sizes:
        return
    lo, hi = min(sizes), max(sizes)
    step = 1 if hi - lo <= 10 else 2
    ticks = list(range(lo, hi + 1, step))
    ax.set_xticks(ticks)
    ax.set_xticklabels(["$2^{%d}$" % k for k in ticks], fontsize=7)


def plot_bandwidth(results, path):
    """GB/s vs size, one subplot per case, a line per library, copy ceiling."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["cases"]
    if not cases:
        return None
    nrows, ncols = _grid(len(cases))
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.5 * ncols, 4.3 * nrows), squeeze=False)
    copy_bw = results.get("meta", {}).get("copy_GBps")
    for ax, case in zip(axes.flat, cases):
        sizes = {r["log2n"] for r in results["records"] if r["case"] == case["id"]}
        for label in case["labels"]:
            xs, ys = _series(results, case["id"], label, "GBps")
            if xs:
                ax.plot(xs, ys, label=label, **_style(case["roles"].get(label)))
        if case.get("peers_from"):
            xs, ys = [], []
            for k in sorted(sizes):
                bl, bt = best_peer(results, case["id"], k, basis="gpu")
                if bl is not None:
                    xs.append(k)
                    ys.append(_rec(results, case["peers_from"], bl, k)["bytes"] / bt / 1e3)
            if xs:
                ax.plot(xs, ys, color="k", ls="--", lw=1.2, label="best peer (%s)" % case["peers_from"])
        if copy_bw:
            ax.axhline(copy_bw, color="0.3", ls="-.", lw=1, label="copy ceiling %.0f GB/s" % copy_bw)
        bad = [r["log2n"] for r in results["records"]
               if r["case"] == case["id"] and r["status"] in ("mismatch", "error")]
        if bad:
            ax.plot(bad, [0] * len(bad), ls="none", marker="x", color="red", ms=8, label="mismatch / error")
        _log2_ticks(ax, sizes)
        ax.set_title(case.get("title", case["id"]), fontsize=10)
        ax.set_xlabel("elements")
        ax.set_ylabel("GB/s (bytes moved / GPU time)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(cases):]:
        ax.set_visible(False)
    m = results.get("meta", {})
    fig.suptitle("cufold bench %s -- %s -- %s" % (m.get("suite", ""), (m.get("device") or {}).get("name", "?"),
                                                  m.get("date", "")), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_calls(results, path):
    """Per-call µs (host wall clock) vs size for the small sizes; None if none measured."""
    recs = [r for r in results["records"] if _ok(r) and r.get("call_us") is not None]
    if not recs:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = [c for c in results["cases"] if any(r["case"] == c["id"] for r in recs)]
    nrows, ncols = _grid(len(cases))
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.5 * ncols, 4.0 * nrows), squeeze=False)
    for ax, case in zip(axes.flat, cases):
        sizes = set()
        for label in case["labels"]:
            xs, ys = _series(results, case["id"], label, "call_us")
            if xs:
                sizes.update(xs)
                ax.plot(xs, ys, label=label, **_style(case["roles"].get(label)))
        _log2_ticks(ax, sizes)
        ax.set_title(case.get("title", case["id"]) + ": time per call", fontsize=10)
        ax.set_xlabel("elements")
        ax.set_ylabel("us per call (wall clock, back-to-back)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(cases):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
