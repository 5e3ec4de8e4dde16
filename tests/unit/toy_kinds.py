"""A toy writer and a toy event source, registered by ``test_kinds``: what a new kind
needs beyond its one registration line (``docs/extending.md``)."""

from __future__ import annotations

from typing import Any

from spark_ext.l4.writers.base import TableWriter
from spark_ext.sources.base import EventSource


class ToyEventSource(EventSource):
    """Reads nothing; it only has to be built."""

    def read_stream(self, spark: Any) -> Any:
        raise NotImplementedError


class ToyWriter(TableWriter):
    """Writes nothing; it only has to be chosen."""

    name = "toy"

    def location(self, name: str) -> str:
        return name

    def create_tables(self, spark: Any) -> None: ...

    def frames(self, batch: Any) -> Any: ...

    def count(self, frame: Any) -> int:
        return 0

    def append(self, name: str, frame: Any, *, app_id: str, version: int) -> None: ...

    def merge_answers(self, name: str, frame: Any, *, backfill: bool) -> dict[str, int]:
        return {"inserted": 0, "updated": 0}

    def read(self, spark: Any, name: str, columns: list[str] | None = None) -> Any: ...

    def exists(self, spark: Any, name: str) -> bool:
        return False

    def maintain(self, spark: Any, names: tuple[str, ...], hours: list[str], *,
                 vacuum_retention_hours: int | None) -> None: ...

    def version(self, spark: Any, name: str) -> int:
        return 0
