"""cufold.bench: the pure-Python parts, on the CPU (no GPU, torch or CuPy needed).

The runner is exercised end to end with a NumPy "backend" (host arrays as
device arrays, a wall clock as the event clock); one test drives real cufold
calls through Numba (the simulator on a machine without a GPU).
"""

import datetime
import inspect
import io
import json
import os
import re

import numpy as np
import pytest

from cufold import bench
from cufold.bench import backends as B
from cufold.bench import report as R
from cufold.bench import runner as RU
from cufold.bench import suites as S
from cufold.bench import timing as T


# --- sizes, rotation, reps ---------------------------------------------------------
def test_parse_sizes():
    assert T.parse_sizes("10:28") == list(range(10, 29))
    assert T.parse_sizes("10:28:2") == list(range(10, 29, 2))
    assert T.parse_sizes("20,10,16,10") == [10, 16, 20]
    assert T.parse_sizes("10:12,2^20, 2**24") == [10, 11, 12, 20, 24]
    assert T.parse_sizes([12, 10]) == [10, 12]
    for bad in ("abc", "28:10", "40", "10:12:0", "1:2:3:4", ""):
        with pytest.raises(ValueError, match="cufold bench"):
            T.parse_sizes(bad)


def test_parse_list():
    assert T.parse_list(None) is None
    assert T.parse_list(" a, b,,c ") == ["a", "b", "c"]
    assert T.parse_list(",") is None


def test_rotation_count():
    l2 = 50 << 20
    assert T.rotation_count(4 << 10, l2) == 64                      # capped: L2-resident
    assert T.rotation_count(4 << 10, l2, cap=8) == 8
    assert T.rotation_count(1 << 30, l2) == 1                       # one buffer >> L2
    for nbytes in (1 << 20, 4 << 20, 16 << 20, 40 << 20, 150 << 20, 151 << 20):
        k = T.rotation_count(nbytes, l2)
        if k < 64:
            assert k * nbytes > 3 * l2                              # rotation exceeds 3x L2
            assert k == 1 or (k - 1) * nbytes <= 3 * l2             # ... with no buffer to spare
    assert T.rotation_count(4 << 20, None) == T.rotation_count(4 << 20, T.DEFAULT_L2_BYTES)
    assert T.rotation_note(64, 4096, l2).startswith("L2-resident")
    assert T.rotation_note(1, 1 << 30, l2) == ""


def test_choose_reps_and_calls():
    kw = dict(target_s=0.25, min_reps=20, max_reps=2000, max_total_s=2.0)
    assert T.choose_reps(1e-6, **kw) == 2000            # tiny: capped
    assert T.choose_reps(1e-3, **kw) == 250             # target time
    assert T.choose_reps(0.05, **kw) == 20              # min reps (1 s < 2 s)
    assert T.choose_reps(0.2, **kw) == 10               # slow: fewer than min reps
    assert T.choose_reps(5.0, **kw) == 3                # never below the floor
    assert T.choose_reps(0, **kw) == 2000
    assert T.choose_calls(5e-6, 0.08, 100, 20000) == 16000
    assert T.choose_calls(1.0, 0.08, 100, 20000) == 100


def test_summarize():
    s = T.summarize([3, 1, 2, 10])
    assert s["median"] == 2.5 and s["min"] == 1 and s["max"] == 10 and s["n"] == 4
    assert s["p10"] == pytest.approx(1.3)
    assert T.summarize([])["median"] is None


def test_settings_quick_and_overrides():
    q = T.Settings.quick()
    assert q.target_s < T.Settings().target_s and q.min_reps < 20
    argv = ["reduce", "--quick", "--min-reps", "7", "--call-max", "18", "--no-raw"]
    args = bench.build_parser().parse_args(argv)
    s = bench._settings(args)
    assert s.min_reps == 7 and s.call_max_log2 == 18 and s.raw is False and s.target_s == q.target_s


# --- data and checks ----------------------------------------------------------------
def test_generate_grid_is_exact_in_float32():
    (x,) = S.generate("float32", "grid", 1 << 16, 1, seed=1)
    assert x.dtype == np.float32 and x.min() >= -1 and x.max() <= 1
    assert abs(float(np.mean(x, dtype=np.float64))) < 0.02                # zero mean: no drift
    assert np.all(x * 256 == np.round(x * 256))
    # any order gives the exact sum: sequential float32 == float64
    assert float(np.cumsum(x, dtype=np.float32)[-1]) == float(np.sum(x, dtype=np.float64))
    bufs = S.generate("int32", "grid", 1000, 3, seed=2)
    assert len(bufs) == 3 and all(b.dtype == np.int32 and b.min() == -8 and b.max() == 8 for b in bufs)
    assert not np.array_equal(bufs[0], bufs[1])
    (u,) = S.generate("float32", "uniform", 1000, 1, seed=3)
    assert np.any(u * 256 != np.round(u * 256))


def _cctx(kind, x, idx=None):
    return S.CheckCtx(S.reference(kind, x), x, idx, x.size, x.dtype)


def test_checks():
    (x,) = S.generate("float32", "grid", 4096, 1, seed=4)
    c = _cctx("sum", x)
    assert S.check_sum(np.float32(np.sum(x, dtype=np.float64)), c)[0]
    assert not S.check_sum(np.float32(np.sum(x[:-512], dtype=np.float64) + 7), c)[0]
    assert not S.check_sum(np.float32("nan"), c)[0]
    xi = x.astype(np.int32)
    assert S.check_sum(np.int64(xi.sum()), _cctx("sum", xi))[0]
    assert not S.check_sum(np.int64(xi.sum() + 1), _cctx("sum", xi))[0]

    sc = _cctx("scan", x)
    good = np.cumsum(x, dtype=np.float32)
    assert S.check_scan(good, sc)[0]
    bad = good.copy()
    bad[100] += 1
    ok, note = S.check_scan(bad, sc)
    assert not ok and "first at 100" in note
    idx = np.array([0, 5, 4095])
    assert S.check_scan(good[idx], _cctx("scan", x, idx))[0]

    xa = np.array([0.5, 0.9, -1, 0.9], dtype=np.float32)
    ac = _cctx("argmax", xa)
    assert S.check_argmax(np.int64(1), ac) == (True, "")
    ok, note = S.check_argmax(np.int64(3), ac)
    assert ok and "tie" in note
    assert not S.check_argmax(np.int64(0), ac)[0]
    assert not S.check_argmax(np.int64(9), ac)[0]
    assert S.check_argmax((np.float32(0.9), np.int64(1)), ac)[0]

    (u,) = S.generate("float32", "uniform", 4096, 1, seed=5)
    mc = _cctx("mean_var", u)
    u64 = u.astype(np.float64)
    m, v0, v1 = float(u64.mean()), float(u64.var()), float(u64.var(ddof=1))
    assert S.check_mean_var((m, v0), mc) == (True, "")
    assert S.check_mean_var((m, v1), mc)[0]
    assert not S.check_mean_var((v0, m), mc)[0]                 # wrong order
    assert S.check_mean_var(S._swap((v1, m)), mc)[0]            # torch.var_mean's order, canonicalized

    assert S.check_copy(x.copy(), _cctx("sum", x))[0]


def test_sample_indices():
    assert S.sample_indices(1 << 20) is None
    idx = S.sample_indices(1 << 24)
    assert idx[0] == 0 and idx[-1] == (1 << 24) - 1 and np.all(np.diff(idx) > 0)


# --- peers missing --------------------------------------------------------------------
def _importer(missing):
    import importlib

    def imp(name):
        if any(name == m or name.startswith(m + ".") for m in missing):
            raise ModuleNotFoundError("No module named %r" % name)
        return importlib.import_module(name)
    return imp


