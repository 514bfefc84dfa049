"""The scenarios of ``tests/test_distributed.py``, run in every rank's own process.

``python tests/distributed_cases.py RANK WORLD STORE RESULTS [CASE ...]`` joins a process
group (gloo on CPU tensors under Numba's simulator, NCCL on ``cuda:RANK`` on a GPU), runs the
cases and writes ``{case: "ok" or the failure}`` as JSON to RESULTS. Every rank draws the
same global data from one seed and takes its own shard, so each rank checks the whole answer
against NumPy (float64) on the concatenated data.
"""

import datetime
import json
import os
import sys
import time
import traceback

import numpy as np

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


class Ctx:
    def __init__(self, rank, world, device):
        self.rank, self.world, self.device = rank, world, device

    def rng(self, name):
        import zlib
        return np.random.default_rng(zlib.crc32(name.encode()) + int(os.environ.get("CUFOLD_TEST_SEED", "0")))

    def t(self, a):
        """A tensor of its own (never sharing the test's NumPy data) on this rank's device."""
        import torch
        return torch.tensor(np.array(a)).to(self.device)

    def h(self, t):
        if isinstance(t, tuple):
            return tuple(self.h(f) for f in t)
        return t.detach().cpu().numpy()

    def shard_lengths(self, total):
        """Uneven shards: rank r gets about (r + 1) parts; with 3+ ranks rank 1 gets none."""
        w = self.world
        weights = np.array([0 if (w >= 3 and r == 1) else r + 1 for r in range(w)], float)
        cuts = np.floor(np.cumsum(weights) / weights.sum() * total).astype(int)
        return np.diff(np.concatenate([[0], cuts]))

    def shard(self, whole, lengths=None):
        lengths = self.shard_lengths(len(whole)) if lengths is None else lengths
        start = int(np.sum(lengths[:self.rank]))
        return whole[start: start + lengths[self.rank]]


def close(got, want, rtol=1e-5, atol=1e-6):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


def affine_host(p, q):
    return (p[0] * q[0], p[1] * q[0] + q[1])


AFFINE = None


def affine_op():
    global AFFINE
    if AFFINE is None:
        import cufold

        def affine(p, q):
            return (p[0] * q[0], p[1] * q[0] + q[1])
        AFFINE = cufold.Op(affine, identity=(1.0, 0.0))     # not commutative: folds in rank order
    return AFFINE


def raises_everywhere(fn, exc, match):
    try:
        fn()
    except exc as e:
        assert match in str(e), "%s: %s" % (type(e).__name__, e)
        return
    raise AssertionError("no %s raised (expected %r)" % (exc.__name__, match))


# --- all_reduce ---------------------------------------------------------------------------------

def case_all_reduce_native(c):
    import cufold
    import cufold.distributed as cd
    rng = c.rng("native")
    per_rank = rng.standard_normal((c.world, 37)).astype(np.float32)
    ints = rng.integers(-50, 50, (c.world, 37)).astype(np.int32)
    x, i = c.t(per_rank[c.rank]), c.t(ints[c.rank])
    assert cd.all_reduce(x) is x
    close(c.h(x), per_rank.astype(np.float64).sum(0), rtol=1e-5)
    cd.all_reduce(i, cufold.maximum, algorithm="nccl")
    assert (c.h(i) == ints.max(0)).all()
    p = c.t(per_rank[c.rank].reshape(37, 1))
    out = c.t(np.full((37, 1), np.nan, np.float32))
    cd.all_reduce(p, cufold.multiplies, out=out)
    close(c.h(out)[:, 0], per_rank.astype(np.float64).prod(0), rtol=1e-4)
    close(c.h(p)[:, 0], per_rank[c.rank])                     # out= leaves x as it was


def case_all_reduce_nan_max(c):
    import cufold
    import cufold.distributed as cd
    rng = c.rng("nanmax")
    per_rank = rng.standard_normal((c.world, 40)).astype(np.float32)
    per_rank[c.world - 1, 3] = np.nan
    for alg in ("gather", "scatter", "p2p", None):
        x = c.t(per_rank[c.rank])
        cd.all_reduce(x, cufold.maximum, algorithm=alg)
        close(c.h(x), np.maximum.reduce(per_rank.astype(np.float64), axis=0))
        assert np.isnan(c.h(x)[3])


