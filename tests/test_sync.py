"""The host waits for the GPU only where a result's size depends on the data or the
caller asked for a check, each documented in the function's docstring.

Every such wait goes through ``cufold.host.readback`` (``read_to_host``,
``synchronize``); the count also catches reads back through the array libraries'
own copies (Numba's, the simulator's ``copy_to_host``). Counted on the second call
of each signature (the first plans its Program, which may upload constants once).
On a GPU the CUDA-graph tests (tests/test_graphs.py) prove the same from the
other side: a call that synchronised could not be captured.
"""

import numpy as np
import pytest
from numba import cuda

import cufold
from conftest import SIMULATOR

# Simulator: 200 items are two reduce/scan/by-key tiles (64 x 2), several blocks: the
# multi-block finishes (last-block fold, look-back, merges) run; waits do not depend on
# the size beyond that, and each simulated block costs ~0.05 s a call.
N = 200 if SIMULATOR else 1 << 16


def _calls(rng):
    """(name, expected waits, call) for every public device function; fresh inputs."""
    d = cuda.to_device
    x = d(rng.standard_normal(N).astype(np.float32))
    xi = d(rng.integers(0, 60, N).astype(np.int32))
    m = d(rng.standard_normal((N // 10, 10)).astype(np.float32))
    sorted_keys = d(np.sort(rng.integers(0, N // 8, N)).astype(np.int32))
    offsets = d(np.linspace(0, N, 17).astype(np.int64))
    table = d(np.zeros(64, np.float64))
    edges = d(np.linspace(-3, 3, 9))
    return [
        ("reduce", 0, lambda: cufold.reduce(x, cufold.maximum)),
        ("sum", 0, lambda: cufold.sum(x)),
        ("sum axis=1", 0, lambda: cufold.sum(m, axis=1)),
        ("sum axis=0 keepdims", 0, lambda: cufold.sum(m, axis=0, keepdims=True)),
        ("prod", 0, lambda: cufold.prod(x)),
        ("min", 0, lambda: cufold.min(x)),
        ("max", 0, lambda: cufold.max(x)),
        ("argmin", 0, lambda: cufold.argmin(x)),
        ("argmax axis=1", 0, lambda: cufold.argmax(m, axis=1)),
        ("minmax", 0, lambda: cufold.minmax(x)),
        ("mean", 0, lambda: cufold.mean(x)),
        ("var", 0, lambda: cufold.var(x, ddof=1)),
        ("mean_var axis=0", 0, lambda: cufold.mean_var(m, axis=0)),
        ("inclusive_scan", 0, lambda: cufold.inclusive_scan(x)),
        ("exclusive_scan total", 0, lambda: cufold.exclusive_scan(x, total=True)),
        ("cumsum", 0, lambda: cufold.cumsum(xi)),
        ("cumprod", 0, lambda: cufold.cumprod(x)),
        ("cummax", 0, lambda: cufold.cummax(x)),
        ("cummin", 0, lambda: cufold.cummin(x)),
        ("segmented_reduce", 0, lambda: cufold.segmented_reduce(x, offsets)),
        ("reduce_by_key", 1, lambda: cufold.reduce_by_key(sorted_keys, x)),
        ("segmented_scan", 0, lambda: cufold.segmented_scan(x, offsets)),
        ("inclusive_scan_by_key", 0, lambda: cufold.inclusive_scan_by_key(sorted_keys, x)),
        ("exclusive_scan_by_key", 0, lambda: cufold.exclusive_scan_by_key(sorted_keys, x)),
        ("reduce_by_key_into check=False", 0,
         lambda: cufold.reduce_by_key_into(xi, x, table, check=False)),
        ("reduce_by_key_into check=False deterministic", 0,
         lambda: cufold.reduce_by_key_into(xi, x, table, check=False, deterministic=True)),
        ("reduce_by_key_into (checked)", 1, lambda: cufold.reduce_by_key_into(xi, x, table)),
        ("histogram range=", 0, lambda: cufold.histogram(x, 32, range=(-2, 2))),
        ("histogram host edges", 0, lambda: cufold.histogram(x, [-1.0, 0.0, 0.5, 1.0])),
        ("histogram (range of the data)", 1, lambda: cufold.histogram(x, 32)),
        ("histogram device edges", 1, lambda: cufold.histogram(x, edges)),
        ("bincount", 1, lambda: cufold.bincount(xi, minlength=64)),
        ("sum gpu_to_gpu", 0, lambda: cufold.sum(x, deterministic="gpu_to_gpu")),
        ("segmented_reduce gpu_to_gpu", 0, lambda: cufold.segmented_reduce(x, offsets, deterministic="gpu_to_gpu")),
        ("reproducible.finalise(sum_state)", 0,
         lambda: cufold.reproducible.finalise(cufold.reproducible.sum_state(x), np.float32)),
        ("sum transform post", 0, lambda: cufold.sum(x, transform=abs, post=lambda s: s + 1)),
        ("dot", 0, lambda: cufold.dot(x, x)),
        ("vdot", 0, lambda: cufold.vdot(m, m)),
        ("norm axis=1", 0, lambda: cufold.norm(m, axis=1)),
        ("logsumexp", 0, lambda: cufold.logsumexp(x)),
        ("count_nonzero", 0, lambda: cufold.count_nonzero(xi)),
        ("all", 0, lambda: cufold.all(xi)),
        ("any axis=0", 0, lambda: cufold.any(m, axis=0)),
        ("argmax counting", 0, lambda: cufold.argmax(cufold.counting(N), transform=lambda i: -(i - 7) ** 2)),
    ]


def test_every_public_function_is_listed():
    """A new public device function gets a row in _calls."""
    import inspect
    import cufold.device as D
    names = {n for n in D.__all__ if n != "algorithms"}
    rows = _calls(np.random.default_rng(0))
    assert len(rows) == ROWS, "update ROWS: every row runs in test_waits_for_the_device"
    listed = {row[0].split()[0] for row in rows}
    assert names <= listed, sorted(names - listed)
    for n in names:
        assert inspect.getdoc(getattr(cufold, n)), n


ROWS = 44      # len(_calls(...)): checked above


@pytest.mark.parametrize("row", range(ROWS))
def test_waits_for_the_device(row, rng, host_waits):
    name, expected, call = _calls(rng)[row]
    call()                      # plans (uploads of constants happen here, once)
    host_waits[0] = 0
    call()
    assert host_waits[0] == expected, name


@pytest.mark.parametrize("name", ["reduce_by_key", "bincount", "histogram", "reduce_by_key_into"])
def test_waits_are_documented(name):
    """Each function that waits says so in its docstring."""
    assert "ynchronis" in getattr(cufold, name).__doc__, name
