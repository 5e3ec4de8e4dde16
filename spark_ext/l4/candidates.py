"""L4 on the executors: what each arriving row offers the ledger
(:mod:`spark_ext.l4.ledger`), computed by ``mapInArrow`` with the same answer builders
for every writer (:mod:`spark_ext.l4.answers`).

- A **result row** of this pipeline offers its answer (``ok`` -> ``llm`` unless the text
  breaks a validation rule, else the fallback) and its ``results`` record; an invalid
  ``ok`` also a ``review_queue`` record; a shadow request's result offers a
  ``shadow_answers`` row instead.
- An **ack row** of the submit tasks (:mod:`spark_ext.submit.ack_channel`) offers: for a
  request the sidecar accepted, a *watch* carrying its ``no_result`` fallback; for one
  it refused (or could not be reached for), the fallback; for an event L1/L2 or the
  rollout's rule arm answered, that answer; and the ``requests`` (or ``dead_letters``)
  record.

Each function takes an iterator of Arrow record batches (one partition) and yields
batches of :func:`~spark_ext.l4.ledger.ledger_schema`; its keyword arguments are plain
data, so it travels with the plan (to Spark Connect's server too). The time of every
row is the micro-batch's (``_now``, Spark's ``current_timestamp()``), so a replayed
batch offers the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from spark_ext.config import ValidationConfig
from spark_ext.l4.answers import (REVIEW_SCHEMA, answers_for_lost, answers_from_refusals,
                                  answers_from_results, build_answers, fast_answers,
                                  invalid_results, reject_invalid, request_fallbacks,
                                  review_rows)
from spark_ext.l4.ledger import (ANSWER, ANSWERS, RECORD, SHADOW_ANSWERS, WATCH,
                                 ledger_schema)
from spark_ext.l4.rollout import ARM_COLUMN, SHADOW_ATTRIBUTE, rollout_answers
from spark_ext.l4.validation import AnswerValidator

#: Input columns the answers query adds before these functions: the batch's time and
#: the row as JSON (what its table record keeps).
NOW, PAYLOAD = "_now", "_payload"
#: Table of result rows that do not parse: counted and logged, never written.
UNREADABLE = "_unreadable"
#: Table of the per-event L1/L2 figures (route, retrieval): counted, never written.
EVENTS = "_events"


def review_schema(key_columns: tuple[str, ...]) -> pa.Schema:
    """The ``review_queue`` table's columns (its records)."""
    extra = [pa.field(k, pa.string()) for k in key_columns if k not in REVIEW_SCHEMA.names]
    return pa.schema([*REVIEW_SCHEMA, *extra, pa.field("enqueue_hour", pa.string())])


def _rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.Table]:
    for batch in batches:
        if batch.num_rows:
            yield pa.Table.from_batches([batch])


def _offers(rows: list[dict], *, kind: str, table: str, keys: list[str], now: int,
            grace_ms: int, hold_ms: int, due: bool = False,
            model_text: dict[str, str | None] | None = None) -> list[dict]:
    """Answer rows as ledger candidates: timing as of ``now``, ``_expire_ts`` =
    deadline + grace + hold, ``_due_ts`` = deadline + grace for watches."""
    if not rows:
        return []
    out = build_answers(rows, keys, now).to_pylist()
    for r in out:
        deadline = r.get("deadline_ts")
        anchor = deadline if deadline is not None else (r.get("enqueue_ts") or now)
        r.update(_kind=kind, _table=table, _now=now, _expire_ts=anchor + grace_ms + hold_ms,
                 _due_ts=anchor + grace_ms if due else None,
                 model_text=(model_text or {}).get(r["request_id"]))
    return out


