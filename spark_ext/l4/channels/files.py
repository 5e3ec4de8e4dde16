"""The ``files`` result channel, Spark side: the sidecars' Parquet landing folder
(``sidecar.results_dir``) and this pipeline's acks folder (``sidecar.acks_dir``, else
``<results_dir>/acks/<pipeline id>``), both read by the ``sts_results`` source
(:mod:`spark_ext.sources.result_files`), which forgets read files after
``maintenance.results_retention_s``.

The submit tasks write their acks as one Parquet file per task and micro-batch, named
like the sidecar's result files (:func:`sidecar.contract.result_file_name`: the submit
query's run start as the incarnation, the batch id as the sequence, one writer stream
per partition) and renamed into place, so the source reads each once.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from spark_ext.l4.channels.base import ChannelSide, ChannelStreams
from spark_ext.submit.ack_channel import AckChannel, task_position

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


@dataclass(frozen=True)
class FileAcks(AckChannel):
    """A task's acks as one Parquet file in ``acks_dir``."""

    acks_dir: str = "."

    def write_table(self, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        from sidecar.contract import result_file_name

        batch, partition = task_position()
        folder = Path(self.acks_dir)
        folder.mkdir(parents=True, exist_ok=True)
        name = result_file_name(self.run_started_ms, batch, f"acks-{self.run_id}-p{partition}")
        temp = folder / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        pq.write_table(table, temp)
        os.replace(temp, folder / name)  # visible at once and whole


class FilesChannel(ChannelSide):
    """Results and acks in local (or mounted) landing folders."""

    name = "files"

    @property
    def acks_dir(self) -> str:
        """This pipeline's acks folder."""
        side = self.config.sidecar
        return side.acks_dir or os.path.join(side.results_dir, "acks", self.pipeline_id)

    def folders(self) -> list[str]:
        return [self.config.sidecar.results_dir, self.acks_dir]

    def source(self) -> str:
        return self.config.sidecar.results_dir

    def _read(self, spark: SparkSession, path: str, schema: StructType | None = None
              ) -> DataFrame:
        from spark_ext.sources.result_files import SOURCE_NAME, register_results_source

        register_results_source(spark)
        reader = spark.readStream.format(SOURCE_NAME)
        if schema is not None:
            reader = reader.schema(schema)
        return (reader.option("path", path)
                .option("retentionSeconds", str(self.config.maintenance.results_retention_s))
                .load())

    def results(self, spark: SparkSession) -> DataFrame:
        return self._read(spark, self.config.sidecar.results_dir)

    def streams(self, spark: SparkSession, ack_schema: StructType) -> ChannelStreams:
        from pyspark.sql import functions as F

        results = self.results(spark)
        payload = F.to_json(F.struct(*[F.col(c) for c in results.columns]))
        return ChannelStreams(results, payload, self._read(spark, self.acks_dir, ack_schema))

    def ack_channel(self, run_id: str, run_started_ms: int) -> FileAcks:
        return FileAcks(self.pipeline_id, run_id, run_started_ms, acks_dir=self.acks_dir)
