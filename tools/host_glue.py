"""Time cufold's own host-side glue per call, with the GPU steps stubbed out.

Runs anywhere, no GPU needed: describing the input, allocating the output,
querying the stream and the launch itself are replaced by stubs, so what is
left is cufold's Python between them (plans, caches, argument assembly). Add
the measured costs of those steps on the GPU (docs/performance.md) to predict
a call's host time.

    PYTHONPATH=src python tools/host_glue.py
"""
import importlib
import sys
import time
import types

import numpy as np

import cufold
from cufold.host import arrays as _arrays, launch as _launch

R = importlib.import_module("cufold.device.reduce")
S = importlib.import_module("cufold.device.scan")

_in = _arrays.Arr(0x7000_0000, (1024,), (1,), np.dtype(np.float32), 1024, "torch", object(), 0)
_arrays.describe = lambda x, name="x", stream=None: _in
_arrays.empty = lambda like, shape, dtype, stream=None: (
    object(), _arrays.Arr(0x7100_0000, tuple(shape), (1,) * len(shape), np.dtype(dtype), 1024 if shape else 1,
                          "torch", object(), 0))
_arrays.stream_handle = lambda like, stream=None: 0
_out1 = _arrays.Arr(0x7200_0000, (1,), (1,), np.dtype(np.float32), 1, "torch", object(), 0)
_arrays.scalar_results = lambda like, dtype, stream: (lambda: (object(), _out1.ptr))
_arrays.vector_allocator = lambda like, n, dtype: (lambda obj: (object(), 0x7300_0000))
_launch.Kernel.launch = lambda self, *a: None
_launch.DIRECT = False  # bound launches take the Kernel.launch fallback, stubbed above
_ws = _arrays.Arr(0x7400_0000, (1 << 24,), (1,), np.dtype(np.uint8), 1 << 24, "torch", None, 0)
_launch.workspace = lambda dev, stream, nbytes: (_ws.ptr, _ws)
_flags = _arrays.Arr(0x7500_0000, (4096,), (1,), np.dtype(np.uint32), 4096, "torch", None, 0)
_state = types.SimpleNamespace(counter=_flags, flags=(_flags, _flags), words=(_flags, _flags))
S._look_back_state = lambda dev, stream, tiles: (_state, np.uint32(4))
R._counters[(0, 0)] = _flags
R._resident_blocks = lambda dev, nt: 1056

for name, call in (("cufold.sum", cufold.sum), ("cufold.inclusive_scan", cufold.inclusive_scan)):
    x = object()
    call(x)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(5000):
            call(x)
        best = min(best, (time.perf_counter() - t) / 5000 * 1e6)
    print("%-24s glue %.2f us per call (best of 5)" % (name, best))
sys.exit(0)
