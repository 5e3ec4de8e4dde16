"""Sidecars started lazily by tasks (``sidecar.launch: lazy``), outside Spark: one per
GPU however many processes ask at once, reused, started again after a crash, a start
that fails reported in one line."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sidecar.client import SidecarClient
from spark_ext.config import SidecarEndpointConfig
from spark_ext.exceptions import PipelineConfigError, SidecarLaunchError
from spark_ext.submit.sidecar_launcher import endpoint_for, ensure_sidecar, stop_sidecars
from tests.utils import REPO, wait_until

#: A Spark task's view of the launcher: one process asking for GPU 7's sidecar, at
#: the same instant (argv[2], epoch s) as the others.
_TASK = """
import json, sys, time
from spark_ext.config import SidecarEndpointConfig
from spark_ext.submit.sidecar_launcher import endpoint_for, ensure_sidecar
cfg = SidecarEndpointConfig(**json.loads(sys.argv[1]))
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
print(json.dumps(ensure_sidecar(cfg, "7", endpoint_for(cfg, "7"))))
"""


def _config(tmp: Path, **extra: object) -> dict:
    return {**dict(endpoint="unix:///nonexistent/sts-default.sock",
                   gpu_endpoint=f"unix://{tmp}/run/sts-gpu{{gpu}}.sock", launch="lazy",
                   launch_args=["--engine", "simulated"], run_dir=str(tmp / "run"),
                   results_dir=str(tmp / "results"), start_timeout_s=60.0), **extra}


def _ready_lines(log: Path) -> int:
    return log.read_text(errors="replace").count("sts sidecar ready")


@pytest.mark.timeout(120)
def test_concurrent_tasks_start_one_sidecar_per_gpu(tmp_path: Path) -> None:
    raw = _config(tmp_path)
    config = SidecarEndpointConfig(**raw)
    endpoint = endpoint_for(config, "7")
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    start_at = str(time.time() + 5.0)  # all imports done by then, even on a busy machine
    tasks = [subprocess.Popen([sys.executable, "-c", _TASK, json.dumps(raw), start_at],
                              cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    try:
        outs = [t.communicate(timeout=90) for t in tasks]
        assert [t.returncode for t in tasks] == [0] * 4, [err[-2000:] for _, err in outs]
        assert [json.loads(out) for out, _ in outs] == [True] * 4
        log = tmp_path / "run" / "sts-gpu7.log"
        assert _ready_lines(log) == 1, log.read_text()
        pid = int((tmp_path / "run" / "sts-gpu7.pid").read_text())
        with SidecarClient(endpoint) as client:
            assert client.stats().sidecar_id == f"{socket.gethostname()}-gpu7"
        assert ensure_sidecar(config, "7", endpoint)  # reused, nothing started
        assert _ready_lines(log) == 1

        os.kill(pid, signal.SIGKILL)  # a crash: the next task starts a new one
        with SidecarClient(endpoint) as client:
            wait_until(lambda: not client.is_serving(), 10, what="sidecar gone")
        assert ensure_sidecar(config, "7", endpoint)
        assert _ready_lines(log) == 2
        new_pid = int((tmp_path / "run" / "sts-gpu7.pid").read_text())
        assert new_pid != pid
    finally:
        stopped = stop_sidecars(tmp_path / "run")
    assert stopped == [new_pid]
    assert not Path(endpoint.removeprefix("unix://")).exists()


#: Stands in for a sidecar that is draining (its executor gone): running, not serving,
#: and it exits half a second after a task took the GPU's start lock (argv[1]).
_DRAINING = """
import fcntl, sys, time
with open(sys.argv[1], "a+b") as lock:
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(lock, fcntl.LOCK_UN)
        except BlockingIOError:
            break
        time.sleep(0.02)
