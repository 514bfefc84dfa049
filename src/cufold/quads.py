"""Quads: four float32 values moved in one memory operation, which ``cuda`` lacks (and the
one other memory operation it lacks that cufold uses: 8-byte loads with L2's prefetch size).

An L2 atomic unit handles a 16-byte reduction (``red.global.add.v4.f32``, sm_90 on) for
about the price of a 4-byte one: where updates to scattered rows bound a kernel (feature
rows by key into a table, shuffled keys), four features in one operation cut that work
(``bench pyg``, F = 16 shuffled sum on an H200: 488 -> 345 us).

``add4(array, i, a, b, c, d)``
    ``array[i + j] += (a, b, c, d)[j]`` for ``j < 4``, each element atomically, as one
    fire-and-forget reduction (no result; relaxed, GPU scope, as ``cuda.atomic.add``).
``load4(array, i)``
    ``(array[i], ..., array[i + 3])`` as one streamed 16-byte load (``ld.global.cs``:
    evict first, as ``cuda.ldcs``), of memory the kernel does not write (the compiler
    may reorder or merge it as a pure read).
``read4(array, i)``
    ``(array[i], ..., array[i + 3])`` as one 16-byte load of memory that other threads may
    be updating (a plain load, kept in its place among the thread's atomics): the words a
    compare-and-swap starts from. ``array`` may be float32, int32 or uint32.

``load8_l2_128(array, i)``, ``load8_l2_256(array, i)``
    ``array[i]`` of a 1-D uint64 array as one 8-byte load that asks L2 to fetch the 128 or
    256 bytes around it from DRAM (``ld.global.L2::128B`` / ``L2::256B``, sm_75 on): fewer,
    larger DRAM requests for a stream of loads (the device reduce's 8-byte reads,
    ``CUFOLD_REDUCE_LOAD``, for study). Plain reads in the simulator.

``red_max(array, i, v)``, ``red_min(array, i, v)``
    ``array[i] = max(array[i], v)`` (``min``) for float32, atomically and fire-and-forget (no
    result, no compare-and-swap loop to wait on): a float's bits ordered as integers, ``v >=
    +0`` by a signed ``red.max.s32`` (``min``: ``red.min.s32``), a negative ``v`` by an
    unsigned ``red.min.u32`` (``red.max.u32``). A NaN ``v`` stores a NaN that every later
    update keeps (``0x7FFFFFFF`` for max, ``0xFFFFFFFF`` for min), so NaN propagates as in
    NumPy's maximum; a NaN already in ``array`` must come from these functions (a caller
    reads the word first and skips where it is NaN, as ``cufold.device.rows`` does). Of two
    zeros either may win.

``array``: a 1-D float32 array (``read4``: or int32, uint32) in global memory; element ``i``
must be 16-byte aligned (the address of ``array[0]`` and ``i`` multiples of 16 bytes and
of 4: the caller's host side checks, as ``cufold.device.rows.quads_for`` does); sm_90 or
later for ``add4``. In Numba's CPU simulator they are plain Python over the four elements
(``add4`` as four ``cuda.atomic.add``).

The GPU versions are Numba intrinsics (inline PTX): the one place cufold's kernels use more
than ``cuda.*`` names, so a move to another CUDA Python compiler rewrites this module only.

Example, inside a user's kernel (rows of 4 features, flat 1-D arrays)::

    @cuda.jit
    def scatter_rows(keys, x, out):          # out[keys[r]] += x[r], rows of 4 float32
        r = cuda.grid(1)
        if r < keys.size:
            a, b, c, d = load4(x, 4 * r)
            add4(out, 4 * keys[r], a, b, c, d)
"""

from numba import config, cuda

__all__ = ["add4", "load4", "read4", "load8_l2_128", "load8_l2_256", "red_max", "red_min"]

SIMULATOR = bool(config.ENABLE_CUDASIM)

