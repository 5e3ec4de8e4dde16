"""The benchmarks' ``sts`` subcommand: ``bench``. Registered through ``sts.commands`` in a
source checkout (the benchmarks are not in the wheel; ``sts plan`` is
:mod:`sts_capacity`'s); the benchmark modules are imported only when it runs."""

from __future__ import annotations

import argparse
import sys

from sidecar import ConfigError, one_line


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``sts bench`` to the ``sts`` parser."""
    from benchmarks.cli_args import add_bench_arguments

    bench = sub.add_parser("bench", help="STS vs the blocking foreachBatch baseline, or --knee")
    add_bench_arguments(bench)
    bench.set_defaults(func=_run_bench)


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


def _missing(e: ImportError, command: str) -> int:
    print(f"sts: needs module {e.name!r}; install the Spark side with: "
          f"pip install 'sts-spark[spark]' (sts {command})", file=sys.stderr)
    return 2