def case_all_reduce_affine_rank_order(c):
    import cufold.distributed as cd
    rng = c.rng("affine")
    for n in (1, 7 * c.world, 7 * c.world + 1):
        a = rng.uniform(0.5, 1.5, (c.world, n))
        b = rng.standard_normal((c.world, n))
        want = (a[0], b[0])
        for r in range(1, c.world):
            want = affine_host(want, (a[r], b[r]))
        for alg, pack_max in (("gather", cd.PACK_MAX_BYTES), ("gather", 0), ("scatter", cd.PACK_MAX_BYTES),
                              ("p2p", cd.PACK_MAX_BYTES)):
            saved, cd.PACK_MAX_BYTES = cd.PACK_MAX_BYTES, pack_max      # 0: field by field, as large tuples
            try:
                x = (c.t(a[c.rank]), c.t(b[c.rank]))
                cd.all_reduce(x, affine_op(), algorithm=alg)
            finally:
                cd.PACK_MAX_BYTES = saved
            close(c.h(x[0]), want[0], rtol=1e-12)
            close(c.h(x[1]), want[1], rtol=1e-12)


def case_all_reduce_welford(c):
    import cufold
    import cufold.distributed as cd
    rng = c.rng("welford")
    data = [rng.standard_normal((int(rng.integers(1, 9)), 50)) * 3 + 1e4 for _ in range(c.world)]
    mine = data[c.rank]
    whole = np.concatenate(data)
    for alg, pack_max in ((None, 0), ("sums", 0), ("gather", 0), ("gather", cd.PACK_MAX_BYTES), ("scatter", 0),
                          ("p2p", 0)):
        state = (c.t(np.full(50, mine.shape[0], np.float64)), c.t(mine.mean(0)),
                 c.t(((mine - mine.mean(0)) ** 2).sum(0)))
        saved, cd.PACK_MAX_BYTES = cd.PACK_MAX_BYTES, pack_max     # 0: gathered field by field
        try:
            cd.all_reduce(state, cufold.welford, algorithm=alg)
        finally:
            cd.PACK_MAX_BYTES = saved
        close(c.h(state[0]), np.full(50, len(whole)))
        close(c.h(state[1]), whole.mean(0), rtol=1e-12)
        close(c.h(state[2]) / len(whole), whole.var(0), rtol=1e-9)
    many = rng.standard_normal((c.world, 3, 300)) + 50     # the merge kernels' full tiles, then a part
    many[:, 0] = np.floor(np.abs(many[:, 0]))                 # counts, some zero
    state = tuple(c.t(f) for f in many[c.rank])
    cd.all_reduce(state, cufold.welford, algorithm="sums")
    cnt, mean, m2 = many[:, 0], many[:, 1], many[:, 2]
    total = cnt.sum(0)
    mu = np.where(total > 0, (cnt * mean).sum(0) / np.where(total > 0, total, 1), 0)
    close(c.h(state[0]), total)
    close(c.h(state[1]), mu, rtol=1e-12)
    close(c.h(state[2]), (m2 + cnt * (mean - mu) ** 2).sum(0), rtol=1e-10)
    state = tuple(c.t(f.reshape(3, 100)) for f in many[c.rank])     # 2-D states, the default path
    cd.all_reduce(state, cufold.welford)
    close(c.h(state[0]).ravel(), total)
    close(c.h(state[1]).ravel(), mu, rtol=1e-12)
    close(c.h(state[2]).ravel(), (m2 + cnt * (mean - mu) ** 2).sum(0), rtol=1e-10)
    empty = tuple(c.t(np.zeros(4)) for _ in range(3))          # no items anywhere: stays the identity
    cd.all_reduce(empty, cufold.welford, algorithm="sums")
    assert all((c.h(f) == 0).all() for f in empty)
    raises_everywhere(lambda: cd.all_reduce((c.t(np.ones(3)),) * 2, cufold.plus, algorithm="sums"), ValueError,
                      "merges Welford states")


