"""What each suite times: cases (an operation on one dtype), their candidates
(cufold and what a user would pick instead), references, checks and targets.

A :class:`Candidate` is built lazily: ``make(ctx)`` returns a
:class:`Prepared` (the function to time, its per-buffer arguments, and the
call whose result is checked), or raises :class:`~.backends.Skip` ("cufold.argmax
missing", "cuda.compute not importable: ..."). Nothing is imported here.

Input data (see :func:`generate`): ``grid`` floats are uniform on the grid
``k/256``, ``k`` in [-256, 256] (zero mean: no drift), ints uniform in
[-8, 8]: every partial sum of these is exact in float32 (|partial| < 2^16,
about 7 standard deviations of the walk even at 2^28 elements), so sums and
scans in any order can be checked tightly against NumPy. ``uniform`` floats
are continuous uniform [-1, 1) (argmax, mean/var).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional

import numpy as np

from .backends import Skip

__all__ = ["Candidate", "Case", "Prepared", "Suite", "SUITES", "generate", "build_cases",
           "reference", "CASE_ALIASES", "matrix_shape"]


# --- data -------------------------------------------------------------------
def generate(dtype, dist, n, count, seed):
    """``count`` host buffers of ``n`` elements (one contiguous block, split)."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    total = n * count
    if dt.kind in "iu":
        block = rng.integers(-8, 8, size=total, dtype=np.int8, endpoint=True).astype(dt)
    elif dist == "grid":
        k = rng.integers(-256, 256, size=total, dtype=np.int16, endpoint=True)
        block = k.astype(dt) * dt.type(1.0 / 256)
    elif dist == "uniform":
        block = rng.random(size=total, dtype=np.float64 if dt == np.float64 else np.float32)
        block = (block * 2 - 1).astype(dt, copy=False)
    else:
        raise ValueError("cufold bench: unknown distribution %r" % dist)
    return [block[i * n:(i + 1) * n] for i in range(count)]


def matrix_shape(n):
    """The near-square 2-D shape of ``n`` (a power of two) elements: 2^10 -> (32, 32)."""
    rows = 1 << (max(int(n), 1).bit_length() - 1) // 2
    return rows, int(n) // rows


def sample_indices(n, full_max=1 << 22, edge=4096, random=1 << 16, seed=7):
    """Indices at which big 1-D results are checked (None: all)."""
    if n <= full_max:
        return None
    rng = np.random.default_rng(seed)
    idx = np.concatenate([np.arange(edge), np.arange(n - edge, n),
                          rng.integers(0, n, size=random)])
    return np.unique(idx).astype(np.int64)


def reference(kind, x):
    """NumPy float64/int64 reference of ``kind`` on host input ``x``."""
    if kind == "sum":
        acc = np.int64 if x.dtype.kind in "iu" else np.float64
        return {"sum": np.sum(x, dtype=acc), "abs": float(np.sum(np.abs(x), dtype=np.float64))}
    if kind == "argmax":
        i = int(np.argmax(x))
        return {"index": i, "value": x[i]}
    if kind == "mean_var":
        x64 = x.astype(np.float64)
        m = x64.mean()
        d = x64 - m
        ss = float(np.dot(d, d))
        return {"mean": float(m), "var0": ss / x.size, "var1": ss / max(1, x.size - 1)}
    if kind == "scan":
        acc = np.int64 if x.dtype.kind in "iu" else np.float64
        return {"scan": np.cumsum(x, dtype=acc)}
    raise ValueError(kind)


# --- checks -------------------------------------------------------------------
class CheckCtx:
    """What a check sees: reference, host input (buffer 0), sample indices."""

    def __init__(self, ref, host_x, idx, n, dtype):
        self.ref, self.host_x, self.idx, self.n, self.dtype = ref, host_x, idx, n, np.dtype(dtype)

    def sampled(self, arr):
        return arr if self.idx is None else arr[self.idx]


def _eps(dt):
    return float(np.finfo(dt).eps) if np.dtype(dt).kind == "f" else 0.0


def _scalar(got):
    a = np.asarray(got)
    if a.size != 1:
        raise ValueError("expected a scalar result, got shape %s" % (a.shape,))
    return a.reshape(()).item()


