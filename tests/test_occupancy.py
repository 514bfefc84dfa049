"""Grids sized by the kernel's occupancy: a grid-stride reduce and a split axis reduction
launch at most one round of the blocks an SM holds at once (``Kernel.resident_blocks``,
the driver's occupancy calculator on a GPU). The simulator knows no occupancy, so here the
calculator and the SM count are replaced, and the results must not change."""

import numpy as np
import pytest

import cufold
from cufold.device import axis as axis_mod
from cufold.host import launch as _launch
from conftest import SIMULATOR, gpu_only, to_device, to_host


@pytest.fixture
def few_slots(monkeypatch):
    """``set(sms, blocks_per_sm)``: what the launch path reports from now on; the launches'
    grids are recorded in the returned list."""
    grids = []
    real_launch = cufold.host.programs.Builder.launch

    def record(self, fn, key, grid, block, args, shared=0):
        grids.append((key[0], grid, key))
        return real_launch(self, fn, key, grid, block, args, shared)

    monkeypatch.setattr(cufold.host.programs.Builder, "launch", record)

    def set_slots(sms, blocks):
        monkeypatch.setattr(_launch, "sm_count", lambda device_id: sms)
        monkeypatch.setattr(_launch.Kernel, "resident_blocks", lambda self, block, shared=0, device_id=None: blocks)
    return set_slots, grids


@pytest.mark.skipif(not SIMULATOR, reason="replaces the occupancy the simulator does not have")
@pytest.mark.parametrize("slots", [(1, 1), (2, 1), (1, 3)])
def test_reduce_grid_is_one_round(rng, few_slots, slots):
    set_slots, grids = few_slots
    set_slots(*slots)
    # a length of its own per case: a cached Program (planned under other slots) would not plan again
    x = rng.standard_normal(2000 + 7 * sum(slots) + slots[0]).astype(np.float32)
    d = to_device(x)
    for alg in ("single_pass", "two_pass"):
        del grids[:]
        got = to_host(cufold.sum(d, algorithm=alg))
        np.testing.assert_allclose(got, x.astype(np.float64).sum(), rtol=1e-4, atol=1e-4)
        first = next(g for k, g, _ in grids if k == "reduce")
        assert first <= slots[0] * slots[1], (alg, grids)
    m, v = to_host(cufold.mean_var(d))
    np.testing.assert_allclose([m, v], [x.astype(np.float64).mean(), x.astype(np.float64).var()], rtol=1e-4,
                               atol=1e-5)
    assert to_host(cufold.argmax(d)) == np.argmax(x)


@pytest.mark.skipif(not SIMULATOR, reason="replaces the occupancy the simulator does not have")
@pytest.mark.parametrize("slots", [(1, 1), (1, 2), (3, 1)])
def test_split_axis_reduction_is_one_round(rng, few_slots, slots):
    """Columns (axis 0 of a wide array) and rows (axis 1 of a few long rows), both split
    across blocks at the simulator's limits, split again to fit the slots."""
    set_slots, grids = few_slots
    set_slots(*slots)
    x = rng.standard_normal((300 + 7 * sum(slots) + slots[0], 40)).astype(np.float32)   # (as above)
    d = to_device(x)
    few_long_rows = rng.standard_normal((3, 600 + sum(slots))).astype(np.float32)
    for axis, kind, h in ((0, "axis_columns", x), (1, "axis_rows", few_long_rows)):
        dd = to_device(h)
        for name, ref in (("sum", lambda a: a.astype(np.float64).sum(axis=axis)),
                          ("max", lambda a: a.max(axis=axis)), ("argmax", lambda a: a.argmax(axis=axis))):
            del grids[:]
            got = to_host(getattr(cufold, name)(dd, axis=axis))
            np.testing.assert_allclose(got, ref(h), rtol=1e-4, atol=1e-4, err_msg=name)
            launched = [(g, key) for k, g, key in grids if k == kind]
            assert launched, (name, grids)
            grid, key = launched[0]
            # (keys end: rows split, unroll, walk, pairs; columns split, per, unroll)
            split = key[-4] if kind == "axis_rows" else key[-3]
            # split only as far as one round holds (more tiles than slots: no split at all)
            assert grid <= slots[0] * slots[1] or not split, (name, grids)
    assert to_host(cufold.sum(d)) == pytest.approx(x.astype(np.float64).sum(), rel=1e-4, abs=1e-3)


def test_one_round_schedules():
    """The re-split itself (host arithmetic): x.sum(axis=0) of (8192, 8192) planned for 8
    blocks an SM (256 tiles x 5 splits) on 132 SMs that hold 4 becomes 2 splits, 512 blocks;
    a schedule that fits, or an unknown occupancy, is kept."""
    lim = axis_mod.Limits(256, 4096, 16, 1024, 132 * 8, 132 * 4)
    lay = axis_mod.plan_layout((8192, 8192), (8192, 1), (0,), True, False)
    s = axis_mod.schedule(lay, lim)
    assert (s.kernel, s.split, s.grid) == ("columns", 5, 1280)
    t = axis_mod.one_round(s, 8192, 8192, 4 * 132)
    assert (t.split, t.grid, t.chunk) == (2, 512, 4096)
    assert axis_mod.one_round(s, 8192, 8192, 10 * 132) == s         # 1320 slots hold 1280 blocks
    assert axis_mod.one_round(s, 8192, 8192, None) == s


@gpu_only
def test_resident_blocks_on_the_gpu():
    """The occupancy calculator answers for a compiled reduce kernel, within what an SM
    holds, and the reduce's grid is at most one round of it."""
    x = to_device(np.ones(1 << 24, np.float32))
    assert to_host(cufold.sum(x)) == 1 << 24
    found = [k for k in list(_launch._kernels.values()) if "'reduce'" in k.key]
    assert found
    for k in found:
        blocks = k.resident_blocks(128)
        assert blocks is not None and 1 <= blocks <= 16, (k, blocks)
