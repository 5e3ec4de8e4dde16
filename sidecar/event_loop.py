"""The sidecar's event loop: uvloop where it is installed, else asyncio's own.

The gateway runs its whole per-request path (gRPC callbacks, admission, one serving
task per request, timers) on one event loop, so the loop's own cost per callback and
per task is part of every request's. uvloop (libuv, in C) runs the same ``asyncio``
program with less of it: measured in ``python -m benchmarks.gateway_overhead``, about
a tenth of the sidecar's CPU per request. gRPC's asyncio server runs on either.

Example:
    >>> import asyncio
    >>> async def loop_name() -> str:
    ...     return running_loop_name()
    >>> run(loop_name(), "asyncio")
    'asyncio'
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: Values of ``server.event_loop``.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def uvloop_available() -> bool:
    """Whether uvloop can be imported here (it is not built for Windows)."""
    return importlib.util.find_spec("uvloop") is not None


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the event loop ``kind`` names (``None``: asyncio's default).

    Raises:
        ValueError: ``kind`` is not one of :data:`EVENT_LOOPS`, or it is ``uvloop``
            and uvloop is not installed.
    """
    if kind not in EVENT_LOOPS:
        raise ValueError(f"server.event_loop={kind!r} must be one of {EVENT_LOOPS}")
    if kind == "asyncio" or (kind == "auto" and not uvloop_available()):
        return None
    try:
        import uvloop
    except ImportError:
        raise ValueError("server.event_loop='uvloop' but uvloop is not installed "
                         "(pip install uvloop, or use 'auto' or 'asyncio')") from None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], kind: str = "auto") -> T:
    """Run ``main`` to its end on a new event loop of ``kind`` (see :func:`loop_factory`)
    and close the loop, like :func:`asyncio.run`."""
    factory = loop_factory(kind)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the kind of the running event loop."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
