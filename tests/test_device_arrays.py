"""cufold.host.arrays: describing, allocating and streaming device arrays.

Runs in the simulator (Numba's simulated device arrays) and on a GPU (torch,
cupy, numba and jax arrays when importable).
"""

import numpy as np
import pytest
from numba import cuda

from conftest import gpu_only, simulator_only

from cufold.host import arrays as A
from cufold.host.arrays import Arr, describe, describe_many, empty, stream_handle


def _dev(host):
    return cuda.to_device(np.ascontiguousarray(host))


# --- errors ----------------------------------------------------------------------


def test_host_numpy_rejected_with_hint():
    with pytest.raises(TypeError) as e:
        describe(np.arange(4.0), "x")
    msg = str(e.value)
    assert msg.startswith("cufold: x is a host (NumPy) array; move it to the GPU first")
    assert "cupy.asarray(x)" in msg and "torch.as_tensor(x, device='cuda')" in msg
    assert "numba.cuda.to_device(x)" in msg


@pytest.mark.parametrize("host", [[1.0, 2.0], 3.0, np.float32(1), (1, 2)])
def test_other_host_objects_rejected(host):
    with pytest.raises(TypeError, match="is a host"):
        describe(host, "values")


def test_unsupported_object_names_its_type():
    class Thing:
        pass

    with pytest.raises(TypeError, match="Thing"):
        describe(Thing(), "x")


def test_name_appears_in_message():
    with pytest.raises(TypeError, match="cufold: keys is a host"):
        describe(np.zeros(3), "keys")


# --- simulator arrays ------------------------------------------------------------


@simulator_only
def test_describe_sim_contiguous():
    h = np.arange(10, dtype=np.float32)
    x = _dev(h)
    a = describe(x)
    assert a.library == "sim"
    assert a.obj is x
    assert a.ptr == x._ary.__array_interface__["data"][0]
    assert a.shape == (10,) and a.strides == (1,) and a.byte_strides == (4,)
    assert a.dtype == np.float32 and a.itemsize == 4
    assert a.size == 10 and a.ndim == 1 and a.device_id == 0
    assert a.c_contiguous and a.f_contiguous


@simulator_only
def test_describe_sim_strided_slice():
    x = _dev(np.arange(10, dtype=np.int64))
    base = describe(x)
    v = x[1::3]
    a = describe(v)
    assert a.shape == (3,) and a.strides == (3,) and a.byte_strides == (24,)
    assert a.ptr == base.ptr + 8
    assert not a.c_contiguous
    assert describe(x[::2]).strides == (2,)


@simulator_only
def test_describe_sim_zero_d_and_2d():
    z = cuda.device_array((), dtype=np.float64)
    a = describe(z)
    assert a.shape == () and a.strides == () and a.size == 1 and a.ndim == 0
    m = _dev(np.zeros((3, 4), np.int16))
    b = describe(m)
    assert b.shape == (3, 4) and b.strides == (4, 1) and b.byte_strides == (8, 2)
    t = describe(m.T)
    assert t.shape == (4, 3) and t.strides == (1, 4) and t.f_contiguous and not t.c_contiguous


def test_describe_is_idempotent_on_arr():
    a = Arr(0, (3,), (1,), np.dtype(np.float32), 3, "cai", None, 0)
    assert describe(a) is a


# --- generic protocols (no GPU memory is touched) ---------------------------------


class _CAI:
    def __init__(self, **kw):
        self.__cuda_array_interface__ = dict(kw)


def test_describe_cuda_array_interface():
    x = _CAI(shape=(4, 5), typestr="<f4", data=(0x1000, False), strides=None, version=3)
    a = describe(x)
    assert a.library == "cai" and a.ptr == 0x1000
    assert a.shape == (4, 5) and a.strides == (5, 1) and a.dtype == np.float32 and a.size == 20
    assert a.stream is None
    y = _CAI(shape=(3,), typestr="<i8", data=(0x2000, False), strides=(16,), version=3, stream=7)
    b = describe(y)
    assert b.strides == (2,) and b.stream == 7


def test_describe_cai_mask_and_bad_strides():
    with pytest.raises(TypeError, match="masked"):
        describe(_CAI(shape=(2,), typestr="<f4", data=(16, False), mask=object(), version=1))
    with pytest.raises(ValueError, match="not a multiple"):
        describe(_CAI(shape=(2,), typestr="<f4", data=(16, False), strides=(6,), version=3))


