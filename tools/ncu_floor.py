"""The reads behind #24's 90%-of-the-floor criterion, once each (after a warm-up), for ncu's
DRAM counters: what any library reaches on y's 48 MiB, what a copy reaches, and the bytes
A[:, ::2] makes DRAM deliver (every sector of A: twice its contiguous copy's).

    ncu --profile-from-start off --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,\\
dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\\
sm__throughput.avg.pct_of_peak_sustained_elapsed python tools/ncu_floor.py > $OUT/ncu-floor.csv
    python tools/ncu_floor.py --table $OUT/ncu-floor.csv      # a line a launch, under its case

``runs`` as the first argument profiles #24's remaining misses instead: the full reductions of
A[::2] (the reduce over runs) next to the same reductions of its contiguous copy and of A, A.T's
full argmax next to A's, and a kernel copy of the contiguous half (DRAM's ceiling on 128 MiB).

(``--clock-control none``: the clocks the benchmarks run at; ncu's default locks them to
base, which slows instruction-heavy kernels more than reads.) (A copy_ of a contiguous
tensor is a DMA copy, which ncu does not profile: the copy here is an elementwise kernel.)
Every case runs once untimed first (compiles, plans); then, between cudaProfilerStart and
Stop, each case follows a marker (torch's spin kernel), so the table tells whose kernels
(cufold's, torch's, CuPy's, CUB's) are whose.
"""
import csv
import sys

import numpy as np


def cases():
    """(label, call) of each read; inputs made once, on the current GPU."""
    import cupy
    import torch

    import cufold
    import cuda.compute as cc
    from axis_cases import array

    x, y = array("x"), array("y")
    x_half = x[:, ::2]
    x_half_copy = x_half.contiguous()
    y_flat = y.reshape(-1)
    y_copy = torch.empty_like(y_flat)
    y_cp = cupy.asarray(y_flat)
    out = cupy.empty(1, np.float32)
    made = cc.make_reduce_into(d_in=y_cp, d_out=out, op=cc.OpKind.PLUS, h_init=np.zeros(1, np.float32))
    temp = cupy.empty(max(1, int(made(temp_storage=None, d_in=y_cp, d_out=out, num_items=y_cp.size,
                                      op=cc.OpKind.PLUS, h_init=np.zeros(1, np.float32)))), np.uint8)
    return [
        ("cufold.sum(y)", lambda: cufold.sum(y)),
        ("torch.sum(y)", lambda: y.sum()),
        ("cupy.sum(y)", lambda: y_cp.sum()),
        ("CUB reduce_into(y)", lambda: made(temp_storage=temp, d_in=y_cp, d_out=out, num_items=y_cp.size,
                                            op=cc.OpKind.PLUS, h_init=np.zeros(1, np.float32))),
        ("copy(y), as a kernel (torch.mul by 1)", lambda: torch.mul(y_flat, 1.0, out=y_copy)),
        ("cufold.sum(y, axis=2)", lambda: cufold.sum(y, axis=2)),
        ("cufold.argmax(y, axis=2)", lambda: cufold.argmax(y, axis=2)),
        ("cufold.argmax(y)", lambda: cufold.argmax(y)),
        ("torch.argmax(y)", lambda: y.argmax()),
        ("cufold.argmax(y.permute(0, 2, 1))", lambda: cufold.argmax(y.permute(0, 2, 1))),
        ("cufold.argmax(x.T)", lambda: cufold.argmax(x.T)),
        ("cufold.sum(x[:, ::2])", lambda: cufold.sum(x_half)),
        ("cufold.sum(x[:, ::2].contiguous())", lambda: cufold.sum(x_half_copy)),
        ("torch.sum(x[:, ::2])", lambda: x_half.sum()),
    ]


MARKER = "spin"         # (torch.cuda._sleep's kernel name holds it)


def runs_cases():
    """(label, call) of #24's misses: A[::2] and A.T against contiguous reads of the same bytes."""
    import torch

    import cufold
    from axis_cases import array

    x, y = array("x"), array("y")
    y_copy = y.permute(1, 0, 2).contiguous()
    half = x[::2]
    half_copy = half.contiguous()
    half_out = torch.empty_like(half_copy)
    return [
        ("cufold.sum(A[::2])", lambda: cufold.sum(half)),
        ("cufold.sum(A[::2].contiguous())", lambda: cufold.sum(half_copy)),
        ("torch.sum(A[::2].contiguous())", lambda: half_copy.sum()),
        ("copy(A[::2].contiguous()), as a kernel", lambda: torch.mul(half_copy, 1.0, out=half_out)),
        ("copy(A[::2]) (strided reads), as a kernel", lambda: torch.mul(half, 1.0, out=half_out)),
        ("cufold.argmax(A[::2])", lambda: cufold.argmax(half)),
        ("cufold.argmax(A[::2].contiguous())", lambda: cufold.argmax(half_copy)),
        ("cufold.sum(A)", lambda: cufold.sum(x)),
        ("cufold.argmax(A)", lambda: cufold.argmax(x)),
        ("cufold.argmax(A.T)", lambda: cufold.argmax(x.T)),
        ("cufold.argmax(y.permute(1, 0, 2))", lambda: cufold.argmax(y.permute(1, 0, 2))),
        ("cufold.argmax(y.permute(1, 0, 2).contiguous())", lambda: cufold.argmax(y_copy)),
        ("torch.argmax(A)", lambda: x.argmax()),
    ]


def run(which="floor"):
    import torch
    todo = runs_cases() if which == "runs" else cases()
    for label, call in todo:      # compiled and planned before the profiled launches
        call()
        print("case: " + label)   # (in the order of the markers: what --table reads)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _, call in todo:
        torch.cuda._sleep(1000)
        call()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def table(path):
    """ncu's --csv (one row a metric a launch) as one line a launch, under its case."""
    with open(path) as f:
        lines = f.read().splitlines()
    labels = [line[len("case: "):] for line in lines if line.startswith("case: ")]
    rows = list(csv.reader(line for line in lines if line.startswith('"')))
    launches = {}
    head, rows = rows[0], rows[1:]
    col = {name: k for k, name in enumerate(head)}
    for r in rows:
        key = (int(r[col["ID"]]), r[col["Kernel Name"]][:40])
        launches.setdefault(key, {})[r[col["Metric Name"]]] = (r[col["Metric Value"]], r[col["Metric Unit"]])
    case = -1
    for (i, name), m in sorted(launches.items()):
        if MARKER in name:
            case += 1
            print("== %s" % (labels[case] if case < len(labels) else "?"))
            continue
        print("   %-40s %s" % (name, "  ".join("%s=%s %s" % (k, v, u) for k, (v, u) in sorted(m.items()))))


if __name__ == "__main__":
    if "--table" in sys.argv:
        table(sys.argv[sys.argv.index("--table") + 1])
    else:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        run(sys.argv[1] if len(sys.argv) > 1 else "floor")
