"""The README's block "Every route, one after the other", run as printed, in order, in a
fresh folder: each command exits 0 with its summary and prints no traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils import REPO

BIN = Path(sys.executable).parent


def readme_block(heading: str) -> str:
    """The first ```bash block under ``## <heading>`` of the README."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split(f"## {heading}\n", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_readme_routes_run_in_sequence_as_printed(tmp_path: Path) -> None:
    block = readme_block("Every route, one after the other")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("SPARK_REMOTE", None)
    try:
        done = subprocess.run(["bash", "-e", "-c", "set -o pipefail\n" + block], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=1400)
    finally:  # a command that failed leaves the block before its server's --stop
        if (tmp_path / "sts-connect" / "connect-server.pid").exists():
            subprocess.run([str(BIN / "sts"), "connect-server", "--stop", "--work-dir",
                            str(tmp_path / "sts-connect")], env=env, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert done.stdout.count("=== sts demo summary ===") == 2, out[-4000:]
    assert "INCOMPLETE" not in done.stdout, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    # The local session's log profile: no notes of Spark's default one, no Hadoop WARN.
    assert "Using Spark's default log4j profile" not in out, out[:4000]
    assert "NativeCodeLoader" not in out, out[:4000]
    for folder in ("sts-demo-kafka", "sts-demo-connect"):
        assert (tmp_path / folder / "summary.json").is_file(), folder
    # L1/L2's figures on Connect too, where the answers batch counts them in the server.
    assert "L1/L2 routes         {}" not in done.stdout, out[-4000:]
