"""Accumulator and result dtypes, as NumPy chooses them.

``np.sum`` of int32 is int64, of uint8 is uint64, of float16 is float16 (we
accumulate it in float32, as NumPy's pairwise sum effectively does);
``np.min`` keeps the dtype; ``np.mean`` of integers is float64. ``dtype=``
overrides the accumulator and the result, as in NumPy.
"""

import numpy as np

from ..values import ValueType

_INT64 = np.dtype(np.int64)
_UINT64 = np.dtype(np.uint64)
_FLOAT32 = np.dtype(np.float32)
_FLOAT64 = np.dtype(np.float64)


def sum_dtype(dt):
    """Result dtype of ``np.add.reduce`` / ``np.multiply.reduce``."""
    if dt.kind == "b" or (dt.kind == "i" and dt.itemsize < 8):
        return _INT64
    if dt.kind == "u" and dt.itemsize < 8:
        return _UINT64
    return dt


def mean_dtype(dt):
    """Result dtype of ``np.mean`` / ``np.var``."""
    return dt if dt.kind == "f" else _FLOAT64


def accumulate(dt):
    """The dtype to accumulate a result of dtype ``dt`` in."""
    return _FLOAT32 if dt == np.float16 else dt


def value_types(result, accumulator=None):
    """(accumulator ValueType, result ValueType) from field dtypes."""
    result_vt = ValueType.of(result)
    if accumulator is None:
        fields = tuple(accumulate(f) for f in result_vt.fields)
        accumulator = fields if result_vt.is_tuple else fields[0]
    return ValueType.of(accumulator), result_vt


def result_fields(op, in_vt, dtype=None):
    """Result field dtype(s) of reducing ``in_vt`` with ``op``: ``dtype=`` if
    given; NumPy's sum/prod promotion for plus and multiplies; otherwise the
    input's own. A dtype for a scalar value type, a tuple of them for a tuple."""
    from ..ops import multiplies, plus
    if isinstance(dtype, tuple):            # one per field (np.dtype would read a tuple as a subarray)
        if len(dtype) != len(in_vt.fields):
            raise ValueError("cufold: dtype has %d fields; the values have %d" % (len(dtype), len(in_vt.fields)))
        fields = tuple(np.dtype(d) for d in dtype)
    elif dtype is not None:
        fields = tuple(np.dtype(dtype) for _ in in_vt.fields)
    elif op is plus or op is multiplies:
        fields = tuple(sum_dtype(f) for f in in_vt.fields)
    else:
        fields = in_vt.fields
    return fields if in_vt.is_tuple else fields[0]
