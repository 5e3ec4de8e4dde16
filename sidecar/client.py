"""A small blocking client for the sidecar (used by the CLI, Spark tasks and tests)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.contract import Priority
from sidecar.credentials import TOKEN_METADATA_KEY, ClientSecurity, read_pem
from sidecar.exceptions import one_line
from sidecar.pb.sts.v1 import inference_pb2 as pb
from sidecar.pb.sts.v1 import inference_pb2_grpc as pb_grpc

_REQUEST_FIELDS = frozenset(pb.InferenceRequest.DESCRIPTOR.fields_by_name)


def request_to_proto(row: Mapping[str, Any]) -> pb.InferenceRequest:
    """Build a wire request from a mapping with the seed's field names.

    ``priority`` may be ``"high"``/``"normal"``/``"low"`` or the enum value;
    ``None`` values and unknown keys are ignored. ``attributes`` (the event's key
    columns, echoed on the result) is a mapping; ``None`` or missing means none,
    values that are not strings are converted with ``str()`` and ``None`` values
    are left out (the reader sees a missing key). ``submit_ts`` is epoch ms.

    Example:
        >>> msg = request_to_proto({"request_id": "r1", "priority": "high",
        ...                         "attributes": {"ticket_id": "T-7", "shard": 3},
        ...                         "submit_ts": 1_700_000_000_000})
        >>> msg.priority == pb.PRIORITY_HIGH, sorted(msg.attributes.items()), msg.submit_ts
        (True, [('shard', '3'), ('ticket_id', 'T-7')], 1700000000000)
        >>> len(request_to_proto({"request_id": "r2", "attributes": None}).attributes)
        0
    """
    fields = {k: v for k, v in row.items() if k in _REQUEST_FIELDS and v is not None}
    priority = fields.get("priority")
    if isinstance(priority, str):
        try:
            fields["priority"] = int(Priority.parse(priority))
        except ValueError:
            fields["priority"] = pb.PRIORITY_UNSPECIFIED
    if (attributes := fields.get("attributes")) is not None:
        fields["attributes"] = {str(k): v if isinstance(v, str) else str(v)
                                for k, v in attributes.items() if v is not None}
    return pb.InferenceRequest(**fields)


def channel_credentials(security: ClientSecurity) -> grpc.ChannelCredentials | None:
    """TLS channel credentials for ``security`` (``None`` for a plaintext channel).

    Raises:
        ValueError: one line naming a PEM file that cannot be read.
    """
    if not security.tls_ca_file:
        return None
    cert = key = None
    if security.tls_cert_file and security.tls_key_file:
        cert = read_pem(security.tls_cert_file, "client certificate")
        key = read_pem(security.tls_key_file, "client key")
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(security.tls_ca_file, "CA bundle"),
        private_key=key, certificate_chain=cert)


def auth_metadata(security: ClientSecurity | None) -> tuple[tuple[str, str], ...]:
    """The call metadata carrying the bearer token (empty without one).

    Example:
        >>> auth_metadata(None)
        ()
    """
    token = security.token() if security is not None else None
    return ((TOKEN_METADATA_KEY, f"Bearer {token}"),) if token else ()


def open_channel(target: str, security: ClientSecurity | None = None, *,
                 options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
    """A blocking channel to ``target``: TLS when ``security`` names a CA, else plaintext.
    The token is not part of the channel; pass :func:`auth_metadata` with each call."""
    options = list(options or [])
    security = security or ClientSecurity()
    creds = channel_credentials(security)
    if creds is None:
        return grpc.insecure_channel(target, options=options)
    if security.tls_server_name:
        options.append(("grpc.ssl_target_name_override", security.tls_server_name))
    return grpc.secure_channel(target, creds, options=options)


def describe_rpc_error(error: grpc.RpcError, target: str) -> str:
    """One line for a failed call: what went wrong, then the target in parentheses.

    Example:
        >>> class Err(grpc.RpcError):
        ...     def code(self): return grpc.StatusCode.UNAUTHENTICATED
        ...     def details(self): return "wrong bearer token"
        >>> describe_rpc_error(Err(), "127.0.0.1:50051")
        'the sidecar refused the credentials: wrong bearer token (127.0.0.1:50051)'
    """
    code = error.code() if hasattr(error, "code") else None
    details = one_line(error.details() if hasattr(error, "details") else error)
    if code == grpc.StatusCode.UNAVAILABLE:
        what = f"cannot reach the sidecar: {details}"
    elif code == grpc.StatusCode.UNAUTHENTICATED:
        what = f"the sidecar refused the credentials: {details}"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        what = "the sidecar did not answer in time"
    else:
        what = f"the sidecar answered {code.name if code else 'an error'}: {details}"
    return f"{what} ({target})"


class SidecarClient:
    """Blocking gRPC client of ``sts.v1.Inference``.

    Args:
        target: ``host:port`` or ``unix:///path.sock``.
        timeout_s: Deadline of each call.
        security: TLS files and token source (:class:`~sidecar.credentials.ClientSecurity`);
            ``None``: plaintext, no token.

    Usage::

        with SidecarClient("127.0.0.1:50051") as client:
            acks = client.submit([{"request_id": "a", "prompt": "hi", ...}])
    """

    def __init__(self, target: str, *, timeout_s: float = 10.0,
                 security: ClientSecurity | None = None) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.security = security
        self._metadata = auth_metadata(security)
        self._channel = open_channel(
            target, security, options=[("grpc.max_send_message_length", 64 * 1024 * 1024),
                                       ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        self._stub = pb_grpc.InferenceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def __enter__(self) -> "SidecarClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def submit(self, requests: Iterable[Mapping[str, Any] | pb.InferenceRequest]
               ) -> pb.SubmitBatchResponse:
        """Submit one batch; returns the response with one ack per request."""
        msgs = [r if isinstance(r, pb.InferenceRequest) else request_to_proto(r)
                for r in requests]
        return self._stub.SubmitBatch(pb.SubmitBatchRequest(requests=msgs),
                                      timeout=self.timeout_s, metadata=self._metadata)

    def generate(self, request: Mapping[str, Any] | pb.InferenceRequest,
                 timeout_s: float | None = None) -> pb.Result:
        """Blocking: admit one request and wait for its terminal result (the
        synchronous baseline; the product path is :meth:`submit`)."""
        msg = request if isinstance(request, pb.InferenceRequest) else request_to_proto(request)
        return self._stub.Generate(msg, timeout=timeout_s, metadata=self._metadata)

    def generate_future(self, request: Mapping[str, Any] | pb.InferenceRequest,
                        timeout_s: float | None = None) -> "grpc.Future":
        """Like :meth:`generate` but returns a future (fire a batch, then wait for all)."""
        msg = request if isinstance(request, pb.InferenceRequest) else request_to_proto(request)
        return self._stub.Generate.future(msg, timeout=timeout_s, metadata=self._metadata)

    def stats(self) -> pb.GetStatsResponse:
        return self._stub.GetStats(pb.GetStatsRequest(), timeout=self.timeout_s,
                                   metadata=self._metadata)

    def is_serving(self) -> bool:
        """True when the standard health service answers ``SERVING``."""
        try:
            reply = self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def wait_until_serving(self, timeout_s: float) -> None:
        """Poll health until ``SERVING``; raise ``TimeoutError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.is_serving():
                return
            time.sleep(0.25)
        raise TimeoutError(f"sidecar at {self.target} not serving after {timeout_s:.0f}s")
