"""A toy of each kind (engine, result channel and its Spark side, writer, event source),
registered by
``test_kinds``: what a new kind needs beyond its one registration line
(``docs/extending.md``)."""

from __future__ import annotations

from typing import Any

from sidecar.engines.simulated import SimulatedEngine, SimulatedEngineConfig
from sidecar.request_state import ResultRecord
from sidecar.result_channels.base import ResultChannel, ResultChannelStats
import pyarrow as pa

from spark_ext.l4.channels.base import ChannelSide, ChannelStreams
from spark_ext.l4.writers.base import TableWriter
from spark_ext.submit.ack_channel import AckChannel
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


#: What :class:`ToyAcks` wrote: (pipeline, run, rows).
TOY_ACKS: list[tuple[str, str, int]] = []


class ToyAcks(AckChannel):
    """Keeps the acks in :data:`TOY_ACKS`."""

    def write_table(self, table: pa.Table) -> None:
        TOY_ACKS.append((self.pipeline_id, self.run_id, table.num_rows))


class ToyChannelSide(ChannelSide):
    """The Spark side of the toy result channel: reads nothing, keeps its acks."""

    name = "toy"

    def source(self) -> str:
        return "the toy channel"

    def results(self, spark: Any) -> Any:
        raise NotImplementedError

    def streams(self, spark: Any, ack_schema: Any) -> ChannelStreams:
        raise NotImplementedError

    def ack_channel(self, run_id: str, run_started_ms: int) -> ToyAcks:
        return ToyAcks(self.pipeline_id, run_id, run_started_ms)
