"""Pin a user's function down: a stable text of what it computes, or None.

A kernel built from a user's operator may come from the disk cache in a later
process only if the code Numba would compile there is the same. Numba compiles
the function's bytecode with the values of the globals and closure cells it
reads (frozen as constants), so :func:`fingerprint` hashes:

* the code object, recursively (bytecode, constants and nested code objects,
  names, argument counts, flags, exception table), and the bytecode format of
  this Python (the magic number);
* every global the code names (nested code included), every closure cell and
  every default argument, where the value is one of
  - plain data: None, bool, int, float, complex, str, bytes, NumPy scalars and
    dtypes, and tuples (up to ``MAX_ITEMS`` items) or frozensets of these;
  - a module of NumPy, math, cmath, operator or Numba (``np``, ``math``,
    ``cuda``), by name and version (so ``math.exp`` is pinned by the name
    ``exp`` in the bytecode and the module's name), or a function, ufunc or
    type those modules or the builtins define (``max``, ``np.float32``), by
    its qualified name, checked to resolve to the same object;
  - a cufold operator (its function, identity and flags), a plain Python
    function or a Numba device function (its ``py_func`` and compile
    options), recursively; a function reached again (recursion, cycles) is
    referred to by the order it was first met in;
  - a Numba type (``numba.float32``) or a cufold ValueType;
  - a name bound nowhere (it would raise NameError when compiled).

Anything else -- an arbitrary object, an array, a list or dict (mutable), a
module of another package, a callable without ``__code__`` -- cannot be
pinned down, and the fingerprint is None: such a kernel compiles in each
process, as it always did, never from a stale cache entry. File names and line
numbers are left out (the same source elsewhere compiles to the same code).
"""

import builtins
import hashlib
import importlib.util
import sys
import types as pytypes

import numpy as np

#: Tuples longer than this are not pinned (data that big belongs in an argument).
MAX_ITEMS = 256

_FORMAT = "cufold-fingerprint-1 %s %s" % (sys.implementation.cache_tag, importlib.util.MAGIC_NUMBER.hex())
_PLAIN = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))
_LIBRARIES = ("builtins", "math", "cmath", "operator", "numpy", "numba")


class _Unpinned(Exception):
    """Something the function depends on cannot be pinned down."""


def fingerprint(obj):
    """A stable hex digest of what ``obj`` (a function, a Numba device function
    or a :class:`cufold.Op`) computes, equal in every process where the same
    source runs with the same values; None when it cannot be pinned down (see
    the module's docstring)."""
    try:
        text = _Pinner().value(obj)
    except _Unpinned:
        return None
    except Exception:  # noqa: BLE001 - an object that breaks on inspection is not pinned
        return None
    return hashlib.sha256(("%s\n%s" % (_FORMAT, text)).encode()).hexdigest()


