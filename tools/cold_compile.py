"""Where the first call of a reduce with a user's operator spends its time, stage by stage.

    PYTHONPATH=src python tools/cold_compile.py [--op lambda|commutative|plus] [--n N] [--cache-dir DIR]
                                                [--functions K]

The call is ``cufold.reduce(x, op)`` on a float32 array (``lambda``: a plain lambda,
taken as non-commutative; ``commutative``: ``cufold.Op(lambda, commutative=True)``;
``plus``: the built-in, for comparison), in this fresh process. Each stage's time is
exclusive (a stage nested in another is not counted twice):

  cufold host            plans, kernel factories, fingerprints, disk keys, the rest of the call
  cufold codegen         ``_codegen.build``: exec of generated source, device-function wrappers
  numba IR passes        bytecode -> Numba IR, rewrites, SSA, inlining (untyped and typed passes)
  numba typing           type inference (a call of a device function types it too)
  numba lowering         Numba IR -> LLVM IR (code libraries, one per function)
  numba glue             the rest of Numba's compile driver (LLVM IR to text, linking libraries)
  NVVM                   LLVM IR -> PTX (libNVVM, -O3)
  ptxas (nvJitLink)      PTX -> cubin, through the linker
  module load            cuModuleLoadData (a GPU only)
  disk cache             reading and writing cubins (``CUFOLD_CACHE_DIR``)

``--functions K``: also the K functions that cost most, each through Numba's front end
(``compile_cuda``: its passes, typing and lowering, exclusive of the functions it calls).

Without a GPU (no /dev/nvidia*) the call is made for a pretend sm_90a device: the kernel
goes through the real ``_launch.Kernel._entry`` (disk cache included) with the driver's
parts stubbed, so everything but the module load is real work (nvJitLink runs on the
CPU). Run it twice with the same ``--cache-dir`` to see a second process: it reads the
cubin instead of compiling (without a GPU, loading it is stubbed).
"""
import argparse
import collections
import contextlib
import glob
import os
import sys
import tempfile
import time

T_START = time.perf_counter()
GPU = bool(glob.glob("/dev/nvidia[0-9]*"))
os.environ.pop("NUMBA_ENABLE_CUDASIM", None)


def _clocks():
    return time.perf_counter(), time.process_time()


class Stages:
    """Exclusive time per stage, wall-clock and this process's CPU time (steadier on a
    shared machine): entering a stage pauses the one it is nested in."""

    def __init__(self):
        self.seconds = collections.defaultdict(float)
        self.cpu = collections.defaultdict(float)
        self.calls = collections.Counter()
        self._stack = []

    def _charge(self, name, since, now):
        self.seconds[name] += now[0] - since[0]
        self.cpu[name] += now[1] - since[1]

    @contextlib.contextmanager
    def stage(self, name):
        now = _clocks()
        if self._stack:
            self._charge(*self._stack[-1], now)
        self._stack.append([name, now])
        self.calls[name] += 1
        try:
            yield
        finally:
            now = _clocks()
            self._charge(*self._stack.pop(), now)
            if self._stack:
                self._stack[-1][1] = now

    def wrap(self, owner, attr, name):
        """Time ``owner.attr`` (a function or method) as stage ``name`` (or ``name(args)``)."""
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            with self.stage(name(*args) if callable(name) else name):
                return fn(*args, **kwargs)

        setattr(owner, attr, timed)


def _pass_stage(manager, index, pss, state):
    kind = type(pss).__name__
    if kind == "NopythonTypeInference":
        return "numba typing"
    if kind in ("CUDANativeLowering", "NativeLowering", "CreateLibrary", "CUDABackend"):
        return "numba lowering"
    return "numba IR passes"


