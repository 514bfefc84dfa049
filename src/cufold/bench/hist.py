"""Bench suites ``hist`` (histogram / bincount) and ``segmented`` (segmented reduce).

``hist``: ``cufold.histogram(x, bins, range=(-1, 1))`` on float32 against
``torch.histc`` and ``cupy.histogram``, and ``cufold.bincount(k, minlength=bins)``
on int32 against ``torch.bincount`` and ``cupy.bincount``, for 64, 1024 and
65536 bins, on *uniform* data (the suite's uniform [-1, 1) floats; ``k`` their
bin) and *skewed* data (``u**5``: a quarter of the items in the central 1/1000
of the range, so warps hold many equal bins), and with ``--full`` each cufold
algorithm (``cufold.histogram[shared_match]`` ...; the shared ones skip 65536 bins).
Sizes: the issue's 2^20 and 2^26 (``--full``: 2^10..2^28). No target yet: the
table reports the ratios. cufold must match NumPy exactly; peers are checked loosely
(torch.histc bins by its own float arithmetic, so items within an ulp of an edge may
land in the neighbouring bin).

``segmented``: ``2^k`` segments of 10 float32 values (``2^20``: the issue's
"1M segments of 10 values") summed by ``cufold.segmented_reduce(values,
offsets)`` against ``torch.segment_reduce(values, 'sum', offsets=offsets)``,
CuPy's CSR row sums (``cupyx.scipy.sparse.csr_matrix.sum(axis=1)``: CUB's
merge-based SpMV with CuPy's CUB accelerator) and ``cuda.compute.segmented_reduce``
(CUB's ``DeviceSegmentedReduce``, a block per segment). Bytes moved per
segment: 10 values, one int64 offset, one result (52). Values are on the 1/256
grid, so every sum is exact. Sizes above 2^24 segments are skipped (10 x 2^24
values are 640 MiB; default sizes 2^10, 2^14, 2^18, 2^20, 2^24, ``--full`` every one from
2^10 to 2^24). Target: at 2^20 segments, at least 10x torch.segment_reduce.

Everything is imported on use, ``suites`` included (it imports this module).
"""

from __future__ import annotations

import functools
import importlib

import numpy as np

from .backends import Skip


class _Suites:
    """``suites``, imported on first use (it imports this module to register the suites)."""

    def __getattr__(self, name):
        from . import suites
        return getattr(suites, name)


S = _Suites()

__all__ = ["hist_cases", "segmented_cases", "HIST_TARGETS", "SEGMENTED_TARGETS", "HIST_DOC",
           "SEGMENTED_DOC", "HIST_BINS", "SEGMENT_LENGTH"]

HIST_BINS = (64, 1024, 65536)
DISTS = ("uniform", "skewed")
RANGE = (-1.0, 1.0)   # the histograms' range: the suite's uniform floats
SEGMENT_LENGTH = 10
MAX_SEGMENTS_LOG2 = 24

HIST_DOC = ("histogram f32 / bincount i32, 64/1024/65536 bins, uniform and skewed data, vs torch.histc/"
            "bincount and cupy.histogram/bincount (--full: every cufold algorithm)")
SEGMENTED_DOC = ("segmented sum of 2^k segments x 10 float32 vs torch.segment_reduce, cupyx CSR row sums, "
                 "cuda.compute.segmented_reduce (target at 2^20)")

HIST_TARGETS = []   # none yet: reported only

SEGMENTED_TARGETS = [
    {"name": "segmented_reduce 2^20 segments x 10 f32 vs torch.segment_reduce", "kind": "speedup_vs",
     "case": "segmented/float32", "label": "cufold.segmented_reduce", "peer": "torch.segment_reduce",
     "log2n": 20, "cmp": ">=", "threshold": 10.0},
]


# --- the cufold functions (top-level once exported, else from their device modules) ---------------

