"""What an import costs a Spark Python worker: the L1/L2 modules an executor runs load
neither the sidecar's gateway (admission, config, engines) nor gRPC's server side."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Modules of the gateway that only the sidecar process needs.
GATEWAY = ("sidecar.admission", "sidecar.scheduler", "sidecar.server", "sidecar.config",
           "sidecar.engines", "grpc._server", "grpc.aio._server")


def _loaded_after(statement: str) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["spark_ext", "spark_ext.l1", "spark_ext.l2"])
def test_an_executor_import_loads_no_gateway(module: str) -> None:
    loaded = _loaded_after(f"import {module}")
    gateway = [m for m in loaded if any(m == g or m.startswith(g + ".") for g in GATEWAY)]
    assert not gateway, f"import {module} loads {gateway}"


def test_a_public_sidecar_name_is_the_function_not_its_module() -> None:
    """``sidecar``'s names load on first use; a name that is also a module's must still
    be the function once that module was imported by someone else first."""
    loaded = _loaded_after("import sidecar.stats\nfrom sidecar import percentiles\n"
                           "assert callable(percentiles), percentiles")
    assert "sidecar.stats" in loaded
