"""Credentials a client presents to a sidecar: TLS files and a bearer token.

The token is never taken from a command line (other users can read a process's
arguments): it comes from a file or an environment variable. Shared by the
sidecar, its client, the Spark side and the benchmarks.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

#: gRPC metadata key carrying the bearer token (``authorization: Bearer <token>``).
TOKEN_METADATA_KEY = "authorization"


def read_token(token_file: str | None = None, token_env: str | None = None) -> str | None:
    """The bearer token from ``token_file`` (first line, stripped) or the environment
    variable ``token_env``; ``None`` when neither is given.

    Raises:
        ValueError: one line naming the file or variable that is missing or empty.

    Example:
        >>> import os
        >>> os.environ["STS_DOCTEST_TOKEN"] = "s3cret"
        >>> read_token(token_env="STS_DOCTEST_TOKEN"), read_token()
        ('s3cret', None)
        >>> read_token(token_env="STS_NO_SUCH_VARIABLE")
        Traceback (most recent call last):
        ...
        ValueError: token variable is not set or empty (STS_NO_SUCH_VARIABLE)
    """
    if token_file:
        try:
            text = Path(token_file).expanduser().read_text(encoding="utf-8")
        except OSError as e:
            raise ValueError(f"cannot read the token file: {e.strerror or e} "
                             f"({token_file})") from None
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise ValueError(f"the token file is empty ({token_file})")
        return token
    if token_env:
        token = os.environ.get(token_env, "").strip()
        if not token:
            raise ValueError(f"token variable is not set or empty ({token_env})")
        return token
    return None


def read_pem(path: str, what: str) -> bytes:
    """The bytes of a PEM file; a one-line ``ValueError`` naming ``what`` and the path."""
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read the {what}: {e.strerror or e} ({path})") from None
    if b"-----BEGIN" not in data:
        raise ValueError(f"the {what} is not a PEM file ({path})")
    return data


@dataclass
class ClientSecurity:
    """How a client authenticates to a sidecar and checks who it talks to.

    With ``tls_ca_file`` the channel is TLS and the server certificate must chain
    to that CA; ``tls_cert_file``/``tls_key_file`` add a client certificate (mutual
    TLS). The token, if any, travels as ``authorization: Bearer <token>`` metadata.

    Example:
        >>> ClientSecurity().enabled, ClientSecurity(token_env="STS_SIDECAR_TOKEN").enabled
        (False, True)
    """

    tls_ca_file: str | None = None
    """PEM CA bundle that signed the sidecar's certificate; set it to use TLS."""

    tls_cert_file: str | None = None
    """PEM client certificate chain (mutual TLS)."""

    tls_key_file: str | None = None
    """PEM private key of ``tls_cert_file``."""

    tls_server_name: str | None = None
    """Name to check the server certificate against when it differs from the
    target's host (e.g. connecting to an IP with a certificate for a DNS name)."""

    token_file: str | None = None
    """File holding the bearer token (first line)."""

    token_env: str | None = None
    """Environment variable holding the bearer token (used when ``token_file`` is unset)."""

    def __post_init__(self) -> None:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together "
                             f"(tls_cert_file={self.tls_cert_file!r}, "
                             f"tls_key_file={self.tls_key_file!r})")
        if self.tls_cert_file and not self.tls_ca_file:
            raise ValueError("a client certificate needs tls_ca_file (TLS) too "
                             f"(tls_cert_file={self.tls_cert_file!r})")

    @property
    def enabled(self) -> bool:
        """Whether any credential is configured."""
        return bool(self.tls_ca_file or self.token_file or self.token_env)

    @property
    def tls(self) -> bool:
        return bool(self.tls_ca_file)

    def token(self) -> str | None:
        """The bearer token (see :func:`read_token`)."""
        return read_token(self.token_file, self.token_env)


def security_fields(security: ClientSecurity | None) -> dict[str, str]:
    """The set fields of ``security`` by name: a pipeline config's ``sidecar`` section
    takes them as they are.

    Example:
        >>> security_fields(ClientSecurity(token_file="/run/secrets/sts-token"))
        {'token_file': '/run/secrets/sts-token'}
        >>> security_fields(None)
        {}
    """
    if security is None:
        return {}
    return {k: v for k, v in dataclasses.asdict(security).items() if v is not None}
