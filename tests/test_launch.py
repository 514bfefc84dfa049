"""cufold.host.launch: one launch path for compiled kernels.

In the simulator every launch goes through the Numba dispatcher; the direct
path's argument packing is checked against Numba's own ABI (a subprocess with
the real Numba-CUDA compiles PTX and runs Numba's ``_prepare_args``; no GPU
needed). On a GPU the direct path runs and is compared with the dispatcher.
"""

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import cuda
from numba import types as t

from conftest import SIMULATOR, gpu_only

from cufold.host import arrays as A
from cufold.host import launch as L

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

F32 = t.Array(t.float32, 1, "A")
F32_0D = t.Array(t.float32, 0, "A")


def scale(out, x, a, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = x[i] * a


def axpy_pair(out, xs, a, n):
    i = cuda.grid(1)
    if i < n:
        out[i] = xs[0][i] * a + xs[1][i]


def first_times(out, x, a):
    if cuda.grid(1) == 0:
        out[()] = x[0] * a


SCALE_SIG = (F32, F32, t.float32, t.int64)
PAIR_SIG = (F32, t.UniTuple(F32, 2), t.float32, t.int64)
ZERO_D_SIG = (F32_0D, F32, t.float32)


def _dev(h):
    return cuda.to_device(np.ascontiguousarray(h))


def _launch_modes():
    return ["numba"] if SIMULATOR else ["direct", "numba"]


@pytest.fixture(params=_launch_modes())
def mode(request, monkeypatch):
    monkeypatch.setattr(L, "DIRECT", request.param == "direct")
    return request.param


def _check_mode(k, mode):
    if mode == "direct":
        assert k.direct, k._direct_reason
        assert k._funcs, "the direct path was not taken"


def test_scale_1d(rng, mode):
    n = 100
    h = rng.standard_normal(n).astype(np.float32)
    x = A.describe(_dev(h))
    obj, out = A.empty(x, (n,), np.float32)
    k = L.Kernel(scale, SCALE_SIG)
    k.launch((n + 63) // 64, 64, A.stream_handle(x), 0, out, x, 2.5, n)
    np.testing.assert_allclose(A.as_numba(out).copy_to_host(), h * np.float32(2.5), rtol=1e-6)
    _check_mode(k, mode)


def test_tuple_of_arrays(rng, mode):
    n = 70
    h0 = rng.standard_normal(n).astype(np.float32)
    h1 = rng.standard_normal(n).astype(np.float32)
    xs = A.describe_many((_dev(h0), _dev(h1)))
    obj, out = A.empty(xs[0], (n,), np.float32)
    k = L.Kernel(axpy_pair, PAIR_SIG)
    k.launch(2, 64, 0, 0, out, xs, np.float32(-3.0), n)
    np.testing.assert_allclose(A.as_numba(out).copy_to_host(), h0 * np.float32(-3) + h1, rtol=1e-6)
    _check_mode(k, mode)


def test_strided_input(rng, mode):
    h = rng.standard_normal(90).astype(np.float32)
    d = _dev(h)
    x = A.describe(d[1::3])
    assert x.strides == (3,)
    n = x.size
    obj, out = A.empty(x, (n,), np.float32)
    k = L.Kernel(scale, SCALE_SIG)
    k.launch(1, 32, 0, 0, out, x, 2.0, n)
    np.testing.assert_allclose(A.as_numba(out).copy_to_host(), h[1::3] * 2, rtol=1e-6)
    _check_mode(k, mode)


def test_zero_d_output(mode):
    x = A.describe(_dev(np.array([3.0, 1.0], np.float32)))
    obj, out = A.empty(x, (), np.float32)
    k = L.Kernel(first_times, ZERO_D_SIG)
    k.launch(1, 32, 0, 0, out, x, 4.0)
    assert A.as_numba(out).copy_to_host()[()] == 12.0
    _check_mode(k, mode)


def test_bind_varies_arrays_and_length(rng, mode):
    """A bound launch: the arrays and the length change per call, a's value stays."""
    k = L.Kernel(scale, SCALE_SIG)
    h0 = rng.standard_normal(50).astype(np.float32)
    x0 = A.describe(_dev(h0))
    _, out0 = A.empty(x0, (50,), np.float32)
    go = k.bind(4, 32, A.stream_handle(x0), 0, (out0, x0, np.float32(3.0), 50), (0, 1, 3))
    for n in (50, 77, 1, 128):
        h = rng.standard_normal(n).astype(np.float32)
        x = A.describe(_dev(h))
        _, out = A.empty(x, (n,), np.float32)
        A.as_numba(out).copy_to_device(np.full(n, np.nan, np.float32))   # poison
        go(out, x, n)
        np.testing.assert_allclose(A.as_numba(out).copy_to_host(), h * np.float32(3), rtol=1e-6)
    _check_mode(k, mode)


def test_bind_varies_bare_pointers(rng, mode):
    """``(i, "ptr")``: a bare device pointer for array ``i``, its length kept."""
    k = L.Kernel(scale, SCALE_SIG)
    n = 40
    x0 = A.describe(_dev(np.zeros(n, np.float32)))
    _, out0 = A.empty(x0, (n,), np.float32)
    go = k.bind(2, 32, A.stream_handle(x0), 0, (out0, x0, np.float32(-2.0), n), ((0, "ptr"), (1, "ptr")))
    for _ in range(3):
        h = rng.standard_normal(n).astype(np.float32)
        x = A.describe(_dev(h))
        _, out = A.empty(x, (n,), np.float32)
        go(out.ptr, x.ptr)
        np.testing.assert_allclose(A.as_numba(out).copy_to_host(), h * np.float32(-2), rtol=1e-6)
    _check_mode(k, mode)


def test_bind_varies_pointers_in_a_tuple(rng, mode):
    """``(i, "ptr", j)``: a bare pointer for array ``j`` of tuple argument ``i``
    (the express path's tuple results), the tuple's other arrays kept."""
    k = L.Kernel(axpy_pair, PAIR_SIG)
    n = 60
    keep = rng.standard_normal(n).astype(np.float32)
    x0 = A.describe(_dev(np.zeros(n, np.float32)))
    xs0 = (x0, A.describe(_dev(keep)))
    _, out0 = A.empty(x0, (n,), np.float32)
    go = k.bind(2, 32, A.stream_handle(x0), 0, (out0, xs0, np.float32(5.0), n), ((0, "ptr"), (1, "ptr", 0)))
    for _ in range(3):
        h = rng.standard_normal(n).astype(np.float32)
        x = A.describe(_dev(h))
        _, out = A.empty(x, (n,), np.float32)
        A.as_numba(out).copy_to_device(np.full(n, np.nan, np.float32))   # poison
        go(out.ptr, x.ptr)
        np.testing.assert_allclose(A.as_numba(out).copy_to_host(), h * np.float32(5) + keep,
                                   rtol=1e-5, atol=1e-6)   # the GPU fuses the multiply-add
    _check_mode(k, mode)


@gpu_only
def test_direct_launch_in_another_current_context(rng):
    """The direct path launches a CUfunction of the device's primary context
    (cheaper per launch than the loaded CUkernel); from a thread whose current
    context is another one it still launches, with the primary one pushed."""
    k = L.Kernel(scale, SCALE_SIG)
    n = 32
    h = rng.standard_normal(n).astype(np.float32)
    x = A.describe(_dev(h))
    _, out = A.empty(x, (n,), np.float32)
    k.launch(1, 32, 0, 0, out, x, 2.0, n)
    assert k._funcs, k._direct_reason
    drv = L._driver()
    lib = drv.lib
    dev, other = ctypes.c_int(), ctypes.c_void_p()
    assert lib.cuDeviceGet(ctypes.byref(dev), x.device_id) == 0
    assert lib.cuCtxCreate_v2(ctypes.byref(other), 0, dev) == 0     # pushed: now current
    try:
        k.launch(1, 32, 0, 0, out, x, 3.0, n)
        assert lib.cuCtxSynchronize() == 0
    finally:
        lib.cuCtxDestroy_v2(other)
    cuda.synchronize()
    np.testing.assert_allclose(A.as_numba(out).copy_to_host(), h * np.float32(3), rtol=1e-6)


def echo_ints(out, a, b, c):
    if cuda.grid(1) == 0:
        out[0] = a
        out[1] = b
        out[2] = c


def test_bind_varies_narrow_integers(mode):
    """Integers narrower than 64 bits (a single-pass scan's uint32 epoch): each has its
    own 8-byte slot, written as its low bytes, negative values included."""
    k = L.Kernel(echo_ints, (t.Array(t.int64, 1, "C"), t.int32, t.uint32, t.int8))
    out = A.describe(_dev(np.zeros(3, np.int64)))
    go = k.bind(1, 32, A.stream_handle(out), 0, (out, np.int32(5), np.uint32(6), np.int8(7)), (1, 2, 3))
    for a, b, c in ((-1, 2**32 - 1, -128), (2**31 - 1, 2**31, 127), (-(2**31), 0, -1)):
        A.as_numba(out).copy_to_device(np.full(3, 99, np.int64))   # poison
        go(np.int32(a), np.uint32(b), np.int8(c))
        assert A.as_numba(out).copy_to_host().tolist() == [a, b, c]
    _check_mode(k, mode)


@gpu_only
def test_bind_rejects_what_it_cannot_vary():
    """The direct path writes 1-D arrays and integers only (the
    simulator's fallback substitutes any argument)."""
    k = L.Kernel(scale, SCALE_SIG)
    x = A.describe(_dev(np.zeros(4, np.float32)))
    with pytest.raises(ValueError, match="varies"):
        k.bind(1, 32, 0, 0, (x, x, np.float32(1), 4), (2,))


def test_argument_checks():
    k = L.Kernel(scale, SCALE_SIG)
    x = A.describe(_dev(np.zeros(4, np.float32)))
    xi = A.describe(_dev(np.zeros(4, np.int32)))
    with pytest.raises(TypeError, match="argument 1 must be a 1-d float32 array; got 1-d int32"):
        k.launch(1, 32, 0, 0, x, xi, 1.0, 4)
    with pytest.raises(TypeError, match="Arr descriptor"):
        k.launch(1, 32, 0, 0, x, np.zeros(4, np.float32), 1.0, 4)
    with pytest.raises(TypeError, match="do not match its signature"):
        k.launch(1, 32, 0, 0, x, x, 1.0)
    kp = L.Kernel(axpy_pair, PAIR_SIG)
    with pytest.raises(TypeError, match="tuple of 2; got 3"):
        kp.launch(1, 32, 0, 0, x, (x, x, x), 1.0, 4)
    kc = L.Kernel(scale, (t.Array(t.float32, 1, "C"),) + SCALE_SIG[1:])
    strided = A.describe(_dev(np.zeros(8, np.float32))[::2])
    with pytest.raises(TypeError, match="C-contiguous"):
        kc.launch(1, 32, 0, 0, strided, x, 1.0, 4)


# --- the packed argument buffer ---------------------------------------------------


def test_plan_layout():
    p = L._Plan((F32, t.int64, t.UniTuple(t.Array(t.int32, 2, "C"), 2), t.complex64,
                 t.boolean, t.float16, t.uint8, t.float64, F32_0D))
    # 1-d array: 7 fields; 2-d: 9; 0-d: 5; complex64: 2 x 4 bytes
    assert p.param_sizes() == [8] * 7 + [8] + [8] * 18 + [4, 4] + [1, 2, 1, 8] + [8] * 5
    assert p.supported


def test_packed_bytes():
    k = L.Kernel(scale, SCALE_SIG)
    out = A.Arr(0x1000, (5,), (1,), np.dtype(np.float32), 5, "cai", None, 0)
    x = A.Arr(0x2000, (5,), (3,), np.dtype(np.float32), 5, "cai", None, 0)
    raw = k.packed_params(out, x, 1.5, 5)
    q = np.frombuffer(raw, dtype=np.int64)
    assert list(q[:7]) == [0, 0, 5, 4, 0x1000, 5, 4]
    assert list(q[7:14]) == [0, 0, 5, 4, 0x2000, 5, 12]
    assert np.frombuffer(raw[14 * 8:14 * 8 + 4], np.float32)[0] == 1.5
    assert q[15] == 5


def test_unsupported_type_falls_back():
    rec = t.Record.make_c_struct([("a", t.int32)])
    p = L._Plan((rec,))
    assert not p.supported


_ABI_SCRIPT = textwrap.dedent(r"""
    import json, os, re, sys, types as pytypes
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    import ctypes
    import numpy as np
    from numba import cuda, types as t
    from numba.cuda.dispatcher import _Kernel
    from cufold.host import launch as L
    from cufold.host.arrays import Arr

    def kern(a, n, tup, c, b, h, u8, d, z, i32, c128):
        pass

    sig = (t.Array(t.float32, 1, "A"), t.int64,
           t.Tuple((t.Array(t.int32, 2, "C"), t.Array(t.float64, 1, "A"))),
           t.complex64, t.boolean, t.float16, t.uint8, t.float64,
           t.Array(t.int16, 0, "A"), t.int32, t.complex128)
    ptx, _ = cuda.compile_ptx(kern, sig, cc=(8, 0))
    sizes = [int(m) // 8 for m in re.findall(r"\.param \.[usfb](\d+) ", ptx)]

    def fake(arr):
        lay = pytypes.SimpleNamespace(strides_in_bytes=arr.byte_strides, is_contiguous_c=True,
                                      is_contiguous_f=False)
        shim = pytypes.SimpleNamespace(size=arr.size, dtype=arr.dtype, ptr=arr.ptr,
                                       shape=tuple(arr.shape), _layout=lay)
        return pytypes.SimpleNamespace(__cuda_memory__=True, _strided_memory_view_shim=shim)

    def arr(ptr, shape, strides, dt):
        n = int(np.prod(shape)) if shape else 1
        return Arr(ptr, shape, strides, np.dtype(dt), n, "cai", None, 0)

    a = arr(0x1000, (7,), (2,), np.float32)
    m = arr(0x2000, (3, 4), (4, 1), np.int32)
    v = arr(0x3000, (5,), (-1,), np.float64)
    z = arr(0x4000, (), (), np.int16)
    vals = (a, -123456789012, (m, v), np.complex64(1.5 - 2.25j), True, np.float16(0.333),
            200, 2.0 ** 0.5, z, -7, complex(3.0, -4.0))

    def to_nb(x):
        if isinstance(x, Arr):
            return fake(x)
        if isinstance(x, tuple):
            return tuple(to_nb(y) for y in x)
        return x

    class Me:
        extensions = []
        _prepare_args = _Kernel._prepare_args

    me = Me()
    kargs = []
    for ty, val in zip(sig, vals):
        me._prepare_args(ty, to_nb(val), 0, [], kargs)

    def as_bytes(v):
        if isinstance(v, (bool, np.bool_)):
            return bytes([1 if v else 0])
        if isinstance(v, int):
            return int(v).to_bytes(8, "little", signed=v < 0)
        return bytes(v)

    numba_bytes = [as_bytes(v).hex() for v in kargs]
    k = L.Kernel(kern, sig)
    raw = k.packed_params(*vals)
    ours = [raw[8 * i: 8 * i + s].hex() for i, s in enumerate(k.plan.param_sizes())]
    print(json.dumps({"ptx_sizes": sizes, "plan_sizes": k.plan.param_sizes(),
                      "numba": numba_bytes, "ours": ours}))
""")


def test_abi_matches_numba():
    """Our packing == Numba's ``_prepare_args`` byte for byte, and our
    parameter sizes == the compiled PTX's (real Numba-CUDA, no GPU needed)."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["NUMBA_ENABLE_CUDASIM"] = "0"
    proc = subprocess.run([sys.executable, "-c", _ABI_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=240)
    if proc.returncode != 0:
        if "NvvmSupportError" in proc.stderr or "libNVVM cannot be found" in proc.stderr:
            pytest.skip("no NVVM to compile PTX: " + proc.stderr.strip().splitlines()[-1])
        raise AssertionError(proc.stderr[-4000:])
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["plan_sizes"] == got["ptx_sizes"]
    assert len(got["numba"]) == len(got["ours"])
    for i, (mine, theirs) in enumerate(zip(got["ours"], got["numba"])):
        size = got["plan_sizes"][i]
        assert mine == theirs[:2 * size], (i, mine, theirs)


# --- caches, workspace, NVTX --------------------------------------------------------


def test_get_kernel_caches():
    calls = []

    def factory():
        calls.append(1)
        return scale, SCALE_SIG

    key = ("test", "scale", id(factory))
    k1 = L.get_kernel(key, factory)
    k2 = L.get_kernel(key, factory)
    assert k1 is k2 and len(calls) == 1 and k1.key == key


def _real_streams(count):
    """Raw handles of ``count`` new streams (the driver is asked about a workspace's stream:
    whether it is being captured into a graph), or made-up ones in the simulator."""
    if SIMULATOR:
        return [12345 + i for i in range(count)]
    made = [cuda.stream() for _ in range(count)]
    _real_streams.keep = made
    return [A._stream_from_obj(s) for s in made]


def test_workspace_cached_grown_zeroed():
    dev = 0
    stream, second = _real_streams(2)
    ptr, w = L.workspace(dev, stream, 100)
    assert w.size >= 100 and w.dtype == np.uint8 and ptr == w.ptr
    assert not np.any(A.as_numba(w).copy_to_host())
    ptr2, w2 = L.workspace(dev, stream, 50)
    assert ptr2 == ptr and w2 is w
    early = w.view(np.int32, 2)
    ptr3, w3 = L.workspace(dev, stream, w.size + 1)
    assert w3.size >= 2 * w.size
    assert not np.any(A.as_numba(w3).copy_to_host())
    assert any(old is w for old in L._WS_OLD)  # kept alive: earlier views stay valid
    A.as_numba(early)[1] = 5
    assert A.as_numba(w).copy_to_host().view(np.int32)[1] == 5
    other, _ = L.workspace(dev, second, 10)
    assert other != ptr3
    part = w3.view(np.int32, 4, offset=8)
    assert part.ptr == w3.ptr + 8


def test_nvtx_range_is_a_context_manager():
    with L.nvtx_range("cufold.test"):
        pass
    assert isinstance(L.NVTX, bool)


def test_launch_env_var():
    assert L._direct_from_env(None) is True
    assert L._direct_from_env("direct") is True
    assert L._direct_from_env(" Numba ") is False
    with pytest.warns(UserWarning, match="neither"):
        assert L._direct_from_env("cuda") is True


def test_disk_cache_files_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("CUFOLD_CACHE_DIR", str(tmp_path))
    p1 = L._cache_path("src-a", SCALE_SIG, {}, (9, 0))
    p2 = L._cache_path("src-b", SCALE_SIG, {}, (9, 0))
    p3 = L._cache_path("src-a", SCALE_SIG, {"fastmath": True}, (9, 0))
    assert len({p1, p2, p3}) == 3 and str(tmp_path) in p1 and "sm_90" in p1
    assert L._write_cubin(p1, "_Z6kernel", b"\x7fELF...")
    assert L._read_cubin(p1) == ("_Z6kernel", b"\x7fELF...")
    assert L._read_cubin(p2) is None


# --- GPU: direct path against the dispatcher, foreign arrays, disk cache --------------


@gpu_only
def test_direct_matches_dispatcher_numba_arrays(rng, monkeypatch):
    n = 1000
    h = rng.standard_normal(n).astype(np.float32)
    x = A.describe(cuda.to_device(h))
    k = L.Kernel(scale, SCALE_SIG)
    outs = []
    for direct in (True, False):
        monkeypatch.setattr(L, "DIRECT", direct)
        obj, out = A.empty(x, (n,), np.float32)
        k.launch(8, 128, 0, 0, out, x, 3.0, n)
        outs.append(obj.copy_to_host())
    assert k._funcs
    np.testing.assert_array_equal(outs[0], outs[1])


@gpu_only
def test_direct_torch(rng):
    torch = pytest.importorskip("torch")
    n = 777
    xt = torch.randn(n, device="cuda", dtype=torch.float32)
    x = A.describe(xt)
    obj, out = A.empty(x, (n,), np.float32)
    k = L.Kernel(scale, SCALE_SIG)
    k.launch(7, 128, A.stream_handle(x), 0, out, x, 0.5, n)
    torch.testing.assert_close(obj, xt * 0.5)
    # tuple + strided + a side stream
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    y = torch.randn(2 * n, device="cuda")[::2]
    xs = A.describe_many((xt, y))
    with torch.cuda.stream(s):
        obj2, out2 = A.empty(xs[0], (n,), np.float32)
        kp = L.Kernel(axpy_pair, PAIR_SIG)
        kp.launch(7, 128, A.stream_handle(xs), 0, out2, xs, 2.0, n)
    s.synchronize()
    torch.testing.assert_close(obj2, xt * 2 + y)
    # 0-d
    obj3, out3 = A.empty(x, (), np.float32)
    L.Kernel(first_times, ZERO_D_SIG).launch(1, 32, A.stream_handle(x), 0, out3, x, 4.0)
    assert float(obj3) == pytest.approx(float(xt[0]) * 4)


@gpu_only
def test_direct_cupy(rng):
    cp = pytest.importorskip("cupy")
    n = 513
    xc = cp.asarray(rng.standard_normal(n).astype(np.float32))
    x = A.describe(xc[::-1])
    obj, out = A.empty(x, (n,), np.float32)
    L.Kernel(scale, SCALE_SIG).launch(5, 128, A.stream_handle(x), 0, out, x, -1.0, n)
    cp.testing.assert_allclose(obj, -xc[::-1])


@gpu_only
def test_disk_cache_new_kernel_loads_cubin(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("CUFOLD_CACHE_DIR", str(tmp_path))
    n = 300
    h = rng.standard_normal(n).astype(np.float32)
    x = A.describe(cuda.to_device(h))
    key = "test_disk_cache scale v1 %d" % os.getpid()
    k1 = L.Kernel(scale, SCALE_SIG, disk_key=key)
    obj, out = A.empty(x, (n,), np.float32)
    k1.launch(3, 128, 0, 0, out, x, 2.0, n)
    assert k1.loaded_from_disk[x.device_id] is False
    files = list(tmp_path.rglob("*.cubin"))
    assert len(files) == 1
    k2 = L.Kernel(scale, SCALE_SIG, disk_key=key)
    obj2, out2 = A.empty(x, (n,), np.float32)
    k2.launch(3, 128, 0, 0, out2, x, 2.0, n)
    assert k2.loaded_from_disk[x.device_id] is True
    assert k2._dispatcher is None  # nothing was compiled
    np.testing.assert_array_equal(obj2.copy_to_host(), h * np.float32(2))


def _sum_key(op):
    from cufold.values import ValueType
    f32 = ValueType.of(np.float32)
    return (("reduce", (op, f32, f32, "warp", (64, 2))), ((np.dtype(np.float32), 1, True), int, np.float32))


def test_library_disk_key(monkeypatch):
    """The library's kernels are cached on disk only when their key pins their
    code down: cufold's own operators, plain data, and users' operators with a
    fingerprint (one named like a built-in is a user's too); an operator using
    an array is not pinned. The text changes with every tuning knob."""
    import cufold
    monkeypatch.setenv("CUFOLD_CACHE", "1")
    key = _sum_key(cufold.plus)
    text = L.library_disk_key(key)
    assert text is not None and L.source_digest() in text and repr(key) in text
    assert L.library_disk_key(_sum_key(cufold.plus)) == text
    user = cufold.Op(lambda a, b: a + b, identity=0)
    user_text = L.library_disk_key(_sum_key(user))
    assert user_text is not None and user_text != text and user.fingerprint() in user_text
    named_plus = cufold.Op(lambda a, b: a + b, identity=0, name="plus")
    assert L.library_disk_key(_sum_key(named_plus)) not in (None, text)
    table = np.arange(4.0)
    assert L.library_disk_key(_sum_key(cufold.Op(lambda a, b: a + b * table[0]))) is None
    assert L.library_disk_key(key + (print,)) is None          # a function: its code is not in the text
    monkeypatch.setenv("CUFOLD_TILE", "128x4")
    assert L.library_disk_key(key) not in (None, text)
    monkeypatch.setenv("CUFOLD_CACHE", "0")
    assert L.library_disk_key(key) is None
    monkeypatch.delenv("CUFOLD_CACHE")
    monkeypatch.delenv("CUFOLD_TILE")
    assert L.library_disk_key(key) == text                     # on by default


def test_source_digest_is_stable_across_processes():
    """The same sources give the same digest in a new process (no addresses or
    orderings of one process in it)."""
    code = "from cufold.host import launch as _launch; print(_launch.source_digest())"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == L.source_digest()


def _two_processes(code, cache_dir):
    """The output of ``code`` run in two new processes, one after the other, sharing the
    disk cache in ``cache_dir`` (the second should load what the first compiled)."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUFOLD_CACHE="1", CUFOLD_CACHE_DIR=str(cache_dir))
    outs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    return outs


@gpu_only
def test_library_kernels_load_from_disk(tmp_path):
    """A second process loads cufold.sum's kernel from the disk
    cache (compiling nothing) and gets the same result."""
    code = textwrap.dedent("""
        import numpy as np
        from numba import cuda
        import cufold, importlib
        L = importlib.import_module("cufold.host.launch")
        x = cuda.to_device((np.arange(100000) % 7).astype(np.float32))   # exact sums
        total = float(cufold.sum(x).copy_to_host())
        print(total, sorted(set(v for k in L._kernels.values() for v in k.loaded_from_disk.values())))
    """)
    (first, first_loaded), (second, second_loaded) = [out.split(" ", 1)
                                                      for out in _two_processes(code, tmp_path)]
    assert first == second == repr(float((np.arange(100000) % 7).sum()))
    assert first_loaded.strip() == "[False]" and second_loaded.strip() == "[True]"
    assert list(tmp_path.rglob("*.cubin"))


_USER_OP_KEYS = """
import json, sys
import numpy as np
import cufold
from cufold.host import launch as L
from cufold.values import ValueType
SCALE = float(sys.argv[1])
f32 = ValueType.of(np.float32)
table = np.arange(3.0)

def key(op):   # as test_launch._sum_key
    return (("reduce", (op, f32, f32, "warp", (64, 2))), ((np.dtype(np.float32), 1, True), int, np.float32))

pinned = cufold.Op(lambda a, b: max(a, b) * SCALE, identity=0.0, commutative=True)
unpinned = cufold.Op(lambda a, b: max(a, b) * table[1])
print(json.dumps([L.library_disk_key(key(pinned)), L.library_disk_key(key(unpinned))]))
"""


def test_user_operator_disk_key_is_stable_across_processes():
    """A user's operator that its fingerprint pins down gives its kernel a disk key,
    the same in every new process running the same source with the same values,
    another one where a global it uses has another value (``SCALE``); one using an
    array gives none."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), CUFOLD_CACHE="1")

    def keys(scale):
        got = subprocess.run([sys.executable, "-c", _USER_OP_KEYS, scale], env=env, capture_output=True,
                             text=True, timeout=300)
        assert got.returncode == 0, got.stderr[-3000:]
        return json.loads(got.stdout)

    (first, unpinned), (second, _), (rescaled, _) = keys("2.0"), keys("2.0"), keys("3.0")
    assert first is not None and first == second
    assert rescaled is not None and rescaled != first
    assert unpinned is None


@gpu_only
def test_user_operator_kernels_load_from_disk(tmp_path):
    """A second process loads the kernels of reductions with users' operators (a
    lambda, an Op with a closure) from the disk cache, compiling nothing, and gets
    the same results."""
    code = textwrap.dedent("""
        import numpy as np
        from numba import cuda
        import cufold, importlib
        L = importlib.import_module("cufold.host.launch")

        def scaled(k):
            return cufold.Op(lambda a, b: a + b * k, identity=0.0, commutative=True)

        x = cuda.to_device((np.arange(100000) % 7).astype(np.float32))   # exact sums and maxima
        results = [float(cufold.reduce(x, lambda a, b: max(a, b)).copy_to_host()),
                   float(cufold.reduce(x, scaled(1.0)).copy_to_host())]
        kernels = list(L._kernels.values())
        print(results, sorted(set(v for k in kernels for v in k.loaded_from_disk.values())),
              sum(k._dispatcher is not None for k in kernels), sep="|")
    """)
    (first, first_loaded, first_compiled), (second, second_loaded, second_compiled) = [
        out.strip().split("|") for out in _two_processes(code, tmp_path)]
    h = (np.arange(100000) % 7).astype(np.float32)
    assert first == second == repr([float(h.max()), float(h.sum())])
    assert first_loaded == "[False]" and int(first_compiled) > 0
    assert second_loaded == "[True]" and second_compiled == "0"
    assert list(tmp_path.rglob("*.cubin"))


@gpu_only
def test_launch_error_is_clear():
    x = A.describe(cuda.to_device(np.zeros(4, np.float32)))
    k = L.Kernel(scale, SCALE_SIG)
    with pytest.raises(L.LaunchError, match="launching kernel scale failed"):
        k.launch(1, 4096, 0, 0, x, x, 1.0, 4)  # too many threads per block


def test_bounded_cache_starts_again_when_full():
    """The per-call caches (bound launches per length, streams, users' operators) stay
    bounded: the entry past the limit finds the cache emptied."""
    c = L.BoundedCache(3)
    for k in range(3):
        assert c.put(k, str(k)) == str(k)
    assert c.get(2) == "2" and len(c) == 3
    assert c.put("next", 1) == 1
    assert dict(c) == {"next": 1}


def test_pointer_slots_of_tuple_members():
    """The data pointer of array j of a tuple argument sits after the slots of the
    members before it (5 + 2 * ndim per array): found on Numba's tuple types, which
    take no slices."""
    from numba import types as nbt
    a1, a2 = nbt.Array(nbt.float32, 1, "C"), nbt.Array(nbt.int64, 2, "A")
    k = L.Kernel(lambda x, t: None, (nbt.int64, nbt.Tuple((a1, a2, a1))))
    assert L._pointer_slot(k, (1, "ptr", 0)) == 1 + 4
    assert L._pointer_slot(k, (1, "ptr", 1)) == 1 + 7 + 4
    assert L._pointer_slot(k, (1, "ptr", 2)) == 1 + 7 + 9 + 4
    k2 = L.Kernel(lambda x: None, (nbt.UniTuple(a1, 3),))
    assert L._pointer_slot(k2, (0, "ptr", 2)) == 14 + 4


def test_every_call_opens_an_nvtx_range(monkeypatch):
    """With the nvtx package there, each device-wide call runs in a range named after
    it (one mechanism: the Programs' run); without it, nothing is entered."""
    import cufold
    opened = []

    class Range:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            opened.append(self.name)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(L, "NVTX", True)
    monkeypatch.setattr(L, "nvtx_range", Range)
    x = cuda.to_device(np.arange(300, dtype=np.float32))
    cufold.sum(x)
    cufold.inclusive_scan(x)
    cufold.segmented_reduce(x, cuda.to_device(np.array([0, 100, 300])))
    cufold.histogram(x, 8, range=(0, 300))
    assert opened == ["cufold.sum", "cufold.scan", "cufold.segmented_reduce", "cufold.histogram"]
    monkeypatch.setattr(L, "NVTX", False)
    del opened[:]
    cufold.sum(x)
    assert opened == []


def test_compiled_launcher_passes_the_driver_its_arguments():
    """cufold.host.native's launcher calls the function at ``entry`` with
    cuLaunchKernel's C signature: here a ctypes callback standing in for the
    driver records what it got (no GPU needed: the launcher is CPU code)."""
    from cufold.host import native
    got = []
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, *([ctypes.c_uint] * 7),
                             ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64)

    def fake_cu_launch_kernel(*args):
        got.append(args)      # (a ctypes callback takes the interpreter lock the launcher let go)
        return 719            # a CUresult the caller must see

    fake = proto(fake_cu_launch_kernel)
    launch = native.launcher(ctypes.cast(fake, ctypes.c_void_p).value)
    function, stream, params = 0x7F12_3456_7890, 0x5555_0000_1234, 0x7FFF_0000_0008
    assert launch(function, 65535 * 4, 2, 3, 256, 1, 1, 49152, stream, params, 0) == 719
    assert got == [(function, 65535 * 4, 2, 3, 256, 1, 1, 49152, stream, params, 0)]
    assert launch((1 << 64) - 1, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0) == 719       # all ones is an integer too
    assert got[-1][0] == (1 << 64) - 1
    with pytest.raises(TypeError, match="11 integers"):
        launch(1, 2, 3)
    with pytest.raises(TypeError):
        launch(function, 1.5, 1, 1, 32, 1, 1, 0, 0, 0, 0)
    assert len(got) == 2                  # neither bad call reached the driver


_NO_BLAS_SCRIPT = """
import importlib, json, sys
from cufold.host import launch as L
linalg = importlib.import_module("numba.cuda.np.linalg")
before = linalg.ensure_blas
L._target_without_blas()
L._target_without_blas()                                   # once is enough; twice is harmless
math = importlib.import_module("numba.cuda.np.arraymath")
got = {"have_blas": math._HAVE_BLAS, "scipy_linalg": "scipy.linalg" in sys.modules,
       "restored": linalg.ensure_blas is before and math.ensure_blas is before}
try:
    import scipy.linalg.cython_blas  # noqa: F401  (SciPy's users import it as before)
    got["scipy_later"] = True
except ImportError as e:
    got["scipy_later"] = "no scipy" if "scipy" in str(e) and "cufold" not in str(e) else str(e)
print(json.dumps(got))
"""


def test_target_loads_without_blas():
    """The first compile's load of Numba-CUDA's array math finds no BLAS (SciPy's OpenBLAS
    would start a spinning thread a core in the middle of a cold compile), leaves Numba's
    ``ensure_blas`` as it was, and SciPy imports as before afterwards (real Numba-CUDA, no GPU
    needed)."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["NUMBA_ENABLE_CUDASIM"] = "0"
    proc = subprocess.run([sys.executable, "-c", _NO_BLAS_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["have_blas"] is False and got["scipy_linalg"] is False and got["restored"] is True
    assert got["scipy_later"] in (True, "no scipy")
