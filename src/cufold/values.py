"""Value types: a scalar of a NumPy numeric dtype, or a tuple of them.

A :class:`ValueType` knows how to move its values around a warp and through
memory. Every routine here is generated once per value type and cached:

* ``shuffle(kind)`` moves every field through a warp shuffle. Numba's
  shuffles accept only int32/int64/float32/float64, so narrower and unsigned
  fields are widened (or reinterpreted) to a shuffleable type and back, which
  is exact. All fields are shuffled before any is used, so independent fields
  interleave instead of serialising (seed 000's ILP point).
* ``load(arrays, i)`` / ``store(arrays, i, value)``: a scalar value lives in
  one array; a tuple value lives in a tuple of equally long arrays (structure
  of arrays), one per field.
* ``cast(value)`` brings an operator's result back to the value type (Numba
  promotes ``int8 + int8`` to ``int64``; the value type is what is stored).
* ``equal(a, b)``: field-wise equality, used to find peers by key.
"""

import functools

import numpy as np
from numba import types as nbtypes
from numba.np.numpy_support import from_dtype as _numba_from_dtype

from . import _codegen

#: dtypes a field may have.
SUPPORTED_DTYPES = tuple(
    np.dtype(t)
    for t in (
        np.bool_,
        np.int8, np.int16, np.int32, np.int64,
        np.uint8, np.uint16, np.uint32, np.uint64,
        np.float16, np.float32, np.float64,
    )
)

# How a field crosses a shuffle: (type it is shuffled as, None if native).
_SHUFFLE_AS = {
    "bool": "int32",
    "int8": "int32", "int16": "int32", "int32": None, "int64": None,
    "uint8": "int32", "uint16": "int32",
    "uint32": "int32",  # same width: a reinterpretation, exact
    "uint64": "int64",  # same width: a reinterpretation, exact
    "float16": "float32",  # widening is exact, and narrowing back too
    "float32": None, "float64": None,
}


def _field_dtype(spec):
    try:
        dt = np.dtype(spec)
    except TypeError as exc:
        raise TypeError("cufold: %r is not a NumPy dtype" % (spec,)) from exc
    if dt not in SUPPORTED_DTYPES:
        raise TypeError(
            "cufold: values of dtype %s cannot be shuffled or reduced; "
            "supported field dtypes are %s"
            % (dt, ", ".join(str(d) for d in SUPPORTED_DTYPES))
        )
    return dt


