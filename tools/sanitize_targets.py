"""Every device algorithm once, for compute-sanitizer (memcheck, racecheck, synccheck).

    compute-sanitizer --tool racecheck --error-exitcode 9 python3 tools/sanitize_targets.py
Small inputs spanning several tiles and blocks; results are checked too.
"""
import sys

import numpy as np
from numba import cuda

import cufold

rng = np.random.default_rng(0)
failures = 0


def check(name, got, want, exact=True):
    global failures
    ok = np.array_equal(got, want) if exact else np.allclose(got, want, rtol=1e-4, atol=1e-3)
    failures += not ok
    print("%-40s %s" % (name, "ok" if ok else "WRONG"), flush=True)


n = 100_003
x = rng.integers(-100, 100, n).astype(np.int32)
xf = rng.normal(size=n).astype(np.float32)
d, df = cuda.to_device(x), cuda.to_device(xf)
for alg in cufold.algorithms("reduce"):
    check("reduce %s int32 sum" % alg, cufold.sum(d, algorithm=alg).copy_to_host(), x.sum())
    check("reduce %s int32 sum, 4-byte offset" % alg, cufold.sum(d[1:], algorithm=alg).copy_to_host(), x[1:].sum())
    check("reduce %s float32 max" % alg, cufold.max(df, algorithm=alg).copy_to_host(), xf.max())
    if not alg.startswith("atomic"):
        check("reduce %s argmax" % alg, cufold.argmax(df, algorithm=alg).copy_to_host(), xf.argmax())
for alg in cufold.algorithms("scan"):
    check("scan %s int32 inclusive" % alg, cufold.inclusive_scan(d, algorithm=alg).copy_to_host(), np.cumsum(x, dtype=np.int32))
    check("scan %s float32 exclusive" % alg,
          cufold.exclusive_scan(df, algorithm=alg).copy_to_host(),
          np.concatenate([[0], np.cumsum(xf.astype(np.float64))[:-1]]), exact=False)
xd = rng.normal(size=n)
check("scan single_pass float64 (wide states)", cufold.inclusive_scan(cuda.to_device(xd), algorithm="single_pass")
      .copy_to_host(), np.cumsum(xd), exact=False)
keys = np.sort(rng.integers(0, 5000, n)).astype(np.int32)
keys[::7] = rng.integers(0, 5000, keys[::7].size)          # ordered, with some disorder
want = np.bincount(keys, weights=xd, minlength=5000)
for alg in cufold.algorithms("reduce_by_key"):
    out = cuda.to_device(np.zeros(5000))
    cufold.reduce_by_key_into(cuda.to_device(keys), cuda.to_device(xd), out, algorithm=alg)
    check("reduce_by_key_into %s" % alg, out.copy_to_host(), want, exact=False)
shuffled = keys.copy()
shuffled[::2] = rng.integers(0, 5000, shuffled[::2].size)    # most rows past the run-head limit
for alg in ("adaptive", "table"):
    out = cuda.to_device(np.zeros(5000))
    cufold.reduce_by_key_into(cuda.to_device(shuffled), cuda.to_device(xd), out, algorithm=alg)
    check("reduce_by_key_into %s (match / table rows)" % alg, out.copy_to_host(),
          np.bincount(shuffled, weights=xd, minlength=5000), exact=False)
out = cuda.to_device(np.zeros(5000))
cufold.reduce_by_key_into(cuda.to_device(keys), cuda.to_device(xd), out, deterministic=True)   # radix grouping
check("reduce_by_key_into deterministic", out.copy_to_host(), want, exact=False)
offs = np.sort(rng.integers(0, n, 2001)).astype(np.int64)
offs[0], offs[-1] = 0, n
check("segmented_reduce", cufold.segmented_reduce(df, cuda.to_device(offs)).copy_to_host(),
      np.array([xf[a:b].astype(np.float64).sum() for a, b in zip(offs[:-1], offs[1:])]), exact=False)
