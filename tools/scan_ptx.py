"""Compile cufold's device-scan kernels for sm_90 without a GPU and report what
ptxas makes of them: registers, shared memory, spills, and the resident blocks
per SM that those allow (H100/H200: 64K registers, 228 KiB shared memory,
2048 threads, 32 blocks per SM).

    PYTHONPATH=src python tools/scan_ptx.py                      # the default table
    PYTHONPATH=src python tools/scan_ptx.py int32:inclusive:single_pass:128x24
    CUFOLD_SCAN_VARIANT=wide,atomic PYTHONPATH=src python tools/scan_ptx.py
    PYTHONPATH=src python tools/scan_ptx.py --sass DIR int32:inclusive:single_pass

A case is ``dtype[:kind[:algorithm[:NTxVT]]][@RxL]`` (dtype: a NumPy name, scanned
with plus; ``bool`` with logical_or; ``pair`` for an int64 affine-map tuple, ``pair32``
for a float32 one;
``mat8`` for 2x2 byte matrices in a uint32, non-commutative). ``@RxL[,axis]``: a
C-order (R, L) array scanned along ``axis`` (default: the last), through the axis
planner (the kernel it picks: ``pair32@4096x2048`` is the batched affine recurrence,
``pair32@2048x64,0`` columns; ``algorithm`` then applies to a single row only).
``/h`` after a tuple dtype writes its last field only (``out=(None, h)``):
``pair32/h@4096x2048``. ``--sass DIR`` also writes each
kernel's PTX, cubin and SASS (``cuobjdump -sass``) to DIR. Like
tools/ptx_check.py, it fakes the current device so that device functions
compile for sm_90 on a machine with no GPU.
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
from numba import cuda

from sm90 import pretend_sm90

pretend_sm90()

import cufold  # noqa: E402
import importlib  # noqa: E402
from cufold.host import arrays as _arrays  # noqa: E402
from cufold.values import ValueType  # noqa: E402

S = importlib.import_module("cufold.device.scan")
R = importlib.import_module("cufold.device.reduce")

CUOBJDUMP = os.environ.get("CUOBJDUMP") or next(
    (p for p in ("/usr/local/cuda-13.0/bin/cuobjdump", "/usr/local/cuda/bin/cuobjdump",
                 "/tmp/pipdl/x/nvidia/cu13/bin/cuobjdump") if os.path.exists(p)), "cuobjdump")
PTXAS = os.environ.get("PTXAS", "ptxas")


def _fake(nbytes):
    return _arrays.Arr(0x100000, (nbytes,), (1,), np.dtype(np.uint8), nbytes, "numba", None, 0)


# No device memory: workspaces and look-back state are fake descriptors.
S._launch.workspace = lambda dev, stream, nbytes: (0x100000, _fake(max(nbytes, 256)))
S._launch.zeros = lambda dev, stream, nbytes: _fake(nbytes)

launched = []
L = importlib.import_module("cufold.host.launch")


class _Captured:
    """What the launch path hands back for a kernel: its launches are recorded, nothing runs."""
    name = "captured"

    def __init__(self, fn, key):
        self.fn, self.key = fn, key

    def bind(self, grid, block, stream, shared, args, vary):
        launched.append((self.fn, self.key, block, args))
        return lambda *new: None


def _capture(fn, key, args):
    return _Captured(fn, key)


L.kernel_for = _capture      # the one compile point of every launch


def _arr(dtype, shape):
    """A C-order array of ``shape`` at a fake address."""
    strides = tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))
    return _arrays.Arr(0x200000, shape, strides, np.dtype(dtype), int(np.prod(shape)), "numba", None, 0)


AFFINE = cufold.Op(lambda a, b: (a[0] * b[0], a[1] * b[0] + b[1]), name="affine")


def _mat8(x, y):    # 2x2 matrices mod 256 in a uint32 (as tests/test_device_scan.py)
    a, b, c, d = x & 255, (x >> 8) & 255, (x >> 16) & 255, (x >> 24) & 255
    e, f, g, h = y & 255, (y >> 8) & 255, (y >> 16) & 255, (y >> 24) & 255
    return (((a * e + b * g) & 255) | (((a * f + b * h) & 255) << 8)
            | (((c * e + d * g) & 255) << 16) | (((c * f + d * h) & 255) << 24))


MAT8 = cufold.Op(_mat8, identity=np.uint32(0x01000001), name="mat8")


def kernels(case):
    """[(name, python fn, numba signature, threads)] of one case."""
    name = case
    case, _, rows = case.partition("@")
    rows, _, axis = rows.partition(",")
    shape = tuple(int(d) for d in rows.split("x")) if rows else (1 << 26,)
    axis = int(axis) if axis else (-1 if len(shape) > 1 else None)
    parts = case.split(":")
    dtype, _, last_only = parts[0].partition("/")
    kind = parts[1] if len(parts) > 1 else "inclusive"
    alg = parts[2] if len(parts) > 2 else "single_pass"
    if len(parts) > 3:
        os.environ["CUFOLD_TILE"] = parts[3]
    else:
        os.environ.pop("CUFOLD_TILE", None)
    if dtype == "pair":
        op, vt = AFFINE, ValueType.of((np.int64, np.int64))
    elif dtype == "pair32":
        op, vt = AFFINE, ValueType.of((np.float32, np.float32))
    elif dtype == "mat8":
        op, vt = MAT8, ValueType.of(np.uint32)
    elif dtype == "bool":
        op, vt = cufold.logical_or, ValueType.of(np.bool_)
    else:       # "int32+": cumsum's dtypes (small integers sum as int64)
        op, vt = cufold.plus, ValueType.of(np.dtype(dtype.rstrip("+")))
    xs = tuple(_arr(f, shape) for f in vt.fields)
    numpy_sum = dtype.endswith("+")
    acc_vt, out_vt, _ = S._types_for(op, vt, None, numpy_sum)
    init = acc_vt.sample() if kind == "exclusive" else None
    given, stored = (), None
    if last_only:                                # out=(None, ..., h)
        given, stored = (_arr(out_vt.fields[-1], shape),), (False,) * (vt.arity - 1) + (True,)
    del launched[:]
    # as the library plans it (outputs allocated, the axis planner for 2-D shapes)
    S._plan_scan(xs, given, vt.is_tuple, op, init, None, alg, False, kind, numpy_sum, 0, None, axis,
                 stored=stored)
    out = []
    for fn, key, nt, args in launched:
        sig = tuple(L._nbtype(a) for a in args)
        out.append(("%s/%s" % (name, getattr(fn, "__name__", "kernel")), fn, sig, nt))
    return out


_INFO = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def blocks_per_sm(regs, smem, nt):
    """Resident blocks per SM on sm_90 (registers allocated per warp in units of 256)."""
    warp_regs = -(-regs * 32 // 256) * 256
    by_regs = 65536 // (warp_regs * (nt // 32)) if regs else 32
    by_smem = (233472 // (smem + 1024)) if smem else 32      # 1 KiB reserved per block
    by_threads = 2048 // nt
    return min(by_regs, by_smem, by_threads, 32)


def compile_one(name, fn, sig, nt, sass_dir=None):
    # MIN_BLOCKS=k: compile with launch bounds (nt, k), i.e. ask ptxas for k resident blocks.
    bounds = (nt, int(os.environ["MIN_BLOCKS"])) if os.environ.get("MIN_BLOCKS") else None
    bounds = bounds or getattr(fn, "jit_options", {}).get("launch_bounds")     # the factory's own
    ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0), launch_bounds=bounds)
    ptx = re.sub(r"^\.version .*$", ".version 9.0", ptx, count=1, flags=re.M)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(sass_dir or tmp, re.sub(r"[^\w.-]", "_", name) + ".ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cubin = src[:-4] + ".cubin"
        res = subprocess.run([PTXAS, "-arch=sm_90", "-v", src, "-o", cubin],
                             capture_output=True, text=True)
        info = res.stderr
        if res.returncode:
            raise RuntimeError(info)
        if sass_dir:
            sass = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True, text=True).stdout
            with open(src[:-4] + ".sass", "w") as f:
                f.write(sass)
    regs = int(_INFO.search(info).group(1))
    m = _SMEM.search(info)
    smem = int(m.group(1)) if m else 0
    m = _SPILL.search(info)
    spills = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    return regs, smem, spills, blocks_per_sm(regs, smem, nt)


def sass_option(argv):
    """``(DIR or None, the other arguments)`` of a leading ``--sass DIR`` (the folder made)."""
    if argv[:1] != ["--sass"]:
        return None, argv
    os.makedirs(argv[1], exist_ok=True)
    return argv[1], argv[2:]


DEFAULT_CASES = [
    "int32:inclusive:single_pass", "float32:inclusive:single_pass", "int32:exclusive:single_pass",
    "int8:inclusive:single_pass", "float64:inclusive:single_pass", "pair:inclusive:single_pass",
    "int32:inclusive:reduce_then_scan",
]


def main(argv):
    sass_dir, argv = sass_option(argv)
    variant = os.environ.get("CUFOLD_SCAN_VARIANT", "")
    print("variant: %r" % (variant or "default"))
    print("%-58s %5s %6s %9s %7s %s" % ("kernel", "regs", "smem", "spills", "blk/SM", "thr x blk"))
    for case in argv or DEFAULT_CASES:
        for name, fn, sig, nt in kernels(case):
            regs, smem, spills, bps = compile_one(name, fn, sig, nt, sass_dir)
            print("%-58s %5d %6d %4d/%-4d %7d %4dx%d" % (name, regs, smem, spills[0], spills[1],
                                                         bps, nt, bps))


if __name__ == "__main__":
    main(sys.argv[1:])