if SIMULATOR:
    @cuda.jit(device=True)
    def add4(array, i, a, b, c, d):
        cuda.atomic.add(array, i, a)
        cuda.atomic.add(array, i + 1, b)
        cuda.atomic.add(array, i + 2, c)
        cuda.atomic.add(array, i + 3, d)

    @cuda.jit(device=True)
    def load4(array, i):
        return array[i], array[i + 1], array[i + 2], array[i + 3]

    read4 = load4

    @cuda.jit(device=True)
    def load8_l2_128(array, i):
        return array[i]

    load8_l2_256 = load8_l2_128

    def _extreme_red(which):
        """``red_max`` / ``red_min``: a NaN stored, else the atomic ``which``."""
        @cuda.jit(device=True)
        def red(array, i, v):
            if v != v:
                cuda.atomic.exch(array, i, v)
            else:                           # (looked up as the kernel runs: the simulator's cuda)
                getattr(cuda.atomic, which)(array, i, v)
        return red

    red_max = _extreme_red("max")
    red_min = _extreme_red("min")

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def _f32_array(array):
        return isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.float32

    def _element(context, builder, array_type, array, index):
        """The address of ``array[index]`` (no bounds or wraparound: the caller's index is valid)."""
        data = context.make_array(array_type)(context, builder, value=array).data
        return builder.gep(data, [index])

    @intrinsic
    def add4(typingctx, array, index, a, b, c, d):
        if not (_f32_array(array) and isinstance(index, types.Integer)):
            return None
        sig = types.void(array, types.int64, types.float32, types.float32, types.float32, types.float32)

        def codegen(context, builder, sig, args):
            ptr = _element(context, builder, sig.args[0], args[0], args[1])
            f32 = ir.FloatType()
            fn = ir.FunctionType(ir.VoidType(), [ptr.type, f32, f32, f32, f32])
            red = ir.InlineAsm(fn, "red.global.add.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f,~{memory}",
                               side_effect=True)
            builder.call(red, [ptr] + list(args[2:]))
            return context.get_dummy_value()

        return sig, codegen

    def _vector_load(name, dtypes, text, side_effect):
        """An intrinsic ``(array, i) -> 4-tuple``: ``array[i .. i + 3]`` by the PTX ``text``
        (``{kind}``: the element type's ``f32`` or ``b32``) for 1-D arrays of ``dtypes``;
        ``side_effect``: kept in its place among the thread's other memory operations."""
        def vector_load(typingctx, array, index):
            if not (isinstance(array, types.Array) and array.ndim == 1 and array.dtype in dtypes
                    and isinstance(index, types.Integer)):
                return None
            dt = array.dtype
            sig = types.UniTuple(dt, 4)(array, types.int64)
            kind, reg = ("f32", "f") if dt == types.float32 else ("b32", "r")

            def codegen(context, builder, sig, args):
                ptr = _element(context, builder, sig.args[0], args[0], args[1])
                fn = ir.FunctionType(ir.LiteralStructType([context.get_value_type(dt)] * 4), [ptr.type])
                constraints = ",".join(["=" + reg] * 4) + ",l" + (",~{memory}" if side_effect else "")
                ld = ir.InlineAsm(fn, text.format(kind=kind) + " {$0, $1, $2, $3}, [$4];", constraints,
                                  side_effect=side_effect)
                got = builder.call(ld, [ptr])
                return context.make_tuple(builder, sig.return_type,
                                          [builder.extract_value(got, j) for j in range(4)])

            return sig, codegen

        vector_load.__name__ = vector_load.__qualname__ = name
        return intrinsic(vector_load)

    def _prefetching_load(size):
        """An intrinsic ``(array, i) -> array[i]`` for 1-D uint64 arrays: ``ld.global`` with
        L2's prefetch of ``size`` bytes (a pure read: the compiler may move or merge it)."""
        def load8(typingctx, array, index):
            if not (isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.uint64
                    and isinstance(index, types.Integer)):
                return None
            sig = types.uint64(array, types.int64)

            def codegen(context, builder, sig, args):
                ptr = _element(context, builder, sig.args[0], args[0], args[1])
                fn = ir.FunctionType(ir.IntType(64), [ptr.type])
                ld = ir.InlineAsm(fn, "ld.global.L2::%dB.u64 $0, [$1];" % size, "=l,l", side_effect=False)
                return builder.call(ld, [ptr])

            return sig, codegen

        load8.__name__ = load8.__qualname__ = "load8_l2_%d" % size
        return intrinsic(load8)

    load8_l2_128 = _prefetching_load(128)
    load8_l2_256 = _prefetching_load(256)
    load4 = _vector_load("load4", (types.float32,), "ld.global.cs.v4.{kind}", False)
    read4 = _vector_load("read4", (types.float32, types.int32, types.uint32), "ld.global.v4.{kind}", True)

    def _extreme_red(which):
        """``red_max`` / ``red_min``: the integer reductions of a float32's bits."""
        nan, signed, unsigned = ("0x7FFFFFFF", "max", "min") if which == "max" else ("0xFFFFFFFF", "min", "max")
        text = ("{ .reg .pred %%isnan, %%ispos; .reg .b32 %%w;\n"
                " mov.b32 %%w, $1;\n"
                " setp.nan.f32 %%isnan, $1, $1;\n"
                " @%%isnan mov.b32 %%w, %s;\n"
                " setp.ge.s32 %%ispos, %%w, 0;\n"
                " @%%ispos red.global.%s.s32 [$0], %%w;\n"
                " @!%%ispos red.global.%s.u32 [$0], %%w; }" % (nan, signed, unsigned))

        def red(typingctx, array, index, value):
            if not (_f32_array(array) and isinstance(index, types.Integer)):
                return None
            sig = types.void(array, types.int64, types.float32)

            def codegen(context, builder, sig, args):
                ptr = _element(context, builder, sig.args[0], args[0], args[1])
                fn = ir.FunctionType(ir.VoidType(), [ptr.type, ir.FloatType()])
                asm = ir.InlineAsm(fn, text, "l,f,~{memory}", side_effect=True)
                builder.call(asm, [ptr, args[2]])
                return context.get_dummy_value()

            return sig, codegen

        red.__name__ = red.__qualname__ = "red_" + which
        return intrinsic(red)

    red_max = _extreme_red("max")
    red_min = _extreme_red("min")