def instrument(stages):
    from numba.cuda.core import compiler_machinery
    from numba.cuda import codegen, dispatcher
    from numba.cuda.cudadrv import driver, nvvm
    from cufold import _codegen
    from cufold.host import launch as _launch

    stages.wrap(compiler_machinery.PassManager, "_runPass", _pass_stage)
    stages.wrap(dispatcher._Kernel, "__init__", "numba glue")
    stages.wrap(nvvm, "compile_ir", "NVVM")
    stages.wrap(driver._Linker, "complete", "ptxas (nvJitLink)")
    stages.wrap(_codegen, "build", "cufold codegen")
    stages.wrap(_launch, "_read_cubin", "disk cache")
    stages.wrap(_launch, "_write_cubin", "disk cache")
    if GPU:
        stages.wrap(driver.Context, "create_module_image", "module load")
        stages.wrap(_launch.Kernel, "_load_cubin", "module load")
        return
    # No GPU: answer for an sm_90a device and stop short of the driver.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sm90 import pretend_sm90
    pretend_sm90()

    class Module:
        initialized = True

    class Function:
        handle = 0
        module = Module()

    class Driver:
        api, check_ctx, ok = "stub", False, 0

        def launch(self, *cfg):
            return 0

        def stream(self, handle):
            return handle

        def function_of(self, handle, ctx):
            return None

        def func(self, handle):
            return handle

    codegen.CUDACodeLibrary._ensure_cc = lambda self, cc: (9, 0, "a") if cc is None else cc

    def get_cufunc(self):
        self.get_cubin()
        return Function()

    codegen.CUDACodeLibrary.get_cufunc = get_cufunc
    _launch._driver = lambda drv=Driver(): drv
    _launch._primary_context = lambda dev: 0
    _launch._numba_device_ctx = lambda dev: contextlib.nullcontext()
    _launch.Kernel._load_cubin = lambda self, entry, cubin: 0
    # (commutative operators size their grid by occupancy: an H200's 8 blocks of 256 an SM)
    _launch.Kernel.resident_blocks = lambda self, block, shared=0, device_id=None: max(1, 2048 // block)


def fake_input(n):
    """A float32 device array as cufold describes one, at a fake address (no GPU)."""
    import numpy as np
    from cufold.host import arrays as _arrays
    R = sys.modules["cufold.device.reduce"]

    def arr(dtype, count, ptr):
        return _arrays.Arr(ptr, (count,), (1,), np.dtype(dtype), count, "numba", None, 0)

    R._workspace = lambda dev, stream, vt, count: (
        tuple(arr(f, count, 0x20000) for f in vt.fields) if vt.is_tuple else arr(vt.dtype, count, 0x20000),
        arr(np.uint32, 1, 0x40000))
    R._resident_blocks = lambda dev, nt: 132 * max(1, 2048 // nt)     # an H200
    # results: descriptors of no memory (the launch is stubbed too)
    _arrays._EMPTY_BY_LIB["numba"] = lambda like, shape, dt, stream: (None, arr(dt, max(1, int(np.prod(shape))),
                                                                            0x30000))
    return arr(np.float32, n, 0x10000)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", choices=("lambda", "commutative", "plus"), default="lambda")
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--cache-dir", help="CUFOLD_CACHE_DIR (default: a new empty folder)")
    ap.add_argument("--functions", type=int, default=0, help="list the K costliest functions")
    a = ap.parse_args()
    os.environ["CUFOLD_CACHE_DIR"] = a.cache_dir or tempfile.mkdtemp(prefix="cufold-cold-")
    stages = Stages()
    with stages.stage("import"):
        import numpy as np
        import cufold
    instrument(stages)
    functions = Stages()
    if a.functions:
        from numba.cuda import dispatcher
        functions.wrap(dispatcher, "compile_cuda", lambda pyfunc, *args: getattr(pyfunc, "__qualname__", "?"))
    op = {"lambda": lambda a, b: max(a, b),
          "commutative": cufold.Op(lambda a, b: max(a, b), commutative=True),
          "plus": cufold.plus}[a.op]
    if GPU:
        from numba import cuda
        x = cuda.to_device(np.random.default_rng(0).random(a.n, dtype=np.float32))
        cuda.synchronize()
    else:
        x = fake_input(a.n)
    t, c = _clocks()
    with stages.stage("cufold host"):
        got = cufold.reduce(x, op)          # plans the call's Program (compiling), runs it
        if GPU:
            cuda.synchronize()
    first = time.perf_counter() - t
    first_cpu = time.process_time() - c
    kernels = list(sys.modules["cufold.host.launch"]._kernels.values())
    print("cufold.reduce(float32[%d], %s) first call, %s: %.3f s wall, %.3f s CPU (import %.2f s before it)"
          % (a.n, a.op, "GPU" if GPU else "no GPU, sm_90a", first, first_cpu, stages.seconds["import"]))
    print("  %-20s %9s %9s %6s" % ("stage", "wall s", "CPU s", "calls"))
    for name in ("cufold host", "cufold codegen", "numba IR passes", "numba typing", "numba lowering",
                 "numba glue", "NVVM", "ptxas (nvJitLink)", "module load", "disk cache"):
        print("  %-20s %9.3f %9.3f %6d" % (name, stages.seconds.get(name, 0.0), stages.cpu.get(name, 0.0),
                                          stages.calls[name]))
    if not GPU:
        print("  (module load: no GPU here)")
    if a.functions:
        ranked = sorted(functions.seconds.items(), key=lambda kv: -kv[1])
        print("  %-40s %9s %6s   (%d functions, %.3f s)" % ("function (compile_cuda, exclusive)", "wall s", "calls",
                                                             len(ranked), sum(functions.seconds.values())))
        for name, sec in ranked[:a.functions]:
            print("  %-40s %9.3f %6d" % (name[:40], sec, functions.calls[name]))
    print("kernels: %d; loaded from disk: %s; cache %s"
          % (len(kernels), [k.loaded_from_disk for k in kernels], os.environ["CUFOLD_CACHE_DIR"]))
    if GPU:
        print("result", got)
    print("threads of this process, CPU s (user + system; the stages' CPU column counts them all):")
    for name, cpu in thread_cpu():
        print("  %-24s %7.3f" % (name, cpu))
    with open("/proc/self/maps") as f:
        pools = sorted({line.split()[-1] for line in f if any(s in line for s in ("omp", "tbb", "blas"))})
    print("thread-pool libraries loaded:", ", ".join(pools) or "none")


def thread_cpu():
    """``[(name, CPU seconds)]`` of this process's threads, most first (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    rows = []
    for task in glob.glob("/proc/self/task/*"):
        try:
            with open(task + "/comm") as f:
                name = f.read().strip()
            with open(task + "/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        rows.append(("%s [%s]" % (name, os.path.basename(task)), (int(fields[11]) + int(fields[12])) / tick))
    return sorted(rows, key=lambda r: -r[1])


if __name__ == "__main__":
    main()
