"""L4's one decision per request: which candidate becomes its answer row, and when.

The answers query turns everything that arrives (result rows, the submit tasks' acks)
into *candidates* (:mod:`spark_ext.l4.candidates`), spreads them over a few buckets by
``request_id`` and hands each bucket to :func:`ledger_step` with what the bucket
remembers (the state of a Spark stateful operator, so it survives restarts and a
replayed micro-batch decides the same). Per request:

- the first candidate answer (a model's answer, a result's or a refusal's fallback, an
  L1/L2 answer) becomes the answer row: an **append** (no table read, no MERGE);
- an accepted request (``watch``) brings its ``no_result`` fallback with it; when no
  answer came by ``deadline + grace`` (``due_ts``) that fallback is appended, also when
  nothing arrives at all (a clock tick wakes every bucket);
- a model's answer for a request answered with the fallback is a **backfill**: a MERGE
  that upgrades that one row;
- anything else for a request already answered is dropped (a repeated result, a
  replayed ack).

A request is remembered until ``expire_ts`` (deadline + grace + a hold), then
forgotten; a candidate for a request past it, or enqueued before this ledger's run
began (``merge_before``: a new checkpoint), may meet an answer the ledger does not know
of, so it goes to the table as a **merge** (insert if missing, upgrade a fallback):
correctness never depends on how long the ledger remembers, only the cost does.

Rows for the other tables (``requests``, ``results``, ``dead_letters``,
``review_queue``) travel through as **records** in the same output, so one query
writes every table: one writer per table.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_ext.l4.answers import answer_schema

# Candidate kinds (``_kind`` of the ledger's input).
ANSWER = "answer"
"""A candidate answer: the first for a request wins; a model's answer after the fallback
backfills it."""
WATCH = "watch"
"""An accepted request; its row is the fallback given at ``_due_ts`` if no answer came."""
RECORD = "record"
"""A row for table ``_table`` (its JSON in ``_payload``), passed through."""
CLOCK = "clock"
"""A tick: due fallbacks are given even when nothing else arrives."""

# Output kinds (``_kind`` of the ledger's output).
APPEND = "append"
"""A new answer row: appended to ``_table``."""
MERGE = "merge"
"""An answer row to merge into ``_table``: a backfill, or a candidate the ledger cannot
decide alone (insert if missing; a model's answer upgrades a fallback)."""
STATS = "stats"
"""One row per bucket and step: ``_payload`` is ``{"open": n, "remembered": n,
"next_due_ts": ms}``."""

# PySpark's applyInPandasWithState concatenates each group's pandas frames and pandas
# warns about all-null columns there on every call (harmless: the types come from the
# schema). This module is what the Python worker imports to run the ledger.
warnings.filterwarnings("ignore", category=FutureWarning,
                        message="The behavior of DataFrame concatenation with empty")

#: Record tables that keep one row per request (or dead letter): a replayed submit
#: batch's acks bring their records again; ``results`` keeps every row the sidecar wrote.
ONCE_RECORDS = frozenset({"requests", "dead_letters"})

#: How long after ``deadline + grace`` the ledger remembers an answered request (a
#: repeat then is dropped without a table read; later ones are merged, which is as
#: correct and costs a read).
STATE_HOLD_MS = 30_000

#: The answers tables a candidate may be for.
ANSWERS, SHADOW_ANSWERS = "answers", "shadow_answers"

#: Control columns of candidates and outputs, after the answer columns.
CONTROL = pa.schema([
    ("model_text", pa.string()),
    ("_kind", pa.string()),
    ("_table", pa.string()),
    ("_bucket", pa.int32()),
    ("_now", pa.int64()),
    ("_due_ts", pa.int64()),
    ("_expire_ts", pa.int64()),
    ("_payload", pa.string()),
])


def ledger_schema(key_columns: Iterable[str]) -> pa.Schema:
    """The columns of candidates and of the ledger's output: the answer columns
    (:func:`~spark_ext.l4.answers.answer_schema`) then :data:`CONTROL`.

    Example:
        >>> ledger_schema(["ticket_id"]).names[-9:]
        ['ticket_id', 'model_text', '_kind', '_table', '_bucket', '_now', '_due_ts', '_expire_ts', '_payload']
    """
    return pa.schema([*answer_schema(key_columns), *CONTROL])


#: What a bucket remembers of each answered request.
ANSWERED_SCHEMA = pa.schema([("key", pa.string()), ("source", pa.string()),
                             ("expire_ts", pa.int64())])


@dataclass
class LedgerState:
    """What one bucket remembers: answered requests (key, how, until when), the watched
    requests that have no answer yet (their full fallback rows), and the records held
    for the next flush (:func:`hold_records`)."""

    answered: pa.Table
    open: pa.Table
    held: pa.Table

    @classmethod
    def empty(cls, schema: pa.Schema) -> "LedgerState":
        return cls(ANSWERED_SCHEMA.empty_table(), schema.empty_table(), schema.empty_table())

    def to_bytes(self) -> tuple[bytes, bytes, bytes]:
        return _ipc(self.answered), _ipc(self.open), _ipc(self.held)

    @classmethod
    def from_bytes(cls, answered: bytes, open_: bytes, held: bytes | None,
                   schema: pa.Schema) -> "LedgerState":
        return cls(_unipc(answered, ANSWERED_SCHEMA), _unipc(open_, schema),
                   _unipc(held, schema))


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _unipc(data: bytes | None, schema: pa.Schema) -> pa.Table:
    if not data:
        return schema.empty_table()
    return pa.ipc.open_stream(data).read_all().cast(schema)


def _keys(table: pa.Table) -> pa.Array:
    """``<table>|<request_id>``: a request's identity in the ledger."""
    if table.num_rows == 0:
        return pa.array([], pa.string())
    return pc.binary_join_element_wise(table.column("_table"), table.column("request_id"), "|")


def _with_kind(rows: pa.Table, kinds: list[str]) -> pa.Table:
    i = rows.schema.get_field_index("_kind")
    return rows.set_column(i, "_kind", pa.array(kinds, pa.string()))


def _answered_at(rows: pa.Table, now: int) -> pa.Table:
    """Fallback rows given now: ``answered_ts``, ``latency_ms`` and ``deadline_met``
    as of ``now``."""
    n = rows.num_rows
    at = pa.array([now] * n, pa.int64())
    latency = pc.subtract(at, rows.column("enqueue_ts"))
    met = pc.less_equal(at, rows.column("deadline_ts"))
    for name, values in (("answered_ts", at), ("latency_ms", latency), ("deadline_met", met),
                         ("_now", at)):
        rows = rows.set_column(rows.schema.get_field_index(name), name, values)
    return rows


def _as_backfill(rows: pa.Table, now: int) -> pa.Table:
    n = rows.num_rows
    for name, values in (("answer_source", pa.array(["backfill"] * n, pa.string())),
                         ("status", pa.array(["ok"] * n, pa.string())),
                         ("backfilled_at", pa.array([now] * n, pa.int64()))):
        rows = rows.set_column(rows.schema.get_field_index(name), name, values)
    return rows


def ledger_step(state: LedgerState, candidates: pa.Table, *, now: int,
                merge_before: int) -> tuple[pa.Table, LedgerState]:
    """Decide one bucket's candidates of one micro-batch (see the module docstring).

    Args:
        state: What the bucket remembers.
        candidates: Rows of :func:`ledger_schema` (any kinds, in arrival order).
        now: The micro-batch's time (epoch ms): the same when the batch is replayed.
        merge_before: Requests enqueued before this (the ledger's run start) are
            decided by the table (``merge``), not by the ledger.

    Returns:
        The output rows (same schema, ``_kind`` one of :data:`APPEND`, :data:`MERGE`,
        :data:`RECORD`) and the new state.

    Example:
        >>> import pyarrow as pa
        >>> schema = ledger_schema(["event_id"])
        >>> def row(kind, source, **kw):
        ...     return {"request_id": "r1", "answer_source": source, "_kind": kind,
        ...             "_table": "answers", "enqueue_ts": 100, "deadline_ts": 1_000,
        ...             "_due_ts": 1_500, "_expire_ts": 9_000, **kw}
        >>> watch = pa.Table.from_pylist([row("watch", "fallback")], schema)
        >>> out, st = ledger_step(LedgerState.empty(schema), watch, now=200, merge_before=0)
        >>> out.num_rows, st.open.num_rows               # watched, nothing due yet
        (0, 1)
        >>> out, st = ledger_step(st, schema.empty_table(), now=1_600, merge_before=0)
        >>> out.column("_kind").to_pylist(), out.column("answered_ts").to_pylist()
        (['append'], [1600])
        >>> late = pa.Table.from_pylist([row("answer", "llm")], schema)
        >>> out, st = ledger_step(st, late, now=2_000, merge_before=0)
        >>> out.column("_kind").to_pylist(), out.column("answer_source").to_pylist()
        (['merge'], ['backfill'])
        >>> out, st = ledger_step(st, late, now=2_100, merge_before=0)  # a repeat
        >>> out.num_rows
        0
    """
    keys = _keys(candidates).to_pylist() if candidates.num_rows else []
    known = _known(state, keys)
    decided = _decide(candidates, keys, known, now=now, merge_before=merge_before)
    parts = []
    if decided.out_index:
        parts.append(_with_kind(candidates.take(decided.out_index), decided.out_kind))
    if decided.backfill_index:
        rows = _as_backfill(candidates.take(decided.backfill_index), now)
        parts.append(_with_kind(rows, [MERGE] * rows.num_rows))
    # Watched requests: still open ones (not answered now) and new ones; give the due.
    still_open = state.open
    if decided.closed and still_open.num_rows:
        still_open = still_open.filter(pc.invert(pc.is_in(
            _keys(still_open), value_set=pa.array(list(decided.closed), pa.string()))))
    if new_open := [i for i in decided.new_open if keys[i] not in decided.closed]:
        still_open = pa.concat_tables([still_open, candidates.take(new_open)])
    given, still_open = _give_due(still_open, now=now, merge_before=merge_before)
    if given is not None:
        parts.append(given)
        for key, exp in zip(_keys(given).to_pylist(), given.column("_expire_ts").to_pylist()):
            decided.remembered[key] = ("fallback", exp if exp is not None else now)
    answered = _remember(state.answered, decided.remembered, now=now)
    out = pa.concat_tables(parts) if parts else candidates.schema.empty_table()
    return out, LedgerState(answered, still_open, state.held)


def _known(state: LedgerState, keys: list[str]) -> dict[str, str | None]:
    """What the bucket knows of each key: ``open`` (watched), how it was answered (its
    source), or nothing (``None``)."""
    known: dict[str, str | None] = {}
    if not keys:
        return known
    lookup = pa.array(keys, pa.string())
    ans_at = pc.index_in(lookup, value_set=state.answered.column("key")).to_pylist()
    open_at = pc.index_in(lookup, value_set=_keys(state.open)).to_pylist()
    ans_sources = state.answered.column("source")
    for key, a, o in zip(keys, ans_at, open_at):
        if key not in known:
            known[key] = "open" if o is not None else (
                ans_sources[a].as_py() if a is not None else None)
    return known


@dataclass
class _Decisions:
    """What :func:`_decide` made of one micro-batch's candidates (row indexes)."""

    out_index: list[int] = field(default_factory=list)
    out_kind: list[str] = field(default_factory=list)
    backfill_index: list[int] = field(default_factory=list)
    new_open: list[int] = field(default_factory=list)
    closed: set[str] = field(default_factory=set)
    remembered: dict[str, tuple[str, int]] = field(default_factory=dict)


def _decide(candidates: pa.Table, keys: list[str], known: dict[str, str | None], *,
            now: int, merge_before: int) -> _Decisions:
    """One pass over the candidates in arrival order (``known`` is updated as it goes):
    records through (once for :data:`ONCE_RECORDS`), a watch opened unless answered,
    the first answer out (a merge when stale), a model's answer after the fallback as
    its backfill, any repeat dropped."""
    n = candidates.num_rows
    column = (lambda name: candidates.column(name).to_pylist()) if n else (lambda name: [])
    kinds, sources, tables = column("_kind"), column("answer_source"), column("_table")
    expires, enqueued = column("_expire_ts"), column("enqueue_ts")
    d = _Decisions()
    for i in range(n):
        kind, key = kinds[i], keys[i]
        if kind == RECORD:
            if tables[i] in ONCE_RECORDS:  # a replayed ack brings its record again
                if known.get(key) is not None:
                    continue
                known[key] = "recorded"
                d.remembered[key] = ("recorded", expires[i] if expires[i] is not None else now)
            d.out_index.append(i)
            d.out_kind.append(RECORD)
            continue
        status = known.get(key)
        if kind == WATCH:
            if status is None:  # an answer that came first wins; a repeated ack is one
                d.new_open.append(i)
                known[key] = "open"
            continue
        if kind != ANSWER:
            continue
        stale = expires[i] is None or expires[i] <= now or (
            enqueued[i] is not None and enqueued[i] < merge_before)
        source = sources[i]
        if status is None or status == "open":
            d.out_index.append(i)
            d.out_kind.append(MERGE if stale else APPEND)
            if status == "open":
                d.closed.add(key)
        elif status == "fallback" and source == "llm" and tables[i] == ANSWERS:
            d.backfill_index.append(i)
            source = "backfill"
        else:
            continue  # answered already: a repeat
        known[key] = source
        d.remembered[key] = (source, expires[i] if expires[i] is not None else now)
    return d


def _give_due(still_open: pa.Table, *, now: int, merge_before: int
              ) -> tuple[pa.Table | None, pa.Table]:
    """The fallbacks of the watched requests due by ``now`` (a merge when stale), and
    those still open."""
    if not still_open.num_rows:
        return None, still_open
    due = pc.fill_null(pc.less_equal(still_open.column("_due_ts"), now), True)
    if not pc.any(due).as_py():
        return None, still_open
    given = _answered_at(still_open.filter(due), now)
    stale = pc.or_(pc.fill_null(pc.less_equal(given.column("_expire_ts"), now), True),
                   pc.fill_null(pc.less(given.column("enqueue_ts"), merge_before), False))
    return (_with_kind(given, [MERGE if s else APPEND for s in stale.to_pylist()]),
            still_open.filter(pc.invert(due)))


def _remember(answered: pa.Table, remembered: dict[str, tuple[str, int]], *, now: int
              ) -> pa.Table:
    """The answered requests: the expired forgotten, those decided now updated."""
    if answered.num_rows:
        keep = pc.greater(answered.column("expire_ts"), now)
        if remembered:
            keep = pc.and_(keep, pc.invert(pc.is_in(
                answered.column("key"), value_set=pa.array(list(remembered), pa.string()))))
        answered = answered.filter(keep)
    fresh = [(k, s, e) for k, (s, e) in remembered.items() if e > now]
    if fresh:
        answered = pa.concat_tables([answered, pa.Table.from_arrays(
            [pa.array([f[0] for f in fresh], pa.string()),
             pa.array([f[1] for f in fresh], pa.string()),
             pa.array([f[2] for f in fresh], pa.int64())], schema=ANSWERED_SCHEMA)])
    return answered


#: Most records a bucket holds between flushes (then it flushes at once).
MAX_HELD_RECORDS = 50_000
#: Where in each window a record table's flush falls (a share of the window): ``requests``
#: and ``results``, the two that have rows every window, half a window apart, so no
#: micro-batch commits both (measured at 200 events/s on 2 cores: 0.7-1.3 s each).
RECORD_PHASES = {"requests": 0.0, "results": 0.5, "dead_letters": 0.25, "review_queue": 0.75}


def _window_start(table: str | None, at: int, every_ms: int) -> int:
    """The start of table ``table``'s window that holds time ``at`` (epoch ms)."""
    shift = int(every_ms * RECORD_PHASES.get(table or "", 0.0))
    return (at - shift) // every_ms * every_ms + shift


def _oldest_by_table(held: pa.Table) -> dict[str | None, int | None]:
    """Each record table in ``held`` and the oldest ``_now`` of its rows, in one pass
    over those two columns (the rows' payloads are not touched)."""
    if held.num_rows == 0:
        return {}
    oldest = held.select(["_table", "_now"]).group_by("_table").aggregate([("_now", "min")])
    return dict(zip(oldest.column("_table").to_pylist(), oldest.column("_now_min").to_pylist()))


def hold_records(held: pa.Table, records: pa.Table, *, now: int, every_ms: int
                 ) -> tuple[pa.Table, pa.Table]:
    """Records to write now and records to hold: a table's records are written in the
    first micro-batch of each of its ``every_ms`` windows (epoch-aligned and shifted by
    :data:`RECORD_PHASES`, so every bucket flushes a table in the same micro-batch: one
    commit per table per window, and two tables in different micro-batches), all at
    once with ``every_ms`` = 0 or past :data:`MAX_HELD_RECORDS`.

    Returns:
        (records to write, records still held).

    Example:
        >>> import pyarrow as pa
        >>> schema = ledger_schema([])
        >>> rec = lambda t: pa.Table.from_pylist([{"_kind": "record", "_now": t}], schema)
        >>> out, held = hold_records(schema.empty_table(), rec(1_000), now=1_000, every_ms=10_000)
        >>> out.num_rows, held.num_rows
        (0, 1)
        >>> out, held = hold_records(held, rec(10_500), now=10_500, every_ms=10_000)
        >>> out.num_rows, held.num_rows              # a new window: both go out
        (2, 0)
    """
    both = pa.concat_tables([held, records]) if held.num_rows else records
    if every_ms <= 0 or both.num_rows >= MAX_HELD_RECORDS or both.num_rows == 0:
        return both, both.schema.empty_table()
    due_tables = [table for table, oldest in _oldest_by_table(both).items()
                  if oldest is not None and
                  _window_start(table, oldest, every_ms) < _window_start(table, now, every_ms)]
    if not due_tables:
        return both.schema.empty_table(), both
    due = pc.is_in(both.column("_table"), value_set=pa.array(due_tables, pa.string()),
                   skip_nulls=False)
    return both.filter(due), both.filter(pc.invert(due))


def stats_payload(state: LedgerState, every_ms: int) -> dict[str, Any]:
    """What a bucket's :data:`STATS` row says: watched requests without an answer, ids
    remembered, records held, and the next time the bucket has work without any new
    arrival: a fallback falling due, or held records to flush (``None``: none)."""
    due = [pc.min(state.open.column("_due_ts")).as_py()] if state.open.num_rows else []
    for table, oldest in _oldest_by_table(state.held).items():
        if oldest is not None:
            due.append(_window_start(table, oldest, every_ms) + every_ms)
    return {"open": state.open.num_rows, "remembered": state.answered.num_rows,
            "held": state.held.num_rows, "next_due_ts": min(due) if due else None}


class BucketLedger:
    """The ledger as the function of Spark's ``applyInPandasWithState`` (one call per
    bucket and micro-batch; the state is the two Arrow IPC blobs of
    :class:`LedgerState`). Plain data, so it pickles to the executors and to Spark
    Connect's server.

    Args:
        key_columns: The event's key columns.
        merge_before: See :func:`ledger_step`.
        records_every_ms: See :func:`hold_records`.
    """

    #: The Spark state's schema (DDL).
    STATE_DDL = "answered BINARY, open BINARY, held BINARY"

    def __init__(self, key_columns: tuple[str, ...], merge_before: int,
                 records_every_ms: int = 0) -> None:
        self.key_columns = tuple(key_columns)
        self.merge_before = merge_before
        self.records_every_ms = records_every_ms

    def __call__(self, key: tuple, pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        import json

        schema = ledger_schema(self.key_columns)
        tables = [pa.Table.from_pandas(pdf, schema=schema, preserve_index=False)
                  for pdf in pdfs if len(pdf)]
        candidates = pa.concat_tables(tables) if tables else schema.empty_table()
        now = int(pc.max(candidates.column("_now")).as_py()) if candidates.num_rows else None
        if now is None:  # nothing to decide with: no time (never happens with a clock row)
            return
        current = (LedgerState.from_bytes(*state.get, schema=schema) if state.exists
                   else LedgerState.empty(schema))
        out, after = ledger_step(current, candidates, now=now, merge_before=self.merge_before)
        is_record = pc.equal(out.column("_kind"), RECORD)
        records, after.held = hold_records(after.held, out.filter(is_record), now=now,
                                           every_ms=self.records_every_ms)
        state.update(after.to_bytes())
        bucket = int(key[0])
        payload = {"bucket": bucket, **stats_payload(after, self.records_every_ms)}
        stats = pa.Table.from_pylist([{"_kind": STATS, "_bucket": bucket, "_now": now,
                                       "_payload": json.dumps(payload)}], schema)
        yield pa.concat_tables([out.filter(pc.invert(is_record)), records, stats]).to_pandas(
            types_mapper=_PANDAS_TYPES.get)


#: Arrow -> pandas types that keep nulls in integer and boolean columns.
_PANDAS_TYPES: dict[pa.DataType, Any] = {}
try:  # pandas' nullable dtypes
    import pandas as _pd

    _PANDAS_TYPES = {pa.int64(): _pd.Int64Dtype(), pa.int32(): _pd.Int32Dtype(),
                     pa.bool_(): _pd.BooleanDtype(), pa.string(): _pd.StringDtype()}
except ImportError:  # pragma: no cover - pandas ships with PySpark's pandas extras
    pass