m2 = rng.integers(-9, 9, (301, 257)).astype(np.int32)
dm = cuda.to_device(m2)
check("axis rows", cufold.sum(dm, axis=1).copy_to_host(), m2.sum(axis=1))
check("axis columns", cufold.sum(dm, axis=0).copy_to_host(), m2.sum(axis=0))
# the layout planner's split kernels (a last-arrival ticket per output) and strided full reductions
for shape, axis in (((16, 65536), 1), ((65536, 8), 0), ((1000, 64), 1), ((64, 3000), 0)):
    h = rng.integers(-9, 9, shape).astype(np.int32)
    dh = cuda.to_device(h)
    check("axis %s axis=%d sum" % (shape, axis), cufold.sum(dh, axis=axis).copy_to_host(), h.sum(axis=axis))
    check("axis %s axis=%d argmax" % (shape, axis), cufold.argmax(dh, axis=axis).copy_to_host(), h.argmax(axis=axis))
    check("axis %s axis=%d mean" % (shape, axis), cufold.mean(dh, axis=axis).copy_to_host(), h.mean(axis=axis),
          exact=False)
# results turned through shared memory: (B, K, A) viewed as (K, A, B), along axis 0 (CuPy: a 3-D view)
import cupy  # noqa: E402
h = rng.integers(-9, 9, (64, 3, 20000)).astype(np.int32)   # 1250 tiles: fills an H100/H200
hv = h.transpose(1, 2, 0)
cv = cupy.asarray(h).transpose(1, 2, 0)
check("axis turned tiles sum", cupy.asnumpy(cufold.sum(cv, axis=0)), hv.sum(axis=0))
check("axis turned tiles argmax", cupy.asnumpy(cufold.argmax(cv, axis=0)), hv.argmax(axis=0))
big = rng.integers(-9, 9, (1024, 1024)).astype(np.int32)
dbig = cuda.to_device(big)
check("full sum of x.T", cufold.sum(dbig.T).copy_to_host(), big.sum())
check("full sum of x[::2]", cufold.sum(dbig[::2]).copy_to_host(), big[::2].sum())
check("full argmax of x[:, ::3]", cufold.argmax(dbig[:, ::3]).copy_to_host(), big[:, ::3].argmax())
# the device reduce over runs (reduce.Spec.runs): whole tiles (8192) and partial last tiles (29672)
for rows, length in ((40, 8192), (8, 29672)):
    r = rng.integers(-9, 9, (rows, length)).astype(np.int32)
    dr = cuda.to_device(r)
    check("runs: full sum of %dx%d[::2]" % (rows, length), cufold.sum(dr[::2]).copy_to_host(), r[::2].sum())
    check("runs: full argmax of %dx%d[::2]" % (rows, length), cufold.argmax(dr[::2]).copy_to_host(), r[::2].argmax())
    # (retiled: indices rise along each run, not from run to run)
    check("runs: full argmax of %dx%d.T" % (rows, length), cufold.argmax(dr.T).copy_to_host(), r.T.argmax())
    check("runs: full argmin of %dx%d.T" % (rows, length), cufold.argmin(dr.T).copy_to_host(), r.T.argmin())
    rv = r[::2].astype(np.float64)
    check("runs: mean_var of %dx%d[::2]" % (rows, length),
          np.array([m.copy_to_host() for m in cufold.mean_var(cuda.to_device(r.astype(np.float32))[::2])]),
          np.array([rv.mean(), rv.var()]), exact=False)
tall = rng.integers(-9, 9, (200000, 4)).astype(np.int32)       # rows of 4: a line a thread
check("full argmax of a tall x.T", cufold.argmax(cuda.to_device(tall).T).copy_to_host(), tall.T.argmax())
# tuple values by key: every path
tk = rng.integers(0, 3000, n).astype(np.int32)
ones = np.ones(n, np.int64)
for alg in (None, "warp", "atomic", "grouped"):
    outs = (cuda.to_device(np.zeros(3000, np.int64)), cuda.to_device(np.zeros(3000)))
    cufold.reduce_by_key_into(cuda.to_device(tk), (cuda.to_device(ones), cuda.to_device(xd)), outs, algorithm=alg)
    check("tuple by key %s (count, sum)" % alg, outs[1].copy_to_host(), np.bincount(tk, xd, 3000), exact=False)
