"""reduce_by_key_into of tuple values (cufold.device.bykey_tuple) against NumPy.

Field-wise operators against ``np.add.at``/``np.minimum.at``/``np.maximum.at`` per field,
argmin/argmax against a loop (ties: the first position; NaN wins as ``numpy.argmax``),
welford against each group's mean and variance (and values near 1e6 with spread 1), user
operators (a non-commutative one against the sequential fold), every path, every key width,
keys nothing reaches, bad keys and bad arguments. ``out`` always starts poisoned with random
values: it is an operand of the reduction.

Run: PYTHONPATH=src python -m pytest tests/test_bykey_tuple.py -q
"""

import numpy as np
import pytest
from numba import cuda

from conftest import SIMULATOR

import cufold
from cufold.device import bykey as BK, bykey_tuple as BT

# Simulator: 333 items are 3 by-key tiles of 64 x 2 (the last partial), 2 of the 256-item
# runs2/adaptive tiles, and more than one pass of the 4 x 64-thread per-item kernels.
N, M = (333, 50) if SIMULATOR else (100_000, 3000)
INT_KEYS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def host(outs):
    return tuple(o.copy_to_host() for o in outs)


def make_keys(rng, n=N, m=M, order="random"):
    """Power-law key frequencies over ``[0, m - 5)`` (the last 5 keys: nothing reaches them)."""
    keys = np.minimum((rng.pareto(1.2, n) * 3).astype(np.int64), m - 6)
    keys = rng.permutation(m - 5)[keys]
    return np.sort(keys) if order == "sorted" else keys


def call(keys, values, outs, op, **kw):
    d_outs = tuple(dev(o) for o in outs)
    d_vals = tuple(dev(v) for v in values) if isinstance(values, tuple) else dev(values)
    got = BK.reduce_by_key_into(dev(keys), d_vals, d_outs, op, **kw)
    assert got is d_outs
    return host(d_outs)


PATHS = [(None, False, "random"), (None, False, "sorted"), ("warp", False, "random"), ("warp", False, "sorted"),
         ("atomic", False, "random"), (None, True, "random"), ("sorted", True, "sorted")]


def assert_per_field(got, outs, keys, vals, ufuncs):
    """Field ``f`` of ``got`` is ``outs[f]`` with ``vals[f]`` folded in by key with
    ``ufuncs[f].at`` (cast to the field's dtype first), exactly."""
    for f, (v, uf) in enumerate(zip(vals, ufuncs)):
        ref = outs[f].copy()
        uf.at(ref, keys, v.astype(ref.dtype))
        np.testing.assert_array_equal(got[f], ref)


# --- field-wise ----------------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm,deterministic,order", PATHS)
def test_count_and_sums_per_field(algorithm, deterministic, order, rng):
    """A count and three float64 sums in one call: np.add.at per field."""
    keys = make_keys(rng, order=order)
    vals = (np.ones(N, np.int64), rng.normal(size=N), rng.normal(size=N), rng.integers(-9, 9, N).astype(np.float32))
    outs = (rng.integers(0, 5, M), rng.normal(size=M), rng.normal(size=M), rng.normal(size=M))
    got = call(keys, vals, outs, cufold.plus, algorithm=algorithm, deterministic=deterministic)
    for f in range(4):
        ref = outs[f].copy()
        np.add.at(ref, keys, vals[f].astype(ref.dtype))
        np.testing.assert_allclose(got[f], ref, rtol=1e-12, atol=1e-12)
        assert np.array_equal(got[f][-5:], outs[f][-5:])          # nothing reaches them: as given
    if deterministic:          # the same bits again
        again = call(keys, vals, outs, cufold.plus, algorithm=algorithm, deterministic=True)
        assert all(np.array_equal(a, b) for a, b in zip(got, again))


@pytest.mark.parametrize("key_dtype", INT_KEYS)
def test_key_dtypes(key_dtype, rng):
    m = 100 if np.dtype(key_dtype).itemsize == 1 else M
    keys = make_keys(rng, m=m).astype(key_dtype)
    vals = (rng.integers(-50, 50, N).astype(np.int32), rng.normal(size=N))
    outs = (rng.integers(0, 9, m).astype(np.int64), rng.normal(size=m))
    got = call(keys, vals, outs, cufold.plus)
    for f in range(2):
        ref = outs[f].copy()
        np.add.at(ref, keys.astype(np.int64), vals[f].astype(ref.dtype))
        np.testing.assert_allclose(got[f], ref, rtol=1e-12)


