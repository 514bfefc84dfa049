"""Compile cufold's device kernels to PTX for sm_90 on a machine without a GPU.

The simulator runs kernels as Python and so never type-checks them; this does,
through Numba's real CUDA pipeline. Run before every GPU session:
    PYTHONPATH=src python tools/ptx_check.py
"""
import hashlib
import os
import time

import numpy as np
from numba import cuda

from sm90 import pretend_sm90

pretend_sm90()

import cufold  # noqa: E402
import importlib  # noqa: E402
from cufold.host import arrays as _arrays  # noqa: E402
R = importlib.import_module("cufold.device.reduce")  # the module (cufold.device.reduce is the function)
L = importlib.import_module("cufold.host.launch")
P = importlib.import_module("cufold.host.programs")
from cufold.values import ValueType  # noqa: E402

compiled = {}


class _Compiled:
    name = "ptx-only"

    def launch(self, *args):
        pass

    def bind(self, *args):
        return lambda *new: None

    def resident_blocks(self, *args, **kw):
        return None                     # unknown without a GPU: the planners keep their grids


#: PTX_DUMP=DIR writes each kernel's PTX there, named by a digest of its key: two trees'
#: dumps diffed show which kernels a change altered.
DUMP = os.environ.get("PTX_DUMP")


def fake_kernel_for(fn, key, args):
    sig = tuple(L._nbtype(a) for a in args)
    k = (key, sig)
    if k not in compiled:
        t = time.time()
        # (PTX only: link-time optimisation is a linker's choice, not compile_ptx's)
        options = {k: v for k, v in L.jit_options_of(fn).items() if k != "lto"}
        ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0), **options)
        compiled[k] = time.time() - t
        if DUMP:
            os.makedirs(DUMP, exist_ok=True)
            name = hashlib.sha1(repr(k).encode()).hexdigest()[:16]
            with open(os.path.join(DUMP, name + ".ptx"), "w") as f:
                f.write("// %r\n%s" % (k, ptx))
    return _Compiled()


L.kernel_for = fake_kernel_for     # the one compile point of every launch (Programs too)


def arr(dtype, n=1000):
    dt = np.dtype(dtype)
    return _arrays.Arr(0x10000, (n,), (1,), dt, n, "numba", None, 0)


R._workspace = lambda dev, stream, vt, count: (
    tuple(arr(f, count) for f in vt.fields) if vt.is_tuple else arr(vt.dtype, count), arr(np.uint32, 1))
R._copy_partials = lambda b, vt, partials, count: partials
R._resident_blocks = lambda dev, nt: 1056


def check(op, in_dt, acc, out, lift="value", project="value", algorithms=R.ALGORITHMS, n=1 << 20):
    in_vt, acc_vt, out_vt = ValueType.of(in_dt), ValueType.of(acc), ValueType.of(out)
    for alg in algorithms:
        try:
            p = R.plan(op, in_vt, acc_vt, out_vt, n, 0, alg, lift=lift, project=project, deterministic=False)
        except ValueError as e:
            print("  skip %-12s %s" % (alg, str(e)[:60]))
            continue
        xs = tuple(arr(f, n) for f in in_vt.fields) if in_vt.is_tuple else arr(in_vt.dtype, n)
        outs = tuple(arr(f, 1) for f in out_vt.fields) if out_vt.is_tuple else arr(out_vt.dtype, 1)
        R.run(P.Builder(0, 0), p, xs, n, outs, None)
        print("  ok   %-12s %s -> %s (%s)" % (alg, in_vt, out_vt, op.name))


t0 = time.time()
check(cufold.plus, np.float32, np.float32, np.float32)
check(cufold.plus, np.int32, np.int64, np.int64)
check(cufold.maximum, np.float16, np.float32, np.float16, algorithms=("single_pass",))
check(cufold.argmax, np.float32, (np.float32, np.int64), np.int64, lift="index", project="index",
      algorithms=("single_pass", "single_block"))
check(cufold.welford, np.float32, (np.float64,) * 3, (np.float32, np.float32), lift="welford",
      project="mean_var", algorithms=("single_pass",))
check(cufold.plus, np.float32, (np.float64,) * 2, np.float32, lift="count", project="count_mean",
      algorithms=("single_pass",))                                     # a mean alone
check(cufold.as_op(lambda a, b: (a[0] * b[0], a[1] * b[0] + b[1])), (np.int64, np.int64),
      (np.int64, np.int64), (np.int64, np.int64), algorithms=("single_pass", "two_pass", "tiles", "single_block"))
print("%d kernels compiled in %.1f s" % (len(compiled), time.time() - t0))

# (axis reductions: at the end, through the Program path on descriptors of no memory)
from numba import types as nbt  # noqa: E402

# The radix grouping of reduce_by_key_into(deterministic=True): both kernels, both passes.
X = importlib.import_module("cufold.device.radix")
BK = importlib.import_module("cufold.device.bykey")
status = nbt.Tuple((L._nbtype(arr(np.int64)), L._nbtype(arr(np.int64))))
for key_dt, m in ((np.int32, 10**6), (np.int64, 2**33)):
    sk = X.sort_key_dtype(m)
    for first in (True, False):
        kd = np.dtype(key_dt) if first else sk
        on_bad = BK._record_out_of_range if first else None
        fn = X.count_kernel(np.dtype(kd), sk, first, 8, X.TILE, on_bad)
        gate = (L._nbtype(arr(np.int32)), nbt.int32)        # the flag of an adaptive call, and its value
        sig = (L._nbtype(arr(kd)), nbt.int64, nbt.int64, nbt.int64, L._nbtype(arr(np.int32)), nbt.int64,
               status, nbt.int64) + gate
        cuda.compile_ptx(fn, sig, cc=(9, 0))
        fn = X.scatter_kernel(np.dtype(kd), sk, np.dtype(np.float64), np.dtype(np.int32), first, 8, X.TILE)
        sig = (L._nbtype(arr(kd)), L._nbtype(arr(np.float64)), nbt.int64, nbt.int64, nbt.int64,
               L._nbtype(arr(np.int32)), nbt.int64, L._nbtype(arr(sk)), L._nbtype(arr(np.float64))) + gate
        ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
        print("  ok   radix %s first=%s (%d PTX lines)" % (np.dtype(kd), first, ptx.count("\n")))
print("radix kernels compiled; all in %.1f s" % (time.time() - t0))

