"""Cross-cutting gRPC concerns: parse big messages off the event loop, bound the request
bytes being processed at once, and map exceptions to a gRPC status."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from sidecar.exceptions import EngineDeadError

logger = logging.getLogger(__name__)

#: Messages at least this large are parsed and their answers serialised in a worker
#: thread, so the event loop (health checks, other RPCs) keeps running meanwhile.
OFFLOAD_BYTES = 1 << 20


class ExceptionInterceptor(grpc.aio.ServerInterceptor):
    """Answer a message that does not parse with ``INVALID_ARGUMENT``, and log an
    exception escaping a handler and answer ``INTERNAL`` (``INVALID_ARGUMENT`` for
    ``ValueError``, ``UNAVAILABLE`` for a dead engine), instead of gRPC's bare ``UNKNOWN``.

    Args:
        max_inflight_bytes: Most request bytes being parsed and handled at once, over
            all calls; a call that would pass it gets ``RESOURCE_EXHAUSTED`` at once
            (a lone call is always let through: ``max_message_mb`` bounds it).
            ``None``: no limit.
    """

    def __init__(self, *, max_inflight_bytes: int | None = None) -> None:
        self.max_inflight_bytes = max_inflight_bytes
        self.inflight_bytes = 0
        self.refused_for_bytes = 0
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}
        """Per method: the handler found and its guarded form, built once (this runs for
        every call, and a closure plus a handler per call is a fixed cost of each RPC)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method
        if (cached := self._wrapped.get(method)) is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._guard(handler, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _guard(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """``handler`` with the byte cap, the parse and the exception mapping around it."""
        inner = handler.unary_unary
        deserialize = handler.request_deserializer
        serialize = handler.response_serializer

        async def guarded(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            size = len(raw)
            limit = self.max_inflight_bytes
            if limit is not None and self.inflight_bytes and self.inflight_bytes + size > limit:
                self.refused_for_bytes += 1
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self.inflight_bytes} request bytes are being processed and this call "
                    f"has {size} (server.max_inflight_rpc_mb); retry later")
            self.inflight_bytes += size
            try:
                big = size >= OFFLOAD_BYTES
                try:
                    if deserialize is None:
                        request = raw
                    elif big:
                        request = await asyncio.to_thread(deserialize, raw)
                    else:
                        request = deserialize(raw)
                except DecodeError as e:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"request does not parse as the method's message: {e}")
                del raw
                try:
                    response = await inner(request, context)
                except EngineDeadError as e:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"engine unavailable: {e}")
                except ValueError as e:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
                except Exception as e:
                    logger.exception("Method %s failed.", method)
                    await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
                if serialize is None:
                    return response
                del request
                return await asyncio.to_thread(serialize, response) if big \
                    else serialize(response)
            finally:
                self.inflight_bytes -= size

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=None,
            response_serializer=None,
        )
