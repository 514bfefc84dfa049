"""Bench suite ``calls``: what one call of each public device function costs a
Python caller, against its torch equivalent.

The time is the **per-call host time** (``call_us``): the wall clock per call of
back-to-back calls after warm-up, the median of ``call_repeats`` bursts taken in
turns with the row's peer (:func:`~.runner.measure_calls`). The CUDA-event time
is taken briefly too (``gpu_us``: it tells host-bound calls from GPU-bound ones).
Sizes: 2^10..2^20 elements (default 2^10, 2^12, ..., 2^20; ``--full`` each one).

Rows (cufold, then the peer):

* ``sum``, ``argmax``, ``mean_var``, ``inclusive_scan``, ``exclusive_scan`` of 1-D
  float32 against ``torch.sum``, ``torch.argmax``, ``torch.var_mean``,
  ``torch.cumsum`` (``exclusive_scan`` too: torch has no exclusive scan);
* ``sum``, ``argmax``, ``mean_var`` with ``axis=0`` and ``axis=1`` of a 2-D float32
  array (2^5 x 2^5 .. 2^10 x 2^10) against ``torch.sum(dim=)``, ``torch.argmax(dim=)``,
  ``torch.var_mean(dim=)``;
* ``segmented_reduce(values, offsets)`` against ``torch.segment_reduce(values, 'sum',
  offsets=offsets)`` (the ``segmented`` suite's inputs: 2^k segments of 10 values);
* ``reduce_by_key(keys, values)`` against ``torch.unique_consecutive(keys,
  return_counts=True)`` + ``torch.segment_reduce(values, 'sum', lengths=counts)``, and
  ``reduce_by_key_into(keys, values, out, check=False)`` and with its default check
  against ``out.index_add_(0, keys, values)``: sorted int32 keys, 10 items a key (seed
  001's particles per cell, ordered), the ``bykey`` suite's float64 values;
* ``histogram(x, bins=64, range=(0, 1))`` against ``torch.histc(x, 64, 0, 1)`` (the
  ``hist`` suite's uniform [-1, 1) floats: half of them in range) and ``bincount(k,
  minlength=64)`` against ``torch.bincount(k, minlength=64)``.

Every result, cufold's and the peer's, is checked once against NumPy before it
is timed, so a row's columns compute the same thing. Targets: cufold's per-call
time over the peer's, at the worst size, <= 1 (<= 1.5 for ``reduce_by_key_into``
with its default check, which synchronises once to report bad keys).
"""

from __future__ import annotations

import functools

import numpy as np

from .hist import S, _cached
from . import hist as H

__all__ = ["calls_cases", "CALLS_TARGETS", "CALLS_DOC", "CALLS_SETTINGS"]

CALLS_DOC = "per-call host time of every device function vs torch, 2^10..2^20"
#: Settings of every ``calls`` run: the events only tell host-bound calls from GPU-bound
#: ones (a short budget); every size gets per-call loops.
CALLS_SETTINGS = {"target_s": 0.01, "min_reps": 10, "max_reps": 100, "est_reps": 3, "call_max_log2": 20,
                  # host time is noisy on a shared machine: more, longer loops (the median is read)
                  "call_target_s": 0.05, "call_repeats": 9}
BINS = 64
SPAN = (0.0, 1.0)
ITEMS_PER_KEY = 10
#: cufold per call / peer per call allowed (default 1.0)
THRESHOLDS = {"cufold.reduce_by_key_into": 1.5}


# --- checks ----------------------------------------------------------------------------------

def check_exclusive_scan(got, c):
    """The inclusive reference shifted by one, zero first."""
    inclusive = c.ref["scan"]
    exclusive = np.concatenate((np.zeros(1, inclusive.dtype), inclusive[:-1]))
    return S.check_scan(got, S.CheckCtx({"scan": exclusive}, c.host_x, c.idx, c.n, c.dtype))


def along(check, ref_kind, axis):
    """``check`` (of a 1-D case) applied to the result for every row (``axis=1``)
    or column (``axis=0``) of the matrix."""
    where = "row" if axis == 1 else "column"

    def check_lines(got, c):
        x = c.host_x.reshape(S.matrix_shape(c.n))
        lines = x if axis == 1 else x.T
        parts = [np.asarray(p).reshape(-1) for p in (got if isinstance(got, tuple) else (got,))]
        if any(p.size != len(lines) for p in parts):
            return False, "%d results, expected one per %s (%d)" % (parts[0].size, where, len(lines))
        notes = set()
        for i, line in enumerate(lines):
            line = np.ascontiguousarray(line)
            one = tuple(p[i] for p in parts) if isinstance(got, tuple) else parts[0][i]
            ok, note = check(one, S.CheckCtx(S.reference(ref_kind, line), line, None, line.size, c.dtype))
            if not ok:
                return False, "%s %d: %s" % (where, i, note)
            if note:
                notes.add(note)
        return True, "; ".join(sorted(notes)[:2])
    return check_lines