@pytest.mark.parametrize("algorithm,order", [("adaptive", "random"), ("adaptive", "sorted"), ("sorted", "sorted")])
def test_min_max_minmax_with_nan(algorithm, order, rng):
    keys = make_keys(rng, order=order)
    x = rng.normal(size=N).astype(np.float32)
    x[rng.integers(0, N, 5)] = np.nan
    y = rng.integers(-1000, 1000, N).astype(np.int32)
    outs = (rng.normal(size=M).astype(np.float32), rng.integers(-9, 9, M).astype(np.int64))
    for op, uf in ((cufold.minimum, np.minimum), (cufold.maximum, np.maximum)):
        got = call(keys, (x, y), outs, op, algorithm=algorithm)
        assert_per_field(got, outs, keys, (x, y), (uf, uf))
    lo, hi = rng.normal(size=M).astype(np.float32), rng.normal(size=M).astype(np.float32)
    got = call(keys, (x, x), (lo, hi), cufold.minmax, algorithm=algorithm)
    assert_per_field(got, (lo, hi), keys, (x, x), (np.minimum, np.maximum))


# --- argmin / argmax -----------------------------------------------------------------------------

def arg_reference(keys, x, positions, prior_v, prior_p, largest):
    """A loop: the first position among the largest (smallest) values, NaN first; the prior
    (value, position) of out is one more candidate."""
    rv, rp = prior_v.copy(), prior_p.copy()
    for k in range(rv.size):
        cand = [(rv[k], rp[k])] + [(x[i], positions[i]) for i in np.flatnonzero(keys == k)]
        nans = [c for c in cand if c[0] != c[0]]
        if nans:
            best = min(nans, key=lambda c: c[1])
        else:
            top = max(c[0] for c in cand) if largest else min(c[0] for c in cand)
            best = min((c for c in cand if c[0] == top), key=lambda c: c[1])
        rv[k], rp[k] = best
    return rv, rp


ARG_PATHS = [("packed", False, np.float32), (None, True, np.float32), ("sorted", False, np.float32),
             (None, False, np.float64), ("packed", False, np.int32)]


@pytest.mark.parametrize("op", [cufold.argmax, cufold.argmin], ids=["argmax", "argmin"])
@pytest.mark.parametrize("algorithm,deterministic,dtype", ARG_PATHS)
def test_argmin_argmax_ties_and_nan(op, algorithm, deterministic, dtype, rng):
    keys = make_keys(rng, order="sorted" if algorithm == "sorted" else "random")
    x = rng.integers(-3, 4, N).astype(dtype)          # many ties
    if dtype != np.int32:
        x[rng.integers(0, N, 6)] = np.nan
        x[rng.integers(0, N, 6)] = -0.0
    largest = op is cufold.argmax
    prior_v = rng.integers(-3, 4, M).astype(dtype)
    if dtype != np.int32:
        prior_v[:3] = np.nan
    prior_p = rng.integers(0, N, M).astype(np.int64)
    got = call(keys, x, (prior_v, prior_p), op, algorithm=algorithm, deterministic=deterministic)
    rv, rp = arg_reference(keys, x, np.arange(N), prior_v, prior_p, largest)
    np.testing.assert_array_equal(got[0], rv)
    np.testing.assert_array_equal(got[1], rp)
    # positions given as a second field (int32: the packed word; int64: a grouped path)
    pos = rng.permutation(N).astype(np.int32)
    got = call(keys, (x, pos), (prior_v, prior_p.astype(np.int32)), op, algorithm=algorithm,
               deterministic=deterministic)
    rv, rp = arg_reference(keys, x, pos, prior_v, prior_p.astype(np.int32), largest)
    np.testing.assert_array_equal(got[0], rv)
    np.testing.assert_array_equal(got[1], rp)


