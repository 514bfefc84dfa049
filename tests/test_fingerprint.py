"""cufold._fingerprint: a stable text of what a user's function computes, or None.

The fingerprint decides whether a kernel made from a user's operator may come
from the disk cache of an earlier process, so it must be equal wherever the
same source runs with the same values, differ whenever the code or a value it
uses differs, and be None when something it uses cannot be pinned down.

Run: PYTHONPATH=src python -m pytest tests/test_fingerprint.py -q
"""

import functools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import cuda

import cufold
from cufold._fingerprint import fingerprint

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _define(source, **values):
    """The namespace ``source`` defines, run with ``values`` as its first globals
    (a module of its own: its functions' globals are this namespace)."""
    scope = {"np": np, "cuda": cuda, "cufold": cufold, "math": __import__("math"), **values}
    exec(textwrap.dedent(source), scope)
    return scope


# One source using every kind of thing a fingerprint pins down.
RICH = """
    SCALE = 2.5
    OFFSET = np.float32(0.5)
    KIND = np.dtype(np.int64)
    LIMITS = (1, 2.0, "three", None, (4, b"5"))

    def helper(x, k=3, *, shift=1):
        return x * SCALE + k + shift + OFFSET

    twice = cuda.jit(device=True)(lambda x: x * 2)
    inner = cufold.Op(lambda a, b: a + b, identity=0, commutative=True)

    def make(power):
        def op(a, b):
            return math.exp(helper(a)) + twice(b) ** power + abs(LIMITS[0]) + max(a, b) + np.sqrt(b)
        return op

    op = cufold.Op(make(2), identity=lambda vt: 0, commutative=True)
    plain = lambda a, b: max(a, b)
"""

_PRINT_RICH = """
import json, textwrap, numpy as np, math, cufold
from numba import cuda
scope = {"np": np, "cuda": cuda, "cufold": cufold, "math": math}
exec(textwrap.dedent(%r), scope)
from cufold._fingerprint import fingerprint
print(json.dumps([fingerprint(scope[k]) for k in ("op", "plain", "helper", "twice", "inner")]))
""" % RICH


def _in_new_process(code):
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    return got.stdout


def test_same_source_same_fingerprint_in_every_process():
    """The same source gives the same fingerprints in two new processes and in this
    one (no addresses, file names, line numbers or orderings of one process)."""
    first, second = (json.loads(_in_new_process(_PRINT_RICH)) for _ in range(2))
    scope = _define(RICH)
    here = [fingerprint(scope[k]) for k in ("op", "plain", "helper", "twice", "inner")]
    assert None not in first
    assert first == second == here
    assert len(set(here)) == len(here)


def test_pinned_down_by_code():
    """Different code, constants or constant types never collide."""
    variants = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a + 1, lambda a, b: a + 2,
                lambda a, b: a + 1.0, lambda a, b: a + True, lambda a, b: b + a, lambda x, y: x + y,
                lambda a, b: max(a, b), lambda a, b: min(a, b), lambda a, b: (a, b)[0]]
    prints = [fingerprint(f) for f in variants]
    assert None not in prints
    assert len(set(prints)) == len(prints)
    assert fingerprint(lambda a, b: a + b) == prints[0]           # another function, same code


def test_pinned_down_by_global_values():
    """A global's value is part of the fingerprint: a changed value, type or dtype changes it."""
    source = "def op(a, b):\n    return a * SCALE + b\n"
    prints = [fingerprint(_define(source, SCALE=v)["op"])
              for v in (2.0, 3.0, 2, np.float32(2.0), np.float64(2.0), np.int64(2), (2.0,), "2")]
    assert None not in prints
    assert len(set(prints)) == len(prints)
    assert fingerprint(_define(source, SCALE=2.0)["op"]) == prints[0]


