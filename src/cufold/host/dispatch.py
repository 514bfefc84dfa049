"""The dispatcher: which algorithm runs when the caller names none.

One place for the choices, so that a measurement that moves a threshold moves
it here. Thresholds are in elements (tiles of the family's own tile size) and
were measured on an H100 and an H200 (see bench/results/); the simulator takes
the same paths. Each algorithm family registers its algorithm names here when
it is imported (:func:`register`); nothing here imports a family.
"""

#: Inputs up to this many tiles go to one block (seed 002's latency path).
SINGLE_BLOCK_TILES = 1

#: Scans of at least this many elements use reduce-then-scan (None: never).
#: Since the single-pass kernel fits 8 blocks per SM (32 registers, packed
#: look-back states) it wins at every size on an H200: 90% of copy at 2^28
#: against reduce-then-scan's 63% (tools/tune_scan.py, 2026-11-21).
REDUCE_THEN_SCAN_MIN = None

_ALGORITHMS = {}


def register(kind, names):
    """Family ``kind``'s algorithm names (what ``algorithm=`` accepts), in order."""
    _ALGORITHMS[kind] = tuple(names)


def algorithms(kind):
    """The names ``algorithm=`` accepts for ``kind``: 'reduce', 'scan',
    'reduce_by_key', 'histogram' or 'segmented_scan'.

    Example: ``cufold.algorithms("reduce")`` -> ``('single_pass', 'two_pass', ...)``
    """
    if kind not in _ALGORITHMS:
        raise ValueError("cufold: no algorithms of kind %r; kinds are %s"
                         % (kind, ", ".join(map(repr, sorted(_ALGORITHMS)))))
    return _ALGORITHMS[kind]


def choose_reduce(n, tile):
    """Single block for inputs of at most a tile (``tile``: the accumulator's
    tile), else the single-launch last-block reduction (deterministic, no
    atomics on the data)."""
    if n <= SINGLE_BLOCK_TILES * tile.nt * tile.vt:
        return "single_block"
    return "single_pass"


def choose_scan(n, tile):
    """Single block for at most a tile, else the single-pass look-back scan (one
    launch)."""
    if n <= SINGLE_BLOCK_TILES * tile.nt * tile.vt:
        return "single_block"
    if REDUCE_THEN_SCAN_MIN is not None and n >= REDUCE_THEN_SCAN_MIN:
        return "reduce_then_scan"
    return "single_pass"
