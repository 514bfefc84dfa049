"""Tests of cufold.block: every algorithm of reduce, all_reduce, inclusive_scan
and exclusive_scan against plain NumPy / Python references.

Kernels run one or a few blocks; outputs are poisoned before launch and every
element is checked. In the simulator the blocks stay small; on a GPU the same
tests add the sizes of real use (1000 and 1024 threads).
"""

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import cuda

from conftest import SIMULATOR

import cufold
from cufold import _codegen, block
from cufold.ops import Op
from cufold.values import ValueType

# uint8 sums wrap around on purpose; the simulator's NumPy scalars say so.
# On a GPU, Numba warns that one-block grids under-use it: that is the point here.
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Grid size")]

REDUCE_ALGS = block.ALGORITHMS["reduce"]
SCAN_ALGS = block.ALGORITHMS["scan"]

# Block shapes: an int, or (x, y, z). Small in the simulator (one Python thread
# per CUDA thread); the sizes of real use on a GPU.
SHAPES = [1, 7, 32, 33, 50, 64, 96, (8, 5), (4, 3, 2)]
if not SIMULATOR:
    SHAPES += [256, 1000, 1024, (32, 32), (10, 10, 10)]
# A few mid-sized shapes for the per-dtype tests (rotated through).
ROTATION = [33, (8, 5), 64, 96, 7, (4, 3, 2)] if SIMULATOR else [1024, 1000, (8, 5, 7), 96, 257, 33]
BIG = 256 if SIMULATOR else 1024


def _nthreads(shape):
    return int(np.prod(shape)) if isinstance(shape, tuple) else shape


def _dim3(shape):
    return shape if isinstance(shape, tuple) else (shape,)


# --- operators and value cases -------------------------------------------------------

def _affine(a, b):
    # x -> a0*x + a1, then b: (a, b) = (a0*b0, a1*b0 + b1). Associative, not
    # commutative, no identity given.
    return (a[0] * b[0], a[1] * b[0] + b[1])


def _matmul(a, b):
    # 2x2 integer matrices (row-major 4-tuples).
    return (a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3],
            a[2] * b[0] + a[3] * b[2], a[2] * b[1] + a[3] * b[3])


def _triple(a, b):
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


AFFINE = Op(_affine, name="affine")
MATMUL = Op(_matmul, identity=(1, 0, 0, 1), name="matmul")
TRIPLE = Op(_triple, identity=(0, 0, 0), commutative=True, name="triple")

# The dihedral group of the square as signed permutation matrices: not
# commutative, and its products stay small.
_D4 = np.array([(1, 0, 0, 1), (0, 1, 1, 0), (1, 0, 0, -1), (0, -1, 1, 0),
                (-1, 0, 0, -1), (0, 1, -1, 0), (-1, 0, 0, 1), (0, -1, -1, 0)], np.int64)


class Case:
    """An operator on a value type, a random input generator and a host
    reference operator on Python values."""

    def __init__(self, name, op, dtype, gen, ref, rtol=0.0, initial=None):
        self.name, self.op, self.vt = name, op, ValueType.of(dtype)
        self.gen, self.ref, self.rtol, self.initial = gen, ref, rtol, initial

    def __repr__(self):
        return self.name


def _scalar(dtype, draw):
    return lambda rng, n: draw(rng, n).astype(dtype)


def _argmax_gen(rng, n):
    # Few distinct values, so ties (lowest index wins) happen.
    return (rng.integers(0, 6, n).astype(np.float32), np.arange(n, dtype=np.int64))