def check_sum(got, c):
    v = _scalar(got)
    ref = c.ref["sum"]
    if c.dtype.kind in "iu":
        ok = int(v) == int(ref)
        return ok, "" if ok else "got %s, expected %s" % (v, ref)
    tol = 16 * _eps(c.dtype) * math.sqrt(c.n) + 1e-300
    ok = math.isfinite(v) and abs(v - float(ref)) <= tol
    return ok, "" if ok else "got %r, expected %r (tol %.3g)" % (v, float(ref), tol)


def check_argmax(got, c):
    g = got
    if isinstance(g, tuple):          # (value, index) pairs: take the index
        g = g[-1]
    a = np.asarray(g)
    if a.dtype.names:                 # structured (value, index)
        a = a[a.dtype.names[-1]]
    i = int(a.reshape(-1)[-1]) if a.size else -1
    if not 0 <= i < c.n:
        return False, "index %d out of range" % i
    if c.host_x[i] != c.ref["value"]:
        return False, "x[%d] = %r is not the maximum %r (at %d)" % (
            i, c.host_x[i], c.ref["value"], c.ref["index"])
    if i != c.ref["index"]:
        return True, "tie: index %d, first occurrence %d" % (i, c.ref["index"])
    return True, ""


def check_mean_var(got, c):
    """``got`` = (mean, var); var may be population (ddof=0) or sample (ddof=1)."""
    if not isinstance(got, tuple) or len(got) != 2:
        return False, "expected (mean, var), got %r" % (type(got),)
    mean, var = _scalar(got[0]), _scalar(got[1])
    f32 = c.dtype == np.float32
    mtol = 1e-4 if f32 else 1e-10
    vtol = 2e-4 if f32 else 1e-9
    r = c.ref
    if not (math.isfinite(mean) and abs(mean - r["mean"]) <= mtol):
        return False, "mean %r, expected %r" % (mean, r["mean"])
    # population variance if it matches (at large n both do), else sample variance
    if abs(var - r["var0"]) <= vtol * abs(r["var0"]):
        return True, ""
    if abs(var - r["var1"]) <= vtol * abs(r["var1"]):
        return True, "var with ddof=1"
    return False, "var %r, expected %r (ddof=0) or %r (ddof=1)" % (var, r["var0"], r["var1"])


def check_scan(got, c):
    g = np.asarray(got).reshape(-1)
    ref = c.sampled(c.ref["scan"])
    if g.shape != ref.shape:
        return False, "shape %s, expected %s" % (g.shape, ref.shape)
    if c.dtype.kind in "iu":
        bad = np.nonzero(g.astype(np.int64) != ref)[0]
    else:
        pos = (np.arange(c.n) if c.idx is None else c.idx).astype(np.float64)
        tol = 16 * _eps(c.dtype) * np.sqrt(pos + 1)
        g64 = g.astype(np.float64)
        bad = np.nonzero(~(np.abs(g64 - ref) <= tol))[0]
    return verdict(bad, g, ref, c)


def verdict(bad, g, ref, c):
    """``(ok, note)`` of a check whose wrong positions are ``bad`` (of ``got`` as ``g``,
    against ``ref``; sampled positions reported as the input's)."""
    if bad.size:
        k = bad[0]
        at = int(k if c.idx is None else c.idx[k])
        return False, "%d of %d wrong; first at %d: got %r, expected %r" % (bad.size, g.size, at, g[k], ref[k])
    return True, ""


def check_copy(got, c):
    g = np.asarray(got).reshape(-1)
    ok = np.array_equal(g, c.sampled(c.host_x))
    return ok, "" if ok else "copy differs"


# --- cases ------------------------------------------------------------------
@dataclasses.dataclass
class Prepared:
    fn: Callable                       # timed: fn(arg)
    args: list                         # one per rotation buffer
    result: Optional[Callable] = None  # result(arg) -> value to check (default fn)
    call_fn: Optional[Callable] = None  # timed per call (wall clock; default fn)


@dataclasses.dataclass
class Candidate:
    label: str
    lib: str                 # cufold, torch, cupy, numba, cuda.compute, copy
    role: str                # cufold | peer | ceiling
    make: Callable           # make(ctx) -> Prepared; may raise Skip
    canon: Callable = None   # host result -> canonical form for the check
    check: Callable = None   # overrides the case's check
    skip: str = None         # known at build time
    requires: str = None     # the cufold function it calls (checked at build time)
    study: bool = False      # a study (every algorithm): runs with --full only


