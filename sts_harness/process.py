"""Run ``sts sidecar`` as a child process (demo, benchmarks, tests)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sidecar import ClientSecurity, SidecarError
from sidecar.client import SidecarClient

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(empty log)"


class SidecarStartError(SidecarError, RuntimeError):
    """The sidecar child process exited or did not serve in time. The message is one line
    (``Server exited unexpectedly: <its last log line> (<log file>)``); ``log_tail`` holds
    the end of its log."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(message)
        self.log_tail = log_tail


def write_token_file(path: Path) -> Path:
    """A fresh random bearer token in ``path``, readable by its owner only.

    Example:
        >>> import tempfile
        >>> token = write_token_file(Path(tempfile.mkdtemp()) / "token")
        >>> oct(token.stat().st_mode & 0o777), len(token.read_text().strip()) >= 32
        ('0o600', True)
    """
    import secrets

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    os.chmod(path, 0o600)
    return path


class SidecarProcess:
    """``sts sidecar`` on a free loopback port, as a context manager.

    ``__enter__`` polls the health service until ``SERVING`` and raises
    ``RuntimeError`` with the log's tail if the process dies first; ``__exit__``
    sends SIGTERM (the sidecar drains), waits ``stop_timeout_s``, then kills.

    Example:
        >>> import tempfile
        >>> with SidecarProcess(Path(tempfile.mkdtemp()) / "results",
        ...                     ["--engine", "simulated"]) as sc:
        ...     sc.client.stats().engine
        'simulated'
    """

    def __init__(self, results_dir: Path, args: Sequence[str] = (), *,
                 start_timeout_s: float = 240.0, stop_timeout_s: float = 8.0,
                 log_path: Path | None = None, cpus: set[int] | None = None,
                 security: ClientSecurity | None = None) -> None:
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.results_dir = Path(results_dir)
        self.args = list(args)
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.log_path = log_path or self.results_dir.with_suffix(".log")
        self.cpus = cpus
        self.security = security
        """Credentials the client presents (the sidecar's own come from ``args``)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: SidecarClient | None = None

    def __enter__(self) -> "SidecarProcess":
        cmd = [sys.executable, "-m", "sidecar.cli", "sidecar", "--listen", self.target,
               "--results-dir", str(self.results_dir), *self.args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        cpus = self.cpus
        preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, preexec_fn=preexec)
        self.client = SidecarClient(self.target, timeout_s=30.0, security=self.security)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.__exit__(None, None, None)
                tail = self.tail_log()
                raise SidecarStartError(f"Server exited unexpectedly: {_last_line(tail)} "
                                        f"({self.log_path})", tail)
            if self.client.is_serving():
                return self
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise SidecarStartError(f"sidecar not serving after {self.start_timeout_s:g} s "
                                f"({self.log_path})", self.tail_log())

    def tail_log(self, n: int = 4000) -> str:
        """The last ``n`` bytes of the sidecar's log."""
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def start_local_sidecar(stack: contextlib.ExitStack, out: Path, engine: str, sidecar_id: str,
                        extra_args: Sequence[str] = ()) -> tuple[SidecarProcess, Path]:
    """The sidecar ``sts demo`` and ``sts validate`` start for themselves, entered on ``stack``.

    ``engine`` running 8 sequences, results in ``out/results``, its log in
    ``out/sidecar.log``, and a bearer token in ``out/sidecar-token`` that the client
    presents (the secure path, end to end). Returns the process and the token file.
    """
    token_file = write_token_file(out / "sidecar-token")
    print(f"Starting sidecar ({engine}); log: {out / 'sidecar.log'}", flush=True)
    sidecar = stack.enter_context(SidecarProcess(
        out / "results", ["--engine", engine, "--sidecar-id", sidecar_id,
                          "--max-in-flight", "8", "--engine-arg", "max_num_seqs=8", *extra_args,
                          "--set", f"server.token_file={json.dumps(str(token_file))}"],
        log_path=out / "sidecar.log", start_timeout_s=300, stop_timeout_s=60,
        security=ClientSecurity(token_file=str(token_file))))
    return sidecar, token_file