CASES = {
    "int32": Case("int32", cufold.plus, np.int32,
                  _scalar(np.int32, lambda r, n: r.integers(-1000, 1000, n)), lambda a, b: a + b),
    "float64": Case("float64", cufold.plus, np.float64,
                    _scalar(np.float64, lambda r, n: r.normal(size=n)), lambda a, b: a + b,
                    rtol=1e-9),
    # uint8 sums wrap around, as in NumPy.
    "uint8": Case("uint8", cufold.plus, np.uint8,
                  _scalar(np.uint8, lambda r, n: r.integers(0, 256, n)),
                  lambda a, b: (a + b) & 255),
    # float16 sums of small integers are exact below 2048; a tolerance all the same.
    "float16": Case("float16", cufold.plus, np.float16,
                    _scalar(np.float16, lambda r, n: r.integers(0, 4, n)), lambda a, b: a + b,
                    rtol=1e-3),
    "argmax": Case("argmax", cufold.ops.argmax, (np.float32, np.int64), _argmax_gen,
                   lambda a, b: cufold.ops.argmax(a, b)),
    "triple": Case("triple", TRIPLE, (np.int32, np.float64, np.int16),
                   lambda r, n: (r.integers(-50, 50, n).astype(np.int32), r.normal(size=n),
                                 r.integers(-9, 9, n).astype(np.int16)),
                   _triple, rtol=1e-9),
    "affine": Case("affine", AFFINE, (np.int64, np.int64),
                   lambda r, n: (r.choice(np.array([-1, 1], np.int64), n), r.integers(-3, 4, n)),
                   _affine, initial=(-1, 5)),
    "matmul": Case("matmul", MATMUL, (np.int64,) * 4,
                   lambda r, n: tuple(_D4[r.integers(0, 8, n)].T.copy()), _matmul),
}


# --- host-side helpers -------------------------------------------------------------------

def _fields(vt, arrays):
    return arrays if vt.is_tuple else (arrays,)


def _pack(vt, fields):
    return tuple(fields) if vt.is_tuple else fields[0]


def _values(vt, arrays):
    """Python values (scalars, or tuples) of the elements of ``arrays``."""
    cols = [a.tolist() for a in _fields(vt, arrays)]
    return list(zip(*cols)) if vt.is_tuple else cols[0]


def _poison(vt, n):
    return _pack(vt, [np.full(n, 99 if f.kind in "iub" else np.nan, f) for f in vt.fields])


def _to_device(vt, arrays):
    return _pack(vt, [cuda.to_device(a) for a in _fields(vt, arrays)])


def _to_host(vt, arrays):
    return _pack(vt, [a.copy_to_host() for a in _fields(vt, arrays)])


def _check(case, got, expected, where):
    """``got``: arrays of the value type; ``expected``: a list of Python values
    (None: not checked)."""
    keep = [i for i, e in enumerate(expected) if e is not None]
    for k, (f, col) in enumerate(zip(case.vt.fields, _fields(case.vt, got))):
        want = np.array([(expected[i][k] if case.vt.is_tuple else expected[i]) for i in keep],
                        dtype=np.float64 if f.kind == "f" else object)
        have = col[keep]
        assert not (f.kind == "f" and np.isnan(have.astype(np.float64)).any()), \
            "%s: unwritten output (field %d)" % (where, k)
        if f.kind == "f":
            np.testing.assert_allclose(have.astype(np.float64), want, rtol=case.rtol,
                                       atol=case.rtol, err_msg=where)
        else:
            np.testing.assert_array_equal(have.astype(object), want, err_msg=where)


def _fold(ref, seq):
    return functools.reduce(ref, seq)


def _scan_ref(ref, seq, inclusive, initial=None):
    if inclusive:
        return list(itertools.accumulate(seq, ref))
    out, run = [], initial
    for v in seq:
        out.append(run)
        run = ref(run, v)
    return out


# --- device-side helpers -------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _slice(vt):
    """Device function ``(arrays, lo, hi) -> views`` (a tuple per field);
    inlined, as Numba returns no new array view from a device function."""
    body = vt._pack(["%s[lo:hi]" % vt._field("a", i) for i in range(vt.arity)])
    fn = _codegen.build("def view(a, lo, hi):\n    return %s\n" % body, "view", device=False)
    return cuda.jit(device=True, inline="always")(fn)


def _jit(block_threads):
    """``cuda.jit`` for a kernel of blocks of ``block_threads`` threads: on a
    GPU with ``launch_bounds``, so that big blocks of wide values (4-tuples,
    1000 threads) get few enough registers per thread to launch."""
    return cuda.jit if SIMULATOR else cuda.jit(launch_bounds=block_threads)


