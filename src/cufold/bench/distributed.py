"""``python -m cufold bench distributed``: cufold.distributed against NCCL through
torch.distributed, one process per GPU (issue 21's targets).

Cases (float32; every rank holds the sizes below):

``all_reduce plus``   2^28 items (1 GiB): ``torch.distributed.all_reduce`` against
                      ``cufold.distributed.all_reduce`` (``check=False``: nothing but NCCL;
                      and the default ``check=True``, one agreement exchange). Target: cufold's
                      throughput >= 0.97x torch's.
``all_reduce welford`` a Welford ``(count, mean, M2)`` tuple over 2^24 items (three float32
                      fields, 192 MiB): ``cufold.welford`` by the default algorithm (``"p2p"``
                      at two ranks of one host, else ``"sums"``) and by each algorithm
                      (single calls, and the default and NCCL also back to back; ``plus`` by
                      ``"p2p"`` on the same bytes beside NCCL's), against one NCCL
                      ``all_reduce`` (sum) of the same bytes (and, for reference, one NCCL
                      ``all_gather`` of them). Target: cufold's default <= 1.5x that time,
                      both timed over ``BACK_TO_BACK`` calls back to back (a single call's
                      time holds how far apart the ranks leave the host barrier: the same
                      rows single, within one run, spread 761-938 us on 2 x H200).
``reduce sum``        2^30 items per rank: ``cufold.distributed.sum`` (local sum, then a
                      one-item all-reduce) against ``cufold.sum`` of all ``W * 2^30`` items on
                      one GPU (rank 0 alone). Target: throughput >= 1.9x one GPU (W = 2),
                      both sides timed over ``BACK_TO_BACK`` calls back to back (a call's
                      share). Also timed: single calls, and the sum of one rank's shard on
                      one GPU (what a single distributed call adds to it is the ranks' skew
                      leaving the barrier and the one-item all-reduce's latency).
``argmax``            2^28 items per rank: ``cufold.distributed.argmax`` (global index)
                      against torch (local ``argmax``, its value, an ``all_gather`` of the
                      pairs and the first maximum picked on the GPU).

Times are CUDA-event medians on each rank after a barrier; the table shows the slowest
rank's median. Every result is checked once against torch before it is timed.
Output: ``table.txt``, ``results.json`` and ``ratios.png`` in ``--out`` (default
``bench/results/distributed-<gpu>x<W>-<date>``).

Examples::

    python -m cufold bench distributed                     # every GPU of the machine
    python -m cufold bench distributed --world 2 --quick
    python -m cufold bench distributed --dry-run
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

__all__ = ["main", "TARGETS"]

LOG2 = {"all_reduce": 28, "welford": 24, "reduce": 30, "argmax": 28}
#: The small Welford case's items (a latency case: synchronised batch norm's channels).
SMALL_LOG2 = 10
#: Calls timed back to back in the throughput rows of the reduce case (a call's share shown).
BACK_TO_BACK = 8
_B2B = ", %d calls back to back (a call)" % BACK_TO_BACK
#: (name, the row measured, the peer row, cmp, threshold, how): the ratio is peer / row
#: for "speed" (>= threshold), row / peer for "time" (<= threshold).
TARGETS = [
    ("all_reduce plus 2^28 f32: cufold vs torch.distributed", "cufold all_reduce (check=False)",
     "torch all_reduce", ">=", 0.97, "speed"),
    ("all_reduce welford 2^24: cufold / one NCCL all_reduce of the bytes", "cufold all_reduce welford" + _B2B,
     "NCCL all_reduce, same bytes" + _B2B, "<=", 1.5, "time"),
    ("reduce sum 2^30/rank: throughput vs one GPU", "cufold.distributed.sum" + _B2B,
     "cufold.sum, one GPU, whole array" + _B2B, ">=", 1.9, "speed"),
]


def _parser():
    p = argparse.ArgumentParser(prog="python -m cufold bench distributed", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=None, help="processes (one per GPU; default: every GPU)")
    p.add_argument("--out", default=None, help="results folder")
    p.add_argument("--quick", action="store_true", help="fewer repetitions, smaller sizes (2^-4)")
    p.add_argument("--reps", type=int, default=15, help="timed repetitions per row (default 15)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; no GPU needed")
    p.add_argument("--no-progress", action="store_true", help="(accepted for symmetry with other suites)")
    p.add_argument("--full", action="store_true", help="the same as the default run (one size per case)")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None, stdout=None, stderr=None):
    args = _parser().parse_args(argv)
    out, err = stdout or sys.stdout, stderr or sys.stderr
    if args.rank is not None:
        return _rank_main(args)
    if args.dry_run:
        for name, row, peer, cmp, thr, _ in TARGETS:
            out.write("  %s: %s vs %s (%s %.2f)\n" % (name, row, peer, cmp, thr))
        out.write("sizes: %s\n" % ", ".join("%s 2^%d" % kv for kv in LOG2.items()))
        out.write("estimate: 60 s on an H100/H200 (2 GPUs; process start and first calls ~40 s)\n")
        return 0
    import torch
    world = args.world or torch.cuda.device_count()
    if world < 1 or world > torch.cuda.device_count():
        err.write("cufold bench distributed: needs %s GPUs, this machine has %d\n"
                  % (world or "1+", torch.cuda.device_count()))
        return 2
    name = torch.cuda.get_device_name(0).replace("NVIDIA ", "").split()[0]
    out_dir = args.out or os.path.join("bench", "results", "distributed-%sx%d-%s" % (
        name, world, datetime.date.today().strftime("%Y%m%d")))
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="cufold-dist-")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    cmd = [sys.executable, "-m", "cufold.bench.distributed", "--store", os.path.join(tmp, "store"),
           "--out", out_dir, "--reps", str(args.reps), "--world", str(world)] + (["--quick"] if args.quick else [])
    t0 = time.time()
    procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env) for r in range(world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        err.write("cufold bench distributed: ranks exited %s\n" % codes)
        return 1
    with open(os.path.join(out_dir, "table.txt")) as f:
        out.write(f.read())
    err.write("wrote %s in %.0f s\n" % (out_dir, time.time() - t0))
    return 0


# --- one rank ---------------------------------------------------------------------------------------

def _rank_main(args):
    import numpy as np
    import torch
    import torch.distributed as dist
    rank, world = args.rank, args.world
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + args.store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    import cufold
    import cufold.distributed as cd
    shrink = 4 if args.quick else 0
    reps = 5 if args.quick else args.reps
    dev = torch.device("cuda", rank)
    rows = []

    def timed(label, fn, group_rows=True, per_call=1):
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1000.0 / per_call)
        mine = torch.tensor([float(np.median(times))], device=dev)
        every = torch.empty(world, device=dev)
        dist.all_gather_into_tensor(every, mine)
        us = float(every.max())
        if group_rows:
            rows.append({"case": current[0], "label": label, "us": us, "per_rank_us": every.tolist()})
        return us

    def check(got, want, what, rtol=1e-4):
        if not torch.allclose(got.double(), want.double(), rtol=rtol, atol=1e-6, equal_nan=True):
            raise AssertionError("cufold bench distributed: %s differs from its reference" % what)

    current = [""]
    g = torch.Generator(device=dev).manual_seed(1234 + rank)

    # all_reduce plus, 2^28 float32: both sides reduce the same buffer in place
    current[0] = "all_reduce plus 2^%d f32" % (LOG2["all_reduce"] - shrink)
    n = 1 << (LOG2["all_reduce"] - shrink)
    x = torch.rand(n, device=dev, generator=g)
    ref = x.clone()
    dist.all_reduce(ref)
    y = x.clone()
    cd.all_reduce(y)
    check(y, ref, "all_reduce plus")
    timed("torch all_reduce", lambda: dist.all_reduce(x))
    timed("cufold all_reduce (check=False)", lambda: cd.all_reduce(x, check=False))
    timed("cufold all_reduce (check=True)", lambda: cd.all_reduce(x))
    del x, y, ref

    # Welford (count, mean, M2) over 2^24: three float32 fields
    current[0] = "all_reduce welford 2^%d" % (LOG2["welford"] - shrink)
    n = 1 << (LOG2["welford"] - shrink)
    state = (torch.full((n,), 4.0, device=dev), torch.randn(n, device=dev, generator=g),
             torch.rand(n, device=dev, generator=g))
    pairs = [torch.empty(world * n, device=dev) for _ in range(3)]
    for p, f in zip(pairs, state):
        dist.all_gather_into_tensor(p, f)
    want = cufold.reduce(tuple(p.view(world, n) for p in pairs), cufold.welford, axis=0)
    for alg in ("gather", "scatter", "sums", "p2p", None):
        got = tuple(f.clone() for f in state)
        cd.all_reduce(got, cufold.welford, algorithm=alg)
        for a, b in zip(got, want):
            check(a, b, "welford %s" % alg, rtol=1e-5)
    flat = torch.rand(3 * n, device=dev, generator=g)
    summed = flat.clone()
    cd.all_reduce(summed, algorithm="p2p")
    ref = flat.clone()
    dist.all_reduce(ref)
    check(summed, ref, "all_reduce plus [p2p]")
    timed("NCCL all_reduce, same bytes", lambda: dist.all_reduce(flat))
    every_flat = torch.empty(world * 3 * n, device=dev)
    timed("NCCL all_gather, same bytes a rank", lambda: dist.all_gather_into_tensor(every_flat, flat))
    two, one = flat[: 2 * n], flat[2 * n:]         # what the 'sums' path sends, without its kernels
    timed("NCCL all_reduce 2/3 then 1/3 of the bytes", lambda: (dist.all_reduce(two), dist.all_reduce(one)))
    timed("cufold all_reduce welford", lambda: cd.all_reduce(state, cufold.welford, check=False))
    timed("NCCL all_reduce, same bytes" + _B2B, lambda: [dist.all_reduce(flat) for _ in range(BACK_TO_BACK)],
          per_call=BACK_TO_BACK)
    timed("cufold all_reduce welford" + _B2B,
          lambda: [cd.all_reduce(state, cufold.welford, check=False) for _ in range(BACK_TO_BACK)],
          per_call=BACK_TO_BACK)
    timed("cufold all_reduce plus [p2p], same bytes", lambda: cd.all_reduce(flat, algorithm="p2p", check=False))
    for alg in ("p2p", "sums", "scatter", "gather"):
        timed("cufold all_reduce welford [%s]" % alg,
              lambda alg=alg: cd.all_reduce(state, cufold.welford, algorithm=alg, check=False))
    del state, pairs, flat, want, every_flat, summed, ref

    # a small Welford merge (synchronised batch norm's channels): latency, not bandwidth
    current[0] = "all_reduce welford 2^%d (small)" % SMALL_LOG2
    small = tuple(torch.rand(1 << SMALL_LOG2, device=dev, generator=g) + 1 for _ in range(3))
    small_flat = torch.rand(3 << SMALL_LOG2, device=dev, generator=g)
    timed("NCCL all_reduce, same bytes (small)" + _B2B,
          lambda: [dist.all_reduce(small_flat) for _ in range(BACK_TO_BACK)], per_call=BACK_TO_BACK)
    for alg in ("p2p", "sums", "gather"):
        timed("cufold all_reduce welford (small) [%s]" % alg + _B2B,
              lambda alg=alg: [cd.all_reduce(small, cufold.welford, algorithm=alg, check=False)
                               for _ in range(BACK_TO_BACK)], per_call=BACK_TO_BACK)
    del small, small_flat

    # reduce: sum of 2^30 per rank against one GPU summing all W * 2^30
    current[0] = "reduce sum 2^%d per rank" % (LOG2["reduce"] - shrink)
    n = 1 << (LOG2["reduce"] - shrink)
    x = torch.rand(n, device=dev, generator=g)
    total = x.double().sum()
    dist.all_reduce(total)
    check(cd.sum(x), total, "distributed sum", rtol=1e-4)
    timed("cufold.distributed.sum", lambda: cd.sum(x, check=False))
    timed("torch.sum + all_reduce", lambda: dist.all_reduce(torch.sum(x)))
    # The single call's time holds how far apart the ranks leave the barrier and the
    # one-item all-reduce's latency; calls back to back (a call's share) hold them once.
    timed("cufold.distributed.sum" + _B2B, lambda: [cd.sum(x, check=False) for _ in range(BACK_TO_BACK)],
          per_call=BACK_TO_BACK)

    def alone(label, fn, per_call=1):           # rank 0 alone, the others idle
        for _ in range(3):
            fn()
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1000.0 / per_call)
        rows.append({"case": current[0], "label": label, "us": float(np.median(ts)),
                     "per_rank_us": [float(np.median(ts))]})

    if rank == 0:
        alone("cufold.sum, one GPU, one rank's shard", lambda: cufold.sum(x))
    del x
    torch.cuda.empty_cache()
    if rank == 0:
        whole = torch.rand(world * n, device=dev, generator=g)
        alone("cufold.sum, one GPU, whole array", lambda: cufold.sum(whole))
        alone("cufold.sum, one GPU, whole array" + _B2B, lambda: [cufold.sum(whole) for _ in range(BACK_TO_BACK)],
              per_call=BACK_TO_BACK)
        del whole
    dist.barrier()

    # argmax with global indices against a torch formulation
    current[0] = "argmax 2^%d per rank" % (LOG2["argmax"] - shrink)
    n = 1 << (LOG2["argmax"] - shrink)
    x = torch.rand(n, device=dev, generator=g)

    def torch_argmax():
        i = torch.argmax(x)
        pair = torch.stack([x[i].double(), (i + rank * n).double()])
        every = torch.empty(2 * world, dtype=torch.float64, device=dev)
        dist.all_gather_into_tensor(every, pair)
        every = every.view(world, 2)
        return every[torch.argmax(every[:, 0]), 1].long()

    ref = torch_argmax()
    got = cd.argmax(x)
    if int(got) != int(ref):
        raise AssertionError("cufold bench distributed: argmax %d, torch %d" % (int(got), int(ref)))
    timed("cufold.distributed.argmax", lambda: cd.argmax(x, check=False))
    timed("torch argmax + all_gather of pairs", torch_argmax)
    del x

    if rank == 0:
        _report(rows, world, args.out, torch.cuda.get_device_name(0))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _report(rows, world, out_dir, gpu):
    import torch
    lines = ["cufold bench distributed -- %d x %s -- %s" % (world, gpu, datetime.datetime.now().isoformat(
        timespec="seconds")),
             "versions: torch %s, nccl %s; us = the slowest rank's CUDA-event median; x = the case's first row / us"
             % (torch.__version__, ".".join(map(str, torch.cuda.nccl.version())))]
    cases = []
    for r in rows:
        if r["case"] not in cases:
            cases.append(r["case"])
    for c in cases:
        mine = [r for r in rows if r["case"] == c]
        lines += ["", "== " + c]
        for r in mine:
            lines.append("  %-45s %10.1f   %5.2f" % (r["label"], r["us"], mine[0]["us"] / r["us"]))
    verdicts = []
    by_label = {}
    for r in rows:                       # a label's first row (the case a target names comes first)
        by_label.setdefault(r["label"], r["us"])
    lines += ["", "targets (distributed, %d ranks):" % world]
    for name, row, peer, cmp, thr, how in TARGETS:
        if row not in by_label or peer not in by_label:
            lines.append("  ----  %s: not measured" % name)
            continue
        ratio = by_label[peer] / by_label[row] if how == "speed" else by_label[row] / by_label[peer]
        ok = ratio >= thr if cmp == ">=" else ratio <= thr
        verdicts.append({"name": name, "ratio": ratio, "threshold": thr, "cmp": cmp, "pass": bool(ok)})
        lines.append("  %s  %-62s %6.2f %s %.2f   %.1f us vs %.1f us" % (
            "PASS" if ok else "MISS", name, ratio, cmp, thr, by_label[row], by_label[peer]))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "table.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"world": world, "gpu": gpu, "rows": rows, "targets": verdicts}, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 3))
        names = [v["name"].split(":")[0] for v in verdicts]
        ax.barh(names, [v["ratio"] for v in verdicts], color=["tab:green" if v["pass"] else "tab:red"
                                                              for v in verdicts])
        for i, v in enumerate(verdicts):
            ax.plot([v["threshold"]] * 2, [i - 0.4, i + 0.4], "k--")
        ax.set_xlabel("ratio (dashed: target)")
        ax.set_title("cufold.distributed, %d x %s" % (world, gpu))
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "ratios.png"), dpi=110)
    except ImportError:
        pass


if __name__ == "__main__":
    sys.exit(main())
