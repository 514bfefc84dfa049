"""cufold.distributed over several processes: gloo on CPUs under the simulator (2 and 3
ranks), NCCL on a GPU machine (1 rank, and 2 where there are two GPUs).

The scenarios live in ``tests/distributed_cases.py``; each world size starts its ranks once
(one process each, a file store, a timeout so that a hang fails instead of waiting) and every
scenario becomes a test here.
"""

import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

# The ranks import torch in their own processes: here only a test that needs it does (an import
# at collection cost every xdist worker 3 s).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")

from conftest import SIMULATOR  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import distributed_cases  # noqa: E402

CASES = sorted(distributed_cases.CASES)
if SIMULATOR:
    WORLDS = [2, 3]
else:
    # The GPUs this process may use: CUDA_VISIBLE_DEVICES where set (two ranks on one GPU
    # hang in NCCL), else every device node (no CUDA context made here).
    _visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    _gpus = len([d for d in _visible.split(",") if d.strip()]) if _visible is not None else \
        len(glob.glob("/dev/nvidia[0-9]*"))
    WORLDS = [1] + ([2] if _gpus >= 2 else [])
#: The whole group's run (every scenario), in seconds: past it the ranks are killed.
GROUP_TIMEOUT = 600
#: In the simulator three ranks run the scenarios that a third rank changes: folds in rank
#: order (a middle rank), chunks of the scatter fold and key ranges of the sharded table
#: that neither end owns, global indices past two shards, Welford merges of three states,
#: and an error raised on every rank. The rest run at two ranks (three ranks of every
#: scenario took 140 s of the CI's 2 cores).
THREE_RANK_CASES = ["all_reduce_affine_rank_order", "all_reduce_argmax_ties", "all_reduce_p2p", "all_reduce_welford",
                    "by_key_sharded", "errors_everywhere", "reduce_rank_order"]


def cases_for(world):
    return THREE_RANK_CASES if SIMULATOR and world == 3 else CASES


def _run_group(world, tmp):
    store = os.path.join(tmp, "store")
    env = dict(os.environ, PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "..", "src"), env.get("PYTHONPATH", "")])
    if SIMULATOR:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
        # The ranks share the CI's 2 cores with the test workers: one compute thread each
        # (spinning OpenMP threads of several processes starve one another), and gloo on the
        # loopback interface (no lookup of the host's name, which a machine without a
        # network may answer slowly or with an address it cannot reach).
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        if os.path.exists("/sys/class/net/lo"):
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs, files = [], []
    for rank in range(world):
        res = os.path.join(tmp, "rank%d.json" % rank)
        log = open(os.path.join(tmp, "rank%d.log" % rank), "w")
        procs.append((subprocess.Popen([sys.executable, os.path.join(HERE, "distributed_cases.py"), str(rank),
                                        str(world), store, res] + cases_for(world), env=env, stdout=log, stderr=subprocess.STDOUT),
                      log))
        files.append(res)
    try:
        for p, _ in procs:
            p.wait(timeout=GROUP_TIMEOUT)
    except subprocess.TimeoutExpired:
        for p, _ in procs:
            p.kill()
    results = []
    for rank, (p, log) in enumerate(procs):
        log.close()
        got = {}
        if os.path.exists(files[rank]):
            with open(files[rank]) as f:
                got = json.load(f)
        with open(log.name) as f:
            tail = f.read()[-3000:]
        results.append((got, p.returncode, tail))
    return results


@pytest.mark.parametrize("world", WORLDS)
def test_every_case_on_every_rank(world, tmp_path):
    """One group per world size runs every scenario (one process start each: under xdist a
    module fixture would start the groups again in every worker); failures are listed by case."""
    failures = []
    for rank, (got, code, tail) in enumerate(_run_group(world, str(tmp_path))):
        for case in cases_for(world):
            if case not in got:
                failures.append("rank %d never finished %s (exit %s):\n%s" % (rank, case, code, tail))
                break
            if got[case] != "ok":
                failures.append("rank %d, %s:\n%s" % (rank, case, got[case]))
        if code != 0 and not failures:
            failures.append("rank %d exited %s:\n%s" % (rank, code, tail))
    assert not failures, "%d of %d ranks' cases failed:\n%s" % (len(failures), world, "\n".join(failures))


def test_uninitialised_group_is_a_clear_error():
    import numpy as np
    torch = pytest.importorskip("torch")
    import cufold.distributed as cd
    with pytest.raises(RuntimeError, match="not initialised"):
        cd.all_reduce(torch.ones(3) if SIMULATOR else torch.ones(3, device="cuda"))
    with pytest.raises(TypeError, match="x is a host .NumPy. array"):
        cd.all_reduce(np.ones(3))
    with pytest.raises(TypeError, match="torch tensor"):
        cd.all_reduce([1.0, 2.0])
