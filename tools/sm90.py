"""Compile cufold's kernels for sm_90 on a machine without a GPU (the tools' --compile-only
paths): Numba's device functions ask the current device for its compute capability, so
answer 9.0. Call ``pretend_sm90()`` before the first compile."""

import numba.cuda.dispatcher as _dispatcher


class _Hopper:
    compute_capability = (9, 0)


def pretend_sm90():
    _dispatcher.get_current_device = lambda: _Hopper()