class _FakeDL:
    """Exposes a NumPy array's DLPack capsule while claiming a CUDA device:
    exercises the capsule parser without a GPU."""

    def __init__(self, a, device=(2, 0)):
        self.a, self.device = a, device

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()


def test_describe_dlpack_capsule_parsing():
    h = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    a = describe(_FakeDL(h))
    assert a.library == "dlpack"
    assert a.ptr == h.__array_interface__["data"][0]
    assert a.shape == (3, 2) and a.strides == (4, 2) and a.dtype == np.int32
    c = np.zeros(5, np.complex64)
    assert describe(_FakeDL(c)).dtype == np.complex64
    b = np.zeros(3, np.bool_)
    assert describe(_FakeDL(b)).dtype == np.bool_


def test_dlpack_on_cpu_is_host():
    with pytest.raises(TypeError, match="is a host"):
        describe(_FakeDL(np.zeros(3), device=(1, 0)), "x")


# --- tuples ----------------------------------------------------------------------


def _arr(n, dev=0, dt=np.float32):
    return Arr(0x100, (n,), (1,), np.dtype(dt), n, "cai", None, dev)


def test_describe_many_checks_lengths():
    with pytest.raises(ValueError, match="equally long.*10, 12"):
        describe_many((_arr(10), _arr(12)), "x")
    with pytest.raises(ValueError, match="empty"):
        describe_many((), "x")
    one = _arr(4)
    assert describe_many(one) == (one,)
    got = describe_many([_arr(3), _arr(3, dt=np.int64)])
    assert len(got) == 2 and got[1].dtype == np.int64


def test_describe_many_checks_devices():
    with pytest.raises(ValueError, match="several GPUs"):
        describe_many((_arr(4, 0), _arr(4, 1)), "pairs")
    assert A.same_device((_arr(1, 1), _arr(2, 1))) == 1


@simulator_only
def test_describe_many_sim_arrays():
    xs = (_dev(np.zeros(5, np.float32)), _dev(np.ones(5, np.int32)))
    a, b = describe_many(xs)
    assert a.dtype == np.float32 and b.dtype == np.int32 and a.library == b.library == "sim"
    with pytest.raises(ValueError, match="5, 6"):
        describe_many((xs[0], _dev(np.zeros(6))), "x")
    with pytest.raises(TypeError, match=r"x\[1\] is a host"):
        describe_many((xs[0], np.zeros(5)), "x")


# --- allocation ------------------------------------------------------------------