def _cufold_fn(env, name, module):
    cf = env.get("cufold")
    f = getattr(cf, name, None)
    if f is None:
        try:
            f = getattr(importlib.import_module("cufold.device." + module), name)
        except (ImportError, AttributeError) as e:
            raise Skip("cufold.%s missing (%s)" % (name, e))
    return f


def _algorithms(module):
    try:
        return tuple(importlib.import_module("cufold.device." + module).ALGORITHMS)
    except Exception:   # pragma: no cover - the module is part of cufold
        return ()


# --- derived inputs: transformed on the host, uploaded once per (inputs, kind) --------------------

def _skew(u):
    return u ** 5     # float32: concentrated around 0


def _host_data(host_x, dist, bins=None):
    """float32 data (``bins`` None) or int32 bins in [0, bins) from the suite's uniform floats."""
    x = host_x if dist == "uniform" else _skew(host_x)
    if bins is None:
        return x
    k = np.floor((x.astype(np.float64) + 1.0) * (bins / 2.0))
    return np.clip(k, 0, bins - 1).astype(np.int32)


def _cached(ctx, key, build):
    """``build()``, once per size's inputs (device data derived from them)."""
    cache = ctx.inputs.__dict__.setdefault("_cufold_derived", {})
    if key not in cache:
        cache[key] = build()
    return cache[key]


def _derived(ctx, dist, bins=None):
    """Device buffers (one per rotation buffer, all of the same data) of the derived
    input, cached on the size's inputs; primaries of the backend's library."""
    def build():
        host = np.ascontiguousarray(_host_data(ctx.inputs.host0, dist, bins))
        return [ctx.backend.upload(host) for _ in range(ctx.inputs.count)]
    return _cached(ctx, (dist, bins), build)


def _views(ctx, prims, kind):
    return [ctx.backend.view(p, kind) for p in prims]


# --- checks ------------------------------------------------------------------------------------------

_REFS = {}


def _reference(host_x, kind, dist, bins, span):
    key = (id(host_x), host_x.size, kind, dist, bins, span)
    ref = _REFS.get(key)
    if ref is None:
        if len(_REFS) > 16:
            _REFS.clear()
        if kind == "histogram":
            ref = np.histogram(_host_data(host_x, dist), bins, range=span)[0]
        else:
            ref = np.bincount(_host_data(host_x, dist, bins), minlength=bins)
        _REFS[key] = ref
    return ref


def _first(got):
    return got[0] if isinstance(got, tuple) else got


def _check_counts(kind, dist, bins, exact, span=RANGE):
    def check(got, c):
        g = np.asarray(_first(got)).reshape(-1)
        ref = _reference(c.host_x, kind, dist, bins, span)
        if g.shape != ref.shape:
            return False, "shape %s, expected %s" % (g.shape, ref.shape)
        diff = np.abs(g.astype(np.float64) - ref)
        if exact:
            bad = np.nonzero(diff)[0]
            if bad.size:
                k = bad[0]
                return False, "%d of %d bins differ; bin %d: %r, expected %r" % (bad.size, g.size, k, g[k],
                                                                                ref[k])
            return True, ""
        if g.sum() != ref.sum() and abs(float(g.sum()) - float(ref.sum())) > 0.001 * c.n + 2:
            return False, "total %r, expected %r" % (g.sum(), ref.sum())
        moved = diff.sum() / 2
        if moved > 0.01 * c.n + 2:
            return False, "%d items in other bins than NumPy's" % moved
        return True, ("%d items in another bin than NumPy's (edge rounding)" % moved) if moved else ""
    return check


# --- histogram / bincount candidates -------------------------------------------------------------------