@functools.lru_cache(maxsize=2)
def _bykey_host(n):
    """Sorted int64 keys, ITEMS_PER_KEY items a key, and the bykey suite's values."""
    from . import bykey
    return np.arange(n, dtype=np.int64) // ITEMS_PER_KEY, bykey.box_values(n)


def check_into(got, c):
    from . import bykey
    keys, values = _bykey_host(c.n)
    return bykey._check(got, np.bincount(keys, weights=values))


def check_runs(got, c):
    """``(unique keys, totals)`` of the runs."""
    from . import bykey
    if not isinstance(got, tuple) or len(got) != 2:
        return False, "expected (keys, totals), got %r" % (type(got),)
    keys, values = _bykey_host(c.n)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ok, why = bykey._check(got[0], keys[starts].astype(np.float64))
    if not ok:
        return False, "keys: " + why
    return bykey._check(got[1], np.add.reduceat(values, starts))


# --- by-key candidates: the bykey suite's, on one set of device data per size -------------------

def _bykey_ctx(ctx):
    """The bykey suite's Ctx for this size (device copies shared by the row's candidates)."""
    def build():
        from . import bykey
        keys, values = _bykey_host(ctx.n)
        return bykey.Ctx(ctx.env, ctx.backend, "ordered", keys, values, int(keys[-1]) + 1, np.int32)
    return _cached(ctx, "bykey", build)


def _from_bykey(pick):
    """The bykey suite's candidate ``pick(bykey module)`` (a call without arguments)
    as this harness's Prepared."""
    def make(ctx):
        from . import bykey
        p = pick(bykey)(_bykey_ctx(ctx))

        def call(_):
            p.call()

        def result(_):
            p.call()
            return p.result()
        return S.Prepared(call, [None], result)
    return make


def _cf_runs(ctx):
    f = S._cufold_attr(ctx.env, "reduce_by_key")
    b = _bykey_ctx(ctx)
    keys, values = b.device("keys", "cufold"), b.device("values", "cufold")
    return S.Prepared(lambda _: f(keys, values), [None])


def _torch_runs(ctx):
    torch = ctx.mod("torch")
    b = _bykey_ctx(ctx)
    keys, values = b.device("keys", "torch"), b.device("values", "torch")
    unique, segment = torch.unique_consecutive, torch.segment_reduce

    def call(_):
        runs, counts = unique(keys, return_counts=True)
        return runs, segment(values, "sum", lengths=counts)
    return S.Prepared(call, [None])


# --- rows -----------------------------------------------------------------------------------------

def _cf(label, name, make=None, **kw):
    return S.Candidate(label, "cufold", "cufold", make or S.cf_call(name, **kw), requires=name)


def _torch(label, make, **kw):
    return S.Candidate(label, "torch", "peer", make, **kw)


def _row(case_id, title, dist, bytes_per_elem, ref_kind, check, cands, **kw):
    return S.Case(case_id, case_id.split("/")[0], title, "float32", dist, bytes_per_elem, ref_kind, check,
                  cands, **kw)


def _axis_rows(axis):
    dim = {"dim": axis}
    tag = "(axis=%d)" % axis
    return [
        _row("sum/axis=%d" % axis, "sum float32 matrix, axis=%d" % axis, "grid", 4, "sum",
             along(S.check_sum, "sum", axis),
             [_cf("cufold.sum" + tag, "sum", axis=axis),
              _torch("torch.sum(dim=%d)" % axis, S.torch_call("sum", **dim))], matrix=True),
        _row("argmax/axis=%d" % axis, "argmax float32 matrix, axis=%d" % axis, "uniform", 4, "argmax",
             along(S.check_argmax, "argmax", axis),
             [_cf("cufold.argmax" + tag, "argmax", axis=axis),
              _torch("torch.argmax(dim=%d)" % axis, S.torch_call("argmax", **dim))], matrix=True),
        _row("mean_var/axis=%d" % axis, "mean + var float32 matrix, axis=%d" % axis, "uniform", 4, "mean_var",
             along(S.check_mean_var, "mean_var", axis),
             [_cf("cufold.mean_var" + tag, "mean_var", axis=axis),
              _torch("torch.var_mean(dim=%d)" % axis, S.torch_call("var_mean", **dim), canon=S._swap)],
             matrix=True),
    ]


