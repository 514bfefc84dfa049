"""Time cufold's reduce kernels against torch/cupy at large sizes (development aid).
Usage: CUFOLD_TILE=256x16 PPT=16 python tools/tune_reduce.py [cases]
(PPT: the last block's partials per thread, which bounds the grid: grid <= threads x PPT)"""
import importlib, os, sys
import numpy as np, torch, cupy
import cufold

# PPT and BLOCKS_PER_SM change compiled code the disk cache's key does not see
os.environ["CUFOLD_CACHE"] = "0"
R = importlib.import_module("cufold.device.reduce")
if os.environ.get("PPT"):
    R.PARTIALS_PER_THREAD = int(os.environ["PPT"])
    R._plan.cache_clear()
if os.environ.get("BLOCKS_PER_SM"):      # the grid's cap: this many blocks per SM (else what fits)
    _sms = torch.cuda.get_device_properties(0).multi_processor_count
    R._resident_blocks = lambda dev, nt: _sms * int(os.environ["BLOCKS_PER_SM"])
    R._plan.cache_clear()

def gpu_time(fn, bufs, reps=20):
    for b in bufs[:2]:
        fn(b)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (a, b) in enumerate(ev):
        x = bufs[i % len(bufs)]
        a.record(); fn(x); b.record()
    torch.cuda.synchronize()
    return float(np.median([a.elapsed_time(b) for a, b in ev]) * 1e3)

def cp(x):
    return cupy.asarray(x)

cases = sys.argv[1].split(",") if len(sys.argv) > 1 else ["sum28", "sum24"]
tile = (os.environ.get("CUFOLD_TILE", "default") + "/ppt" + os.environ.get("PPT", "8")
        + ("/bps" + os.environ["BLOCKS_PER_SM"] if os.environ.get("BLOCKS_PER_SM") else ""))
for case in cases:
    logn = int(case[-2:]); n = 1 << logn
    kind = case[:-2]
    nb = max(3, min(16, (3 << 28) // (n * 4)))
    bufs = [torch.randn(n, device="cuda") for _ in range(nb)]
    cbufs = [cp(b) for b in bufs]
    if kind == "sum":
        ours = gpu_time(lambda x: cufold.sum(x), bufs)
        peers = {"torch": gpu_time(lambda x: torch.sum(x), bufs), "cupy": gpu_time(lambda x: cupy.sum(x), cbufs)}
        ok = abs(float(cufold.sum(bufs[0]).item()) - bufs[0].double().sum().item()) < 1e-3 * n ** 0.5
    elif kind == "argmax":
        ours = gpu_time(lambda x: cufold.argmax(x), bufs)
        peers = {"torch": gpu_time(lambda x: torch.argmax(x), bufs), "cupy": gpu_time(lambda x: cupy.argmax(x), cbufs)}
        ok = int(cufold.argmax(bufs[0]).item()) == int(torch.argmax(bufs[0]).item())
    elif kind == "meanvar":
        ours = gpu_time(lambda x: cufold.mean_var(x), bufs)
        peers = {"torch": gpu_time(lambda x: torch.var_mean(x, correction=0), bufs)}
        m, v = cufold.mean_var(bufs[0])
        ok = abs(float(v.item()) - bufs[0].double().var(correction=0).item()) < 1e-4
    best = min(peers.values())
    print("%-10s tile=%-16s cufold %8.1f us (%5.2f TB/s) | %s | ratio best/cufold %.3f %s" % (
        case, tile, ours, n * 4 / ours / 1e6, " ".join("%s %.1f" % kv for kv in peers.items()), best / ours, "OK" if ok else "WRONG"))
    del bufs, cbufs; torch.cuda.empty_cache()
