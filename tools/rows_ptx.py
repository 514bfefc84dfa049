"""Compile the feature-row kernels (``cufold.device.rows``) of the PyG shapes for sm_90
without a GPU and report what ptxas makes of them: registers, spills, resident warps
per SM, and static SASS counts of the instructions that matter per row (global loads,
atomics, shuffles, votes, match).

    PYTHONPATH=src python tools/rows_ptx.py                  # the default table
    PYTHONPATH=src python tools/rows_ptx.py --sass DIR       # also PTX, cubin and SASS in DIR
    PYTHONPATH=src python tools/rows_ptx.py into:plus:16 segments:maximum:64 det:plus:16

A case is ``what:op:F`` with ``what`` one of ``into`` (reduce_by_key_into, int64 keys,
float32 rows and out), ``det`` (the same with deterministic=True: the ordered rows after
the radix grouping) or ``segments`` (segmented_reduce over int64 CSR offsets); ``op`` a
cufold operator's name. ``cuobjdump`` is found as in tools/scan_ptx.py (``CUOBJDUMP``).
"""
import os
import re
import sys

import numpy as np

from sm90 import pretend_sm90

pretend_sm90()

import cufold  # noqa: E402
import importlib  # noqa: E402
from cufold.host import arrays as _arrays  # noqa: E402

import scan_ptx  # noqa: E402  (the launch capture, ptxas and cuobjdump)

L = importlib.import_module("cufold.host.launch")
P = importlib.import_module("cufold.host.programs")
ROWS = importlib.import_module("cufold.device.rows")
BK = importlib.import_module("cufold.device.bykey")

E, N = 4_000_000, 200_000


def _view(dtype, shape):
    strides = (shape[1], 1)
    return _arrays.Arr(0x200000, tuple(shape), strides, np.dtype(dtype), shape[0] * shape[1], "numba", None, 0)


class _Status:
    kernel = (scan_ptx._arr(np.int64, (2,)), scan_ptx._arr(np.int64, (1,)))
    epoch = 0


BK._status = lambda dev, stream, check: (_Status, 1 if check else 0)
L.kept_zeros = lambda purpose, dev, stream, nbytes: scan_ptx._fake(nbytes)


def kernels(case):
    """[(name, python fn, numba signature, threads)] of one case."""
    what, opname, F = case.split(":")
    F = int(F)
    op = getattr(cufold, opname)
    vals, out = _view(np.float32, (E, F)), _view(np.float32, (N, F))
    keys = scan_ptx._arr(np.int64, (E,))
    del scan_ptx.launched[:]
    sig = P.signature
    if what in ("into", "det"):
        ROWS._plan_into(("rows", op, None, what == "det", False, sig(keys), sig(vals), sig(out), 0, None),
                        keys, vals, out)
    elif what == "segments":
        offsets = scan_ptx._arr(np.int64, (N + 1,))
        ROWS._plan_segments((sig(vals), sig(offsets), 0, op, None, None, False, None), vals, offsets)
    else:
        raise SystemExit("unknown case %r" % case)
    found = []
    for fn, key, nt, args in scan_ptx.launched:
        if not (isinstance(key, tuple) and key and key[0] == "rows"):
            continue
        spec = key[1]
        tag = "%s/P%dV%dS%dU%d/%s" % (case, spec.lanes, spec.vec, spec.steps, spec.unroll,
                                        "level0" if spec.transform is None and not found else "pieces")
        found.append((tag, fn, tuple(L._nbtype(a) for a in args), nt))
    return found


#: SASS opcodes counted (statically, in the whole kernel)
COUNTED = ("LDG", "REDG", "ATOMG", "SHFL", "VOTE", "MATCH", "STG", "BRA")


def sass_counts(path):
    text = open(path).read()
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text)
    return {c: sum(1 for o in ops if o == c) for c in COUNTED}, len(ops)


DEFAULT_CASES = ["into:plus:%d" % F for F in (3, 16, 31, 64, 256)] + \
                ["into:maximum:%d" % F for F in (16, 64)] + \
                ["segments:plus:%d" % F for F in (16, 64)] + ["det:plus:16"]


def main(argv):
    sass_dir, argv = scan_ptx.sass_option(argv)
    print("%-40s %5s %9s %9s  %s" % ("kernel", "regs", "spills", "warps/SM", "static SASS (with --sass)"))
    for case in argv or DEFAULT_CASES:
        for name, fn, sig, nt in kernels(case):
            regs, smem, spills, bps = scan_ptx.compile_one(name, fn, sig, nt, sass_dir)
            extra = ""
            if sass_dir:
                path = os.path.join(sass_dir, re.sub(r"[^\w.-]", "_", name) + ".sass")
                counts, total = sass_counts(path)
                extra = "%d instr; " % total + " ".join("%s %d" % kv for kv in counts.items() if kv[1])
            print("%-40s %5d %4d/%-4d %9d  %s" % (name, regs, spills[0], spills[1], bps * nt // 32, extra),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
