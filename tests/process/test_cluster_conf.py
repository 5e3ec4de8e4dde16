"""The cluster-started route (``conf/cluster/``): the scripts are valid shell, the pod
template is a valid pod with one sidecar per executor, and the Databricks init script
really starts one sidecar per GPU that nvidia-smi lists (a stand-in ``nvidia-smi``
lists two; the sidecars run the simulated engine), restarts one that dies, and is
stopped through its process groups."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sidecar.client import SidecarClient
from tests.utils import REPO, require_tool, wait_until

CLUSTER = REPO / "conf" / "cluster"
INIT = CLUSTER / "databricks-init.sh"
POD = CLUSTER / "k8s-pod-template.yaml"
SCRIPTS = [INIT, REPO / "sts_harness" / "fake_gpu_discovery.sh"]


def _pod() -> dict:
    return yaml.safe_load(POD.read_text())


def _sidecar_script(tmp_path: Path) -> Path:
    """The pod's sidecar command as a script file."""
    path = tmp_path / "k8s-sidecar.sh"
    path.write_text("#!/usr/bin/env bash\n" + _pod()["spec"]["initContainers"][0]["args"][0])
    return path


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shell_scripts_parse(script: Path) -> None:
    assert os.access(script, os.X_OK), f"{script} is not executable"
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_shell_scripts_pass_shellcheck(tmp_path: Path) -> None:
    require_tool("shellcheck", "Debian's shellcheck package")
    proc = subprocess.run(["shellcheck", *map(str, SCRIPTS), str(_sidecar_script(tmp_path))],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_pod_template_gives_each_executor_a_sidecar(tmp_path: Path) -> None:
    pod = _pod()
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    spec = pod["spec"]
    (sidecar,) = spec["initContainers"]
    (executor,) = spec["containers"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: starts first, stops last
    assert sidecar["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "resources" not in executor  # the GPU is the sidecar's; Spark sets the rest
    assert executor["name"] == "spark-executor"
    assert "podTemplateContainerName=spark-executor" in POD.read_text()
    volumes = {v["name"]: v for v in spec["volumes"]}
    for container in (sidecar, executor):
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["sts-run"] == "/run/sts" and mounts["sts-results"] == "/data/sts/results"
        assert set(mounts) <= set(volumes)
    assert "emptyDir" in volumes["sts-run"]
    assert "persistentVolumeClaim" in volumes["sts-results"]  # the driver reads it too
    script = sidecar["args"][0]
    assert "unix:///run/sts/sts-gpu$gpu.sock" in script
    assert "--results-dir /data/sts/results" in script
    probe = " ".join(sidecar["startupProbe"]["exec"]["command"])
    assert "unix:///run/sts/sts-gpu0.sock" in probe
    subprocess.run(["bash", "-n", str(_sidecar_script(tmp_path))], check=True)


def _fake_node(tmp_path: Path) -> dict[str, str]:
    """A PATH with an ``nvidia-smi`` that lists GPUs 0 and 1, and a venv whose ``sts``
    runs this checkout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0\\n1\\n'\n")
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    sts = venv_bin / "sts"
    sts.write_text(f'#!/bin/sh\nexec {sys.executable} -m sidecar.cli "$@"\n')
    for f in (smi, sts):
        f.chmod(0o755)
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {k: v for k, v in os.environ.items() if k != "DB_IS_DRIVER"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PYTHONPATH=pythonpath,
               STS_RESULTS_DIR=str(tmp_path / "results"), STS_VENV=str(tmp_path / "venv"),
               STS_RUN_DIR=str(tmp_path / "run"), STS_LOG_DIR=str(tmp_path / "logs"),
               STS_SIDECAR_ARGS="--engine simulated")
    return env


def _sidecar_pid(pgid: int) -> int | None:
    """The sidecar process in a restart loop's process group."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rpartition(")")[2].split()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[2]) == pgid and b"sidecar.cli" in cmdline and stat[0] not in "ZX":
            return int(proc.name)
    return None


@pytest.mark.timeout(120)
def test_databricks_init_script_starts_one_sidecar_per_gpu(tmp_path: Path) -> None:
    env = _fake_node(tmp_path)
    run = tmp_path / "run"
    out = subprocess.run(["bash", str(INIT)], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    pgids = {gpu: int((run / f"sts-gpu{gpu}.pgid").read_text()) for gpu in ("0", "1")}
    try:
        for gpu in ("0", "1"):
            with SidecarClient(f"unix://{run}/sts-gpu{gpu}.sock") as client:
                wait_until(client.is_serving, 60, what=f"sidecar of GPU {gpu}")
                assert client.stats().sidecar_id == f"{socket.gethostname()}-gpu{gpu}"
            pid = _sidecar_pid(pgids[gpu])
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert f"CUDA_VISIBLE_DEVICES={gpu}".encode() in environ
        mode = (run / "sts-gpu0.sock").stat().st_mode & 0o777
        assert mode & 0o007 == 0, oct(mode)  # no access for others
        assert (run.stat().st_mode & 0o777) == 0o770

        # A sidecar that dies is started again by its loop.
        dead = _sidecar_pid(pgids["1"])
        os.kill(dead, signal.SIGKILL)
        wait_until(lambda: _sidecar_pid(pgids["1"]) not in (None, dead), 30,
                   what="a new sidecar for GPU 1")
        with SidecarClient(f"unix://{run}/sts-gpu1.sock") as client:
            wait_until(client.is_serving, 60, what="the restarted sidecar")
        assert "restarting" in (tmp_path / "logs" / "sts-gpu1.log").read_text()
    finally:
        for pgid in pgids.values():
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        while any(_sidecar_pid(p) for p in pgids.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pgid in pgids.values():
            if _sidecar_pid(pgid):
                os.killpg(pgid, signal.SIGKILL)
    assert not (run / "sts-gpu0.sock").exists()  # drained and removed its socket


def test_databricks_init_script_skips_the_driver_and_needs_a_results_dir(tmp_path: Path
                                                                          ) -> None:
    env = _fake_node(tmp_path)
    out = subprocess.run(["bash", str(INIT)], env={**env, "DB_IS_DRIVER": "TRUE"},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "driver node" in out.stdout
    assert not (tmp_path / "run").exists()
    env.pop("STS_RESULTS_DIR")
    out = subprocess.run(["bash", str(INIT)], env=env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode != 0 and "STS_RESULTS_DIR" in out.stderr
