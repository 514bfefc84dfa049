"""Feature rows on a GPU in under a minute: CUDA-event medians of ``reduce_by_key_into``
sum and max (and, shuffled, the sum with ``deterministic=True``: ``det``) and
``segmented_reduce`` sum at ``bench pyg``'s shapes (E = 4 000 000 rows of F float32
features into N = 200 000 power-law nodes, int64 destinations, sorted and shuffled:
``cufold.bench.bykey_tuple.power_law_keys``), next to what ``bench pyg`` measured before the
sub-warp spans (H100, bench/results/pyg-H100-20261125) and the read floor (the bytes of the
keys and rows at 2.97 TB/s).

    PYTHONPATH=src python tools/rows_probe.py                      # F = 1, 16, 64, 256
    PYTHONPATH=src python tools/rows_probe.py --features 16 --reps 50
    PYTHONPATH=src python tools/rows_probe.py --env CUFOLD_ROWS_PEERS=0 --env CUFOLD_ROWS_UNROLL=8
    PYTHONPATH=src python tools/rows_probe.py --src src,/tmp/old/src   # two trees, one table

``--env K=V`` (repeatable; ``--env "K=V K2=V2"``: two variables in one setting) and
``--src A,B`` rerun this probe in subprocesses, one per setting (the ``CUFOLD_ROWS_*``
knobs are read when cufold is imported) and tabulate them side by side; without them it
measures in this process. The sum accumulates into its ``out``; the maximum refills ``out``
with -inf in the call (as ``bench pyg``); F = 1 rotates over 4 copies of the inputs (smaller
than the L2 cache otherwise). Each case checks feature 0 against NumPy once (float64) before
it is timed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

E, N = 4_000_000, 200_000
COPY_TBS = 2.97           # an H100's copy bandwidth, TB/s

#: us measured by ``bench pyg`` on an H100 before the sub-warp spans (cufold.git 8a315ce)
BEFORE = {
    (1, "sorted", "sum"): 21.7, (1, "sorted", "max"): 31.5, (1, "sorted", "segsum"): 51.1,
    (1, "shuffled", "sum"): 369.3, (1, "shuffled", "max"): 70.2,
    (16, "sorted", "sum"): 1072, (16, "sorted", "max"): 417.9, (16, "sorted", "segsum"): 614.5,
    (16, "shuffled", "sum"): 1091, (16, "shuffled", "max"): 821.5,
    (64, "sorted", "sum"): 457.8, (64, "sorted", "max"): 608.4, (64, "sorted", "segsum"): 849.8,
    (64, "shuffled", "sum"): 986.7, (64, "shuffled", "max"): 1143,
    (256, "sorted", "sum"): 1902, (256, "sorted", "max"): 2583, (256, "sorted", "segsum"): 2206,
    (256, "shuffled", "sum"): 3364, (256, "shuffled", "max"): 5550,
}
#: PyG's us in the same run (the targets: sum 2x, max 3x; segmented: 2x torch.segment_reduce)
PYG = {
    (1, "sorted", "sum"): 694.2, (1, "sorted", "max"): 668.9, (1, "shuffled", "sum"): 560.0,
    (1, "shuffled", "max"): 1041, (16, "sorted", "sum"): 1749, (16, "sorted", "max"): 5294,
    (16, "shuffled", "sum"): 845.1, (16, "shuffled", "max"): 1533, (64, "sorted", "sum"): 6351,
    (64, "sorted", "max"): 25663, (64, "shuffled", "sum"): 1995, (64, "shuffled", "max"): 5362,
    (256, "sorted", "sum"): 17818, (256, "sorted", "max"): 63687, (256, "shuffled", "sum"): 6377,
    (256, "shuffled", "max"): 15386,
}


def floor_us(F):
    return (E * (8 + 4 * F)) / (COPY_TBS * 1e6)


def median_us(call, args, reps):
    """CUDA-event median of ``call(a)`` over ``reps`` calls (rotating over ``args``)."""
    from numba import cuda
    for a in args:
        call(a)
    cuda.synchronize()
    times = []
    for i in range(reps):
        start, end = cuda.event(), cuda.event()
        start.record()
        call(args[i % len(args)])
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end) * 1e3)
    return float(np.median(times))


def measure(features, reps, seed):
    """{(F, order, task): us} in this process."""
    import torch
    import cufold
    from cufold.bench.bykey_tuple import power_law_keys
    dev = torch.device("cuda")
    results = {}
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    keys_of = {order: power_law_keys(E, N, order, seed) for order in ("sorted", "shuffled")}
    for F in features:
        copies = 4 if F == 1 else 1
        x = [torch.rand((E, F), device=dev, generator=gen) * 2 - 1 for _ in range(copies)]
        x0 = x[0][:, 0].double().cpu().numpy()
        for order in ("sorted", "shuffled"):
            keys_h = keys_of[order]
            keys = [torch.from_numpy(keys_h).to(dev) for _ in range(copies)]
            ref_sum = np.bincount(keys_h, weights=x0, minlength=N)
            ref_max = np.full(N, -np.inf)
            np.maximum.at(ref_max, keys_h, x0)
            outs = [torch.zeros((N, F), device=dev) for _ in range(copies)]
            args = list(zip(keys, x, outs))

            def into_sum(a):
                cufold.reduce_by_key_into(a[0], a[1], a[2], check=False)

            def into_max(a):
                a[2].fill_(-np.inf)
                cufold.reduce_by_key_into(a[0], a[1], a[2], cufold.maximum, check=False)

            outs[0].zero_()
            into_sum(args[0])
            got = outs[0][:, 0].double().cpu().numpy()
            assert np.allclose(got, ref_sum, rtol=1e-4, atol=1e-3), "sum F=%d %s" % (F, order)
            results[(F, order, "sum")] = median_us(into_sum, args, reps)
            if order == "shuffled":
                def into_det(a):
                    cufold.reduce_by_key_into(a[0], a[1], a[2], check=False, deterministic=True)
                results[(F, order, "det")] = median_us(into_det, args, reps)
            into_max(args[0])
            assert np.array_equal(outs[0][:, 0].double().cpu().numpy(), ref_max), "max F=%d %s" % (F, order)
            results[(F, order, "max")] = median_us(into_max, args, reps)
            if order == "sorted":
                off = torch.from_numpy(np.searchsorted(keys_h, np.arange(N + 1)).astype(np.int64)).to(dev)
                box = {}

                def segsum(a):
                    box["r"] = cufold.segmented_reduce(a[1], off)
                segsum(args[0])
                got = torch.as_tensor(box["r"], device=dev)[:, 0].double().cpu().numpy()
                assert np.allclose(got, ref_sum, rtol=1e-4, atol=1e-3), "segmented sum F=%d" % F
                results[(F, order, "segsum")] = median_us(segsum, args, reps)
            del keys, outs, args
            print("  measured F=%d %s" % (F, order), file=sys.stderr, flush=True)
        del x
        torch.cuda.empty_cache()
    return results


def table(columns, features):
    """Rows of (F, order, task): floor, before, PyG, then each column's us (and x before)."""
    names = list(columns)
    head = "%-4s %-9s %-7s %8s %8s %8s" % ("F", "order", "task", "floor", "before", "PyG")
    head += "".join(" %12s" % n[-12:] for n in names)
    lines = [head]
    for F in features:
        for order in ("sorted", "shuffled"):
            for task in ("sum", "max", "segsum", "det"):
                key = (F, order, task)
                if not any(key in columns[n] for n in names):
                    continue
                before, pyg = BEFORE.get(key), PYG.get(key)
                row = "%-4d %-9s %-7s %8.1f %8s %8s" % (F, order, task, floor_us(F),
                                                        "%.1f" % before if before else "-",
                                                        "%.1f" % pyg if pyg else "-")
                for n in names:
                    us = columns[n].get(key)
                    row += " %12s" % ("%.1f" % us if us else "-")
                lines.append(row)
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--features", default="1,16,64,256")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--env", action="append", default=[],
                    help="K=V (or 'K=V K2=V2'): a setting to compare (a subprocess each)")
    ap.add_argument("--src", default="", help="comma-separated source trees to compare (a subprocess each)")
    ap.add_argument("--json", action="store_true", help="print this process's results as JSON only")
    args = ap.parse_args(argv)
    features = [int(f) for f in args.features.split(",")]
    t0 = time.time()
    if not args.env and not args.src:
        res = measure(features, args.reps, args.seed)
        if args.json:
            print(json.dumps([[list(k), v] for k, v in res.items()]))
            return
        print(table({"us now": res}, features))
        print("(%.0f s)" % (time.time() - t0))
        return
    # the tree first, then whatever the path held (a GPU machine's carried NumPy, say)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not p.rstrip("/").endswith("src")]
    settings = [("src=" + s, {"PYTHONPATH": os.pathsep.join([s] + rest)}) for s in args.src.split(",") if s]
    settings += [(e, dict(kv.split("=", 1) for kv in e.split())) for e in args.env]
    if args.env and not args.src:
        settings.insert(0, ("default", {}))
    columns = {}
    for name, env in settings:
        out = subprocess.run([sys.executable, __file__, "--json", "--features", args.features, "--reps",
                              str(args.reps), "--seed", str(args.seed)], env={**os.environ, **env},
                             capture_output=True, text=True)
        if out.returncode:
            print("%s failed:\n%s" % (name, out.stderr[-2000:]))
            continue
        columns[name] = {tuple(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1])}
        # the table so far after each setting: a time limit that cuts the run keeps the rest
        print(table(columns, features))
        print("(%s done, %.0f s)" % (name, time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
