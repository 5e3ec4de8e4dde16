"""Test-time TLS material: a CA, a server certificate for ``localhost``/``127.0.0.1`` and a
client certificate, written as PEM files (built with ``cryptography``; nothing is shipped)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _issue(subject: str, issuer_key: ec.EllipticCurvePrivateKey, issuer: x509.Name, *,
           ca: bool, usage: list | None = None, san: list | None = None
           ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(_name(subject)).issuer_name(issuer if not ca else _name(subject))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    signer = key if ca else issuer_key
    return builder.sign(signer, hashes.SHA256()), key


def make_tls_files(folder: Path, prefix: str = "") -> TlsFiles:
    """A fresh CA with one server and one client certificate, as PEM files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _issue(f"{prefix}sts test CA", None, None, ca=True)  # type: ignore[arg-type]
    server_cert, server_key = _issue(
        "localhost", ca_key, ca_cert.subject, ca=False,
        usage=[ExtendedKeyUsageOID.SERVER_AUTH],
        san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client_cert, client_key = _issue("sts-spark executor", ca_key, ca_cert.subject, ca=False,
                                     usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    files = TlsFiles(*(folder / f"{prefix}{n}" for n in (
        "ca.pem", "server.pem", "server.key", "client.pem", "client.key")))
    for cert, path in ((ca_cert, files.ca), (server_cert, files.server_cert),
                       (client_cert, files.client_cert)):
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, files.server_key)
    _write_key(client_key, files.client_key)
    return files