# Every family's Programs as the library plans them (scans, segmented_reduce, reduce_by_key,
# reduce_by_key_into, histograms), on descriptors of no memory: what the simulator never types.
import types as _pytypes  # noqa: E402
L.workspace = lambda dev, stream, nbytes: (0x100000, arr(np.uint8, max(nbytes, 256)))
L.zeros = lambda dev, stream, nbytes: arr(np.uint8, nbytes)
S = importlib.import_module("cufold.device.scan")
SEG = importlib.import_module("cufold.device.segmented")
H = importlib.import_module("cufold.device.histogram")
fake_status = _pytypes.SimpleNamespace(kernel=(arr(np.int64, 2), arr(np.int64, 1)), epoch=0)
BK._status = lambda dev, stream, check: (fake_status, 1 if check else 0)
BK._resident_blocks = lambda *args: 132 * 4          # an H100's grid (no GPU to ask)
H.sm_count = lambda dev: 132
before = len(compiled)
n = 1 << 20
f32, i32 = arr(np.float32, n), arr(np.int32, n)
for alg in S.ALGORITHMS:
    for kind in ("inclusive", "exclusive"):
        S._plan_scan((f32,), (), False, cufold.plus, None, None, alg, True, kind, False, 0, None)
S._plan_scan((arr(np.int64, n), arr(np.int64, n)), (), True,
             cufold.Op(lambda a, b: (a[0] * b[0], a[1] * b[0] + b[1])), None, None, "single_pass", False,
             "inclusive", False, 0, None)
offsets = arr(np.int64, 1001)
SEG._plan_segmented((f32,), offsets, cufold.plus, None, None, 0, None, "segmented_reduce")
SEG._plan_segmented((f32, i32), offsets, cufold.minmax, None, None, 0, None, "segmented_reduce")
SEG._plan_count_runs((i32,), 0)
SEG._plan_runs((i32,), (f32,), cufold.plus, None, 5000, 0, None)
# Segmented scans: heads from CSR offsets (partition + scan) and from keys; scalar, float16,
# tuple (non-commutative, no identity) values; integer, float and tuple keys; both kinds.
SS = importlib.import_module("cufold.device.segscan")
ss_before = len(compiled)
affine = cufold.Op(lambda a, b: (a[0] * b[0], a[1] * b[0] + b[1]), name="affine")
i64n = arr(np.int64, n)
for exclusive in (False, True):
    SS._plan((f32,), (offsets,), None, cufold.plus, exclusive, None, None, 0, None, "segmented_scan")
    SS._plan((f32,), (i32,), ValueType.of(np.int32), cufold.plus, exclusive, None, None, 0, None, "scan_by_key")
    SS._plan((i64n, i64n), (arr(np.int32, 1001),), None, affine, exclusive, (1, 0) if exclusive else None, None,
             0, None, "segmented_scan")
SS._plan((arr(np.float16, n),), (arr(np.uint8, 1001),), None, cufold.maximum, False, None, None, 0, None,
         "segmented_scan")
SS._plan((i64n, i64n), (f32, arr(np.int8, n)), ValueType.of((np.float32, np.int8)), affine, False, None, None, 0,
         None, "scan_by_key")
SS._plan((arr(np.int8, n),), (arr(np.float64, n),), ValueType.of(np.float64), cufold.plus, True, 3,
         np.int64, 0, None, "scan_by_key")
SS._plan((f32, i64n), (offsets,), None, cufold.argmin, False, None, None, 0, None, "segmented_scan")
SS._plan((arr(np.bool_, n),), (i64n,), ValueType.of(np.int64), cufold.logical_or, True, None, None, 0, None,
         "scan_by_key")
ss_keys = [k[0] for k in list(compiled)[ss_before:]]
for key in ss_keys:
    spec = key[1]
    what = ("%s %s -> %s, %s" % (spec.op.name, spec.in_vt, spec.out_vt,
                                 "offsets" if spec.key_vt is None else "keys %s" % spec.key_vt)
            if key[0] == "segscan" else "nv=%d" % spec)
    print("  ok   %s %s%s" % (key[0], what, " exclusive" if key[0] == "segscan" and spec.exclusive else ""))
out64 = arr(np.float64, 10**6)
for alg in BK.ALGORITHMS:
    for det, check in ((False, True), (False, False)) if alg != "sorted" else ((True, True), (False, False)):
        BK._plan_program(cufold.plus, i32, f32, out64, alg, det, check, 0)
BK._plan_program(cufold.plus, i32, f32, out64, None, True, True, 0)          # the radix grouping
BK._plan_program(cufold.maximum, i32, f32, arr(np.float32, 10**6), "warp", False, False, 0)   # a CAS loop
edges = arr(np.float64, 65)
for mode, w in (("uniform", None), ("edges", f32), ("uniform", arr(np.float64, n))):
    for alg in H.ALGORITHMS:
        H._plan_counts(mode, f32, w, 64, edges, False, alg, 0, None)
H._plan_counts("int", i32, None, 64, None, False, None, 0, None)
# Generated x and weights (cufold.counting, cufold.constant): items computed from the index.
gen_x, gen_w = _arrays.Generated("counting", n, -3, np.float32), _arrays.Generated("constant", n, 0.5, np.float32)
for mode in ("uniform", "edges"):
    for alg in H.ALGORITHMS:
        H._plan_counts(mode, gen_x, gen_w, 64, edges, False, alg, 0, None)
H._plan_counts("uniform", gen_x, None, 64, edges, False, "shared", 0, None)
H._plan_counts("uniform", f32, gen_w, 64, edges, False, "global_match", 0, None)
H._plan_counts("int", _arrays.Generated("counting", n, 1, np.int32), arr(np.float64, n), 64, None, False, None, 0,
               None)
H._plan_minmax(("histogram", None, None, 0, None), gen_x)
print("%d family kernels compiled; all in %.1f s" % (len(compiled) - before, time.time() - t0))

# reduce_by_key_into of tuple values: every path (field-wise warp/atomic with hardware and CAS
# fields, packed argmin/argmax lifted and given, two-pass Welford, sorted and grouped).
BT = importlib.import_module("cufold.device.bykey_tuple")
before = len(compiled)
f64, i64 = arr(np.float64, n), arr(np.int64, n)
o32, o64, oi64, oi32 = (arr(np.float32, 10**6), arr(np.float64, 10**6), arr(np.int64, 10**6),
                        arr(np.int32, 10**6))
ou32 = arr(np.uint32, 10**6)


