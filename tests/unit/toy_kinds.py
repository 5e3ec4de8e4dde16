"""A toy of each kind (engine, result channel, writer, event source), registered by
``test_kinds``: what a new kind needs beyond its one registration line
(``docs/extending.md``)."""

from __future__ import annotations

from typing import Any

from sidecar.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from sidecar.request_state import ResultRecord
from sidecar.result_channels.base import ResultChannel, ResultChannelStats
from spark_ext.l4.writers.base import TableWriter
from spark_ext.sources.base import EventSource


class ToyEngine(SimulatedEngine):
    """The simulated engine with 1 ms steps under another name."""

    kind = "toy"

    @classmethod
    def from_config(cls, config: Any) -> "ToyEngine":
        return cls(SimulatedEngineConfig(step_base_ms=1.0, step_per_seq_ms=0.0),
                   served_model_name=config.served_model_name)


class ToyResultChannel(ResultChannel):
    """Keeps every row in a list: delivered as soon as it is emitted."""

    kind = "toy"

    def __init__(self, config: Any, sidecar_id: str) -> None:
        self.sidecar_id = sidecar_id
        self.rows: list[ResultRecord] = []

    def start(self) -> None: ...

    def emit(self, record: ResultRecord) -> None:
        self.rows.append(record)

    async def flush(self) -> None: ...

    async def close(self, timeout_s: float | None = None) -> None: ...

    def stats(self) -> ResultChannelStats:
        n = len(self.rows)
        return ResultChannelStats(self.kind, n, n, 0, 0, True)

    @property
    def destination(self) -> str:
        return "a list in memory"

    def summary(self) -> str:
        return f"{len(self.rows)} results in memory"


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
