"""Test set-up: the same tests run on a real GPU and in Numba's CPU simulator.

With no GPU on the machine (CI), the simulator is switched on before numba is
imported, and cufold installs its warp intrinsics into it. Set
``NUMBA_ENABLE_CUDASIM`` yourself to force either mode.
"""

import glob
import sys
import zlib
import os

if "NUMBA_ENABLE_CUDASIM" not in os.environ and not glob.glob("/dev/nvidia[0-9]*"):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    # Each simulated CUDA thread is a Python thread; a shorter switch interval
    # makes their many rendezvous (barriers, shuffles) about 1.5x faster.
    sys.setswitchinterval(0.001)
# JAX takes 75% of the GPU's memory when it first runs; the test workers share one GPU.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba import config, cuda  # noqa: E402

import cufold  # noqa: E402,F401  (installs the simulator's warp intrinsics)

SIMULATOR = bool(config.ENABLE_CUDASIM)


def _pin_xdist_worker_to_a_core():
    """Simulator under pytest-xdist: each worker on a core of its own (``gwN`` on the
    N-th allowed core, wrapping round). The simulator runs a launch's threads on the
    core the launching thread is on at that moment (``cufold.simulator._pin_cpu``);
    unpinned, two workers often launched from the same core and took turns on it
    while the other core idled (CI's 2 cores: the suite ran 15-25% longer).
    ``CUFOLD_SIM_PIN=0`` turns this off with the simulator's own pinning."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not (SIMULATOR and worker.startswith("gw") and hasattr(os, "sched_setaffinity")):
        return
    from cufold.simulator import PIN_ENV
    if os.environ.get(PIN_ENV, "1") == "0":
        return
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})


_pin_xdist_worker_to_a_core()


def pytest_report_header(config):
    return "cufold: running kernels on %s" % ("the CPU simulator" if SIMULATOR else "the GPU")


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test name and a run salt
    (``CUFOLD_TEST_SEED``), printed on failure through the test id."""
    salt = int(os.environ.get("CUFOLD_TEST_SEED", "0"))
    seed = (zlib.crc32(request.node.nodeid.encode()) + salt) % (2**32)
    return np.random.default_rng(seed)


gpu_only = pytest.mark.skipif(SIMULATOR, reason="needs a real GPU")
simulator_only = pytest.mark.skipif(not SIMULATOR, reason="simulator behaviour")


def to_device(h):
    """A host array (or tuple of them) on the device, as a test input."""
    if isinstance(h, tuple):
        return tuple(to_device(a) for a in h)
    return cuda.to_device(np.ascontiguousarray(h))


def to_host(d):
    """A device result (or tuple of them) of any array library back on the host."""
    if isinstance(d, tuple):
        return tuple(to_host(a) for a in d)
    if hasattr(d, "copy_to_host"):   # Numba (and the simulator's) device arrays
        return d.copy_to_host()
    if hasattr(d, "get"):            # CuPy
        return d.get()
    if hasattr(d, "cpu"):            # PyTorch
        return d.cpu().numpy()
    return np.asarray(d)