def tuple_plan(op, vals, outs, alg, det=False, check=True, keys=i32):
    lift = BT._lift_of(op, len(vals), len(outs))
    in_vt, out_vt = BT._check_fields(op, lift, vals, outs, keys.size)
    BT._plan_program(op, lift, in_vt, out_vt, keys, vals, outs, alg, det, check, 0)
    print("  ok   tuple %-8s %-9s %s -> %s" % (alg, op.name, in_vt, out_vt))


tuple_plan(cufold.plus, (i64, f64, f64, f64), (oi64, o64, o64, o64), None)                   # adaptive
tuple_plan(cufold.plus, (i64, f64, f64, f64), (oi64, o64, o64, o64), "warp")
tuple_plan(cufold.plus, (i64, f64), (oi64, o64), "atomic", check=False, keys=i64)
tuple_plan(cufold.maximum, (f32, i32), (o32, oi32), "warp")                  # a CAS field beside a hardware one
tuple_plan(cufold.minmax, (f32, f32), (o32, o32), "adaptive", keys=i64)
tuple_plan(cufold.argmax, (f32,), (o32, oi64), "packed")
tuple_plan(cufold.argmin, (f32,), (o32, oi32), "packed", check=False)
os.environ["CUFOLD_BYKEY_TUPLE_ROWS"] = "warp"
tuple_plan(cufold.argmax, (f32,), (o32, oi64), "packed")
del os.environ["CUFOLD_BYKEY_TUPLE_ROWS"]
tuple_plan(cufold.argmax, (i32, i32), (oi32, oi32), "packed")
tuple_plan(cufold.argmin, (arr(np.uint32, n), arr(np.uint32, n)), (ou32, ou32), "packed")
BT.KEPT_WORDS_MAX = 0                                 # packed's words filled per call (many keys)
tuple_plan(cufold.argmax, (f32,), (o32, oi64), "packed")
BT.KEPT_WORDS_MAX = 1 << 22
tuple_plan(cufold.welford, (f64,), (o64, o64, o64), "two_pass")
tuple_plan(cufold.welford, (f32,), (o32, o32, o32), "two_pass", check=False)
tuple_plan(cufold.argmax, (f64,), (o64, oi64), "grouped")
tuple_plan(cufold.welford, (f64,), (o64, o64, o64), None, det=True)
tuple_plan(cufold.plus, (i64, f64), (oi64, o64), "sorted", det=True)
tuple_plan(cufold.plus, (i64, f64), (oi64, o64), "sorted", keys=arr(np.uint16, n))
tuple_plan(cufold.argmax, (f64, i64), (o64, oi64), "sorted", check=False)
tuple_plan(cufold.Op(lambda a, b: (a[0] * b[0], a[1] * b[0] + b[1])), (f64, f64), (o64, o64), None)
tuple_plan(cufold.plus, (arr(np.bool_, n), arr(np.float16, n)), (oi32, o32), "warp", keys=arr(np.uint8, n))
tuple_plan(cufold.argmax, (arr(np.int16, n), arr(np.int16, n)), (oi32, oi32), "packed", keys=arr(np.int16, n))
tuple_plan(cufold.welford, (i32,), (o64, o64, o64), "two_pass")
sum_max32 = cufold.Op(lambda a, b: (a[0] + b[0], max(a[1], b[1])), identity=(0.0, -2**31), commutative=True)
tuple_plan(sum_max32, (f32, i32), (o32, oi32), None)                                       # cas
tuple_plan(sum_max32, (arr(np.int16, n), arr(np.bool_, n)), (arr(np.int16, 10**6), arr(np.bool_, 10**6)), "cas")
print("%d tuple by-key kernels compiled; all in %.1f s" % (len(compiled) - before, time.time() - t0))

# Axis reductions: every kernel of the layout planner (rows in sub-warp, warp and block
# groups, split or not; columns split or not; one and two outer reduced dimensions), for
# float32, float64, int32, argmax (a tuple accumulator) and mean/var (Welford).
A = importlib.import_module("cufold.device.axis")
D = importlib.import_module("cufold.device")
A.limits = lambda dev: A.Limits(256, 4096, 16, 1024, 132 * 8, 132 * 4)
before = len(compiled)


def view(dtype, shape, strides):
    size = int(np.prod(shape))
    return _arrays.Arr(0x10000, tuple(shape), tuple(strides), np.dtype(dtype), size, "numba", None, 0)


LAYOUTS = [  # (shape, strides, axes): what each exercises
    ((8192, 64), (64, 1), (1,)),          # rows, sub-warp groups of 16 lanes
    ((1 << 16, 8), (8, 1), (1,)),         # rows, sub-warp groups of 2 (4-byte items: 8-byte loads)
    ((1 << 16, 7), (7, 1), (1,)),         # rows of an odd length: 4-byte loads
    ((256, 1024), (1024, 1), (1,)),       # rows, warp groups, split
    ((65536, 1024), (1024, 1), (1,)),     # rows, warp groups
    ((64, 65536), (65536, 1), (1,)),      # rows, block groups, split
    ((4096, 8192), (16384, 1), (0, 1)),   # full reduction of x[::2]: block groups, split, an outer dim
    ((4, 5, 3, 4096), (10 * 24576, 24576, 4096, 1), (0, 1, 3)),   # rows, two outer dims
    ((8192, 8192), (8192, 1), (0,)),      # columns, split
    ((64, 1 << 20), (1 << 20, 1), (0,)),  # columns, no split (the tiles fill the GPU)
    ((8, 64, 4096), (64 * 4096 * 2, 4096, 1), (0, 1)),  # columns, two reduced dims
    ((1 << 24, 4), (4, 1), (0,)),         # columns of 4 x 64 threads, split
    ((1 << 24, 4), (4, 1), (1,)),         # rows, a thread per row
    ((64, 65536, 3), (196608, 1, 65536), (0,)),   # columns over two kept dims (y.permute(0, 2, 1))
    ((64, 3, 65536), (196608, 65536, 1), (1,)),   # columns of 3 items: 256 x 1 threads
    ((3, 65536, 64), (65536, 1, 196608), (0,)),   # results turned in shared memory (y.permute(1, 2, 0))
]
CASES = [(D._SUM, np.float32), (D._SUM, np.float64), (D._SUM, np.int32), (D._ARGMAX, np.float32),
         (D._MAX, np.float32)]
for reduction, dt in CASES:
    for shape, strides, axes in LAYOUTS:
        if reduction is D._ARGMAX and len(axes) > 1 and len(axes) != len(shape):
            continue
        x = view(dt, shape, strides)
        reduction._plan(((P.signature(x),), 0, None, None, axes, False, None, True, False, (), False, None, None,
                          None), x)
