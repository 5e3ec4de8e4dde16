"""L4: answer rows, built in Arrow on the driver from what a micro-batch brings.

Three ways a request gets its one answer row, all with the same columns
(:data:`ANSWER_SCHEMA` plus the event's key columns):

- :func:`answers_from_results`: the fast path. The sidecar writes exactly one
  terminal row per accepted request by its deadline, so a result row *is* the
  answer: ``ok`` -> ``llm``; ``timeout``/``shed``/``rejected``/``error`` ->
  ``fallback`` with the pool's rule text. No join and no watermark.
- :func:`answers_from_refusals`: requests the sidecar refused at submission (or
  could not be reached for) are answered with the fallback at once.
- :func:`answers_for_lost`: the safety net, for accepted requests whose result
  never came (the sidecar was killed, a file was lost).

A late ``ok`` row (``late = true``, the ``finish_and_backfill`` policy) or an
``ok`` row for a request already answered with the fallback upgrades that answer
to ``backfill`` (:class:`spark_ext.l4.answer_store.AnswerStore`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sidecar.contract import RefusalReason, Status

#: Partition column of every table: the UTC hour of ``enqueue_ts`` (:func:`hour_of`).
PARTITION = "enqueue_hour"

#: Columns of the ``answers`` table (the event's key columns follow, as strings).
ANSWER_SCHEMA = pa.schema([
    ("request_id", pa.string()),
    ("trace_id", pa.string()),
    ("priority", pa.string()),
    ("answer", pa.string()),
    ("answer_source", pa.string()),
    ("status", pa.string()),
    ("reason", pa.string()),
    ("fallback_text", pa.string()),
    ("enqueue_ts", pa.int64()),
    ("submit_ts", pa.int64()),
    ("received_ts", pa.int64()),
    ("finish_ts", pa.int64()),
    ("deadline_ts", pa.int64()),
    ("answered_ts", pa.int64()),
    ("latency_ms", pa.int64()),
    ("deadline_met", pa.bool_()),
    ("backfilled_at", pa.int64()),
    ("kb_ids", pa.string()),
    ("enqueue_hour", pa.string()),
])

#: The retrieved article ids of a request: a column of the request rows (L2) and the
#: request attribute that carries them to the result row (comma-joined).
KB_IDS = "kb_ids"

#: ``reason`` of a safety-net fallback: no result row came by deadline + grace.
NO_RESULT = "no_result"
#: ``reason`` of a fallback for a request the sidecar could not be reached for.
UNAVAILABLE = "unavailable"

#: ``status`` of the answer row of a dropped event.
DROPPED = "dropped"


def hour_of(epoch_ms: int | None) -> str:
    """The partition value of a time: its UTC hour, ``YYYY-MM-DDTHH``.

    Example:
        >>> hour_of(1_700_000_000_000)
        '2023-11-14T22'
    """
    ms = epoch_ms if epoch_ms is not None else 0
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H")


def hours_between(start_ms: int, end_ms: int) -> list[str]:
    """Every UTC hour partition from ``start_ms`` to ``end_ms`` inclusive.

    Example:
        >>> hours_between(1_700_000_000_000, 1_700_000_000_000 + 3_600_000)
        ['2023-11-14T22', '2023-11-14T23']
    """
    first = (start_ms // 3_600_000) * 3_600_000
    return [hour_of(t) for t in range(first, end_ms + 1, 3_600_000)]


def answer_schema(key_columns: Iterable[str]) -> pa.Schema:
    """:data:`ANSWER_SCHEMA` plus the key columns (strings) it does not already have."""
    extra = [pa.field(k, pa.string()) for k in key_columns if k not in ANSWER_SCHEMA.names]
    return pa.schema(list(ANSWER_SCHEMA) + extra)


def build_answers(rows: list[dict], key_columns: list[str], answered_ts: int) -> pa.Table:
    """Answer rows as a table: timing columns derived from ``answered_ts`` (when the
    answer lands), the partition from ``enqueue_ts``, key columns as strings."""
    schema = answer_schema(key_columns)
    for row in rows:
        row["answered_ts"] = answered_ts
        enqueue, deadline = row.get("enqueue_ts"), row.get("deadline_ts")
        row["latency_ms"] = answered_ts - enqueue if enqueue is not None else None
        row["deadline_met"] = answered_ts <= deadline if deadline is not None else None
        row.setdefault("backfilled_at", None)
        row["enqueue_hour"] = hour_of(enqueue)
        for k in key_columns:
            if row.get(k) is not None and not isinstance(row[k], str):
                row[k] = str(row[k])
    return pa.Table.from_pylist(rows, schema=schema)


#: The request column (and result attribute) with a request's own fallback text: it wins
#: over the sidecar pool's and the configured one.
REQUEST_FALLBACK = "fallback_text"


def _fallback_text(own: str | None, default: str, request: str | None = None) -> str:
    return request or own or default


def answers_from_results(results: pa.Table, *, key_columns: list[str], fallback_text: str
                         ) -> list[dict]:
    """One answer per result row (the caller drops ids already answered)."""
    out = []
    for r in results.to_pylist():
        ok = r["status"] == "ok"
        attrs = dict(r.get("attributes") or {})
        fallback = _fallback_text(r.get("fallback_text"), fallback_text,
                                  attrs.get(REQUEST_FALLBACK))
        row = {
            "request_id": r["request_id"], "trace_id": r.get("trace_id"),
            "priority": r.get("priority"),
            "answer": r.get("text") if ok else fallback,
            "answer_source": "llm" if ok else "fallback",
            "status": r["status"], "reason": r.get("reason") or None,
            "fallback_text": None if ok else fallback,
            "enqueue_ts": r.get("enqueue_ts"), "submit_ts": r.get("submit_ts"),
            "received_ts": r.get("received_ts"), "finish_ts": r.get("finish_ts"),
            "deadline_ts": r.get("deadline_ts"), "kb_ids": attrs.get(KB_IDS),
        }
        row.update({k: attrs.get(k) for k in key_columns if k not in row})
        out.append(row)
    return out


def joined_ids(ids: Any) -> str | None:
    """Retrieved article ids as the answers table keeps them: ``"a,b"`` (``None``: no
    retrieval ran).

    Example:
        >>> joined_ids(["faq-1", "kb-7"]), joined_ids(None), joined_ids("faq-2")
        ('faq-1,kb-7', None, 'faq-2')
    """
    if ids is None:
        return None
    if isinstance(ids, str):
        return ids
    return ",".join(str(i) for i in ids)


def answers_from_refusals(acks: pa.Table, *, key_columns: list[str], fallback_text: str
                          ) -> list[dict]:
    """Fallback answers for the ack rows the sidecar did not accept."""
    refused = acks.filter(pc.invert(pc.fill_null(acks.column("accepted"), False)))
    out = []
    for a in refused.to_pylist():
        reason = a.get("reason") or UNAVAILABLE
        fallback = _fallback_text(a.get("sidecar_fallback_text"), fallback_text,
                                  a.get(REQUEST_FALLBACK))
        row = {
            "request_id": a["request_id"], "trace_id": a.get("trace_id"),
            "priority": a.get("priority"), "answer": fallback, "answer_source": "fallback",
            "status": (UNAVAILABLE if reason == UNAVAILABLE
                       else "shed" if reason in _SHED_REASONS else "rejected"),
            "reason": reason, "fallback_text": fallback,
            "enqueue_ts": a.get("enqueue_ts"), "submit_ts": a.get("submit_ts"),
            "received_ts": None, "finish_ts": None, "deadline_ts": a.get("deadline_ts"),
            "kb_ids": joined_ids(a.get(KB_IDS)),
        }
        row.update({k: a.get(k) for k in key_columns if k not in row})
        out.append(row)
    return out


#: Refusal reasons (as ack strings) that mean "shed under load", not "invalid": the
#: contract's own split (``RefusalReason.status``).
_SHED_REASONS = frozenset(str(r) for r in RefusalReason if r.status is Status.SHED)


def answers_for_lost(pending: Iterable[Mapping], *, key_columns: list[str], fallback_text: str
                     ) -> list[dict]:
    """Safety-net fallbacks for accepted requests that got no result row in time."""
    out = []
    for p in pending:
        fallback = _fallback_text(None, fallback_text, p.get(REQUEST_FALLBACK))
        row = {
            "request_id": p["request_id"], "trace_id": p.get("trace_id"),
            "priority": p.get("priority"), "answer": fallback,
            "answer_source": "fallback", "status": "timeout", "reason": NO_RESULT,
            "fallback_text": fallback, "enqueue_ts": p.get("enqueue_ts"),
            "submit_ts": p.get("submit_ts"), "received_ts": None, "finish_ts": None,
            "deadline_ts": p.get("deadline_ts"), "kb_ids": joined_ids(p.get(KB_IDS)),
        }
        row.update({k: p.get(k) for k in key_columns if k not in row})
        out.append(row)
    return out


#: Columns of the ``review_queue`` table (plus the key columns), besides ``enqueue_hour``.
REVIEW_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("trace_id", pa.string()), ("priority", pa.string()),
    ("rule", pa.string()), ("model_text", pa.string()), ("fallback_text", pa.string()),
    ("enqueue_ts", pa.int64()), ("finish_ts", pa.int64()), ("flagged_ts", pa.int64()),
])


def invalid_results(results: pa.Table, check: Callable[[str | None], str | None]
                    ) -> dict[str, str]:
    """``request_id`` -> the rule its ``ok`` text breaks, for the rows that break one."""
    out = {}
    ok = results.filter(pc.equal(results.column("status"), "ok"))
    for rid, text in zip(ok.column("request_id").to_pylist(), ok.column("text").to_pylist()):
        if (rule := check(text)) is not None:
            out[rid] = rule
    return out


def request_fallbacks(results: pa.Table) -> dict[str, str | None]:
    """Request id -> the request's own fallback text (its ``fallback_text`` attribute)."""
    return {r["request_id"]: dict(r.get("attributes") or {}).get(REQUEST_FALLBACK)
            for r in results.select(["request_id", "attributes"]).to_pylist()}


