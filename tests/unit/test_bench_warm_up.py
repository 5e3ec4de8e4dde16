"""The bench's warm-up waits for the pipeline's first writes of its record tables
(:func:`sts_harness.warm_up.wait_first_writes`)."""

from __future__ import annotations

import pytest

from sts_harness.warm_up import wait_first_writes


class _Pipeline:
    """A pipeline whose tables appear after a number of ``check()`` calls each (the
    caller's behaviour is what is tested: how long it waits, and what it says)."""

    def __init__(self, appear_after: dict[str, int]) -> None:
        self.appear_after = appear_after
        self.checks = 0
        self.spark = None
        self.tables = self

    def exists(self, spark: object, name: str) -> bool:
        return self.checks >= self.appear_after[name]

    def check(self) -> None:
        self.checks += 1


def test_the_run_starts_once_both_record_tables_were_written() -> None:
    pipeline = _Pipeline({"requests": 1, "results": 2})
    wait_first_writes(pipeline, timeout_s=30)  # type: ignore[arg-type]
    assert pipeline.checks == 2


def test_a_table_never_written_fails_the_warm_up_by_name() -> None:
    pipeline = _Pipeline({"requests": 0, "results": 10**9})
    with pytest.raises(TimeoutError, match=r"did not write \['results'\]"):
        wait_first_writes(pipeline, timeout_s=0.4)  # type: ignore[arg-type]