moments = D._Reduction(cufold.welford, lambda dt: D._moment_options("mean_var", 0, None, dt), name="mean_var",
                       needs_items=True)
means = D._Reduction(cufold.plus, lambda dt: D._moment_options("mean", 0, None, dt), name="mean", needs_items=True)
ordered = D._Reduction(cufold.Op(lambda p, q: (p[0] * q[0], p[1] * q[0] + q[1])), name="affine")
SOME = [lay for lay in LAYOUTS if lay[0] in ((1 << 16, 8), (1 << 16, 7), (256, 1024), (64, 65536), (8192, 8192),
                                               (1 << 24, 4), (3, 65536, 64))]
for shape, strides, axes in SOME:
    x = view(np.float32, shape, strides)
    moments._plan(((P.signature(x),), 0, None, None, axes, False, None, True, False, (), False, None, None, None), x)
    means._plan(((P.signature(x),), 0, None, None, axes, False, None, True, False, (), False, None, None, None), x)
    xi = view(np.int64, shape, strides)
    ordered._plan(((P.signature(xi),) * 2, 0, None, None, axes, False, None, True, True, (), False, None, None,
                   None), xi, xi)
axis_keys = [k[0] for k in compiled if isinstance(k[0], tuple) and str(k[0][0]).startswith("axis")]
for key in sorted({(k[0], k[1].op.name, str(k[1].in_vt) + (" wide" if k[1].wide else "")) + tuple(k[2:])
                   for k in axis_keys}, key=str):
    print("  ok   %s %s %s (%s)" % (key[0], key[1], key[2], " ".join(map(str, key[3:]))))
print("%d axis kernels compiled; all in %.1f s" % (len(compiled) - before, time.time() - t0))

# Feature rows (values (n, F)): reduce_by_key_into's atomic rows (hardware and CAS updates, sub-warp
# and warp lanes, strided rows), its ordered rows after the radix grouping (deterministic=True),
# segmented_reduce's CSR rows and their piece levels, reduce_by_key's totals.
ROWS = importlib.import_module("cufold.device.rows")
before = len(compiled)
nr, mr = 1 << 20, 200_000


# (the adaptive path's hint slot is mapped host memory: a placeholder here)
RB = importlib.import_module("cufold.host.readback")
RB.hint_slot = lambda device_id: RB.HintSlot(arr(np.int32, 1), np.zeros(1, np.int32), 0)


def rows_into(op, keys, vals, out, det=False, check=True, transform=None):
    sig = P.signature
    ROWS._plan_into(("rows", op, None, det, check, sig(keys), sig(vals), sig(out), 0, transform, None), keys, vals, out)
    print("  ok   rows into %-8s %s keys, values %s %s -> %s det=%s" % (op.name, keys.dtype, vals.shape, vals.dtype,
                                                                     out.dtype, det))


rows_into(cufold.plus, i32, view(np.float32, (nr, 64), (64, 1)), view(np.float32, (mr, 64), (64, 1)))
rows_into(cufold.maximum, arr(np.int64, nr), view(np.float32, (nr, 16), (16, 1)), view(np.float32, (mr, 16), (16, 1)),
          check=False)
rows_into(cufold.plus, arr(np.uint8, nr), view(np.float16, (nr, 3), (1, nr)), view(np.float64, (mr, 3), (6, 2)))
rows_into(cufold.maximum, i32, view(np.int32, (nr, 33), (40, 1)), view(np.int64, (mr, 33), (33, 1)))
rows_into(cufold.plus, i32, view(np.float32, (nr, 256), (256, 1)), view(np.float32, (mr, 256), (256, 1)), det=True)
rows_into(cufold.minimum, arr(np.int16, nr), view(np.float64, (nr, 5), (5, 1)), view(np.float64, (mr, 5), (5, 1)),
          det=True, check=False)
offsets = arr(np.int64, mr + 1)
for vals in (view(np.float32, (nr, 64), (64, 1)), view(np.float32, (nr, 1), (1, 1)),
             view(np.int32, (nr, 7), (1, nr))):
    for op in (cufold.plus, cufold.maximum):
        ROWS._plan_segments((P.signature(vals), P.signature(offsets), 0, op, None, None, False, None), vals, offsets)
        print("  ok   rows segments %-8s %s %s" % (op.name, vals.shape, vals.dtype))
ROWS._plan_segments((P.signature(f32), P.signature(arr(np.int32, 11)), 0, cufold.plus, 1.5, np.float64, False, None),
                    view(np.float16, (nr, 16), (16, 1)), arr(np.int32, 11))
SEG._plan_runs((i32,), (view(np.float32, (n, 16), (16, 1)),), cufold.plus, None, 5000, 0, None)
print("%d feature-row kernels compiled; all in %.1f s" % (len(compiled) - before, time.time() - t0))

# Fills (launch.fill): empty inputs' results, 1-D and along an axis, scalar and tuple values.
before = len(compiled)
for reduction, shape, axes in [(D._SUM, (0,), None), (moments, (0,), None), (D._SUM, (4, 0), (1,)),
                               (D._MAX, (3, 0), (1,)),
                               (moments, (6, 0), (1,))]:
    x = view(np.float32, shape, (shape[-1], 1)[-len(shape):] if len(shape) > 1 else (1,))
    try:
        reduction._plan(((P.signature(x),), 0, None, None, axes, False, None, True, False, (), False, None, None,
                          None), x)
    except ValueError as e:                   # no identity: the error, no kernel
        print("  --   %s of %s: %s" % (reduction.name, shape, e))
fills = sorted({str(k[0]) for k in compiled if isinstance(k[0], tuple) and k[0][0] == "fill"})
print("  ok   %s" % "\n  ok   ".join(fills))
print("%d fill kernels compiled; all in %.1f s" % (len(compiled) - before, time.time() - t0))

# Reproducible (gpu_to_gpu) sums: the binned sum kernel per binning dtype and finish (sum, mean,
# state), the warp-per-segment kernel, the state combine/finalise kernel.
RP = importlib.import_module("cufold.device.reproducible")
RP._resident_blocks = lambda *args: 132 * 3
before = len(compiled)
for dt in (np.float32, np.float64, np.float16):
    x = arr(dt, n)
    D._SUM._plan(((P.signature(x),), 0, None, None, None, False, None, "gpu_to_gpu", False, (), False, None, None, None), x)
mean_r = D._Reduction(cufold.plus, lambda dt: D._moment_options("mean", 0, None, dt), name="mean",
                      needs_items=True)
