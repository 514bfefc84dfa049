"""The dispatcher: which algorithm runs when the caller names none.

One place for the choices, so that a measurement that moves a threshold moves
it here. Thresholds are in elements and were measured on an H100 (see
bench/results/); the simulator takes the same paths.
"""

from . import reduce as _reduce

#: Inputs up to this many tiles go to one block (seed 002's latency path).
SINGLE_BLOCK_TILES = 1


def algorithms(kind):
    """The names ``algorithm=`` accepts for ``kind`` ('reduce' or 'scan')."""
    if kind == "reduce":
        return _reduce.ALGORITHMS
    if kind == "scan":
        from . import scan
        return scan.ALGORITHMS
    raise ValueError("cufold: no algorithms of kind %r; kinds are 'reduce', 'scan'" % (kind,))


def choose_reduce(op, acc_vt, n, device_id):
    """Single block for inputs of at most a tile, else the single-launch
    last-block reduction (deterministic, no atomics on the data)."""
    tile = _reduce.tile_for(acc_vt, acc_vt)
    if n <= SINGLE_BLOCK_TILES * tile.nt * tile.vt:
        return "single_block"
    return "single_pass"