def calls_cases(env, dtypes):
    """The rows (float32 in ``dtypes``); ``env`` is not needed."""
    if "float32" not in dtypes:
        return []
    hist, count = H._check_counts("histogram", "uniform", BINS, True, SPAN), \
        H._check_counts("bincount", "uniform", BINS, True)
    return [
        _row("sum", "sum float32", "grid", 4, "sum", S.check_sum,
             [_cf("cufold.sum", "sum"), _torch("torch.sum", S.torch_call("sum"))]),
        _row("argmax", "argmax float32", "uniform", 4, "argmax", S.check_argmax,
             [_cf("cufold.argmax", "argmax"), _torch("torch.argmax", S.torch_call("argmax"))]),
        _row("mean_var", "mean + var float32", "uniform", 4, "mean_var", S.check_mean_var,
             [_cf("cufold.mean_var", "mean_var"),
              _torch("torch.var_mean", S.torch_call("var_mean"), canon=S._swap)]),
        _row("inclusive_scan", "inclusive scan (+) float32", "grid", 8, "scan", S.check_scan,
             [_cf("cufold.inclusive_scan", "inclusive_scan"), _torch("torch.cumsum", S.torch_cumsum)],
             sampled=True),
        _row("exclusive_scan", "exclusive scan (+) float32 (torch: inclusive)", "grid", 8, "scan",
             check_exclusive_scan,
             [_cf("cufold.exclusive_scan", "exclusive_scan"),
              _torch("torch.cumsum", S.torch_cumsum, check=S.check_scan)], sampled=True),
        *_axis_rows(1),
        *_axis_rows(0),
        _row("segmented_reduce", "segmented sum, 2^k segments x %d float32" % H.SEGMENT_LENGTH, "grid",
             4 * H.SEGMENT_LENGTH + 8 + 4, "sum", H.check_segmented,
             [_cf("cufold.segmented_reduce", "segmented_reduce", H._cf_segmented),
              _torch("torch.segment_reduce", H._torch_segmented)]),
        _row("reduce_by_key", "reduce_by_key, sorted int32 keys x %d, float64" % ITEMS_PER_KEY, "grid", 12,
             "sum", check_runs,
             [_cf("cufold.reduce_by_key", "reduce_by_key", _cf_runs),
              _torch("torch.unique_consecutive+segment_reduce", _torch_runs)]),
        _row("reduce_by_key_into", "reduce_by_key_into, sorted int32 keys x %d, float64" % ITEMS_PER_KEY,
             "grid", 12, "sum", check_into,
             [_cf("cufold.reduce_by_key_into(check=False)", "reduce_by_key_into",
                  _from_bykey(lambda bk: bk._cufold(check=False))),
              _cf("cufold.reduce_by_key_into", "reduce_by_key_into", _from_bykey(lambda bk: bk._cufold(check=True))),
              _torch("torch.index_add_", _from_bykey(lambda bk: bk._index_add))]),
        _row("histogram", "histogram float32, %d bins, range (0, 1)" % BINS, "uniform", 4, "sum", hist,
             [_cf("cufold.histogram", "histogram", H._cf_hist("histogram", "uniform", BINS, span=SPAN)),
              _torch("torch.histc", H._peer_hist("torch", "histogram", "uniform", BINS, SPAN),
                     check=H._check_counts("histogram", "uniform", BINS, False, SPAN))]),
        _row("bincount", "bincount int32, minlength %d" % BINS, "uniform", 4, "sum", count,
             [_cf("cufold.bincount", "bincount", H._cf_hist("bincount", "uniform", BINS)),
              _torch("torch.bincount", H._peer_hist("torch", "bincount", "uniform", BINS))]),
    ]


def _targets():
    """Per row and cufold candidate: cufold's call_us over the peer's, worst size."""
    out = []
    for case in calls_cases(None, ("float32",)):
        peer = next(c.label for c in case.candidates if c.role == "peer")
        for c in case.candidates:
            if c.role == "cufold":
                out.append({"name": "%s per call vs %s" % (c.label, peer), "kind": "call_vs", "case": case.id,
                            "label": c.label, "peer": peer, "range": [10, 20], "cmp": "<=",
                            "threshold": THRESHOLDS.get(c.label, 1.0)})
    return out


CALLS_TARGETS = _targets()