def _cf_hist(kind, dist, bins, algorithm=None, span=RANGE):
    module = "histogram"

    def make(ctx):
        f = _cufold_fn(ctx.env, kind, module)
        kw = {"algorithm": algorithm} if algorithm else {}
        prims = _derived(ctx, dist, None if kind == "histogram" else bins)
        args = _views(ctx, prims, "cufold")
        if kind == "histogram":
            g = functools.partial(f, bins=bins, range=span, **kw)
        else:
            g = functools.partial(f, minlength=bins, **kw)
        return S.Prepared(g, args)
    return make


def _peer_hist(lib, kind, dist, bins, span=RANGE):
    """torch.histc / torch.bincount or cupy.histogram / cupy.bincount over the same inputs."""
    def make(ctx):
        mod = ctx.mod(lib)
        prims = _derived(ctx, dist, None if kind == "histogram" else bins)
        args = _views(ctx, prims, lib)
        if kind == "bincount":
            g = functools.partial(mod.bincount, minlength=bins)
        elif lib == "torch":
            g = functools.partial(mod.histc, bins=bins, min=span[0], max=span[1])
        else:
            g = functools.partial(mod.histogram, bins=bins, range=span)
        return S.Prepared(g, args)
    return make


def _hist_case(kind, dist, bins):
    exact = _check_counts(kind, dist, bins, True)
    loose = _check_counts(kind, dist, bins, False)
    name = "cufold." + kind
    cands = [S.Candidate(name, "cufold", "cufold", _cf_hist(kind, dist, bins))]
    cands += [S.Candidate("%s[%s]" % (name, a), "cufold", "cufold", _cf_hist(kind, dist, bins, a), study=True)
              for a in _algorithms("histogram")]
    if kind == "histogram":
        cands += [S.Candidate("torch.histc", "torch", "peer", _peer_hist("torch", kind, dist, bins), check=loose),
                  S.Candidate("cupy.histogram", "cupy", "peer", _peer_hist("cupy", kind, dist, bins), check=loose)]
        title = "histogram float32, %d bins, %s" % (bins, dist)
    else:
        cands += [S.Candidate("torch.bincount", "torch", "peer", _peer_hist("torch", kind, dist, bins)),
                  S.Candidate("cupy.bincount", "cupy", "peer", _peer_hist("cupy", kind, dist, bins))]
        title = "bincount int32, %d bins, %s" % (bins, dist)
    return S.Case("%s/%d/%s" % (kind, bins, dist), kind, title, "float32", "uniform", 4, "sum", exact, cands)


def hist_cases(env, dtypes):
    """histogram cases (float32 in ``dtypes``) and bincount cases (int32 in ``dtypes``)."""
    cases = []
    for kind, dt in (("histogram", "float32"), ("bincount", "int32")):
        if dt not in dtypes:
            continue
        for bins in HIST_BINS:
            for dist in DISTS:
                cases.append(_hist_case(kind, dist, bins))
    return cases


# --- segmented ----------------------------------------------------------------------------------------

_SEGMENT_DATA = {}


def _segment_host(n):
    """Host values (``SEGMENT_LENGTH * n`` grid floats) and int64 offsets for ``n`` segments."""
    got = _SEGMENT_DATA.get(n)
    if got is None:
        _SEGMENT_DATA.clear()
        rng = np.random.default_rng(20 + n)
        k = rng.integers(-256, 256, size=SEGMENT_LENGTH * n, dtype=np.int16, endpoint=True)
        values = k.astype(np.float32) * np.float32(1.0 / 256)
        offsets = np.arange(0, SEGMENT_LENGTH * n + 1, SEGMENT_LENGTH, dtype=np.int64)
        got = _SEGMENT_DATA[n] = (values, offsets)
    return got


