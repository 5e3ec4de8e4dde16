"""Configuration loading/validation, the Parquet result channel, and model preparation."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sidecar.config import ResultChannelConfig, SchedulerConfig, SidecarConfig
from sidecar.contract import RESULT_SCHEMA
from sidecar.model_prep import default_model_dir, is_prepared, prepare_default_model
from sidecar.request_state import ResultRecord
from sidecar.result_writer import ParquetResultWriter
from tests.conftest import CONF


def test_repo_config_loads_and_flags_override() -> None:
    config = SidecarConfig.from_yaml(CONF)
    assert config.engine.kind == "vllm"
    assert config.results.flush_interval_s <= 0.2
    changed = config.with_overrides({"server.listen": "unix:///tmp/x.sock",
                                     "scheduler.max_in_flight": 3, "engine.model": None})
    assert changed.server.listen == "unix:///tmp/x.sock"
    assert changed.scheduler.max_in_flight == 3
    assert changed.engine.model == config.engine.model


@pytest.mark.parametrize("bad, field", [
    ({"scheduler": {"max_in_flight": 0}}, "max_in_flight"),
    ({"results": {"flush_interval_s": 1.0}}, "flush_interval_s"),
    ({"engine": {"kind": "tgi"}}, "kind"),
    ({"scheduler": {"max_inflight": 3}}, "max_inflight"),
    ({"schedular": {}}, "schedular"),
])
def test_bad_config_names_the_field(bad: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SidecarConfig.from_dict(bad)


def _record(i: int) -> ResultRecord:
    return ResultRecord(
        request_id=f"w{i}", trace_id="t", status="ok", text="hi", finish_reason="stop",
        prompt_tokens=3, output_tokens=1, cached_tokens=0, enqueue_ts=1, received_ts=2,
        first_token_ts=None, finish_ts=4, ttft_ms=None, tpot_ms=None, error=None,
        sidecar_id="s", model="m", priority="high", deadline_ts=9, callback_topic="")


def test_writer_flushes_within_interval_and_files_are_complete(tmp_path: Path) -> None:
    config = ResultChannelConfig(results_dir=str(tmp_path), flush_interval_s=0.05,
                                 max_rows_per_file=4)

    async def run() -> float:
        writer = ParquetResultWriter(config, "s0")
        writer.start()
        start = time.monotonic()
        writer.emit(_record(0))
        while not list(tmp_path.glob("*.parquet")):
            await asyncio.sleep(0.005)
        first_file_s = time.monotonic() - start
        for i in range(1, 10):
            writer.emit(_record(i))
        await writer.close()
        return first_file_s

    first_file_s = asyncio.run(run())
    assert first_file_s < 1.0
    files = sorted(tmp_path.glob("*.parquet"))
    tables = [pq.read_table(f) for f in files]
    assert all(t.schema.equals(RESULT_SCHEMA) for t in tables)
    assert all(t.num_rows <= 4 for t in tables)
    ids = [i for t in tables for i in t.column("request_id").to_pylist()]
    assert sorted(ids) == sorted(f"w{i}" for i in range(10))
    assert not list(tmp_path.glob(".*")), "temporary files left behind"


def test_scheduler_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_tokens_cap"):
        SchedulerConfig(max_tokens_cap=0)


def test_model_prepare_is_idempotent_and_vllm_loadable(smollm2_dir: Path) -> None:
    assert smollm2_dir == default_model_dir() and is_prepared(smollm2_dir)
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["head_dim"] >= 64
    assert (smollm2_dir / "model.safetensors").stat().st_size > 100_000_000
    assert "im_start" in (smollm2_dir / "chat_template.jinja").read_text()
    start = time.monotonic()
    assert prepare_default_model() == smollm2_dir
    assert time.monotonic() - start < 2.0
