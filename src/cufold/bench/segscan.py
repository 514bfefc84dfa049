"""Bench suite ``segscan``: segmented scans (issue #19, item 3).

Cases (float32 values on the 1/256 grid, the suite's sizes ``n`` = 2^20 .. 2^26 values):

* ``segscan/short``: ``cufold.segmented_scan(values, offsets)`` (inclusive sum)
  over segments of 0..31 values (mean 15.5: about ``n / 15.5`` int64 offsets,
  empty segments included);
* ``segscan/long``: the same over segments of 1 .. 2^17 values (mean 64 Ki);
* ``scan_by_key/short`` and ``scan_by_key/long``: ``cufold.inclusive_scan_by_key(keys,
  values)`` with int32 keys, one run per segment of the same layouts.

Peers (same run, same inputs), the formulations a torch user writes:

* segments: ``c = torch.cumsum(v)``, then ``c`` minus the prefix in front of each
  segment's start (``cat([0], c)[offsets[:-1]]``) spread over the segment by
  ``repeat_interleave(..., output_size=n)`` (no host synchronisation);
* by key: the same after ``torch.unique_consecutive(keys, return_counts=True)``
  (which synchronises: its result's size depends on the data), and a
  synchronisation-free one: each item's run start by ``torch.cummax`` over the
  head positions, then ``c - cat([0], c)[start]``.

Bytes moved per value (the floor is these bytes at the copy bandwidth measured
at the start of the run, ``copy ceiling`` in the header; ``GB/s`` / copy GB/s is
the fraction of the floor): values read and results written (8), plus the
offsets (8 bytes per segment: 8 / 15.5 for short segments) or the keys (4).

Checks: cufold against a float64 NumPy reference (per-segment sums of grid values:
exact up to float32 rounding); the torch formulations to their own precision
(a float32 cumsum over the whole array, then differences: errors grow with the
running total).

Targets (proposed with the suite, issue #19 sets none for segmented scans): at
2^26, cufold at least 2x the torch formulation and at least 75% of the copy
floor, for every case.
"""

from __future__ import annotations

import numpy as np

from .backends import Skip


class _Suites:
    """``suites``, imported on first use (it imports this module to register the suite)."""

    def __getattr__(self, name):
        from . import suites
        return getattr(suites, name)


S = _Suites()

__all__ = ["LAYOUTS", "SEGSCAN_DOC", "SEGSCAN_TARGETS", "layout", "segscan_cases"]

#: Segment lengths: uniform in [lo, hi).
LAYOUTS = {"short": (0, 32), "long": (1, 1 << 17)}
MEAN = {name: (lo + hi - 1) / 2 for name, (lo, hi) in LAYOUTS.items()}

SEGSCAN_DOC = ("segmented_scan / inclusive_scan_by_key f32 over short (0..31) and long (~64Ki) segments "
               "vs torch cumsum formulations (2^20..2^26)")

SEGSCAN_TARGETS = []
for _case in ("segscan/short", "segscan/long", "scan_by_key/short", "scan_by_key/long"):
    _label = "cufold.segmented_scan" if _case.startswith("segscan") else "cufold.inclusive_scan_by_key"
    _peer = "torch cumsum - start prefix" if _case.startswith("segscan") else "torch unique_consecutive + cumsum"
    SEGSCAN_TARGETS += [
        {"name": "%s @2^26 vs %s" % (_case, _peer), "kind": "speedup_vs", "case": _case, "label": _label,
         "peer": _peer, "log2n": 26, "cmp": ">=", "threshold": 2.0},
        {"name": "%s @2^26 vs copy bandwidth (floor)" % _case, "kind": "copy_frac", "case": _case,
         "label": _label, "log2n": 26, "cmp": ">=", "threshold": 0.75},
    ]


# --- layouts: host offsets, keys and the reference ------------------------------------------------

_LAYOUT_CACHE = {}