@simulator_only
@pytest.mark.parametrize("shape", [(), 5, (2, 3), (0,)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_empty_sim(shape, dtype):
    like = describe(_dev(np.zeros(3, np.float32)))
    obj, a = empty(like, shape, dtype)
    want = (shape,) if isinstance(shape, int) else shape
    assert obj.shape == want and a.shape == want
    assert a.dtype == np.dtype(dtype) and a.library == "sim"
    assert a.ptr == obj._ary.__array_interface__["data"][0]
    assert a.c_contiguous
    obj[...] = 1
    assert np.all(obj.copy_to_host() == 1)


def test_view_carves_bytes():
    base = Arr(1000, (64,), (1,), np.dtype(np.uint8), 64, "cai", None, 0)
    v = base.view(np.float32, 4, offset=16)
    assert v.ptr == 1016 and v.shape == (4,) and v.dtype == np.float32 and v.size == 4
    w = base.view(np.int64)
    assert w.shape == (8,)
    with pytest.raises(ValueError, match="exceeds"):
        base.view(np.float64, 9)
    with pytest.raises(ValueError, match="multiple"):
        base.view(np.float32, 2, offset=2)


@simulator_only
def test_view_as_numba_writes_through_sim():
    buf = cuda.to_device(np.zeros(32, np.uint8))
    base = describe(buf)
    v = base.view(np.int32, (2, 2), offset=8)
    nb = A.as_numba(v)
    nb[1, 1] = 7
    raw = buf.copy_to_host().view(np.int32)
    assert raw[2 + 3] == 7 and raw.sum() == 7


@simulator_only
def test_as_numba_sim_returns_the_array():
    x = _dev(np.zeros(3))
    assert A.as_numba(describe(x)) is x


# --- streams ---------------------------------------------------------------------


def test_stream_handle_int_and_default():
    a = _arr(4)
    assert stream_handle(a, 0x1234) == 0x1234
    assert stream_handle(a) == 0
    assert stream_handle((a, _arr(4)), 5) == 5


def test_stream_handle_objects():
    class TorchLike:
        cuda_stream = 77

    class CoreLike:
        def __cuda_stream__(self):
            return (0, 99)

    a = _arr(4)
    assert stream_handle(a, TorchLike()) == 77
    assert stream_handle(a, CoreLike()) == 99


@simulator_only
def test_stream_handle_sim_stream():
    assert stream_handle(_arr(4), cuda.stream()) == 0


def test_stream_handle_rejects_junk():
    with pytest.raises(TypeError, match="stream="):
        stream_handle(_arr(4), object())


# --- GPU: real libraries -----------------------------------------------------------


@gpu_only
def test_numba_device_array():
    h = np.arange(20, dtype=np.float64)
    x = cuda.to_device(h)
    a = describe(x)
    assert a.library == "numba" and a.ptr == x.device_ctypes_pointer.value
    assert a.shape == (20,) and a.strides == (1,) and a.dtype == np.float64
    s = describe(x[2::3])
    assert s.ptr == a.ptr + 16 and s.strides == (3,) and s.shape == (6,)
    obj, o = empty(a, (), np.float32)
    assert isinstance(obj, type(x)) and obj.shape == () and o.ptr == obj.device_ctypes_pointer.value
    assert stream_handle(a) == 0
    st = cuda.stream()
    assert stream_handle(a, st) == int(st.handle)


@gpu_only
def test_torch_tensor():
    torch = pytest.importorskip("torch")
    x = torch.arange(30, dtype=torch.float32, device="cuda")
    a = describe(x)
    assert a.library == "torch" and a.ptr == x.data_ptr() and tuple(a.shape) == (30,)
    assert a.strides == (1,) and a.dtype == np.float32 and a.device_id == x.device.index
    s = describe(x[1::4])
    assert s.ptr == x.data_ptr() + 4 and s.strides == (4,) and s.size == 8
    obj, o = empty(a, (), np.float64)
    assert isinstance(obj, torch.Tensor) and obj.is_cuda and obj.dtype == torch.float64
    assert obj.shape == () and o.ptr == obj.data_ptr()
    assert stream_handle(a) == torch.cuda.current_stream().cuda_stream
    s2 = torch.cuda.Stream()
    assert stream_handle(a, s2) == s2.cuda_stream
    obj2, o2 = empty(a, (4,), np.int32, stream=s2.cuda_stream)
    assert obj2.dtype == torch.int32 and o2.shape == (4,)
    with pytest.raises(TypeError, match="is a host"):
        describe(torch.zeros(3), "x")


@gpu_only
def test_cupy_array():
    cp = pytest.importorskip("cupy")
    x = cp.arange(40, dtype=cp.int32)
    a = describe(x)
    assert a.library == "cupy" and a.ptr == x.data.ptr and a.shape == (40,)
    assert a.strides == (1,) and a.dtype == np.int32
    s = describe(x[::-2])
    assert s.strides == (-2,) and s.ptr == x.data.ptr + 39 * 4
    obj, o = empty(a, (3, 2), np.float32)
    assert isinstance(obj, cp.ndarray) and obj.shape == (3, 2) and o.ptr == obj.data.ptr
    assert stream_handle(a) == cp.cuda.get_current_stream().ptr
    st = cp.cuda.Stream()
    assert stream_handle(a, st) == st.ptr


@gpu_only
def test_jax_array():
    jnp = pytest.importorskip("jax.numpy")
    import jax
    try:
        x = jax.device_put(jnp.arange(16, dtype=jnp.float32), jax.devices("gpu")[0])
    except RuntimeError:
        pytest.skip("jax has no GPU backend")
    a = describe(x)
    assert a.library == "jax" and a.shape == (16,) and a.dtype == np.float32 and a.ptr
    obj, o = empty(a, (), np.float32)
    out = A.to_library(obj, o)
    assert isinstance(out, jax.Array)
