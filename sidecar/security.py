"""Transport security of the sidecar: who may bind where, TLS, the bearer token, sockets.

* A TCP address that is not loopback needs TLS or a token (or, in a lab,
  ``server.allow_insecure_remote``): :func:`check_listen`.
* TLS from PEM files, mutual when a client CA is given: :func:`server_credentials`.
* The token is checked on every RPC except the standard health service by
  :class:`TokenInterceptor` with a constant-time compare; it is never logged.
* A unix socket lives in a directory the sidecar's user owns and gets
  ``server.socket_mode`` (``0o660``): :func:`prepare_socket_dir`, :func:`restrict_socket`.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from sidecar.config import ServerConfig
from sidecar.credentials import TOKEN_METADATA_KEY, read_pem, read_token
from sidecar.exceptions import ConfigError

logger = logging.getLogger(__name__)

#: RPCs answered without a token: load balancers and supervisors probe health.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)


def unix_socket_path(listen: str) -> Path | None:
    """The socket file of a ``unix:`` address, else ``None``.

    Example:
        >>> unix_socket_path("unix:///run/sts/sts-gpu0.sock"), unix_socket_path("127.0.0.1:1")
        (PosixPath('/run/sts/sts-gpu0.sock'), None)
    """
    if listen.startswith("unix://"):
        return Path(listen.removeprefix("unix://"))
    if listen.startswith("unix:"):
        return Path(listen.removeprefix("unix:"))
    return None


def listen_host(listen: str) -> str:
    """The host part of a ``host:port`` address (brackets of IPv6 removed).

    Raises:
        ConfigError: when the address has no port.

    Example:
        >>> listen_host("[::1]:50051"), listen_host("0.0.0.0:1"), listen_host(":50051")
        ('::1', '0.0.0.0', '')
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address must be host:port or unix:///path.sock, got "
                          f"{listen!r} (server.listen)")
    return host.removeprefix("[").removesuffix("]")


def is_loopback(listen: str) -> bool:
    """Whether ``listen`` can only be reached from this host (unix socket or loopback).
    Names other than ``localhost`` count as remote: they may resolve to anything.

    Example:
        >>> [is_loopback(a) for a in ("127.0.0.1:1", "[::1]:1", "localhost:1",
        ...                           "0.0.0.0:1", "[::]:1", "10.0.0.5:1", "unix:///tmp/s")]
        [True, True, True, False, False, False, True]
    """
    if unix_socket_path(listen) is not None:
        return True
    host = listen_host(listen)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_token(config: ServerConfig) -> str | None:
    """The bearer token the server requires (``None``: none). One-line errors."""
    try:
        return read_token(config.token_file, config.token_env)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_listen(config: ServerConfig, *, token: str | None) -> None:
    """Refuse a remote TCP address without TLS or a token, unless the lab switch is on.

    Raises:
        ConfigError: one line naming the address and the fix.
    """
    if is_loopback(config.listen):
        return
    tls = bool(config.tls_cert_file)
    if not tls and token is None:
        if not config.allow_insecure_remote:
            raise ConfigError(
                f"refusing to listen on {config.listen} without TLS or a token: anyone who "
                "reaches it could use the GPU; set server.tls_cert_file/tls_key_file or "
                "server.token_file/token_env, or --allow-insecure-remote for a lab "
                "(server.listen)")
        logger.warning("Listening on %s without TLS or a token (allow_insecure_remote): "
                       "anyone who reaches it can submit work.", config.listen)
    elif not tls:
        logger.warning("Listening on %s with a token but without TLS: the token crosses "
                       "the network in clear text.", config.listen)


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS credentials from the configured PEM files (``None`` without TLS);
    a client CA makes client certificates mandatory (mutual TLS)."""
    if not config.tls_cert_file or not config.tls_key_file:
        return None
    try:
        cert = read_pem(config.tls_cert_file, "server certificate")
        key = read_pem(config.tls_key_file, "server key")
        client_ca = (read_pem(config.tls_client_ca_file, "client CA bundle")
                     if config.tls_client_ca_file else None)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                       require_client_auth=client_ca is not None)


def prepare_socket_dir(path: Path) -> None:
    """Create the socket's directory ``0o750`` if missing; refuse one owned by another
    user or writable by others (they could replace the socket). Removes a stale socket."""
    parent = path.parent
    try:
        parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        info = parent.stat()
    except OSError as e:
        raise ConfigError(f"cannot create the socket directory: {e.strerror or e} "
                          f"({parent})") from None
    if info.st_uid != os.geteuid():
        raise ConfigError(f"the socket directory belongs to another user (uid {info.st_uid}); "
                          f"use a directory the sidecar owns ({parent})")
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise ConfigError(f"the socket directory is writable by every user ({parent})")
    if path.is_socket():
        if _socket_answers(path):
            raise ConfigError(f"another process is serving this socket ({path})")
        path.unlink()  # a previous run's socket; nothing else is removed
    elif path.exists():
        raise ConfigError(f"the socket path exists and is not a socket ({path})")


def _socket_answers(path: Path) -> bool:
    """Whether something accepts connections on the unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


@contextmanager
def socket_umask(mode: int) -> Iterator[None]:
    """While binding, a umask that creates the socket with at most ``mode``."""
    old = os.umask(0o777 & ~mode)
    try:
        yield
    finally:
        os.umask(old)


def restrict_socket(path: Path, mode: int) -> None:
    """Set the socket's mode (the umask already kept it at most ``mode``)."""
    os.chmod(path, mode)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Answer ``UNAUTHENTICATED`` to every RPC but health that does not carry
    ``authorization: Bearer <token>``. The compare is constant-time; the token and
    the presented value are never logged (only the method and whether one was sent).

    Example:
        >>> TokenInterceptor("t0k3n").accepts((("authorization", "Bearer t0k3n"),))
        True
        >>> TokenInterceptor("t0k3n").accepts((("authorization", "Bearer nope"),))
        False
    """

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()
        self.refused = 0

    def accepts(self, metadata: Any) -> bool:
        """Whether ``metadata`` carries the token."""
        presented = next((v for k, v in metadata or () if k == TOKEN_METADATA_KEY), None)
        if presented is None:
            return False
        if isinstance(presented, str):
            presented = presented.encode("utf-8", "replace")
        return hmac.compare_digest(presented, self._expected)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method.startswith(OPEN_METHOD_PREFIXES) or \
                self.accepts(handler_call_details.invocation_metadata):
            return await continuation(handler_call_details)
        self.refused += 1
        sent = any(k == TOKEN_METADATA_KEY
                   for k, _ in handler_call_details.invocation_metadata or ())
        if self.refused <= 10 or self.refused % 1000 == 0:  # a flood does not flood the log
            logger.warning("Refused %s: %s bearer token (%d refused so far).", method,
                           "wrong" if sent else "no", self.refused)
        detail = "wrong bearer token" if sent else "missing bearer token (authorization metadata)"

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, detail)

        return grpc.unary_unary_rpc_method_handler(refuse)
