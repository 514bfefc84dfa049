"""Tune ``cufold.reduce_by_key_into`` on seed 001's box: every kernel variant, one table.

On the GPU machine (about a minute, mostly Numba compiling ~15 kernels)::

    python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl
    PYTHONPATH=$PWD/.site:$PWD/src python3 tools/tune_bykey.py

Without a GPU (registers, spills, shared memory and SASS counts for sm_90; needs
``ptxas``, and ``nvdisasm`` for the counts, on PATH or in ``$PTXAS``/``$NVDISASM``)::

    PYTHONPATH=src python tools/tune_bykey.py --compile-only
    PYTHONPATH=src python tools/tune_bykey.py --compile-only --types    # type-check every kernel

Options: ``--variants a,b`` (label prefixes), ``--orders ordered,shifted``, ``--side 100``,
``--per-cell 10``, ``--reps 20``.

Every variant is one ``reduce_by_key_into`` call (``check=False`` unless its label says
otherwise) on a zeroed float64 ``out`` of 10^6 cells, 10^7 int32 keys and float64 values
(114 MiB read). Time = CUDA events around ``reps`` back-to-back calls queued behind a
``torch.cuda._sleep`` (GPU time, not the host's), median of 3 batches, per call. Each
variant is first checked against ``numpy.bincount``. ``floor`` is the ``atomic`` kernel
with every key out of range (loads and compares, no update): what the inputs' reads cost
in our own kernel. The second table is the number of ``out`` updates each scheme issues
(a NumPy model of the kernels), in millions.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

# label, algorithm, environment (tile NTxVT[xSLOTS], run-head limit, load hint), check
VARIANTS = [
    ("default", None, {}, False),
    ("default check=True", None, {}, True),
    ("runs 256x4", "runs", {}, False),
    ("runs2 128x2", "runs2", {}, False),
    ("runs2 256x1", "runs2", {"CUFOLD_BYKEY_TILE": "256x1"}, False),
    ("adaptive 128x2", "adaptive", {}, False),
    ("adaptive 256x2", "adaptive", {"CUFOLD_BYKEY_TILE": "256x2"}, False),
    ("adaptive 128x1", "adaptive", {"CUFOLD_BYKEY_TILE": "128x1"}, False),
    ("adaptive runs<=24", "adaptive", {"CUFOLD_BYKEY_RUNS": "24"}, False),
    ("adaptive ld.ca", "adaptive", {"CUFOLD_BYKEY_LOAD": "ca"}, False),
    ("atomic 256x4", "atomic", {}, False),
    ("warp 256x4", "warp", {}, False),
    ("table 512x4x2048", "table", {}, False),
    ("floor (atomic, no valid key)", "atomic", {}, False),
]
ENV_KEYS = ("CUFOLD_BYKEY_TILE", "CUFOLD_BYKEY_RUNS", "CUFOLD_BYKEY_LOAD")
MODELLED = ("atomic", "warp", "runs", "runs2", "adaptive", "table")


def set_env(env):
    from cufold.device import bykey as BK
    for k in ENV_KEYS:
        os.environ.pop(k, None)
    os.environ.update(env)
    BK.plan.cache_clear()


# --- the number of updates, modelled --------------------------------------------------------

def tile_of(algorithm):
    """(items per thread, threads) of the GPU default tile (``bykey.GPU_TILES``)."""
    from cufold.device import bykey as BK
    nt, vt, _ = BK.GPU_TILES.get(algorithm, BK.GPU_TILES[None])
    return vt, nt


def updates(keys, algorithm, vt=4, nt=256, runs_max=16):
    """How many updates of ``out`` a scheme issues (keys all valid; n a multiple of 64)."""
    from cufold.device import bykey as BK
    width = 32 * BK.LANE_ITEMS.get(algorithm, 1)         # elements in a row (runs2: 64)
    n = keys.size - keys.size % width
    if algorithm == "atomic":
        return n
    rows = keys[:n].reshape(-1, width)
    left = np.empty_like(rows)
    left[:, 1:] = rows[:, :-1]
    left[1:, 0] = rows[:-1, -1]
    left[0, 0] = -1
    first_row = (np.arange(rows.shape[0]) % vt) == 0       # a span's first row: lane 0 is a head
    left[first_row, 0] = -1
    heads = rows != left
    count = heads.sum(1)
    if algorithm in ("runs", "runs2"):
        return int(count.sum())
    direct = count == width
    by_runs = (count <= runs_max * width // 32) & ~direct
    if algorithm in ("warp", "adaptive"):
        def distinct(r):                                  # distinct keys in each row of r
            return 1 + (np.diff(np.sort(r, axis=1), axis=1) != 0).sum(1)
        if algorithm == "warp":
            return int(distinct(rows).sum())
        # adaptive: each half of a row of 64 grouped apart
        groups = distinct(rows[:, :32]) + distinct(rows[:, 32:])
        other = ~direct & ~by_runs
        # a run continued from a runs row into a non-runs row (or the reverse) is split
        return int(count[direct].sum() + count[by_runs].sum() + groups[other].sum())
    # table: the distinct keys of the tile's table rows
    other = ~direct & ~by_runs
    tile_rows = nt * vt // 32
    tile_of = np.repeat(np.arange(rows.shape[0]) // tile_rows, 32)
    sel = np.repeat(other, 32)
    pairs = np.unique(tile_of[sel].astype(np.int64) * (1 << 32) + rows.reshape(-1)[sel])
    return int(count[direct].sum() + count[by_runs].sum() + pairs.size)


# --- GPU timing --------------------------------------------------------------------------------

def run_gpu(args):
    import torch
    from cufold.bench.bykey import box_keys, box_values
    from gpu_timing import gpu_us
    from cufold.device import bykey as BK
    try:
        import cupy
        import cupyx
    except ImportError:
        cupy = cupyx = None
    m = args.side ** 3
    orders = args.orders.split(",")
    variants = [v for v in VARIANTS if not args.variants or any(v[0].startswith(p) for p in args.variants.split(","))]
    print("%s, torch %s, %d^3 cells x %d, int32 keys, float64 values; us per call (x: best peer / us)"
          % (torch.cuda.get_device_name(), torch.__version__, args.side, args.per_cell))
    table, models, best = {}, {}, {}
    for order in orders:
        keys_h = box_keys(args.side, args.per_cell, order, 12345)
        values_h = box_values(keys_h.size, 12345)
        ref = np.bincount(keys_h, weights=values_h, minlength=m)
        keys = torch.as_tensor(keys_h.astype(np.int32), device="cuda")
        values = torch.as_tensor(values_h, device="cuda")
        out = torch.zeros(m, dtype=torch.float64, device="cuda")
        tiny = torch.zeros(1, dtype=torch.float64, device="cuda")
        models[order] = {a: updates(keys_h, a, *tile_of(a)) / 1e6 for a in MODELLED}
        peers = {"torch.index_add_": lambda: out.index_add_(0, keys, values)}
        if cupyx is not None:
            ck, cv, co = cupy.asarray(keys), cupy.asarray(values), cupy.asarray(out)
            peers["cupyx.scatter_add"] = lambda: cupyx.scatter_add(co, ck, cv)
        for label, call in peers.items():
            out.zero_()
            call()
            torch.cuda.synchronize()
            ok = np.allclose(out.cpu().numpy(), ref, rtol=1e-9, atol=1e-9)
            table[(label, order)] = (gpu_us(call, args.reps), ok)
        best[order] = min(t for (lab, o), (t, ok) in table.items() if o == order and lab in peers)
        for label, alg, env, check in variants:
            set_env(env)
            floor = label.startswith("floor")
            target = tiny if floor else out

            def call(alg=alg, check=check, target=target):
                BK.reduce_by_key_into(keys, values, target, algorithm=alg, check=check)
            t0 = time.time()
            try:
                out.zero_()
                call()
                torch.cuda.synchronize()
                ok = floor or np.allclose(out.cpu().numpy(), ref, rtol=1e-9, atol=1e-9)
                table[(label, order)] = (gpu_us(call, args.reps), ok)
            except Exception as e:  # report and go on
                table[(label, order)] = (None, "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:80]))
            sys.stderr.write("  %-8s %-30s %.1f s\n" % (order, label, time.time() - t0))
    set_env({})
    labels = ["torch.index_add_", "cupyx.scatter_add"] + [v[0] for v in variants]
    print("%-30s" % "variant" + "".join("%18s" % o for o in orders))
    for label in labels:
        cells = []
        for order in orders:
            got = table.get((label, order))
            if got is None:
                cells.append("%18s" % "-")
            elif got[0] is None:
                cells.append("%18s" % "ERROR")
            else:
                t, ok = got
                cells.append("%9.1f %5.2fx%s" % (t, best[order] / t, "  " if ok is True else " !"))
        print("%-30s" % label + "".join(cells))
    errors = [(k, v[1]) for k, v in table.items() if v[1] is not True]
    for (label, order), why in errors:
        print("!! %s %s: %s" % (label, order, "result differs from numpy.bincount" if why is False else why))
    print("updates of out (millions, modelled; default tiles, runs<=16):")
    print("%-30s" % "scheme" + "".join("%18s" % o for o in orders))
    for a in MODELLED:
        print("%-30s" % a + "".join("%18.2f" % models[o][a] for o in orders))
    print("targets: ordered, shifted <= best peer / 2; random <= best peer (default row, check=False)")


# --- no GPU: compile for sm_90 --------------------------------------------------------------

def compile_only(args):
    """Compile the variants (default types), or with ``--types`` every algorithm over a
    matrix of operators, key, value and output dtypes and the int64 index path, for
    sm_90: the simulator never type-checks. Kernels go through ``bykey.run`` (a Program)
    with kernels that compile instead of binding a launch."""
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
    from numba import cuda

    from sm90 import pretend_sm90
    pretend_sm90()
    import cufold
    from cufold.host import arrays as _arrays
    from cufold.device import bykey as BK
    L = BK._launch

    def arr(dt, n=1 << 20):
        return _arrays.Arr(0x10000, (n,), (1,), np.dtype(dt), n, "numba", None, 0)

    BK._resident_blocks = lambda *a: 132 * 4          # the grid of 'block' (no GPU to ask)
    BK._launch.workspace = lambda dev, stream, nbytes: (0x10000, arr(np.uint8, max(nbytes, 256)))
    ptxas = os.environ.get("PTXAS") or shutil.which("ptxas")
    nvdisasm = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    tmp = tempfile.mkdtemp(prefix="tune_bykey_")
    lines = []

    class Compiled:
        name = "compiled"

        def bind(self, *args):
            return lambda *new: None

    def fake_kernel_for(fn, key, kargs):
        sig = tuple(L._nbtype(a) for a in kargs)
        t0 = time.time()
        ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
        line = "%s compiled in %.1f s" % (key[0], time.time() - t0)
        # runs/table's only clz is the run scan's segment start, on a 32-bit ballot: a
        # 64-bit one (Numba types uint32 | uint32 as uint64) gives wrong sums on a GPU only
        if key[1].algorithm in ("runs", "table") and "clz.b64" in ptx:
            line += " | !! clz.b64 in the run scan"
        if ptxas and not args.types:
            line += " | " + sass_summary(ptx)
        lines.append(line)
        return Compiled()

    def sass_summary(ptx):
        path = os.path.join(tmp, "k.ptx")
        for version in (None, "9.0", "8.0"):      # NVVM's PTX may be newer than this ptxas
            with open(path, "w") as f:
                f.write(ptx if version is None else re.sub(r"^\.version .*$", ".version " + version, ptx,
                                                           flags=re.M))
            r = subprocess.run([ptxas, "-arch=sm_90", "-v", path, "-o", path + ".cubin"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
        else:
            return "ptxas failed: " + r.stderr.strip().splitlines()[-1][:100]
        used = re.search(r"Used (\d+) registers", r.stderr)
        spill = re.search(r"(\d+) bytes spill stores", r.stderr)
        smem = re.search(r"(\d+) bytes smem", r.stderr)
        out = "%s regs, %s B spilled, %s B smem" % (used and used.group(1), spill and spill.group(1),
                                                  smem.group(1) if smem else "0")
        if nvdisasm:
            sass = subprocess.run([nvdisasm, "-c", path + ".cubin"], capture_output=True, text=True).stdout
            out += " | " + " ".join("%s %d" % (k, len(re.findall(pat, sass))) for k, pat in
                                    (("RED", r"\bREDG?\."), ("ATOMG", r"\bATOMG\."), ("ATOMS", r"\bATOMS\."),
                                     ("SHFL", r"\bSHFL\."), ("MATCH", r"\bMATCH\."), ("LDG", r"\bLDG\.")))
        return out

    L.kernel_for = fake_kernel_for

    def compile_call(op, kd, vd, od, alg, check=False, wide=False, deterministic=False):
        n, m = 10 ** 7, 10 ** 6
        p = BK.plan(op, np.dtype(kd), np.dtype(vd), np.dtype(od), m, n, 0, alg, deterministic, check)
        if wide:
            p = p._replace(spec=p.spec._replace(wide=True))
        out = arr(od, m)
        status = (arr(np.int64, 2), arr(np.int64, 1))
        BK.run(p, arr(kd, n), arr(vd, n), out, status, 1 if check else 0, 0)
        return p

    print("sm_90 (ptxas %s, nvdisasm %s)" % (ptxas or "not found", nvdisasm or "not found"))
    if args.types:
        cases = [(cufold.plus, np.int32, np.float64, np.float64), (cufold.maximum, np.uint64, np.float32, np.float32),
                 (cufold.minimum, np.int8, np.int32, np.int32), (cufold.multiplies, np.int64, np.int64, np.int64),
                 (cufold.bit_or, np.uint16, np.uint32, np.uint32), (cufold.plus, np.int16, np.bool_, np.uint64),
                 (cufold.plus, np.int32, np.float16, np.float32)]
        for alg in BK.ALGORITHMS:
            for i, (op, kd, vd, od) in enumerate(cases):
                for wide in (False, True):
                    try:
                        compile_call(op, kd, vd, od, alg, check=bool(i % 2), wide=wide,
                                     deterministic=alg == "sorted" and i == 1)
                        status = "ok"
                    except Exception as e:  # report every failure
                        status = "FAILED %s: %s" % (type(e).__name__, str(e).strip().splitlines()[-1][:120])
                    print("  %-9s %-10s keys %-7s values %-8s out %-8s wide=%-5s %s (%d kernels)"
                          % (alg, op.name, np.dtype(kd), np.dtype(vd), np.dtype(od), wide, status, len(lines)))
                    del lines[:]
        return
    print("per kernel: registers, spills, shared memory, SASS instruction counts (static)")
    seen = set()
    for label, alg, env, check in VARIANTS:
        if args.variants and not any(label.startswith(p) for p in args.variants.split(",")):
            continue
        set_env(env)
        spec = None
        try:
            spec = BK.plan(cufold.plus, np.dtype(np.int32), np.dtype(np.float64), np.dtype(np.float64), 10 ** 6,
                           10 ** 7, 0, alg, False, check).spec
            if spec in seen:
                continue
            seen.add(spec)
            compile_call(cufold.plus, np.int32, np.float64, np.float64, alg, check)
        except Exception as e:  # report and go on
            lines.append("FAILED %s: %s" % (type(e).__name__, str(e).strip().splitlines()[-1][:120]))
        for line in lines:
            print("%-22s %-9s %s" % (label, spec.algorithm if spec else alg, line))
        del lines[:]
    set_env({})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--types", action="store_true", help="with --compile-only: every algorithm over a dtype matrix")
    ap.add_argument("--variants", default="")
    ap.add_argument("--orders", default="ordered,shifted,random")
    ap.add_argument("--side", type=int, default=100)
    ap.add_argument("--per-cell", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    if args.compile_only:
        compile_only(args)
    else:
        run_gpu(args)


if __name__ == "__main__":
    main()
