"""``sts plan`` (and, where the benchmarks are not installed, a ``sts bench`` that says where
they are): registered through the ``sts.commands`` entry point; the planner is imported only
when the command runs."""

from __future__ import annotations

import argparse
import importlib.util
import sys

#: Where ``sts bench`` lives: the benchmarks of a source checkout, not in the wheel.
BENCH_ELSEWHERE = ("sts: sts bench runs from a source checkout of sts-spark (the benchmarks are "
                   "not in the wheel): git clone the project, bash scripts/install.sh, then "
                   "sts bench (sts bench)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``sts plan`` to the ``sts`` parser, and a ``sts bench`` that explains itself
    where ``benchmarks`` cannot be imported."""
    from sts_capacity.plan import add_plan_arguments, run_plan

    plan = sub.add_parser("plan", help="GPUs needed for a traffic profile (seed formula)")
    add_plan_arguments(plan)
    plan.set_defaults(func=run_plan)
    if importlib.util.find_spec("benchmarks") is None:
        bench = sub.add_parser("bench", help="in a source checkout only", add_help=False,
                               prefix_chars="\x00")  # every argument taken as it is
        bench.add_argument("args", nargs="*")
        bench.set_defaults(func=_bench_elsewhere)


def _bench_elsewhere(args: argparse.Namespace) -> int:
    print(BENCH_ELSEWHERE, file=sys.stderr)
    return 2
