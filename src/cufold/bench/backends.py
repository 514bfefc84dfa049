"""Which libraries are here, and one array world to run them in.

:func:`probe` imports each library the benchmark may compare (torch, CuPy,
Numba's CUDA target, ``cuda.compute``, cufold itself) and records why the ones
that cannot run are skipped ("cuda.compute not importable: ..."). Nothing
raises: a missing peer is a line in the report.

:class:`Backend` holds the *primary* array library (torch if usable, else
CuPy, else Numba): it uploads inputs, makes zero-copy views of them for the
other libraries (through ``__cuda_array_interface__``), fetches results back
to NumPy, synchronizes, and provides the CUDA-event clock. Everything runs on
the legacy default stream, the current stream of all four libraries unless
the caller changed it.

CuPy is switched to CUB (``CUPY_ACCELERATORS=cub`` before its import, then
``set_routine_accelerators(['cub'])`` and ``set_reduction_accelerators(['cub'])``)
so ``cupy.sum``/``argmax``/``cumsum`` use ``cub::Device*``.
"""

from __future__ import annotations

import gc
import importlib
import os
import platform
import subprocess
import sys

import numpy as np

from .timing import DEFAULT_L2_BYTES, EventClock

__all__ = ["Skip", "Env", "probe", "Backend", "version_of"]

LIBS = ("cufold", "torch", "cupy", "numba", "cuda.compute")


class Skip(Exception):
    """A candidate that cannot run here; the message says why."""


def version_of(dist):
    try:
        from importlib import metadata
        return metadata.version(dist)
    except Exception:
        return None


class Env:
    """Result of :func:`probe`: usable modules and reasons for the rest."""

    def __init__(self):
        self.modules = {}     # lib -> module (only usable ones)
        self.skipped = {}     # lib -> reason
        self.versions = {}
        self.notes = []
        self.simulator = False

    def has(self, lib):
        return lib in self.modules

    def plan_note(self, lib):
        """What a dry run says of a candidate of ``lib``: "will run", or why it is skipped."""
        return "will run" if self.has(lib) else "skipped: %s" % self.skipped.get(lib, "unavailable")

    def get(self, lib):
        if lib not in self.modules:
            raise Skip(self.skipped.get(lib, "%s unavailable" % lib))
        return self.modules[lib]

    @property
    def primary(self):
        for lib in ("torch", "cupy", "numba"):
            if lib in self.modules:
                return lib
        return None

    def summary_lines(self):
        lines = []
        for lib in LIBS:
            if lib in self.modules:
                v = self.versions.get(lib)
                lines.append("  %-13s ok%s" % (lib, (" (%s)" % v) if v else ""))
            else:
                lines.append("  %-13s skipped: %s" % (lib, self.skipped.get(lib, "?")))
        return lines


def _short(e):
    msg = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, msg[0] if msg else "")


def parse_cupy_accelerators(spec):
    """``"cub"`` (routine and reduction), ``"cub:none"`` (routine:reduction),
    ``"none"`` -> (routine list, reduction list)."""
    spec = (spec or "cub").strip()
    parts = spec.split(":") if ":" in spec else [spec, spec]
    if len(parts) != 2:
        raise ValueError("cufold bench: bad --cupy-accelerators %r (e.g. cub, cub:none, none)" % spec)

    def names(p):
        items = [x.strip() for x in p.split(",") if x.strip() and x.strip() != "none"]
        for x in items:
            if x not in ("cub", "cutensor", "cutensornet"):
                raise ValueError("cufold bench: unknown CuPy accelerator %r" % x)
        return items
    return names(parts[0]), names(parts[1])