@dataclasses.dataclass
class Case:
    id: str                  # "sum/float32"
    op: str                  # sum | argmax | mean_var | reduce-alg | scan | scan-alg
    title: str
    dtype: str
    dist: str                # grid | uniform
    bytes_per_elem: int      # bytes moved per element
    ref_kind: str
    check: Callable
    candidates: list
    peers_from: str = None   # algorithm cases: best peer from this case
    sampled: bool = False    # 1-D results: check at sample indices when big
    matrix: bool = False     # inputs viewed as a matrix_shape(n) matrix

    def describe(self):
        return {"id": self.id, "op": self.op, "title": self.title, "dtype": self.dtype, "dist": self.dist,
                "bytes_per_elem": self.bytes_per_elem, "peers_from": self.peers_from,
                "labels": [c.label for c in self.candidates],
                "roles": {c.label: c.role for c in self.candidates},
                "libs": {c.label: c.lib for c in self.candidates}}


class Ctx:
    """What ``Candidate.make`` sees."""

    def __init__(self, env, backend, case, n, inputs):
        self.env, self.backend, self.case, self.n, self.inputs = env, backend, case, n, inputs
        self.dtype = np.dtype(case.dtype)

    def views(self, kind):
        views = self.inputs.views(kind)
        if self.case.matrix:
            shape = matrix_shape(self.n)
            return [v.reshape(shape) for v in views]
        return views

    def mod(self, lib):
        return self.env.get(lib)


def _cufold_attr(env, name):
    cf = env.get("cufold")
    obj = cf
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise Skip("cufold.%s missing" % name)
    Op = getattr(cf, "Op", None)
    # argmax/argmin/minmax are operators that reduce a whole array when called
    # with one (Op.device_reduction); an operator without it is not a reduction
    if Op is not None and isinstance(obj, Op) and getattr(obj, "device_reduction", None) is None:
        raise Skip("cufold.%s is the operator (cufold.Op), no device-wide cufold.%s(x) yet" % (name, name))
    if not callable(obj):
        raise Skip("cufold.%s is not callable" % name)
    return obj


def _with_out(fn, out):
    """result(arg) for candidates writing into ``out``."""
    def result(arg):
        fn(arg)
        return out
    return result


# cufold -----------------------------------------------------------------------
def cf_call(name, **kw):
    def make(ctx):
        f = _cufold_attr(ctx.env, name)
        if kw:
            f = functools.partial(f, **kw)
        return Prepared(f, ctx.views("cufold"))
    return make


def cf_reduce_alg(alg):
    def make(ctx):
        cf = ctx.mod("cufold")
        red = _cufold_attr(ctx.env, "reduce")
        args = ctx.views("cufold")
        f = functools.partial(red, op=cf.plus, algorithm=alg)
        try:
            f(args[0])
        except ValueError as e:
            if "determinis" not in str(e):
                raise
            # atomic algorithms run only when nondeterminism is allowed
            f = functools.partial(red, op=cf.plus, algorithm=alg, deterministic=False)
        return Prepared(f, args)
    return make


def cf_scan_alg(alg):
    def make(ctx):
        cf = ctx.mod("cufold")
        f = functools.partial(_cufold_attr(ctx.env, "inclusive_scan"), op=cf.plus, algorithm=alg)
        return Prepared(f, ctx.views("cufold"))
    return make


def cf_scan_out(ctx):
    cf = ctx.mod("cufold")
    scan = _cufold_attr(ctx.env, "inclusive_scan")
    args = ctx.views("cufold")
    out = ctx.backend.empty_like(args[0])
    f = functools.partial(scan, op=cf.plus, out=out)
    return Prepared(f, args, _with_out(f, out))


# torch ------------------------------------------------------------------------
def torch_call(fname, **kw):
    def make(ctx):
        torch = ctx.mod("torch")
        f = getattr(torch, fname)
        if kw:
            f = functools.partial(f, **kw)
        return Prepared(f, ctx.views("torch"))
    return make


