"""Compile cufold's kernels for sm_90 on a machine without a GPU (the tools' --compile-only
paths): Numba's device functions ask the current device for its compute capability, so
answer 9.0, and the launch module's questions about the device (compute capability, SMs,
L2 bytes) get an H100's answers. Call ``pretend_sm90()`` before the first compile."""

import numba.cuda.dispatcher as _dispatcher


class _Hopper:
    compute_capability = (9, 0)


def pretend_sm90():
    _dispatcher.get_current_device = lambda: _Hopper()
    from cufold.host import launch
    launch.compute_capability = lambda dev: (9, 0)   # (feature rows' 16-byte atomics need sm_90)
    launch.sm_count = lambda dev: 132                # (grids are sized by it)
    launch.l2_bytes = lambda dev: 50 << 20           # (the adaptive feature rows compare out with it)
