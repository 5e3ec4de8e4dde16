"""Test helpers: a real sidecar process behind a context manager, and result readers."""

from __future__ import annotations

import time

from sidecar.process import REPO, SidecarProcess, free_port
from sidecar.result_reader import read_results, wait_for_results

__all__ = ["REPO", "RemoteSidecar", "free_port", "make_request", "read_results",
           "wait_for_results"]


class RemoteSidecar(SidecarProcess):
    """A sidecar child process for tests (see :class:`sidecar.process.SidecarProcess`)."""


def make_request(request_id: str, *, priority: str = "normal", prompt: str = "Say hello.",
                 max_tokens: int = 16, deadline_in_ms: int = 60_000, **extra: object) -> dict:
    """A valid request mapping with the seed's field names."""
    now = int(time.time() * 1000)
    row = dict(request_id=request_id, trace_id=f"trace-{request_id}", priority=priority,
               enqueue_ts=now, deadline_ts=now + deadline_in_ms, prompt=prompt,
               max_tokens=max_tokens, temperature=0.0, cache_key="", callback_topic="")
    row.update(extra)
    return row
