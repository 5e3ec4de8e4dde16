"""Rollout ``offline``: L1-L4 in batch over past events, the model's answer next to the
rule answer for every request (what ``sts validate`` writes as its report).

The same code as the streaming pipeline, run as a batch: L1/L2
(:func:`spark_ext.l2.fast_path.apply_fast_path` when configured) and tagging
(:func:`spark_ext.l1.tagging.build_requests`) on Spark, then the requests are submitted in
waves of ``wave`` (:func:`spark_ext.submit.submission.submit_batches`; a wave at a time keeps the
sidecar's queues short, so the report shows the model's answers rather than a burst's
sheds), their terminal rows are read from the sidecar's result folder, and each one is
turned into the answer the pipeline would serve (:func:`spark_ext.l4.answers.answers_from_results`,
refusals by :func:`~spark_ext.l4.answers.answers_from_refusals`, missing results by
:func:`~spark_ext.l4.answers.answers_for_lost`), validation included. Deadlines are set
when a wave is sent (past events' own times would all be past).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from sidecar.contract import now_ms
from spark_ext.l2 import fast_path
from spark_ext.l4.answers import (KB_IDS, answers_for_lost, answers_from_refusals,
                               answers_from_results, fast_answers, invalid_results,
                                  reject_invalid)
from spark_ext.config import PipelineConfig
from spark_ext.exceptions import InputFileError
from spark_ext.pipeline.sts_pipeline import PIPELINE_ATTRIBUTE
from spark_ext.sources.result_files import conform, list_result_files
from spark_ext.submit.submission import submit_batches
from spark_ext.l2.prompts import build_requests
from spark_ext.l2.template import PromptTemplate
from spark_ext.l4.validation import AnswerValidator

logger = logging.getLogger(__name__)

#: Columns of the report (the event's key columns follow, as strings).
REPORT_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("trace_id", pa.string()), ("priority", pa.string()),
    ("route", pa.string()),
    ("rule_answer", pa.string()), ("llm_answer", pa.string()),
    ("served_answer", pa.string()), ("served_source", pa.string()),
    ("status", pa.string()), ("reason", pa.string()), ("validation", pa.string()),
    ("latency_ms", pa.int64()), ("ttft_ms", pa.float64()),
    ("prompt_tokens", pa.int64()), ("output_tokens", pa.int64()),
    ("submit_ts", pa.int64()), ("finish_ts", pa.int64()), ("run_id", pa.string()),
])


class _ResultReader:
    """This run's terminal result rows, reading each new result file once."""

    def __init__(self, folder: str, run_id: str) -> None:
        self.folder, self.run_id = folder, run_id
        self.rows: dict[str, dict] = {}
        self._seen: set[str] = set()

    def poll(self) -> None:
        for f in list_result_files(self.folder):
            if f.path in self._seen:
                continue
            self._seen.add(f.path)
            try:
                table = conform(pq.read_table(f.path))
            except Exception as e:  # the streaming source quarantines such files
                logger.warning("Skipping unreadable result file %s: %s", f.path, e)
                continue
            mine = pc.equal(pc.map_lookup(table.column("attributes"), PIPELINE_ATTRIBUTE,
                                          "first"), self.run_id)
            for r in table.filter(pc.fill_null(mine, False)).to_pylist():
                if not r.get("late"):
                    self.rows.setdefault(r["request_id"], r)


def _request_rows(spark: SparkSession, events: pa.Table, config: PipelineConfig) -> pa.Table:
    """L1/L2 and tagging on Spark, as the submit query does."""
    from pyspark.errors import AnalysisException

    template = PromptTemplate(stable=config.template.stable, dynamic=config.template.dynamic)
    try:
        df = spark.createDataFrame(events)
        if fast_path.enabled(config):
            df = fast_path.apply_fast_path(df, config)
        return build_requests(df, config.tagging, template).toArrow()
    except (ValueError, AnalysisException) as e:  # a column the config names is missing
        raise InputFileError(f"the events do not fit the pipeline config: "
                             f"{str(e).splitlines()[0]}") from None


def _restamped(wave: pa.Table) -> pa.Table:
    """Deadlines from now: each request keeps its SLA (``deadline - enqueue``)."""
    now = now_ms()
    sla = pc.subtract(wave.column("deadline_ts"), wave.column("enqueue_ts"))
    wave = wave.set_column(wave.schema.get_field_index("enqueue_ts"), "enqueue_ts",
                           pa.array([now] * wave.num_rows, pa.int64()))
    return wave.set_column(wave.schema.get_field_index("deadline_ts"), "deadline_ts",
                           pc.add(sla, now))