for dt in (np.float32, np.int32):
    x = arr(dt, n)
    mean_r._plan(((P.signature(x),), 0, None, None, None, False, None, "gpu_to_gpu", False, (), False, None, None, None), x)
for dt in (np.float32, np.float64):
    x = arr(dt, n)
    RP._state_plan(((P.signature(x),), 0, False, None, None, True, None), x)     # 8-byte loads (float32)
    SEG._plan_segmented_key((None, None, 0, cufold.plus, None, None, False, "gpu_to_gpu"), x, offsets)
unaligned = _arrays.Arr(0x10004, (n,), (1,), np.dtype(np.float32), n, "numba", None, 0)   # 4-byte loads
RP._state_plan(((P.signature(unaligned),), 0, False, None, None, True, None), unaligned)
states = _arrays.Arr(0x10000, (4, RP.STATE_WORDS), (RP.STATE_WORDS, 1), np.dtype(np.int64), 4 * RP.STATE_WORDS,
                     "numba", None, 0)
RP._combine_kernel_plan((P.signature(states), 0, False, "state", None, None), states)
RP._combine_kernel_plan((P.signature(states), 0, False, "sum", np.dtype(np.float32), np.dtype(np.float32)), states)
RP._combine_kernel_plan((P.signature(states), 0, False, "sum", np.dtype(np.float64), np.dtype(np.float64)), states)
for k in compiled:
    if isinstance(k[0], tuple) and str(k[0][0]).startswith("binned"):
        print("  ok   %s %s" % (k[0][0], str(k[0][1])[:160]))
print("%d reproducible kernels compiled; all in %.1f s" % (len(compiled) - before, time.time() - t0))

# Scans along an axis and in reverse (device/scan_axis.py): segments, lanes (groups of 16 and 32 lanes),
# tiles (one tile a row; several, packed and wide states), columns (no chunks; chunks with a
# lanes spine and with a tiles spine), the gather fallback (4-D permuted; axis=None of a
# transposed matrix), reversed views, tuple values (the affine recurrence) and int32 -> int64.
before = len(compiled)
affine = cufold.Op(lambda p, q: (p[0] * q[0], p[1] * q[0] + q[1]), name="affine")
SCAN_AXES = [  # (dtype(s), shape, strides, axis, op, kind, numpy_sum, reverse)
    (np.float32, (4096, 4096), (4096, 1), 1, cufold.plus, "inclusive", True, False),     # tiles, one a row
    (np.float32, (16, 1 << 20), (1 << 20, 1), 1, cufold.plus, "inclusive", True, True),  # tiles, look-back
    (np.float32, (1 << 20, 16), (16, 1), 1, cufold.plus, "inclusive", True, False),      # segments
    (np.float32, (1 << 16, 200), (200, 1), 1, cufold.maximum, "exclusive", False, True),  # segments, rev.
    (np.float32, (1 << 16, 16), (32, 1), 1, cufold.plus, "inclusive", True, False),      # lanes of 16
    (np.float32, (1 << 16, 200), (402, 2), 1, cufold.maximum, "exclusive", False, True),  # lanes of 32
    (np.float32, (400, 5, 100), (1200, 200, 1), 2, cufold.plus, "inclusive", True, False),   # lanes, A x C
    (np.float32, (1 << 20, 16), (16, 1), 0, cufold.plus, "inclusive", True, False),      # columns, tiles spine
    (np.float32, (4096, 4096), (4096, 1), 0, cufold.plus, "inclusive", True, True),      # columns, lanes spine
    (np.float32, (16, 1 << 20), (1 << 20, 1), 0, cufold.plus, "inclusive", True, False),  # columns, no chunks
    (np.int32, (4096, 4096), (4096, 1), 0, cufold.plus, "exclusive", True, False),       # int32 -> int64
    (np.int32, (4096, 4096), (1, 4096), 0, cufold.plus, "inclusive", True, False),       # transposed: tiles
    ((np.float32, np.float32), (4096, 2048), (2048, 1), 1, affine, "inclusive", False, False),   # wide states
    ((np.float32, np.float32), (4096, 2048), (2048, 1), 1, affine, "inclusive", False, True),
    ((np.float32, np.float32), (2048, 64), (64, 1), 0, affine, "exclusive", False, False),       # columns
    ((np.float32, np.float32), (64, 2048), (2048, 1), 1, affine, "exclusive", False, True),      # tiles, excl.
    ((np.float32, np.float32), (1 << 16, 20), (20, 1), 1, affine, "inclusive", False, False),    # lanes
    (np.float32, (8, 9, 10, 11), (990, 1, 99, 9), 2, cufold.plus, "inclusive", True, False),    # gather 4-D
    (np.float64, (300, 200), (1, 300), None, cufold.plus, "inclusive", True, False),     # gather, flat
    (np.int32, (1 << 20,), (1,), None, cufold.plus, "inclusive", True, True),             # reversed 1-D
    ((np.float32, np.float32), (1 << 26,), (1,), None, affine, "inclusive", False, False),  # 1-D, pair states
    ((np.float32, np.float32), (16, 1 << 20), (1 << 20, 1), 1, affine, "inclusive", False, False),  # tiles, pair
    ((np.float32, np.float32), (16, 1 << 20), (1 << 20, 1), 1, affine, "exclusive", False, True),
    (np.int32, (16, 1 << 20), (1 << 20, 1), 1, cufold.plus, "exclusive", True, False),    # int64 pair states
]
for dts, shape, strides, ax, op, kind, numpy_sum, rev in SCAN_AXES:
    fields = dts if isinstance(dts, tuple) else (dts,)
    xs = tuple(view(f, shape, strides) for f in fields)
    S._plan_scan(xs, (), isinstance(dts, tuple), op, None if kind == "inclusive" or op is not affine else (1.0, 0.0),
                 None, None, False, kind, numpy_sum, 0, None, ax, rev)
def _scan_key(key):
    if key[0] in ("scan_tiles", "scan"):
        spec = key[1]
        return "%s %s %s->%s %s %dx%d %s %s%s" % (key[0], spec.op.name, spec.in_vt, spec.out_vt, spec.kind,
                                                 spec.tile.nt, spec.tile.vt, spec.carry, spec.variant.states,
                                                 "" if spec.transform is None else " " + spec.transform.name)
    return str(key[:1] + key[2:])


scan_keys = sorted({_scan_key(k[0]) for k in list(compiled)[before:]})
for key in scan_keys:
    print("  ok   %s" % key[:150])
print("%d axis-scan kernels compiled; all in %.1f s" % (len(compiled) - before, time.time() - t0))

