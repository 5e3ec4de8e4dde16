"""Progressive rollout on real Spark, real simulated-engine sidecars and real Delta:
a mode switch over the same checkpoints, shadow answers that are never served, the
demo's canary arms (exactly the events whose hash is below the share) and shadow
shares, and ``sts validate``'s report."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sidecar import write_text_atomically
from sidecar.cli import main as sts_main
from sidecar.contract import PRIORITY_NAMES
from spark_ext.config import PipelineConfig
from spark_ext.sources.event_tables import read_event_table
from spark_ext.pipeline.sts_pipeline import StsPipeline
from spark_ext.l4.rollout import canary_bucket
from sts_harness.demo import DemoOptions, run_demo
from sts_harness.warm_up import is_warm_up
from tests.utils import RemoteSidecar, wait_until

pytestmark = pytest.mark.timeout(300)

RULE = "Thanks for your message. An agent will get back to you shortly."
#: Deadlines far enough out that a busy shared machine still gets every model answer.
SLA = {"high": 120_000, "normal": 120_000, "low": 120_000}


def _config(tmp: Path, endpoint: str, results_dir: str, **sections) -> PipelineConfig:
    data = {"source": {"path": str(tmp / "events")},
            "tagging": {"event_time_ms": None, "max_tokens": 8, "sla_ms": SLA},
            "sidecar": {"endpoint": endpoint, "results_dir": results_dir, "timeout_s": 3.0},
            "answers": {"grace_ms": 1000, "fallback_text": RULE},
            "output": {"out_dir": str(tmp / "out"), "checkpoint_dir": str(tmp / "ckpt"),
                       "writer": "deltalake"}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return PipelineConfig.from_dict(data)


def _write_events(tmp: Path, prefix: str, n: int) -> None:
    events = [{"event_id": f"{prefix}-{i}", "text": f"My order {i} is late.",
               "priority": PRIORITY_NAMES[i % 3], "event_ts": 0} for i in range(n)]
    write_text_atomically(tmp / "events" / f"{prefix}.json",
                          "".join(json.dumps(e) + "\n" for e in events))


def _answers(pipeline: StsPipeline) -> dict[str, dict]:
    rows = pipeline.store.read("answers").to_pylist()
    by_id = {r["request_id"]: r for r in rows}
    assert len(by_id) == len(rows), "two answers for one request"
    return by_id


def _run_until(pipeline: StsPipeline, done) -> None:
    def check() -> bool:
        pipeline.process_all_available()
        return done()
    wait_until(check, 120, interval_s=0.3, what="the pipeline's answers")


def _request_id(event_id: str) -> str:
    """A request id of a one-key event (tagging: SHA-256 of the namespace and the key)."""
    return hashlib.sha256(event_id.encode()).hexdigest()[:32]


def _llm_arm(answers: list[dict], share: float) -> set[str]:
    """The events whose request id falls in the canary's model arm."""
    return {a["event_id"] for a in answers if canary_bucket(a["request_id"]) < share}


def test_modes_switch_over_the_same_checkpoints(spark, tmp_path: Path) -> None:
    """full -> shadow on one checkpoint folder: each event is answered once; shadow serves
    the rule answer at once and keeps the model's (validated) answer in shadow_answers
    only, never backfilling the served one. (The canary's exact arms: the demo test.)"""
    args = ["--engine", "simulated", "--sidecar-id", "rollout", "--set",
            "engine.simulated.step_base_ms=20", "--set", "results.flush_interval_s=0.05",
            "--set", "scheduler.deadline_admission=false"]
    with RemoteSidecar(tmp_path / "results", args, log_path=tmp_path / "sidecar.log") as sidecar:
        def phase(prefix: str, n: int, total: int, **sections) -> StsPipeline:
            cfg = _config(tmp_path, sidecar.target, str(sidecar.results_dir), **sections)
            _write_events(tmp_path, prefix, n)
            pipeline = StsPipeline(spark, cfg)
            pipeline.start()
            try:
                _run_until(pipeline, lambda: len(_answers(pipeline)) == total)
                if sections.get("rollout", {}).get("mode") == "shadow":
                    _run_until(pipeline, lambda: pipeline.store.read(
                        "shadow_answers").num_rows == n)
            finally:
                pipeline.stop()
            return pipeline

        phase("full", 3, 3)
        last = phase("shadow", 4, 7, rollout={"mode": "shadow"},
                     validation={"must_not_match": {"sim": "simulated"}})
    answers = {a["event_id"]: a for a in _answers(last).values()}
    assert len(answers) == 7
    served = {e: (a["answer_source"], a["reason"]) for e, a in answers.items()}
    assert {served[f"full-{i}"] for i in range(3)} == {("llm", None)}
    shadow_ids = [f"shadow-{i}" for i in range(4)]
    assert {served[e] for e in shadow_ids} == {("rule", "rollout:shadow")}
    assert all(answers[e]["answer"] == RULE and answers[e]["backfilled_at"] is None
               for e in shadow_ids)
    shadow = last.store.read("shadow_answers").to_pylist()
    assert sorted(s["event_id"] for s in shadow) == shadow_ids
    assert {(s["answer_source"], s["status"], s["reason"]) for s in shadow} == {
        ("fallback", "invalid", "must_not_match:sim")}
    assert all(s["model_text"].startswith("[simulated]") for s in shadow)
    assert not last.store.exists("review_queue")  # nothing was served: nothing to review
    requests = last.store.read("requests").to_pylist()
    assert sorted(r["event_id"] for r in requests) == [f"full-{i}" for i in range(3)] + shadow_ids


