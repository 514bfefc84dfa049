"""(temporary) full argmax of A.T and z.T under CUFOLD_WALK_UNROLL, next to the contiguous copies'."""
import os, sys
import torch
sys.path.insert(0, "tools")
from gpu_timing import gpu_us
from axis_cases import array
import cufold
from cufold.device import axis as A
x, y, z = array("x"), array("y"), array("z")
xt, zt = x.T, z.T
xc, zc = xt.contiguous(), zt.contiguous()
for name, v, c in (("A.T", xt, xc), ("z.T", zt, zc)):
    got = int(torch.as_tensor(cufold.argmax(v), device="cuda"))
    assert got == int(torch.argmax(c)), (name, got)
cells = []
for name, call in (("A.T argmax", lambda: cufold.argmax(xt)), ("z.T argmax", lambda: cufold.argmax(zt)),
                   ("A argmax", lambda: cufold.argmax(x)), ("z argmax", lambda: cufold.argmax(z)),
                   ("A[::2] argmax", lambda: cufold.argmax(x[::2])),
                   ("y.permute(0,2,1) argmax", lambda: cufold.argmax(y.permute(0, 2, 1)))):
    cells.append("%s %.1f" % (name, gpu_us(call, reps=40, batches=5)))
print("WALK_UNROLL=%s | %s" % (A.WALK_UNROLL, " | ".join(cells)), flush=True)