def torch_cumsum(ctx):
    torch = ctx.mod("torch")
    from .backends import torch_dtype
    # same dtype out (torch would promote int32 to int64: twice the bytes written)
    f = functools.partial(torch.cumsum, dim=0, dtype=torch_dtype(torch, ctx.dtype))
    return Prepared(f, ctx.views("torch"))


# cupy -------------------------------------------------------------------------
def cupy_call(fname, same_dtype=False):
    def make(ctx):
        cupy = ctx.mod("cupy")
        f = getattr(cupy, fname)
        if same_dtype:
            f = functools.partial(f, dtype=ctx.dtype)
        return Prepared(f, ctx.views("cupy"))
    return make


def cupy_mean_var(ctx):
    cupy = ctx.mod("cupy")
    mean, var = cupy.mean, cupy.var

    def f(x):
        return mean(x), var(x)
    return Prepared(f, ctx.views("cupy"))


# numba ------------------------------------------------------------------------
def _numba_add(a, b):
    return a + b


def numba_reduce(ctx):
    ncuda = ctx.mod("numba")
    r = ncuda.reduce(_numba_add)   # Reduce caches kernels by (functor, dtype): one functor
    res = ncuda.device_array(1, dtype=ctx.dtype)
    # res= keeps the result on the device (no per-call copy and sync)
    f = functools.partial(r, res=res)
    return Prepared(f, ctx.views("numba"), _with_out(f, res))


# cuda.compute ---------------------------------------------------------------------
def _cc_view_kind(ctx):
    return "cupy" if ctx.env.has("cupy") else "primary"


def cc_prepared(ctx, algorithm, buffers, counts, **fixed):
    """cuda.compute's ``algorithm`` (``reduce_into``, ``inclusive_scan``,
    ``segmented_reduce``) with cuda-cccl 1.1.1's keyword-only calls. ``buffers``: one
    dict of arrays per rotation buffer (``d_in``, ``d_out``, ...), ``counts``: the
    ``num_items`` / ``num_segments`` keyword, ``fixed``: ``op`` and the initial value.

    GPU time: the object ``make_<algorithm>(...)`` builds, called with temp storage
    allocated once (as a CUB user does); per-call host time: the one-shot
    ``cuda.compute.<algorithm>(...)``, which finds the built object in its cache and
    allocates temp storage on every call (as a Python user does)."""
    cc = ctx.mod("cuda.compute")
    one_shot = getattr(cc, algorithm)
    made = getattr(cc, "make_" + algorithm)(**buffers[0], **fixed)
    nbytes = made(temp_storage=None, **buffers[0], **counts, **fixed)   # the size query
    temp = ctx.backend.upload(np.zeros(max(1, int(nbytes)), np.uint8))

    def run_made(b):
        made(temp_storage=temp, **b, **counts, **fixed)
        return b["d_out"]

    def run_one_shot(b):
        one_shot(**b, **counts, **fixed)
    return Prepared(run_made, buffers, call_fn=run_one_shot)


def cc_reduce(ctx):
    cc = ctx.mod("cuda.compute")
    args = ctx.views(_cc_view_kind(ctx))
    out = ctx.backend.empty_like(args[0][:1])
    return cc_prepared(ctx, "reduce_into", [{"d_in": a, "d_out": out} for a in args], {"num_items": ctx.n},
                       op=cc.OpKind.PLUS, h_init=np.zeros(1, dtype=ctx.dtype))


def cc_scan(ctx):
    cc = ctx.mod("cuda.compute")
    args = ctx.views(_cc_view_kind(ctx))
    out = ctx.backend.empty_like(args[0])
    return cc_prepared(ctx, "inclusive_scan", [{"d_in": a, "d_out": out} for a in args],
                       {"num_items": ctx.n}, op=cc.OpKind.PLUS, init_value=np.zeros(1, dtype=ctx.dtype))


# copy -----------------------------------------------------------------------------
def copy_make(ctx):
    _, fn = ctx.backend.copy_fn()
    src = ctx.views("primary")
    pairs = [(s, ctx.backend.empty_like(s)) for s in src]
    return Prepared(fn, pairs)


def copy_candidate(label="copy (device-to-device)"):
    return Candidate(label, "copy", "ceiling", copy_make, check=check_copy)


