"""Speed of cufold's device functions in Numba's CPU simulator (issue #23's benchmark).

Each (function, size) runs in a new process, as a user's script would: one first
(compiling) call, then ``--reps`` timed calls. Prints a table: the first call, the
median of the timed calls, their spread (max / min), and seconds per million items.

    python tools/sim_speed.py                       # every function at 2^16
    python tools/sim_speed.py --sizes 16,20 --reps 2
    python tools/sim_speed.py --functions sum,inclusive_scan --sizes 12,14,16,18

Targets (a 2-core machine): <= 5 s at 2^16 and <= 80 s at 2^20 per call, about
linear in the size, and a spread under 2x.
"""

import argparse
import json
import os
import subprocess
import sys
import time

FUNCTIONS = ("sum", "argmax", "mean_var", "inclusive_scan", "segmented_reduce", "reduce_by_key_into",
             "histogram")

# One call of each function on n items; `x` float32 in [0, 1), `cells` int32 keys.
_CHILD = r"""
import os, sys, time, json
os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
import numpy as np
import cufold
from numba import cuda

name, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(n)
x = cuda.to_device(rng.random(n, dtype=np.float32))
if name == "segmented_reduce":
    cuts = np.sort(rng.integers(0, n + 1, 511))
    offsets = cuda.to_device(np.concatenate([[0], cuts, [n]]).astype(np.int64))
    call = lambda: cufold.segmented_reduce(x, offsets)
elif name == "reduce_by_key_into":
    keys = cuda.to_device(rng.integers(0, 1000, n).astype(np.int32))
    out = cuda.to_device(np.zeros(1000, np.float32))
    call = lambda: cufold.reduce_by_key_into(keys, x, out)
elif name == "histogram":
    call = lambda: cufold.histogram(x, bins=64, range=(0.0, 1.0))
else:
    f = getattr(cufold, name)
    call = lambda: f(x)
times = []
for _ in range(reps + 1):
    t = time.perf_counter()
    r = call()
    cuda.synchronize()
    times.append(time.perf_counter() - t)
print("RESULT", json.dumps(times))
"""


def run_one(name, n, reps, timeout):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, name, str(n), str(reps)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after %d s" % timeout}
    if proc.returncode != 0 or "RESULT" not in proc.stdout:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:120]}
    times = json.loads(proc.stdout.split("RESULT", 1)[1])
    timed = sorted(times[1:])
    return {"first": times[0], "median": timed[len(timed) // 2], "spread": timed[-1] / timed[0],
            "process": time.perf_counter() - t0}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--functions", default=",".join(FUNCTIONS))
    p.add_argument("--sizes", default="16", help="log2 sizes, comma separated")
    p.add_argument("--reps", type=int, default=3, help="timed calls after the first")
    p.add_argument("--timeout", type=int, default=900, help="seconds per process")
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args(argv)
    rows = []
    print("%-20s %8s %9s %9s %7s %10s" % ("function", "items", "first s", "median s", "spread", "s / M items"))
    for name in a.functions.split(","):
        for e in (int(s) for s in a.sizes.split(",")):
            r = run_one(name, 1 << e, a.reps, a.timeout)
            r.update(function=name, items=1 << e)
            rows.append(r)
            if "error" in r:
                print("%-20s %8d  %s" % (name, 1 << e, r["error"]))
            else:
                print("%-20s %8d %9.2f %9.2f %6.2fx %10.1f" % (name, 1 << e, r["first"], r["median"],
                                                              r["spread"], r["median"] / (1 << e) * 1e6))
            sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