def _records(table: pa.Table, name: str, now: int, *, keep_ms: int = 0) -> list[dict]:
    """One record per row of ``table`` for table ``name`` (its JSON in ``_payload``);
    its identity (``request_id``, for a dead letter its topic, partition and offset) is
    remembered ``keep_ms`` past its deadline (past ``now`` without one)."""
    if table.num_rows == 0:
        return []
    if "request_id" in table.column_names and name != "dead_letters":
        ids = table.column("request_id").to_pylist()
    elif "_kafka_offset" in table.column_names:
        ids = [f"{t}/{p}/{o}" for t, p, o in zip(*(table.column(c).to_pylist() for c in (
            "_kafka_topic", "_kafka_partition", "_kafka_offset")))]
    else:
        ids = [None] * table.num_rows
    deadlines = (table.column("deadline_ts").to_pylist() if "deadline_ts" in table.column_names
                 else [None] * table.num_rows)
    return [{"request_id": rid, "_kind": RECORD, "_table": name, "_now": now, "_payload": p,
             "_expire_ts": (d if d is not None else now) + keep_ms}
            for rid, p, d in zip(ids, table.column(PAYLOAD).to_pylist(), deadlines)]


def _batch_now(table: pa.Table) -> int:
    return int(pc.max(table.column(NOW)).as_py())


