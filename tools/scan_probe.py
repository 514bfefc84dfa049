"""The cumsum cases of ``bench scan-axes`` (and a flat 1-D cumsum of the same 2^24 items) on a
GPU in seconds: cufold's GPU time next to torch moving the same bytes in the same shape
(``clone``), inputs rotated through more memory than L2, and ``--once`` for ncu.

    PYTHONPATH=src:tools python tools/scan_probe.py                 # every case, timed
    PYTHONPATH=src:tools python tools/scan_probe.py 1048576x16,1 16x1048576,0
    CUFOLD_ALIGNED_SEGMENTS=0 PYTHONPATH=src:tools python tools/scan_probe.py 1048576x16,1
    ncu --profile-from-start off ... python tools/scan_probe.py --once     # clone, then cumsum, a case each
    PYTHONPATH=src:tools python tools/scan_probe.py --dtype float64 16x1048576,1

The knobs of :mod:`cufold.device.scan_axis` (``CUFOLD_*``) are read at import: one setting a
process. Each case's result is checked against torch.cumsum once before it is timed.
"""
import sys

import torch

import cufold
from cufold.device import scan_axis
from gpu_timing import rotating_us

CASES = ("4096x4096,1", "4096x4096,0", "1048576x16,1", "1048576x16,0", "16x1048576,1", "16x1048576,0",
         "16777216,0")
ROTATE = 3                      # 3 inputs of 64 MiB: more than an H100's or H200's L2


def parse(case):
    dims, _, axis = case.partition(",")
    return tuple(int(d) for d in dims.split("x")), int(axis or 0)


def main(argv):
    once = "--once" in argv
    dtype = getattr(torch, argv[argv.index("--dtype") + 1]) if "--dtype" in argv else torch.float32
    chosen = [a for a in argv if not a.startswith("--") and not hasattr(torch, a)] or list(CASES)
    g = torch.Generator(device="cuda").manual_seed(0)
    print("case            plan                           cufold us   clone us   %%clone  (%s, %s)"
          % (torch.cuda.get_device_name(), str(dtype).replace("torch.", "")))
    runs = []
    for case in chosen:
        shape, axis = parse(case)
        xs = [torch.randint(-8, 8, shape, device="cuda", generator=g).to(dtype) for _ in range(ROTATE)]
        got = cufold.cumsum(xs[0], axis=axis)
        want = torch.cumsum(xs[0], dim=axis)
        assert torch.equal(torch.as_tensor(got, device="cuda"), want), case
        xs[0].clone()
        lay = scan_axis.plan_layout(shape, xs[0].stride(), xs[0].stride(), axis, False) if len(shape) > 1 else None
        runs.append((case, axis, xs, "flat" if lay is None else "%s A%d L%d C%d" % (lay.kind, lay.A, lay.L, lay.C)))
    torch.cuda.synchronize()
    if once:
        torch.cuda.cudart().cudaProfilerStart()
        for case, axis, xs, _ in runs:
            xs[1].clone()                              # the marker: the copy of the same bytes
            cufold.cumsum(xs[1], axis=axis)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        for case, _, _, plan in runs:
            print("%-15s %s" % (case, plan))
        return 0
    for case, axis, xs, plan in runs:
        ours = rotating_us(lambda x: cufold.cumsum(x, axis=axis), xs)
        copy = rotating_us(lambda x: x.clone(), xs)
        print("%-15s %-30s %10.1f %10.1f %7.0f%%" % (case, plan, ours, copy, 100 * copy / ours), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
