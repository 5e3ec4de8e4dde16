"""Every notebook runs headless, top to bottom, without a cell error (nbclient).

The quickstart streams the sample tickets with the simulated engine (the real vLLM
path is what ``sts demo`` and the slow tests cover); the analyst notebook reads the
tables the quickstart wrote; the capacity notebook plans and measures a short knee.
Each runs in its own kernel (its own Spark), with a time cap per cell.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.utils import REPO

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = REPO / "notebooks"


def _run(name: str, cwd: Path, **parameters: object) -> nbformat.NotebookNode:
    """Execute ``notebooks/<name>`` in ``cwd`` with ``parameters`` set after its
    ``parameters`` cell (papermill's convention); raise on the first failing cell."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    overrides = "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(overrides))
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def _outputs(nb: nbformat.NotebookNode) -> str:
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) if o.get("output_type") == "stream")


def test_notebooks_are_generated_from_the_script() -> None:
    """``scripts/make_notebooks.py`` is the source; the committed files match it."""
    spec = importlib.util.spec_from_file_location("make_notebooks",
                                                  REPO / "scripts" / "make_notebooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_notebooks"] = module
    spec.loader.exec_module(module)
    for name, text in module.render().items():
        assert (NOTEBOOKS / name).read_text(encoding="utf-8") == text, (
            f"{name} is stale: run python scripts/make_notebooks.py")


@pytest.mark.timeout(600)
def test_the_own_stream_notebook_answers_every_event_once(tmp_path: Path) -> None:
    """``00_own_stream``: three cells on the user's stream, against a running sidecar."""
    from tests.utils import RemoteSidecar

    args = ["--engine", "simulated", "--sidecar-id", "notebook",
            "--set", "engine.simulated.step_base_ms=5", "--set", "results.flush_interval_s=0.05"]
    with RemoteSidecar(tmp_path / "results", args, log_path=tmp_path / "sidecar.log") as sidecar:
        nb = _run("00_own_stream.ipynb", tmp_path, SIDECAR=sidecar.target,
                  RESULTS_DIR=str(tmp_path / "results"), OUT=str(tmp_path / "own"), SECONDS=15)
    text = _outputs(nb)
    line = next(x for x in text.splitlines() if x.startswith("answers:"))
    answers, answered = int(line.split()[1]), int(line.split()[-1])
    assert answers == answered > 0, text[-2000:]  # one row per event
    assert re.search(r"\|\s*llm\|", text), text[-2000:]  # the model answered


@pytest.mark.timeout(900)
def test_every_notebook_runs_headless(tmp_path: Path) -> None:
    out = tmp_path / "quickstart"
    quick = _run("01_quickstart.ipynb", tmp_path, ENGINE="simulated", OUT=str(out),
                 RATE=3.0, DURATION=8.0, WRITER="deltalake")
    text = _outputs(quick)
    assert "sts-submit" in text and "tables:" in text
    assert (out / "tables" / "answers" / "_delta_log").is_dir()

    analyst = _run("02_analyst.ipynb", tmp_path, TABLES=str(out / "tables"))
    text = _outputs(analyst)
    assert "'answers': 24" in text, text[-2000:]  # 3/s x 8 s, one answer each
    assert "backfilled:" in text
    images = [o for c in analyst.cells for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) >= 2  # answers by source, latency against the SLA

    capacity = _run("03_capacity.ipynb", tmp_path, OUT=str(tmp_path / "capacity"),
                    RATES=[2.0, 8.0], DURATION=4.0)
    assert "knee:" in _outputs(capacity)
    assert (tmp_path / "capacity" / "bench.json").is_file()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_quickstart_and_the_analyst_run_on_spark_connect(
        spark_connect_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``SPARK_REMOTE`` set, as in a Databricks serverless notebook, the notebooks'
    ``local_session`` is a Spark Connect client: the quickstart's pipeline runs there with
    Delta on Spark, and the analyst notebook reads its tables with Spark's Delta reader."""
    monkeypatch.setenv("SPARK_REMOTE", spark_connect_server.remote)
    out = tmp_path / "quickstart"
    quick = _run("01_quickstart.ipynb", tmp_path, ENGINE="simulated", OUT=str(out),
                 RATE=3.0, DURATION=6.0)
    assert "writer: spark" in _outputs(quick)
    analyst = _run("02_analyst.ipynb", tmp_path, TABLES=str(out / "tables"))
    assert "'answers': 18" in _outputs(analyst)  # 3/s x 6 s, one answer each
