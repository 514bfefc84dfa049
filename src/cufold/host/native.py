"""A compiled call into the CUDA driver: ``cuLaunchKernel`` without a Python binding.

A launch from Python through cuda.bindings costs 5.6 us of host time on an H100
host, of which about 0.9 us is the binding (converting eleven arguments, making
a ``CUresult`` enum of the return code) and the rest the driver itself
(``tools/launch_costs.py``). Every small cufold call makes one or a few launches,
so that binding share is a tenth of its whole cost.

:func:`launch_kernel` is a Numba CPU function that calls the driver's entry
point by its address, an argument like the others, with plain integers: no
ctypes conversion, no objects made. The address being an argument (not a
constant of the compiled code) lets Numba cache the compiled function on disk,
so a new process loads it (~0.1 s, once) instead of compiling it (~0.3 s).

``launch_kernel(entry, function, gx, gy, gz, bx, by, bz, shared_bytes, stream,
params, extra) -> int``: ``entry`` the address of ``cuLaunchKernel``, the rest
its arguments as integers (handles and pointers as addresses, 0 for NULL);
returns the ``CUresult`` code (0 on success).
"""

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["launch_kernel"]


@intrinsic
def _call_cu_launch_kernel(typingctx, entry, function, gx, gy, gz, bx, by, bz, shared_bytes, stream, params,
                           extra):
    """``((CUresult (*)(CUfunction, uint x 7, CUstream, void**, void**)) entry)(...)``."""
    arg_types = (entry, function, gx, gy, gz, bx, by, bz, shared_bytes, stream, params, extra)
    for t in arg_types:
        if not isinstance(t, types.Integer):
            return None
    sig = types.int32(*arg_types)

    def codegen(context, builder, signature, args):
        i64, i32 = ir.IntType(64), ir.IntType(32)
        wide = [context.cast(builder, v, t, types.int64) for v, t in zip(args, signature.args)]
        fnty = ir.FunctionType(i32, [i64] + [i32] * 7 + [i64, i64, i64])
        fn = builder.inttoptr(wide[0], fnty.as_pointer())
        # the seven unsigned ints (grid, block, shared bytes) narrowed; handles and pointers as they are
        call_args = [wide[1]] + [builder.trunc(v, i32) for v in wide[2:9]] + wide[9:]
        return builder.call(fn, call_args)

    return sig, codegen


@numba.njit(cache=True, nogil=True)
def launch_kernel(entry, function, gx, gy, gz, bx, by, bz, shared_bytes, stream, params, extra):
    return _call_cu_launch_kernel(entry, function, gx, gy, gz, bx, by, bz, shared_bytes, stream, params, extra)
