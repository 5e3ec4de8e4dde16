"""The interface of a table writer (one class per ``output.writer``, registered in
:mod:`spark_ext.l4.writers`).

The answers query's micro-batch (:class:`~spark_ext.l4.answers_batch.AnswersBatch`)
decides *what* goes to which table, in which order; a writer only knows *how*: it
turns the ledger's output into frames of its own kind (:meth:`TableWriter.frames`:
Spark DataFrames for Delta on Spark, Arrow tables for delta-rs) and appends or merges
them. Appends are idempotent by ``(app_id, version)`` (``app_id`` = the query's run
and the table, ``version`` = the batch id: :func:`append_marker` in each commit, and
Delta's app transaction), so a replayed micro-batch writes nothing twice; a merge
inserts a missing answer or upgrades a fallback, so it is idempotent by itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import pyarrow as pa


def summarize(rows: pa.Table) -> list[dict]:
    """:meth:`BatchFrames.summary` from the control columns of a micro-batch's ledger
    output (``_kind``, ``_table``, ``answer_source``, ``status``, ``reason``, ``_payload``).

    Example:
        >>> t = pa.table({"_kind": ["append", "append", "stats"], "_table": ["answers"] * 2
        ...               + [None], "answer_source": ["llm", "llm", None],
        ...               "status": ["ok", "ok", None], "reason": [None] * 3,
        ...               "_payload": [None, None, '{"bucket": 0}']})
        >>> summarize(t)[0]["n"], summarize(t)[1]["payloads"]
        (2, ['{"bucket": 0}'])
    """
    import collections

    from spark_ext.l4.ledger import STATS

    if rows.num_rows == 0:
        return []
    counts: collections.Counter = collections.Counter()
    payloads: dict[tuple, list[str]] = collections.defaultdict(list)
    for kind, table, source, status, reason, payload in zip(
            *(rows.column(c).to_pylist() for c in (
                "_kind", "_table", "answer_source", "status", "reason", "_payload"))):
        if kind == STATS or (table or "").startswith("_"):
            payloads[(kind, table)].append(payload)
        if kind != STATS:
            counts[(kind, table, source, status, reason)] += 1
    return ([{"_kind": k, "_table": t, "answer_source": s, "status": st, "reason": r, "n": n}
             for (k, t, s, st, r), n in counts.items()]
            + [{"_kind": k, "_table": t, "payloads": p} for (k, t), p in payloads.items()])


class BatchFrames(ABC):
    """One micro-batch's ledger output, in the writer's own kind of frame."""

    @abstractmethod
    def answers(self, table: str, kind: str) -> Any:
        """The answer rows of ``kind`` (``append`` or ``merge``) for ``table``
        (``answers``, ``shadow_answers``), with that table's columns."""

    @abstractmethod
    def records(self, table: str, schema: Any) -> Any:
        """The records for ``table``, parsed with ``schema`` (a Spark ``StructType``) and
        with their ``enqueue_hour``."""

    @abstractmethod
    def summary(self) -> list[dict]:
        """Counts per ``_kind``, ``_table``, ``answer_source`` and ``status`` (``n``),
        plus every ``stats`` row and the payloads of the uncounted tables (``_events``,
        ``_unreadable``) as ``payloads``."""

    def release(self) -> None:
        """Free what the frames hold (a cached DataFrame)."""


class TableWriter(ABC):
    """How the tables are created, written, read and kept small.

    Args:
        output: The pipeline's ``output`` section.
        key_columns: The event's key columns (kept in ``answers`` as strings).
    """

    name: ClassVar[str]
    """``output.writer`` value."""

    runs_on_connect: ClassVar[bool] = False
    """Whether the ``foreachBatch`` functions using it may run in a Spark Connect server
    (they then carry configuration only)."""

    records_interval_s: ClassVar[float] = 0.0
    """The default of ``output.records_interval_s`` (how often the record tables are
    written) for this writer: how much a commit costs decides it."""

    writes_with_spark: ClassVar[bool] = False
    """Whether Spark's own file systems write the tables (then Spark must reach
    ``output.out_dir``; otherwise only the checkpoints)."""

    query_confs: ClassVar[dict[str, str]] = {}
    """Spark settings of the query that writes the tables (the answers query) for this
    writer, set for that query only."""

    traces_answers: ClassVar[bool] = False
    """Whether it writes answers in this process, where it can emit the L4 spans through
    :attr:`tracer` (the executors of a Spark writer cannot)."""

    def __init__(self, output: Any, key_columns: tuple[str, ...]) -> None:
        self.output = output
        self.key_columns = tuple(key_columns)
        self.conflicts_retried = 0
        """Write conflicts retried (another writer committed first)."""
        self.tracer: Any = None
        """L4 spans (``answered``, ``backfilled``) when :attr:`traces_answers`; ``None``: off."""

    @classmethod
    def available(cls, spark: Any) -> bool:
        """Whether this writer can run in ``spark``."""
        return True

    @abstractmethod
    def location(self, name: str) -> str:
        """Where table ``name`` is (a path, or a catalog name)."""

    @abstractmethod
    def create_tables(self, spark: Any,
                      names: tuple[str, ...] = ("answers", "shadow_answers")) -> None:
        """Create the answer tables ``names`` (of ``answers`` and ``shadow_answers``:
        their columns, partitioning and the change data feed) unless they exist."""

    @abstractmethod
    def frames(self, batch: Any) -> BatchFrames:
        """The ledger's output ``batch`` (a DataFrame) as this writer's frames."""

    @abstractmethod
    def count(self, frame: Any) -> int:
        """Rows of one of :meth:`frames`' frames."""

    @abstractmethod
    def append(self, name: str, frame: Any, *, app_id: str, version: int) -> None:
        """Append ``frame`` to table ``name`` once per ``(app_id, version)``."""

    @abstractmethod
    def merge_answers(self, name: str, frame: Any, *, backfill: bool) -> dict[str, int]:
        """Merge answer rows into ``name``: insert those whose request has no row; with
        ``backfill``, a model's answer upgrades a fallback. Returns ``inserted`` and
        ``updated``."""

    @abstractmethod
    def read(self, spark: Any, name: str, columns: list[str] | None = None) -> pa.Table:
        """Table ``name`` as Arrow (empty when it does not exist)."""

    @abstractmethod
    def exists(self, spark: Any, name: str) -> bool:
        """Whether table ``name`` exists."""

    @abstractmethod
    def maintain(self, spark: Any, names: tuple[str, ...], hours: list[str], *,
                 vacuum_retention_hours: int | None) -> None:
        """Keep each table's files few: compact ``hours`` where the writes do not, and
        vacuum files past ``vacuum_retention_hours`` (``None``: no vacuum this time)."""

    @abstractmethod
    def version(self, spark: Any, name: str) -> int:
        """The latest version of table ``name``."""
