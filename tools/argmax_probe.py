"""Where packed argmax by key spends its time, against the one-field max (GPU only).

``PYTHONPATH=.site:src python3 tools/argmax_probe.py``: 2^22 float32 values into 200k
power-law int64 keys (``bench bykey-tuple``'s data), sorted and shuffled. For each
variant (scatter rows, tile): CUDA-event median of the whole call, then the kernels'
own durations from torch.profiler (CUPTI)."""

import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import cufold  # noqa: E402
from cufold.bench.bykey_tuple import power_law_keys  # noqa: E402
from cufold.device import bykey_tuple  # noqa: E402

E, N = 1 << 22, 200_000
VARIANTS = [("default", {}), ("words cas", {"CUFOLD_PACKED_MODE": "cas"}),
            ("cas 128x4", {"CUFOLD_PACKED_MODE": "cas", "CUFOLD_BYKEY_TILE": "128x4"}), ("rows=warp", {"CUFOLD_BYKEY_TUPLE_ROWS": "warp"}),
            ("tile 128x2", {"CUFOLD_BYKEY_TILE": "128x2"}), ("tile 256x8", {"CUFOLD_BYKEY_TILE": "256x8"}),
            ("tile 128x4", {"CUFOLD_BYKEY_TILE": "128x4"}), ("runs 8", {"CUFOLD_BYKEY_RUNS": "8"}),
            ("runs 31", {"CUFOLD_BYKEY_RUNS": "31"})]


def timed(call, reps=20, batches=7):
    """GPU time per call: ``reps`` calls queued back to back behind a sleep (so the host's
    launch time hides), median over ``batches``."""
    call(); torch.cuda.synchronize()
    ts = []
    for _ in range(batches):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(2_000_000)
        a.record()
        for _ in range(reps):
            call()
        b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(ts)


def kernels(call):
    from torch.profiler import ProfilerActivity, profile
    call(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            call()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" and ev.count:
            out[ev.key[:60]] = ev.device_time_total / ev.count if hasattr(ev, "device_time_total") else ev.cuda_time_total / ev.count
    return out


def main():
    for order in ("sorted", "shuffled"):
        keys = torch.as_tensor(power_law_keys(E, N, order)).cuda()
        x = torch.randn(E, device="cuda")
        vmax = torch.full((N,), -np.inf, device="cuda")
        pos = torch.full((N,), np.iinfo(np.int64).max, dtype=torch.int64, device="cuda")
        m1 = torch.full((N,), -np.inf, device="cuda")
        for label, env in VARIANTS:
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            bykey_tuple._forget_plans()
            from cufold.device import bykey
            if hasattr(bykey, "_forget_plans"):
                bykey._forget_plans()
            arg = lambda: cufold.reduce_by_key_into(keys, x, (vmax, pos), cufold.argmax, check=False)  # noqa: E731
            one = lambda: cufold.reduce_by_key_into(keys, x, m1, cufold.maximum, check=False)  # noqa: E731
            try:
                ta, t1 = timed(arg), timed(one)
                ks, k1 = kernels(arg), kernels(one)
                print("%-9s %-11s argmax %7.1f us  max %7.1f us  ratio %.2f  argmax kernels: %s | max: %s" % (
                    order, label, ta, t1, ta / t1, "; ".join("%s %.1f" % kv for kv in ks.items()),
                    "; ".join("%s %.1f" % kv for kv in k1.items())), flush=True)
            except Exception as exc:  # noqa: BLE001
                print(order, label, "failed:", exc, flush=True)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


if __name__ == "__main__":
    main()