# --- canonical forms -----------------------------------------------------------------
def _swap(pair):                     # torch.var_mean -> (var, mean)
    return (pair[1], pair[0])


# --- suites -----------------------------------------------------------------------
def _algorithms(env, kind):
    """cufold.algorithms(kind) names, or a reason they are unknown."""
    if not env.has("cufold"):
        return None, env.skipped.get("cufold", "cufold not importable")
    f = getattr(env.modules["cufold"], "algorithms", None)
    if f is None:
        return None, "cufold.algorithms missing"
    try:
        return list(f(kind)), None
    except Exception as e:
        return None, "cufold.algorithms(%r) failed: %s: %s" % (kind, type(e).__name__, e)


def _cf(name):
    """The plain cufold call ``cufold.<name>(x)``."""
    return Candidate("cufold." + name, "cufold", "cufold", cf_call(name), requires=name)


def _sum_case(dt):
    it = np.dtype(dt).itemsize
    cands = [
        _cf("sum"),
        Candidate("torch.sum", "torch", "peer", torch_call("sum")),
        Candidate("cupy.sum (CUB)", "cupy", "peer", cupy_call("sum")),
        Candidate("numba cuda.reduce", "numba", "peer", numba_reduce),
        Candidate("cuda.compute.reduce_into", "cuda.compute", "peer", cc_reduce),
    ]
    return Case("sum/%s" % dt, "sum", "sum %s" % dt, dt, "grid", it, "sum", check_sum, cands)


def reduce_cases(env, dtypes):
    cases = [_sum_case(dt) for dt in ("float32", "float64", "int32") if dt in dtypes]
    if "float32" in dtypes:
        cases.append(Case("argmax/float32", "argmax", "argmax float32", "float32", "uniform", 4, "argmax",
                          check_argmax, [
                              _cf("argmax"),
                              Candidate("torch.argmax", "torch", "peer", torch_call("argmax")),
                              Candidate("cupy.argmax (CUB)", "cupy", "peer", cupy_call("argmax")),
                          ]))
        cases.append(Case("mean_var/float32", "mean_var", "mean + var float32", "float32", "uniform", 4,
                          "mean_var", check_mean_var, [
                              _cf("mean_var"),
                              Candidate("torch.var_mean", "torch", "peer", torch_call("var_mean"),
                                        canon=_swap),
                              Candidate("cupy.mean+cupy.var", "cupy", "peer", cupy_mean_var),
                          ]))
        names, why = _algorithms(env, "reduce")
        if names is None:
            cands = [Candidate("cufold.reduce[*]", "cufold", "cufold", None, skip=why, study=True)]
        else:
            cands = [Candidate("cufold.reduce[%s]" % a, "cufold", "cufold", cf_reduce_alg(a), requires="reduce",
                               study=True) for a in names]
        cases.append(Case("reduce-alg/float32", "reduce-alg", "sum float32 by cufold reduce algorithm",
                          "float32", "grid", 4, "sum", check_sum, cands, peers_from="sum/float32"))
    return cases


def cf_repro_state(wide):
    """``cufold.reproducible.sum_state(x, wide=wide)`` timed (the binned sum's kernel with 8- or
    4-byte loads of float32 items), checked through ``finalise``."""
    def make(ctx):
        cf = ctx.mod("cufold")
        rep = getattr(cf, "reproducible", None)
        if rep is None:
            raise Skip("cufold.reproducible missing")
        f = functools.partial(rep.sum_state, wide=wide)
        dt = ctx.dtype
        return Prepared(f, ctx.views("cufold"), lambda a: rep.finalise(f(a), dt))
    return make


