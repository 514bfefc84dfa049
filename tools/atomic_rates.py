"""What a float64 global atomic costs, by address pattern: the model behind by-key tuning.

Each kernel issues ``--ops`` (10^7) ``cuda.atomic.add`` (a fire-and-forget ``RED``) on a
float64 array of 2^20 slots (8 MiB, L2-resident) from a grid-stride loop (8 blocks of
256 per SM), the addresses made from the op's index. Per warp instruction, ``active``
lanes (32, 16, 4) issue one each:

- ``random``      each lane a random slot (32 lines per instruction)
- ``coalesced``   consecutive slots (8 sectors, 2 lines)
- ``sector``      a slot every 32 B (32 sectors in 8 lines)
- ``line``        a slot every 128 B (32 lines, in order)
- ``clusters4``   4 random lines, 8 consecutive slots in each (8 sectors)
- ``same8``       4 random slots, 8 lanes on each (lanes on one address)
- ``random+load`` ``random``, each op also reading an int32 and a float64 streamed from
  two 10^7-element arrays (seed 001's random keys without the key dependence)

Run on the GPU machine: ``PYTHONPATH=$PWD/.site:$PWD/src python3 tools/atomic_rates.py``;
``--compile-only`` compiles for sm_90 without a GPU. H200 results and what they mean:
docs/performance.md, "Session 10".
"""

import argparse
import statistics

import numpy as np
from numba import cuda, float64, uint32

SLOTS = 1 << 20
MASK = SLOTS - 1
PATTERNS = ["random", "coalesced", "sector", "line", "clusters4", "same8", "random+load"]


@cuda.jit(device=True)
def _hash(x):
    x = uint32(x) * uint32(2654435761)
    x = x ^ (x >> uint32(15))
    x = x * uint32(2246822519)
    return x ^ (x >> uint32(13))


def make(pattern, active):
    """The kernel of one pattern: ``kernel(out, ops, ints, floats)``."""
    @cuda.jit
    def kernel(out, ops, ints, floats):
        lane = cuda.laneid
        warps = (cuda.gridDim.x * cuda.blockDim.x) // 32
        warp = cuda.grid(1) // 32
        while warp * active < ops:
            op = warp * active + lane              # the op this lane issues
            if lane < active and op < ops:
                v = float64(1.0)
                if pattern == 0 or pattern == 6:   # random
                    slot = _hash(op) & MASK
                elif pattern == 1:                 # coalesced
                    slot = op & MASK
                elif pattern == 2:                 # sector
                    slot = (op * 4) & MASK
                elif pattern == 3:                 # line
                    slot = (op * 16) & MASK
                elif pattern == 4:                 # clusters4
                    slot = (_hash(warp * 4 + lane // 8) & (MASK - 15)) + (lane & 7)
                else:                              # same8
                    slot = _hash(warp * 4 + lane // 8) & MASK
                if pattern == 6:
                    v = floats[op] + float64(ints[op])
                cuda.atomic.add(out, slot, v)
            warp += warps
    return kernel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ops", type=int, default=10_000_000)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--compile-only", action="store_true")
    a = p.parse_args()
    if a.compile_only:
        from numba import types

        from sm90 import pretend_sm90
        pretend_sm90()
        sig = (types.float64[::1], types.int64, types.int32[::1], types.float64[::1])
        for i, name in enumerate(PATTERNS):
            ptx, _ = cuda.compile_ptx(make(i, 32).py_func, sig, cc=(9, 0))
            assert "red.global.add.f64" in ptx or "atom.global.add.f64" in ptx, name
        print("compiled", len(PATTERNS), "patterns for sm_90")
        return
    dev = cuda.get_current_device()
    out = cuda.to_device(np.zeros(SLOTS))
    ints = cuda.to_device(np.arange(a.ops, dtype=np.int32))
    floats = cuda.to_device(np.ones(a.ops))
    blocks = dev.MULTIPROCESSOR_COUNT * 8
    start, end = cuda.event(), cuda.event()
    name = getattr(dev, "name", "?")
    name = name.decode() if isinstance(name, bytes) else name
    print("%s: %d float64 atomic adds into 2^20 slots (8 MiB), grid-stride %d x 256" % (name, a.ops, blocks))
    print("%-12s %6s %10s %12s" % ("pattern", "active", "us", "Gops/s"))
    for active in (32, 16, 4):
        for i, name in enumerate(PATTERNS):
            if active < 32 and name in ("clusters4", "same8", "random+load"):
                continue
            k = make(i, active)
            k[blocks, 256](out, a.ops, ints, floats)
            times = []
            for _ in range(5):
                start.record()
                for _ in range(a.reps):
                    k[blocks, 256](out, a.ops, ints, floats)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3 / a.reps)
            t = statistics.median(times)
            print("%-12s %6d %10.1f %12.1f" % (name, active, t, a.ops / t / 1e3))


if __name__ == "__main__":
    main()