def reject_invalid(answers: list[dict], invalid: Mapping[str, str], fallback_text: str,
                   own: Mapping[str, str | None] | None = None) -> list[dict]:
    """``answers`` with every ``llm`` answer whose id is in ``invalid`` replaced by the
    fallback (``status = invalid``, ``reason`` = the rule): the request's own text
    (``own``: request id -> its ``fallback_text``) where it has one.

    Example:
        >>> rows = [{"request_id": "r1", "answer": "mail me at a@b.c", "answer_source": "llm"}]
        >>> reject_invalid(rows, {"r1": "pii:email"}, "Later.", {"r1": "Ask again."})[0]["answer"]
        'Ask again.'
    """
    out = []
    for row in answers:
        rule = invalid.get(row["request_id"])
        if rule is not None and row["answer_source"] == "llm":
            text = _fallback_text(None, fallback_text, (own or {}).get(row["request_id"]))
            row = dict(row, answer=text, answer_source="fallback", status="invalid",
                       reason=rule, fallback_text=text)
        out.append(row)
    return out


def review_rows(results: pa.Table, invalid: Mapping[str, str], *, key_columns: list[str],
                fallback_text: str, now_ms: int) -> pa.Table:
    """One ``review_queue`` row per invalid ``ok`` result: the model's text for a person."""
    rows = []
    for r in results.filter(pc.equal(results.column("status"), "ok")).to_pylist():
        if (rule := invalid.get(r["request_id"])) is None:
            continue
        attrs = dict(r.get("attributes") or {})
        row = {"request_id": r["request_id"], "trace_id": r.get("trace_id"),
               "priority": r.get("priority"), "rule": rule, "model_text": r.get("text"),
               "fallback_text": _fallback_text(r.get("fallback_text"), fallback_text),
               "enqueue_ts": r.get("enqueue_ts"), "finish_ts": r.get("finish_ts"),
               "flagged_ts": now_ms}
        row.update({k: attrs.get(k) for k in key_columns if k not in row})
        rows.append(row)
    schema = REVIEW_SCHEMA
    for k in key_columns:
        if k not in schema.names:
            schema = schema.append(pa.field(k, pa.string()))
    return pa.Table.from_pylist(rows, schema=schema)