def test_cupy_accelerators_spec():
    assert B.parse_cupy_accelerators("cub") == (["cub"], ["cub"])
    assert B.parse_cupy_accelerators(None) == (["cub"], ["cub"])
    assert B.parse_cupy_accelerators("cub:none") == (["cub"], [])
    assert B.parse_cupy_accelerators("none") == ([], [])
    for bad in ("cub:cub:cub", "fast"):
        with pytest.raises(ValueError):
            B.parse_cupy_accelerators(bad)


def test_probe_reports_missing_peers():
    env = B.probe(importer=_importer({"torch", "cupy", "cuda"}))
    assert env.skipped["torch"].startswith("torch not importable")
    assert env.skipped["cupy"].startswith("cupy not importable")
    assert env.skipped["cuda.compute"].startswith("cuda.compute not importable")
    assert env.has("cufold")
    assert "torch" not in env.modules
    assert any("skipped: cuda.compute not importable" in line for line in env.summary_lines())
    with pytest.raises(B.Skip, match="cupy not importable"):
        env.get("cupy")


def test_cases_skip_missing_peers():
    env = B.probe(importer=_importer({"torch", "cupy", "cuda"}))
    cases = S.build_cases("reduce", env)
    assert [c.id for c in cases][:3] == ["sum/float32", "sum/float64", "sum/int32"]
    by = {(c.id, cand.label): cand for c in cases for cand in c.candidates}
    assert by[("sum/float32", "torch.sum")].skip.startswith("torch not importable")
    assert by[("sum/float32", "cupy.sum (CUB)")].skip.startswith("cupy not importable")
    assert by[("sum/float32", "cuda.compute.reduce_into")].skip.startswith("cuda.compute not importable")
    # filters
    only = S.build_cases("reduce", env, dtypes=["float32"], cases=["sum"], only=["cufold", "torch"])
    assert [c.id for c in only] == ["sum/float32"]
    assert [c.label for c in only[0].candidates] == ["cufold.sum", "torch.sum"]
    assert S.build_cases("scan", env, cases=["alg"]) == []                     # studies: --full only
    assert [c.id for c in S.build_cases("scan", env, cases=["alg"], full=True)] == ["scan-alg/int32",
                                                                                    "scan-alg/float32"]
    scan = S.build_cases("scan", env, dtypes=["float32"], only=["torch"])
    assert [c.role for c in scan[0].candidates] == ["peer", "ceiling"]        # copy ceiling kept
    with pytest.raises(ValueError, match="unsupported dtypes"):
        S.build_cases("reduce", env, dtypes=["float16"])


def test_cufold_missing_function_is_a_skip():
    class FakeCufold:
        class Op:
            pass
        argmax = Op()

        @staticmethod
        def algorithms(kind):
            raise ImportError("not yet")

    env = B.Env()
    env.modules["cufold"] = FakeCufold
    with pytest.raises(B.Skip, match="cufold.sum missing"):
        S._cufold_attr(env, "sum")
    with pytest.raises(B.Skip, match="is the operator"):
        S._cufold_attr(env, "argmax")
    FakeCufold.argmax.device_reduction = len          # an operator that also reduces arrays
    FakeCufold.argmax.__class__.__call__ = lambda self, x: self.device_reduction(x)
    assert S._cufold_attr(env, "argmax") is FakeCufold.argmax
    del FakeCufold.argmax.device_reduction
    env.skipped.update(torch="torch not importable", cupy="cupy not importable", numba="no GPU")
    cases = S.build_cases("reduce", env, dtypes=["float32"], full=True)
    by = {(c.id, cand.label): cand for c in cases for cand in c.candidates}
    assert by[("sum/float32", "cufold.sum")].skip == "cufold.sum missing"
    assert "algorithms('reduce') failed" in by[("reduce-alg/float32", "cufold.reduce[*]")].skip


def test_main_dry_run_and_no_gpu(monkeypatch):
    fake = _importer({"torch", "cupy", "cuda"})
    real_probe = B.probe
    monkeypatch.setattr(B, "probe",
                        lambda importer=None, libs=B.LIBS, **kw: real_probe(importer=fake, libs=libs, **kw))
    out, err = io.StringIO(), io.StringIO()
    assert bench.main(["reduce", "--dry-run", "--sizes", "10:12"], stdout=out, stderr=err) == 0
    text = out.getvalue()
    assert "skipped: torch not importable" in text and "skipped: cuda.compute not importable" in text
    assert "sizes: 2^10, 2^11, 2^12" in text and "targets:" in text
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")

    def no_gpu(importer=None, libs=B.LIBS, **kw):
        env = real_probe(importer=fake, libs=libs, **kw)
        env.modules.pop("numba", None)
        env.skipped["numba"] = "numba.cuda: no CUDA GPU"
        env.simulator = False
        return env
    monkeypatch.setattr(B, "probe", no_gpu)
    out, err = io.StringIO(), io.StringIO()
    assert bench.main(["scan", "--sizes", "10"], stdout=out, stderr=err) == 2
    assert "no GPU array library" in err.getvalue()
    err = io.StringIO()
    assert bench.main(["bykey"], stdout=io.StringIO(), stderr=err) == 2  # it needs a GPU, like the others
    assert bench.main(["reduce", "--sizes", "nonsense"], stdout=io.StringIO(), stderr=io.StringIO()) == 2
    out = io.StringIO()
    assert bench.main(["list"], stdout=out) == 0 and "hist" in out.getvalue()


# --- default runs: what they list and what they take ------------------------------------------------
@pytest.fixture
def no_peers(monkeypatch):
    """probe() as on a machine without torch, CuPy and cuda.compute."""
    fake = _importer({"torch", "cupy", "cuda"})
    real_probe = B.probe
    monkeypatch.setattr(B, "probe",
                        lambda importer=None, libs=B.LIBS, **kw: real_probe(importer=fake, libs=libs, **kw))


def _dry_run(argv):
    """The dry run's text and its estimate (seconds)."""
    out = io.StringIO()
    assert bench.main(argv + ["--dry-run"], stdout=out, stderr=io.StringIO()) == 0
    text = out.getvalue()
    return text, float(re.search(r"^estimate: (\d+) s on an H100/H200 \(", text, re.M).group(1))


@pytest.mark.parametrize("suite", sorted(S.SUITES))
def test_default_runs_list_their_cases_within_four_minutes(suite, no_peers):
    text, seconds = _dry_run([suite])
    assert 0 < seconds < bench.DEFAULT_BUDGET_S == 240
    full_text, full_seconds = _dry_run([suite, "--full"])
    assert full_seconds >= seconds
    if suite == "bykey":       # one box: the default is the full run
        assert "orders: ordered, shifted, random" in text and "cufold[adaptive]" in text
        assert full_text == text
        return
    if suite == "pyg":  # issue 19's PyG shapes: the default is the full run too
        assert "features: 1, 16, 64, 256; orders: sorted, shuffled" in text
        assert "cufold segmented sum" in text and full_text == text
        return
    if suite == "distributed":  # issue 21's sizes, one process per GPU: the default is the full run
        assert "all_reduce plus 2^28 f32" in text and "reduce 2^30" in text and full_text == text
        return
    if suite == "bykey-tuple":  # issue 25's shapes: the default is the full run too
        assert "orders: sorted, shuffled; tasks: argmax, sums, welford" in text
        assert "cufold argmax by key" in text and full_text == text
        return
    for mode, out in (("default", text), ("full", full_text)):
        cases = S.build_cases(suite, B.probe(), full=mode == "full")
        assert re.findall(r"^case (\S+) \(", out, re.M) == [c.id for c in cases] != []
        labels = re.findall(r"^  (?:cufold|peer|ceiling) +(.+?) +(?:will run|skipped)", out, re.M)
        assert labels == [cand.label for c in cases for cand in c.candidates]
    studies = [cand.label for c in S.build_cases(suite, B.probe(), full=True) for cand in c.candidates
               if cand.study]
    assert all(label not in text and label in full_text for label in studies)
    sizes = re.search(r"^sizes: (.*)$", text, re.M).group(1)
    assert sizes == ", ".join("2^%d" % k for k in T.parse_sizes(S.SUITES[suite].default_sizes))