@pytest.mark.parametrize("rows", ["warp", "atomic"])
def test_inner_rows_of_packed_and_two_pass(rows, monkeypatch, rng):
    """``CUFOLD_BYKEY_TUPLE_ROWS``: the packed and two-pass scatters by peers or per element."""
    monkeypatch.setenv("CUFOLD_BYKEY_TUPLE_ROWS", rows)
    BK.plan.cache_clear()
    try:
        keys = make_keys(rng, order="sorted")
        x = rng.integers(-3, 4, N).astype(np.float32)
        prior = (np.full(M, -np.inf, np.float32), np.full(M, -1, np.int64))
        got = call(keys, x, prior, cufold.argmax)
        rv, rp = arg_reference(keys, x, np.arange(N), *prior, True)
        np.testing.assert_array_equal(got[0], rv)
        np.testing.assert_array_equal(got[1], rp)
        zeros = tuple(np.zeros(M) for _ in range(3))
        got = call(keys, x, zeros, cufold.welford)
        ref = welford_reference(keys, x, zeros)
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
    finally:
        monkeypatch.delenv("CUFOLD_BYKEY_TUPLE_ROWS")
        BK.plan.cache_clear()


def test_argmax_from_identity_and_paths_chosen(rng):
    """Out starting at the identity gives each key's (max, first argmax); the automatic
    choice per operator."""
    keys = make_keys(rng)
    x = rng.normal(size=N).astype(np.float32)
    ident = cufold.argmax.identity_for(cufold.ValueType.of((np.float32, np.int64)))
    got = call(keys, x, (np.full(M, ident[0], np.float32), np.full(M, ident[1], np.int64)), cufold.argmax)
    for k in np.unique(keys)[:20]:
        idx = np.flatnonzero(keys == k)
        assert got[1][k] == idx[np.argmax(x[idx])] and got[0][k] == x[idx].max()
    assert got[1][-1] == ident[1]
    vt = cufold.ValueType.of
    f32, f64, i64 = np.float32, np.float64, np.int64
    assert BT.path_for(cufold.argmax, vt((f32, i64)), vt((f32, i64)), "index", N, None, False) == "packed"
    assert BT.path_for(cufold.argmax, vt((f64, i64)), vt((f64, i64)), "index", N, None, False) == "grouped"
    assert BT.path_for(cufold.plus, vt((f64, f64)), vt((f64, f64)), "none", N, None, False) == "adaptive"
    assert BT.path_for(cufold.plus, vt((f64, f64)), vt((f64, f64)), "none", N, None, True) == "grouped"
    assert BT.path_for(cufold.plus, vt((i64, i64)), vt((i64, i64)), "none", N, None, True) == "adaptive"
    assert BT.path_for(cufold.welford, vt((f64,) * 3), vt((f64,) * 3), "welford", N, None, False) == "two_pass"
    assert BT.path_for(cufold.minmax, vt((f32, f32)), vt((f32, f32)), "none", N, None, False) == "adaptive"
    assert BT.path_for(SUM_MAX, vt((i64, i64)), vt((i64, i64)), "none", N, None, False) == "grouped"
    assert BT.path_for(SUM_MAX32, vt((f32, np.int32)), vt((f32, np.int32)), "none", N, None, False) == "cas"


# --- welford -------------------------------------------------------------------------------------

def welford_reference(keys, x, prior):
    c0, m0, q0 = (p.astype(np.float64).copy() for p in prior)
    for k in range(c0.size):
        v = x[keys == k].astype(np.float64)
        if not v.size:
            continue
        c1, m1 = v.size, v.mean()
        q1 = np.sum((v - m1) ** 2)
        c = c0[k] + c1
        d = m1 - m0[k]
        c0[k], m0[k], q0[k] = c, m0[k] + d * c1 / c, q0[k] + q1 + d * d * c0[k] * c1 / c
    return c0, m0, q0


@pytest.mark.parametrize("algorithm,deterministic,order", [(None, False, "random"), (None, True, "random"),
                                                         ("sorted", False, "sorted")])
def test_welford_mean_and_variance(algorithm, deterministic, order, rng):
    keys = make_keys(rng, order=order)
    x = rng.normal(3, 2, N)
    prior = (rng.integers(0, 3, M).astype(np.float64), rng.normal(size=M), rng.random(M))
    prior[2][prior[0] == 0] = 0
    got = call(keys, x, prior, cufold.welford, algorithm=algorithm, deterministic=deterministic)
    ref = welford_reference(keys, x, prior)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-10, atol=1e-10)
    assert all(np.array_equal(g[-5:], p[-5:]) for g, p in zip(got, prior))