def case_all_reduce_p2p(c):
    """The one-shot fold over mapped staging: rank order, the slots in turn with new data
    each call, staging that grows (and whose old slots are freed), ``out=``, tuples."""
    import cufold
    import cufold.distributed as cd
    from cufold.host import peers
    rng = c.rng("p2p")
    slot_max, push_max = cd.P2P_SLOT_MAX_BYTES, cd.P2P_PUSH_MAX_BYTES
    peers.release()
    saved, peers.MIN_BYTES = peers.MIN_BYTES, 64          # small slots, so that the test grows them
    try:
        for n in (5, 3, 40, 200, 33, 129):                   # grows at 40 and 200 (float64 pairs)
            if n == 129:                                       # from here a slot at most 48 pairs
                cd.P2P_SLOT_MAX_BYTES = 1024
            # small operands go by one push-and-meet kernel; 40 and 129 as large ones do
            cd.P2P_PUSH_MAX_BYTES = 0 if n in (40, 129) else push_max
            a = rng.uniform(0.5, 1.5, (c.world, n))
            b = rng.standard_normal((c.world, n))
            want = (a[0], b[0])
            for r in range(1, c.world):
                want = affine_host(want, (a[r], b[r]))
            x = (c.t(a[c.rank]), c.t(b[c.rank]))
            out = (c.t(np.full(n, np.nan)), c.t(np.full(n, np.nan)))
            cd.all_reduce(x, affine_op(), algorithm="p2p", out=out)
            close(c.h(out[0]), want[0], rtol=1e-12)
            close(c.h(out[1]), want[1], rtol=1e-12)
            close(c.h(x[0]), a[c.rank])                         # out= leaves x as it was
            v = rng.integers(-9, 9, (c.world, n)).astype(np.int16)
            y = c.t(v[c.rank])
            cd.all_reduce(y, cufold.maximum, algorithm="p2p")
            assert (c.h(y) == v.max(0)).all()
        if c.world > 1:
            st = peers.staging(None, x[0].device, 0)
            want = 1 << int(np.ceil(np.log2(200 * 16 * (c.world - 1))))     # 200 pairs from each other rank
            assert st is not None and st.capacity == want, (st and st.capacity, want)
    finally:
        peers.release()
        peers.MIN_BYTES, cd.P2P_SLOT_MAX_BYTES, cd.P2P_PUSH_MAX_BYTES = saved, slot_max, push_max


def case_p2p_barrier_gives_up(c):
    """A rank that never comes to a p2p call: the others' barrier gives up (after
    ``peers.BARRIER_POLLS`` polls, a minute by default), and the next ``check=True`` call raises
    the same error on every rank."""
    import cufold
    import cufold.distributed as cd
    from cufold.host import peers
    if c.world < 2:
        return
    saved = peers.BARRIER_POLLS
    peers.release()
    x = c.t(np.arange(8, dtype=np.float32))
    cd.all_reduce(x, cufold.maximum, algorithm="p2p")          # every rank maps the staging
    peers.BARRIER_POLLS = 1000
    try:
        if c.rank == 0:                                         # rank 1 never makes this call
            cd.all_reduce(c.t(np.ones(8, np.float32)), cufold.maximum, algorithm="p2p", check=False)
        raises_everywhere(lambda: cd.all_reduce(c.t(np.ones(4, np.float32))), RuntimeError, "gave up")
    finally:
        peers.BARRIER_POLLS = saved
        peers.release()
    y = c.t(np.full(5, c.rank, np.float32))                    # afresh: a new staging works
    cd.all_reduce(y, cufold.maximum, algorithm="p2p")
    close(c.h(y), np.full(5, c.world - 1))


def case_p2p_streams_and_capture(c):
    """On GPUs: p2p calls that alternate between two streams, left unsynchronised until the
    end, are all right (a call on another stream waits for the previous one); inside CUDA-graph
    capture an explicit "p2p" raises before any collective (its slots take turns per call)."""
    if SIM or c.world < 2:
        return
    import torch
    import cufold
    import cufold.distributed as cd
    v = c.rng("p2p streams").standard_normal((6, c.world, 5000)).astype(np.float32)
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]
    results = []
    for k in range(6):
        with torch.cuda.stream(streams[k % 2]):
            x = c.t(v[k, c.rank])
            cd.all_reduce(x, cufold.maximum, algorithm="p2p", check=False)
            results.append(x)
    torch.cuda.synchronize()
    for k, x in enumerate(results):
        close(c.h(x), v[k].max(0))
    g, x = torch.cuda.CUDAGraph(), c.t(v[0, c.rank])
    torch.cuda.synchronize()
    try:
        with torch.cuda.graph(g):
            cd.all_reduce(x, cufold.maximum, algorithm="p2p", check=False)
    except ValueError as e:
        assert "CUDA graph" in str(e), e
    else:
        raise AssertionError("no ValueError for p2p inside capture")
    torch.cuda.synchronize()