class ValueType:
    """The type of the values a primitive combines.

    ``ValueType.of(np.float32)`` is a scalar type; ``ValueType.of((np.float64,
    np.int64))`` is a pair, whose values are Python tuples inside kernels.
    """

    def __init__(self, fields, is_tuple):
        self.fields = tuple(fields)
        self.is_tuple = bool(is_tuple)

    @staticmethod
    def of(spec):
        """Normalise a dtype-like, a tuple of dtype-likes, or a ValueType."""
        if isinstance(spec, ValueType):
            return spec
        if isinstance(spec, (tuple, list)):
            if not spec:
                raise TypeError("cufold: a tuple value type needs at least one field")
            return _intern(tuple(_field_dtype(s) for s in spec), True)
        return _intern((_field_dtype(spec),), False)

    # --- description -----------------------------------------------------------
    @property
    def arity(self):
        return len(self.fields)

    @property
    def dtype(self):
        """The dtype of a scalar value type."""
        if self.is_tuple:
            raise TypeError("cufold: %s has several fields, not one dtype" % self)
        return self.fields[0]

    @property
    def itemsize(self):
        return sum(f.itemsize for f in self.fields)

    @property
    def numba_type(self):
        scalars = [_numba_from_dtype(f) for f in self.fields]
        return nbtypes.Tuple(scalars) if self.is_tuple else scalars[0]

    def __repr__(self):
        if self.is_tuple:
            return "(%s)" % ", ".join(str(f) for f in self.fields)
        return str(self.fields[0])

    def __reduce__(self):
        return (ValueType.of, (tuple(self.fields) if self.is_tuple else self.fields[0],))

    # --- host-side values --------------------------------------------------------
    def make(self, value):
        """A host value (numpy scalar or tuple of them) of this type."""
        if self.is_tuple:
            if not isinstance(value, tuple) or len(value) != self.arity:
                raise TypeError("cufold: expected a %d-tuple for %s, got %r" % (self.arity, self, value))
            return tuple(f.type(v) for f, v in zip(self.fields, value))
        if isinstance(value, tuple):
            raise TypeError("cufold: expected a scalar for %s, got %r" % (self, value))
        return self.fields[0].type(value)

    def constant(self, value):
        """``value`` in a form a kernel can capture as a compile-time constant.

        Numba cannot embed float16 constants, so those fields are widened to
        float32 (exactly); device code passes the constant through ``cast``.
        """
        value = self.make(value)
        fields = value if self.is_tuple else (value,)
        wide = tuple(np.float32(v) if f == np.float16 else v for f, v in zip(self.fields, fields))
        return wide if self.is_tuple else wide[0]

    def sample(self):
        """A small non-trivial host value, used to check operators on the host."""
        vals = tuple(f.type(1) for f in self.fields)
        return vals if self.is_tuple else vals[0]

    # --- generated device routines ------------------------------------------------
    def _env(self):
        return {"T%d" % i: f.type for i, f in enumerate(self.fields)}

    def _pack(self, exprs):
        if self.is_tuple:
            return "(" + ", ".join(exprs) + ("," if len(exprs) == 1 else "") + ")"
        return exprs[0]

    def _field(self, var, i):
        return "%s[%d]" % (var, i) if self.is_tuple else var

    def _arrays_in(self, var):
        """``[(field, expression)]``: each field that has an array, and that array
        in ``var``, a value's arrays (one array, or a tuple of them: ``_field``)."""
        return [(i, self._field(var, i)) for i in range(self.arity)]

    def _pack_arrays(self, exprs):
        """One expression per field of :meth:`_arrays_in` as the type's arrays."""
        return self._pack(exprs)

    @property
    def stored(self):
        """Whether each field has an array (every one, but in an :class:`OutputType`)."""
        return (True,) * self.arity

    @property
    def plain(self):
        """The ValueType of this type's fields, every one of them an array (what an
        :class:`InputType` or :class:`OutputType` holds as values)."""
        return _intern(self.fields, self.is_tuple)

    @functools.cached_property
    def cast(self):
        """Device function: bring a value of compatible shape to this type."""
        body = self._pack(["T%d(%s)" % (i, self._field("v", i)) for i in range(self.arity)])
        return _codegen.build("def cast(v):\n    return %s\n" % body, "cast", self._env())

    def shuffle(self, kind):
        """Device function ``(mask, value, arg) -> value`` for one of
        ``'idx'``, ``'up'``, ``'down'``, ``'xor'`` (numba's ``shfl_*_sync``).
        """
        return _shuffle(self, kind)

    @functools.cached_property
    def load(self):
        """Device function ``(arrays, i) -> value`` (a tuple type reads one array per field)."""
        # An unsigned index spares Numba's negative-index wraparound (5 instructions a load).
        body = self._pack(["%s[u]" % self._field("a", i) for i in range(self.arity)])
        return _codegen.build("def load(a, i):\n    u = np.uint64(i)\n    return %s\n" % body, "load")

    @functools.cached_property
    def store(self):
        """Device function ``(arrays, i, value)``."""
        lines = ["    %s[u] = %s" % (a, self._field("v", i)) for i, a in self._arrays_in("a")]
        return _codegen.build("def store(a, i, v):\n    u = np.uint64(i)\n%s\n" % "\n".join(lines), "store")

    @functools.cached_property
    def equal(self):
        """Device function ``(a, b) -> bool``: every field equal."""
        body = " and ".join("%s == %s" % (self._field("a", i), self._field("b", i)) for i in range(self.arity))
        return _codegen.build("def equal(a, b):\n    return %s\n" % body, "equal")


_interned = {}


def _intern(fields, is_tuple):
    key = (fields, is_tuple)
    vt = _interned.get(key)
    if vt is None:
        vt = _interned[key] = ValueType(fields, is_tuple)
    return vt


@functools.lru_cache(maxsize=None)
def _shuffle(vt, kind):
    intrinsic = {"idx": "shfl_sync", "up": "shfl_up_sync", "down": "shfl_down_sync", "xor": "shfl_xor_sync"}[kind]
    env = vt._env()
    moved, back = [], []
    for i, f in enumerate(vt.fields):
        via = _SHUFFLE_AS[f.name]
        src = vt._field("v", i)
        if via is None:
            moved.append("    r%d = cuda.%s(mask, %s, arg)" % (i, intrinsic, src))
            back.append("r%d" % i)
        else:
            env["W%d" % i] = np.dtype(via).type
            moved.append("    r%d = cuda.%s(mask, W%d(%s), arg)" % (i, intrinsic, i, src))
            back.append("(r%d != 0)" % i if f.name == "bool" else "T%d(r%d)" % (i, i))
    src = "def shuffle(mask, v, arg):\n%s\n    return %s\n" % ("\n".join(moved), vt._pack(back))
    return _codegen.build(src, "shuffle", env)