def test_estimate_parts():
    s = T.Settings(target_s=0.1, max_reps=1000, call_repeats=5, call_target_s=0.03)
    e = T.estimate_seconds(s, points=10, call_points=4, first_calls=["cufold", "torch", "cuda.compute"],
                           data_bytes=3e9)
    m = T.ESTIMATE
    assert e["events"] == pytest.approx(10 * (m["point_s"] + 0.1 + 1000 * m["hold_s"]))
    assert e["per-call loops"] == pytest.approx(4 * 5 * 0.03)
    assert e["first calls"] == pytest.approx(m["compile_s"]["cufold"] + m["compile_s"]["other"]
                                             + m["compile_s"]["cuda.compute"])
    assert e["data"] == pytest.approx(10.0) and e["total"] == pytest.approx(sum(
        v for k, v in e.items() if k != "total"))


def test_mode_settings():
    parse = bench.build_parser().parse_args
    short, full = bench._settings(parse(["reduce"])), bench._settings(parse(["reduce", "--full"]))
    assert short.target_s < full.target_s == T.Settings().target_s
    calls = bench._settings(parse(["calls", "--target-time", "0.5"]), S.SUITES["calls"])
    assert calls.max_reps == S.SUITES["calls"].settings["max_reps"] and calls.target_s == 0.5
    with pytest.raises(SystemExit):
        parse(["reduce", "--full", "--quick"])


def test_calls_rows(no_peers):
    cases = S.build_cases("calls", B.probe())
    assert [c.id for c in cases] == [
        "sum", "argmax", "mean_var", "inclusive_scan", "exclusive_scan", "sum/axis=1", "argmax/axis=1",
        "mean_var/axis=1", "sum/axis=0", "argmax/axis=0", "mean_var/axis=0", "segmented_reduce",
        "reduce_by_key", "reduce_by_key_into", "histogram", "bincount"]
    for c in cases:                                       # cufold against one torch peer
        assert [x.lib for x in c.candidates if x.role == "peer"] == ["torch"]
        assert all(x.lib == "cufold" for x in c.candidates if x.role != "peer")
    targets = {(t["case"], t["label"]): t for t in S.SUITES["calls"].targets}
    assert len(targets) == sum(len(c.candidates) - 1 for c in cases)
    assert all(t["kind"] == "call_vs" and t["cmp"] == "<=" and t["range"] == [10, 20] for t in targets.values())
    into = targets[("reduce_by_key_into", "cufold.reduce_by_key_into")]
    assert into["threshold"] == 1.5 and into["peer"] == "torch.index_add_"
    assert targets[("reduce_by_key_into", "cufold.reduce_by_key_into(check=False)")]["threshold"] == 1.0
    assert S.matrix_shape(1 << 10) == (32, 32) and S.matrix_shape(1 << 11) == (32, 64)
    assert S.matrix_shape(1 << 20) == (1024, 1024)


def test_calls_checks():
    from cufold.bench import calls as C
    (x,) = S.generate("float32", "grid", 1 << 10, 1, seed=8)
    ctx = S.CheckCtx(S.reference("scan", x), x, None, x.size, x.dtype)
    exclusive = np.concatenate(([0], np.cumsum(x, dtype=np.float64)[:-1])).astype(np.float32)
    assert C.check_exclusive_scan(exclusive, ctx) == (True, "")
    assert not C.check_exclusive_scan(np.cumsum(x), ctx)[0]
    m = x.reshape(32, 32)
    for axis, where in ((1, "row"), (0, "column")):
        check = C.along(S.check_sum, "sum", axis)
        assert check(m.sum(axis), ctx) == (True, "")
        bad = m.sum(axis)
        bad[3] += 1
        ok, note = check(bad, ctx)
        assert not ok and note.startswith("%s 3:" % where)
        assert not check(m.sum(axis)[:-1], ctx)[0]
    (u,) = S.generate("float32", "uniform", 1 << 10, 1, seed=9)
    mu, uctx = u.reshape(32, 32), S.CheckCtx(None, u, None, u.size, u.dtype)
    assert C.along(S.check_argmax, "argmax", 1)(mu.argmax(1), uctx)[0]
    assert not C.along(S.check_argmax, "argmax", 0)(mu.argmin(0), uctx)[0]
    ok, note = C.along(S.check_mean_var, "mean_var", 0)(S._swap((mu.var(0, ddof=1), mu.mean(0))), uctx)
    assert ok and note == "var with ddof=1"
    keys, values = C._bykey_host(1 << 10)
    assert keys[0] == 0 and keys[-1] == 102 and np.all(np.diff(keys) >= 0)
    sums = np.bincount(keys, weights=values)
    assert C.check_into(sums, ctx)[0] and not C.check_into(sums + 1, ctx)[0]
    assert C.check_runs((np.arange(103), sums), ctx)[0]
    assert not C.check_runs((np.arange(1, 104), sums), ctx)[0]
    assert not C.check_runs(sums, ctx)[0]


