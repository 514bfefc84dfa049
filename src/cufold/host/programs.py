"""The one host path of cufold's device functions: a Program per call signature.

A call of a device function (``cufold.sum``, ``segmented_reduce``, ...) makes,
every time, the same few kernel launches on new arrays. The first call with a
*signature* -- the function's configuration (operator, algorithm, options), its
arrays' library, dtypes, shapes, strides and alignment, the device and the
stream -- plans those launches (algorithm, tiles, grid, workspace) and binds
each with everything but the arrays' addresses packed once
(:meth:`Kernel.bind`): a :class:`Program`. Later calls with that signature find
the Program in a cache and only describe their arrays, allocate the outputs
through the arrays' own library, write addresses and launch.

A family plans a Program on *placeholders*: :meth:`Builder.input` and
:meth:`Builder.output` return array descriptors whose addresses are markers,
each array its own range of fake addresses. Whatever the plan derives from them
by address arithmetic (a window, a flattening, a field of a view) is a marker at
a known offset, so plan code written for real arrays plans Programs unchanged;
:meth:`Builder.launch` finds the markers in a launch's arguments, and the
Program writes ``address + offset`` there on every call. A marker left where a
launch cannot vary it is an error when the Program is built, never a launch on
a fake address.

Public API
----------
``Builder(device_id, stream, alloc_stream=None)``: ``input(arr)``,
``output(like, shape, dtype)``, ``value(sample)``, ``launch(fn, key, grid,
block, args, shared=0)``, ``guard(check)``, ``after(hook)``,
``build(finish) -> Program``
``Program``: ``prog(*arrays, *values) -> result``; ``Stale`` (a guard failed:
plan again)
``Programs(plan, name, limit)``: a bounded cache of Programs by call signature,
``run(key, *arrays)`` (``plan(key, *arrays) -> Program`` on a miss; an NVTX range
``name`` around each run)
``signature(arr)``: what of an array a Program depends on
"""

from __future__ import annotations

import numpy as np

from . import arrays as _arrays, launch as _launch
from .arrays import Arr

__all__ = ["Builder", "Program", "Programs", "Stale", "signature"]

# Marker addresses: array k of a plan starts at _MARK + k * _SPAN (plus the low
# bits of its real address, so alignment tests on markers see the real alignment).
_MARK = 1 << 62
_SPAN = 1 << 40
_MAX_ARRAYS = 1 << 12
_ALIGN_BITS = 15


def signature(a):
    """What a Program depends on of array ``a`` (an :class:`Arr`): its layout,
    library, device, and the alignment of its address (16 bytes or less)."""
    if a.__class__ is not Arr:            # a generated input (arrays.Generated)
        return a.signature()
    return (a.dtype, a.shape, a.strides, a.library, a.device_id, a.ptr & _ALIGN_BITS)


class Stale(Exception):
    """A Program's guard failed (what it bound was replaced): plan it again."""


class _Value:
    """A per-call integer argument of a Program (see :meth:`Builder.value`)."""

    __slots__ = ("index", "sample")

    def __init__(self, index, sample):
        self.index, self.sample = index, sample


