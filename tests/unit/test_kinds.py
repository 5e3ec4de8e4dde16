"""Each kind list (engines, result channels) is defined once, next to its factory, and
the config checks, the ``--engine`` flags and the shipped config read it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sidecar import ENGINE_KINDS, RESULT_CHANNEL_KINDS, SidecarConfig
from sidecar.cli import build_parser
from sidecar.config import EngineConfig, ResultChannelConfig
from sidecar.engines import build_engine
from sidecar.result_channels import build_result_channel
from tests.conftest import CONF


def _choices(command: str, dest: str = "engine") -> tuple[str, ...]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if a.dest == dest)
    return tuple(action.choices)


def test_every_engine_flag_offers_the_registered_kinds() -> None:
    assert ENGINE_KINDS == ("vllm", "simulated")
    for command in ("sidecar", "demo", "validate", "bench"):
        assert _choices(command) == ENGINE_KINDS, command


def test_config_checks_name_the_registered_kinds() -> None:
    with pytest.raises(ValueError, match="must be one of \\('vllm', 'simulated'\\)"):
        EngineConfig(kind="tgi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be one of \\('files', 'kafka'\\)"):
        ResultChannelConfig(kind="s3")  # type: ignore[arg-type]
    assert list(SidecarConfig.sections()) == ["server", "engine", "scheduler", "results",
                                              "warmup"]


def test_the_factories_build_each_kind(tmp_path: Path) -> None:
    assert build_engine(EngineConfig(kind="simulated")).kind == "simulated"
    channel = build_result_channel(ResultChannelConfig(results_dir=str(tmp_path)), "s0")
    assert channel.kind == "files" and not channel.bounded


def test_the_shipped_config_documents_every_kind() -> None:
    text = Path(CONF).read_text(encoding="utf-8")
    engine_line = next(line for line in text.splitlines() if line.strip().startswith("kind: vllm"))
    assert all(kind in engine_line for kind in ENGINE_KINDS)
    results_line = next(line for line in text.splitlines()
                        if line.strip().startswith("kind: files"))
    assert all(kind in results_line for kind in RESULT_CHANNEL_KINDS)