def case_all_reduce_argmax_ties(c):
    import cufold
    import cufold.distributed as cd
    v = np.zeros((c.world, 30), np.float32)
    v[:, 5] = 2.0                                   # a tie over every rank: rank 0's index wins
    idx = np.arange(c.world * 30).reshape(c.world, 30)
    pair = (c.t(v[c.rank]), c.t(idx[c.rank]))
    cd.all_reduce(pair, cufold.argmax)
    assert (c.h(pair[1]) == idx[0]).all()


def case_all_reduce_user_op(c):
    import cufold
    import cufold.distributed as cd
    rng = c.rng("user")
    op = cufold.Op(lambda p, q: (p[0] + q[0], p[1] * q[1]), commutative=True)
    s = rng.integers(0, 9, (c.world, 25)).astype(np.int64)
    m = rng.uniform(0.9, 1.1, (c.world, 25))
    x = (c.t(s[c.rank]), c.t(m[c.rank]))
    cd.all_reduce(x, op)
    assert (c.h(x[0]) == s.sum(0)).all()
    close(c.h(x[1]), m.prod(0), rtol=1e-12)


# --- reduce over shards ---------------------------------------------------------------------------

def case_reduce_shortcuts(c):
    import cufold.distributed as cd
    rng = c.rng("shortcuts")
    whole = rng.standard_normal((23, 6)).astype(np.float32)
    whole[rng.integers(0, 23), rng.integers(0, 6)] = 9.0          # one clear maximum
    x = c.t(c.shard(whole))
    w64 = whole.astype(np.float64)
    for axis in (None, 0, (0, 1), -2):
        close(c.h(cd.sum(x, axis=axis)), w64.sum(axis=axis), rtol=1e-5, atol=1e-5)
        close(c.h(cd.max(x, axis=axis)), w64.max(axis=axis))
        close(c.h(cd.min(x, axis=axis, keepdims=True)), w64.min(axis=axis, keepdims=True))
        close(c.h(cd.mean(x, axis=axis)), w64.mean(axis=axis), rtol=1e-5)
        m, v = cd.mean_var(x, axis=axis, ddof=1)
        close(c.h(m), w64.mean(axis=axis), rtol=1e-5)
        close(c.h(v), w64.var(axis=axis, ddof=1), rtol=1e-4)
    close(c.h(cd.prod(c.t(c.shard(np.full(11, 1.5))), axis=0)), 1.5 ** 11, rtol=1e-12)
    assert int(c.h(cd.argmax(x))) == int(np.argmax(whole))
    assert (c.h(cd.argmax(x, axis=0)) == np.argmax(whole, axis=0)).all()
    assert (c.h(cd.argmin(x, axis=0, keepdims=True)) == np.argmin(whole, axis=0)[None]).all()
    mine = c.shard(whole)                              # along axis 1: this rank's rows only
    assert (c.h(cd.argmax(x, axis=1)) == np.argmax(mine, axis=1)).all()
    close(c.h(cd.sum(x, axis=1)), mine.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


def case_reduce_int_and_nan(c):
    import cufold.distributed as cd
    rng = c.rng("ints")
    whole = rng.integers(-1000, 1000, 41).astype(np.int32)
    x = c.t(c.shard(whole))
    assert int(c.h(cd.sum(x))) == int(whole.astype(np.int64).sum())
    assert c.h(cd.sum(x)).dtype == np.int64                          # NumPy's rule: int32 sums as int64
    close(c.h(cd.mean(x)), whole.mean(), rtol=1e-12)
    f = rng.standard_normal(41)
    f[[7, 30]] = np.nan
    y = c.t(c.shard(f))
    assert int(c.h(cd.argmax(y))) == int(np.argmax(f)) == 7
    assert np.isnan(c.h(cd.max(y)))


def case_reduce_rank_order(c):
    import cufold.distributed as cd
    rng = c.rng("fold")
    a, b = rng.uniform(0.5, 1.5, 29), rng.standard_normal(29)
    want = (a[0], b[0])
    for i in range(1, 29):
        want = affine_host(want, (a[i], b[i]))
    got = cd.reduce((c.t(c.shard(a)), c.t(c.shard(b))), affine_op(), check=False)
    close(c.h(got[0]), want[0], rtol=1e-12)
    close(c.h(got[1]), want[1], rtol=1e-12)
    # global indices past uneven shards (an empty one at 3 ranks), ties to the first, NaN first
    m = rng.integers(0, 4, (13, 3)).astype(np.float32)
    m[9, 1] = np.nan
    x = c.t(c.shard(m))
    assert int(c.h(cd.argmax(x, check=False))) == int(np.argmax(m))
    assert (c.h(cd.argmax(x, axis=0)) == np.argmax(m, axis=0)).all()
    assert (c.h(cd.argmin(x, axis=0, check=False)) == np.argmin(m, axis=0)).all()


def case_sum_gpu_to_gpu(c):
    import cufold
    import cufold.distributed as cd
    rng = c.rng("repro")
    whole = (rng.standard_normal(301) * np.exp(rng.uniform(-20, 20, 301))).astype(np.float32)
    one = cufold.sum(c.t(whole) if not SIM else _sim(whole), deterministic="gpu_to_gpu")
    one = np.asarray(one.cpu().numpy() if hasattr(one, "cpu") else one.copy_to_host())
    got = c.h(cd.sum(c.t(c.shard(whole)), deterministic="gpu_to_gpu"))
    assert got.tobytes() == one.tobytes(), (got, one)        # the same bits, any number of ranks
    other = c.h(cd.sum(c.t(c.shard(whole, np.full(c.world, 301 // c.world) + np.eye(c.world, dtype=int)[0]
                                   * (301 % c.world))), deterministic="gpu_to_gpu"))
    assert other.tobytes() == one.tobytes()                   # and any sharding
    close(c.h(cd.mean(c.t(c.shard(whole)), deterministic="gpu_to_gpu")), whole.astype(np.float64).mean(),
          rtol=1e-5)


def _sim(a):
    from numba import cuda
    return cuda.to_device(a)


# --- reduce_by_key_into ---------------------------------------------------------------------------

def _pairs(c, name, n_total, m, features=None):
    rng = c.rng(name)
    keys = rng.integers(0, m, n_total)
    vals = rng.standard_normal((n_total,) + ((features,) if features else ())).astype(np.float32)
    return keys, vals


def case_by_key_replicated(c):
    import cufold
    import cufold.distributed as cd
    m = 17
    keys, vals = _pairs(c, "bykey", 90, m)
    lengths = c.shard_lengths(90)
    k, v = c.t(c.shard(keys, lengths)), c.t(c.shard(vals, lengths))
    init = np.linspace(-1, 1, m).astype(np.float32)
    for check in (True, False):
        out = c.t(init)
        cd.reduce_by_key_into(k, v, out, check=check)
        want = init.astype(np.float64)
        np.add.at(want, keys, vals)
        close(c.h(out), want, rtol=1e-5, atol=1e-5)
    out = c.t(np.full(m, -np.inf, np.float32))
    cd.reduce_by_key_into(k, v, out, cufold.maximum)
    want = np.full(m, -np.inf)
    np.maximum.at(want, keys, vals)
    close(c.h(out), want)
    rows_keys, rows = _pairs(c, "rows", 60, m, features=5)
    rl = c.shard_lengths(60)
    out = c.t(np.zeros((m, 5), np.float32))
    cd.reduce_by_key_into(c.t(c.shard(rows_keys, rl)), c.t(c.shard(rows, rl)), out)
    want = np.zeros((m, 5))
    np.add.at(want, rows_keys, rows)
    close(c.h(out), want, rtol=1e-5, atol=1e-5)


def case_by_key_tuples(c):
    import cufold
    import cufold.distributed as cd
    m = 11
    keys, vals = _pairs(c, "tuples", 80, m)
    vals[[3, 50]] = vals.max() + 1                             # a tie across shards: the first wins
    keys[[3, 50]] = 4
    lengths = c.shard_lengths(80)
    k, v = c.t(c.shard(keys, lengths)), c.t(c.shard(vals, lengths))
    for check in (True, False):
        vmax, where = c.t(np.full(m, -np.inf, np.float32)), c.t(np.full(m, -1, np.int64))
        cd.reduce_by_key_into(k, v, (vmax, where), cufold.argmax, check=check)
        for key in range(m):
            hit = np.flatnonzero(keys == key)
            if len(hit):
                assert c.h(where)[key] == hit[np.argmax(vals[hit])], (key, c.h(where)[key])
            else:
                assert c.h(where)[key] == -1
    state = tuple(c.t(np.zeros(m)) for _ in range(3))
    cd.reduce_by_key_into(k, v, state, cufold.welford)
    count, mean, m2 = c.h(state)
    for key in range(m):
        g = vals[keys == key].astype(np.float64)
        assert count[key] == len(g)
        if len(g):
            close(mean[key], g.mean(), rtol=1e-6)
            close(m2[key] / len(g), g.var(), rtol=1e-5, atol=1e-7)
    ones = c.t(np.ones(lengths[c.rank], np.int32))
    sums = (c.t(np.zeros(m, np.int64)), c.t(np.zeros(m)))
    cd.reduce_by_key_into(k, (ones, v.double()), sums)
    assert (c.h(sums[0]) == np.bincount(keys, minlength=m)).all()
    close(c.h(sums[1]), np.bincount(keys, vals.astype(np.float64), minlength=m), rtol=1e-6, atol=1e-6)


def case_by_key_sharded(c):
    import cufold
    import cufold.distributed as cd
    rows_per_rank = np.array([5 + 3 * r for r in range(c.world)])
    m = int(rows_per_rank.sum())
    start = int(rows_per_rank[:c.rank].sum())
    mine = slice(start, start + rows_per_rank[c.rank])
    keys, vals = _pairs(c, "sharded", 120, m)
    lengths = c.shard_lengths(120)
    k, v = c.t(c.shard(keys, lengths)), c.t(c.shard(vals, lengths))
    out = c.t(np.ones(rows_per_rank[c.rank], np.float32))
    cd.reduce_by_key_into(k, v, out, shard=True)
    want = np.ones(m)
    np.add.at(want, keys, vals)
    close(c.h(out), want[mine], rtol=1e-5, atol=1e-5)
    vmax = c.t(np.full(rows_per_rank[c.rank], -np.inf, np.float32))
    where = c.t(np.full(rows_per_rank[c.rank], -1, np.int64))
    cd.reduce_by_key_into(k, v, (vmax, where), cufold.argmax, shard=True)
    for key in range(mine.start, mine.stop):
        hit = np.flatnonzero(keys == key)
        assert c.h(where)[key - start] == (hit[np.argmax(vals[hit])] if len(hit) else -1)
    state = tuple(c.t(np.zeros(rows_per_rank[c.rank])) for _ in range(3))
    cd.reduce_by_key_into(k, v, state, cufold.welford, shard=True, check=False)
    assert (c.h(state[0]) == np.bincount(keys, minlength=m)[mine]).all()


# --- waits: only the documented ones ----------------------------------------------------------------

def case_waits(c):
    """check=False calls never wait for the device (on a GPU torch's sync debug mode raises on
    any synchronising op); check=True waits once, through cufold's one read-back."""
    import cufold
    import cufold.distributed as cd
    from cufold.host import readback
    import torch
    reads = [0]
    real = readback.read_to_host

    def counted(*args, **kwargs):
        reads[0] += 1
        return real(*args, **kwargs)
    readback.read_to_host = counted
    x = c.t(np.arange(700 if SIM else 70000, dtype=np.float32) % 7)     # several tiles in either
    pair = (c.t(np.ones(300)), c.t(np.ones(300)))
    state = tuple(c.t(np.ones(64)) for _ in range(3))
    keys, vals, table = c.t(np.arange(50) % 9), c.t(np.ones(50, np.float32)), c.t(np.zeros(9, np.float32))
    calls = [lambda ck: cd.all_reduce(x, check=ck), lambda ck: cd.all_reduce(x, cufold.maximum, check=ck),
             lambda ck: cd.all_reduce(pair, affine_op(), check=ck, algorithm="scatter"),
             lambda ck: cd.all_reduce(state, cufold.welford, check=ck),
             lambda ck: cd.sum(x, check=ck), lambda ck: cd.argmax(x, check=ck), lambda ck: cd.mean_var(x, check=ck),
             lambda ck: cd.reduce_by_key_into(keys, vals, table, check=ck)]
    try:
        for i, call in enumerate(calls):
            call(True)                                            # compiles, plans
            reads[0] = 0
            call(True)
            assert reads[0] == 1, "call %d: %d waits with check=True" % (i, reads[0])
            reads[0] = 0
            if not SIM:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            try:
                call(False)
            finally:
                if not SIM:
                    torch.cuda.set_sync_debug_mode("default")
            assert reads[0] == 0, "call %d: %d waits with check=False" % (i, reads[0])
    finally:
        readback.read_to_host = real


# --- errors: the same clear error on every rank, never a hang ------------------------------------

def case_errors_everywhere(c):
    import cufold
    import cufold.distributed as cd
    if c.world > 1:
        n = 10 + (c.rank == c.world - 1)
        raises_everywhere(lambda: cd.all_reduce(c.t(np.ones(n, np.float32))), ValueError, "shape (10,) against (11,)")
        dt = np.float64 if c.rank == 0 else np.float32
        raises_everywhere(lambda: cd.all_reduce(c.t(np.ones(4, dt)), cufold.maximum), ValueError,
                          "dtypes (float64) against (float32)")
        rows = np.ones((3 + c.rank, 2 + (c.rank == 1)))
        raises_everywhere(lambda: cd.sum(c.t(rows), axis=0), ValueError, "shape (n, 2) against (n, 3)")
    bad_keys = np.arange(6) + (20 if c.rank == c.world - 1 else 0)
    raises_everywhere(lambda: cd.reduce_by_key_into(c.t(bad_keys), c.t(np.ones(6, np.float32)),
                                                    c.t(np.zeros(8, np.float32))), ValueError, "outside the table")
    last = c.rank == c.world - 1                # shard=True exchanges sizes: its errors reach every rank too
    raises_everywhere(lambda: cd.reduce_by_key_into(c.t(np.arange(6)), c.t(np.ones(6 + last, np.float32)),
                                                    c.t(np.zeros(8, np.float32)), shard=True, check=False),
                      ValueError, "differ in length" if last else "failed on rank %d" % (c.world - 1))
    no_identity = cufold.Op(lambda a, b: a + b)
    empty = np.ones(0 if c.rank == 0 else 3)
    raises_everywhere(lambda: cd.reduce(c.t(empty), no_identity), ValueError,
                      "no identity" if c.rank == 0 else "failed on rank 0")
    raises_everywhere(lambda: cd.all_reduce(c.t(np.ones(3)), algorithm="ring"), ValueError, "algorithm")
    raises_everywhere(lambda: cd.all_reduce(c.t(np.ones(3)), no_identity, algorithm="nccl"), ValueError,
                      "not one the backend reduces")
    # the group still works afterwards: nothing was left half-done
    x = c.t(np.ones(5, np.float32))
    cd.all_reduce(x)
    close(c.h(x), np.full(5, c.world))


CASES = {name[5:]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}


def main(argv):
    rank, world, store, results = int(argv[0]), int(argv[1]), argv[2], argv[3]
    names = argv[4:] or list(CASES)
    import torch
    import torch.distributed as dist
    backend = "gloo" if SIM else "nccl"
    device = "cpu" if SIM else "cuda:%d" % rank
    if not SIM:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method="file://" + store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=int(os.environ.get("CUFOLD_DIST_TIMEOUT", "90"))))
    c = Ctx(rank, world, torch.device(device))
    out = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            CASES[name](c)
            out[name] = "ok"
        except Exception:
            out[name] = traceback.format_exc(limit=6)
        print("%s: %.2f s" % (name, time.perf_counter() - t0), flush=True)    # in the rank's log
        with open(results, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
