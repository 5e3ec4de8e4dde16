"""When ``spark-submit spark_ext/pipeline/job.py --until-idle`` may stop: only once the
answers query has read the acks of the submit query's last events (a result can reach the
ledger before its request's ack; the ledger then counts nothing open for a request whose
ack it has not read, and a job that stopped then lost that event's answer)."""

from __future__ import annotations

from types import SimpleNamespace

from spark_ext.pipeline.sts_pipeline import StsPipeline


def _progress(ts: str, rows: int, ms: int) -> dict:
    return {"timestamp": ts, "numInputRows": rows, "durationMs": {"triggerExecution": ms},
            "batchId": 0}


def _pipeline(submit: list[dict], answers: list[dict]) -> StsPipeline:
    pipeline = StsPipeline.__new__(StsPipeline)  # only its queries are read
    pipeline.queries = [SimpleNamespace(recentProgress=submit),
                        SimpleNamespace(recentProgress=answers)]
    return pipeline


def test_the_answers_query_catches_up_only_with_a_batch_after_the_last_submit_batch() -> None:
    submit = [_progress("2026-12-02T18:05:00.000Z", 8, 2_000),
              _progress("2026-12-02T18:05:10.000Z", 0, 50)]  # an empty one after: ignored
    assert not _pipeline(submit, [_progress("2026-12-02T18:05:01.500Z", 7, 900)]
                         ).answers_caught_up()  # began before the submit batch ended
    assert _pipeline(submit, [_progress("2026-12-02T18:05:01.500Z", 7, 900),
                              _progress("2026-12-02T18:05:02.500Z", 1, 900)]
                     ).answers_caught_up()
    assert not _pipeline(submit, []).answers_caught_up()  # no answers batch yet
    assert _pipeline([], [_progress("2026-12-02T18:05:00.000Z", 0, 10)]).answers_caught_up()
