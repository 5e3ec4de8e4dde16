"""L4 on the executors: the answer rows of a micro-batch, computed by ``mapInArrow`` over
its Arrow batches with the same functions the driver-side writer uses
(:mod:`spark_ext.l4.answers`), so the two writers answer alike.

Each function takes an iterator of Arrow record batches (one partition) and yields
batches of one fixed schema; its keyword arguments are plain data, so it travels to the
executors (and to Spark Connect's server) with the plan.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from sidecar.contract import now_ms
from spark_ext.config import ValidationConfig
from spark_ext.l4.answers import (REVIEW_SCHEMA, answer_schema, answers_from_refusals,
                                  answers_from_results, build_answers, fast_answers,
                                  invalid_results, reject_invalid, review_rows)
from spark_ext.l4.rollout import ARM_COLUMN, rollout_answers
from spark_ext.l4.validation import AnswerValidator

#: ``answers`` plus the shadow table's own column.
SHADOW_EXTRA = pa.field("model_text", pa.string())


def shadow_schema(key_columns: tuple[str, ...]) -> pa.Schema:
    return answer_schema(key_columns).append(SHADOW_EXTRA)


def review_schema(key_columns: tuple[str, ...]) -> pa.Schema:
    extra = [pa.field(k, pa.string()) for k in key_columns if k not in REVIEW_SCHEMA.names]
    return pa.schema([*REVIEW_SCHEMA, *extra, pa.field("enqueue_hour", pa.string())])


def _rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.Table]:
    for batch in batches:
        if batch.num_rows:
            yield pa.Table.from_batches([batch])


def result_answers(batches: Iterator[pa.RecordBatch], *, key_columns: tuple[str, ...],
                   fallback_text: str, validation: ValidationConfig,
                   shadow: bool = False) -> Iterator[pa.RecordBatch]:
    """Result rows (terminal and late) -> answer rows: ``ok`` -> ``llm`` unless its text
    breaks a validation rule (then the fallback, ``status = invalid``), anything else ->
    ``fallback``. With ``shadow``, rows for the ``shadow_answers`` table (terminal rows
    only, the model's text kept in ``model_text``)."""
    check = AnswerValidator(validation).check
    keys = list(key_columns)
    schema = shadow_schema(key_columns) if shadow else answer_schema(key_columns)
    for table in _rows(batches):
        if shadow and "late" in table.column_names:
            table = table.filter(pc.invert(pc.fill_null(table.column("late"), False)))
        invalid = invalid_results(table, check)
        rows = reject_invalid(answers_from_results(table, key_columns=keys,
                                                   fallback_text=fallback_text),
                              invalid, fallback_text)
        out = build_answers(rows, keys, now_ms())
        if shadow:
            texts = {r["request_id"]: r["text"] for r in table.to_pylist() if r["status"] == "ok"}
            out = out.append_column(SHADOW_EXTRA, pa.array(
                [texts.get(rid) for rid in out.column("request_id").to_pylist()], pa.string()))
        yield from out.cast(schema).to_batches()


def review_queue_rows(batches: Iterator[pa.RecordBatch], *, key_columns: tuple[str, ...],
                      fallback_text: str, validation: ValidationConfig
                      ) -> Iterator[pa.RecordBatch]:
    """One ``review_queue`` row per ``ok`` result whose text breaks a validation rule."""
    from spark_ext.l4.answer_store import with_partition

    check = AnswerValidator(validation).check
    schema = review_schema(key_columns)
    for table in _rows(batches):
        if invalid := invalid_results(table, check):
            rows = review_rows(table, invalid, key_columns=list(key_columns),
                               fallback_text=fallback_text, now_ms=now_ms())
            yield from with_partition(rows).cast(schema).to_batches()


def ack_answers(batches: Iterator[pa.RecordBatch], *, key_columns: tuple[str, ...],
                fallback_text: str, rule_text: str, rollout_mode: str, submit_column: str | None,
                shadow: bool = False) -> Iterator[pa.RecordBatch]:
    """A submit micro-batch's rows -> the answers it gives at once: events L1/L2 answered
    (``rule``, ``drop``, ``kb``), events of the rollout's rule arm, and a fallback for
    every request the sidecar refused or could not be reached for. With ``shadow``: the
    shadow table's rows for refused shadow requests instead (nothing else)."""
    keys = list(key_columns)
    schema = shadow_schema(key_columns) if shadow else answer_schema(key_columns)
    for table in _rows(batches):
        submitted = (pc.fill_null(table.column(submit_column), False)
                     if submit_column and submit_column in table.column_names
                     else pa.array([True] * table.num_rows))
        sent = table.filter(submitted)
        shadow_rows = (pc.fill_null(pc.equal(sent.column(ARM_COLUMN), "shadow"), False)
                       if ARM_COLUMN in sent.column_names else pa.array([False] * sent.num_rows))
        if shadow:
            rows = answers_from_refusals(sent.filter(shadow_rows), key_columns=keys,
                                         fallback_text=fallback_text)
            out = build_answers(rows, keys, now_ms())
            out = out.append_column(SHADOW_EXTRA, pa.nulls(out.num_rows, pa.string()))
            yield from out.cast(schema).to_batches()
            continue
        rows = answers_from_refusals(sent.filter(pc.invert(shadow_rows)), key_columns=keys,
                                     fallback_text=fallback_text)
        held = table.filter(pc.invert(submitted))
        if "route" in held.column_names:
            rows += fast_answers(held.to_pylist(), key_columns=keys, rule_text=rule_text)
        if ARM_COLUMN in table.column_names:
            arm = pc.fill_null(pc.is_in(table.column(ARM_COLUMN), pa.array(["rule", "shadow"])),
                               False)
            rows += rollout_answers(table.filter(arm).to_pylist(), mode=rollout_mode,
                                    key_columns=keys, rule_text=fallback_text)
        yield from build_answers(rows, keys, now_ms()).cast(schema).to_batches()

