"""The benchmarks' ``sts`` subcommands: ``bench`` and ``plan``. Registered through
``sts.commands``; the benchmark modules are imported only when a command runs."""

from __future__ import annotations

import argparse
import sys

from sidecar import ConfigError, one_line


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``sts bench`` and ``sts plan`` to the ``sts`` parser."""
    from benchmarks.cli_args import add_bench_arguments, add_plan_arguments

    bench = sub.add_parser("bench", help="STS vs the blocking foreachBatch baseline, or --knee")
    add_bench_arguments(bench)
    bench.set_defaults(func=_run_bench)
    plan = sub.add_parser("plan", help="GPUs needed for a traffic profile (seed formula)")
    add_plan_arguments(plan)
    plan.set_defaults(func=_run_plan)


def _run_bench(args: argparse.Namespace) -> int:
    try:
        from benchmarks.bench import run_bench_command
    except ImportError as e:
        return _missing(e, "bench")
    from spark_ext.exceptions import SparkStartError

    try:
        return run_bench_command(args)
    except (FileNotFoundError, ValueError) as e:  # a profile or option that does not fit
        raise ConfigError(f"{one_line(e)} (sts bench)") from None
    except SparkStartError as e:
        print(f"sts: {e} (sts bench)", file=sys.stderr)
        return 1


def _run_plan(args: argparse.Namespace) -> int:
    try:
        from benchmarks.plan import run_plan
    except ImportError as e:
        return _missing(e, "plan")
    return run_plan(args)


def _missing(e: ImportError, command: str) -> int:
    print(f"sts: needs module {e.name!r}; install the Spark side with: "
          f"pip install 'sts-spark[spark]' (sts {command})", file=sys.stderr)
    return 2