time.sleep(0.5)
"""


@pytest.mark.timeout(90)
def test_a_task_that_finds_the_sidecar_draining_starts_a_new_one_once_it_exits(
        tmp_path: Path) -> None:
    """A sidecar whose executor went away (``orphan_exit_s``) drains before it exits; a
    task of a new executor on that GPU waits for it to go, then starts its own."""
    config = SidecarEndpointConfig(**_config(tmp_path))
    endpoint = endpoint_for(config, "5")
    run = tmp_path / "run"
    run.mkdir()
    draining = subprocess.Popen([sys.executable, "-c", _DRAINING, str(run / "sts-gpu5.lock"),
                                 "sidecar.cli"])
    (run / "sts-gpu5.pid").write_text(f"{draining.pid}\n")
    try:
        assert ensure_sidecar(config, "5", endpoint)
        assert draining.wait(timeout=10) == 0
        new_pid = int((run / "sts-gpu5.pid").read_text())
        assert new_pid != draining.pid
        assert _ready_lines(run / "sts-gpu5.log") == 1
    finally:
        draining.kill()
        stop_sidecars(run)


@pytest.mark.timeout(60)
def test_a_sidecar_that_cannot_start_is_one_clear_error(tmp_path: Path) -> None:
    config = SidecarEndpointConfig(**_config(tmp_path, launch_args=["--engine", "nope"]))
    with pytest.raises(SidecarLaunchError, match="exited before serving.*invalid choice") as e:
        ensure_sidecar(config, "3", endpoint_for(config, "3"))
    assert "\n" not in str(e.value)


@pytest.mark.timeout(120)
def test_a_task_of_the_stream_does_not_wait_for_a_warm_up(tmp_path: Path) -> None:
    """A GPU executor that joins a running stream: its task starts the sidecar and
    goes on after ``wait_s`` (its requests get the fallback); the sidecar comes up in the
    background and a later task finds it serving, without a second start."""
    config = SidecarEndpointConfig(**_config(tmp_path))
    endpoint = endpoint_for(config, "6")
    run = tmp_path / "run"
    try:
        assert ensure_sidecar(config, "6", endpoint, wait_s=0.0) is False  # not waited for
        pid = int((run / "sts-gpu6.pid").read_text())
        wait_until(lambda: ensure_sidecar(config, "6", endpoint, wait_s=0.0), timeout_s=60)
        assert int((run / "sts-gpu6.pid").read_text()) == pid
        assert _ready_lines(run / "sts-gpu6.log") == 1
    finally:
        stop_sidecars(run)


@pytest.mark.timeout(60)
def test_a_sidecar_that_died_starting_in_the_background_is_one_clear_error(
        tmp_path: Path) -> None:
    """The task that started it did not wait; the next task on the GPU reports why it
    never served instead of starting it again (and refusing every request quietly)."""
    config = SidecarEndpointConfig(**_config(tmp_path, launch_args=["--engine", "nope"]))
    endpoint = endpoint_for(config, "2")
    assert ensure_sidecar(config, "2", endpoint, wait_s=0.0) is False
    pid = int((tmp_path / "run" / "sts-gpu2.pid").read_text())

    def failure() -> str | None:
        try:  # still starting: False, no error yet
            assert ensure_sidecar(config, "2", endpoint, wait_s=0.0) is False
        except SidecarLaunchError as e:
            return str(e)
        return None

    why = wait_until(failure, timeout_s=30)
    assert re.search("last started.*exited before serving.*invalid choice", why), why
    assert "\n" not in why
    assert int((tmp_path / "run" / "sts-gpu2.pid").read_text()) == pid  # not started again


def test_a_socket_path_over_the_unix_limit_is_refused_before_starting(tmp_path: Path) -> None:
    config = SidecarEndpointConfig(**_config(tmp_path, gpu_endpoint=f"unix://{tmp_path}/"
                                             + "s" * 120 + "-{gpu}.sock"))
    with pytest.raises(SidecarLaunchError, match="longer than 107 bytes"):
        ensure_sidecar(config, "0", endpoint_for(config, "0"))
    assert not (tmp_path / "run" / "sts-gpu0.pid").exists()


def test_launch_settings_are_checked() -> None:
    with pytest.raises(PipelineConfigError, match="launch"):
        SidecarEndpointConfig(launch="eager")  # type: ignore[arg-type]
    with pytest.raises(PipelineConfigError, match="gpu_endpoint"):
        SidecarEndpointConfig(gpu_endpoint="unix:///run/sts/sts.sock")
    with pytest.raises(PipelineConfigError, match="launch_args"):
        SidecarEndpointConfig(launch_args="--engine simulated")  # type: ignore[arg-type]
