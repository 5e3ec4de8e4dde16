"""delta-rs from the driver (``output.writer: deltalake``): for a Spark without Delta's
jars. Each micro-batch's ledger output is collected once as Arrow (it is small: the
batch's answers and records) and written with ``write_deltalake`` through the
:class:`~spark_ext.l4.answer_store.AnswerStore` (appends stamped with app transactions,
the backfill as a pruned ``MERGE``). It keeps file handles and caches on the driver, so
it does not run on Spark Connect.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_ext.l4.answer_store import ANSWER_TABLE_CONFIGURATION, AnswerStore, with_partition
from spark_ext.l4.answers import PARTITION, answer_schema
from spark_ext.l4.ledger import RECORD, SHADOW_ANSWERS
from spark_ext.l4.writers.base import BatchFrames, TableWriter


class DeltalakeWriter(TableWriter):
    """delta-rs on the driver, paths only (``output.out_dir`` and
    ``output.storage_options``)."""

    name = "deltalake"
    runs_on_connect = False
    traces_answers = True

    def __init__(self, output: Any, key_columns: tuple[str, ...]) -> None:
        super().__init__(output, key_columns)
        self.store = AnswerStore(output.out_dir, key_columns=list(key_columns),
                                 storage_options=output.storage_options or None)
        """The tables (reads, appends, compaction), also for the demo and tests."""

    def location(self, name: str) -> str:
        return self.store.path(name)

    def exists(self, spark: Any, name: str) -> bool:
        return self.store.exists(name)

    def create_tables(self, spark: Any,
                      names: tuple[str, ...] = ("answers", SHADOW_ANSWERS)) -> None:
        """``answers`` and ``shadow_answers`` (empty, their columns, partitioned, the
        change data feed on) unless they exist."""
        from deltalake import write_deltalake

        schema = answer_schema(self.key_columns)
        for name, table_schema in (("answers", schema),
                                   (SHADOW_ANSWERS, schema.append(pa.field("model_text",
                                                                           pa.string())))):
            if name in names and not self.store.exists(name):
                write_deltalake(self.store.path(name), table_schema.empty_table(),
                                mode="append", partition_by=[PARTITION],
                                storage_options=self.store.storage_options,
                                configuration=dict(ANSWER_TABLE_CONFIGURATION))

    def read(self, spark: Any, name: str, columns: list[str] | None = None) -> pa.Table:
        return self.store.read(name, columns)

    def version(self, spark: Any, name: str) -> int:
        return self.store._table(name).version()

    def frames(self, batch: Any) -> "ArrowFrames":
        return ArrowFrames(batch.toArrow(), self.key_columns)

    def count(self, frame: pa.Table) -> int:
        return frame.num_rows

    def append(self, name: str, frame: pa.Table, *, app_id: str, version: int) -> None:
        if frame.num_rows == 0:
            return
        if self.store.append(name, frame, app_id=app_id, version=version) \
                and name == "answers" and self.tracer is not None:
            rows = frame.to_pylist()
            self.tracer.answered(rows, rows[0]["answered_ts"])

    def merge_answers(self, name: str, frame: pa.Table, *, backfill: bool) -> dict[str, int]:
        """Insert the rows whose request has no row in ``name``; with ``backfill``, a
        model's answer upgrades a fallback. The MERGE names the rows' partitions and
        ``enqueue_ts`` range, so it reads the recent files only."""
        if frame.num_rows == 0:
            return {"inserted": 0, "updated": 0}
        source = with_partition(_one_row_per_request(frame))
        hours = ", ".join(f"'{h}'" for h in sorted(set(source.column(PARTITION).to_pylist())))
        first = pc.min(source.column("enqueue_ts")).as_py()
        last = pc.max(source.column("enqueue_ts")).as_py()
        bounds = (f"t.enqueue_ts >= {int(first)} AND t.enqueue_ts <= {int(last)} AND "
                  if first is not None else "")
        merge = self.store._table(name).merge(
            source, predicate=(f"t.{PARTITION} IN ({hours}) AND {bounds}"
                               f"t.{PARTITION} = s.{PARTITION} AND t.request_id = s.request_id"),
            source_alias="s", target_alias="t")
        if backfill:
            merge = merge.when_matched_update(
                updates={"answer": "s.answer", "answer_source": "'backfill'", "status": "'ok'",
                         "finish_ts": "s.finish_ts", "received_ts": "s.received_ts",
                         "backfilled_at": "coalesce(s.backfilled_at, s.answered_ts)"},
                predicate="t.answer_source = 'fallback' AND s.answer_source IN "
                          "('llm', 'backfill')")
        metrics = merge.when_not_matched_insert_all().execute()
        if backfill and self.tracer is not None:
            upgraded = source.filter(pc.equal(source.column("answer_source"), "backfill"))
            if upgraded.num_rows:
                stamp = pc.max(upgraded.column("answered_ts")).as_py()
                self.tracer.backfilled(upgraded, upgraded.column("request_id").to_pylist(),
                                       stamp)
        return {"inserted": int(metrics.get("num_target_rows_inserted") or 0),
                "updated": int(metrics.get("num_target_rows_updated") or 0)}

    def maintain(self, spark: Any, names: tuple[str, ...], hours: list[str], *,
                 vacuum_retention_hours: int | None) -> None:
        self.store.maintain(vacuum_retention_hours=vacuum_retention_hours)


def _one_row_per_request(rows: pa.Table) -> pa.Table:
    """One row per ``request_id``: the model's answer when there is one (a ``backfill``
    when a fallback came with it), else the first."""
    by_id: dict[str, int] = {}
    fallback_too: set[str] = set()
    sources = rows.column("answer_source").to_pylist()
    for i, (rid, source) in enumerate(zip(rows.column("request_id").to_pylist(), sources)):
        if source == "fallback":
            fallback_too.add(rid)
        best = by_id.get(rid)
        if best is None or (source in ("llm", "backfill")
                            and sources[best] not in ("llm", "backfill")):
            by_id[rid] = i
    picked = rows.take(sorted(by_id.values()))
    upgrade = [rid in fallback_too and s == "llm" for rid, s in zip(
        picked.column("request_id").to_pylist(), picked.column("answer_source").to_pylist())]
    if any(upgrade):
        mask = pa.array(upgrade)
        i = picked.schema.get_field_index("answer_source")
        picked = picked.set_column(i, "answer_source",
                                   pc.if_else(mask, "backfill", picked.column(i)))
        j = picked.schema.get_field_index("backfilled_at")
        picked = picked.set_column(j, "backfilled_at",
                                   pc.if_else(mask, picked.column("answered_ts"), picked.column(j)))
    return picked


def _from_json(value: Any, t: pa.DataType) -> Any:
    """A value of Spark's ``to_json`` back in Arrow's Python form (binary from base64,
    maps as pairs)."""
    if value is None:
        return None
    if pa.types.is_binary(t):
        return base64.b64decode(value)
    if pa.types.is_map(t):
        return [(k, _from_json(v, t.item_type)) for k, v in value.items()]
    if pa.types.is_list(t):
        return [_from_json(v, t.value_type) for v in value]
    if pa.types.is_struct(t):
        return {f.name: _from_json(value.get(f.name), f.type) for f in t}
    return value


class ArrowFrames(BatchFrames):
    """The ledger's output collected once; frames are Arrow tables."""

    def __init__(self, batch: pa.Table, key_columns: tuple[str, ...]) -> None:
        self.batch = batch
        self.columns = answer_schema(key_columns).names
        self._schemas: dict[str, pa.Schema] = {}

    def _where(self, kind: str, table: str) -> pa.Table:
        if self.batch.num_rows == 0:
            return self.batch
        mask = pc.and_(pc.equal(self.batch.column("_kind"), kind),
                       pc.equal(self.batch.column("_table"), table))
        return self.batch.filter(pc.fill_null(mask, False))

    def answers(self, table: str, kind: str) -> pa.Table:
        extra = ["model_text"] if table == SHADOW_ANSWERS else []
        return self._where(kind, table).select([*self.columns, *extra])

    def records(self, table: str, schema: Any) -> pa.Table:
        from pyspark.sql.pandas.types import to_arrow_schema

        if table not in self._schemas:
            self._schemas[table] = to_arrow_schema(schema)
        arrow = self._schemas[table]
        rows = [json.loads(p) for p in self._where(RECORD, table).column("_payload").to_pylist()]
        parsed = pa.Table.from_pylist(
            [{f.name: _from_json(r.get(f.name), f.type) for f in arrow} for r in rows],
            schema=arrow)
        return with_partition(parsed) if "enqueue_ts" in parsed.column_names else parsed

    def summary(self) -> list[dict]:
        from spark_ext.l4.writers.base import summarize

        return summarize(self.batch.select(["_kind", "_table", "answer_source", "status",
                                            "reason", "_payload"]))
