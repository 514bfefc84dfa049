"""Tests of cufold.simulator: warp intrinsics for Numba's CUDA simulator.

The kernels below are ordinary ``@cuda.jit`` kernels compared against a NumPy
model of the hardware semantics, so the same tests run unchanged on a real GPU
(where the intrinsics are Numba's own) and prove the model matches hardware.

Where hardware leaves a result undefined (a shuffle reading a lane that has
exited, does not exist, or is not in the mask), the model still computes the
value the simulator returns (the caller's own value) but marks it "undefined";
those entries are only checked under the simulator.

Error and timeout tests are simulator-only.

Run: NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/test_simulator.py -q
"""

import time

import numpy as np
import pytest
from numba import cuda

from cufold import simulator

simulator.install()  # cufold's __init__ does this too; a no-op on a GPU

SIM = simulator.is_simulator()
sim_only = pytest.mark.skipif(not SIM, reason="simulator-only behaviour")

FULL = 0xFFFFFFFF
W = 32


# ---------------------------------------------------------------------------
# NumPy model of the hardware semantics


def shfl_model(kind, vals, b, live, masks=None):
    """Expected result of a shuffle executed by every live thread.

    vals: per-thread values (linear thread id order); b: scalar or per-thread
    lane/offset operand; live: bool per thread (exists and has not exited);
    masks: per-thread member masks (default full).

    Returns (expected, defined): ``defined`` is False where hardware leaves the
    value undefined (source lane in range but not a live member of the mask).
    """
    n = len(vals)
    b = np.broadcast_to(np.asarray(b, dtype=np.int64), (n,))
    masks = np.full(n, FULL, np.int64) if masks is None else np.asarray(masks)
    expected = np.array(vals, copy=True)
    defined = np.ones(n, bool)
    for t in range(n):
        if not live[t]:
            continue
        lane, base = t % W, t - t % W
        bval = int(b[t]) & 31  # hardware uses b[4:0]
        src = {
            "up": lane - bval,
            "down": lane + bval,
            "xor": lane ^ bval,
            "idx": bval,
        }[kind]
        if not 0 <= src < W:
            continue  # out of range: own value, defined
        s = base + src
        if s < n and live[s] and (int(masks[t]) >> src) & 1:
            expected[t] = vals[s]
        else:
            defined[t] = False  # simulator: own value; hardware: undefined
    return expected, defined


def warp_participants(live, t, mask=FULL):
    """Linear ids of the live threads of t's warp that are in mask."""
    base = t - t % W
    return [
        s
        for s in range(base, min(base + W, len(live)))
        if live[s] and (mask >> (s - base)) & 1
    ]


def bits(ids):
    r = 0
    for s in ids:
        r |= 1 << (s % W)
    return r


def check(got, expected, defined=None, what=""):
    """Compare everywhere under the simulator, only where defined on hardware."""
    got, expected = np.asarray(got), np.asarray(expected)
    if defined is None or SIM:
        np.testing.assert_array_equal(got, expected, err_msg=what)
    else:
        np.testing.assert_array_equal(got[defined], expected[defined], err_msg=what)


def run(kernel, griddim, blockdim, *host_arrays):
    """Launch with device copies of the arrays; return them copied back."""
    dev = [cuda.to_device(a) for a in host_arrays]
    kernel[griddim, blockdim](*dev)
    cuda.synchronize()
    return [d.copy_to_host() for d in dev]


# ---------------------------------------------------------------------------
# Kernels


@cuda.jit
def k_shuffles(vals, deltas, out):
    tid = cuda.threadIdx.x
    v = vals[tid]
    for i in range(deltas.size):
        d = deltas[i]
        out[0, i, tid] = cuda.shfl_up_sync(0xFFFFFFFF, v, d)
        out[1, i, tid] = cuda.shfl_down_sync(0xFFFFFFFF, v, d)
        out[2, i, tid] = cuda.shfl_xor_sync(0xFFFFFFFF, v, d)
        out[3, i, tid] = cuda.shfl_sync(0xFFFFFFFF, v, d)


