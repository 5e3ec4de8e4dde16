"""The README's first code block (a user's own job: Kafka in, Delta out, a sidecar
address), run as printed in its own Python process against a real Kafka broker and a
simulated-engine sidecar: only its addresses and folders are replaced."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.utils import REPO, RemoteSidecar, wait_until

pytestmark = [pytest.mark.timeout(300)]


def readme_job() -> str:
    """The README's first ```python block."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, "the README has no python block"
    return match.group(1)


def test_the_readme_starts_with_a_complete_user_job() -> None:
    """Its first code block is the user's job, about ten lines."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert text.index("```python") < text.index("```bash")
    code = readme_job()
    assert "LlmInference" in code and 'format("kafka")' in code and "answers_table" in code
    assert len(code.strip().splitlines()) <= 16


def _produce(bootstrap: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        producer.produce(topic, key=f"t-{i}", value=f"Where is my order {i}?")
    assert producer.flush(30) == 0


def test_the_readme_job_answers_every_event_once(kafka_broker, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    topic = f"tickets-{uuid.uuid4().hex[:8]}"
    args = ["--engine", "simulated", "--sidecar-id", "readme",
            "--set", "engine.simulated.step_base_ms=10",
            "--set", "scheduler.deadline_admission=false",
            "--set", "results.flush_interval_s=0.05"]
    with RemoteSidecar(tmp_path / "results", args, log_path=tmp_path / "sidecar.log") as sidecar:
        code = (readme_job().replace("broker:9092", kafka_broker.bootstrap_servers)
                .replace('"tickets"', json.dumps(topic))
                .replace("127.0.0.1:50051", sidecar.target)
                .replace("/tmp/sts-results", str(tmp_path / "results"))
                .replace("/tmp/my-job", str(tmp_path / "job"))
                .replace('sla_ms=5000', 'sla_ms=60000'))
        _produce(kafka_broker.bootstrap_servers, topic, 6)
        (tmp_path / "job.py").write_text(code, encoding="utf-8")
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(REPO)}
        env.pop("SPARK_REMOTE", None)
        job = subprocess.Popen([sys.executable, "job.py"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        table = tmp_path / "job" / "answers"

        def answered() -> int:
            assert job.poll() is None, job.stdout.read()[-3000:]
            try:
                return DeltaTable(str(table)).to_pyarrow_table().num_rows >= 6
            except Exception:  # noqa: BLE001 - not created yet
                return False
        try:
            wait_until(answered, 200, interval_s=1.0, what="the README job's answers")
        finally:
            job.terminate()
            job.wait(60)
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    assert sorted(r["ticket_id"] for r in rows) == [f"t-{i}" for i in range(6)], rows
    assert {r["answer_source"] for r in rows} == {"llm"}, rows