def probe(importer=None, libs=LIBS, cupy_accelerators="cub"):
    """Import what is importable; never raises. ``importer`` (for tests)
    replaces :func:`importlib.import_module`; ``cupy_accelerators`` as in
    :func:`parse_cupy_accelerators` (default: CUB for routines and reductions)."""
    routine_acc, reduction_acc = parse_cupy_accelerators(cupy_accelerators)
    imp = importer or importlib.import_module
    env = Env()
    env.versions["python"] = platform.python_version()
    env.versions["numpy"] = np.__version__

    if "numba" in libs or "cufold" in libs:
        try:
            numba = imp("numba")
            env.versions["numba"] = getattr(numba, "__version__", None)
            env.versions["numba-cuda"] = version_of("numba-cuda")
            from numba import config
            env.simulator = bool(getattr(config, "ENABLE_CUDASIM", False))
        except Exception as e:  # pragma: no cover - numba is a dependency
            env.notes.append("numba not importable: %s" % _short(e))

    if "torch" in libs:
        try:
            torch = imp("torch")
            env.versions["torch"] = torch.__version__
            if not torch.cuda.is_available():
                env.skipped["torch"] = "torch: CUDA not available"
            else:
                env.modules["torch"] = torch
                env.versions["torch.cuda"] = getattr(torch.version, "cuda", None)
        except Exception as e:
            env.skipped["torch"] = "torch not importable: %s" % _short(e)

    if "cupy" in libs:
        if "cupy" not in sys.modules:
            os.environ.setdefault("CUPY_ACCELERATORS", ",".join(routine_acc))
        try:
            cupy = imp("cupy")
            env.versions["cupy"] = cupy.__version__
            if cupy.cuda.runtime.getDeviceCount() < 1:
                env.skipped["cupy"] = "cupy: no CUDA device"
            else:
                env.modules["cupy"] = cupy
                try:
                    from cupy import _core
                    _core.set_routine_accelerators(routine_acc)
                    _core.set_reduction_accelerators(reduction_acc)
                    env.versions["cupy.accelerators"] = "routine=%s reduction=%s" % (
                        _acc_names(_core.get_routine_accelerators()),
                        _acc_names(_core.get_reduction_accelerators()))
                except Exception as e:
                    env.notes.append("cupy: could not select CUB: %s" % _short(e))
                    env.versions["cupy.accelerators"] = "unknown (CUPY_ACCELERATORS=%s)" % (
                        os.environ.get("CUPY_ACCELERATORS"),)
        except Exception as e:
            env.skipped["cupy"] = "cupy not importable: %s" % _short(e)

    if "numba" in libs:
        try:
            ncuda = imp("numba.cuda")
            if env.simulator:
                env.skipped["numba"] = "numba.cuda is the CPU simulator (NUMBA_ENABLE_CUDASIM=1)"
            elif not ncuda.is_available():
                env.skipped["numba"] = "numba.cuda: no CUDA GPU"
            else:
                env.modules["numba"] = ncuda
        except Exception as e:
            env.skipped["numba"] = "numba.cuda not importable: %s" % _short(e)

    if "cuda.compute" in libs:
        try:
            cc = imp("cuda.compute")
            env.modules["cuda.compute"] = cc
            env.versions["cuda.compute"] = version_of("cuda-cccl") or getattr(cc, "__version__", None)
        except Exception as e:
            env.skipped["cuda.compute"] = "cuda.compute not importable: %s" % _short(e)

    if "cufold" in libs:
        try:
            cf = imp("cufold")
            env.modules["cufold"] = cf
            env.versions["cufold"] = getattr(cf, "__version__", None)
            rev = _git_rev(cf)
            if rev:
                env.versions["cufold.git"] = rev
        except Exception as e:
            env.skipped["cufold"] = "cufold not importable: %s" % _short(e)
    return env


def _acc_names(accs):
    names = {1: "cub", 2: "cutensor", 3: "cutensornet"}
    try:
        return ",".join(names.get(int(a), str(a)) for a in accs) or "none"
    except Exception:
        return str(accs)


