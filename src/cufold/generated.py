"""Generated inputs: arrays whose items a kernel computes from their index.

``cufold.counting(n)`` and ``cufold.constant(n, value)`` go wherever a 1-D device
array goes in a reduction (alone, or as fields of a tuple input) and hold no
memory: the kernel receives the start (or the value) and computes item ``i``.
A call whose inputs are all generated returns results of Numba's device arrays
(pass ``out=`` to write into an array of your own library).

Example::

    i = cufold.argmax(cufold.counting(1000), transform=lambda i: -(i - 321) ** 2)   # 321
    first = cufold.reduce_by_key_into(keys, cufold.counting(keys.shape[0]), out, cufold.minimum)
"""

import numpy as np

from .host.arrays import Generated
from .values import _field_dtype

__all__ = ["counting", "constant"]


def counting(n, start=0, dtype=np.int64):
    """The sequence ``start, start + 1, ..., start + n - 1`` of ``dtype``, generated.

    Example: ``cufold.sum(cufold.counting(10))  # 45``
    """
    dt = _field_dtype(dtype)
    if dt.kind == "b":
        raise TypeError("cufold: counting() needs a numeric dtype, not bool")
    return Generated("counting", n, start, dt)


def constant(n, value, dtype=None):
    """``n`` items equal to ``value`` (of ``dtype``, default NumPy's for ``value``), generated.

    Example: ``cufold.sum(cufold.constant(4, 2.5))  # 10.0``
    """
    dt = _field_dtype(np.asarray(value).dtype if dtype is None else dtype)
    return Generated("constant", n, value, dt)