class Builder:
    """Collects one Program: its per-call arrays and values, its launches in
    order, and what runs around them.

    ``device_id`` and ``stream`` (raw handle) are the Program's; outputs are
    allocated on ``alloc_stream`` (a raw handle where the caller named a stream,
    else None: the library's current stream).
    """

    def __init__(self, device_id, stream, alloc_stream=None):
        self.device_id, self.stream, self.alloc_stream = device_id, stream, alloc_stream
        self._arrays = []        # per-call arrays: ("in", template Arr) or ("out", allocator, like index)
        self._values = []
        self._launches = []      # (kernel, grid, block, shared, args, vary, sources)
        self._guards = []
        self._after = []

    # --- per-call things ------------------------------------------------------

    def _marker(self, a, shape=None, strides=None, dtype=None, library=None):
        k = len(self._arrays)
        if k >= _MAX_ARRAYS:
            raise ValueError("cufold: a Program takes at most %d arrays" % _MAX_ARRAYS)
        dt = a.dtype if dtype is None else np.dtype(dtype)
        shape = a.shape if shape is None else tuple(shape)
        strides = a.strides if strides is None else tuple(strides)
        size = 1
        for s in shape:
            size *= s
        return Arr(_MARK + k * _SPAN + (a.ptr & _ALIGN_BITS), shape, strides, dt, size,
                   a.library if library is None else library, None, a.device_id, a.stream)

    def input(self, a):
        """A placeholder for a per-call array laid out as ``a`` (an Arr); the
        Program is then called with such an array at this position."""
        if a.__class__ is _arrays.Generated:  # no memory: its parameter is a launch constant
            self._arrays.append(("in", a))
            return a
        m = self._marker(a)
        self._arrays.append(("in", m))
        return m

    def output(self, like, shape, dtype):
        """A placeholder for a new array of ``shape`` and ``dtype`` (C order) in the
        library and on the device of input ``like`` (a placeholder of
        :meth:`input`), allocated on every call."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        k = self._input_index(like)
        home = _arrays.shell(self._arrays[k][1])
        dt = np.dtype(dtype)
        if _arrays.carves(home, shape, dt):              # small torch results: views of batches
            take = _arrays.small_results(home, shape, dt, self.alloc_stream)
            alloc = lambda obj: take()                                  # noqa: E731
        else:
            alloc = _arrays.allocator(home, shape, dt, self.alloc_stream)
        strides = _arrays._c_strides(shape)
        m = self._marker(home, shape, strides, dt, home.library)
        m.ptr -= m.ptr & _ALIGN_BITS            # a fresh allocation is aligned far beyond 16 bytes
        self._arrays.append(("out", m, alloc, k))
        return m

    def value(self, sample):
        """A per-call integer argument (its type that of ``sample``, a NumPy integer):
        pass the returned object in launch arguments; the Program then takes one
        more argument per value, after the arrays."""
        v = _Value(len(self._values), np.asarray(sample)[()])
        self._values.append(v)
        return v

    def _input_index(self, m):
        for k, entry in enumerate(self._arrays):
            if entry[1] is m:
                return k
        raise ValueError("cufold: not a placeholder of this Program's inputs")

    # --- launches ---------------------------------------------------------------

    def resident(self, fn, key, args, block):
        """Blocks of ``block`` threads of the kernel that :meth:`launch` of ``fn``, ``key``
        and ``args`` would launch that this Program's GPU holds at once (all SMs; the
        kernel is compiled or loaded first), or None where unknown (the simulator): what a
        grid that must run in one round is capped at."""
        kernel = _launch.kernel_for(fn, key, tuple(self._concrete(a) for a in args))
        blocks = kernel.resident_blocks(block, device_id=self.device_id)
        return _launch.sm_count(self.device_id) * blocks if blocks else None

    def launch(self, fn, key, grid, block, args, shared=0):
        """Launch kernel function ``fn`` (compiled through the one launch path under
        ``key`` and the arguments' layout) on ``grid`` x ``block``; ``args`` may hold
        placeholders (alone or in a tuple) and values."""
        args = tuple(args)
        concrete = tuple(self._concrete(a) for a in args)
        kernel = _launch.kernel_for(fn, key, concrete)
        vary, sources = [], []
        for i, a in enumerate(args):
            if a.__class__ is tuple:
                for j, m in enumerate(a):
                    src = self._source(m)
                    if src is not None:
                        vary.append((i, "ptr", j))
                        sources.append(src)
            else:
                src = self._source(a)
                if src is not None:
                    vary.append((i, "ptr") if src[0] != "val" else i)
                    sources.append(src)
        self._launches.append((kernel, grid, block, shared, concrete, tuple(vary), tuple(sources)))

    def _concrete(self, a):
        if a.__class__ is tuple:
            return tuple(self._concrete(m) for m in a)
        if a.__class__ is _Value:
            return a.sample
        if a.__class__ is _arrays.Generated:  # what a kernel gets for a generated input
            return a.param
        return a

    def _source(self, a):
        """Where argument ``a`` comes from on each call: ("arr", k, byte offset) for a
        marker (or a view of one), ("val", k) for a value, None for a constant."""
        if a.__class__ is _Value:
            return ("val", a.index)
        if a.__class__ is not Arr or a.ptr < _MARK - _SPAN:
            return None
        k = (a.ptr - _MARK + _SPAN // 2) // _SPAN
        if not 0 <= k < len(self._arrays):
            raise ValueError("cufold: an argument points at no array of this Program")
        return ("arr", k, a.ptr - self._arrays[k][1].ptr)

    def guard(self, check):
        """``check() -> bool``, called before every run: False when something the
        Program bound has been replaced (the call then plans a new Program)."""
        self._guards.append(check)

    def after(self, hook):
        """``hook(arrays, values)``, called after the launches (with the call's input
        Arrs and output objects in order, and its values): checks that must read the
        device (and so synchronise), e.g. for bad keys."""
        self._after.append(hook)

    # --- the Program --------------------------------------------------------------

    def build(self, finish=None):
        """The Program. ``finish(outputs) -> result`` turns the list of this call's
        output objects into what the function returns; None (the default) returns
        the one output, the tuple of them, or None where there is none."""
        return Program(self, finish)


class Program:
    """The bound launch sequence of one call signature (see the module doc).

    Called as ``prog(*arrays, *values)``: the call's arrays (Arr descriptors)
    in the order of :meth:`Builder.input`, then its values. Returns
    ``finish(outputs)``. Raises :class:`Stale` where a guard fails.
    """

    __slots__ = ("call", "source", "launches", "__weakref__")

    def __init__(self, b, finish):
        inputs = [k for k, e in enumerate(b._arrays) if e[0] == "in"]
        outputs = [k for k, e in enumerate(b._arrays) if e[0] == "out"]
        env = {"_finish": finish, "_Stale": Stale, "_to_library": _arrays.to_library}
        params = ["a%d" % k for k in inputs] + ["v%d" % v.index for v in b._values]
        lines = ["def call(%s):" % ", ".join(params)]
        for i, g in enumerate(b._guards):
            env["_g%d" % i] = g
            lines.append("    if not _g%d(): raise _Stale()" % i)
        for k in inputs:
            lines.append("    p%d = a%d.ptr" % (k, k))
        for k in outputs:
            _, m, alloc, like = b._arrays[k]
            env["_alloc%d" % k] = alloc
            lines.append("    o%d, p%d = _alloc%d(a%d.obj)" % (k, k, k, like))
        for n, (kernel, grid, block, shared, args, vary, sources) in enumerate(b._launches):
            env["_go%d" % n] = kernel.bind(grid, block, b.stream, shared, args, vary)
            exprs = ["p%d + %d" % (s[1], s[2]) if s[0] == "arr" else "v%d" % s[1] for s in sources]
            lines.append("    _go%d(%s)" % (n, ", ".join(exprs)))
            _check_covered(args, vary, kernel)
        if b._after:
            for i, hook in enumerate(b._after):
                env["_after%d" % i] = hook
                lines.append("    _after%d((%s), (%s))" % (
                    i, "".join("a%d, " % k if k in inputs else "o%d, " % k for k in range(len(b._arrays))),
                    "".join("v%d, " % v.index for v in b._values)))
        like = {k: b._arrays[k][1].library for k in outputs}
        outs = ", ".join(("_to_library(o%d, a%d)" % (k, b._arrays[k][3]) if like[k] == "jax" else "o%d" % k)
                         for k in outputs)
        if finish is not None:
            lines.append("    return _finish([%s])" % outs)
        else:       # the outputs themselves: no list, no call (a small call is all host time)
            lines.append("    return %s" % (outs if len(outputs) == 1 else "(%s)" % outs if outputs else "None"))
        self.source = "\n".join(lines) + "\n"
        exec(compile(self.source, "<cufold-program>", "exec"), env)
        self.call = env["call"]
        self.launches = len(b._launches)

    def __call__(self, *args):
        return self.call(*args)


def _check_covered(args, vary, kernel):
    """Every marker in ``args`` is written per call (no launch on a fake address)."""
    varied = set()
    for v in vary:
        varied.add(v if v.__class__ is int else (v[0], v[2] if len(v) == 3 else None))
    for i, a in enumerate(args):
        for j, m in (enumerate(a) if a.__class__ is tuple else ((None, a),)):
            if m.__class__ is Arr and m.ptr >= _MARK - _SPAN and (i, j) not in varied:
                raise ValueError("cufold: kernel %s argument %s holds a per-call array the launch "
                                 "cannot vary" % (kernel.name, (i, j)))


class Programs(_launch.BoundedCache):
    """The Programs of one device function, by call signature (bounded).

    ``plan(key, *arrays) -> Program`` makes the Program of a signature: the key
    holds everything it depends on (options, the arrays' signatures, the stream),
    so the hot path builds nothing but the key. ``name``: the NVTX range of each
    run (emitted when the ``nvtx`` package is there, as every device-wide call's)."""

    __slots__ = ("plan", "name")

    def __init__(self, plan, name, limit=4096):
        super().__init__(limit)
        self.plan, self.name = plan, name

    def run(self, key, *arrays):
        """The Program of ``key`` (planned on a miss, or when it went stale) run on
        ``arrays``. An unhashable key (an option given as a list, say) plans a
        Program for this call only."""
        if _launch.NVTX:
            with _launch.nvtx_range(self.name):
                return self._run(key, arrays)
        return self._run(key, arrays)

    def _run(self, key, arrays):
        try:
            prog = self.get(key)
        except TypeError:
            return self.plan(key, *arrays).call(*arrays)
        if prog is None:
            prog = self.put(key, self.plan(key, *arrays))
        try:
            return prog.call(*arrays)
        except Stale:
            return self.put(key, self.plan(key, *arrays)).call(*arrays)