# --- cuda.compute peers: cuda-cccl 1.1.1's keyword-only API ------------------------------------------
class FakeCompute:
    """``cuda.compute`` as cuda-cccl 1.1.1 spells it (cuda/compute/algorithms/_reduce.py,
    _scan.py, _segmented_reduce.py): keyword-only functions and made objects, computing
    with NumPy; every call recorded as (name, keyword names)."""

    class OpKind:
        PLUS = "OpKind.PLUS"

    TEMP_BYTES = 96

    def __init__(self):
        self.calls = []
        self.temp_storage = set()     # ids of the temp storage the made objects ran with

    def _record(self, name, kw):
        assert kw["op"] == self.OpKind.PLUS
        self.calls.append((name, tuple(sorted(kw))))

    def _made(self, name, compute):
        fake = self

        class Made:
            def __call__(self, *, temp_storage, **kw):
                if temp_storage is None:                # the size query
                    fake._record("query." + name, kw)
                    return fake.TEMP_BYTES
                fake._record("made." + name, kw)
                assert temp_storage.nbytes >= fake.TEMP_BYTES
                fake.temp_storage.add(id(temp_storage))
                compute(**kw)
        return Made()

    # reduce_into: _reduce.py make_reduce_into(*, d_in, d_out, op, h_init, **kwargs),
    # _Reduce.__call__(self, *, temp_storage, d_in, d_out, num_items, op, h_init, stream=None)
    @staticmethod
    def _reduce(*, d_in, d_out, num_items, op, h_init, stream=None):
        d_out[0] = h_init[0] + d_in[:num_items].sum(dtype=np.float64)

    def make_reduce_into(self, *, d_in, d_out, op, h_init, **kwargs):
        self._record("make_reduce_into", dict(d_in=d_in, d_out=d_out, op=op, h_init=h_init))
        return self._made("reduce_into", self._reduce)

    def reduce_into(self, *, d_in, d_out, num_items, op, h_init, stream=None, **kwargs):
        self._record("reduce_into", dict(d_in=d_in, d_out=d_out, num_items=num_items, op=op, h_init=h_init))
        self._reduce(d_in=d_in, d_out=d_out, num_items=num_items, op=op, h_init=h_init)

    # inclusive_scan: _scan.py make_inclusive_scan(*, d_in, d_out, op, init_value=None,
    # compute_capability=None), _Scan.__call__(self, *, temp_storage, d_in, d_out, op, init_value,
    # num_items, stream=None)
    @staticmethod
    def _scan(*, d_in, d_out, op, init_value, num_items, stream=None):
        d_out[:num_items] = init_value[0] + np.cumsum(d_in[:num_items], dtype=np.float64)

    def make_inclusive_scan(self, *, d_in, d_out, op, init_value=None, compute_capability=None):
        self._record("make_inclusive_scan", dict(d_in=d_in, d_out=d_out, op=op, init_value=init_value))
        return self._made("inclusive_scan", self._scan)

    def inclusive_scan(self, *, d_in, d_out, op, init_value=None, num_items, stream=None):
        self._record("inclusive_scan", dict(d_in=d_in, d_out=d_out, op=op, init_value=init_value,
                                            num_items=num_items))
        self._scan(d_in=d_in, d_out=d_out, op=op, init_value=init_value, num_items=num_items)

    # segmented_reduce: _segmented_reduce.py make_segmented_reduce(*, d_in, d_out, start_offsets_in,
    # end_offsets_in, op, h_init, compute_capability=None), _SegmentedReduce.__call__(self, *,
    # temp_storage, d_in, d_out, num_segments, start_offsets_in, end_offsets_in, op, h_init,
    # max_segment_size=None, stream=None)
    @staticmethod
    def _segmented(*, d_in, d_out, num_segments, start_offsets_in, end_offsets_in, op, h_init,
                   max_segment_size=None, stream=None):
        for i in range(num_segments):
            d_out[i] = h_init[0] + d_in[start_offsets_in[i]:end_offsets_in[i]].sum(dtype=np.float64)

    def make_segmented_reduce(self, *, d_in, d_out, start_offsets_in, end_offsets_in, op, h_init,
                              compute_capability=None):
        self._record("make_segmented_reduce", dict(d_in=d_in, d_out=d_out, start_offsets_in=start_offsets_in,
                                                   end_offsets_in=end_offsets_in, op=op, h_init=h_init))
        return self._made("segmented_reduce", self._segmented)

    def segmented_reduce(self, *, d_in, d_out, num_segments, start_offsets_in, end_offsets_in, op, h_init,
                         max_segment_size=None, stream=None):
        kw = dict(d_in=d_in, d_out=d_out, num_segments=num_segments, start_offsets_in=start_offsets_in,
                  end_offsets_in=end_offsets_in, op=op, h_init=h_init)
        self._record("segmented_reduce", kw)
        self._segmented(**kw)


def test_fake_compute_matches_cccl_signatures():
    """The fake's functions take keywords only, as 1.1.1's (nothing positional)."""
    fake = FakeCompute()
    for name in ("reduce_into", "make_reduce_into", "inclusive_scan", "make_inclusive_scan",
                 "segmented_reduce", "make_segmented_reduce"):
        params = inspect.signature(getattr(fake, name)).parameters.values()
        assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params), name
    with pytest.raises(TypeError, match="positional"):
        fake.reduce_into(np.zeros(4), d_out=np.zeros(1), num_items=4, op=fake.OpKind.PLUS, h_init=np.zeros(1))


def test_cuda_compute_peers_call_keywords_only():
    """Every cuda.compute peer, against the fake module injected through probe's importer:
    GPU time from the made object (its temp storage sized by one temp_storage=None query,
    then allocated once), per-call host time from the one-shot function; results checked."""
    import importlib
    fake = FakeCompute()

    def importer(name):
        if name == "cuda.compute":
            return fake
        if name.split(".")[0] in ("torch", "cupy"):
            raise ModuleNotFoundError("No module named %r" % name)
        return importlib.import_module(name)
    env = B.probe(importer=importer)
    assert env.get("cuda.compute") is fake
    settings = T.Settings(target_s=0.001, min_reps=2, max_reps=4, max_case_s=1.0, warmup=1, est_reps=2,
                          call_target_s=0.001, call_min=3, call_max=5, call_repeats=2, buffer_cap=2)
    expected = {"reduce": ("reduce_into", {"d_in", "d_out", "num_items", "op", "h_init"}),
                "scan": ("inclusive_scan", {"d_in", "d_out", "op", "init_value", "num_items"}),
                "segmented": ("segmented_reduce", {"d_in", "d_out", "num_segments", "start_offsets_in",
                                                   "end_offsets_in", "op", "h_init"})}
    for suite, (name, keywords) in expected.items():
        fake.calls.clear()
        fake.temp_storage.clear()
        cases = S.build_cases(suite, env, only=["cuda.compute"])
        cases = [c for c in cases if any(x.lib == "cuda.compute" for x in c.candidates)][:1]
        res = RU.run_suite(suite, cases, NumpyBackend(), env, [10], settings, progress=False, ceiling=False)
        rec = next(r for r in res["records"] if r["lib"] == "cuda.compute")
        assert rec["status"] == "ok" and rec["call_us"] > 0, rec
        called = {n: [kw for m, kw in fake.calls if m == n] for n, _ in fake.calls}
        assert len(called["make_" + name]) == 1 and len(called["query." + name]) == 1   # built, sized once
        assert called["query." + name][0] == called["made." + name][0] == called[name][0] == tuple(sorted(keywords))
        # the first call (checked), warm-up and events: the made object, one temp storage
        assert len(called["made." + name]) == 1 + settings.warmup + settings.est_reps + rec["reps"]
        assert len(fake.temp_storage) == 1
        # the per-call loops (10 calls to size them, then call_repeats loops): the one-shot
        assert len(called[name]) == 10 + settings.call_repeats * rec["calls"]

def _rec(case, label, role, k, gpu, call=None, status="ok", note="", bpe=4):
    n = 1 << k
    r = {"case": case, "label": label, "lib": label.split(".")[0], "role": role, "log2n": k, "n": n,
         "bytes": bpe * n, "status": status, "note": note}
    if status == "ok":
        r.update(gpu_us=gpu, GBps=bpe * n / gpu / 1e3, reps=20, buffers=1)
        if call is not None:
            r["call_us"] = call
    return r


