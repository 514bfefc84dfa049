"""The dispatcher: which algorithm runs when the caller names none.

One place for the choices, so that a measurement that moves a threshold moves
it here. Thresholds are in elements and were measured on an H100 (see
bench/results/); the simulator takes the same paths.
"""

from . import reduce as _reduce

#: Inputs up to this many tiles go to one block (seed 002's latency path).
SINGLE_BLOCK_TILES = 1

#: Scans of at least this many elements use reduce-then-scan (None: never).
#: Since the single-pass kernel fits 8 blocks per SM (32 registers, packed
#: look-back states) it wins at every size on an H200: 90% of copy at 2^28
#: against reduce-then-scan's 63% (tools/tune_scan.py, 2026-11-21).
REDUCE_THEN_SCAN_MIN = None


def algorithms(kind):
    """The names ``algorithm=`` accepts for ``kind``: 'reduce', 'scan',
    'reduce_by_key' or 'histogram'.

    Example: ``cufold.algorithms("reduce")`` -> ``('single_pass', 'two_pass', ...)``
    """
    import importlib
    modules = {"reduce": "reduce", "scan": "scan", "reduce_by_key": "bykey", "histogram": "histogram"}
    if kind not in modules:
        raise ValueError("cufold: no algorithms of kind %r; kinds are %s" % (kind, ", ".join(map(repr, modules))))
    return importlib.import_module("cufold.device." + modules[kind]).ALGORITHMS


def choose_reduce(op, acc_vt, n, device_id):
    """Single block for inputs of at most a tile, else the single-launch
    last-block reduction (deterministic, no atomics on the data)."""
    tile = _reduce.tile_for(acc_vt, acc_vt)
    if n <= SINGLE_BLOCK_TILES * tile.nt * tile.vt:
        return "single_block"
    return "single_pass"


def choose_scan(op, in_vt, acc_vt, n):
    """Single block for at most a tile, else the single-pass look-back scan (one
    launch)."""
    from . import scan
    tile = scan.tile_for(in_vt, acc_vt)
    if n <= SINGLE_BLOCK_TILES * tile.nt * tile.vt:
        return "single_block"
    if REDUCE_THEN_SCAN_MIN is not None and n >= REDUCE_THEN_SCAN_MIN:
        return "reduce_then_scan"
    return "single_pass"