vmax = cuda.to_device(np.full(3000, -np.inf, np.float32)), cuda.to_device(np.zeros(3000, np.int64))
cufold.reduce_by_key_into(cuda.to_device(tk), df, vmax, cufold.argmax)
want_max = np.full(3000, -np.inf, np.float32)
np.maximum.at(want_max, tk, xf)
check("tuple by key packed argmax", vmax[0].copy_to_host(), want_max)
wf = tuple(cuda.to_device(np.zeros(3000)) for _ in range(3))
cufold.reduce_by_key_into(cuda.to_device(tk), cuda.to_device(xd), wf, cufold.welford)
check("tuple by key two-pass welford (count)", wf[0].copy_to_host(), np.bincount(tk, minlength=3000).astype(float))
sk = np.sort(tk)
outs = (cuda.to_device(np.zeros(3000, np.int64)), cuda.to_device(np.zeros(3000)))
cufold.reduce_by_key_into(cuda.to_device(sk), (cuda.to_device(ones), cuda.to_device(xd)), outs, algorithm="sorted")
check("tuple by key sorted (count, sum)", outs[1].copy_to_host(), np.bincount(sk, xd, 3000), exact=False)
xb = np.abs(x) % 300
for alg in cufold.algorithms("histogram"):
    check("bincount %s" % alg, cufold.bincount(cuda.to_device(xb), algorithm=alg).copy_to_host(), np.bincount(xb))
    for bins in (64, 1000):
        c, e = cufold.histogram(df, bins, range=(-2.0, 2.0), algorithm=alg)
        check("histogram %s %d bins" % (alg, bins), c.copy_to_host(), np.histogram(xf, bins, range=(-2.0, 2.0))[0])
edges = np.sort(rng.normal(size=33))
check("histogram edge array", cufold.histogram(df, edges)[0].copy_to_host(), np.histogram(xf, edges)[0])
# scans along axes and reversed (segments, lanes, tiles, columns), int32 -> int64 (pair states)
for shape, axis in [((3000, 16), 1), ((300, 1000), 1), ((4, 20000), 1), ((20000, 8), 0), ((700, 300), 0)]:
    h = rng.integers(-9, 9, shape).astype(np.int32)
    check("cumsum %s axis=%d" % (shape, axis), cufold.cumsum(cuda.to_device(h), axis=axis).copy_to_host(),
          np.cumsum(h, axis=axis))
    check("cumsum %s axis=%d reverse" % (shape, axis),
          cufold.cumsum(cuda.to_device(h), axis=axis, reverse=True).copy_to_host(),
          np.flip(np.cumsum(np.flip(h, axis), axis=axis), axis))
check("cumsum int32 -> int64", cufold.cumsum(d, dtype=np.int64).copy_to_host(), np.cumsum(x, dtype=np.int64))
# axis 0 of few columns: the column tiles' look-back (exclusive from init), and reduce_then_scan's 3 launches;
# the narrow columns' (3 columns: one look-back for all; float32: a packed word a tile, float64: wide states)
h = rng.integers(-9, 9, (50000, 5)).astype(np.int32)
check("exclusive_scan (50000, 5) axis=0 init=3 (column tiles)",
      cufold.exclusive_scan(cuda.to_device(h), init=3, axis=0).copy_to_host(), 3 + np.cumsum(h, axis=0) - h)
h3 = np.ascontiguousarray(h[:, :3])
check("exclusive_scan (50000, 3) axis=0 init=3 (narrow columns)",
      cufold.exclusive_scan(cuda.to_device(h3), init=3, axis=0).copy_to_host(), 3 + np.cumsum(h3, axis=0) - h3)