def layout(name, n, seed=19):
    """``(offsets int64, keys int32)`` of ``n`` values cut into segments of ``name``'s lengths."""
    key = (name, n)
    got = _LAYOUT_CACHE.get(key)
    if got is None:
        if len(_LAYOUT_CACHE) > 4:
            _LAYOUT_CACHE.clear()
        lo, hi = LAYOUTS[name]
        rng = np.random.default_rng([seed, n, lo, hi])
        lens = rng.integers(lo, hi, size=int(n / MEAN[name] * 1.2) + 16)
        ends = np.cumsum(lens)
        cut = int(np.searchsorted(ends, n))            # the first segment reaching n ends there
        lens = lens[:cut + 1].copy()
        lens[-1] -= int(ends[cut]) - n
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        keys = (np.repeat(np.arange(lens.size, dtype=np.int64), lens) % 1000003).astype(np.int32)
        got = _LAYOUT_CACHE[key] = (offsets, keys)
    return got


_REF_CACHE = {}


def reference(host_x, offsets):
    """Per-segment inclusive sums in float64 (exact for grid values) and the running
    total's magnitude (what a whole-array float32 cumsum rounds against)."""
    key = (id(host_x), host_x.size, offsets.size)
    got = _REF_CACHE.get(key)
    if got is None:
        _REF_CACHE.clear()
        c = np.cumsum(host_x, dtype=np.float64)
        cz = np.concatenate([[0.0], c])
        lens = np.diff(offsets)
        ref = c - np.repeat(cz[offsets[:-1]], lens)
        got = _REF_CACHE[key] = (ref, float(np.max(np.abs(c))) if c.size else 0.0)
    return got


def _check(rel, by_total):
    """A check: ``|got - ref| <= rel * (1 + |ref|)``, plus ``rel * max|running total|``
    where the candidate subtracts whole-array prefixes (``by_total``)."""
    def check(got, c):
        name = c.case_layout
        offsets, _ = layout(name, c.n)
        ref, top = reference(c.host_x, offsets)
        ref = c.sampled(ref)
        g = np.asarray(got).reshape(-1).astype(np.float64)
        if g.shape != ref.shape:
            return False, "shape %s, expected %s" % (g.shape, ref.shape)
        tol = rel * (1 + np.abs(ref)) + (rel * 4 * top if by_total else 0.0)
        return S.verdict(np.nonzero(~(np.abs(g - ref) <= tol))[0], g, ref, c)
    return check


def _with_layout(check, name):
    def run(got, c):
        c.case_layout = name
        return check(got, c)
    return run


# --- candidates -----------------------------------------------------------------------------------

def _heads(ctx, name, what, lib):
    """The layout's offsets or keys on the device (one array, shared by the rotation
    buffers), viewed for ``lib``."""
    cache = ctx.inputs.__dict__.setdefault("_segscan", {})
    if (name, what) not in cache:
        offsets, keys = layout(name, ctx.n)
        cache[(name, what)] = ctx.backend.upload(offsets if what == "offsets" else keys)
    return ctx.backend.view(cache[(name, what)], lib)


def _cufold_fn(ctx, fname):
    f = getattr(ctx.env.get("cufold"), fname, None)
    if f is None:
        raise Skip("cufold.%s missing" % fname)
    return f


def cf_scan(name, fname, what):
    """``cufold.<fname>`` on the layout's ``what``: ``f(values, offsets)`` or ``f(keys, values)``."""
    def make(ctx):
        f = _cufold_fn(ctx, fname)
        heads = _heads(ctx, name, what, "cufold")
        call = (lambda v: f(v, heads)) if what == "offsets" else (lambda v: f(heads, v))
        return S.Prepared(call, ctx.views("cufold"))
    return make