def synthetic_results():
    cases = [
        {"id": "sum/float32", "title": "sum float32", "dtype": "float32", "bytes_per_elem": 4,
         "peers_from": None,
         "labels": ["cufold.sum", "torch.sum", "cupy.sum (CUB)", "cuda.compute.reduce_into"],
         "roles": {"cufold.sum": "cufold", "torch.sum": "peer", "cupy.sum (CUB)": "peer",
                   "cuda.compute.reduce_into": "peer"}},
        {"id": "reduce-alg/float32", "title": "algorithms", "dtype": "float32", "bytes_per_elem": 4,
         "peers_from": "sum/float32", "labels": ["cufold.reduce[a]"], "roles": {"cufold.reduce[a]": "cufold"}},
        {"id": "argmax/float32", "title": "argmax", "dtype": "float32", "bytes_per_elem": 4, "peers_from": None,
         "labels": ["cufold.argmax", "torch.argmax"],
         "roles": {"cufold.argmax": "cufold", "torch.argmax": "peer"}},
        {"id": "scan/int32", "title": "scan int32", "dtype": "int32", "bytes_per_elem": 8, "peers_from": None,
         "labels": ["cufold.inclusive_scan", "torch.cumsum", "copy (device-to-device)"],
         "roles": {"cufold.inclusive_scan": "cufold", "torch.cumsum": "peer",
                   "copy (device-to-device)": "ceiling"}},
    ]
    recs = []
    for k in (10, 20, 24, 28):
        call = k <= 20
        recs.append(_rec("sum/float32", "cufold.sum", "cufold", k, 2.0 * (1 << max(0, k - 18)) + 4,
                         call=5.0 if call else None))
        recs.append(_rec("sum/float32", "torch.sum", "peer", k, 2.2 * (1 << max(0, k - 18)) + 4,
                         call=4.0 if call else None))
        recs.append(_rec("sum/float32", "cupy.sum (CUB)", "peer", k, 2.1 * (1 << max(0, k - 18)) + 5,
                         call=8.0 if call else None))
        recs.append(_rec("sum/float32", "cuda.compute.reduce_into", "peer", k, None, status="skipped",
                         note="cuda.compute not importable"))
        recs.append(_rec("reduce-alg/float32", "cufold.reduce[a]", "cufold", k, 1.0 * (1 << max(0, k - 18)) + 4,
                         call=3.0 if call else None))
        recs.append(_rec("argmax/float32", "cufold.argmax", "cufold", k, None, status="mismatch",
                         note="got 3, expected 4") if k == 20 else
                    _rec("argmax/float32", "cufold.argmax", "cufold", k, 100.0, note="tie: index 5, first 4"))
        recs.append(_rec("argmax/float32", "torch.argmax", "peer", k, 120.0))
        recs.append(_rec("scan/int32", "cufold.inclusive_scan", "cufold", k, 1000.0,
                         call=900.0 if call else None,
                         bpe=8))
        recs.append(_rec("scan/int32", "torch.cumsum", "peer", k, 1100.0, call=800.0 if call else None, bpe=8))
        recs.append(_rec("scan/int32", "copy (device-to-device)", "ceiling", k, 950.0, bpe=8))
    meta = {"suite": "reduce", "date": "2030-01-01T00:00:00", "device": {"name": "Fake GPU", "cc": "9.0",
            "l2_bytes": 50 << 20, "l2_known": True}, "l2_bytes": 50 << 20, "versions": {"numpy": np.__version__},
            "settings": {"call_max_log2": 20}, "copy_GBps": 3000.0,
            "copy": {"label": "copy (fake)", "bytes": 512 << 20, "status": "ok"},
            "skipped_libs": {"cuda.compute": "cuda.compute not importable: ModuleNotFoundError"}}
    targets = list(S.REDUCE_TARGETS) + [t for t in S.SCAN_TARGETS if t["case"] == "scan/int32"]
    return {"meta": meta, "cases": cases, "records": recs, "targets": targets}


def test_time_basis_and_ratios():
    res = synthetic_results()
    r10 = R._rec(res, "sum/float32", "cufold.sum", 10)
    assert R.time_of(r10) == (5.0, "call")
    assert R.time_of(r10, call_max_log2=9) == (r10["gpu_us"], "gpu")
    assert R.time_of(R._rec(res, "sum/float32", "cufold.sum", 28))[1] == "gpu"
    # at 2^10 per call: torch 4.0 is the best peer, cufold 5.0 -> 0.8 (cufold slower)
    assert R.best_peer(res, "sum/float32", 10) == ("torch.sum", 4.0)
    assert R.ratio(res, "sum/float32", "cufold.sum", 10) == pytest.approx(0.8)
    # at 2^28 gpu: cufold 2*1024+4, cupy 2.1*1024+5 (best) -> > 1: cufold faster
    bl, bt = R.best_peer(res, "sum/float32", 28)
    assert bl == "cupy.sum (CUB)"
    x = R.ratio(res, "sum/float32", "cufold.sum", 28)
    assert x == pytest.approx((2.1 * 1024 + 5) / (2.0 * 1024 + 4)) and x > 1
    # ... which equals the bandwidth ratio
    rc, rp = R._rec(res, "sum/float32", "cufold.sum", 28), R._rec(res, "sum/float32", bl, 28)
    assert x == pytest.approx(rc["GBps"] / rp["GBps"])
    # algorithm cases take their peers from peers_from
    assert R.best_peer(res, "reduce-alg/float32", 28)[0] == "cupy.sum (CUB)"
    assert R.ratio(res, "reduce-alg/float32", "cufold.reduce[a]", 10) == pytest.approx(4.0 / 3.0)
    assert R.ratio(res, "argmax/float32", "cufold.argmax", 20) is None          # mismatch: no ratio


def test_format_table():
    text = R.format_table(synthetic_results())
    assert "Fake GPU" in text and "copy ceiling: 3000 GB/s" in text
    assert "> 1: cufold faster" in text
    assert "skipped: cuda.compute not importable" in text
    assert "not run: cuda.compute.reduce_into: cuda.compute not importable" in text
    assert "MISMATCH" in text and "!! cufold.argmax MISMATCH at 2^20: got 3, expected 4" in text
    assert "tie: index 5" in text
    block = text.split("== sum float32")[1].split("\n\n")[0]
    rows = [l for l in block.splitlines() if l.startswith("2^")]
    assert len(rows) == 4
    assert rows[0].split("|")[1].strip() == "call" and rows[-1].split("|")[1].strip() == "gpu"
    assert rows[0].split("|")[2].split()[0] == "5.00"          # cufold per-call µs at 2^10
    assert rows[0].split("|")[2].split()[2] == "0.80"          # ratio
    assert rows[0].rstrip().endswith("torch.sum")               # best peer at 2^10
    assert "best peer (sum/float32)" in text


def test_evaluate_targets():
    ev = {e["name"]: e for e in R.evaluate_targets(synthetic_results())}
    bw = ev["sum f32 @2^28 bandwidth vs best peer"]
    assert bw["status"] == "PASS" and bw["value"] == pytest.approx((2.1 * 1024 + 5) / (2.0 * 1024 + 4))
    t24 = ev["sum f32 @2^24 time vs best peer"]
    assert t24["status"] == "PASS" and t24["value"] == pytest.approx((2.0 * 64 + 4) / (2.1 * 64 + 5))
    pc = ev["sum f32 per call 2^10..2^20 vs torch.sum"]
    assert pc["status"] == "MISS" and pc["value"] == pytest.approx(5.0 / 4.0) and "geomean" in pc["detail"]
    am = ev["argmax f32 @2^28 speedup vs torch.argmax"]
    assert am["status"] == "PASS" and am["value"] == pytest.approx(1.2)
    mv = ev["mean/var f32 @2^28 speedup vs torch.var_mean"]
    assert mv["status"] == "n/a" and "not measured" in mv["detail"]
    cf = ev["int32 inclusive scan @2^28 vs copy bandwidth"]
    assert cf["status"] == "PASS" and cf["value"] == pytest.approx(0.95)
    assert "copy (device-to-device)" in cf["detail"]
    sc = ev["int32 scan per call 2^10..2^20 vs torch.cumsum"]
    assert sc["status"] == "MISS" and sc["value"] == pytest.approx(900 / 800)
    text = R.format_targets(list(ev.values()), "reduce")
    assert "PASS" in text and "MISS" in text and "n/a" in text and "95.0% >= 90%" in text
    # a missing size is n/a, not a crash
    res = synthetic_results()
    res["records"] = [r for r in res["records"] if r["log2n"] != 28]
    ev = {e["name"]: e for e in R.evaluate_targets(res)}
    assert ev["sum f32 @2^28 bandwidth vs best peer"]["status"] == "n/a"
    assert "2^28 not measured" in ev["sum f32 @2^28 bandwidth vs best peer"]["detail"]
    # copy fraction falls back on the run's copy ceiling
    res = synthetic_results()
    res["records"] = [r for r in res["records"] if r["role"] != "ceiling"]
    e = [x for x in R.evaluate_targets(res) if x["kind"] == "copy_frac"][0]
    assert e["value"] == pytest.approx((8 << 28) / 1000.0 / 1e3 / 3000.0)


