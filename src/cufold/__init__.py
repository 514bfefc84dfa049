"""cufold: GPU parallel reductions and scans for Python.

Layers, as in CUB: :mod:`cufold.thread` (sequential, in registers),
:mod:`cufold.warp` (shuffles, ballots, match), :mod:`cufold.block` (shared
memory and warps) and the device-wide calls at the top level. Operators and
value types live in :mod:`cufold.ops` and :mod:`cufold.values`;
:mod:`cufold.quads` has a thread's 16-byte float32 loads and atomic adds.
"""

from . import simulator as _simulator

_simulator.install()  # warp intrinsics for NUMBA_ENABLE_CUDASIM=1; no-op on a GPU

from .ops import (  # noqa: E402
    Op, as_op, plus, multiplies, minimum, maximum, bit_and, bit_or, bit_xor,
    logical_and, logical_or, argmin, argmax, minmax, welford,
)
from .values import ValueType  # noqa: E402
from .generated import counting, constant  # noqa: E402
from . import thread, warp, block, quads  # noqa: E402
from .device import reproducible  # noqa: E402
from .device import (  # noqa: E402
    algorithms, reduce, sum, prod, min, max, argmin, argmax, minmax, mean, var, mean_var,
    inclusive_scan, exclusive_scan, cumsum, cumprod, cummax, cummin,
    segmented_reduce, reduce_by_key, reduce_by_key_into, histogram, bincount,
    segmented_scan, inclusive_scan_by_key, exclusive_scan_by_key,
    dot, vdot, norm, logsumexp, count_nonzero, all, any,
)

__version__ = "0.1.0"

__all__ = [
    "Op", "as_op", "ValueType", "thread", "warp", "block", "quads", "reproducible",
    "algorithms", "reduce", "sum", "prod", "min", "max", "argmin", "argmax", "minmax", "mean", "var",
    "mean_var", "inclusive_scan", "exclusive_scan", "cumsum", "cumprod", "cummax", "cummin",
    "segmented_reduce", "reduce_by_key", "reduce_by_key_into", "histogram", "bincount",
    "segmented_scan", "inclusive_scan_by_key", "exclusive_scan_by_key",
    "dot", "vdot", "norm", "logsumexp", "count_nonzero", "all", "any",
    "counting", "constant",
    "plus", "multiplies", "minimum", "maximum", "bit_and", "bit_or", "bit_xor",
    "logical_and", "logical_or", "argmin", "argmax", "minmax", "welford",
]