class _Pinner:
    """One walk over a function and what it uses (functions and operators met
    before are referred to by their order, which ends cycles)."""

    def __init__(self):
        self._order = {}     # id -> order first met (functions, operators)
        self._alive = []     # what the ids belong to, kept alive during the walk

    def value(self, v):
        cls = v.__class__
        if cls in _PLAIN:
            return "%s:%r" % (cls.__name__, v)
        if cls is tuple or cls is frozenset:
            if len(v) > MAX_ITEMS:
                raise _Unpinned("a tuple of %d items" % len(v))
            items = [self.value(x) for x in v]
            return "%s(%s)" % (cls.__name__, ",".join(items if cls is tuple else sorted(items)))
        if isinstance(v, np.generic):
            if v.dtype.kind not in "biufcmM":
                raise _Unpinned("a NumPy scalar of dtype %s" % v.dtype)
            return "np:%s:%s" % (v.dtype.str, v.tobytes().hex())
        if isinstance(v, np.dtype):
            return "dtype:%s:%r" % (v.str, v)
        if isinstance(v, pytypes.ModuleType):
            return "module:%s" % _library(v.__name__, v.__name__)
        named = _library_object(v)
        if named is not None:
            return named
        if isinstance(v, pytypes.FunctionType):
            return self._once(v, self._function)
        from .ops import Op
        if isinstance(v, Op):
            return self._once(v, self._op)
        if _is_numba(cls) and isinstance(getattr(v, "py_func", None), pytypes.FunctionType):
            return self._once(v, self._device_function)
        from numba.core.types import Type
        if isinstance(v, Type):
            return "numba-type:%s.%s:%s" % (cls.__module__, cls.__qualname__, v)
        from .values import ValueType
        if isinstance(v, ValueType):
            return "value-type:%r" % (v,)
        raise _Unpinned("a %s" % cls.__name__)

    def _once(self, v, describe):
        order = self._order.get(id(v))
        if order is not None:
            return "#%d" % order
        order = self._order[id(v)] = len(self._order)
        self._alive.append(v)
        return "#%d=%s" % (order, describe(v))

    def _function(self, fn):
        code = fn.__code__
        parts = [self._code(code)]
        scope = fn.__globals__
        built = getattr(fn, "__builtins__", builtins.__dict__)
        built = built if isinstance(built, dict) else vars(built)
        for name in sorted(_names(code)):
            if name in scope:
                parts.append("global %s=%s" % (name, self.value(scope[name])))
            elif name in built:
                parts.append("builtin %s=%s" % (name, self.value(built[name])))
            else:      # unbound (an attribute's name, or a NameError when compiled)
                parts.append("unbound %s" % name)
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                content = cell.cell_contents
            except ValueError:   # a cell not yet assigned
                parts.append("cell %s empty" % name)
                continue
            parts.append("cell %s=%s" % (name, self.value(content)))
        parts.append("defaults=%s" % self.value(fn.__defaults__ or ()))
        kw = fn.__kwdefaults__ or {}
        parts.append("kwdefaults=%s" % ",".join("%s=%s" % (k, self.value(kw[k])) for k in sorted(kw)))
        return "function{%s}" % ";".join(parts)

    def _code(self, co):
        consts = [self._code(c) if isinstance(c, pytypes.CodeType) else self.value(c) for c in co.co_consts]
        fields = (co.co_name, co.co_code.hex(), co.co_names, co.co_varnames, co.co_freevars, co.co_cellvars,
                  co.co_argcount, co.co_posonlyargcount, co.co_kwonlyargcount, co.co_flags, co.co_nlocals,
                  getattr(co, "co_exceptiontable", b"").hex())
        return "code%r[%s]" % (fields, ",".join(consts))

    def _op(self, op):
        return "op{%s}" % ";".join([self.value(op.fn), self.value(op._identity), repr(op.commutative),
                                    repr(op.fieldwise), repr(op.name), repr(op.kinds), repr(op.atomic)])

    def _device_function(self, d):
        options = getattr(d, "targetoptions", None)
        if options is None:   # the simulator's stand-in
            options = {k: getattr(d, k, None) for k in ("_device", "_fastmath", "_debug")}
        # `link` (files) and `extensions` (objects) must be empty to be pinned
        opts = ",".join("%s=%s" % (k, self.value(tuple(v) if v.__class__ is list else v))
                        for k, v in sorted(options.items()))
        return "device{%s;%s}" % (self._function(d.py_func), opts)


def _names(code):
    """The global (and attribute) names of ``code`` and the code nested in it."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, pytypes.CodeType):
            names |= _names(c)
    return names


def _is_numba(cls):
    return cls.__module__.split(".")[0] == "numba"


def _library(module, what):
    """``what`` (text) at the version of library module ``module``; unpinned
    unless ``module`` belongs to one of ``_LIBRARIES``."""
    root = module.split(".")[0]
    if root not in _LIBRARIES:
        raise _Unpinned("module %s" % module)
    version = getattr(sys.modules.get(root), "__version__", "")
    if module.startswith("numba.cuda"):
        version += "/" + _numba_cuda_version()
    return "%s@%s" % (what, version)


def _library_object(v):
    """The name of a function, ufunc or type a library module (or the builtins)
    defines, if ``v`` is one: found again under its module and qualified name."""
    module = getattr(v, "__module__", None)
    name = getattr(v, "__qualname__", None) or getattr(v, "__name__", None)
    if not isinstance(module, str) or not isinstance(name, str) or module.split(".")[0] not in _LIBRARIES:
        return None
    found = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    if found is not v:
        return None
    return "library:" + _library(module, "%s.%s" % (module, name))


_cuda_version = []


def _numba_cuda_version():
    if not _cuda_version:
        try:
            from importlib.metadata import version
            _cuda_version.append(version("numba-cuda"))
        except Exception:  # noqa: BLE001 - not installed as a distribution
            _cuda_version.append("unknown")
    return _cuda_version[0]