def _git_rev(mod):
    try:
        d = os.path.dirname(os.path.abspath(mod.__file__))
        out = subprocess.run(["git", "-C", d, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        if out.returncode != 0:
            return None
        rev = out.stdout.strip()
        dirty = subprocess.run(["git", "-C", d, "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, timeout=5)
        return rev + ("+dirty" if dirty.stdout.strip() else "")
    except Exception:
        return None


def _module_root(obj):
    return type(obj).__module__.split(".", 1)[0]


class Backend:
    """The primary array library, views for the others, clock and fetches."""

    def __init__(self, env, cufold_input=None):
        self.env = env
        self.name = env.primary
        if self.name is None:
            raise Skip("no GPU array library: need torch or cupy with CUDA (or numba.cuda on a GPU); "
                       + "; ".join(env.skipped.get(k, k) for k in ("torch", "cupy", "numba")))
        self.cufold_input = cufold_input or self.name
        if self.cufold_input not in env.modules:
            raise Skip("--cufold-input %s: %s" % (self.cufold_input,
                                                   env.skipped.get(self.cufold_input, "unavailable")))
        self.clock = self._make_clock()

    # --- device ------------------------------------------------------------
    def sync(self):
        n = self.name
        if n == "torch":
            self.env.modules["torch"].cuda.synchronize()
        elif n == "cupy":
            self.env.modules["cupy"].cuda.Device().synchronize()
        else:
            self.env.modules["numba"].synchronize()

    def _make_clock(self):
        n = self.name
        if n == "torch":
            torch = self.env.modules["torch"]
            sleep = getattr(torch.cuda, "_sleep", None)
            hold = (lambda: sleep(200_000)) if sleep is not None else None  # ~100 us of GPU time
            return EventClock("torch.cuda.Event", lambda: torch.cuda.Event(enable_timing=True),
                              lambda a, b: a.elapsed_time(b), self.sync, hold=hold)
        if n == "cupy":
            cupy = self.env.modules["cupy"]
            return EventClock("cupy.cuda.Event", cupy.cuda.Event,
                              cupy.cuda.get_elapsed_time, self.sync)
        ncuda = self.env.modules["numba"]
        return EventClock("numba.cuda.event", lambda: ncuda.event(timing=True),
                          ncuda.event_elapsed_time, self.sync)

    def device_info(self):
        """name, compute capability, L2 bytes (64 MiB if unknown), SMs, memory."""
        info = {"name": None, "cc": None, "l2_bytes": None, "sms": None, "memory_bytes": None}
        m = self.env.modules
        if "torch" in m:
            try:
                p = m["torch"].cuda.get_device_properties(0)
                info.update(name=p.name, cc="%d.%d" % (p.major, p.minor), sms=p.multi_processor_count,
                            memory_bytes=int(p.total_memory))
                l2 = getattr(p, "L2_cache_size", None)
                if l2:
                    info["l2_bytes"] = int(l2)
            except Exception:
                pass
        if "cupy" in m and (info["l2_bytes"] is None or info["name"] is None):
            try:
                p = m["cupy"].cuda.runtime.getDeviceProperties(0)
                name = p.get("name")
                if isinstance(name, bytes):
                    name = name.decode(errors="replace")
                info["name"] = info["name"] or name
                info["cc"] = info["cc"] or "%d.%d" % (p["major"], p["minor"])
                info["sms"] = info["sms"] or p.get("multiProcessorCount")
                info["memory_bytes"] = info["memory_bytes"] or p.get("totalGlobalMem")
                if info["l2_bytes"] is None and p.get("l2CacheSize"):
                    info["l2_bytes"] = int(p["l2CacheSize"])
            except Exception:
                pass
        if "numba" in m and (info["l2_bytes"] is None or info["name"] is None):
            try:
                d = m["numba"].get_current_device()
                name = d.name.decode() if isinstance(d.name, bytes) else d.name
                info["name"] = info["name"] or name
                info["cc"] = info["cc"] or "%d.%d" % tuple(d.compute_capability)
                if info["l2_bytes"] is None:
                    info["l2_bytes"] = int(d.L2_CACHE_SIZE)
            except Exception:
                pass
        info["l2_known"] = info["l2_bytes"] is not None
        if info["l2_bytes"] is None:
            info["l2_bytes"] = DEFAULT_L2_BYTES
        if "cupy" in m:
            try:
                rt = m["cupy"].cuda.runtime
                info["driver"] = rt.driverGetVersion()
                info["runtime"] = rt.runtimeGetVersion()
            except Exception:
                pass
        return info

    # --- arrays ------------------------------------------------------------
    def upload(self, host):
        host = np.ascontiguousarray(host)
        n = self.name
        if n == "torch":
            torch = self.env.modules["torch"]
            return torch.from_numpy(host).to("cuda")
        if n == "cupy":
            return self.env.modules["cupy"].asarray(host)
        return self.env.modules["numba"].to_device(host)

    def empty_like(self, arr, dtype=None):
        root = _module_root(arr)
        if root == "torch":
            torch = self.env.modules["torch"]
            if dtype is None:
                return torch.empty_like(arr)
            return torch.empty(arr.shape, dtype=torch_dtype(torch, dtype), device=arr.device)
        if root == "cupy":
            return self.env.modules["cupy"].empty(arr.shape, dtype=dtype or arr.dtype)
        ncuda = self.env.modules["numba"]
        return ncuda.device_array(arr.shape, dtype=dtype or arr.dtype)

    def view(self, arr, kind):
        """Zero-copy view of a device array for library ``kind``."""
        if kind == "cufold":
            kind = self.cufold_input
        if kind == "primary" or kind == _module_root(arr) or (kind == "numba" and hasattr(arr, "copy_to_host")):
            return arr
        mod = self.env.get(kind)
        if kind == "torch":
            return mod.as_tensor(arr, device="cuda")
        if kind == "cupy":
            return mod.asarray(arr)
        if kind == "numba":
            return mod.as_cuda_array(arr)
        raise Skip("no %s view" % kind)

    def copy_fn(self):
        """(label, fn(pair)) for a device-to-device copy ``pair = (src, dst)``."""
        n = self.name
        if n == "torch":
            def copy(p):
                return p[1].copy_(p[0])
            return "copy (torch copy_)", copy
        if n == "cupy":
            def copy(p):
                p[1].data.copy_from_device(p[0].data, p[0].nbytes)
                return p[1]
            return "copy (cupy memcpy)", copy

        def copy(p):
            p[1].copy_to_device(p[0])
            return p[1]
        return "copy (numba memcpy)", copy

    def fetch(self, obj, idx=None):
        """A result as NumPy (tuples stay tuples); ``idx`` gathers 1-D results
        on the device first (big scans)."""
        if obj is None:
            return None
        if isinstance(obj, (tuple, list)):
            return tuple(self.fetch(o) for o in obj)
        root = _module_root(obj)
        if root == "torch":
            t = obj
            if idx is not None and t.dim() == 1 and t.numel() > len(idx):
                torch = self.env.modules["torch"]
                t = t[torch.as_tensor(idx, device=t.device)]
            return t.detach().cpu().numpy()
        if root == "cupy":
            a = obj
            if idx is not None and a.ndim == 1 and a.size > len(idx):
                a = a[self.env.modules["cupy"].asarray(idx)]
            return a.get()
        if hasattr(obj, "copy_to_host"):
            a = obj.copy_to_host()
        elif hasattr(obj, "__cuda_array_interface__") and "numba" in self.env.modules:
            a = self.env.modules["numba"].as_cuda_array(obj).copy_to_host()
        else:
            return np.asarray(obj)
        if idx is not None and a.ndim == 1 and a.size > len(idx):
            a = a[idx]
        return a

    def release(self):
        """Return cached device memory between sizes."""
        gc.collect()
        m = self.env.modules
        try:
            if "torch" in m:
                m["torch"].cuda.empty_cache()
        except Exception:
            pass
        try:
            if "cupy" in m:
                m["cupy"].get_default_memory_pool().free_all_blocks()
        except Exception:
            pass


class SharedCopies:
    """Device copies of a case's host data, shared by its candidates: each named array
    uploaded once, then viewed once per library (``lib`` None: the upload itself)."""

    def __init__(self, backend):
        self.backend, self._dev = backend, {}

    def get(self, what, lib, host):
        """The copy of ``what`` for ``lib``; ``host()`` makes its host data (first use only)."""
        key = (what, lib)
        got = self._dev.get(key)
        if got is None:
            prim = self._dev.get((what, None))
            if prim is None:
                prim = self._dev[(what, None)] = self.backend.upload(host())
            got = self._dev[key] = self.backend.view(prim, lib) if lib else prim
        return got


def torch_dtype(torch, dtype):
    return {"float32": torch.float32, "float64": torch.float64, "int32": torch.int32,
            "int64": torch.int64, "float16": torch.float16}[np.dtype(dtype).name]