# Fused transforms (transform=, post=), generated inputs and the shortcuts built on them
# (device/fused.py), whole (single_pass, 8-byte loads where they apply) and along axes
# (rows and columns), and the projected fill of an empty reduction with a post-map.
F = importlib.import_module("cufold.device.fused")
as_transform_ = cufold.ops.as_transform
before = len(compiled)


def fused(reduction, xs, dtype=None, axis=None, transform=None, post=None, algorithm=None, keepdims=False,
          deterministic=True):
    xs = xs if isinstance(xs, tuple) else (xs,)
    key = (tuple(P.signature(a) for a in xs), 0, None, dtype, axis, keepdims, algorithm, deterministic,
           len(xs) > 1, (), False, None, transform, post)
    reduction._plan(key, *xs)


def square(v):
    return v * v


f32n, f64n = arr(np.float32, n), arr(np.float64, n)
rows, cols = view(np.float32, (4096, 1024), (1024, 1)), view(np.float32, (8192, 8192), (8192, 1))
count = _arrays.Generated("counting", n, 0, np.int64)
for alg in ("single_pass", "two_pass", "single_block"):
    fused(D._SUM, f32n, transform=square, post=lambda s: s + 1, algorithm=alg)
fused(D._SUM, f64n, transform=abs)
fused(D._ARGMAX, f32n, transform=abs)
fused(D._ARGMAX, count, transform=lambda i: -(i - 7) ** 2)
fused(D._SUM, (f32n, count), transform=lambda t: t[0] * t[1])
fused(D._SUM, _arrays.Generated("constant", n, 2.5, np.float32))
fused(D._Reduction(cufold.argmin), (f32n, _arrays.Generated("counting", n, 3, np.int32)))
fused(moments, f32n, transform=square)
fused(F._dot_reduction(), (f32n, f32n), np.dtype(np.float32), transform=F._product(np.dtype(np.float32)))
fused(D._SUM, (arr(np.int32, n), arr(np.int32, n), arr(np.uint32, n)), transform=lambda t: t[0] * t[1] + t[2])
fused(F._dot_reduction(), (arr(np.int32, n), arr(np.int32, n)), np.dtype(np.int32),
      transform=F._product(np.dtype(np.int32)))
for ord_ in (2.0, 1.0, np.inf, 0.0, 3.0):
    op, tf, post = F._norm_functions(ord_, np.dtype(np.float32), np.dtype(np.float32))
    fused(F._norm_reduction(op, "norm"), f32n, np.dtype(np.float32), transform=tf, post=post)
op, tf, post = F._norm_functions(2.0, np.dtype(np.float32), np.dtype(np.float16))
fused(F._norm_reduction(op, "norm"), arr(np.float16, n), np.dtype(np.float32), transform=tf, post=post)
for dt in (np.float32, np.float64):
    op, lift, finish = F._logsumexp_functions(np.dtype(dt), np.dtype(dt))
    fused(F._logsumexp_reduction(op), arr(dt, n), transform=lift, post=finish)
    for x, ax in ((rows, (1,)), (cols, (0,))):
        fused(F._logsumexp_reduction(op), view(dt, x.shape, x.strides), transform=lift, post=finish, axis=ax)
fused(D._SUM, arr(np.float32, 0), transform=square, post=lambda s: s + 1)           # the projected fill
op, tf, post = F._norm_functions(2.0, np.dtype(np.float32), np.dtype(np.float32))
for x, ax in ((rows, (1,)), (cols, (0,))):
    fused(F._norm_reduction(op, "norm"), x, np.dtype(np.float32), transform=tf, post=post, axis=ax)
F.count_nonzero.__globals__["_COUNT"] or F._COUNT.append(D._Reduction(cufold.plus, name="count_nonzero"))
fused(F._COUNT[0], f32n, np.dtype(np.int64), transform=F._nonzero)
fused(F._COUNT[0], rows, np.dtype(np.int64), transform=F._nonzero, axis=(1,))
fused(F._truth(cufold.logical_and, "all"), arr(np.int32, n), transform=F._nonzero)
fused(F._truth(cufold.logical_or, "any"), cols, transform=F._nonzero, axis=(0,))
print("%d fused kernels compiled; all in %.1f s" % (len(compiled) - before, time.time() - t0))

# transform= and generated inputs in the other families: scans (every algorithm), segmented
# reductions, reduce_by_key's runs, reduce_by_key_into's scalar paths (every algorithm).
before = len(compiled)
sq, count32 = as_transform_(square), _arrays.Generated("counting", n, 0, np.int32)
for alg in S.ALGORITHMS:
    S._plan_scan((i32,), (), False, cufold.plus, None, None, alg, True, "inclusive", True, 0, None, transform=sq)
    S._plan_scan((count, ), (), False, cufold.plus, None, None, alg, False, "exclusive", False, 0, None)
    S._plan_scan((f32, count), (), True, cufold.argmax, None, None, alg, False, "inclusive", False, 0, None)
S._plan_scan((_arrays.Generated("constant", n, 2.0, np.float32),), (), False, cufold.maximum, None, None,
             "single_pass", False, "inclusive", False, 0, None, transform=as_transform_(abs))
SEG._plan_segmented((f32,), offsets, cufold.plus, None, None, 0, None, "segmented_reduce", transform=sq)
SEG._plan_segmented((count,), offsets, cufold.maximum, -1, None, 0, None, "segmented_reduce")
SEG._plan_runs((i32,), (f32,), cufold.plus, None, 5000, 0, None, sq)
SEG._plan_runs((i32,), (count,), cufold.minimum, None, 5000, 0, None)
oi64m = arr(np.int64, 10**6)
for alg in BK.ALGORITHMS:
    BK._plan_program(cufold.minimum, i32, count, oi64m, alg, False, False, 0)
    BK._plan_program(cufold.plus, i32, f32, out64, alg, False, True, 0, sq)
BK._plan_program(cufold.minimum, i32, count32, arr(np.int32, 10**6), None, False, True, 0)
BK._plan_program(cufold.plus, i32, _arrays.Generated("constant", n, 1.0, np.float64), out64, "warp", False,
                 False, 0)
BK._plan_program(cufold.plus, i32, f32, out64, None, True, True, 0, sq)        # grouped (radix), transformed
SS._plan((i32,), (offsets,), None, cufold.plus, False, None, None, 0, None, "segmented_scan", sq)
SS._plan((count,), (offsets,), None, cufold.plus, True, None, None, 0, None, "segmented_scan")
SS._plan((f32,), (i32,), ValueType.of(np.int32), cufold.maximum, False, None, None, 0, None, "scan_by_key",
         as_transform_(abs))