@pytest.mark.parametrize("algorithm", ["two_pass", "grouped"])
def test_welford_near_1e6_is_accurate(algorithm, rng):
    """Values 1e6 +- 1: the sum-of-squares form loses every digit in float64 (1e12 against
    a spread of 1); the variance must be right to 1e-6."""
    keys = make_keys(rng)
    x = 1e6 + rng.uniform(-1, 1, N)
    zeros = tuple(np.zeros(M) for _ in range(3))
    count, mean, m2 = call(keys, x, zeros, cufold.welford, algorithm=algorithm)
    for k in np.flatnonzero(count >= 2):
        v = x[keys == k]
        assert abs(m2[k] / count[k] - v.var()) <= 1e-6 * v.var()
        assert abs(mean[k] - v.mean()) <= 1e-12 * v.mean()


# --- user operators --------------------------------------------------------------------------------

AFFINE = cufold.Op(lambda a, b: (a[0] * b[0], a[1] * b[0] + b[1]), identity=(1.0, 0.0), name="affine")
SUM_MAX = cufold.Op(lambda a, b: (a[0] + b[0], max(a[1], b[1])), identity=lambda vt: (0, np.iinfo(np.int64).min),
                    commutative=True, name="sum_max")


@pytest.mark.parametrize("algorithm", [None, "sorted"])
def test_user_operators(algorithm, rng):
    """A non-commutative operator folds each key in input order after out's value; a
    commutative one with an identity."""
    keys = make_keys(rng, order="sorted" if algorithm == "sorted" else "random")
    a, b = rng.uniform(0.9, 1.1, N), rng.normal(size=N)
    outs = (rng.uniform(0.9, 1.1, M), rng.normal(size=M))
    got = call(keys, (a, b), outs, AFFINE, algorithm=algorithm)
    r0, r1 = outs[0].copy(), outs[1].copy()
    for i in range(N):
        k = keys[i]
        r0[k], r1[k] = r0[k] * a[i], r1[k] * a[i] + b[i]
    np.testing.assert_allclose(got[0], r0, rtol=1e-12)
    np.testing.assert_allclose(got[1], r1, rtol=1e-10, atol=1e-12)
    c, d = rng.integers(-5, 5, N), rng.integers(-10**12, 10**12, N)
    outs = (rng.integers(-5, 5, M), rng.integers(-10**12, 10**12, M))
    got = call(keys, (c, d), outs, SUM_MAX, algorithm=algorithm)
    assert_per_field(got, outs, keys, (c, d), (np.add, np.maximum))




SUM_MAX32 = cufold.Op(lambda a, b: (a[0] + b[0], max(a[1], b[1])),
                      identity=lambda vt: (0, np.iinfo(np.int32).min), commutative=True, name="sum_max32")


@pytest.mark.parametrize("algorithm,order", [(None, "random"), (None, "sorted"), ("grouped", "random")])
def test_compare_and_swap_on_64_bit_tuples(algorithm, order, rng):
    """A (float32, int32) user operator packs into one word: a CAS loop per update (the
    default); out's bits stay where nothing reaches (NaN, -0.0)."""
    keys = make_keys(rng, order=order)
    a, c = rng.integers(-8, 8, N).astype(np.float32), rng.integers(-10**9, 10**9, N).astype(np.int32)
    outs = (rng.integers(-8, 8, M).astype(np.float32), rng.integers(-10**9, 10**9, M).astype(np.int32))
    outs[0][-2:] = [np.nan, -0.0]
    got = call(keys, (a, c), outs, SUM_MAX32, algorithm=algorithm)
    assert_per_field(got, outs, keys, (a, c), (np.add, np.maximum))
    assert np.signbit(got[0][-1]) and np.isnan(got[0][-2])
    keys[7] = M
    with pytest.raises(IndexError, match="key %d at position 7 is out of range" % M):
        call(keys, (a, c), outs, SUM_MAX32, algorithm=algorithm)


# --- bad keys, empty input, errors ----------------------------------------------------------------

@pytest.mark.parametrize("op,algorithm", [(cufold.plus, "adaptive"), (cufold.argmax, "packed"),
                                          (cufold.welford, "two_pass"), (cufold.plus, "grouped"),
                                          (cufold.plus, "sorted")])