def _emit(rows: list[dict], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    if rows:
        yield from pa.Table.from_pylist(rows, schema=schema).to_batches()


def result_candidates(batches: Iterator[pa.RecordBatch], *, key_columns: tuple[str, ...],
                      fallback_text: str, validation: ValidationConfig, grace_ms: int,
                      hold_ms: int) -> Iterator[pa.RecordBatch]:
    """This pipeline's result rows (``sidecar.contract.RESULT_SCHEMA`` plus ``_now`` and
    ``_payload``) -> candidates (see the module docstring)."""
    check = AnswerValidator(validation).check
    keys = list(key_columns)
    schema = ledger_schema(key_columns)
    timing = dict(keys=keys, grace_ms=grace_ms, hold_ms=hold_ms)
    for table in _rows(batches):
        now = _batch_now(table)
        unreadable = pc.invert(pc.is_valid(table.column("status")))
        out = _records(table.filter(unreadable), UNREADABLE, now)
        table = table.filter(pc.invert(unreadable))
        out += _records(table, "results", now)
        shadow = _shadow_mask(table)
        for rows, name in ((table.filter(pc.invert(shadow)), ANSWERS),
                           (table.filter(shadow), SHADOW_ANSWERS)):
            if rows.num_rows == 0:
                continue
            if name == SHADOW_ANSWERS:  # a shadow answer is never backfilled
                rows = rows.filter(pc.invert(pc.fill_null(rows.column("late"), False)))
            invalid = invalid_results(rows, check)
            own = request_fallbacks(rows) if invalid else None
            answers = reject_invalid(answers_from_results(rows, key_columns=keys,
                                                          fallback_text=fallback_text),
                                     invalid, fallback_text, own)
            texts = ({r: t for r, t, s in zip(rows.column("request_id").to_pylist(),
                                               rows.column("text").to_pylist(),
                                               rows.column("status").to_pylist()) if s == "ok"}
                     if name == SHADOW_ANSWERS else None)
            out += _offers(answers, kind=ANSWER, table=name, now=now, model_text=texts,
                           **timing)
            if invalid and name == ANSWERS:  # a person looks at them
                review = review_rows(rows, invalid, key_columns=keys,
                                     fallback_text=fallback_text, now_ms=now)
                out += [{"request_id": r["request_id"], "_kind": RECORD,
                         "_table": "review_queue", "_now": now, "_payload": json.dumps(r)}
                        for r in review.to_pylist()]
        yield from _emit(out, schema)


def _shadow_mask(results: pa.Table) -> pa.Array:
    """Which result rows answer shadow requests (by their attribute)."""
    if results.num_rows == 0:
        return pa.array([], pa.bool_())
    flag = pc.map_lookup(results.column("attributes"), SHADOW_ATTRIBUTE, "first")
    return pc.fill_null(pc.equal(flag, "1"), False)


def ack_candidates(batches: Iterator[pa.RecordBatch], *, key_columns: tuple[str, ...],
                   fallback_text: str, rule_text: str, rollout_mode: str,
                   submit_column: str | None, dead_letter_column: str | None,
                   grace_ms: int, hold_ms: int, count_events: bool
                   ) -> Iterator[pa.RecordBatch]:
    """The submit tasks' ack rows (the submit query's output, plus ``_now``,
    ``_payload``: the ``requests`` or ``dead_letters`` row as JSON, and with
    ``count_events`` ``_events``: the L1/L2 figures) -> candidates."""
    keys = list(key_columns)
    schema = ledger_schema(key_columns)
    timing = dict(keys=keys, grace_ms=grace_ms, hold_ms=hold_ms)
    for table in _rows(batches):
        now = _batch_now(table)
        out: list[dict] = []
        if dead_letter_column and dead_letter_column in table.column_names:
            dead = pc.is_valid(table.column(dead_letter_column))
            out += _records(table.filter(dead), "dead_letters", now, keep_ms=hold_ms)
            table = table.filter(pc.invert(dead))
        if count_events and EVENTS in table.column_names:
            out += [{"_kind": RECORD, "_table": EVENTS, "_now": now, "_payload": p}
                    for p in table.column(EVENTS).to_pylist()]
        submitted = (pc.fill_null(table.column(submit_column), False)
                     if submit_column and submit_column in table.column_names
                     else pa.array([True] * table.num_rows, pa.bool_()))
        sent = table.filter(submitted)
        out += _records(sent, "requests", now, keep_ms=grace_ms + hold_ms)
        shadow = (pc.fill_null(pc.equal(sent.column(ARM_COLUMN), "shadow"), False)
                  if ARM_COLUMN in sent.column_names else pa.array([False] * sent.num_rows, pa.bool_()))
        served, shadowed = sent.filter(pc.invert(shadow)), sent.filter(shadow)
        out += _offers(answers_from_refusals(served, key_columns=keys,
                                             fallback_text=fallback_text),
                       kind=ANSWER, table=ANSWERS, now=now, **timing)
        out += _offers(answers_from_refusals(shadowed, key_columns=keys,
                                             fallback_text=fallback_text),
                       kind=ANSWER, table=SHADOW_ANSWERS, now=now, **timing)
        accepted = served.filter(pc.fill_null(served.column("accepted"), False))
        out += _offers(answers_for_lost(accepted.to_pylist(), key_columns=keys,
                                        fallback_text=fallback_text),
                       kind=WATCH, table=ANSWERS, now=now, due=True, **timing)
        held = table.filter(pc.invert(submitted))
        answers = fast_answers(held.to_pylist(), key_columns=keys, rule_text=rule_text) \
            if "route" in held.column_names else []
        if ARM_COLUMN in table.column_names:
            arm = pc.fill_null(pc.is_in(table.column(ARM_COLUMN),
                                        pa.array(["rule", "shadow"])), False)
            answers += rollout_answers(table.filter(arm).to_pylist(), mode=rollout_mode,
                                       key_columns=keys, rule_text=fallback_text)
        out += _offers(answers, kind=ANSWER, table=ANSWERS, now=now, **timing)
        yield from _emit(out, schema)



#: Columns of an arrival (:mod:`spark_ext.l4.arrivals`): one of ``result`` and ``ack``
#: is set (a struct of the row), ``_payload`` is its record's JSON.
RESULT, ACK = "result", "ack"


def _struct_rows(table: pa.Table, column: str) -> pa.Table:
    """The rows of ``table`` whose struct ``column`` is set, as a table of its fields
    plus the arrival's ``_now``, ``_payload`` (and ``_events``)."""
    rows = table.filter(pc.is_valid(table.column(column)))
    struct = rows.column(column).combine_chunks()
    names = [struct.type.field(i).name for i in range(struct.type.num_fields)]
    out = pa.Table.from_arrays(struct.flatten(), names=names)
    for extra in (NOW, PAYLOAD, EVENTS):
        if extra in rows.column_names and extra not in out.column_names:
            out = out.append_column(extra, rows.column(extra))
    return out


def arrival_candidates(batches: Iterator[pa.RecordBatch], *, results: dict, acks: dict
                       ) -> Iterator[pa.RecordBatch]:
    """Arrivals (result rows and ack rows of one stream) -> candidates, each kind by
    :func:`result_candidates` or :func:`ack_candidates` with its keyword arguments."""
    for table in _rows(batches):
        for column, fn, options in ((RESULT, result_candidates, results),
                                    (ACK, ack_candidates, acks)):
            if column in table.column_names and pc.any(pc.is_valid(table.column(column))).as_py():
                rows = _struct_rows(table, column)
                yield from fn(iter(rows.to_batches()), **options)