f3 = h3.astype(np.float32)
check("cumsum (50000, 3) float32 axis=0 reverse (narrow columns)",
      cufold.cumsum(cuda.to_device(f3), axis=0, reverse=True).copy_to_host(),
      np.flip(np.cumsum(np.flip(f3, 0), axis=0), 0))
d3 = h3.astype(np.float64) / 4
check("exclusive_scan (50000, 3) float64 axis=0 init=0.5 (narrow columns, wide states)",
      cufold.exclusive_scan(cuda.to_device(d3), init=0.5, axis=0).copy_to_host(), 0.5 + np.cumsum(d3, axis=0) - d3)
check("cumsum (50000, 5) axis=0 reduce_then_scan",
      cufold.cumsum(cuda.to_device(h), axis=0, algorithm="reduce_then_scan").copy_to_host(), np.cumsum(h, axis=0))
# axis 0 of many columns: the column strips (a block down each strip of 32, its carry in the block)
hs = rng.integers(-9, 9, (700, 4100)).astype(np.int32)
check("exclusive_scan (700, 4100) axis=0 init=3 (column strips)",
      cufold.exclusive_scan(cuda.to_device(hs), init=3, axis=0).copy_to_host(), 3 + np.cumsum(hs, axis=0) - hs)
# transform= fused into the axis scans' loads (segments, lanes, tiles, columns), reversed too; zipped inputs
for shape, axis in [((3000, 16), 1), ((300, 1000), 1), ((4, 20000), 1), ((20000, 8), 0), ((700, 300), 0)]:
    h = rng.integers(-9, 9, shape).astype(np.float32)
    for rev in (False, True):
        got = cufold.cumsum(cuda.to_device(h), axis=axis, reverse=rev, transform=lambda v: v * v).copy_to_host()
        want = np.flip(np.cumsum(np.flip(h * h, axis), axis=axis), axis) if rev else np.cumsum(h * h, axis=axis)
        check("cumsum %s axis=%d%s transform=v*v" % (shape, axis, " reverse" if rev else ""), got, want)
h = rng.integers(-9, 9, (3000, 40)).astype(np.float32)
check("cumsum x[:, ::2] transform=v*v (lanes)",
      cufold.cumsum(cuda.to_device(h)[:, ::2], axis=1, transform=lambda v: v * v).copy_to_host(),
      np.cumsum(h[:, ::2] ** 2, axis=1))
check("cumsum zipped (x, y) axis=1 transform=x*y",
      cufold.cumsum((cuda.to_device(h), cuda.to_device(h + 1)), axis=1, transform=lambda t: t[0] * t[1])
      .copy_to_host(), np.cumsum(h * (h + 1), axis=1))
# segmented scans and scans by key
offs = np.unique(np.concatenate([[0, n], rng.integers(0, n, 500)])).astype(np.int64)
seg_want = np.concatenate([np.cumsum(x[a:b]) for a, b in zip(offs[:-1], offs[1:])])
check("segmented_scan", cufold.segmented_scan(d, cuda.to_device(offs)).copy_to_host(), seg_want)
runs = np.repeat(np.arange(len(offs) - 1), np.diff(offs)).astype(np.int32)
check("inclusive_scan_by_key", cufold.inclusive_scan_by_key(cuda.to_device(runs), d).copy_to_host(), seg_want)
# reproducible sums, 1-D and segmented
check("sum gpu_to_gpu", cufold.sum(df, deterministic="gpu_to_gpu").copy_to_host(), xf.astype(np.float64).sum(),
      exact=False)
check("segmented sum gpu_to_gpu",
      cufold.segmented_reduce(df, cuda.to_device(offs), deterministic="gpu_to_gpu").copy_to_host(),
      np.add.reduceat(xf.astype(np.float64), offs[:-1]), exact=False)