def test_out_of_range_keys(op, algorithm, rng):
    keys = make_keys(rng, order="sorted" if algorithm == "sorted" else "random")
    if algorithm == "sorted":
        keys[:3], keys[-4:] = -2, M + 7
    else:
        keys[[5, 77, 300]] = [-1, M, 10**6]
    x = rng.normal(size=N)
    if op is cufold.plus:
        values, outs = (x, x * 2), (rng.normal(size=M), rng.normal(size=M))
    elif op is cufold.argmax:
        values, outs = x.astype(np.float32), (rng.normal(size=M).astype(np.float32), rng.integers(0, N, M))
    else:
        values, outs = x, tuple(np.zeros(M) for _ in range(3))
    with pytest.raises(IndexError, match="out of range for out of length %d" % M):
        call(keys, values, outs, op, algorithm=algorithm)
    got = call(keys, values, outs, op, algorithm=algorithm, check=False)     # bad keys skipped
    if op is cufold.plus:
        good = (keys >= 0) & (keys < M)
        ref = [o.copy() for o in outs]
        for r, v in zip(ref, values):
            np.add.at(r, keys[good], v[good])
    elif op is cufold.argmax:
        ref = arg_reference(keys, values, np.arange(N), outs[0], outs[1], True)
    else:
        ref = welford_reference(keys, values, outs)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def test_sorted_needs_sorted_keys(rng):
    keys = make_keys(rng)
    with pytest.raises(ValueError, match="algorithm='sorted' on tuple values needs keys sorted"):
        call(keys, (np.ones(N), np.ones(N)), (np.zeros(M), np.zeros(M)), cufold.plus, algorithm="sorted")


@pytest.mark.parametrize("algorithm", [None, "grouped", "sorted", "packed"])
def test_empty_input(algorithm):
    outs = (np.arange(M, dtype=np.float32), np.arange(M, dtype=np.int64))
    got = call(np.zeros(0, np.int32), np.zeros(0, np.float32), outs, cufold.argmax, algorithm=algorithm)
    assert all(np.array_equal(g, o) for g, o in zip(got, outs))


def test_argument_errors(rng):
    k = dev(np.zeros(10, np.int32))
    f64, f32, i64 = dev(np.zeros(10)), dev(np.zeros(10, np.float32)), dev(np.zeros(10, np.int64))
    o64, o32, oi32, oi8 = dev(np.zeros(4)), dev(np.zeros(4, np.float32)), dev(np.zeros(4, np.int32)), \
        dev(np.zeros(4, np.int8))
    into = BK.reduce_by_key_into
    with pytest.raises(ValueError, match="out has 3 field.* values has 2"):
        into(k, (f64, f64), (o64, o64, o64))
    with pytest.raises(ValueError, match="out has 2 field.* values has 1"):
        into(k, f64, (o64, o64), cufold.plus)
    with pytest.raises(ValueError, match="must be equally long"):
        into(k, (f64, dev(np.zeros(9))), (o64, o64))
    with pytest.raises(ValueError, match="must be equally long"):
        into(k, (f64, f64), (o64, dev(np.zeros(5))))
    with pytest.raises(ValueError, match="keys and values must be equally long"):
        into(dev(np.zeros(11, np.int32)), (f64, f64), (o64, o64))
    with pytest.raises(TypeError, match=r"out\[1\] of dtype float32 cannot hold values of dtype float64"):
        into(k, (f64, f64), (o64, o32))
    with pytest.raises(TypeError, match=r"out\[0\] of dtype int32 cannot hold values of dtype int64"):
        into(k, (i64, f64), (oi32, o64))
    with pytest.raises(TypeError, match="cannot hold the position"):
        into(dev(np.zeros(300, np.int32)), dev(np.zeros(300, np.float32)), (o32, oi8), cufold.argmax)
    with pytest.raises(TypeError, match="welford by key needs floating-point"):
        into(k, f32, (o64, o64, dev(np.zeros(4, np.int64))), cufold.welford)
    with pytest.raises(ValueError, match="algorithm 'runs2' does not take tuple values"):
        into(k, (f64, f64), (o64, o64), algorithm="runs2")
    with pytest.raises(ValueError, match="algorithm 'packed' cannot reduce"):
        into(k, f64, (o64, dev(np.zeros(4, np.int64))), cufold.argmax, algorithm="packed")
    with pytest.raises(ValueError, match="deterministic=True needs algorithm='sorted'"):
        into(k, (f64, f64), (o64, o64), algorithm="warp", deterministic=True)
    with pytest.raises(ValueError, match="needs a commutative"):
        into(k, (f64, f64), (o64, o64), AFFINE, algorithm="warp")
    with pytest.raises(TypeError, match=r"out\[0\] .*host|NumPy"):
        into(k, (f64, f64), (np.zeros(4), np.zeros(4)))


