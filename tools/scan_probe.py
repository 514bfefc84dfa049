"""The cumsum cases of ``bench scan-axes`` (and a flat 1-D cumsum of the same 2^24 items) on a
GPU in seconds: cufold's GPU time next to torch moving the same bytes in the same shape
(``clone``), inputs rotated through more memory than L2, and ``--once`` for ncu.

    PYTHONPATH=src:tools python tools/scan_probe.py                 # every case, timed
    PYTHONPATH=src:tools python tools/scan_probe.py 1048576x16,1 16x1048576,0
    CUFOLD_ALIGNED_SEGMENTS=0 PYTHONPATH=src:tools python tools/scan_probe.py 1048576x16,1
    ncu --profile-from-start off ... python tools/scan_probe.py --once     # clone, then cumsum, a case each
    PYTHONPATH=src:tools python tools/scan_probe.py --dtype float64 16x1048576,1
    PYTHONPATH=src:tools python tools/scan_probe.py --dtype int32 --out-dtype int32 4194304x4,0
    PYTHONPATH=src:tools python tools/scan_probe.py affine:4096x2048,1    # h = a*h + b along axis 1

``affine:`` cases time ``bench scan-axes``' batched affine recurrence (``h`` only, float32) next
to ``a + b`` (the same bytes, in the "clone" column) and the Triton kernel (the last column).
The knobs of :mod:`cufold.device.scan_axis` (``CUFOLD_*``) are read at import: one setting a
process. Each case's result is checked against torch.cumsum once before it is timed.
"""
import sys

import numpy as np
import torch

import cufold
from cufold.bench.scan_axes import _affine, _affine_reference
from cufold.device import scan_axis
from gpu_timing import rotating_us

CASES = ("4096x4096,1", "4096x4096,0", "1048576x16,1", "1048576x16,0", "16x1048576,1", "16x1048576,0",
         "16777216,0")
ROTATE = 3                      # 3 inputs of 64 MiB: more than an H100's or H200's L2


def parse(case):
    dims, _, axis = case.partition(",")
    return tuple(int(d) for d in dims.split("x")), int(axis or 0)


AFFINE = cufold.Op(_affine, name="affine")


def _cumsum_case(shape, axis, dtype, out_dtype, g):
    """``(inputs, cufold call, copy call, peer)`` of a cumsum case, checked against torch."""
    # (symmetric, so the sums walk without drift: float32's stay exact integers up to 2^28 items)
    xs = [torch.randint(-8, 9, shape, device="cuda", generator=g).to(dtype) for _ in range(ROTATE)]
    ours = (lambda x: cufold.cumsum(x, axis=axis)) if out_dtype is None else \
        (lambda x: cufold.cumsum(x, axis=axis, dtype=str(out_dtype).replace("torch.", "")))
    want = torch.cumsum(xs[0], dim=axis) if out_dtype is None else torch.cumsum(xs[0], dim=axis, dtype=out_dtype)
    assert torch.equal(torch.as_tensor(ours(xs[0]), device="cuda"), want), (shape, axis)
    return xs, ours, lambda x: x.clone(), None


def _affine_case(shape, axis, g):
    """The same for the affine recurrence (``h`` only) of a 2-D shape, checked against
    ``bench scan-axes``' float64 loop."""
    assert len(shape) == 2, "affine: cases are 2-D"
    xs = [(torch.rand(shape, device="cuda", generator=g) * 0.5 + 0.5,
           torch.rand(shape, device="cuda", generator=g) * 2 - 1) for _ in range(ROTATE)]
    ours = lambda p: cufold.inclusive_scan(p, AFFINE, axis=axis, out=(None, torch.empty_like(p[1])))[1]
    a, b = (np.moveaxis(v.double().cpu().numpy(), axis, 1) for v in xs[0])     # the loop runs along axis 1
    want = np.moveaxis(_affine_reference(a, b), 1, axis)
    assert np.allclose(ours(xs[0]).double().cpu().numpy(), want, atol=1e-4), (shape, axis)
    peer = None
    if axis in (1, -1):
        try:
            from cufold.bench._triton_affine import affine_rows
            peer = affine_rows
        except Exception:                       # noqa: BLE001 (no Triton: no peer)
            pass
    return xs, ours, lambda p: p[0] + p[1], peer


def main(argv):
    once = "--once" in argv
    dtype = getattr(torch, argv[argv.index("--dtype") + 1]) if "--dtype" in argv else torch.float32
    out_dtype = getattr(torch, argv[argv.index("--out-dtype") + 1]) if "--out-dtype" in argv else None
    chosen = [a for a in argv if not a.startswith("--") and not hasattr(torch, a)] or list(CASES)
    g = torch.Generator(device="cuda").manual_seed(0)
    print("case            plan                           cufold us   clone us   %%clone    peer us  (%s, %s%s)"
          % (torch.cuda.get_device_name(), str(dtype).replace("torch.", ""),
             "" if out_dtype is None else " -> " + str(out_dtype).replace("torch.", "")))
    runs = []
    for case in chosen:
        affine = case.startswith("affine:")
        shape, axis = parse(case.partition(":")[2] if affine else case)
        xs, ours, copy, peer = _affine_case(shape, axis, g) if affine else _cumsum_case(shape, axis, dtype,
                                                                                       out_dtype, g)
        copy(xs[0])
        first = xs[0][0] if affine else xs[0]
        lay = scan_axis.plan_layout(shape, first.stride(), first.stride(), axis, False) if len(shape) > 1 else None
        runs.append((case, xs, ours, copy, peer,
                     "flat" if lay is None else "%s A%d L%d C%d" % (lay.kind, lay.A, lay.L, lay.C)))
    torch.cuda.synchronize()
    if once:
        torch.cuda.cudart().cudaProfilerStart()
        for case, xs, ours, copy, _, _ in runs:
            copy(xs[1])                                # the marker: the copy of the same bytes
            ours(xs[1])
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        for case, *_, plan in runs:
            print("%-15s %s" % (case, plan))
        return 0
    for case, xs, ours, copy, peer, plan in runs:
        t_ours = rotating_us(ours, xs)
        t_copy = rotating_us(copy, xs)
        t_peer = "%10.1f" % rotating_us(peer, xs) if peer is not None else ""
        print("%-15s %-30s %10.1f %10.1f %7.0f%% %s" % (case, plan, t_ours, t_copy, 100 * t_copy / t_ours, t_peer),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