@cuda.jit(device=True)
def _tid():
    return (cuda.threadIdx.x + cuda.threadIdx.y * cuda.blockDim.x
            + cuda.threadIdx.z * cuda.blockDim.x * cuda.blockDim.y)


@cuda.jit(device=True)
def _block_size():
    return cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z


@functools.lru_cache(maxsize=None)
def _reduce_kernel(f, vt, ipt, partial):
    """Each block reduces its threads' items; every thread writes its result."""
    load, store, view = vt.load, vt.store, _slice(vt)
    if ipt == 1 and not partial:
        @_jit(f.block_threads)
        def kernel(xs, outs, valid):
            g = cuda.blockIdx.x * _block_size() + _tid()
            store(outs, g, f(load(xs, g)))
    elif ipt == 1:
        @_jit(f.block_threads)
        def kernel(xs, outs, valid):
            g = cuda.blockIdx.x * _block_size() + _tid()
            store(outs, g, f(load(xs, g), valid[cuda.blockIdx.x]))
    elif not partial:
        @_jit(f.block_threads)
        def kernel(xs, outs, valid):
            g = cuda.blockIdx.x * _block_size() + _tid()
            store(outs, g, f(view(xs, g * ipt, g * ipt + ipt)))
    else:
        @_jit(f.block_threads)
        def kernel(xs, outs, valid):
            g = cuda.blockIdx.x * _block_size() + _tid()
            store(outs, g, f(view(xs, g * ipt, g * ipt + ipt), valid[cuda.blockIdx.x]))
    return kernel


@functools.lru_cache(maxsize=None)
def _scan_kernel(f, vt, ipt, aggregate):
    """Each block scans its items; scans go to ``outs``, totals to ``totals``
    (one per thread)."""
    load, store, view = vt.load, vt.store, _slice(vt)
    if ipt == 1 and aggregate:
        @_jit(f.block_threads)
        def kernel(xs, outs, totals):
            g = cuda.blockIdx.x * _block_size() + _tid()
            s, t = f(load(xs, g))
            store(outs, g, s)
            store(totals, g, t)
    elif ipt == 1:
        @_jit(f.block_threads)
        def kernel(xs, outs, totals):
            g = cuda.blockIdx.x * _block_size() + _tid()
            store(outs, g, f(load(xs, g)))
    elif aggregate:
        @_jit(f.block_threads)
        def kernel(xs, outs, totals):
            g = cuda.blockIdx.x * _block_size() + _tid()
            store(totals, g, f(view(xs, g * ipt, g * ipt + ipt),
                               view(outs, g * ipt, g * ipt + ipt)))
    else:
        @_jit(f.block_threads)
        def kernel(xs, outs, totals):
            g = cuda.blockIdx.x * _block_size() + _tid()
            f(view(xs, g * ipt, g * ipt + ipt), view(outs, g * ipt, g * ipt + ipt))
    return kernel


def _launch(kernel, blocks, shape, *args):
    kernel[blocks, _dim3(shape)](*args)
    cuda.synchronize()


# --- reductions ----------------------------------------------------------------------

def _run_reduce(case, kind, shape, algorithm, ipt, rng, valid=None, blocks=1):
    """Run a reduce/all_reduce on ``blocks`` blocks and check the results
    (``valid``: a list of valid_items per block, for partial=True)."""
    n = _nthreads(shape)
    f = getattr(block, kind)(case.op, case.vt, shape, items_per_thread=ipt, algorithm=algorithm,
                             partial=valid is not None)
    xs = case.gen(rng, blocks * n * ipt)
    outs = _poison(case.vt, blocks * n)
    valid_arr = np.array(valid if valid is not None else [n * ipt] * blocks, np.int64)
    d_outs = _to_device(case.vt, outs)
    _launch(_reduce_kernel(f, case.vt, ipt, valid is not None), blocks, shape,
            _to_device(case.vt, xs), d_outs, cuda.to_device(valid_arr))
    got = _to_host(case.vt, d_outs)
    items = _values(case.vt, xs)
    expected = []
    for b in range(blocks):
        total = _fold(case.ref, items[b * n * ipt: b * n * ipt + valid_arr[b]])
        expected += [total] + [total if kind == "all_reduce" else None] * (n - 1)
    _check(case, got, expected, "%s %s %s ipt=%d valid=%s" % (kind, algorithm, shape, ipt, valid))