def poison_value(dtype):
    """A value no result holds: what :func:`poison_allocations` fills arrays with."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return dt.type(-12345.5)
    if dt.kind in "iu":
        return dt.type(np.iinfo(dt).max - 3)
    return True


def poison_allocations(monkeypatch):
    """Every array the library allocates from now on starts full of :func:`poison_value`,
    so an element left unwritten fails the comparison."""
    from cufold.host import arrays
    real = arrays.empty

    def empty(like, shape, dtype, stream=None):
        obj, arr = real(like, shape, dtype, stream)
        if arr.size and hasattr(obj, "copy_to_device"):
            obj.copy_to_device(np.full(arr.shape, poison_value(dtype), dtype))
        return obj, arr

    monkeypatch.setattr(arrays, "empty", empty)


class _CAI:
    def __init__(self, keep, **kw):
        self.keep = keep
        self.__cuda_array_interface__ = dict(kw)


def strided_view(base, offset, shape, strides):
    """(device view, host view) of ``base`` (1-D, host): element ``offset``, element
    ``strides`` of any sign or zero (CuPy's negative strides, broadcasts)."""
    from numpy.lib.stride_tricks import as_strided
    isz = base.itemsize
    ref = as_strided(base[offset:], shape, tuple(s * isz for s in strides))
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        return FakeCUDAArray(as_strided(base.copy()[offset:], shape, tuple(s * isz for s in strides))), ref
    d = cuda.to_device(base)
    ptr = d.device_ctypes_pointer.value + offset * isz
    return _CAI(d, shape=tuple(shape), typestr=base.dtype.str, data=(ptr, False),
                strides=tuple(s * isz for s in strides), version=3), ref


def affine(p, q):
    """(a, b) o (c, d) = (a c, b c + d): x -> a x + b then x -> c x + d; not commutative."""
    return (p[0] * q[0], p[1] * q[0] + q[1])


#: ``(a, b)`` pairs composing affine maps: associative, not commutative
AFFINE = cufold.Op(affine, identity=(1, 0), name="affine")
AFFINE_NO_IDENTITY = cufold.Op(affine, name="affine_no_identity")


@pytest.fixture
def seg_small_tiles(monkeypatch):
    """Simulator: segmented tiles of one warp, 32 threads x 4 items (simulate fastest)."""
    if SIMULATOR:
        monkeypatch.setenv("CUFOLD_SEG_TILE", "32x4")


# --- what the simulator cannot see: PTX for a real GPU ------------------------------------------

_SM90_PREAMBLE = r"""
import os, re, sys
import numpy as np
os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
import numba.cuda.dispatcher as dispatcher
from numba import cuda, types

class Hopper:
    compute_capability = (9, 0)

dispatcher.get_current_device = lambda: Hopper()     # device functions ask for the CC


def compile_sm90(fn, sig):
    # the PTX of fn for sm_90; exits printing NO-NVVM where there is no NVVM
    try:
        return cuda.compile_ptx(fn, sig, cc=(9, 0))[0]
    except Exception as e:
        if "nvvm" in (type(e).__name__ + str(e)).lower():
            print("NO-NVVM", e)
            sys.exit(0)
        raise
"""


def run_sm90_script(script, marker, **env_extra):
    """Run ``script`` (after a preamble defining ``compile_sm90(fn, sig) -> ptx`` and
    ``types``, ``re``, ``np``, ``cuda``) in a subprocess without the simulator, so that
    it compiles for sm_90 through NVVM with no GPU, and return the Python literal it
    printed after ``marker``. Numba types integers differently from the NumPy scalars
    the simulator computes with; the PTX shows what a GPU will run. Skips the test
    where there is no NVVM."""
    import subprocess
    env = dict(os.environ, **env_extra)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _SM90_PREAMBLE + script], env=env, capture_output=True,
                          text=True, timeout=600)
    error = (proc.stderr.strip().splitlines() or [""])[-1]      # the exception's message
    if proc.returncode != 0 and ("nvvm" in error.lower() or "cudatoolkit" in error.lower()):
        pytest.skip("no NVVM to compile PTX: " + error[:200])
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "NO-NVVM" in proc.stdout:
        pytest.skip("no NVVM to compile PTX")
    import ast
    return ast.literal_eval(proc.stdout.split(marker, 1)[1].strip())


@pytest.fixture
def host_waits(monkeypatch):
    """``[count]`` of the host's waits for the device from now on: cufold's own
    (``host.readback``: ``read_to_host``, ``synchronize``) and reads back through the
    array libraries' copies (Numba's and the simulator's ``copy_to_host``); reset it
    by assigning ``count[0] = 0``."""
    from cufold.host import readback
    count = [0]

    def counted(real):
        def wrapped(*args, **kwargs):
            count[0] += 1
            return real(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(readback, "read_to_host", counted(readback.read_to_host))
    monkeypatch.setattr(readback, "synchronize", counted(readback.synchronize))
    device_array = type(cuda.to_device(np.zeros(1)))
    monkeypatch.setattr(device_array, "copy_to_host", counted(device_array.copy_to_host))
    return count


# Views for scans along an axis, one per kernel the planner picks (tests/test_scan_*.py):
# (offset, shape, strides) over a base of 2400 items, axis, the layout it must take
SCAN_VIEW_LAYOUTS = [
    ((0, (20, 16), (16, 1)), 1, "segments"),
    ((3, (6, 20), (80, 2)), 1, "lanes"),                 # strided rows
    ((0, (3, 300), (300, 1)), 1, "tiles"),               # rows of 3 simulator tiles: look-backs
    ((0, (40, 5), (5, 1)), 0, "columns"),
    ((0, (300, 3), (3, 1)), 0, "columns"),               # few columns: chunks, a spine, downsweep
    ((2399, (5, 33), (-40, -1)), 0, "columns"),          # a reversed view
    ((0, (2, 3, 4, 5), (60, 1, 15, 3)), 2, "gather"),    # 4-D permuted: gathered, then scanned
    ((0, (1, 300), (300, 1)), 1, "flat"),
]