def reproducible_cases(env, dtypes):
    """Plain ``cufold.sum`` against ``deterministic="gpu_to_gpu"`` (binned) and torch.sum; for
    float32 the binned kernel with 8-byte and with 4-byte loads (which is the default is a
    measurement: ``reproducible.WIDE_LOADS``)."""
    cases = []
    for dt in ("float32", "float64"):
        if dt not in dtypes:
            continue
        cands = [
            _cf("sum"),
            Candidate("cufold.sum[gpu_to_gpu]", "cufold", "cufold", cf_call("sum", deterministic="gpu_to_gpu"),
                      requires="sum"),
            Candidate("torch.sum", "torch", "peer", torch_call("sum")),
        ]
        if dt == "float32":
            cands[2:2] = [Candidate("cufold.reproducible.sum_state[%d-byte loads]" % (8 if w else 4), "cufold",
                                    "cufold", cf_repro_state(w)) for w in (True, False)]
        cases.append(Case("sum/%s" % dt, "sum", "sum %s, plain and reproducible (gpu_to_gpu)" % dt, dt, "grid",
                          np.dtype(dt).itemsize, "sum", check_sum, cands))
    if "float32" in dtypes:
        # fused items binned (issue 20): the dot product and the 2-norm, each against its plain self
        g2g = {"deterministic": "gpu_to_gpu"}
        cases.append(_fused.dot_case([
            Candidate("cufold.dot", "cufold", "cufold", _fused.cf_dot(), requires="dot"),
            Candidate("cufold.dot[gpu_to_gpu]", "cufold", "cufold", _fused.cf_dot(**g2g), requires="dot"),
            Candidate("torch.dot", "torch", "peer", _fused._torch_dot)]))
        cases.append(_fused.norm_case([
            Candidate("cufold.norm", "cufold", "cufold", _fused._cf_call("norm"), requires="norm"),
            Candidate("cufold.norm[gpu_to_gpu]", "cufold", "cufold", _fused._cf_call("norm", **g2g),
                      requires="norm"),
            Candidate("torch.linalg.vector_norm", "torch", "peer", _fused._torch_norm)]))
    return cases


def scan_cases(env, dtypes):
    cases = []
    names, why = _algorithms(env, "scan")
    for dt in ("int32", "float32"):
        if dt not in dtypes:
            continue
        it = np.dtype(dt).itemsize
        cands = [
            _cf("inclusive_scan"),
            _cf("cumsum"),
            Candidate("cufold.inclusive_scan(out=)", "cufold", "cufold", cf_scan_out,
                      requires="inclusive_scan"),
            Candidate("torch.cumsum", "torch", "peer", torch_cumsum),
            Candidate("cupy.cumsum (CUB)", "cupy", "peer", cupy_call("cumsum", same_dtype=True)),
            Candidate("cuda.compute.inclusive_scan", "cuda.compute", "peer", cc_scan),
            copy_candidate(),
        ]
        cases.append(Case("scan/%s" % dt, "scan", "inclusive scan (+) %s" % dt, dt, "grid", 2 * it, "scan",
                          check_scan, cands, sampled=True))
        if names is None:
            acands = [Candidate("cufold.inclusive_scan[*]", "cufold", "cufold", None, skip=why, study=True)]
        else:
            acands = [Candidate("cufold.inclusive_scan[%s]" % a, "cufold", "cufold", cf_scan_alg(a),
                                requires="inclusive_scan", study=True) for a in names]
        cases.append(Case("scan-alg/%s" % dt, "scan-alg", "inclusive scan %s by cufold scan algorithm" % dt,
                          dt, "grid", 2 * it, "scan", check_scan, acands, peers_from="scan/%s" % dt,
                          sampled=True))
    return cases


# --- targets ---------------------------------------------------------------------
# kinds: speedup_best (best peer time / cufold time >= t), time_best (cufold / best <= t),
# call_vs (max over sizes of cufold call_us / peer call_us <= t), speedup_vs (peer / cufold >= t),
# copy_frac (cufold GB/s / copy GB/s >= t)
REDUCE_TARGETS = [
    {"name": "sum f32 @2^28 bandwidth vs best peer", "kind": "speedup_best", "case": "sum/float32",
     "label": "cufold.sum", "log2n": 28, "cmp": ">=", "threshold": 1.0},
    {"name": "sum f32 @2^24 time vs best peer", "kind": "time_best", "case": "sum/float32",
     "label": "cufold.sum", "log2n": 24, "cmp": "<=", "threshold": 1.0},
    {"name": "sum f32 per call 2^10..2^20 vs torch.sum", "kind": "call_vs", "case": "sum/float32",
     "label": "cufold.sum", "peer": "torch.sum", "range": [10, 20], "cmp": "<=", "threshold": 1.1},
    {"name": "argmax f32 @2^28 speedup vs torch.argmax", "kind": "speedup_vs", "case": "argmax/float32",
     "label": "cufold.argmax", "peer": "torch.argmax", "log2n": 28, "cmp": ">=", "threshold": 1.1},
    {"name": "mean/var f32 @2^28 speedup vs torch.var_mean", "kind": "speedup_vs",
     "case": "mean_var/float32", "label": "cufold.mean_var", "peer": "torch.var_mean", "log2n": 28,
     "cmp": ">=", "threshold": 1.1},
]