@pytest.mark.parametrize("kind", ["reduce", "all_reduce"])
@pytest.mark.parametrize("algorithm", REDUCE_ALGS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reduce_shapes_noncommutative(shape, algorithm, kind, rng):
    """Every block shape, an operator with neither commutativity nor identity."""
    _run_reduce(CASES["affine"], kind, shape, algorithm, 1, rng)


@pytest.mark.parametrize("kind", ["reduce", "all_reduce"])
@pytest.mark.parametrize("algorithm", REDUCE_ALGS)
@pytest.mark.parametrize("case", ["int32", "float64", "uint8", "float16", "argmax", "triple",
                                  "matmul"])
def test_reduce_types(case, algorithm, kind, rng):
    k = list(CASES).index(case)
    shape = ROTATION[(k + REDUCE_ALGS.index(algorithm)) % len(ROTATION)]
    _run_reduce(CASES[case], kind, shape, algorithm, 3 if k % 2 else 1, rng)


@pytest.mark.parametrize("kind", ["reduce", "all_reduce"])
@pytest.mark.parametrize("algorithm", REDUCE_ALGS)
@pytest.mark.parametrize("ipt", [1, 3])
def test_reduce_items_noncommutative(ipt, algorithm, kind, rng):
    _run_reduce(CASES["matmul"], kind, (8, 5), algorithm, ipt, rng)
    _run_reduce(CASES["affine"], kind, 33, algorithm, ipt, rng)


@pytest.mark.parametrize("kind", ["reduce", "all_reduce"])
@pytest.mark.parametrize("algorithm", REDUCE_ALGS)
@pytest.mark.parametrize("ipt", [1, 3])
def test_reduce_partial(ipt, algorithm, kind, rng):
    """valid_items cuts the block anywhere: a single item, inside a thread's
    items, inside a warp, at a warp boundary (everything: the other tests)."""
    n = 50 if SIMULATOR else 1000
    total = n * ipt
    valid = [1, 31 * ipt + 1, 32 * ipt, total - 1] + ([] if SIMULATOR else [2, total])
    _run_reduce(CASES["affine"], kind, n, algorithm, ipt, rng, valid=valid, blocks=len(valid))
    _run_reduce(CASES["argmax"], kind, (4, 3, 2) if SIMULATOR else (10, 10, 10), algorithm, ipt,
                rng, valid=[5], blocks=1)


@pytest.mark.parametrize("algorithm", REDUCE_ALGS)
def test_reduce_big_block(algorithm, rng):
    _run_reduce(CASES["int32"], "all_reduce", BIG, algorithm, 1, rng)


@pytest.mark.parametrize("kind", ["reduce", "all_reduce"])
def test_reduce_several_blocks(kind, rng):
    _run_reduce(CASES["float64"], kind, 40, "warp", 2, rng, blocks=3)


# --- scans --------------------------------------------------------------------------

def _run_scan(case, kind, shape, algorithm, ipt, rng, aggregate=False, initial=None, blocks=1):
    n = _nthreads(shape)
    extra = {"initial": initial} if kind == "exclusive_scan" and initial is not None else {}
    f = getattr(block, kind)(case.op, case.vt, shape, items_per_thread=ipt, algorithm=algorithm,
                             aggregate=aggregate, **extra)
    xs = case.gen(rng, blocks * n * ipt)
    outs = _poison(case.vt, blocks * n * ipt)
    totals = _poison(case.vt, blocks * n)
    d_outs, d_totals = _to_device(case.vt, outs), _to_device(case.vt, totals)
    _launch(_scan_kernel(f, case.vt, ipt, aggregate), blocks, shape,
            _to_device(case.vt, xs), d_outs, d_totals)
    items = _values(case.vt, xs)
    if initial is None and kind == "exclusive_scan":
        initial = case.op.identity_for(case.vt)
        initial = tuple(v.item() for v in initial) if case.vt.is_tuple else initial.item()
    expected, expected_totals = [], []
    for b in range(blocks):
        seq = items[b * n * ipt:(b + 1) * n * ipt]
        expected += _scan_ref(case.ref, seq, kind == "inclusive_scan", initial)
        expected_totals += [_fold(case.ref, seq)] * n
    where = "%s %s %s ipt=%d" % (kind, algorithm, shape, ipt)
    _check(case, _to_host(case.vt, d_outs), expected, where)
    if aggregate:
        _check(case, _to_host(case.vt, d_totals), expected_totals, where + " aggregate")


@pytest.mark.parametrize("kind", ["inclusive_scan", "exclusive_scan"])
@pytest.mark.parametrize("algorithm", SCAN_ALGS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_scan_shapes_noncommutative(shape, algorithm, kind, rng):
    """Every block shape, 2x2 matrix products (exclusive: from the identity)."""
    _run_scan(CASES["matmul"], kind, shape, algorithm, 1, rng, aggregate=kind == "inclusive_scan")


@pytest.mark.parametrize("kind", ["inclusive_scan", "exclusive_scan"])
@pytest.mark.parametrize("algorithm", SCAN_ALGS)
@pytest.mark.parametrize("case", ["int32", "float64", "uint8", "float16", "argmax", "triple"])
def test_scan_types(case, algorithm, kind, rng):
    k = list(CASES).index(case)
    shape = ROTATION[(k + SCAN_ALGS.index(algorithm)) % len(ROTATION)]
    _run_scan(CASES[case], kind, shape, algorithm, 3 if k % 2 else 1, rng, aggregate=k % 3 == 0)


@pytest.mark.parametrize("kind", ["inclusive_scan", "exclusive_scan"])
@pytest.mark.parametrize("algorithm", SCAN_ALGS)
@pytest.mark.parametrize("ipt", [1, 3])
def test_scan_no_identity(ipt, algorithm, kind, rng):
    """Affine maps: no identity, not commutative; exclusive from initial=(-1, 5)."""
    case = CASES["affine"]
    for shape in [(8, 5), 33]:
        _run_scan(case, kind, shape, algorithm, ipt, rng, aggregate=True, initial=case.initial)


@pytest.mark.parametrize("algorithm", SCAN_ALGS)
def test_scan_items_and_initial(algorithm, rng):
    _run_scan(CASES["matmul"], "exclusive_scan", 50, algorithm, 3, rng, aggregate=True,
              initial=(0, 1, 1, 0))
    _run_scan(CASES["int32"], "exclusive_scan", 7, algorithm, 2, rng, initial=10)


@pytest.mark.parametrize("algorithm", SCAN_ALGS)
def test_scan_big_block(algorithm, rng):
    _run_scan(CASES["int32"], "inclusive_scan", BIG, algorithm, 1, rng, aggregate=True)
    _run_scan(CASES["int32"], "exclusive_scan", 64, algorithm, 1, rng, blocks=3)


# --- the running-prefix callback: a whole array, tile by tile, in one block ------------------

@cuda.jit(device=True)
def _running_sum(aggregate, state):
    # Every lane of the first warp keeps its own copy (a local array).
    before = state[0]
    state[0] = before + aggregate
    return before


_affine_device = cuda.jit(device=True)(_affine)


@cuda.jit(device=True)
def _running_affine(aggregate, state):
    before = (state[0], state[1])
    after = _affine_device(before, aggregate)
    state[0] = after[0]
    state[1] = after[1]
    return before


@functools.lru_cache(maxsize=None)
def _tile_loop_kernel(f, vt, ipt):
    """One block walks the array tile by tile; ``f`` is a block scan with the
    running-prefix callback, whose state is a per-thread local array of two
    int64 (initialised from ``state_init``)."""
    load, store = vt.load, vt.store

    if ipt == 1:
        @_jit(f.block_threads)
        def kernel(xs, outs, size, state_init):
            n = _block_size()
            t = _tid()
            state = cuda.local.array(2, np.int64)
            state[0] = state_init[0]
            state[1] = state_init[1]
            for base in range(0, size, n):
                i = base + t
                s = f(load(xs, i if i < size else size - 1), state)   # the last tile padded
                if i < size:
                    store(outs, i, s)
        return kernel

    # A thread's items in local memory (inlined: Numba returns no array that a
    # device function did not receive).
    if vt.is_tuple:
        def local_items():
            return cuda.local.array(ipt, np.int64), cuda.local.array(ipt, np.int64)
    else:
        def local_items():
            return cuda.local.array(ipt, np.int64)
    local_items = cuda.jit(device=True, inline="always")(local_items)

    @_jit(f.block_threads)
    def kernel(xs, outs, size, state_init):
        n = _block_size()
        t = _tid()
        state = cuda.local.array(2, np.int64)
        state[0] = state_init[0]
        state[1] = state_init[1]
        mine = local_items()        # scanned in place
        for base in range(0, size, n * ipt):
            for k in range(ipt):
                i = base + t * ipt + k
                store(mine, k, load(xs, i if i < size else size - 1))
            f(mine, mine, state)
            for k in range(ipt):
                i = base + t * ipt + k
                if i < size:
                    store(outs, i, load(mine, k))
    return kernel


@pytest.mark.parametrize("kind", ["inclusive_scan", "exclusive_scan"])
@pytest.mark.parametrize("algorithm", SCAN_ALGS)
@pytest.mark.parametrize("ipt", [1, 3])
def test_prefix_callback_tile_loop(ipt, algorithm, kind, rng):
    """A kernel scanning a longer array in one block, tile after tile, carrying
    the running total through the callback, gets the whole array's scan."""
    shape = 36 if SIMULATOR else 1000
    n = _nthreads(shape)
    size = (2 if SIMULATOR else 9) * n * ipt + 7     # then a partial last tile
    # Sums.
    f = getattr(block, kind)(cufold.plus, np.int64, shape, items_per_thread=ipt,
                             algorithm=algorithm, prefix=_running_sum)
    x = rng.integers(-1000, 1000, size)
    out = np.full(size, -99, np.int64)
    d_out = cuda.to_device(out)
    _launch(_tile_loop_kernel(f, ValueType.of(np.int64), ipt), 1, shape, cuda.to_device(x),
            d_out, size, cuda.to_device(np.array([5, 0], np.int64)))
    want = np.cumsum(x) + 5
    if kind == "exclusive_scan":
        want = want - x
    np.testing.assert_array_equal(d_out.copy_to_host(), want)
    # Affine maps: not commutative, no identity (exclusive takes the prefix instead).
    case = CASES["affine"]
    f = getattr(block, kind)(AFFINE, (np.int64, np.int64), shape, items_per_thread=ipt,
                             algorithm=algorithm, prefix=_running_affine)
    xs = case.gen(rng, size)
    outs = _poison(case.vt, size)
    d_outs = _to_device(case.vt, outs)
    start = (-1, 2)
    _launch(_tile_loop_kernel(f, case.vt, ipt), 1, shape, _to_device(case.vt, xs), d_outs, size,
            cuda.to_device(np.array(start, np.int64)))
    seq = _values(case.vt, xs)
    if kind == "inclusive_scan":
        want = [_affine(start, v) for v in _scan_ref(_affine, seq, True)]
    else:
        want = _scan_ref(_affine, seq, False, start)
    _check(case, _to_host(case.vt, d_outs), want, "tile loop %s %s" % (kind, algorithm))


def test_prefix_callback_aggregate(rng):
    """With aggregate=True the total is the tile's own (without the prefix)."""
    shape = 33
    f = block.inclusive_scan(cufold.plus, np.int64, shape, aggregate=True, prefix=_running_sum,
                             algorithm="raking")

    @cuda.jit
    def kernel(x, out, totals):
        t = cuda.threadIdx.x
        state = cuda.local.array(2, np.int64)
        state[0] = 100
        s, tot = f(x[t], state)
        out[t] = s
        totals[t] = tot

    x = rng.integers(0, 10, shape)
    out, totals = np.full(shape, -1, np.int64), np.full(shape, -1, np.int64)
    d_out, d_totals = cuda.to_device(out), cuda.to_device(totals)
    _launch(kernel, 1, shape, cuda.to_device(x), d_out, d_totals)
    np.testing.assert_array_equal(d_out.copy_to_host(), 100 + np.cumsum(x))
    np.testing.assert_array_equal(d_totals.copy_to_host(), np.full(shape, x.sum()))


# --- caller-supplied storage -----------------------------------------------------------------

@pytest.mark.parametrize("reduce_alg,scan_alg", list(zip(REDUCE_ALGS, SCAN_ALGS)))
def test_storage_shared_by_two_primitives(reduce_alg, scan_alg, rng):
    """One temp_storage buffer serves an all_reduce, then (after a barrier) an
    exclusive scan, twice in a loop."""
    shape = (8, 6) if SIMULATOR else (32, 20)
    n = _nthreads(shape)
    red = block.all_reduce(MATMUL, (np.int64,) * 4, shape, algorithm=reduce_alg, storage=True)
    scan = block.exclusive_scan(MATMUL, (np.int64,) * 4, shape, algorithm=scan_alg,
                                storage=True)
    assert red.temp_items > 0 and scan.temp_items > 0
    shared = block.temp_storage((np.int64,) * 4, max(red.temp_items, scan.temp_items))
    vt = ValueType.of((np.int64,) * 4)
    load, store = vt.load, vt.store

    @_jit(n)
    def kernel(xs, totals, scans):
        t = _tid()
        temp = shared()
        for rep in range(2):
            g = rep * n + t
            total = red(load(xs, g), temp)
            cuda.syncthreads()
            s = scan(load(xs, g), temp)
            cuda.syncthreads()
            store(totals, g, total)
            store(scans, g, s)

    case = CASES["matmul"]
    xs = case.gen(rng, 2 * n)
    d_totals, d_scans = _to_device(vt, _poison(vt, 2 * n)), _to_device(vt, _poison(vt, 2 * n))
    _launch(kernel, 1, shape, _to_device(vt, xs), d_totals, d_scans)
    seq = _values(vt, xs)
    want_totals, want_scans = [], []
    for rep in range(2):
        part = seq[rep * n:(rep + 1) * n]
        want_totals += [_fold(_matmul, part)] * n
        want_scans += _scan_ref(_matmul, part, False, (1, 0, 0, 1))
    _check(case, _to_host(vt, d_totals), want_totals, "shared storage: all_reduce")
    _check(case, _to_host(vt, d_scans), want_scans, "shared storage: exclusive_scan")


@pytest.mark.parametrize("algorithm", REDUCE_ALGS)
def test_private_storage_called_repeatedly(algorithm, rng):
    """A primitive's own storage survives back-to-back calls (in a loop, with
    no barrier between them)."""
    shape = 70 if SIMULATOR else 700
    red = block.reduce(cufold.plus, np.int64, shape, algorithm=algorithm)

    @cuda.jit
    def kernel(x, out, reps):
        t = cuda.threadIdx.x
        acc = 0
        for r in range(reps):
            acc += red(x[r * shape + t] * (r + 1))
        out[t] = acc

    reps = 4
    x = rng.integers(-100, 100, reps * shape)
    out = cuda.to_device(np.full(shape, -1, np.int64))
    _launch(kernel, 1, shape, cuda.to_device(x), out, reps)
    want = sum((r + 1) * x[r * shape:(r + 1) * shape].sum() for r in range(reps))
    assert out.copy_to_host()[0] == want


def test_temp_items_and_storage_argument():
    for alg in REDUCE_ALGS:
        f = block.reduce(cufold.plus, np.float32, 96, algorithm=alg)
        assert isinstance(f.temp_items, int) and f.temp_items >= 3
        # A single warp needs no shared memory for the warp algorithms.
        assert block.all_reduce(cufold.plus, np.float32, 32, algorithm=alg).temp_items == \
            (0 if alg != "tree" else 32)
    assert block.inclusive_scan(cufold.plus, np.int8, 20).temp_items == 0
    assert block.inclusive_scan(cufold.plus, np.int8, 64, algorithm="kogge_stone").temp_items == 128
    assert block.reduce(cufold.plus, np.int8, 64, algorithm="warp").temp_items == 2
    # Cached factories; a list shape is the same primitive as the tuple.
    assert block.reduce(cufold.plus, np.int32, (4, 8)) is block.reduce(cufold.plus, "int32", [4, 8])
    s1, s2 = block.temp_storage(np.int32, 10), block.temp_storage(np.int32, 10)
    assert s1 is not s2 and s1.temp_items == 10


# --- errors at creation ---------------------------------------------------------------------

@pytest.mark.parametrize("factory", [block.reduce, block.all_reduce, block.inclusive_scan,
                                     block.exclusive_scan])
def test_errors(factory):
    for bad in [0, 1025, (32, 33), (0, 4), (2, 2, 2, 2), True, 2.0, "64", -3]:
        with pytest.raises(ValueError, match="^cufold: .*block_threads|^cufold: a block has"):
            factory(cufold.plus, np.int32, bad)
    for bad in [0, -1, 1.5]:
        with pytest.raises(ValueError, match="^cufold: items_per_thread"):
            factory(cufold.plus, np.int32, 64, items_per_thread=bad)
    wrong = "kogge_stone" if factory in (block.reduce, block.all_reduce) else "tree"
    with pytest.raises(ValueError, match="^cufold: unknown block .* valid names are 'warp'"):
        factory(cufold.plus, np.int32, 64, algorithm=wrong)
    with pytest.raises(TypeError, match="^cufold: "):
        factory(cufold.plus, "no such dtype", 64)


def test_exclusive_scan_errors():
    with pytest.raises(ValueError, match="^cufold: operator affine has no identity; pass initial"):
        block.exclusive_scan(AFFINE, (np.int64, np.int64), 64)
    with pytest.raises(ValueError, match="^cufold: exclusive_scan takes initial= or prefix="):
        block.exclusive_scan(cufold.plus, np.int32, 64, initial=0, prefix=_running_sum)
    with pytest.raises(TypeError, match="^cufold: prefix must be a device function"):
        block.inclusive_scan(cufold.plus, np.int32, 64, prefix=3)
    with pytest.raises(ValueError, match="^cufold: temp_storage"):
        block.temp_storage(np.int32, -1)
    # Allowed: no identity with a prefix callback.
    block.exclusive_scan(AFFINE, (np.int64, np.int64), 64, prefix=_running_affine)


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.integers(-5, 2000),
                 st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 3))))
def test_block_threads_validation(shape):
    n = _nthreads(shape)
    if 1 <= n <= 1024 and min(_dim3(shape)) >= 1:
        assert block.reduce(cufold.plus, np.int32, shape).block_threads == n
    else:
        with pytest.raises(ValueError, match="^cufold: "):
            block.reduce(cufold.plus, np.int32, shape)


@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 70), algorithm=st.sampled_from(REDUCE_ALGS), seed=st.integers(0, 99))
def test_reduce_any_size_property(n, algorithm, seed):
    """Any block size: the affine reduction in order, with a cut anywhere."""
    rng = np.random.default_rng(seed)
    _run_reduce(CASES["affine"], "all_reduce", n, algorithm, 1, rng,
                valid=[int(rng.integers(1, n + 1))])


def test_algorithms_table():
    assert block.ALGORITHMS == {"reduce": ("warp", "raking", "tree"),
                                "scan": ("warp", "kogge_stone", "raking")}
    for name in ["reduce", "all_reduce", "inclusive_scan", "exclusive_scan", "temp_storage"]:
        doc = getattr(block, name).__doc__
        assert "Example" in doc
    assert "valid on" in block.reduce.__doc__ and "valid on" in block.inclusive_scan.__doc__
