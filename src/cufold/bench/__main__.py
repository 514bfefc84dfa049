"""``python -m cufold.bench SUITE`` (same as ``python -m cufold bench SUITE``)."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
