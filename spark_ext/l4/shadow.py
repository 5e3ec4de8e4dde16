"""The ``shadow_answers`` table: what the model would have answered (rollout ``shadow``).

Shadow requests carry :data:`~spark_ext.l4.rollout.SHADOW_ATTRIBUTE`; their result rows
(and refusals) are turned into answer rows exactly as served answers are, validation
included (``status = invalid`` and the rule in ``reason`` when the model's text breaks
one; the text itself is kept in ``model_text``), but written to ``shadow_answers``,
at most one row per request. They never touch ``answers``: the served answer is the
rule one, and a shadow result never backfills it.
"""

from __future__ import annotations

import logging
import time

import pyarrow as pa
import pyarrow.compute as pc

from spark_ext.l4.answer_store import AnswerLedger, AnswerStore
from spark_ext.l4.answers import (answers_from_refusals, answers_from_results, build_answers,
                               hours_between, invalid_results, reject_invalid)
from spark_ext.l4.rollout import SHADOW_ATTRIBUTE

logger = logging.getLogger(__name__)

#: The table's name, next to ``answers`` in the store's folder.
TABLE = "shadow_answers"


def shadow_mask(results: pa.Table) -> pa.Array:
    """Which result rows answer shadow requests (by their attribute)."""
    if results.num_rows == 0 or "attributes" not in results.column_names:
        return pa.array([False] * results.num_rows)
    flag = pc.map_lookup(results.column("attributes"), SHADOW_ATTRIBUTE, "first")
    return pc.fill_null(pc.equal(flag, "1"), False)


class ShadowAnswers:
    """Writes shadow answer rows through ``store`` (idempotent appends) and keeps its own
    ledger, so each request has at most one row.

    Args:
        store: The pipeline's store (the table lives in its folder).
        horizon_s: How long written ids are remembered (and how far back a restart reads).
    """

    def __init__(self, store: AnswerStore, *, horizon_s: float) -> None:
        self.store = store
        self.horizon_s = horizon_s
        self.written = 0
        self._ledger = AnswerLedger(horizon_s)

    def load(self, now_ms: int | None = None) -> None:
        """Remember the ids of the table's recent rows (after a restart)."""
        now_ms = now_ms or int(time.time() * 1000)
        hours = hours_between(now_ms - int(self.horizon_s * 1000), now_ms)
        ids = self.store.read(TABLE, ["request_id"], hours=hours)
        if ids.num_rows:
            rids = ids.column("request_id").to_pylist()
            self._ledger.remember_all(rids, ["shadow"] * len(rids))

    def _write(self, rows: list[dict], model_text: dict[str, str | None], *, app_id: str,
               version: int) -> int:
        fresh = {}
        for r in rows:
            if self._ledger.get(r["request_id"]) is None:
                fresh.setdefault(r["request_id"], r)
        if not fresh:
            return 0
        table = build_answers(list(fresh.values()), self.store.key_columns,
                              int(time.time() * 1000))
        table = table.append_column("model_text", pa.array(
            [model_text.get(rid) for rid in fresh], pa.string()))
        if not self.store.append(TABLE, table, app_id=app_id, version=version):
            return 0
        self._ledger.remember_all(list(fresh), ["shadow"] * len(fresh))
        self.written += len(fresh)
        return len(fresh)

    def record_results(self, results: pa.Table, *, check, fallback_text: str, app_id: str,
                       version: int) -> int:
        """Shadow answers from terminal result rows, after validation (``check``: the
        pipeline's :meth:`~spark_ext.l4.validation.AnswerValidator.check`). Late rows are
        ignored (nothing is backfilled in the shadow table)."""
        if "late" in results.column_names:
            results = results.filter(pc.invert(pc.fill_null(results.column("late"), False)))
        if results.num_rows == 0:
            return 0
        invalid = invalid_results(results, check)
        rows = reject_invalid(answers_from_results(results, key_columns=self.store.key_columns,
                                                   fallback_text=fallback_text),
                              invalid, fallback_text)
        texts = {r["request_id"]: r["text"] for r in results.to_pylist() if r["status"] == "ok"}
        return self._write(rows, texts, app_id=app_id, version=version)

    def record_refusals(self, acks: pa.Table, *, fallback_text: str, app_id: str,
                        version: int) -> int:
        """Shadow answers (fallbacks) for shadow requests the sidecar refused."""
        rows = answers_from_refusals(acks, key_columns=self.store.key_columns,
                                     fallback_text=fallback_text)
        return self._write(rows, {}, app_id=app_id, version=version)