# feature rows: by key (atomic rows, ordered rows), segments
fk = rng.integers(0, 500, 20000).astype(np.int64)
fv = rng.normal(size=(20000, 33)).astype(np.float32)
for det in (False, True):
    fo = cuda.to_device(np.zeros((500, 33), np.float32))
    cufold.reduce_by_key_into(cuda.to_device(fk), cuda.to_device(fv), fo, deterministic=det)
    want_rows = np.zeros((500, 33))
    np.add.at(want_rows, fk, fv)
    check("feature rows by key deterministic=%s" % det, fo.copy_to_host(), want_rows, exact=False)
# float32 sums of 4k features: a quad of features a lane, one 16-byte reduction (values' quads
# aligned: 16-byte loads too; a column off: scalar loads)
qv = rng.normal(size=(20000, 20)).astype(np.float32)
for name, view in (("load4", slice(0, 16)), ("scalar loads", slice(1, 17))):
    qo = cuda.to_device(np.zeros((500, 16), np.float32))
    cufold.reduce_by_key_into(cuda.to_device(fk), cuda.to_device(qv)[:, view], qo)
    want_rows = np.zeros((500, 16))
    np.add.at(want_rows, fk, qv[:, view])
    check("feature rows quads (%s)" % name, qo.copy_to_host(), want_rows, exact=False)
    # a float maximum's compare-and-swap rows a quad a lane, out's four words in one read
    # ('cas4'); the ordered rows' quad loads (grouped by key)
    qo = cuda.to_device(np.full((500, 16), -np.inf, np.float32))
    cufold.reduce_by_key_into(cuda.to_device(fk), cuda.to_device(qv)[:, view], qo, cufold.maximum)
    want_max = np.full((500, 16), -np.inf)
    np.maximum.at(want_max, fk, qv[:, view])
    check("feature rows quads maximum (%s)" % name, qo.copy_to_host(), want_max)
    qo = cuda.to_device(np.zeros((500, 16), np.float32))
    cufold.reduce_by_key_into(cuda.to_device(fk), cuda.to_device(qv)[:, view], qo, deterministic=True)
    check("feature rows quads deterministic (%s)" % name, qo.copy_to_host(), want_rows, exact=False)
# the default's adaptive feature rows (a float maximum, 2^16+ rows: the GPU picks atomic runs
# for sorted keys, grouped rows for shuffled ones; the other path's kernels return at once)
ak = np.sort(rng.integers(0, 500, 70000)).astype(np.int64)
av = rng.normal(size=(70000, 32)).astype(np.float32)
for order, keys_a in (("sorted", ak), ("shuffled", rng.permutation(ak))):
    ao = cuda.to_device(np.full((500, 32), -np.inf, np.float32))
    cufold.reduce_by_key_into(cuda.to_device(keys_a), cuda.to_device(av), ao, cufold.maximum)
    want_max = np.full((500, 32), -np.inf)
    np.maximum.at(want_max, keys_a, av)
    check("feature rows adaptive maximum, %s keys" % order, ao.copy_to_host(), want_max)
foff = np.array([0, 5, 5, 9000, 20000], np.int64)
check("feature rows segmented", cufold.segmented_reduce(cuda.to_device(fv), cuda.to_device(foff)).copy_to_host(),
      np.stack([fv[a:b].astype(np.float64).sum(axis=0) for a, b in zip(foff[:-1], foff[1:])]), exact=False)
# issue 20 part C: gpu_to_gpu of fused items (dot, norm, a transformed segmented sum), transforms on
# feature rows (atomic rows, ordered rows, CSR rows) and on tuple values by key (warp, cas, grouped)
yf = rng.normal(size=n).astype(np.float32)
dyf = cuda.to_device(yf)
check("dot gpu_to_gpu", cufold.dot(df, dyf, deterministic="gpu_to_gpu").copy_to_host(),
      np.dot(xf.astype(np.float64), yf), exact=False)
