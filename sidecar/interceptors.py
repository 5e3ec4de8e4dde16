"""Cross-cutting gRPC concerns: map unexpected exceptions to a gRPC status."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from sidecar.exceptions import EngineDeadError

logger = logging.getLogger(__name__)


class ExceptionInterceptor(grpc.aio.ServerInterceptor):
    """Answer a message that does not parse with ``INVALID_ARGUMENT``, and log an
    exception escaping a handler and answer ``INTERNAL`` (``INVALID_ARGUMENT`` for
    ``ValueError``, ``UNAVAILABLE`` for a dead engine), instead of gRPC's bare ``UNKNOWN``."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        deserialize = handler.request_deserializer
        method = handler_call_details.method

        async def guarded(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            try:
                request = deserialize(raw) if deserialize else raw
            except DecodeError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"request does not parse as the method's message: {e}")
            try:
                return await inner(request, context)
            except EngineDeadError as e:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"engine unavailable: {e}")
            except ValueError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            except Exception as e:
                logger.exception("Method %s failed.", method)
                await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=None,
            response_serializer=handler.response_serializer,
        )
