"""``python -m cufold demo``: seed 002's reduction and scan demonstration.

Runs on the GPU when there is one, otherwise on Numba's CPU simulator (the
process re-executes itself with ``NUMBA_ENABLE_CUDASIM=1``), and says which.
"""

import os
import sys

import numpy as np
from numba import config, cuda


def _print_array(values, fmt="%4d", per_row=10):
    for row in range(0, len(values), per_row):
        print("%5d: " % row + "".join(" " + fmt % v for v in values[row:row + per_row]))


def _where():
    if config.ENABLE_CUDASIM:
        return "Numba's CPU simulator (no GPU found)"
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    return "GPU %s (sm_%d%d)" % ((name,) + tuple(dev.compute_capability))


def _ensure_backend(seed):
    """Re-execute under the simulator when there is no usable GPU."""
    if config.ENABLE_CUDASIM or cuda.is_available():
        return
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    args = [sys.executable, "-m", "cufold", "demo"] + ([] if seed is None else ["--seed", str(seed)])
    sys.stdout.flush()
    os.execve(sys.executable, args, env)


def run(seed=None):
    _ensure_backend(seed)
    import cufold

    rng = np.random.default_rng(seed)
    print("cufold demo, running on %s" % _where())

    print("\n\nREDUCTION AND SCAN DEMONSTRATION:\n")
    data = cuda.to_device(rng.integers(0, 10, size=100, dtype=np.int32))
    print("Input array:")
    _print_array(data.copy_to_host())
    total = cufold.reduce(data, cufold.plus)
    print("Reduction total: %d\n" % _host(total))
    scanned, scan_total = cufold.exclusive_scan(data, cufold.plus, total=True)
    print("Exclusive scan:")
    _print_array(scanned.copy_to_host())
    print("Scan total: %d" % _host(scan_total))

    print("\n\nMAX-REDUCE DEMONSTRATION:\n")
    data = cuda.to_device(rng.integers(0, 1000, size=100, dtype=np.int32))
    print("Input array:")
    _print_array(data.copy_to_host())
    print("\nInclusive max scan:")
    _print_array(cufold.inclusive_scan(data, cufold.maximum).copy_to_host())
    print("\nMax reduction: %d." % _host(cufold.reduce(data, cufold.maximum)))
    return 0


def _host(value):
    return value.copy_to_host()[()] if hasattr(value, "copy_to_host") else value
