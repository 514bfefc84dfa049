"""A compiled call into the CUDA driver: ``cuLaunchKernel`` without a Python binding.

A launch from Python through cuda.bindings costs 5.6 us of host time on an H100
host, of which about 0.9 us is the binding (converting eleven arguments, making
a ``CUresult`` enum of the return code) and the rest the driver itself
(``tools/launch_costs.py``). Every small cufold call makes one or a few launches,
so that binding share is a tenth of its whole cost.

:func:`launcher` builds, with llvmlite (already loaded: Numba is built on it), a
Python built-in function of CPython's vectorcall convention (``METH_FASTCALL``)
that reads its integer arguments and calls the driver's entry point by address,
without the interpreter lock: no argument objects made, no enum, about 0.2 us
around the driver (a 2-core development machine).
Every address it uses (the entry point, CPython's integer functions, the
``TypeError`` class) is this process's, baked in as a constant when it is built
(a few milliseconds, once per process). A Numba CPU function did the same at
0.3 us a call, but loading Numba's CPU target cost 0.6 s per process.

``launcher(entry) -> launch``; ``launch(function, gx, gy, gz, bx, by, bz,
shared_bytes, stream, params, extra) -> int``: ``entry`` the address of
``cuLaunchKernel``, the arguments its own as integers (handles and pointers as
addresses, 0 for NULL); returns the ``CUresult`` code (0 on success). Anything but
eleven integers raises ``TypeError``.
"""

import ctypes
import threading

__all__ = ["launcher"]

_NARGS = 11
_METH_FASTCALL = 0x0080
_lock = threading.Lock()
_keep = []          # the engines, method definitions and strings the functions use


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


def _address(name):
    return ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value


def _ir(entry):
    """LLVM IR of ``PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t n)``."""
    as_u64 = _address("PyLong_AsUnsignedLongLongMask")
    from_long = _address("PyLong_FromLong")
    occurred = _address("PyErr_Occurred")
    set_string = _address("PyErr_SetString")
    type_error = ctypes.c_void_p.in_dll(ctypes.pythonapi, "PyExc_TypeError").value
    message = ctypes.create_string_buffer(b"cufold: the launcher takes 11 integers")
    _keep.append(message)
    p = "i8*"
    lines = [
        "define %s @launch(%s %%self, %s* %%args, i64 %%n) {" % (p, p, p),
        "entry:",
        "  %%ok = icmp eq i64 %%n, %d" % _NARGS,
        "  br i1 %ok, label %read, label %bad",
        "bad:",
        "  %%set = inttoptr i64 %d to void (%s, %s)*" % (set_string, p, p),
        "  call void %%set(%s inttoptr (i64 %d to %s), %s inttoptr (i64 %d to %s))"
        % (p, type_error, p, p, ctypes.addressof(message), p),
        "  ret %s null" % p,
        "read:",
        "  %%as_u64 = inttoptr i64 %d to i64 (%s)*" % (as_u64, p),
        "  %%occurred = inttoptr i64 %d to %s ()*" % (occurred, p),
    ]
    for k in range(_NARGS):
        # -1 is also the error return: only then ask whether an exception is set
        lines += ["  %%p%d = getelementptr %s, %s* %%args, i64 %d" % (k, p, p, k),
                  "  %%o%d = load %s, %s* %%p%d" % (k, p, p, k),
                  "  %%a%d = call i64 %%as_u64(%s %%o%d)" % (k, p, k),
                  "  %%m%d = icmp eq i64 %%a%d, -1" % (k, k),
                  "  br i1 %%m%d, label %%check%d, label %%next%d" % (k, k, k),
                  "check%d:" % k,
                  "  %%e%d = call %s %%occurred()" % (k, p),
                  "  %%f%d = icmp ne %s %%e%d, null" % (k, p, k),
                  "  br i1 %%f%d, label %%fail, label %%next%d" % (k, k),
                  "next%d:" % k]
    lines += ["  br label %launch",
              "fail:",
              "  ret %s null" % p,
              "launch:"]
    lines += ["  %%u%d = trunc i64 %%a%d to i32" % (k, k) for k in range(1, 8)]
    # the driver is called without the interpreter lock, as cuda.bindings does: a launch
    # that waits for room in a full queue must not stall threads that would empty it
    lines += [
        "  %%save = inttoptr i64 %d to %s ()*" % (_address("PyEval_SaveThread"), p),
        "  %%restore = inttoptr i64 %d to void (%s)*" % (_address("PyEval_RestoreThread"), p),
        "  %ts = call i8* %save()",
        "  %%fn = inttoptr i64 %d to i32 (i64, i32, i32, i32, i32, i32, i32, i32, i64, i64, i64)*" % entry,
        "  %r = call i32 %fn(i64 %a0, i32 %u1, i32 %u2, i32 %u3, i32 %u4, i32 %u5, i32 %u6, i32 %u7,"
        " i64 %a8, i64 %a9, i64 %a10)",
        "  call void %restore(i8* %ts)",
        "  %r64 = sext i32 %r to i64",
        "  %%from_long = inttoptr i64 %d to %s (i64)*" % (from_long, p),
        "  %%res = call %s %%from_long(i64 %%r64)" % p,
        "  ret %s %%res" % p,
        "}",
    ]
    return "\n".join(lines) + "\n"


def launcher(entry):
    """A built-in function calling ``cuLaunchKernel`` at address ``entry`` (see the module doc)."""
    import llvmlite.binding as llvm
    with _lock:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        module = llvm.parse_assembly(_ir(entry))
        module.verify()
        machine = llvm.Target.from_default_triple().create_target_machine(opt=2)
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.finalize_object()
        code = engine.get_function_address("launch")
        definition = _MethodDef(b"cuLaunchKernel", code, _METH_FASTCALL, b"cufold's compiled cuLaunchKernel")
        new = ctypes.pythonapi.PyCFunction_NewEx
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn = new(ctypes.addressof(definition), None, None)
        _keep.append((engine, module, definition))
        return fn