def test_mutated_global_changes_the_fingerprint():
    """``SCALE = 2.0`` then ``3.0``: a new fingerprint (and so a new disk key), and back."""
    scope = _define("SCALE = 2.0\ndef op(a, b):\n    return a * SCALE + b\n")
    before = fingerprint(scope["op"])
    scope["SCALE"] = 3.0
    after = fingerprint(scope["op"])
    scope["SCALE"] = 2.0
    assert None not in (before, after) and before != after
    assert fingerprint(scope["op"]) == before


def test_pinned_down_by_closure_values():
    def make(k):
        return lambda a, b: a * k + b

    assert fingerprint(make(2)) == fingerprint(make(2)) != fingerprint(make(3))
    assert fingerprint(make(2)) != fingerprint(make(2.0))
    assert fingerprint(make(np.float32(2))) != fingerprint(make(np.float64(2)))


def test_pinned_down_by_default_arguments():
    def positional(k):
        def op(a, b, k=k):
            return a * k + b
        return op

    def keyword(k):
        def op(a, b, *, k=k):
            return a * k + b
        return op

    assert fingerprint(positional(2)) == fingerprint(positional(2)) != fingerprint(positional(3))
    assert fingerprint(keyword(2)) == fingerprint(keyword(2)) != fingerprint(keyword(3))
    assert fingerprint(positional(2)) != fingerprint(keyword(2))


def test_builtins_by_name_and_unbound_names():
    """A builtin is pinned by its name; a global shadowing it is pinned by its own value.
    A name bound nowhere is pinned as unbound (NameError when compiled), and binding it
    changes the fingerprint."""
    builtin = fingerprint(_define("def op(a, b):\n    return max(a, b)\n")["op"])
    shadowed = _define("def max(a, b):\n    return a\ndef op(a, b):\n    return max(a, b)\n")
    assert None not in (builtin, fingerprint(shadowed["op"]))
    assert builtin != fingerprint(shadowed["op"])
    scope = _define("def op(a, b):\n    return later(a, b)\n")
    unbound = fingerprint(scope["op"])
    scope["later"] = lambda a, b: a
    assert unbound is not None and fingerprint(scope["op"]) not in (None, unbound)


def test_library_modules_and_functions_by_name():
    """Modules of NumPy, math and Numba, and what they define, are pinned by name
    (``math.exp`` through the module); the names used tell them apart."""
    uses = ["return math.exp(a) + b", "return math.log(a) + b", "return np.sqrt(a) + b",
            "return np.float32(a) + b", "return cuda.laneid + a + b", "return exp(a) + b"]
    prints = [fingerprint(_define("def op(a, b):\n    %s\n" % u, exp=np.exp)["op"]) for u in uses]
    assert None not in prints
    assert len(set(prints)) == len(prints)
    assert fingerprint(_define("def op(a, b):\n    return exp(a)\n", exp=np.exp)["op"]) != \
        fingerprint(_define("def op(a, b):\n    return exp(a)\n", exp=__import__("math").exp)["op"])


@pytest.mark.parametrize("value", [np.arange(3.0), object(), [1, 2], {"k": 1}, json, functools.partial(max, 0),
                                   tuple(range(1000)), {1, 2}],
                         ids=["ndarray", "object", "list", "dict", "module of another package", "partial",
                              "long tuple", "set"])
def test_unpinnable_values_give_none(value):
    """A global, closure cell or default argument that is not plain data, a library
    module or a function makes the fingerprint None (the kernel compiles as before)."""
    source = "def op(a, b):\n    return a + b * len(VALUE)\n"
    assert fingerprint(_define(source, VALUE=value)["op"]) is None
    assert fingerprint((lambda v: lambda a, b: a + b * v)(value)) is None
    assert fingerprint((lambda v: (lambda a, b, k=v: a + b))(value)) is None
    assert fingerprint(cufold.Op((lambda v: lambda a, b: a + b * v)(value))) is None


