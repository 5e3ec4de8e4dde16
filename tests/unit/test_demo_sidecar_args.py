"""The flags ``sts demo`` starts its sidecar with are a valid sidecar configuration."""

from __future__ import annotations

import pytest

from sidecar.commands import _parse_pairs
from sidecar.config import SidecarConfig
from sts_harness.demo import (DEMO_DELIVERY_MS, DEMO_SHED_UNDER_PRESSURE, DemoOptions,
                               demo_sidecar_args)


def _settings(args: list[str]) -> dict:
    """The ``--set`` pairs of ``args``, read as ``sts sidecar`` reads them."""
    return _parse_pairs([args[i + 1] for i, a in enumerate(args) if a == "--set"], "--set")


@pytest.mark.parametrize("engine", ["vllm", "simulated"])
def test_the_demo_sidecar_aims_to_finish_before_the_answer_trip(engine: str) -> None:
    """The demo's sidecar plans each request's batch to finish ``DEMO_DELIVERY_MS`` before
    its deadline (issue 31: `high` answers finished in the SLA's last second landed after
    it) and sheds ``low`` at once while ``normal`` loses requests to waiting (the pools'
    order on a slow engine); with ``--source kafka`` its results go to the broker."""
    config = SidecarConfig().with_overrides(
        _settings(demo_sidecar_args(DemoOptions(engine=engine), None)))
    assert config.scheduler.delivery_ms == DEMO_DELIVERY_MS > 0
    assert config.scheduler.load_shedding.under_pressure == DEMO_SHED_UNDER_PRESSURE == ["low"]
    kafka = SidecarConfig().with_overrides(
        _settings(demo_sidecar_args(DemoOptions(engine=engine), "127.0.0.1:9092")))
    assert kafka.results.kind == "kafka"
    assert kafka.results.kafka.bootstrap_servers == "127.0.0.1:9092"
