"""The Triton peer of ``bench scan-axes``: the batched affine recurrence ``h = a*h + b``
along each row, one program per row, ``tl.associative_scan`` over the row in registers
(the issue's peer kernel; it writes ``h`` only). Imported only where Triton is."""

import triton
import triton.language as tl


@triton.jit
def _combine(a1, b1, a2, b2):
    # x -> a1*x + b1, then a2: (a1*a2, b1*a2 + b2)
    return a1 * a2, b1 * a2 + b2


@triton.jit
def _affine_rows_kernel(A, B, H, length, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    keep = offs < length
    a = tl.load(A + row * stride + offs, mask=keep, other=1.0)
    b = tl.load(B + row * stride + offs, mask=keep, other=0.0)
    _, h = tl.associative_scan((a, b), 0, _combine)
    tl.store(H + row * stride + offs, h, mask=keep)


def affine_rows(pair):
    """``h`` of the recurrence along the rows of C-contiguous 2-D torch tensors ``(a, b)``."""
    import torch
    a, b = pair
    h = torch.empty_like(b)
    rows, length = a.shape
    _affine_rows_kernel[(rows,)](a, b, h, length, a.stride(0), BLOCK=triton.next_power_of_2(length))
    return h
