"""Compile generated source into Numba-CUDA device functions.

cufold separates the algorithm from the data it reduces (seed 003): the
algorithms are ordinary Python closures, while the few routines that depend on
the *shape* of a value (how many fields it has, how each field is shuffled,
loaded, stored or cast) are generated per value type from short source
templates. Generated source is registered with ``linecache`` so that
tracebacks and the CPU simulator show the real lines.
"""

import itertools
import linecache

import numpy as np
from numba import cuda

_serial = itertools.count()


def build(source, name, env=None, device=True):
    """Execute ``source`` and return its function ``name``.

    ``env`` supplies the globals the source refers to (device functions,
    constants). ``cuda`` and ``np`` are always present; the simulator swaps
    ``cuda`` for its fake module inside these globals, as for any kernel.
    With ``device=True`` the function is wrapped with ``cuda.jit(device=True)``.
    """
    filename = "<cufold-generated-%d:%s>" % (next(_serial), name)
    namespace = {"cuda": cuda, "np": np}
    if env:
        namespace.update(env)
    lines = source.splitlines(True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    exec(compile(source, filename, "exec"), namespace)
    fn = namespace[name]
    return cuda.jit(device=True)(fn) if device else fn


def device(fn):
    """Wrap a Python function as a device function (idempotent)."""
    if hasattr(fn, "py_func") or type(fn).__name__ == "FakeCUDAKernel":
        return fn
    return cuda.jit(device=True)(fn)
