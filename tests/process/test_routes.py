"""The two ways a user runs the pipeline, as a user runs them: ``spark-submit`` of
``spark_ext/pipeline/job.py`` and ``sts demo``, each with a ``python3`` first on PATH that is not
the interpreter the project is installed in (Spark's Python workers must still run the
project's interpreter)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sts_harness.process import SidecarProcess
from tests.utils import REPO

BIN = Path(sys.executable).parent


def _path_with_a_wrong_python3(tmp_path: Path) -> dict[str, str]:
    """An environment whose first ``python3`` on PATH fails loudly."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 'the wrong python3 ran' >&2\nexit 3\n")
    (fake / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = f"{fake}:/usr/bin:/bin"
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


@pytest.mark.timeout(420)
def test_spark_submit_route_answers_every_event(tmp_path: Path) -> None:
    """The README's sequence: a sidecar, ``sts events`` into the config's landing
    folder, ``spark-submit spark_ext/pipeline/job.py --until-idle``: it stops by itself with one
    answer per event, paths resolved from the config file's folder. Submitted with
    ``--packages "$(python -m spark_ext.jvm_packages)"`` and nothing else, the job runs
    the deployed writer (``auto`` -> Delta on Spark): it adds Delta's settings itself."""
    conf = tmp_path / "conf"
    conf.mkdir()
    config = yaml.safe_load((REPO / "conf" / "pipeline.yaml").read_text())
    results = tmp_path / "sts-results"  # ../sts-results from conf/, as shipped
    env = _path_with_a_wrong_python3(tmp_path)
    with SidecarProcess(results, ["--engine", "simulated"]) as sidecar:
        config["sidecar"]["endpoint"] = sidecar.target
        (conf / "pipeline.yaml").write_text(yaml.safe_dump(config))
        job_env = dict(env, PYSPARK_DRIVER_PYTHON=sys.executable)
        log = open(tmp_path / "job.log", "w")  # Spark's stderr is long: not a pipe
        from spark_ext.jvm_packages import packages

        job = subprocess.Popen([str(BIN / "spark-submit"), "--master", "local[2]",
                                "--packages", ",".join(packages(("kafka", "delta"))),
                                str(REPO / "spark_ext" / "pipeline" / "job.py"), "--config",
                                str(conf / "pipeline.yaml"), "--until-idle", "4",
                                "--progress", "1", "--timeout", "240"],
                               cwd=REPO, env=job_env, stdout=subprocess.PIPE,
                               stderr=log, text=True)
        try:
            lines = []
            for line in job.stdout:  # the first progress line: the queries run
                lines.append(line)
                if line.startswith("["):
                    break
            events = subprocess.run([str(BIN / "sts"), "events", "--to", "sts-job/events",
                                     "--rate", "5", "--duration", "3"], cwd=tmp_path, env=env,
                                    capture_output=True, text=True, timeout=60)
            assert events.returncode == 0, events.stderr
            rest, _ = job.communicate(timeout=300)
        finally:
            if job.poll() is None:
                job.kill()
            log.close()
        stderr = (tmp_path / "job.log").read_text()
        stdout = "".join(lines) + rest
    assert job.returncode == 0, stderr[-3000:]
    assert "idle for 4 s, every request answered" in stdout, stdout[-2000:]
    assert "(writer spark)" in stdout, stdout[:2000]
    assert "events 15," in stdout
    assert "the wrong python3 ran" not in stderr
    # Spark's log is at WARN from the SparkContext's start on (spark.log.level), not
    # only after it: just the three version lines come before it applies.
    spark_info = re.findall(r"^\d\d/\d\d/\d\d \S+ INFO (\w+):", stderr, re.M)
    assert set(spark_info) <= {"SparkContext"} and len(spark_info) <= 3, stderr[:3000]

    from deltalake import DeltaTable

    answers = DeltaTable(str(tmp_path / "sts-job" / "tables" / "answers")).to_pandas()
    assert len(answers) == answers.request_id.nunique() == 15
    assert (answers.answer_source == "llm").any()  # the workers ran the right python
    assert (tmp_path / "sts-job" / "checkpoints").is_dir()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_demo_from_the_venv_sts_with_another_python3_first_on_path(tmp_path: Path) -> None:
    """``<venv>/bin/sts demo`` without activating the venv: Spark's workers run the
    venv's interpreter, so the simulated engine answers the events."""
    env = _path_with_a_wrong_python3(tmp_path)
    out = tmp_path / "demo"
    demo = subprocess.run([str(BIN / "sts"), "demo", "--engine", "simulated", "--rate", "4",
                           "--duration", "4", "--out", str(out), "--no-l1l2"],
                          cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)
    assert demo.returncode == 0, (demo.stdout + demo.stderr)[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["answers"] == summary["events"] == 16
    assert summary["answers_by_source"].get("llm", 0) > 0, summary
    assert shutil.which("python3", path=env["PATH"]) != sys.executable


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_demo_stops_at_once_with_one_line_when_its_sidecar_dies(tmp_path: Path) -> None:
    """kill -9 of the demo's sidecar mid-run: the demo stops with a one-line error, prints
    the summary marked INCOMPLETE and exits 1 (no summary of zeros, no traceback); py4j's
    INFO lines stay out of the output."""
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    demo = subprocess.Popen([str(BIN / "sts"), "demo", "--engine", "simulated", "--rate", "4",
                             "--duration", "60", "--out", str(out), "--no-l1l2"], cwd=tmp_path,
                            env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in demo.stdout:  # the first progress line: events are flowing
            lines.append(line)
            if line.startswith("[") and "replaying" in line:
                break
        found = subprocess.run(["pgrep", "-f", "--", f"--results-dir {out / 'results'}"],
                               capture_output=True, text=True)
        pids = [int(p) for p in found.stdout.split()]
        assert pids, "".join(lines)[-2000:]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        rest, stderr = demo.communicate(timeout=300)
        took = time.monotonic() - started
    finally:
        if demo.poll() is None:
            demo.kill()
    stdout = "".join(lines) + rest
    assert demo.returncode == 1, stdout[-2000:] + stderr[-2000:]
    assert took < 60, f"the demo noticed the dead sidecar only after {took:.0f} s"
    assert "INCOMPLETE" in stdout and "=== sts demo summary ===" in stdout
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("sts demo:") and "sidecar" in last, stderr[-2000:]
    assert "Traceback" not in stderr
    assert "py4j" not in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["incomplete"]


@pytest.mark.timeout(240)
def test_sigterm_stops_the_demo_and_the_sidecar_it_started(tmp_path: Path) -> None:
    """``timeout``, ``kill`` or a container stop send SIGTERM to the demo alone: it stops
    what it started (its sidecar here) as on Ctrl-C, says so in one line and exits 143,
    where Python's default would have left the sidecar running."""
    import psutil

    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    demo = subprocess.Popen([str(BIN / "sts"), "demo", "--engine", "simulated", "--rate", "4",
                             "--duration", "60", "--out", str(out), "--no-l1l2"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("Sidecar serving on"):
                break
        sidecars = [p for p in psutil.Process(demo.pid).children(recursive=True)
                    if f"--results-dir {out / 'results'}" in " ".join(p.cmdline())]
        assert sidecars, "".join(lines)[-2000:]
        demo.send_signal(signal.SIGTERM)
        _, stderr = demo.communicate(timeout=180)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 143, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == "sts: terminated (SIGTERM) (sts demo)", stderr[-2000:]
    assert "Traceback" not in stderr
    assert not [p.pid for p in sidecars if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]