def run_offline(spark: SparkSession, events: pa.Table, config: PipelineConfig, *,
                run_id: str, wave: int = 16,
                progress: Callable[[int, int], None] | None = None) -> pa.Table:
    """Run L1-L4 over ``events`` against ``config.sidecar`` (its ``results_dir`` must be
    the folder that sidecar writes); return one report row per event
    (:data:`REPORT_SCHEMA` plus the key columns).

    ``progress(done, total)`` is called after every wave.

    Raises:
        InputFileError: the events lack a column the config needs.
    """
    config = copy.deepcopy(config)
    config.tagging.event_time_ms = None  # processing-time deadlines, set per wave
    run = _OfflineRun(config, run_id)
    requests = _request_rows(spark, events, config)
    if "route" not in requests.column_names:
        requests = requests.append_column("route", pa.array(["llm"] * requests.num_rows))
    is_llm = pc.fill_null(pc.equal(requests.column("route"), "llm"), False)
    rows = run.direct_rows(requests.filter(pc.invert(is_llm)).drop_columns(["prompt"]))
    to_llm = requests.filter(is_llm).drop_columns(
        [c for c in fast_path.KB_ONLY_COLUMNS if c in requests.column_names])
    for start in range(0, to_llm.num_rows, wave):
        rows += run.wave_rows(_restamped(to_llm.slice(start, wave)))
        if progress is not None:
            progress(len(rows), requests.num_rows)
    schema = REPORT_SCHEMA
    for k in config.tagging.key_columns:
        if k not in schema.names:
            schema = schema.append(pa.field(k, pa.string()))
    return pa.Table.from_pylist(rows, schema=schema)


class _OfflineRun:
    """One offline run's report rows: the events L1/L2 answered, then the waves sent to
    the sidecar, each waited for until its results came or its deadlines passed."""

    def __init__(self, config: PipelineConfig, run_id: str) -> None:
        self.config, self.run_id = config, run_id
        self.keys = config.tagging.key_columns
        self.fallback = config.answers.fallback_text
        self.check = AnswerValidator(config.validation).check
        self.reader = _ResultReader(config.sidecar.results_dir, run_id)

    def _base(self, r: dict, rule_answer: str | None) -> dict:
        row = {"request_id": r["request_id"], "trace_id": r.get("trace_id"),
               "priority": r.get("priority"), "route": r.get("route"),
               "rule_answer": rule_answer, "run_id": self.run_id}
        row.update({k: None if r.get(k) is None else str(r[k]) for k in self.keys})
        return row

    def direct_rows(self, direct: pa.Table) -> list[dict]:
        """Report rows of the events L1/L2 answered without the sidecar."""
        rows = direct.to_pylist()
        return [self._base(r, a["answer"]) | {"served_answer": a["answer"],
                                              "served_source": a["answer_source"],
                                              "status": a["status"], "reason": a["reason"]}
                for r, a in zip(rows, fast_answers(rows, key_columns=self.keys,
                                                   rule_text=self.config.routing.rule_text))]

    def wave_rows(self, batch: pa.Table) -> list[dict]:
        """Submit one wave, wait for its results (at most its last deadline plus the
        grace), and return its report rows: the model's answer, or the fallback."""
        carried = [*self.keys, *([KB_IDS] if KB_IDS in batch.column_names else [])]
        acks = pa.Table.from_batches(list(submit_batches(
            iter(batch.to_batches()), self.config.sidecar, carried,
            {PIPELINE_ATTRIBUTE: self.run_id})))
        acks_by_id = {a["request_id"]: a for a in acks.to_pylist()}
        served = {a["request_id"]: a for a in answers_from_refusals(
            acks, key_columns=self.keys, fallback_text=self.fallback)}
        waiting = {rid for rid, a in acks_by_id.items() if a["accepted"]}
        due = (pc.max(batch.column("deadline_ts")).as_py() or now_ms()) \
            + self.config.answers.grace_ms
        while waiting - set(self.reader.rows) and now_ms() < due:
            time.sleep(0.05)
            self.reader.poll()
        served.update(self._answered(waiting))
        lost = [acks_by_id[rid] for rid in waiting if rid not in self.reader.rows]
        if lost and len(lost) == len(waiting):
            logger.warning("No result row came for any of the %d accepted requests of this "
                           "wave: is %s the folder that sidecar writes?", len(lost),
                           self.config.sidecar.results_dir)
        for a in answers_for_lost(lost, key_columns=self.keys, fallback_text=self.fallback):
            served[a["request_id"]] = a
        return [self._report_row(ack, served[ack["request_id"]]) for ack in acks_by_id.values()]

    def _answered(self, waiting: set[str]) -> dict[str, dict]:
        """The answers of the results that came, validated."""
        results = [self.reader.rows[rid] for rid in waiting if rid in self.reader.rows]
        if not results:
            return {}
        table = pa.Table.from_pylist(results, schema=conform(pa.table({})).schema)
        invalid = invalid_results(table, self.check)
        out = {}
        for a in reject_invalid(answers_from_results(table, key_columns=self.keys,
                                                     fallback_text=self.fallback),
                                invalid, self.fallback):
            ok = self.reader.rows[a["request_id"]]["status"] == "ok"
            out[a["request_id"]] = a | {
                "validation": invalid.get(a["request_id"], "pass") if ok else None}
        return out

    def _report_row(self, ack: dict, a: dict) -> dict:
        res = self.reader.rows.get(ack["request_id"]) or {}
        ok = res.get("status") == "ok"
        finish, submit = res.get("finish_ts"), ack.get("submit_ts")
        return self._base(ack, self.fallback) | {
            "llm_answer": res.get("text") if ok else None,
            "served_answer": a["answer"], "served_source": a["answer_source"],
            "status": res.get("status") or a["status"], "reason": a["reason"],
            "validation": a.get("validation"),
            "latency_ms": finish - submit if finish and submit else None,
            "ttft_ms": res.get("ttft_ms") if ok else None,
            "prompt_tokens": res.get("prompt_tokens") if ok else None,
            "output_tokens": res.get("output_tokens") if ok else None,
            "submit_ts": submit, "finish_ts": finish}
