"""Table, checkpoint and landing locations as URIs (``s3://``, ``s3a://``, ``abfss://``,
``gs://``, ``dbfs:/``, ``file://``, or a local path), joined as strings, never through
:mod:`pathlib` (``Path("s3://b") / "t"`` is ``s3:/b/t``).

Example:
    >>> join_uri("s3://bucket/sts", "tables", "answers")
    's3://bucket/sts/tables/answers'
    >>> join_uri("dbfs:/sts/", "ckpt"), join_uri("/data/sts", "ckpt")
    ('dbfs:/sts/ckpt', '/data/sts/ckpt')
    >>> is_local_uri("s3a://b/c"), is_local_uri("file:///tmp/x"), is_local_uri("./x")
    (False, True, True)
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

#: A URI scheme: letters, digits, ``+``, ``-``, ``.``, then ``:`` (``s3:``, ``dbfs:``).
#: One letter is a Windows drive, not a scheme.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


def scheme(uri: str) -> str | None:
    """The URI's scheme, lower-cased (``None`` for a plain path)."""
    match = _SCHEME.match(uri)
    return match.group(1).lower() if match else None


def is_local_uri(uri: str) -> bool:
    """``True`` for a path on this machine's file system: no scheme, or ``file:``."""
    return scheme(uri) in (None, "file")


def join_uri(base: str, *parts: str) -> str:
    """``base`` with ``parts`` appended, ``/``-separated; the scheme and authority of
    ``base`` are kept as they are."""
    match = _SCHEME.match(base)
    head, rest = (base[: match.end()], base[match.end():]) if match else ("", base)
    joined = posixpath.join(rest, *(p.strip("/") for p in parts if p))
    return head + joined


def local_path(uri: str) -> Path:
    """A local URI (``file:`` or a plain path) as a :class:`~pathlib.Path`.

    Raises:
        ValueError: ``uri`` is not local.
    """
    if not is_local_uri(uri):
        raise ValueError(f"{uri!r} is not a local path")
    if uri.startswith("file://"):
        return Path(uri[len("file://"):])
    if uri.startswith("file:"):
        return Path(uri[len("file:"):])
    return Path(uri)


def resolve_local(uri: str, base: Path) -> str:
    """A relative local path made absolute against ``base``; every other URI (absolute,
    ``file:``, an object store) is returned unchanged."""
    if not is_local_uri(uri) or uri.startswith("file:") or Path(uri).is_absolute():
        return uri
    return str((base / uri).resolve())
