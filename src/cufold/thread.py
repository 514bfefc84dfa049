"""Thread layer: sequential reduce and scan over one thread's own items.

This is seed 002's register blocking: each thread folds its ``items`` (its
grain, VT values) sequentially, work-efficiently, before any cooperation with
other threads. ``items`` is any array the thread indexes (a
``cuda.local.array``, a slice of shared memory, a global array); a tuple
value type reads a tuple of arrays, one per field. Loops run over a
compile-time count, so they unroll and the values stay in registers.

Example::

    thread_sum = cufold.thread.reduce(cufold.plus, np.float32, 4)

    @cuda.jit
    def kernel(x, out):
        items = cuda.local.array(4, np.float32)
        for k in range(4):
            items[k] = x[cuda.grid(1) * 4 + k]
        out[cuda.grid(1)] = thread_sum(items)
"""

import functools

from numba import cuda

from .ops import as_op
from .values import ValueType


# Factories cache with typed=True (True == 1 would otherwise skip _count).


def _count(items_per_thread):
    try:
        n = int(items_per_thread)
        ok = n >= 1 and n == items_per_thread and not isinstance(items_per_thread, bool)
    except (TypeError, ValueError, OverflowError):  # None, "x", nan, inf ...
        ok = False
    if not ok:
        raise ValueError("cufold: items_per_thread must be a positive integer, got %r" % (items_per_thread,))
    return n


@functools.lru_cache(maxsize=None, typed=True)
def reduce(op, dtype, items_per_thread):
    """``f(items) -> total`` of ``items[0] op items[1] op ...``, in order."""
    op = as_op(op)
    vt = ValueType.of(dtype)
    n = _count(items_per_thread)
    combine, load = op.combine(vt), vt.load

    @cuda.jit(device=True)
    def thread_reduce(items):
        total = load(items, 0)
        for k in range(1, n):
            total = combine(total, load(items, k))
        return total

    return thread_reduce


@functools.lru_cache(maxsize=None, typed=True)
def inclusive_scan(op, dtype, items_per_thread):
    """``f(items, out, prefix, has_prefix) -> total``: ``out[k] = prefix op
    items[0] op ... op items[k]`` (``prefix`` ignored when ``has_prefix`` is
    false). Returns the thread's total (without the prefix). ``out`` may be
    ``items``."""
    op = as_op(op)
    vt = ValueType.of(dtype)
    n = _count(items_per_thread)
    combine, load, store = op.combine(vt), vt.load, vt.store

    @cuda.jit(device=True)
    def thread_inclusive_scan(items, out, prefix, has_prefix):
        total = load(items, 0)
        store(out, 0, combine(prefix, total) if has_prefix else total)
        for k in range(1, n):
            total = combine(total, load(items, k))
            store(out, k, combine(prefix, total) if has_prefix else total)
        return total

    return thread_inclusive_scan


@functools.lru_cache(maxsize=None, typed=True)
def exclusive_scan(op, dtype, items_per_thread):
    """``f(items, out, prefix) -> total``: ``out[0] = prefix``, ``out[k] =
    prefix op items[0] op ... op items[k-1]``. Returns ``prefix op`` all items
    (the next thread's prefix). ``out`` may be ``items``."""
    op = as_op(op)
    vt = ValueType.of(dtype)
    n = _count(items_per_thread)
    combine, load, store = op.combine(vt), vt.load, vt.store

    @cuda.jit(device=True)
    def thread_exclusive_scan(items, out, prefix):
        running = prefix
        for k in range(n):
            item = load(items, k)
            store(out, k, running)
            running = combine(running, item)
        return running

    return thread_exclusive_scan