REPRODUCIBLE_TARGETS = [
    {"name": "gpu_to_gpu sum f32 @2^28 vs plain cufold.sum", "kind": "speedup_vs", "case": "sum/float32",
     "label": "cufold.sum[gpu_to_gpu]", "peer": "cufold.sum", "log2n": 28, "cmp": ">=", "threshold": 0.8},
    {"name": "gpu_to_gpu sum f64 @2^28 vs plain cufold.sum", "kind": "speedup_vs", "case": "sum/float64",
     "label": "cufold.sum[gpu_to_gpu]", "peer": "cufold.sum", "log2n": 28, "cmp": ">=", "threshold": 0.8},
    # read-outs (the target is the sum's; the same bar for the fused items)
    {"name": "gpu_to_gpu dot f32 @2^28 vs plain cufold.dot", "kind": "speedup_vs", "case": "dot/float32",
     "label": "cufold.dot[gpu_to_gpu]", "peer": "cufold.dot", "log2n": 28, "cmp": ">=", "threshold": 0.8},
    {"name": "gpu_to_gpu norm f32 @2^28 vs plain cufold.norm", "kind": "speedup_vs", "case": "norm/float32",
     "label": "cufold.norm[gpu_to_gpu]", "peer": "cufold.norm", "log2n": 28, "cmp": ">=", "threshold": 0.8},
]

SCAN_TARGETS = [
    {"name": "int32 inclusive scan @2^28 vs copy bandwidth", "kind": "copy_frac", "case": "scan/int32",
     "label": "cufold.inclusive_scan", "log2n": 28, "cmp": ">=", "threshold": 0.9},
    {"name": "float32 inclusive scan @2^28 vs copy bandwidth", "kind": "copy_frac", "case": "scan/float32",
     "label": "cufold.inclusive_scan", "log2n": 28, "cmp": ">=", "threshold": 0.9},
    {"name": "int32 scan per call 2^10..2^20 vs torch.cumsum", "kind": "call_vs", "case": "scan/int32",
     "label": "cufold.inclusive_scan", "peer": "torch.cumsum", "range": [10, 20], "cmp": "<=",
     "threshold": 1.1},
    {"name": "float32 scan per call 2^10..2^20 vs torch.cumsum", "kind": "call_vs", "case": "scan/float32",
     "label": "cufold.inclusive_scan", "peer": "torch.cumsum", "range": [10, 20], "cmp": "<=",
     "threshold": 1.1},
]


#: log2 sizes of a default run (the 2^28 bandwidth targets and 2^10..2^20 per-call ones
#: stay covered); ``--full`` sweeps FULL_SIZES.
DEFAULT_SIZES = "10,14,18,20,24,28"
FULL_SIZES = "10:28"


@dataclasses.dataclass
class Suite:
    name: str
    dtypes: tuple
    build: Optional[Callable]      # build(env, dtypes) -> [Case]; None: its own driver
    targets: list
    doc: str
    default_sizes: str = DEFAULT_SIZES
    full_sizes: str = FULL_SIZES
    settings: dict = dataclasses.field(default_factory=dict)   # Settings fields of every run


from . import hist as _hist  # noqa: E402  (the hist and segmented suites live in bench/hist.py)
from . import calls as _calls  # noqa: E402
from . import segscan as _segscan  # noqa: E402
from . import fused as _fused  # noqa: E402

