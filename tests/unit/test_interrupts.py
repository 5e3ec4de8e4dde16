"""SIGTERM as Ctrl-C (:mod:`sidecar.interrupts`), in a child interpreter: the signal
raises where the main thread is, so its ``finally`` runs; a second one during that
cleanup is ignored; the previous handler is back afterwards; ``sts`` reports it in one
line with exit code 143."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.utils import REPO

_CHILD = textwrap.dedent("""
    import os, signal, time
    from sidecar.interrupts import Terminated, sigterm_as_interrupt, stopped

    try:
        with sigterm_as_interrupt() as installed:
            assert installed
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
                print("not interrupted")
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # a second one, during the cleanup
                print("cleanup ran")
    except Terminated as e:
        print(stopped(e))
    print(stopped(KeyboardInterrupt()))
    print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)  # as it was before
""")


def test_sigterm_raises_in_the_main_thread_once_and_cleanup_runs() -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["cleanup ran", "('terminated (SIGTERM)', 143)",
                                        "('interrupted', 130)", "True"]


def test_sts_reports_a_sigterm_in_one_line_with_exit_code_143() -> None:
    child = ("import os, signal, sys\n"
             "from sidecar import cli\n"
             "cli.build_parser = lambda: _parser\n"
             "import argparse\n"
             "_parser = argparse.ArgumentParser()\n"
             "_parser.add_argument('-v', '--verbose', action='store_true')\n"
             "_parser.set_defaults(command='wait', func=lambda a: os.kill(os.getpid(), "
             "signal.SIGTERM) or signal.pause())\n"
             "sys.exit(cli.main([]))\n")
    done = subprocess.run([sys.executable, "-c", child], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 143, done.stderr
    assert done.stderr.strip() == "sts: terminated (SIGTERM) (sts wait)"
