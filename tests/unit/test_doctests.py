"""Every ``>>>`` example in the library, harness and benchmark modules runs."""

from __future__ import annotations

import doctest
import importlib

import pytest

from tests.utils import library_modules

MODULES = library_modules(("sidecar", "spark_ext", "sts_harness", "sts_capacity", "benchmarks"))

#: Modules whose examples need a SparkSession (run by tests/process/test_inference_api.py).
NEEDS_SPARK = {"spark_ext.api.inference", "spark_ext.session", "spark_ext.pipeline.sts_pipeline"}

WITH_EXAMPLES = sorted(name for name, path in MODULES.items()
                       if ">>>" in path.read_text(encoding="utf-8") and name not in NEEDS_SPARK)


def test_examples_are_found() -> None:
    assert "sidecar.atomic_files" in WITH_EXAMPLES


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module", WITH_EXAMPLES)
def test_module_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"