SUITES = {
    "reduce": Suite("reduce", ("float32", "float64", "int32"), reduce_cases, REDUCE_TARGETS,
                    "sum (f32/f64/i32), argmax f32, mean+var f32 (--full: every cufold reduce algorithm)"),
    "reproducible": Suite("reproducible", ("float32", "float64"), reproducible_cases, REPRODUCIBLE_TARGETS,
                          "sum f32/f64, dot f32, norm f32: plain vs deterministic='gpu_to_gpu' (binned) vs torch",
                          default_sizes="20,24,28", full_sizes="10:28"),
    "scan": Suite("scan", ("int32", "float32"), scan_cases, SCAN_TARGETS,
                  "inclusive scan / cumsum (i32/f32), device copy as ceiling (--full: every scan algorithm)"),
    "bykey": Suite("bykey", (), None, [], "seed 001's box: reduce_by_key_into vs torch/cupyx (cufold.bench.bykey)"),
    "bykey-tuple": Suite("bykey-tuple", (), None, [], "tuple values by key: argmax, count + sums, Welford vs "
                         "PyG/torch (cufold.bench.bykey_tuple)"),
    "distributed": Suite("distributed", (), None, [], "cufold.distributed vs torch.distributed/NCCL, one process "
                         "per GPU (cufold.bench.distributed)"),
    "pyg": Suite("pyg", (), None, [], "feature rows by key and over segments (E = 4M x F = 1..256 into N = 200k) "
                 "vs PyG scatter and torch (cufold.bench.pyg)"),
    "hist": Suite("hist", ("float32", "int32"), _hist.hist_cases, _hist.HIST_TARGETS, _hist.HIST_DOC,
                  default_sizes="20,26", full_sizes="10:28"),
    "segmented": Suite("segmented", ("float32",), _hist.segmented_cases, _hist.SEGMENTED_TARGETS,
                       _hist.SEGMENTED_DOC, default_sizes="10,14,18,20,24", full_sizes="10:24"),
    "segscan": Suite("segscan", ("float32",), _segscan.segscan_cases, _segscan.SEGSCAN_TARGETS,
                     _segscan.SEGSCAN_DOC, default_sizes="20,22,24,26", full_sizes="16:26"),
    "fused": Suite("fused", ("float32",), _fused.fused_cases, _fused.FUSED_TARGETS, _fused.FUSED_DOC,
                   default_sizes=_fused.FUSED_SIZES, full_sizes="16:28"),
    "calls": Suite("calls", ("float32",), _calls.calls_cases, _calls.CALLS_TARGETS, _calls.CALLS_DOC,
                   default_sizes="10,12,14,16,18,20", full_sizes="10:20", settings=_calls.CALLS_SETTINGS),
}

CASE_ALIASES = {"var": "mean_var", "mean": "mean_var", "meanvar": "mean_var", "algorithms": "alg",
                "algs": "alg", "cumsum": "scan"}


def build_cases(suite, env, dtypes=None, cases=None, only=None, full=False):
    """The suite's cases for ``dtypes``, keeping case ops in ``cases`` and
    candidates whose lib or label prefix is in ``only`` (ceilings always kept);
    the studies (every cufold algorithm) only when ``full``."""
    s = SUITES[suite]
    dts = tuple(dtypes) if dtypes else s.dtypes
    bad = [d for d in dts if d not in ("float32", "float64", "int32")]
    if bad:
        raise ValueError("cufold bench: unsupported dtypes %s (float32, float64, int32)" % ",".join(bad))
    out = s.build(env, dts) if s.build else []
    if cases:
        want = {CASE_ALIASES.get(c, c) for c in cases}

        def keep_case(c):
            return (c.op in want or c.id in want
                    or ("alg" in want and c.op.endswith("-alg")))
        out = [c for c in out if keep_case(c)]
    def keep(cand):
        if cand.study and not full:
            return False
        return not only or cand.role == "ceiling" or any(cand.lib == o or cand.label.startswith(o) for o in only)
    for c in out:
        c.candidates = [cand for cand in c.candidates if keep(cand)]
    # known-unavailable libraries: skip at build time with the probe's reason
    for c in out:
        for cand in c.candidates:
            if cand.skip is None and cand.lib not in ("copy",) and not env.has(cand.lib):
                cand.skip = env.skipped.get(cand.lib, "%s unavailable" % cand.lib)
            if cand.skip is None and cand.requires and env.has("cufold"):
                try:
                    _cufold_attr(env, cand.requires)
                except Skip as e:
                    cand.skip = str(e)
    return [c for c in out if c.candidates]
