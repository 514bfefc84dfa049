"""GPU time per call for the tools' tables: ``gpu_us(call)``; ``rotating_us(fn, inputs)``
calls ``fn`` on the inputs in turn (rotated through more than L2).

``reps`` back-to-back calls between two CUDA events, queued behind a ``torch.cuda._sleep``
so the host enqueues the whole batch before the GPU reaches it (GPU time, not the host's);
the median of ``batches`` batches, in microseconds per call, after one untimed call (it
compiles and plans). Used by tune_bykey, axis_probe, axis_tune and dist_probe.
"""
import statistics

import torch


def gpu_us(call, reps=20, batches=3, sleep_cycles=20_000_000):
    call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(batches):
        torch.cuda._sleep(sleep_cycles)          # ~10 ms at ~2 GHz: the host queues the batch meanwhile
        start.record()
        for _ in range(reps):
            call()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(per_call)


def rotating_us(fn, inputs, reps=24, batches=5):
    """GPU time per call of ``fn(x)`` over ``inputs`` in turn (queued behind a sleep)."""
    fn(inputs[0])
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(batches):
        torch.cuda._sleep(20_000_000)
        s.record()
        for i in range(reps):
            fn(inputs[i % len(inputs)])
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / reps)
    return statistics.median(times)
