"""Test helpers: a real sidecar process behind a context manager, and result readers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sidecar.client import SidecarClient
from sidecar.result_reader import read_results, wait_for_results

__all__ = ["RemoteSidecar", "free_port", "make_request", "read_results", "wait_for_results"]

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoteSidecar:
    """Runs ``sts sidecar`` as a child process on a free loopback port.

    ``__enter__`` polls the health service until ``SERVING`` and raises
    "Server exited unexpectedly." if the process dies first; ``__exit__`` runs
    ``terminate()``, ``wait(8)``, then ``kill()``.
    """

    def __init__(self, results_dir: Path, args: Sequence[str] = (), *,
                 start_timeout_s: float = 240.0, log_path: Path | None = None) -> None:
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.results_dir = Path(results_dir)
        self.args = list(args)
        self.start_timeout_s = start_timeout_s
        self.log_path = log_path or self.results_dir.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: SidecarClient | None = None

    def __enter__(self) -> "RemoteSidecar":
        cmd = [sys.executable, "-m", "sidecar.cli", "sidecar", "--listen", self.target,
               "--results-dir", str(self.results_dir), *self.args]
        self._log = open(self.log_path, "wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env)
        self.client = SidecarClient(self.target, timeout_s=30.0)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Server exited unexpectedly. Log: {self.tail_log()}")
            if self.client.is_serving():
                return self
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise TimeoutError(f"sidecar not serving after {self.start_timeout_s}s: {self.tail_log()}")

    def sigterm(self, timeout_s: float = 120.0) -> int:
        """Send SIGTERM and return the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def tail_log(self, n: int = 4000) -> str:
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
                self.proc.wait(8)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def make_request(request_id: str, *, priority: str = "normal", prompt: str = "Say hello.",
                 max_tokens: int = 16, deadline_in_ms: int = 60_000, **extra: object) -> dict:
    """A valid request mapping with the seed's field names."""
    now = int(time.time() * 1000)
    row = dict(request_id=request_id, trace_id=f"trace-{request_id}", priority=priority,
               enqueue_ts=now, deadline_ts=now + deadline_in_ms, prompt=prompt,
               max_tokens=max_tokens, temperature=0.0, cache_key="", callback_topic="")
    row.update(extra)
    return row