print("%d transformed / generated family kernels compiled; all in %.1f s" % (len(compiled) - before,
                                                                              time.time() - t0))

# transform= on scans along an axis (device/scan_axis.py): every layout family with a transform
# fused into its loads (segments, lanes of 16 and 32, tiles of one tile a row and with look-backs in
# packed / pair / wide states, columns without chunks and with lanes and tiles spines, the gather of
# a 4-D permutation and of axis=None of a transposed matrix), zipped inputs (a product; the affine
# pair from a transform), reversed; and reversed generated inputs (a counting input counts down).
before = len(compiled)
double_b = as_transform_(lambda ab: (ab[0], ab[1] * 2))
product = as_transform_(lambda t: t[0] * t[1])
T_AXES = [  # (dtype(s), shape, strides, axis, op, kind, numpy_sum, reverse, transform)
    (np.float32, (4096, 4096), (4096, 1), 1, cufold.plus, "inclusive", True, False, sq),      # tiles, one a row
    (np.float32, (16, 1 << 20), (1 << 20, 1), 1, cufold.plus, "inclusive", True, True, sq),   # tiles, packed
    (np.int32, (16, 1 << 20), (1 << 20, 1), 1, cufold.plus, "exclusive", True, False, sq),    # tiles, pair
    (np.float32, (1 << 20, 16), (16, 1), 1, cufold.plus, "inclusive", True, False, sq),       # segments
    (np.float32, (1 << 16, 200), (200, 1), 1, cufold.maximum, "exclusive", False, True, as_transform_(abs)),
    (np.float32, (1 << 16, 16), (32, 1), 1, cufold.plus, "inclusive", True, False, sq),       # lanes of 16
    (np.float32, (1 << 16, 200), (402, 2), 1, cufold.maximum, "exclusive", False, True, as_transform_(abs)),
    (np.float32, (1 << 20, 16), (16, 1), 0, cufold.plus, "inclusive", True, False, sq),       # columns, tiles spine
    (np.float32, (4096, 4096), (4096, 1), 0, cufold.plus, "inclusive", True, True, sq),       # columns, lanes spine
    (np.float32, (16, 1 << 20), (1 << 20, 1), 0, cufold.plus, "inclusive", True, False, sq),  # columns, no chunks
    ((np.float32, np.float32), (4096, 2048), (2048, 1), 1, cufold.plus, "inclusive", True, False, product),
    ((np.float32, np.float32), (4096, 2048), (2048, 1), 0, cufold.plus, "inclusive", True, False, product),
    ((np.float32, np.float32), (16, 1 << 20), (1 << 20, 1), 1, affine, "inclusive", False, True, double_b),  # wide
    ((np.float32, np.float32), (2048, 64), (64, 1), 0, affine, "inclusive", False, False, double_b),
    ((np.float32, np.float32), (1 << 16, 20), (20, 1), 1, affine, "inclusive", False, False, double_b),
    ((np.float32, np.float32), (1 << 16, 20), (40, 2), 1, affine, "inclusive", False, False, double_b),
    (np.float32, (8, 9, 10, 11), (990, 1, 99, 9), 2, cufold.plus, "inclusive", True, False, sq),    # gather 4-D
    ((np.float32, np.float32), (8, 9, 10, 11), (990, 1, 99, 9), 2, cufold.plus, "inclusive", True, False, product),
    (np.float64, (300, 200), (1, 300), None, cufold.plus, "inclusive", True, True, sq),       # gather, flat
]
for dts, shape, strides, ax, op, kind, numpy_sum, rev, tf in T_AXES:
    fields = dts if isinstance(dts, tuple) else (dts,)
    xs = tuple(view(f, shape, strides) for f in fields)
    init = None if kind == "inclusive" or op is not affine else (1.0, 0.0)
    S._plan_scan(xs, (), isinstance(dts, tuple), op, init, None, None, False, kind, numpy_sum, 0, None, ax, rev, tf)
for alg in S.ALGORITHMS:                                  # reversed generated inputs: countdown
    S._plan_scan((count,), (), False, cufold.plus, None, None, alg, True, "inclusive", True, 0, None, None, True)
    S._plan_scan((_arrays.Generated("constant", n, 2.0, np.float32), count32), (), True, cufold.argmax, None,
                 None, alg, False, "inclusive", False, 0, None, None, True,
                 as_transform_(lambda t: (t[0] * t[1], t[1])))
for key in sorted({_scan_key(k[0]) for k in list(compiled)[before:]}):
    print("  ok   %s" % key[:150])
print("%d transformed axis-scan / reversed generated kernels compiled; all in %.1f s" % (len(compiled) - before,
                                                                                       time.time() - t0))

# Issue 20 part C: deterministic="gpu_to_gpu" of fused items (sum/mean/reduce of a transform,
# zipped and generated inputs, post=; dot, vdot, norm; sum_state of zipped pieces; segmented
# sums with a transform), transform= on feature rows (atomic, ordered and CSR rows, F = 1's
# 1-D paths, reduce_by_key's totals) and on tuple values by key (every path but packed), and
# generated value fields by key.
before = len(compiled)
G = "gpu_to_gpu"
fused(D._SUM, f32n, transform=square, deterministic=G)
fused(D._SUM, f64n, transform=square, post=lambda s: s ** 0.5, deterministic=G)
fused(D._SUM, (f32n, count), transform=lambda t: t[0] * t[1], deterministic=G)
fused(D._SUM, _arrays.Generated("counting", n, 0, np.float64), transform=square, deterministic=G)
fused(mean_r, f32n, transform=abs, deterministic=G)
for dt in (np.float32, np.float64, np.float16):
    acc = np.dtype(np.float32 if dt == np.float16 else dt)
    fused(F._dot_reduction(), (arr(dt, n), arr(dt, n)), np.dtype(dt), transform=F._product(acc), deterministic=G)
    for ord_ in (2.0, 1.0):
        op, tf, post = F._norm_functions(ord_, acc, np.dtype(dt))
        fused(F._norm_reduction(op, "norm"), arr(dt, n), acc, transform=tf, post=post, deterministic=G)
fused(F._dot_reduction(), (view(np.float32, (512, 2048), (2048, 1)),) * 2, np.dtype(np.float32),
      transform=F._product(np.dtype(np.float32)), deterministic=G)                 # vdot of matrices
RP._state_plan(((P.signature(f32n), P.signature(f32n)), 0, False, None, None, None, as_transform_(F._product(
    np.dtype(np.float32)))), f32n, f32n)
