"""The ``phalanx`` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import sys


def _bench(args: argparse.Namespace) -> int:
    import importlib

    from bench import SUITES

    module = importlib.import_module(SUITES[args.suite])
    return module.main(quick=args.quick, json_path=args.json, seeds=args.seeds)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_solver_demo

    return run_solver_demo()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="phalanx", description="All-or-nothing PodGroup placement for Kubernetes.")
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="run a benchmark suite")
    from bench import SUITES

    bench.add_argument("suite", choices=sorted(SUITES), help="which benchmark")
    bench.add_argument("--quick", action="store_true", help="the short version that `make bench` runs")
    bench.add_argument("--json", metavar="FILE", help="write results as JSON (and a markdown table beside it)")
    bench.add_argument("--seeds", type=int, help="seeds per case (default: 20 full, 3 quick)")
    bench.set_defaults(func=_bench)

    demo = sub.add_parser("demo", help="place the KEP-6277 user stories and LWS-shaped groups on a generated cluster")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
