"""The sidecar installs and runs without the Spark side (what a GPU node image holds)."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sidecar.client import SidecarClient
from sts_capacity.commands import BENCH_ELSEWHERE
from tests.utils import REPO, free_port, make_request, wait_for_results, wait_until

#: Modules a sidecar-only install does not have.
SPARK_SIDE = ("pyspark", "pandas", "numpy", "deltalake", "matplotlib", "spark_ext",
              "sts_harness", "benchmarks")

#: Modules building the ``sts`` parser may load from the packages above the sidecar: the
#: commands' registration and the Spark side's kinds registry (its ``--writer``/``--source``
#: choices; plain Python, nothing of Spark).
_REGISTRATION = ("sts_harness", "sts_harness.commands", "sts_harness.l1l2_commands",
                 "sts_harness.trace_commands",
                 "benchmarks", "benchmarks.commands",
                 "benchmarks.cli_args", "spark_ext", "spark_ext.kinds", "spark_ext.exceptions")
#: numpy is left out: pyarrow (a sidecar dependency) imports it when it is installed.
_PARSER_PROBE = f"""
import sys
from sidecar.cli import build_parser
build_parser()
heavy = sorted(m for m in sys.modules
               if m.split('.')[0] in {tuple(m for m in SPARK_SIDE if m != "numpy")!r}
               + ('vllm', 'torch') and m not in {_REGISTRATION!r})
print(heavy)
"""


def wheel_top_level_names(wheel: Path) -> set[str]:
    """The top-level names a wheel installs into site-packages, read from its RECORD (its
    ``.dist-info`` and ``.data`` folders left out)."""
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = csv.reader(io.StringIO(zf.read(record).decode()))
        tops = {row[0].split("/")[0] for row in rows if row}
    return {t.removesuffix(".py") for t in tops if not t.endswith((".dist-info", ".data"))}


def test_building_the_cli_imports_no_engine_or_spark_module() -> None:
    """``sts sidecar`` on a GPU node must not load Spark, numpy or the benchmarks just to
    parse its flags (each package registers its commands without heavy imports)."""
    done = subprocess.run([sys.executable, "-c", _PARSER_PROBE], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.timeout(300)
def test_sidecar_only_install_serves_with_the_simulated_engine(tmp_path: Path) -> None:
    """Build the wheel, install it with its base dependencies only into a fresh venv, and
    run ``sts sidecar --engine simulated`` from it: a request gets its result, on uvloop."""
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(dist), str(REPO)], check=True, timeout=180)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    wheel = next(dist.glob("sts_spark-*.whl"))
    assert wheel_top_level_names(wheel) <= {"sidecar", "spark_ext", "sts_capacity", "sts_harness"}
    # Without PYTHONPATH: a checkout on it (its sts_spark.egg-info) looks installed to pip.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True,
                   timeout=240, env=env)
    py = str(venv / "bin" / "python")
    missing = subprocess.run([py, "-c", "import importlib.util as u; print([m for m in "
                              f"{SPARK_SIDE[:5]!r} if u.find_spec(m)])"],
                             capture_output=True, text=True, check=True, env=env)
    assert missing.stdout.strip() == "[]", "the base install pulled in the Spark side"

    results, port = tmp_path / "results", free_port()
    proc = subprocess.Popen([str(venv / "bin" / "sts"), "sidecar", "--engine", "simulated",
                             "--listen", f"127.0.0.1:{port}", "--results-dir", str(results)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        with SidecarClient(f"127.0.0.1:{port}") as client:
            wait_until(lambda: proc.poll() is not None or client.is_serving(), 60,
                       what="sidecar serving")
            assert proc.poll() is None, proc.stdout.read()
            assert client.submit([make_request("alone-1")]).acks[0].accepted
            row = wait_for_results(results, {"alone-1"})["alone-1"]
            assert row["status"] == "ok"
            assert client.stats().engine == "simulated"
        proc.terminate()
        assert proc.wait(30) == 0
        log = proc.stdout.read()
        # uvloop comes with the base install, and `server.event_loop: auto` runs on it.
        assert "uvloop event loop" in log, log[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The shipped conf/ travels in the wheel, found by conf_dir() from any folder.
    shipped = venv / "share" / "sts-spark" / "conf"
    found = subprocess.run([py, "-c", "from sidecar import conf_dir; print(conf_dir())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == str(shipped), found.stdout + found.stderr
    for name in ("sidecar.yaml", "pipeline.yaml", "profiles/seed-200qps.yaml",
                 "cluster/databricks-init.sh", "cluster/k8s-pod-template.yaml",
                 "grafana/sts-spark.json", "prometheus/alerts.yml", "prometheus/prometheus.yml"):
        assert (shipped / name).is_file(), name
    # Capacity planning needs no Spark side: a shipped profile by name, from any folder.
    plan = subprocess.run([str(venv / "bin" / "sts"), "plan", "--profile", "seed-200qps"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "Profile seed-200qps" in plan.stdout and "GPUs:" in plan.stdout, plan.stdout
    bench = subprocess.run([str(venv / "bin" / "sts"), "bench", "--engine", "simulated"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert (bench.returncode, bench.stderr.strip()) == (2, BENCH_ELSEWHERE)
    usage = subprocess.run([str(venv / "bin" / "sts"), "demo", "--engine", "simulated"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2
    assert "sts-spark[spark,l1l2,demo]" in usage.stderr and "Traceback" not in usage.stderr
    # The kafka result channel needs the kafka extra: without it, one line, exit 2.
    kafka = subprocess.run([str(venv / "bin" / "sts"), "sidecar", "--engine", "simulated",
                            "--listen", f"127.0.0.1:{free_port()}", "--set", "results.kind=kafka",
                            "--set", "results.kafka.bootstrap_servers=127.0.0.1:9092"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert kafka.returncode == 2, kafka.stderr
    assert kafka.stderr.strip().splitlines()[-1] == (
        "sts: the kafka result channel needs confluent-kafka: pip install 'sts-spark[kafka]' "
        "(results.kind)")