def test_json_and_plots(tmp_path):
    res = synthetic_results()
    res["records"][0]["np_scalar"] = np.float32(1.5)
    R.format_table(res)                                     # builds the private index
    path = R.write_json(res, str(tmp_path / "deep" / "results.json"))
    back = R.load_json(str(tmp_path / "deep"))
    assert "_index" not in back and back["records"][0]["np_scalar"] == 1.5
    assert back["meta"]["device"]["name"] == "Fake GPU"
    assert json.load(open(path))["cases"][0]["id"] == "sum/float32"
    pytest.importorskip("matplotlib")
    png = R.plot_bandwidth(back, str(tmp_path / "bandwidth.png"))
    call = R.plot_calls(back, str(tmp_path / "call.png"))
    for p in (png, call):
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    out = io.StringIO()
    import contextlib
    with contextlib.redirect_stdout(out):
        assert bench.main(["report", str(tmp_path / "deep"), "--no-plot"]) == 0
    assert "targets (reduce):" in out.getvalue() and "== sum float32" in out.getvalue()


def test_out_dir_names():
    when = datetime.datetime(2030, 1, 2, 3, 4, 5)
    d = R.default_out_dir("reduce", "NVIDIA H100 80GB HBM3", when)
    assert d == os.path.join("bench", "results", "reduce-NVIDIA-H100-80GB-HBM3-20300102-030405")
    assert R.slug(None) == "unknown-gpu" and R.slug("a/b c") == "a-b-c"


# --- the runner end to end with NumPy as the "GPU" --------------------------------------------
class NumpyBackend:
    name = "numpy"
    cufold_input = "numpy"

    def __init__(self):
        self.clock = T.WallClock()
        self.uploads = 0

    def sync(self):
        pass

    def upload(self, h):
        self.uploads += 1
        return np.array(h)

    def view(self, a, kind):
        return a

    def empty_like(self, a, dtype=None):
        return np.empty_like(a, dtype=dtype)

    def copy_fn(self):
        def copy(p):
            np.copyto(p[1], p[0])
            return p[1]
        return "copy (numpy)", copy

    def fetch(self, obj, idx=None):
        if isinstance(obj, tuple):
            return tuple(np.asarray(o) for o in obj)
        a = np.asarray(obj)
        return a[idx] if idx is not None and a.ndim == 1 else a

    def release(self):
        pass

    def device_info(self):
        return {"name": "NumPy CPU", "cc": None, "l2_bytes": 64 << 10, "l2_known": False}


def _numpy_cases():
    def prep(f):
        return lambda ctx: S.Prepared(f, ctx.views("numpy"))

    def not_implemented(ctx):
        def f(x):
            raise NotImplementedError("algorithm x: no float32")
        return S.Prepared(f, ctx.views("numpy"))

    def boom(ctx):
        def f(x):
            raise RuntimeError("kernel exploded")
        return S.Prepared(f, ctx.views("numpy"))

    def missing(ctx):
        raise B.Skip("cufold.sum missing")

    sum_case = S.Case("sum/float32", "sum", "sum float32", "float32", "grid", 4, "sum", S.check_sum, [
        S.Candidate("cufold.sum", "cufold", "cufold", prep(lambda x: x.sum(dtype=np.float64))),
        S.Candidate("np.sum", "numpy", "peer", prep(np.sum)),
        S.Candidate("garbage", "numpy", "peer", prep(lambda x: x[:-1].sum() + 1)),
        S.Candidate("cufold.reduce[x]", "cufold", "cufold", not_implemented),
        S.Candidate("boom", "numpy", "peer", boom),
        S.Candidate("later", "cufold", "cufold", missing),
        S.Candidate("gone", "torch", "peer", None, skip="torch not importable"),
    ])
    scan_case = S.Case("scan/int32", "scan", "scan int32", "int32", "grid", 8, "scan", S.check_scan, [
        S.Candidate("cufold.inclusive_scan", "cufold", "cufold", prep(np.cumsum)),
        S.Candidate("np.cumsum", "numpy", "peer", prep(lambda x: np.cumsum(x, dtype=np.int32))),
        S.copy_candidate(),
    ], sampled=True)
    mv_case = S.Case("mean_var/float32", "mean_var", "mean var", "float32", "uniform", 4, "mean_var",
                     S.check_mean_var, [
                         S.Candidate("cufold.mean_var", "cufold", "cufold", prep(lambda x: (x.mean(), x.var()))),
                         S.Candidate("var_mean", "numpy", "peer", prep(lambda x: (x.var(ddof=1), x.mean())),
                                     canon=S._swap)])
    return [sum_case, scan_case, mv_case]


def test_runner_end_to_end(tmp_path):
    settings = T.Settings(target_s=0.002, min_reps=3, max_reps=20, max_case_s=0.05, warmup=1, est_reps=2,
                          call_max_log2=10, call_target_s=0.001, call_min=5, call_max=50, call_repeats=2,
                          buffer_cap=16)
    backend = NumpyBackend()
    env = B.Env()
    err = io.StringIO()
    saved = []
    res = RU.run_suite("reduce", _numpy_cases(), backend, env, [10, 12], settings, progress=True, log=err,
                       ceiling=12, checkpoint=saved.append)
    recs = {(r["case"], r["label"], r["log2n"]): r for r in res["records"]}
    assert len(res["records"]) == 2 * (7 + 3 + 2)
    # after each size, results that the report reads as they are
    assert [(r["meta"]["partial"], len(r["records"])) for r in saved] == [(True, 12), (False, 24)]
    assert "2^10" in R.format_table(saved[0]) and "2^12" not in R.format_table(saved[0])
    R.evaluate_targets(saved[0])
    ok = recs[("sum/float32", "cufold.sum", 10)]
    assert ok["status"] == "ok", ok.get("traceback") or ok.get("note")
    assert ok["status"] == "ok" and ok["reps"] >= 3 and ok["gpu_us"] > 0 and "call_us" in ok
    assert len(ok["samples_us"]) == ok["reps"]
    assert ok["GBps"] == pytest.approx(ok["bytes"] / ok["gpu_us"] / 1e3)
    # 4 KiB buffers, 64 KiB "L2": 16 (the cap) buffers, L2-resident; 16 KiB: 13 buffers > 3x L2
    assert ok["buffers"] == 16 and ok["rotation"].startswith("L2-resident")
    assert recs[("sum/float32", "cufold.sum", 12)]["buffers"] == 13
    assert "call_us" not in recs[("sum/float32", "cufold.sum", 12)]          # above call_max_log2
    assert recs[("sum/float32", "garbage", 10)]["status"] == "mismatch"
    assert "reps" not in recs[("sum/float32", "garbage", 10)]                # garbage is not timed
    assert recs[("sum/float32", "cufold.reduce[x]", 10)]["status"] == "skipped"
    assert "NotImplementedError" in recs[("sum/float32", "cufold.reduce[x]", 10)]["note"]
    assert recs[("sum/float32", "boom", 10)]["status"] == "error"
    assert recs[("sum/float32", "later", 10)]["note"] == "cufold.sum missing"
    assert recs[("sum/float32", "gone", 12)]["note"] == "torch not importable"
    assert recs[("scan/int32", "np.cumsum", 12)]["status"] == "ok"
    assert recs[("scan/int32", "np.cumsum", 12)]["note"] == ""
    # np.cumsum of int32 writes int64: said, since bytes moved counts int32
    assert "writes int64" in recs[("scan/int32", "cufold.inclusive_scan", 12)]["note"]
    assert recs[("scan/int32", "copy (device-to-device)", 12)]["status"] == "ok"
    assert recs[("mean_var/float32", "var_mean", 10)]["status"] == "ok"
    assert recs[("mean_var/float32", "var_mean", 10)]["note"] == "var with ddof=1"
    assert "MISMATCH: sum/float32 2^10 garbage" in err.getvalue()
    m = res["meta"]
    assert m["copy"]["status"] == "ok" and m["copy_GBps"] > 0 and m["copy"]["label"] == "copy (numpy)"
    assert m["sizes_log2"] == [10, 12] and m["settings"]["min_reps"] == 3
    text = R.format_table(res)
    assert "MISMATCH" in text and "not run: gone: torch not importable" in text
    R.write_json(res, str(tmp_path / "results.json"))
    assert R.load_json(str(tmp_path))["records"][0]["case"] == "sum/float32"
    assert R.evaluate_targets(res)                                   # all n/a here, but no crash