def _segment_buffers(ctx):
    """[(values, offsets)] device pairs of the backend's library, as many as keep the
    rotation beyond the L2 (the suite's count scaled to 52 bytes a segment)."""
    n = ctx.n
    if n > 1 << MAX_SEGMENTS_LOG2:
        raise Skip("more than 2^%d segments (%d values)" % (MAX_SEGMENTS_LOG2, SEGMENT_LENGTH * n))
    def build():
        values, offsets = _segment_host(n)
        count = max(1, min(ctx.inputs.count, -(-(ctx.inputs.count - 1) * 4 // 52) + 1))
        return [(ctx.backend.upload(values), ctx.backend.upload(offsets)) for _ in range(count)]
    return _cached(ctx, "segments", build)


def _pairs(ctx, kind):
    return [(ctx.backend.view(v, kind), ctx.backend.view(o, kind)) for v, o in _segment_buffers(ctx)]


def check_segmented(got, c):
    g = np.asarray(_first(got)).reshape(-1)
    values, _ = _segment_host(c.n)
    ref = values.reshape(c.n, SEGMENT_LENGTH).sum(axis=1, dtype=np.float64)
    if g.shape != ref.shape:
        return False, "shape %s, expected %s" % (g.shape, ref.shape)
    bad = np.nonzero(g.astype(np.float64) != ref)[0]      # grid values: every sum is exact
    if bad.size:
        k = bad[0]
        return False, "%d of %d segments wrong; segment %d: %r, expected %r" % (bad.size, g.size, k, g[k],
                                                                              ref[k])
    return True, ""


def _cf_segmented(ctx):
    f = _cufold_fn(ctx.env, "segmented_reduce", "segmented")

    def call(pair):
        return f(pair[0], pair[1])
    return S.Prepared(call, _pairs(ctx, "cufold"))


def _torch_segmented(ctx):
    torch = ctx.mod("torch")
    seg = getattr(torch, "segment_reduce", None)
    if seg is None:
        raise Skip("torch.segment_reduce missing")

    def call(pair):
        return seg(pair[0], "sum", offsets=pair[1])
    return S.Prepared(call, _pairs(ctx, "torch"))


def _cupyx_csr(ctx):
    ctx.mod("cupy")
    try:
        sparse = importlib.import_module("cupyx.scipy.sparse")
    except ImportError as e:
        raise Skip("cupyx.scipy.sparse not importable: %s" % e)
    cupy = ctx.mod("cupy")
    mats = []
    for v, o in _pairs(ctx, "cupy"):
        cols = cupy.zeros(v.size, dtype=cupy.int32)
        mats.append(sparse.csr_matrix((v, cols, o.astype(cupy.int32)), shape=(o.size - 1, 1)))

    def call(mat):
        return mat.sum(axis=1)
    return S.Prepared(call, mats)


def _cc_segmented(ctx):
    cc = ctx.mod("cuda.compute")
    buffers = [{"d_in": v, "d_out": ctx.backend.empty_like(o[:-1], dtype="float32"),
                "start_offsets_in": o[:-1], "end_offsets_in": o[1:]}
               for v, o in _pairs(ctx, S._cc_view_kind(ctx))]
    return S.cc_prepared(ctx, "segmented_reduce", buffers, {"num_segments": ctx.n}, op=cc.OpKind.PLUS,
                         h_init=np.zeros(1, dtype=np.float32))


def segmented_cases(env, dtypes):
    """The ``segmented/float32`` case (float32 in ``dtypes``)."""
    if "float32" not in dtypes:
        return []
    cands = [
        S.Candidate("cufold.segmented_reduce", "cufold", "cufold", _cf_segmented),
        S.Candidate("torch.segment_reduce", "torch", "peer", _torch_segmented),
        S.Candidate("cupyx csr.sum(axis=1) (CUB SpMV)", "cupy", "peer", _cupyx_csr),
        S.Candidate("cuda.compute.segmented_reduce (CUB)", "cuda.compute", "peer", _cc_segmented),
    ]
    return [S.Case("segmented/float32", "segmented",
                   "segmented sum, 2^k segments x %d float32" % SEGMENT_LENGTH, "float32", "grid",
                   4 * SEGMENT_LENGTH + 8 + 4, "sum", check_segmented, cands)]