@pytest.mark.parametrize("mode", ["canary", "shadow"])
def test_demo_rollout_shares(spark, tmp_path: Path, mode: str) -> None:
    share = 0.3
    opts = DemoOptions(rate=10.0, duration=2.0, out=str(tmp_path / "demo"), engine="simulated",
                       max_tokens=8, sla_ms=(120_000, 120_000, 120_000), drain_timeout_s=30.0,
                       rollout=mode, canary_share=share, l1l2=False)
    summary = run_demo(opts)
    assert summary["incomplete"] is None
    answers = [a for a in read_event_table(summary["tables"]["answers"]).to_pylist()
               if not is_warm_up(a)]  # the warm-up's rows count in no figure
    events = {a["event_id"] for a in answers}
    assert len(answers) == len(events) == summary["events"] == 20
    rollout = summary["rollout"]
    rule_arm = {a["event_id"] for a in answers if a["reason"] == f"rollout:{mode}"}
    if mode == "canary":
        llm_arm = _llm_arm(answers, share)
        assert events - rule_arm == llm_arm
        assert rollout["llm_arm"] == len(llm_arm) and rollout["rule_arm"] == 20 - len(llm_arm)
        assert rollout["shadow_answers"] == 0
    else:
        assert rule_arm == events and rollout["llm_arm"] == 0
        shadow = read_event_table(summary["tables"]["shadow_answers"]).to_pylist()
        assert {s["event_id"] for s in shadow if not is_warm_up(s)} == events
        assert rollout["shadow_answers"] == 20
        assert rollout["shadow_by_source"].get("llm", 0) > 0


def test_validate_writes_the_report_and_prints_the_table(spark, tmp_path: Path,
                                                         capsys) -> None:
    out = tmp_path / "validate"
    code = sts_main(["validate", "--engine", "simulated", "--limit", "8", "--max-tokens", "8",
                     "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = read_event_table(out / "report").to_pylist()
    assert sorted(r["ticket_id"] for r in report) == [f"T000{i}" for i in range(8)]
    assert len({r["request_id"] for r in report}) == 8
    for r in report:
        assert r["rule_answer"] == RULE and r["route"] == "llm"
        assert r["status"] == "ok" and r["llm_answer"].startswith("[simulated]"), r
        assert r["validation"] == "pass" and r["served_source"] == "llm"
        assert r["latency_ms"] > 0 and r["prompt_tokens"] > 0 and r["output_tokens"] > 0
    header = next(line for line in printed.splitlines() if line.startswith("priority"))
    assert "LLM answered" in header and "invalid" in header and "tokens/answer" in header
    all_row = next(line for line in printed.splitlines() if line.startswith("all "))
    assert all_row.split()[1:3] == ["8", "8"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["by_priority"][-1]["llm_answered"] == 8
    # The folder is the command's now: a second run needs --overwrite, a foreign one is refused.
    assert sts_main(["validate", "--engine", "simulated", "--limit", "1", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_spark_and_python_agree_on_every_arm(spark) -> None:
    """The Spark expression gives exactly :func:`canary_bucket`'s arms (300 ids), and
    events L1 routed elsewhere get no arm."""
    from spark_ext.config import RolloutConfig
    from spark_ext.l4.rollout import arm_for, with_arm

    ids = [_request_id(f"e-{i}") for i in range(300)]
    df = spark.createDataFrame([(rid, "rule" if i == 0 else "llm") for i, rid in enumerate(ids)],
                               "request_id string, route string")
    modes = (("canary", 0.37), ("canary", 0.0), ("canary", 1.0), ("shadow", 0.1),
             ("offline", 0.1), ("full", 0.1))
    for n, (mode, share) in enumerate(modes):  # one Spark job for all of them
        df = with_arm(df, RolloutConfig(mode=mode, canary_share=share)) \
            .withColumnRenamed("rollout_arm", f"arm{n}")
    rows = {r["request_id"]: r for r in df.collect()}
    for n, (mode, share) in enumerate(modes):
        assert rows[ids[0]][f"arm{n}"] is None
        assert {rid: rows[rid][f"arm{n}"] for rid in ids[1:]} == {
            rid: arm_for(mode, canary_bucket(rid), share) for rid in ids[1:]}, mode
