"""The ``sts`` command line: a thin shell around the subcommands packages register.

Each installed package registers its own subcommands through the entry-point
group ``sts.commands`` (``register(subparsers)`` adds its parsers and sets
``func`` on each); so ``sts sidecar`` works with only the sidecar installed and
the Spark-side commands appear when their package is there. Logging is set up
first; a command imports what it needs only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import NoReturn

logger = logging.getLogger(__name__)

#: Entry-point group of ``sts`` subcommand providers.
COMMANDS_GROUP = "sts.commands"

#: Providers tried when the distribution's metadata is not installed (a source checkout).
_BUILTIN_PROVIDERS = ("sidecar.commands:register", "sts_harness.commands:register",
                      "sts_capacity.commands:register", "benchmarks.commands:register")

Register = Callable[[argparse._SubParsersAction], None]


def _providers() -> list[tuple[str, Callable[[], Register]]]:
    found = [(ep.value, ep.load) for ep in entry_points(group=COMMANDS_GROUP)]
    if found:
        return found

    def loader(spec: str) -> Callable[[], Register]:
        module, _, attr = spec.partition(":")
        return lambda: getattr(importlib.import_module(module), attr)

    return [(spec, loader(spec)) for spec in _BUILTIN_PROVIDERS]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line: ``sts: <what> (<command>)``,
    exit code 2 (``--help`` still prints the full usage), and whose ``--help`` shows
    every option's default."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"sts: {message} ({self.prog})\n")


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's help ends with its default, when it has one worth saying (not
    ``None``, not an off switch)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "%(default)" in text \
                or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def build_parser() -> argparse.ArgumentParser:
    """The ``sts`` parser with the subcommands of every installed package."""
    parser = _Parser(prog="sts", description="sts-spark: LLM inference in streams")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, load in _providers():
        try:
            load()(sub)
        except ImportError as e:  # a package that is not installed adds no commands
            logger.debug("sts commands from %s not available: %s", name, e)
        except argparse.ArgumentError as e:  # two installs register one command: the first's
            logger.warning("sts: commands from %s skipped: %s", name, e)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sts``; returns the exit code.

    A :class:`~sidecar.exceptions.ConfigError` (a wrong flag, file or setting) is
    printed as one line ``sts: <what> (<where>)`` with exit code 2; any other
    :class:`~sidecar.exceptions.SidecarError` (the engine failed to start or died, the
    sidecar cannot be reached) as one line with exit code 1. Ctrl-C and SIGTERM stop a
    command the same way, what it started stopped on the way out
    (:mod:`sidecar.interrupts`): one line, exit code 130 or 143.
    """
    from sidecar.exceptions import ConfigError, SidecarError, one_line
    from sidecar.interrupts import sigterm_as_interrupt, stopped

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        with sigterm_as_interrupt():
            return int(args.func(args) or 0)
    except KeyboardInterrupt as e:
        what, code = stopped(e)
        print(f"sts: {what} (sts {args.command})", file=sys.stderr)
        return code
    except ConfigError as e:
        print(f"sts: {e}", file=sys.stderr)
        return 2
    except SidecarError as e:
        print(f"sts: {one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