def fast_answers(rows: Iterable[Mapping[str, Any]], *, key_columns: list[str], rule_text: str
                 ) -> list[dict]:
    """Answer rows (for :meth:`AnswerStore.record_answers`) for tagged request rows whose
    route is not ``llm``: ``rule`` and ``drop`` (answered by L1), ``kb`` (answered from
    the knowledge base by L2).

    Example:
        >>> rows = [{"request_id": "r1", "trace_id": "r1", "priority": "low", "route": "rule",
        ...          "enqueue_ts": 1, "deadline_ts": 9, "event_id": "e1"},
        ...         {"request_id": "r2", "route": "kb", "kb_answer": "Yes.",
        ...          "kb_answer_id": "faq-1", "event_id": "e2"},
        ...         {"request_id": "r3", "route": "llm", "event_id": "e3"}]
        >>> [(a["answer"], a["answer_source"], a["status"], a["reason"])
        ...  for a in fast_answers(rows, key_columns=["event_id"], rule_text="Hi!")]
        [('Hi!', 'rule', 'ok', 'rule'), ('Yes.', 'kb', 'ok', 'kb:faq-1')]
    """
    out = []
    for r in rows:
        route = r.get("route")
        if route == "llm" or route is None:
            continue
        if route == "kb":
            answer, source, status, reason = (r.get("kb_answer"), "kb", "ok",
                                              f"kb:{r.get('kb_answer_id')}")
        elif route == "rule":
            answer, source, status, reason = rule_text, "rule", "ok", "rule"
        else:
            answer, source, status, reason = "", "rule", DROPPED, "drop"
        row = {"request_id": r["request_id"], "trace_id": r.get("trace_id"),
               "priority": r.get("priority"), "answer": answer, "answer_source": source,
               "status": status, "reason": reason, "fallback_text": None,
               "enqueue_ts": r.get("enqueue_ts"), "submit_ts": None, "received_ts": None,
               "finish_ts": None, "deadline_ts": r.get("deadline_ts"),
               "kb_ids": (joined_ids(r.get("kb_answer_id")) if route == "kb"
                          else joined_ids(r.get("kb_ids")))}
        row.update({k: r.get(k) for k in key_columns if k not in row})
        out.append(row)
    return out