@cuda.jit
def k_shfl_per_lane_src(vals, srcs, out):
    tid = cuda.threadIdx.x
    out[tid] = cuda.shfl_sync(0xFFFFFFFF, vals[tid], srcs[tid])


@cuda.jit
def k_early_return(vals, quit, down, idx0, ballot, match_all, active):
    tid = cuda.threadIdx.x
    if quit[tid]:
        return
    v = vals[tid]
    down[tid] = cuda.shfl_down_sync(0xFFFFFFFF, v, 1)
    idx0[tid] = cuda.shfl_sync(0xFFFFFFFF, v, 0)
    ballot[tid] = cuda.ballot_sync(0xFFFFFFFF, 1)
    m, p = cuda.match_all_sync(0xFFFFFFFF, tid // 32)
    match_all[tid] = m if p and cuda.all_sync(0xFFFFFFFF, 1) else 0
    cuda.syncwarp()
    active[tid] = cuda.activemask()


@cuda.jit
def k_leader(quit, counter, leaders):
    # Warp-aggregated atomic: one leader per warp adds the warp's lane count.
    tid = cuda.threadIdx.x
    if quit[tid]:
        return
    cuda.syncwarp()
    m = cuda.activemask()
    if cuda.laneid == cuda.ffs(m) - 1:
        cuda.atomic.add(counter, 0, cuda.popc(m))
        leaders[tid] = 1


@cuda.jit
def k_votes(preds, out):
    tid = cuda.threadIdx.x
    for i in range(preds.shape[0]):
        p = preds[i, tid]
        out[0, i, tid] = cuda.ballot_sync(0xFFFFFFFF, p)
        out[1, i, tid] = cuda.all_sync(0xFFFFFFFF, p)
        out[2, i, tid] = cuda.any_sync(0xFFFFFFFF, p)
        out[3, i, tid] = cuda.eq_sync(0xFFFFFFFF, p)


@cuda.jit
def k_match(keys, any_out, all_mask, all_pred):
    tid = cuda.threadIdx.x
    k = keys[tid]
    any_out[tid] = cuda.match_any_sync(0xFFFFFFFF, k)
    m, p = cuda.match_all_sync(0xFFFFFFFF, k)
    all_mask[tid] = m
    all_pred[tid] = p


@cuda.jit
def k_masks(active, lt):
    tid = cuda.threadIdx.x
    active[tid] = cuda.activemask()
    lt[tid] = cuda.lanemask_lt()


@cuda.jit
def k_syncwarp(vals, out):
    sh = cuda.shared.array(64, np.int64)
    tid = cuda.threadIdx.x
    lane = tid % 32
    base = tid - lane
    sh[tid] = vals[tid]
    cuda.syncwarp()
    # Read the neighbour's write: only correct if syncwarp orders it.
    x = sh[base + (lane + 1) % 32]
    cuda.syncwarp()
    sh[tid] = x
    # Second round with each half of the warp synchronising on its own.
    if lane < 16:
        cuda.syncwarp(0x0000FFFF)
        out[tid] = sh[base + (lane + 3) % 16]
    else:
        cuda.syncwarp(0xFFFF0000)
        out[tid] = sh[base + 16 + (lane + 3) % 16]


@cuda.jit
def k_halves(vals, down, xor, ballot, full_ballot):
    tid = cuda.threadIdx.x
    lane = tid % 32
    v = vals[tid]
    # Two disjoint groups, each with its own mask, in different branches.
    if lane < 16:
        down[tid] = cuda.shfl_down_sync(0x0000FFFF, v, 1)
        xor[tid] = cuda.shfl_xor_sync(0x0000FFFF, v, 5)
        ballot[tid] = cuda.ballot_sync(0x0000FFFF, v % 2)
    else:
        down[tid] = cuda.shfl_down_sync(0xFFFF0000, v, 1)
        xor[tid] = cuda.shfl_xor_sync(0xFFFF0000, v, 5)
        ballot[tid] = cuda.ballot_sync(0xFFFF0000, v % 2)
    # Then the whole warp again.
    full_ballot[tid] = cuda.ballot_sync(0xFFFFFFFF, v % 3 == 0)


@cuda.jit
def k_2d(vals, total, first, laneid):
    x = cuda.threadIdx.x
    y = cuda.threadIdx.y
    v = vals[y, x]
    s = v
    off = 16
    while off > 0:
        s += cuda.shfl_xor_sync(0xFFFFFFFF, s, off)
        off //= 2
    total[y, x] = s
    first[y, x] = cuda.shfl_sync(0xFFFFFFFF, v, 0)
    laneid[y, x] = cuda.laneid


@cuda.jit
def k_down_xor(vals, down, xor):
    tid = cuda.threadIdx.x
    v = vals[tid]
    down[tid] = cuda.shfl_down_sync(0xFFFFFFFF, v, 3)
    xor[tid] = cuda.shfl_xor_sync(0xFFFFFFFF, v, 9)


# ---------------------------------------------------------------------------
# Shuffles

DELTAS = np.array([0, 1, 2, 3, 7, 16, 31, 32, 33, 45, -1], dtype=np.int32)


@pytest.mark.parametrize("nthreads", [32, 64, 40, 50])
def test_shuffles_all_deltas(nthreads):
    vals = (np.arange(nthreads, dtype=np.int32) * 10 + 7)
    out = np.full((4, DELTAS.size, nthreads), -1, np.int32)
    (out,) = run(k_shuffles, 1, nthreads, vals, DELTAS, out)[2:]
    live = np.ones(nthreads, bool)
    for k, kind in enumerate(["up", "down", "xor", "idx"]):
        for i, d in enumerate(DELTAS):
            exp, defined = shfl_model(kind, vals, d, live)
            check(out[k, i], exp, defined, f"{kind} delta={d} n={nthreads}")


def test_shfl_sync_src_wraps():
    rng = np.random.default_rng(0)
    vals = np.arange(64, dtype=np.int64) * 3 - 50
    srcs = rng.integers(-70, 100, size=64).astype(np.int32)
    srcs[:6] = [0, 31, 32, 37, -1, 63]
    out = np.zeros(64, np.int64)
    out = run(k_shfl_per_lane_src, 1, 64, vals, srcs, out)[2]
    exp, defined = shfl_model("idx", vals, srcs, np.ones(64, bool))
    assert defined.all()  # the source is always a lane of a full warp
    check(out, exp)
    # Spot checks of the wrapping: src 32 -> lane 0, 37 -> 5, -1 -> 31.
    assert out[2] == vals[0] and out[3] == vals[5] and out[4] == vals[31]


def test_partial_warp_block_of_40():
    vals = np.arange(40, dtype=np.int32) + 100
    out = np.full((4, DELTAS.size, 40), -1, np.int32)
    out = run(k_shuffles, 1, 40, vals, DELTAS, out)[2]
    # Warp 1 has 8 lanes: shfl_down by 1 on lane 39 reads lane 40, which does
    # not exist -> own value (undefined on hardware).
    exp, defined = shfl_model("down", vals, 1, np.ones(40, bool))
    assert not defined[39]
    check(out[1, 1], exp, defined)
    if SIM:
        assert out[1, 1, 39] == vals[39]


def test_early_return_no_deadlock():
    n = 64
    quit = np.zeros(n, np.int32)
    quit[[0, 3, 4, 10, 31, 33, 34, 35, 36, 37, 38, 39, 40, 63]] = 1
    live = quit == 0
    vals = np.arange(n, dtype=np.int64) * 7 + 1
    sentinel = -12345
    down = np.full(n, sentinel, np.int64)
    idx0 = np.full(n, sentinel, np.int64)
    ballot = np.zeros(n, np.uint32)
    match_all = np.zeros(n, np.uint32)
    active = np.zeros(n, np.uint32)
    t0 = time.perf_counter()
    down, idx0, ballot, match_all, active = run(
        k_early_return, 1, n, vals, quit, down, idx0, ballot, match_all, active
    )[2:]
    assert time.perf_counter() - t0 < 30
    exp_down, def_down = shfl_model("down", vals, 1, live)
    exp_idx, def_idx = shfl_model("idx", vals, 0, live)
    exp_down[~live] = sentinel
    exp_idx[~live] = sentinel
    check(down, exp_down, def_down, "down")
    check(idx0, exp_idx, def_idx, "idx0")
    if SIM:
        # Sources that exited give the caller its own value.
        assert down[2] == vals[2]  # lane 3 exited
        assert idx0[1] == vals[1]  # lane 0 exited
        assert idx0[32] == vals[32]  # lane 32 is live: its own value anyway
    exp_ballot = np.zeros(n, np.uint32)
    for t in np.flatnonzero(live):
        exp_ballot[t] = bits(warp_participants(live, t))
    check(ballot, exp_ballot, what="ballot")
    check(match_all, exp_ballot, what="match_all mask: the live lanes")
    check(active, exp_ballot, what="activemask after syncwarp")


def test_activemask_leader_election():
    n = 96
    quit = ((np.arange(n) % 7 == 3) | (np.arange(n) < 2)).astype(np.int32)
    counter = np.zeros(1, np.int64)
    leaders = np.zeros(n, np.int32)
    counter, leaders = run(k_leader, 1, n, quit, counter, leaders)[1:]
    assert counter[0] == n - quit.sum()
    exp = np.zeros(n, np.int32)
    exp[[2, 32, 64]] = 1  # lowest live lane of each warp
    check(leaders, exp)


# ---------------------------------------------------------------------------
# Votes and match


def test_votes():
    n = 50
    t = np.arange(n)
    rng = np.random.default_rng(1)
    preds = np.stack(
        [
            np.zeros(n),
            np.ones(n),
            t % 3 == 0,
            t == 7,
            t >= 32,  # warp 1 (lanes 0..17) all true, warp 0 all false
            rng.integers(0, 2, n),
            np.where(t % 2 == 0, 2, -1),  # non-zero integers are true
        ]
    ).astype(np.int32)
    out = np.zeros((4, len(preds), n), np.uint32)
    out = run(k_votes, 1, n, preds, out)[1]
    live = np.ones(n, bool)
    for i, p in enumerate(preds):
        exp = np.zeros((4, n), np.uint32)
        for tt in range(n):
            ids = warp_participants(live, tt)
            pv = [bool(p[s]) for s in ids]
            exp[0, tt] = bits(s for s in ids if p[s])
            exp[1, tt] = all(pv)
            exp[2, tt] = any(pv)
            exp[3, tt] = len(set(pv)) == 1
        for k, name in enumerate(["ballot", "all", "any", "eq"]):
            check(out[k, i], exp[k], what=f"{name} pattern {i}")


def match_model(keys, n):
    live = np.ones(n, bool)
    kb = [np.asarray(k).tobytes() for k in keys]  # hardware compares bits
    any_exp = np.zeros(n, np.uint32)
    all_mask = np.zeros(n, np.uint32)
    all_pred = np.zeros(n, np.uint8)
    for t in range(n):
        ids = warp_participants(live, t)
        any_exp[t] = bits(s for s in ids if kb[s] == kb[t])
        same = all(kb[s] == kb[ids[0]] for s in ids)
        # The participating lanes (not the whole mask): 0xFF in a warp of 8.
        all_mask[t] = bits(ids) if same else 0
        all_pred[t] = same
    return any_exp, all_mask, all_pred


@pytest.mark.parametrize(
    "name",
    ["lane_div_4", "all_equal", "distinct", "int64_high_bits", "float64", "float32"],
)
def test_match(name):
    n = 40  # one full warp and a partial one
    t = np.arange(n)
    keys = {
        "lane_div_4": (t % 32 // 4).astype(np.int32),
        "all_equal": np.full(n, 9, np.int32),
        "distinct": t.astype(np.int32),
        "int64_high_bits": ((t % 2).astype(np.int64) << 40) + 5,
        "float64": np.where(t % 3 == 0, 0.25, np.where(t % 3 == 1, -0.0, 0.0)),
        "float32": (t % 5 * 0.5).astype(np.float32),
    }[name]
    any_out = np.zeros(n, np.uint32)
    all_mask = np.zeros(n, np.uint32)
    all_pred = np.zeros(n, np.uint8)
    any_out, all_mask, all_pred = run(
        k_match, 1, n, keys, any_out, all_mask, all_pred
    )[1:]
    e_any, e_mask, e_pred = match_model(keys, n)
    check(any_out, e_any, what="match_any")
    check(all_mask, e_mask, what="match_all mask")
    check(all_pred, e_pred, what="match_all pred")


# ---------------------------------------------------------------------------
# activemask, lanemask_lt, syncwarp


def test_activemask_and_lanemask_lt():
    n = 40
    active = np.zeros(n, np.uint32)
    lt = np.zeros(n, np.uint32)
    active, lt = run(k_masks, 1, n, active, lt)
    exp_active = np.where(np.arange(n) < 32, FULL, 0xFF).astype(np.uint32)
    check(active, exp_active, what="activemask")
    check(lt, [(1 << (t % 32)) - 1 for t in range(n)], what="lanemask_lt")


@cuda.jit
def k_wait_for_flag(flag, out):
    t = cuda.threadIdx.x
    if t >= 32:                                   # warp 1 polls until warp 0 has set the flag
        while cuda.atomic.add(flag, 0, 0) == 0:
            cuda.nanosleep(100)
    elif t == 0:
        cuda.atomic.exch(flag, 0, 7)
    out[t] = cuda.atomic.add(flag, 0, 0)


def test_nanosleep_in_a_polling_loop():
    """``cuda.nanosleep`` runs (on the GPU a pause hint; in the simulator a yield), and a
    warp polling with it sees another warp's flag."""
    flag, out = run(k_wait_for_flag, 1, 64, np.zeros(1, np.int32), np.zeros(64, np.int32))
    check(out[32:], np.full(32, 7, np.int32))
    assert flag[0] == 7


def test_syncwarp():
    n = 64
    vals = np.arange(n, dtype=np.int64) ** 2
    out = np.zeros(n, np.int64)
    out = run(k_syncwarp, 1, n, vals, out)[1]
    shifted = np.array([vals[t - t % 32 + (t % 32 + 1) % 32] for t in range(n)])
    exp = np.array(
        [
            shifted[t - t % 16 + (t % 16 + 3) % 16]
            for t in range(n)
        ]
    )
    check(out, exp)


def test_disjoint_submasks():
    n = 64
    vals = np.arange(n, dtype=np.int64) * 5 + 3
    down = np.zeros(n, np.int64)
    xor = np.zeros(n, np.int64)
    ballot = np.zeros(n, np.uint32)
    full_ballot = np.zeros(n, np.uint32)
    down, xor, ballot, full_ballot = run(
        k_halves, 1, n, vals, down, xor, ballot, full_ballot
    )[1:]
    live = np.ones(n, bool)
    masks = np.array([0x0000FFFF if t % 32 < 16 else 0xFFFF0000 for t in range(n)])
    exp, defined = shfl_model("down", vals, 1, live, masks)
    # Lane 15 reads lane 16, which is outside its mask.
    assert not defined[15] and not defined[47]
    check(down, exp, defined, "down")
    if SIM:
        assert down[15] == vals[15]
    exp, defined = shfl_model("xor", vals, 5, live, masks)
    assert defined.all()
    check(xor, exp, what="xor")
    exp_b = np.zeros(n, np.uint32)
    exp_fb = np.zeros(n, np.uint32)
    for t in range(n):
        ids = warp_participants(live, t, int(masks[t]))
        exp_b[t] = bits(s for s in ids if vals[s] % 2)
        exp_fb[t] = bits(s for s in warp_participants(live, t) if vals[s] % 3 == 0)
    check(ballot, exp_b, what="ballot halves")
    check(full_ballot, exp_fb, what="ballot full")


# ---------------------------------------------------------------------------
# Multi-dimensional blocks, 64-bit and float values


@pytest.mark.parametrize("shape", [(8, 8), (6, 7)])  # (x, y); 6x7 = 42 threads
def test_2d_block(shape):
    bx, by = shape
    n = bx * by
    vals = np.arange(n, dtype=np.int64).reshape(by, bx) * 3 + 1
    total = np.zeros((by, bx), np.int64)
    first = np.zeros((by, bx), np.int64)
    laneid = np.zeros((by, bx), np.int32)
    total, first, laneid = run(k_2d, 1, (bx, by), vals, total, first, laneid)[1:]
    flat = vals.ravel()  # row-major (y, x) = linear id x + bx * y
    live = np.ones(n, bool)
    exp_total = np.array([flat[warp_participants(live, t)].sum() for t in range(n)])
    exp_first = np.array([flat[t - t % 32] for t in range(n)])
    if n % 32 == 0:
        check(total.ravel(), exp_total, what="xor reduction")
    else:
        # A butterfly over a partial warp reads missing lanes: undefined on
        # hardware; in the simulator missing lanes contribute their reader's
        # value, so only the full warp is comparable everywhere.
        np.testing.assert_array_equal(total.ravel()[:32], exp_total[:32])
    check(first.ravel(), exp_first, what="broadcast from lane 0")
    check(laneid.ravel(), np.arange(n) % 32, what="laneid")


@pytest.mark.parametrize("dtype", [np.int64, np.float64, np.float32, np.int32])
def test_value_types(dtype):
    n = 64
    if dtype == np.int64:
        vals = (np.arange(n, dtype=np.int64) << 33) + (1 << 40) - 7
    else:
        vals = (np.arange(n) * 1.5 + 0.1 - 20).astype(dtype)
    down = np.zeros(n, dtype)
    xor = np.zeros(n, dtype)
    down, xor = run(k_down_xor, 1, n, vals, down, xor)[1:]
    live = np.ones(n, bool)
    check(down, shfl_model("down", vals, 3, live)[0], what="down")
    check(xor, shfl_model("xor", vals, 9, live)[0], what="xor")


# ---------------------------------------------------------------------------
# Simulator-only: object types, installation, errors and timeouts

_captured = {}


@sim_only
def test_values_returned_unchanged():
    objs = [np.float32(1.5), np.int64(7), 3, 2.5, (1, "x"), np.uint8(200)]

    @cuda.jit
    def k(out):
        tid = cuda.threadIdx.x
        for i in range(len(objs)):
            v = objs[i] if tid == 1 else None
            r = cuda.shfl_sync(0xFFFFFFFF, v, 1)
            if tid == 0:
                _captured[i] = r

    _captured.clear()
    k[1, 32](np.zeros(1))
    for i, o in enumerate(objs):
        assert _captured[i] is o


@sim_only
def test_install_idempotent():
    from numba.cuda.simulator import kernel, kernelapi

    call_before = kernel.FakeCUDAKernel.__call__
    assert simulator.install() is True
    assert simulator.install() is True
    assert kernel.FakeCUDAKernel.__call__ is call_before
    assert kernel.BlockManager.__module__ == "cufold.simulator"
    for name in [
        "shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync",
        "ballot_sync", "all_sync", "any_sync", "eq_sync", "match_any_sync",
        "match_all_sync", "activemask", "lanemask_lt", "syncwarp",
    ]:
        assert hasattr(kernelapi.FakeCUDAModule, name), name


def test_install_matches_simulator_state():
    assert simulator.install() is SIM


@sim_only
def test_mask_without_caller():
    @cuda.jit
    def k_bad_mask(out):
        if cuda.threadIdx.x == 3:
            out[0] = cuda.shfl_sync(0x1, 5, 0)

    with pytest.raises(simulator.WarpMaskError) as ei:
        k_bad_mask[1, 32](np.zeros(1))
    msg = str(ei.value)
    for part in ["k_bad_mask", "block (0, 0, 0)", "lane 3", "0x00000001"]:
        assert part in msg, msg


@sim_only
def test_deadlock_names_lanes_at_once(monkeypatch):
    monkeypatch.setenv(simulator.TIMEOUT_ENV, "30")

    @cuda.jit
    def k_stuck(out):
        tid = cuda.threadIdx.x
        if cuda.blockIdx.x == 1 and tid == 0:
            cuda.syncthreads()  # never matched: everybody else is in the shuffle
        else:
            out[cuda.blockIdx.x, tid] = cuda.shfl_down_sync(0xFFFFFFFF, tid, 1)

    t0 = time.perf_counter()
    with pytest.raises(simulator.WarpDeadlockError) as ei:
        k_stuck[2, 32](np.zeros((2, 32)))
    assert time.perf_counter() - t0 < 5  # detected, not timed out
    assert isinstance(ei.value, simulator.WarpTimeoutError)  # what deadlocks raised before
    msg = str(ei.value)
    for part in [
        "deadlock",
        "k_stuck",
        "block (1, 0, 0)",
        "lanes [" + ", ".join(map(str, range(1, 32))) + "]",
        "missing lanes [0]",
        "lane 0: blocked in cuda.syncthreads()",
        "shfl_down_sync",
    ]:
        assert part in msg, msg


@sim_only
def test_half_warp_at_shuffle_half_at_barrier_fails_within_seconds():
    @cuda.jit
    def k_split(out):
        tid = cuda.threadIdx.x
        if tid % 32 < 16:
            out[tid] = cuda.shfl_sync(0xFFFFFFFF, tid, 0)
        else:
            cuda.syncthreads()

    t0 = time.perf_counter()
    with pytest.raises(simulator.WarpDeadlockError) as ei:
        k_split[1, 64](np.zeros(64))
    assert time.perf_counter() - t0 < 5
    msg = str(ei.value)
    assert "shfl_sync(mask=0xffffffff)" in msg and "cuda.syncthreads()" in msg, msg
    assert "lane 16: blocked in cuda.syncthreads()" in msg, msg


@sim_only
def test_deadlock_found_when_the_last_running_lane_blocks():
    # Thread 0 waits at the barrier, lane 1 at a shuffle with lane 2, which loops a
    # while first (slow, not stuck: no error yet) and then goes to the barrier. Only
    # then can nothing proceed.
    @cuda.jit
    def k_late(out):
        tid = cuda.threadIdx.x
        if tid == 1:
            out[tid] = cuda.shfl_sync(0x6, tid, 2)
        else:
            if tid == 2:
                s = 0
                for i in range(20000):
                    s += i
                out[tid] = s
            cuda.syncthreads()

    with pytest.raises(simulator.WarpDeadlockError) as ei:
        k_late[1, 3](np.zeros(3))
    msg = str(ei.value)
    assert "lanes [1] wait at shfl_sync(mask=0x00000006) for missing lanes [2] " \
           "(lane 2: blocked in cuda.syncthreads())" in msg, msg
    assert "threads 0, 2 wait in cuda.syncthreads() for threads 1" in msg, msg


@sim_only
def test_slow_lane_is_waited_for(monkeypatch):
    # A lane that sleeps past the wait-report interval before a shuffle: the others
    # wait for it, warn that they do, and everyone gets the right result.
    monkeypatch.setenv(simulator.TIMEOUT_ENV, "0.2")

    @cuda.jit
    def k_sleepy(out):
        tid = cuda.threadIdx.x
        if tid == 5:
            time.sleep(0.7)
        out[tid] = cuda.shfl_down_sync(0xFFFFFFFF, tid * 3, 1)

    out = np.full(32, -1.0)
    with pytest.warns(simulator.WarpWaitWarning, match=r"for lanes \[5\] \(lane 5: running"):
        k_sleepy[1, 32](out)
    expect = np.arange(32) * 3.0
    expect[:31] = expect[1:]
    np.testing.assert_array_equal(out, expect)


@sim_only
def test_wait_warning_as_error_stops_a_livelock(monkeypatch):
    monkeypatch.setenv(simulator.TIMEOUT_ENV, "0.1")
    flag = np.zeros(1)

    @cuda.jit
    def k_spin(out, flag):
        tid = cuda.threadIdx.x
        if tid == 0:
            while flag[0] == 0:   # nobody sets it: a livelock, invisible as a deadlock
                time.sleep(0.01)
        out[tid] = cuda.shfl_sync(0xFFFFFFFF, tid, 0)

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", simulator.WarpWaitWarning)
        with pytest.raises(simulator.WarpWaitWarning, match="lane 0: running"):
            k_spin[1, 32](np.zeros(32), flag)
    flag[0] = 1  # lets the aborted block's spinning thread finish


@sim_only
def test_mismatched_collectives(monkeypatch):
    monkeypatch.setenv(simulator.TIMEOUT_ENV, "20")

    @cuda.jit
    def k_mixed(out):
        tid = cuda.threadIdx.x
        if tid == 0:
            out[tid] = cuda.shfl_down_sync(0xFFFFFFFF, tid, 1)
        else:
            out[tid] = cuda.ballot_sync(0xFFFFFFFF, 1)

    t0 = time.perf_counter()
    with pytest.raises(simulator.WarpMismatchError) as ei:
        k_mixed[1, 32](np.zeros(32))
    assert time.perf_counter() - t0 < 10  # detected, not timed out
    msg = str(ei.value)
    assert "shfl_down_sync" in msg and "ballot_sync" in msg and "k_mixed" in msg


@sim_only
def test_mismatched_masks(monkeypatch):
    monkeypatch.setenv(simulator.TIMEOUT_ENV, "20")

    @cuda.jit
    def k_masks_differ(out):
        tid = cuda.threadIdx.x
        if tid < 16:
            out[tid] = cuda.shfl_sync(0xFFFFFFFF, tid, 0)
        else:
            out[tid] = cuda.shfl_sync(0xFFFF0001, tid, 0)

    with pytest.raises(simulator.WarpMismatchError) as ei:
        k_masks_differ[1, 32](np.zeros(32))
    msg = str(ei.value)
    assert "0xffffffff" in msg and "0xffff0001" in msg


@sim_only
def test_exception_in_one_lane_propagates():
    @cuda.jit
    def k_raises(out):
        tid = cuda.threadIdx.x
        if tid == 5:
            raise ValueError("boom from lane 5")
        out[tid] = cuda.shfl_down_sync(0xFFFFFFFF, tid, 1)

    with pytest.raises(ValueError, match="boom from lane 5"):
        k_raises[1, 32](np.zeros(32))


@sim_only
def test_error_while_computing_a_group_reaches_every_lane():
    @cuda.jit
    def k_bad_pred(out):
        tid = cuda.threadIdx.x
        # An array has no single truth value: bool() raises for the group.
        out[tid] = cuda.ballot_sync(0xFFFFFFFF, np.ones(2) if tid == 7 else 1)

    with pytest.raises(ValueError, match="ballot_sync failed in kernel 'k_bad_pred'"):
        k_bad_pred[1, 32](np.zeros(32))


@sim_only
def test_bad_timeout_variable(monkeypatch):
    monkeypatch.setenv(simulator.TIMEOUT_ENV, "soon")

    @cuda.jit
    def k_sync(out):
        cuda.syncwarp()

    with pytest.raises(ValueError, match=simulator.TIMEOUT_ENV):
        k_sync[1, 32](np.zeros(1))


@sim_only
def test_threads_of_a_launch_share_one_core(monkeypatch):
    """The launch's threads run on the launching thread's core (the interpreter lock
    lets one run at a time; handoffs on one core are cheap); CUFOLD_SIM_PIN=0 leaves
    them free."""
    import os
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no thread affinity on this system")
    seen = []

    @cuda.jit
    def k_where(out):
        if cuda.threadIdx.x == 0:
            seen.append(os.sched_getaffinity(0))
        out[cuda.threadIdx.x] = cuda.shfl_down_sync(0xFFFFFFFF, cuda.threadIdx.x, 1)

    k_where[1, 32](np.zeros(32))
    if simulator._pin_cpu() is not None:
        assert len(seen[-1]) == 1
    monkeypatch.setenv(simulator.PIN_ENV, "0")
    assert simulator._pin_cpu() is None
    k_where[1, 32](np.zeros(32))
    assert seen[-1] == os.sched_getaffinity(0)
