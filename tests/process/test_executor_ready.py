"""The executor side of the executor-ready plugin (``spark_ext.submit.executor_ready``):
what the plugin runs on a new executor, and what the driver announces. The plugin holding
a real executor is ``test_gpu_cluster.py``'s."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from spark_ext.config import SidecarEndpointConfig
from spark_ext.submit.executor_ready import PLUGIN_CLASS, announce, plugin_conf, plugin_loaded
from spark_ext.submit.sidecar_launcher import stop_sidecars
from tests.utils import REPO


def _run(spec: str, gpus: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STS_EXECUTOR_GPUS=gpus, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "spark_ext.submit.executor_ready"],
                          input=spec, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_a_new_executors_check_starts_its_gpus_sidecar_and_returns_once_it_serves(
        tmp_path: Path) -> None:
    from sidecar.client import SidecarClient

    run = tmp_path / "run"
    config = SidecarEndpointConfig(
        gpu_endpoint=f"unix://{run}/sts-gpu{{gpu}}.sock", launch="lazy",
        launch_args=["--engine", "simulated"], run_dir=str(run),
        results_dir=str(tmp_path / "results"), start_timeout_s=60.0)
    try:
        proc = _run(json.dumps({"sidecar": dataclasses.asdict(config)}), "1", tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert f"GPU 1's sidecar at unix://{run}/sts-gpu1.sock serves" in proc.stderr
        with SidecarClient(f"unix://{run}/sts-gpu1.sock", timeout_s=5.0) as client:
            assert client.is_serving()  # it outlives the check, for the executor's tasks
    finally:
        stop_sidecars(run)


def test_a_check_that_cannot_run_says_why_in_one_line_and_fails(tmp_path: Path) -> None:
    proc = _run('{"sidecar": {"launch": "lazy", "no_such_option": 1}}', "0", tmp_path)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("sts executor ready: failed: TypeError") and "no_such_option" in line


def test_the_flags_name_the_plugin_and_its_jar() -> None:
    conf = plugin_conf(timeout_s=90)
    assert conf["spark.plugins"] == PLUGIN_CLASS
    assert conf["spark.jars"].startswith("file:") and conf["spark.jars"].endswith(".jar")
    assert Path(conf["spark.jars"].removeprefix("file:")).is_file()
    assert conf["spark.sts.executorReady.timeoutS"] == "90"


def test_a_session_without_the_plugin_announces_nothing(spark) -> None:
    assert not plugin_loaded(spark)
    assert announce(spark, SidecarEndpointConfig(launch="lazy")) is False
