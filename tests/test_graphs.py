"""CUDA graphs: every call that does not synchronise can be captured, and a replay on new
data in the captured buffers gives the right result (GPU only).

torch's recipe: warm up on a side stream, then capture with ``torch.cuda.graph``; the
capture runs on torch's own capture stream, so cufold plans each call's Program inside
the capture (its scratch memory then comes from the graph's pool). A call that
synchronised, allocated outside the graph's pool or launched on another stream would
fail the capture: these tests are also the GPU's proof of tests/test_sync.py.
"""

import numpy as np
import pytest

import cufold
from conftest import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR, reason="CUDA graphs need a real GPU")

N = 50_003
ROWS, COLS = 300, 257


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


def _cases(np_rng):
    """(name, inputs as host arrays, call on device tensors, NumPy reference on host arrays)."""
    f32 = lambda *shape: np_rng.standard_normal(shape).astype(np.float32)        # noqa: E731
    keys = lambda: np_rng.integers(0, 97, N).astype(np.int64)                     # noqa: E731
    offsets = np.linspace(0, N, 41).astype(np.int64)
    seg = lambda v: np.array([v[a:b].sum(dtype=np.float64) for a, b in zip(offsets[:-1], offsets[1:])])  # noqa: E731

    def segscan(v, k=None):
        """Per-segment np.cumsum (segments of ``offsets``, or runs of equal keys ``k``)."""
        starts = offsets[:-1] if k is None else np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        return np.concatenate([np.cumsum(p, dtype=np.float64) for p in np.split(v, starts[1:])])

    def bykey(k, v):
        out = np.zeros(97)
        np.add.at(out, k, v)
        return out

    return [
        ("sum", lambda: [f32(N)], lambda x: cufold.sum(x), lambda x: x.sum(dtype=np.float64)),
        ("argmax", lambda: [f32(N)], lambda x: cufold.argmax(x), lambda x: x.argmax()),
        ("mean_var", lambda: [f32(N)], lambda x: cufold.mean_var(x),
         lambda x: (x.mean(dtype=np.float64), x.var(dtype=np.float64))),
        ("reduce maximum", lambda: [f32(N)], lambda x: cufold.reduce(x, cufold.maximum), lambda x: x.max()),
        ("sum axis=1", lambda: [f32(ROWS, COLS)], lambda x: cufold.sum(x, axis=1),
         lambda x: x.sum(axis=1, dtype=np.float64)),
        ("argmax axis=0", lambda: [f32(ROWS, COLS)], lambda x: cufold.argmax(x, axis=0), lambda x: x.argmax(axis=0)),
        ("inclusive_scan", lambda: [f32(N)], lambda x: cufold.inclusive_scan(x),
         lambda x: np.cumsum(x, dtype=np.float64)),
        ("exclusive_scan int64 total", lambda: [np_rng.integers(-9, 9, N)],
         lambda x: cufold.exclusive_scan(x, total=True),
         lambda x: (np.concatenate([[0], np.cumsum(x)[:-1]]), x.sum())),
        ("segmented_reduce", lambda: [f32(N), offsets],
         lambda v, o: cufold.segmented_reduce(v, o), lambda v, o: seg(v)),
        ("segmented_scan", lambda: [f32(N), offsets],
         lambda v, o: cufold.segmented_scan(v, o), lambda v, o: segscan(v)),
        ("inclusive_scan_by_key", lambda: [np.repeat(np.arange(40), N // 40 + 1)[:N], f32(N)],
         lambda k, v: cufold.inclusive_scan_by_key(k, v), lambda k, v: segscan(v, k)),
        ("reduce_by_key_into check=False", lambda: [keys(), f32(N), np.zeros(97)],
         lambda k, v, out: cufold.reduce_by_key_into(k, v, out, check=False),
         lambda k, v, out: bykey(k, v)),
        ("reduce_by_key_into deterministic", lambda: [keys(), f32(N).astype(np.float64), np.zeros(97)],
         lambda k, v, out: cufold.reduce_by_key_into(k, v, out, check=False, deterministic=True),
         lambda k, v, out: bykey(k, v)),
        ("histogram range=", lambda: [f32(N)], lambda x: cufold.histogram(x, 64, range=(-2, 2)),
         lambda x: np.histogram(x, 64, range=(-2, 2))),
    ]


def _close(got, want):
    got = tuple(np.asarray(g) for g in got) if isinstance(got, tuple) else np.asarray(got)
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            _close(g, w)
        return
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64), rtol=2e-5, atol=2e-3)


def _host(torch, r):
    return tuple(_host(torch, t) for t in r) if isinstance(r, tuple) else r.cpu().numpy()


@pytest.mark.parametrize("case", range(14))
def test_torch_graph_replays_new_data(case, rng):
    torch = _torch()
    name, make, call, ref = _cases(rng)[case]
    static = [torch.as_tensor(h, device="cuda") for h in make()]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                      # warm-up: compiles; Programs of stream s
        for _ in range(2):
            call(*static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):                       # planned again on the capture stream
        result = call(*static)
    for _ in range(3):
        fresh = make()
        for t, h in zip(static, fresh):
            t.copy_(torch.as_tensor(h))
        g.replay()
        torch.cuda.synchronize()
        _close(_host(torch, result), ref(*fresh))


def test_torch_graph_of_several_calls(rng):
    """A training-step-like graph: a scan, a reduction of its output, a histogram, in sequence."""
    torch = _torch()
    x = torch.as_tensor(rng.standard_normal(N).astype(np.float32), device="cuda")

    def step():
        c = cufold.inclusive_scan(x)
        return c, cufold.max(c), cufold.histogram(x, 32, range=(-3, 3))[0]

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c, top, counts = step()
    for _ in range(3):
        h = rng.standard_normal(N).astype(np.float32)
        x.copy_(torch.as_tensor(h))
        g.replay()
        torch.cuda.synchronize()
        want = np.cumsum(h, dtype=np.float64)
        _close(c.cpu().numpy(), want)
        _close(top.cpu().numpy(), want.max())
        _close(counts.cpu().numpy(), np.histogram(h, 32, range=(-3, 3))[0])


def test_cupy_stream_capture(rng):
    """CuPy's own stream capture: warm up on the stream to capture, capture, launch."""
    cp = pytest.importorskip("cupy")
    x = cp.asarray(rng.standard_normal(N).astype(np.float32))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        cufold.sum(x)
        cufold.inclusive_scan(x)
        stream.synchronize()
        try:
            stream.begin_capture()
        except Exception as e:                       # noqa: BLE001 - a CuPy without graphs
            pytest.skip("CuPy cannot capture: %s" % e)
        total = cufold.sum(x)
        scanned = cufold.inclusive_scan(x)
        graph = stream.end_capture()
    for _ in range(3):
        h = rng.standard_normal(N).astype(np.float32)
        x.set(h)
        graph.launch(stream)
        stream.synchronize()
        _close(total.get(), h.sum(dtype=np.float64))
        _close(scanned.get(), np.cumsum(h, dtype=np.float64))


def test_a_synchronising_call_cannot_be_captured(rng):
    """The other side: reduce_by_key (its result's length is the data's) fails the capture
    with torch's error, not with a wrong result."""
    torch = _torch()
    k = torch.as_tensor(np.sort(rng.integers(0, 50, N)), device="cuda")
    v = torch.ones(N, device="cuda")
    cufold.reduce_by_key(k, v)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(Exception):
        with torch.cuda.graph(g):
            cufold.reduce_by_key(k, v)