# --- the benchmark (python -m cufold bench bykey-tuple) ------------------------------------------

def test_bench_end_to_end(tmp_path):
    """Every candidate on tiny shapes in the simulator (the peers skip without torch), checked
    against NumPy, timed by the wall clock; targets and the accuracy line."""
    import io
    from test_bykey import _HostBackend
    from cufold import bench
    from cufold.bench import backends, bykey_tuple as BTB, report
    from cufold.bench.timing import Settings
    text = io.StringIO()
    assert bench.main(["bykey-tuple", "--dry-run"], stdout=text, stderr=io.StringIO()) == 0
    assert "cufold argmax by key" in text.getvalue() and "estimate:" in text.getvalue()
    assert bench.main(["bykey-tuple", "--tasks", "nope"], stdout=io.StringIO(), stderr=io.StringIO()) == 2
    env = backends.Env()
    env.modules["cufold"] = cufold
    settings = Settings(target_s=1e-4, min_reps=1, max_reps=2, warmup=0, est_reps=1, max_case_s=5)
    cands = [c for c in BTB.candidates() if "[" not in c.label]      # the grouped paths: tested above
    res = BTB.run(env, _HostBackend(), ["shuffled", "sorted"], list(BTB.TASKS), 200, 40, settings, progress=False,
                  cands=cands)
    by = {(r["case"], r["label"]): r for r in res["records"]}
    for order in ("shuffled", "sorted"):
        for label in (BTB.ARGMAX, BTB.MAX1, BTB.SUMS1, BTB.SUMS4, BTB.WELFORD):
            assert by[(order, label)]["status"] == "ok", by[(order, label)]
            assert by[(order, label)]["gpu_us"] > 0
        assert by[(order, BTB.TORCH_W)]["status"] == "skipped"
    out = BTB.format_results(res)
    assert "== sorted keys" in out and "targets (bykey-tuple):" in out
    evals = {e["name"]: e for e in BTB.evaluate(res)}
    assert evals["shuffled: count+3 sums, 4 calls / one call"]["status"] in ("PASS", "MISS")
    assert evals["welford near 1e6 +- 1: variance relative error"]["status"] == "PASS"
    assert report.load_json(report.write_json(res, str(tmp_path / "r.json")))["meta"]["n"] == 40


@pytest.mark.parametrize("op,algorithm", [(cufold.plus, "warp"), (cufold.plus, "grouped"), (cufold.argmax, "packed")])
def test_empty_out(op, algorithm):
    """len(out) == 0: every key is bad (reported with check=True, skipped without)."""
    keys, x = np.arange(40, dtype=np.int32), np.ones(40, np.float32)
    values = (x, x) if op is cufold.plus else x
    outs = (np.zeros(0, np.float32), np.zeros(0, np.float32 if op is cufold.plus else np.int64))
    with pytest.raises(IndexError, match="key 0 at position 0 is out of range for out of length 0"):
        call(keys, values, outs, op, algorithm=algorithm)
    got = call(keys, values, outs, op, algorithm=algorithm, check=False)
    assert all(g.size == 0 for g in got)


@pytest.mark.parametrize("op", [cufold.argmax, cufold.argmin], ids=["argmax", "argmin"])
@pytest.mark.parametrize("kept", [True, False], ids=["kept-words", "filled-words"])
def test_packed_words_start_empty_on_every_call(op, kept, monkeypatch, rng):
    """The packed words are reset by each call's finishing pass (kept scratch) or filled
    first (above ``KEPT_WORDS_MAX`` keys): a later call on other keys sees none of the
    first call's (large) values."""
    monkeypatch.setattr(BT, "KEPT_WORDS_MAX", M if kept else M - 1)
    BT._programs_by_key.clear()                  # plans made under the other setting
    largest = op is cufold.argmax
    try:
        for scale in (1000, 1, 1):
            keys = make_keys(rng)
            x = rng.normal(size=N).astype(np.float32) * scale
            prior = (np.full(M, -np.inf if largest else np.inf, np.float32), np.full(M, -1, np.int64))
            got = call(keys, x, prior, op, algorithm="packed")
            rv, rp = arg_reference(keys, x, np.arange(N), *prior, largest)
            np.testing.assert_array_equal(got[0], rv)
            np.testing.assert_array_equal(got[1], rp)
    finally:
        BT._programs_by_key.clear()