def _minus_start_prefix(torch, v, zero, starts, lengths, n):
    """``cumsum(v)`` less the prefix in front of each segment's start, spread over the
    segment by ``repeat_interleave``: torch's segmented scan of ``lengths`` segments
    (``zero``: a one-element zero made once, outside the timed call)."""
    c = torch.cumsum(v, 0)
    base = torch.cat([zero, c])[starts]
    return c - torch.repeat_interleave(base, lengths, output_size=n)


def torch_segmented(name):
    """cumsum, minus the prefix in front of each segment's start (offsets given)."""
    def make(ctx):
        torch = ctx.mod("torch")
        off = _heads(ctx, name, "offsets", "torch")
        n = ctx.n
        zero = torch.zeros(1, dtype=torch.float32, device=off.device)
        return S.Prepared(lambda v: _minus_start_prefix(torch, v, zero, off[:-1], off.diff(), n), ctx.views("torch"))
    return make


def torch_unique_consecutive(name):
    """The run lengths by torch.unique_consecutive (a synchronisation), then as above."""
    def make(ctx):
        torch = ctx.mod("torch")
        keys = _heads(ctx, name, "keys", "torch")
        n = ctx.n
        zero = torch.zeros(1, dtype=torch.float32, device=keys.device)

        def call(v):
            _, counts = torch.unique_consecutive(keys, return_counts=True)
            return _minus_start_prefix(torch, v, zero, torch.cumsum(counts, 0) - counts, counts, n)
        return S.Prepared(call, ctx.views("torch"))
    return make


def torch_cummax(name):
    """No synchronisation: each item's run start by cummax over the head positions."""
    def make(ctx):
        torch = ctx.mod("torch")
        keys = _heads(ctx, name, "keys", "torch")
        idx = torch.arange(ctx.n, device=keys.device)
        zero = torch.zeros(1, dtype=torch.float32, device=keys.device)
        first = torch.ones(1, dtype=torch.bool, device=keys.device)

        def call(v):
            head = torch.cat([first, keys[1:] != keys[:-1]])
            start = torch.cummax(torch.where(head, idx, 0), 0).values
            c = torch.cumsum(v, 0)
            return c - torch.cat([zero, c])[start]
        return S.Prepared(call, ctx.views("torch"))
    return make


def segscan_cases(env, dtypes):
    """The four cases (float32 in ``dtypes``)."""
    if "float32" not in dtypes:
        return []
    exact = _check(1e-6, False)
    loose = _check(2.0 ** -22, True)
    cases = []
    for name in LAYOUTS:
        mean = MEAN[name]
        cands = [
            S.Candidate("cufold.segmented_scan", "cufold", "cufold", cf_scan(name, "segmented_scan", "offsets"),
                        check=_with_layout(exact, name), requires="segmented_scan"),
            S.Candidate("torch cumsum - start prefix", "torch", "peer", torch_segmented(name),
                        check=_with_layout(loose, name)),
        ]
        cases.append(S.Case("segscan/%s" % name, "segscan", "segmented_scan (+) float32, %s segments (mean %.1f)"
                            % (name, mean), "float32", "grid", 8 + 8 / mean, "sum", exact, cands, sampled=True))
        cands = [
            S.Candidate("cufold.inclusive_scan_by_key", "cufold", "cufold",
                        cf_scan(name, "inclusive_scan_by_key", "keys"), check=_with_layout(exact, name),
                        requires="inclusive_scan_by_key"),
            S.Candidate("torch unique_consecutive + cumsum", "torch", "peer", torch_unique_consecutive(name),
                        check=_with_layout(loose, name)),
            S.Candidate("torch cummax starts + cumsum", "torch", "peer", torch_cummax(name),
                        check=_with_layout(loose, name)),
        ]
        cases.append(S.Case("scan_by_key/%s" % name, "scan_by_key", "inclusive_scan_by_key (+) float32, int32 "
                            "keys, %s runs (mean %.1f)" % (name, mean), "float32", "grid", 12, "sum", exact, cands,
                            sampled=True))
    return cases
