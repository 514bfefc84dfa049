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