def test_objects_without_code_give_none():
    assert fingerprint(functools.partial(max)) is None
    assert fingerprint(object()) is None
    assert fingerprint(np.add) is not None    # a NumPy ufunc: by name


def test_recursion_through_helpers():
    """A helper's code, globals and defaults are the caller's too, however deep."""
    source = """
        def leaf(x):
            return x * FACTOR
        def middle(x, k=K):
            return leaf(x) + k
        def op(a, b):
            return middle(a) + b
    """
    base = fingerprint(_define(source, FACTOR=2.0, K=1)["op"])
    assert base is not None
    assert fingerprint(_define(source, FACTOR=3.0, K=1)["op"]) != base
    assert fingerprint(_define(source, FACTOR=2.0, K=2)["op"]) != base
    assert fingerprint(_define(source.replace("x * FACTOR", "x - FACTOR"), FACTOR=2.0, K=1)["op"]) != base
    assert fingerprint(_define(source, FACTOR=[2.0], K=1)["op"]) is None     # unpinnable deep inside


def test_recursion_through_device_functions_and_operators():
    """Numba device functions (by their Python function and compile options) and
    cufold operators (function, identity, flags) are followed."""
    source = """
        step = cuda.jit(device=True)(lambda x: x * STEP)
        inner = cufold.Op(lambda a, b: a + b, identity=IDENTITY, commutative=True)
        def op(a, b):
            return step(a) + inner(a, b)
    """
    base = fingerprint(_define(source, STEP=2, IDENTITY=0)["op"])
    assert base is not None
    assert fingerprint(_define(source, STEP=3, IDENTITY=0)["op"]) != base
    assert fingerprint(_define(source, STEP=2, IDENTITY=1)["op"]) != base
    fast = _define(source.replace("device=True", "device=True, fastmath=True"), STEP=2, IDENTITY=0)
    assert fingerprint(fast["op"]) not in (None, base)


def test_operator_fingerprint_covers_identity_and_flags():
    fn = lambda a, b: a + b  # noqa: E731
    prints = [fingerprint(o) for o in (cufold.Op(fn), cufold.Op(fn, identity=0), cufold.Op(fn, identity=0.0),
                                        cufold.Op(fn, identity=0, commutative=True),
                                        cufold.Op(fn, identity=lambda vt: 0), cufold.Op(fn, name="other"))]
    assert None not in prints
    assert len(set(prints)) == len(prints)
    assert fingerprint(cufold.Op(fn, identity=0)) == prints[1]
    assert all(fingerprint(op) is not None for op in cufold.ops.BUILTINS.values())


def test_cycles_terminate():
    """Self-recursion, mutual recursion through globals and a closure holding its
    own function all give a fingerprint (met-before functions are referred to)."""
    mutual = _define("""
        def ping(a, b):
            return pong(b, a) if a > b else a
        def pong(a, b):
            return ping(a, b - 1)
    """)
    assert fingerprint(mutual["ping"]) is not None
    assert fingerprint(mutual["ping"]) != fingerprint(mutual["pong"])

    def outer():
        def me(a, b):
            return me(a, b - 1) if b else a
        return me

    assert fingerprint(outer()) == fingerprint(outer()) is not None
    scope = _define("def op(a, b):\n    return a\nop.__defaults__ = (op,)\n")
    assert fingerprint(scope["op"]) is not None


def test_operator_changed_after_its_device_code_is_not_pinned():
    """Numba compiled the operator's device function with the values of then: once a
    global it uses changes in this process, the operator has no fingerprint (its
    kernels compile, never go to or come from the disk cache), until it is back."""
    scope = _define("SCALE = 2.0\ndef f(a, b):\n    return a * SCALE + b\n")
    op = cufold.Op(scope["f"])
    before = op.fingerprint()
    op.combine(np.float32)
    assert op.fingerprint() == before is not None
    scope["SCALE"] = 3.0
    assert op.fingerprint() is None
    scope["SCALE"] = 2.0
    assert op.fingerprint() == before
