"""The inputs and reductions the axis tools (axis_probe, axis_tune, axis_variants) time:
``bench axes``'s float32 bases and each reduction as cufold's call and torch's."""
import torch

import cufold

#: x, y and z of ``bench axes`` (A, y and z there).
SHAPES = {"x": (8192, 8192), "y": (64, 3, 65536), "z": (1 << 24, 4)}
#: reduction -> (cufold's function, torch's ``(tensor, axis)`` call).
REDUCTIONS = {"sum": (cufold.sum, lambda a, axis: a.sum(axis)),
              "max": (cufold.max, lambda a, axis: a.amax(axis)),
              "mean": (cufold.mean, lambda a, axis: a.mean(axis)),
              "argmax": (cufold.argmax, lambda a, axis: a.argmax(axis))}


def array(name):
    """A fresh uniform random float32 tensor of base ``name`` on the current GPU."""
    return torch.rand(*SHAPES[name], device="cuda")


def case(label, reduction, a, axis):
    """``(label, cufold's call, torch's call)`` of ``reduction`` of ``a`` along ``axis``."""
    mine, theirs = REDUCTIONS[reduction]
    return label, (lambda: mine(a, axis=axis)), (lambda: theirs(a, axis))