def test_progress_without_tqdm(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_tqdm(name, *a, **kw):
        if name == "tqdm":
            raise ImportError("no tqdm")
        return real_import(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    s = io.StringIO()
    p = RU.Progress(3, stream=s)
    p.describe("sum 2^10 cufold.sum")
    p.update()
    p.write("!! hello")
    p.close()
    assert "[1/3] sum 2^10 cufold.sum" in s.getvalue() and "!! hello" in s.getvalue()


# --- real cufold calls through Numba (the simulator without a GPU) --------------------------------
class NumbaBackend(NumpyBackend):
    name = "numba"
    cufold_input = "numba"

    def __init__(self):
        from numba import cuda
        self.cuda = cuda
        self.clock = T.WallClock(cuda.synchronize)

    def sync(self):
        self.cuda.synchronize()

    def upload(self, h):
        return self.cuda.to_device(np.ascontiguousarray(h))

    def empty_like(self, a, dtype=None):
        return self.cuda.device_array(a.shape, dtype=dtype or a.dtype)

    def fetch(self, obj, idx=None):
        if isinstance(obj, tuple):
            return tuple(self.fetch(o) for o in obj)
        return obj.copy_to_host() if hasattr(obj, "copy_to_host") else np.asarray(obj)


def _measure_cufold_once(cases, log2n):
    """Each cufold candidate of ``cases`` made, called once, checked and timed once."""
    import cufold
    env = B.Env()
    env.modules["cufold"] = cufold
    backend = NumbaBackend()
    settings = T.Settings(target_s=1e-9, min_reps=1, max_reps=1, max_case_s=1e9, warmup=0, est_reps=1,
                          call_max_log2=-1,
                          buffer_cap=2)
    data = RU.DataCache(backend, 1 << log2n, 4096, settings, log2n)
    recs = []
    for case in cases(env):
        for cand in case.candidates:
            if cand.role == "cufold":
                recs.append(RU.measure_candidate(backend, env, case, cand, data, settings))
    return recs


def test_cufold_candidates_through_numba():
    import cufold
    if not callable(getattr(cufold, "sum", None)) or not callable(getattr(cufold, "mean_var", None)):
        pytest.skip("cufold.sum / cufold.mean_var not there yet")
    recs = _measure_cufold_once(lambda env: [c for c in S.reduce_cases(env, ("float32",))
                                             if c.id in ("sum/float32", "mean_var/float32")], 10)
    assert [r["label"] for r in recs] == ["cufold.sum", "cufold.mean_var"]
    for rec in recs:
        assert rec["status"] == "ok", rec
        assert rec["reps"] == 1 and rec["buffers"] == 2


def test_calls_rows_of_cufold_through_numba():
    """Every cufold candidate of the calls suite runs and passes its check (2^6 elements:
    8 x 8 matrices, 64 segments, keys of 10 items)."""
    recs = _measure_cufold_once(lambda env: S.build_cases("calls", env), 6)
    assert len(recs) == 17
    for rec in recs:
        assert rec["status"] == "ok", rec


def test_segscan_rows_of_cufold_through_numba():
    """The segscan suite's cufold candidates run and pass their checks (2^9 values:
    short segments, one long one), and the check catches a wrong scan."""
    recs = _measure_cufold_once(lambda env: S.build_cases("segscan", env), 9)
    assert [r["case"] for r in recs] == ["segscan/short", "scan_by_key/short", "segscan/long", "scan_by_key/long"]
    for rec in recs:
        assert rec["status"] == "ok", rec
    from cufold.bench import segscan as SS
    offsets, keys = SS.layout("short", 1 << 9)
    assert offsets[0] == 0 and offsets[-1] == 1 << 9 and keys.size == 1 << 9
    x = np.arange(1 << 9, dtype=np.float32)
    c = S.CheckCtx(None, x, None, 1 << 9, np.float32)
    ref, _ = SS.reference(x, offsets)
    check = SS._with_layout(SS._check(1e-6, False), "short")
    assert check(ref.astype(np.float32), c)[0]
    assert not check(np.cumsum(x), c)[0]


def test_fused_rows_of_cufold_through_numba():
    """Every cufold candidate of the fused suite (dot, logsumexp, norm, sum with and without
    a transform) runs and passes its check (2^10 elements); its targets name its labels."""
    recs = _measure_cufold_once(lambda env: S.build_cases("fused", env), 10)
    assert [r["label"] for r in recs] == ["cufold.dot", "cufold.logsumexp", "cufold.norm",
                                          "cufold.sum(transform=v*v)", "cufold.sum (plain)"]
    for rec in recs:
        assert rec["status"] == "ok", rec
    labels = {(c.id, x.label) for c in S.build_cases("fused", B.Env()) for x in c.candidates}
    for t in S.SUITES["fused"].targets:
        assert (t["case"], t["label"]) in labels and (t["case"], t["peer"]) in labels, t
    from cufold.bench import fused as F
    x = np.random.default_rng(3).random(1 << 12, dtype=np.float32) * 2 - 1
    ctx = S.CheckCtx(None, x, None, x.size, "float32")
    good = np.float32(x.astype(np.float64).sum())
    assert F._check("sum")(good, ctx)[0]
    assert not F._check("sum")(good - x[:64].sum(), ctx)[0]          # a lost tile of 64 items


def test_per_call_loops_take_turns():
    """The wall-clock loops of a case's candidates alternate (A B A B ...), so a drift
    of the host's speed falls on all of them; a candidate that fails is left out."""
    order = []

    class Clock:
        def wall_per_call_us(self, fn, args, calls):
            order.append(fn())
            return float(len(order))

    def boom():
        raise RuntimeError("lost")

    recs = [{"status": "ok"}, {"status": "ok"}, {"status": "ok"}]
    turns = [(recs[0], lambda: "A", [0], 10), (recs[1], lambda: "B", [0], 20), (recs[2], boom, [0], 5)]
    RU.measure_calls(Clock(), turns, T.Settings(call_repeats=3))
    assert order == ["A", "B"] * 3
    assert recs[0]["call_loops_us"] == [1.0, 3.0, 5.0] and recs[0]["call_us"] == 3.0
    assert recs[1]["call_us"] == 4.0 and recs[1]["calls"] == 20
    assert recs[2]["status"] == "error" and "lost" in recs[2]["note"] and "call_us" not in recs[2]


# --- the axes suite (issue #24): its own driver ------------------------------------------
def test_axes_cases_floor_and_targets():
    from cufold.bench import axes as X
    cases = X.cases()
    assert len(cases) == 222 and ("A.T", None, "sum") in cases
    assert not any(r == "argmax" and isinstance(a, tuple) for _, a, r in cases)
    # sectors touched: every one for a strided row, half the rows for x[::2], a transposed run whole
    assert X.touched_bytes((8192, 4096), (8192, 2), 4) == 8192 * 8192 * 4
    assert X.touched_bytes((4096, 8192), (16384, 1), 4) == 4096 * 8192 * 4
    assert X.touched_bytes((4, 1 << 24), (1, 4), 4) == 4 << 26
    assert X.touched_bytes((100, 5), (64, 0), 4) == 100 * 32            # broadcast: read once
    row = {"layout": "A", "axis": None, "reduction": "sum", "plan": "reduce", "floor_us": 60.0,
           "contiguous_data": True, "full_noncontig": False,
           "cufold": {"status": "ok", "gpu_us": 64.0}, "torch": {"status": "ok", "gpu_us": 80.0}}
    slow = dict(row, layout="A[::2]", full_noncontig=True, cufold={"status": "ok", "gpu_us": 100.0},
                copy={"status": "ok", "gpu_us": 70.0})
    res = {"meta": {"device": {"name": "H200"}, "copy_GBps": 4200.0}, "records": [row, slow]}
    res["targets_evaluated"] = X.evaluate(res)
    status = [t["status"] for t in res["targets_evaluated"]]
    assert status == ["MISS", "MISS", "MISS"]        # 0.8x torch, 60% of the floor, 1.43x the copy
    text = X.format_results(res)
    assert "targets:" in text and "A[::2] axis=None sum 0.80" in text
    out = io.StringIO()
    assert bench.main(["axes", "--dry-run", "--layouts", "z", "--reductions", "sum"], stdout=out) == 0
    assert out.getvalue().count("axis=") == 6


def test_scan_axes_copy_column_and_targets():
    """bench scan-axes: the same-shape copy (torch moving the same bytes, no scan) beside each
    case, its share of cufold's time (``%copy``) and the target against it; an affine case
    compares JAX with the copy of its bytes."""
    from cufold.bench import scan_axes as SX
    ok = lambda us: {"status": "ok", "gpu_us": us}                          # noqa: E731
    fast = {"kind": "cumsum", "shape": [4096, 4096], "axis": 0, "reverse": False, "plan": "strips 1x4096x4096",
            "floor_us": 32.0, "cufold": ok(40.0), "torch": ok(1500.0), "copy": ok(37.0)}
    slow = dict(fast, shape=[16, 1048576], plan="columns 1x16x1048576", cufold=ok(44.0), copy=ok(36.0))
    aff = {"kind": "affine", "shape": [4096, 2048], "axis": 1, "reverse": False, "plan": "tiles 4096x2048x1",
           "floor_us": 24.0, "floor_both_us": 32.0, "cufold": ok(28.8), "triton": ok(28.3), "jax": ok(130.0),
           "copy": ok(27.0), "both": ok(40.0)}
    res = {"meta": {"device": {"name": "H200"}, "copy_GBps": 4168.0}, "records": [fast, slow, aff]}
    res["targets_evaluated"] = SX.evaluate(res)
    by_name = {t["name"]: t for t in res["targets_evaluated"]}
    shape_target = by_name["cumsum >= 90% of the same-shape copy's speed (what the shape allows)"]
    assert (shape_target["status"], shape_target["misses"]) == ("MISS", 1)       # 36/44 = 0.82; 37/40 passes
    assert shape_target["missed"] == ["cumsum 16x1048576 axis=0 0.82"]
    text = SX.format_results(res)
    assert "%copy" in text and " 92%" in text and " 82%" in text
    assert "the same bytes with no scan (a + b) take 27.0 us: 4.81x jax" in text


def test_axes_launched_plan():
    """The axes table's plan column is what cufold launched (splits fitted to the kernel's
    occupancy), read while a call plans; a call already planned gives None."""
    from numba import cuda
    import cufold
    from cufold.bench.axes import launched_plan
    x = cuda.to_device(np.random.default_rng(0).standard_normal((37, 501)).astype(np.float32))
    assert re.fullmatch(r"rows g\d+ x\d+, \d+ blocks", launched_plan(lambda: cufold.sum(x, axis=1)))
    assert launched_plan(lambda: cufold.sum(x, axis=1)) is None
    assert re.fullmatch(r"cols \d+x\d+ x\d+, \d+ blocks", launched_plan(lambda: cufold.argmax(x, axis=0)))
    assert launched_plan(lambda: cufold.min(x)).startswith("reduce")
    rows = cuda.to_device(np.random.default_rng(1).standard_normal((8, 8192)).astype(np.float32))
    assert re.fullmatch(r"reduce runs=1 wide, \d+ blocks", launched_plan(lambda: cufold.sum(rows[::2])))
    row = {"layout": "A", "axis": 1, "reduction": "sum", "plan": "rows g256 x6", "launched": "rows g256 x5, 960 blocks",
           "floor_us": 60.0, "contiguous_data": True, "full_noncontig": False,
           "cufold": {"status": "ok", "gpu_us": 64.0}, "torch": {"status": "ok", "gpu_us": 80.0}}
    from cufold.bench import axes as X
    res = {"meta": {"device": {"name": "H200"}, "copy_GBps": 4200.0}, "records": [row]}
    res["targets_evaluated"] = X.evaluate(res)
    assert "rows g256 x5, 9" in X.format_results(res)


def test_pyg_suite_through_numba():
    """The pyg suite's cufold candidates, made, checked against NumPy and timed once on
    tiny shapes (F = 33, both orders; the one-feature path is the by-key tests' own)."""
    import cufold
    from cufold.bench import pyg
    env = B.Env()
    env.modules["cufold"] = cufold
    settings = T.Settings(target_s=1e-9, min_reps=1, max_reps=1, max_case_s=1e9, warmup=0, est_reps=1)
    cands = [c for c in pyg.candidates() if c.lib == "cufold"]
    results = pyg.run(env, NumbaBackend(), ("sorted", "shuffled"), (33,), 120, 40, settings, progress=False,
                      cands=cands)
    recs = results["records"]
    assert len(recs) == 3 * 2 + 2
    for rec in recs:
        assert rec["status"] == "ok", rec
    assert "F = 33, shuffled destinations" in pyg.format_results(results)

def test_reproducible_candidates_through_numba():
    recs = _measure_cufold_once(lambda env: S.reproducible_cases(env, ("float32", "float64")), 10)
    assert [r["label"] for r in recs] == ["cufold.sum", "cufold.sum[gpu_to_gpu]",
                                          "cufold.reproducible.sum_state[8-byte loads]",
                                          "cufold.reproducible.sum_state[4-byte loads]",
                                          "cufold.sum", "cufold.sum[gpu_to_gpu]",
                                          "cufold.dot", "cufold.dot[gpu_to_gpu]",
                                          "cufold.norm", "cufold.norm[gpu_to_gpu]"]
    for rec in recs:
        assert rec["status"] == "ok", rec
    labels = {(c.id, x.label) for c in S.reproducible_cases(B.Env(), ("float32", "float64")) for x in c.candidates}
    for t in S.REPRODUCIBLE_TARGETS:             # every target names a case and candidates that exist
        assert (t["case"], t["label"]) in labels and (t["case"], t["peer"]) in labels, t