check("norm gpu_to_gpu", cufold.norm(df, deterministic="gpu_to_gpu").copy_to_host(),
      np.linalg.norm(xf.astype(np.float64)), exact=False)
check("segmented x*y gpu_to_gpu",
      cufold.segmented_reduce((df, dyf), cuda.to_device(offs), transform=lambda v: v[0] * v[1],
                              deterministic="gpu_to_gpu").copy_to_host(),
      np.add.reduceat(xf.astype(np.float64) * yf, offs[:-1]), exact=False)
for det in (False, True):
    fo = cuda.to_device(np.zeros((500, 33), np.float32))
    cufold.reduce_by_key_into(cuda.to_device(fk), cuda.to_device(fv), fo, deterministic=det, transform=abs)
    want_rows = np.zeros((500, 33))
    np.add.at(want_rows, fk, np.abs(fv))
    check("feature rows |v| by key deterministic=%s" % det, fo.copy_to_host(), want_rows, exact=False)
check("feature rows segmented v*v",
      cufold.segmented_reduce(cuda.to_device(fv), cuda.to_device(foff), transform=lambda v: v * v).copy_to_host(),
      np.stack([(fv[a:b].astype(np.float64) ** 2).sum(axis=0) for a, b in zip(foff[:-1], foff[1:])]), exact=False)
for alg in ("warp", "grouped"):
    outs = (cuda.to_device(np.zeros(3000)), cuda.to_device(np.zeros(3000)))
    cufold.reduce_by_key_into(cuda.to_device(tk), (cuda.to_device(xd), cufold.counting(n, dtype=np.float64)), outs,
                              algorithm=alg, transform=lambda v: (v[0] * v[0], v[1]))
    check("tuple by key %s transform (sum x^2)" % alg, outs[0].copy_to_host(), np.bincount(tk, xd * xd, 3000),
          exact=False)
best = cuda.to_device(np.full(3000, -np.inf, np.float32)), cuda.to_device(np.full(3000, -1, np.int32))
cufold.reduce_by_key_into(cuda.to_device(tk), (df, cufold.counting(n, dtype=np.int32)), best, cufold.argmax,
                          algorithm="cas", transform=lambda v: (abs(v[0]), v[1]))
want_abs = np.full(3000, -np.inf, np.float32)
np.maximum.at(want_abs, tk, np.abs(xf))
check("tuple by key cas argmax |x| (transform)", best[0].copy_to_host(), want_abs)
# means of thin rows (a thread a row, compensated float32)
zt = rng.normal(size=(40_001, 4)).astype(np.float32)
check("axis thin rows mean", cufold.mean(cuda.to_device(zt), axis=1).copy_to_host(), zt.mean(axis=1), exact=False)
# distributed's rank fold ("p2p"), every rank's operand local here: 3 ranks of affine pairs, rank order
from cufold import distributed as _cd  # noqa: E402
from cufold.host import arrays as _ha  # noqa: E402
affine = cufold.Op(lambda p, q: (p[0] * q[0], p[1] * q[0] + q[1]))
nr = 70_001
fa, fb = rng.uniform(0.5, 1.5, (3, nr)), rng.normal(size=(3, nr))
src_dev = [cuda.to_device(f[r]) for r in range(3) for f in (fa, fb)]
out_dev = [cuda.to_device(np.full(nr, np.nan)) for _ in range(2)]
srcs, outs = [_ha.describe(a) for a in src_dev], [_ha.describe(a) for a in out_dev]
_cd._fold_ranks(affine, 3, srcs, outs, _ha.stream_handle(outs[0]))
wa, wb = fa[0], fb[0]
for r in (1, 2):
    wa, wb = wa * fa[r], wb * fa[r] + fb[r]
check("distributed rank fold (affine, 3 ranks)", out_dev[1].copy_to_host(), wb, exact=False)
cuda.synchronize()
print("FAILURES: %d" % failures)
sys.exit(1 if failures else 0)
