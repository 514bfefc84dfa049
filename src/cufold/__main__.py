"""Command line: ``python -m cufold demo`` and ``python -m cufold bench SUITE``."""

import argparse
import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from . import bench
        return bench.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m cufold", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="seed 002's reduce and scan demonstration")
    demo.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    sub.add_parser("bench", help="benchmarks: python -m cufold bench {reduce,scan,bykey,hist,segmented,calls} --help")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run
        return run(seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