class InputType(ValueType):
    """The value type of an input some of whose fields are generated, not stored
    (``cufold.counting``, ``cufold.constant``): ``sources[i]`` is ``"array"``,
    ``"counting"`` or ``"constant"`` (or ``"countdown"``: a counting input read in
    reverse, item ``i`` is ``last - i``). Its :attr:`load` reads array fields from their
    arrays and computes the others from the index: a counting field's argument is its
    start (item ``i`` is ``start + i``), a constant field's argument is the value."""

    def __init__(self, fields, is_tuple, sources):
        super().__init__(fields, is_tuple)
        self.sources = tuple(sources)

    @staticmethod
    def of(spec, sources):
        """``ValueType.of(spec)`` where every field is an array, else the interned InputType."""
        vt = ValueType.of(spec)
        if all(s == "array" for s in sources):
            return vt
        key = (vt.fields, vt.is_tuple, tuple(sources))
        got = _interned_inputs.get(key)
        if got is None:
            got = _interned_inputs[key] = InputType(vt.fields, vt.is_tuple, sources)
        return got

    def __repr__(self):
        return "%s[%s]" % (ValueType.__repr__(self), ",".join(self.sources))

    def __reduce__(self):
        return (InputType.of, (tuple(self.fields) if self.is_tuple else self.fields[0], self.sources))

    @functools.cached_property
    def load(self):
        exprs = []
        for i, s in enumerate(self.sources):
            a = self._field("a", i)
            exprs.append({"array": "%s[u]" % a, "counting": "T%d(%s + T%d(i))" % (i, a, i),
                          "countdown": "T%d(%s - T%d(i))" % (i, a, i), "constant": "T%d(%s)" % (i, a)}[s])
        return _codegen.build("def load(a, i):\n    u = np.uint64(i)\n    return %s\n" % self._pack(exprs),
                              "load", self._env())


_interned_inputs = {}


class OutputType(ValueType):
    """The value type of a result some of whose fields are not stored (a scan's
    ``out=(None, h)``: the caller wants ``h`` only): ``stored[i]`` says whether
    field ``i`` has an array. Its arrays are those of the stored fields only, a
    tuple in field order (:meth:`_arrays_in`); :attr:`store` (and every store
    generated through ``_arrays_in``) writes them and leaves the other fields out
    of the code: no argument, no address, no store. Values are whole (every field:
    what the operator returns); a result is never loaded back."""

    def __init__(self, fields, stored):
        super().__init__(fields, True)
        self._stored = tuple(bool(s) for s in stored)

    @property
    def stored(self):
        return self._stored

    @staticmethod
    def of(spec, stored):
        """``ValueType.of(spec)`` where every field is stored, else the interned
        OutputType (``spec``: a tuple type; at least one field stored)."""
        vt = ValueType.of(spec)
        stored = tuple(bool(s) for s in stored)
        if not vt.is_tuple or len(stored) != vt.arity or not any(stored):
            raise ValueError("cufold: an OutputType stores some fields of a tuple type; got %s of %s"
                             % (stored, vt))
        if all(stored):
            return vt.plain
        key = (vt.fields, stored)
        got = _interned_outputs.get(key)
        if got is None:
            got = _interned_outputs[key] = OutputType(vt.fields, stored)
        return got

    def __repr__(self):
        return "%s[%s]" % (ValueType.__repr__(self), ",".join("out" if s else "none" for s in self.stored))

    def __reduce__(self):
        return (OutputType.of, (tuple(self.fields), self.stored))

    def _arrays_in(self, var):
        kept = [i for i, s in enumerate(self.stored) if s]
        return [(i, "%s[%d]" % (var, k)) for k, i in enumerate(kept)]

    def _pack_arrays(self, exprs):
        return "(" + ", ".join(exprs) + ",)"            # a tuple, however many are stored

    @property
    def load(self):
        raise TypeError("cufold: %r is a result with fields not stored; it cannot be loaded" % self)


_interned_outputs = {}