SEG._plan_segmented_key((None, None, 0, cufold.plus, None, None, False, G, as_transform_(lambda t: t[0] * t[1])),
                        f32n, f32n, offsets)
SEG._plan_segmented_key((None, None, 0, cufold.plus, None, None, False, G, sq),
                        _arrays.Generated("counting", n, 0, np.float64), offsets)
SEG._plan_segmented_key((None, None, 0, cufold.plus, None, None, False, G, as_transform_(abs)), f64n, offsets)
half = as_transform_(lambda v: v * 0.5)
rows_into(cufold.plus, i32, view(np.int32, (nr, 64), (64, 1)), view(np.float64, (mr, 64), (64, 1)),
          transform=half)
rows_into(cufold.maximum, i32, view(np.float32, (nr, 5), (1, nr)), view(np.float32, (mr, 5), (5, 1)),
          transform=as_transform_(abs), check=False)
rows_into(cufold.plus, i32, view(np.float32, (nr, 40), (40, 1)), view(np.float32, (mr, 40), (40, 1)), det=True,
          transform=sq)
rows_into(cufold.plus, i32, view(np.float32, (nr, 1), (1, 1)), view(np.float64, (mr, 1), (1, 1)), transform=sq)
for vals in (view(np.float32, (nr, 64), (64, 1)), view(np.float32, (nr, 1), (1, 1)), view(np.int32, (nr, 7), (1, nr))):
    ROWS._plan_segments((P.signature(vals), P.signature(offsets), 0, cufold.plus, None, None, False, sq), vals,
                        offsets)
SEG._plan_runs((i32,), (view(np.float32, (n, 16), (16, 1)),), cufold.maximum, None, 5000, 0, None,
               as_transform_(abs))


def tuple_fused(op, vals, outs, alg, transform=None, det=False, check=True, keys=i32):
    if transform is None:
        lift = BT._lift_of(op, len(vals), len(outs))
        in_vt, out_vt = BT._check_fields(op, lift, vals, outs, keys.size)
    else:
        lift = "none"
        in_vt, out_vt = BT._check_transformed(op, transform, vals, outs)
    BT._plan_program(op, lift, in_vt, out_vt, keys, vals, outs, alg, det, check, 0, transform)
    print("  ok   tuple %-8s %-9s %s -> %s (%s)" % (alg, op.name, in_vt, out_vt, getattr(transform, "name", None)))


pair = as_transform_(lambda t: (t[0] * t[1], t[0]))
for alg in ("adaptive", "warp", "atomic", "sorted", "grouped", None):
    tuple_fused(cufold.plus, (f64, f32), (o64, o64), alg, pair, check=alg != "atomic")
tuple_fused(cufold.argmax, (f32, count32), (o32, oi32), "cas", as_transform_(lambda t: (abs(t[0]), t[1])))
tuple_fused(cufold.argmax, (f64, count), (o64, oi64), None, as_transform_(lambda t: (abs(t[0]), t[1])))
tuple_fused(cufold.plus, (f64,), (o64, o64), "sorted", as_transform_(lambda v: (v, v * v)), det=True)
tuple_fused(cufold.plus, (f64, _arrays.Generated("constant", n, 1, np.int64)), (o64, oi64), None)
tuple_fused(cufold.minimum, (count,), (oi64,), "grouped")
for k in list(compiled)[before:]:
    if isinstance(k[0], tuple) and str(k[0][0]).startswith("binned"):
        print("  ok   %s %s" % (k[0][0], str(k[0][1])[:160]))
print("%d gpu_to_gpu-fused / rows / tuple-transform kernels compiled; all in %.1f s" % (len(compiled) - before,
                                                                                      time.time() - t0))

# out=(None, h) (a scan's fields not wanted; values.OutputType): the store of the products
# compiled out of every kernel that writes a result: the 1-D algorithms (a total too), segments,
# lanes, tiles (one tile a row, look-backs in pair and wide states), columns (no chunks; chunks: only the
# downsweep writes it), the gather of a 4-D permutation (into new arrays, then scanned into out),
# a 3-field result storing its middle field, and a transform.
before = len(compiled)
H_ONLY = [  # (shape, strides, axis, kind, reverse, transform)
    ((1 << 26,), (1,), None, "inclusive", False, None),                # 1-D single pass, pair states
    ((4096, 2048), (2048, 1), 1, "inclusive", False, None),            # tiles, one a row
    ((4096, 2048), (2048, 1), 1, "exclusive", True, None),
    ((16, 1 << 20), (1 << 20, 1), 1, "exclusive", False, None),        # tiles, look-backs (pair states)
    ((16, 1 << 20), (1 << 20, 1), 1, "inclusive", True, double_b),     # (a float64 h: wide states)
    ((1 << 16, 20), (20, 1), 1, "exclusive", False, None),             # segments
    ((1 << 16, 20), (64, 2), 1, "inclusive", True, None),              # lanes (rows apart)
    ((2048, 64), (64, 1), 0, "inclusive", False, None),                # columns, chunks and a spine
    ((64, 1 << 20), (1 << 20, 1), 0, "exclusive", False, None),        # columns, no chunks
    ((8, 9, 10, 11), (990, 1, 99, 9), 2, "inclusive", False, None),    # gather 4-D, then scanned
]
for shape, strides, ax, kind, rev, tf in H_ONLY:
    xs = (view(np.float32, shape, strides), view(np.float32, shape, strides))
    h = view(np.float32 if tf is None else np.float64,            # double_b's ab[1] * 2: float64
             shape if ax is not None else (int(np.prod(shape)),),
             tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape))) if ax is not None else (1,))
    S._plan_scan(xs, (h,), True, affine, None if kind == "inclusive" else (1.0, 0.0), None, None, ax is None, kind,
                 False, 0, None, ax, rev, tf, stored=(False, True))
for alg in S.ALGORITHMS:
    S._plan_scan((f32, f32), (f32,), True, affine, None, None, alg, True, "inclusive", False, 0, None,
                 stored=(False, True))
triple = cufold.Op(lambda p, q: (p[0] + q[0], p[1] * q[1], max(p[2], q[2])), name="triple")
S._plan_scan((i32, f32, i32), (f32,), True, triple, None, None, "single_pass", False, "inclusive", False, 0, None,
             stored=(False, True, False))
for key in sorted({_scan_key(k[0]) for k in list(compiled)[before:]}):
    print("  ok   %s" % key[:150])
print("%d scan kernels of fields not stored compiled; all in %.1f s" % (len(compiled) - before, time.time() - t0))
