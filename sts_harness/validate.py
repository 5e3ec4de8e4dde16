"""``sts validate``: the rollout's ``offline`` mode over a table of past events.

Reads the events (Delta, Parquet or JSON lines; by default the shipped sample tickets),
starts a sidecar (``--engine``) unless ``--endpoint`` names one, runs L1-L4 in batch
(:func:`spark_ext.pipeline.offline.run_offline`), writes the report as a Delta table under
``--out/report``, prints a short table per priority and writes ``--out/summary.json``.
``--out`` must be new, empty or an earlier ``sts validate``'s folder (``--overwrite``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sidecar import ENGINES

#: Marks a folder as written by ``sts validate``: only such a folder is ever replaced.
MARKER = ".sts-validate"
#: What ``sts validate`` writes inside ``--out`` (all that ``--overwrite`` removes).
OUTPUTS = ("report", "results", "summary.json", "sidecar.log", "sidecar-token")
#: Key column of the shipped sample tickets.
SAMPLE_KEY = "ticket_id"


def sample_tickets() -> str:
    """Path of the shipped sample tickets (JSON lines)."""
    return str(resources.files("sts_harness").joinpath("samples/support_tickets.jsonl"))


@dataclass
class ValidateOptions:
    """Knobs of ``sts validate``."""

    input: str | None = None
    """Past events: a Delta table, Parquet, or JSON lines; ``None``: the sample tickets."""

    out: str = "./sts-validate"
    """Folder of the report (``out/report``) and the run's files."""

    config: str | None = None
    """Pipeline YAML (tagging, template, validation, routing, sidecar credentials)."""

    engine: str = "vllm"
    """Engine of the sidecar this command starts (a name in ``sidecar.ENGINES``)."""

    endpoint: str | None = None
    """Use this running sidecar instead of starting one (needs ``results_dir``)."""

    results_dir: str | None = None
    """The result folder of ``endpoint`` (default: the config's ``sidecar.results_dir``)."""

    key_columns: list[str] | None = None
    """The events' key columns (default: the config's; ``ticket_id`` for the samples)."""

    limit: int | None = None
    """Only the first ``limit`` events."""

    wave: int = 16
    """Requests in flight at once."""

    max_tokens: int | None = None
    """``tagging.max_tokens`` override."""

    overwrite: bool = False
    """Replace an earlier ``sts validate`` output in ``out``."""

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit {self.limit} must be >= 1")
        if self.wave < 1:
            raise ValueError(f"--wave {self.wave} must be >= 1")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"--max-tokens {self.max_tokens} must be >= 1")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine {self.engine!r} must be one of {', '.join(ENGINES.names)}")


def _config(opts: ValidateOptions):  # -> PipelineConfig
    from spark_ext.config import PipelineConfig

    from sts_harness.support_app import support_sections

    config = (PipelineConfig.from_yaml(opts.config) if opts.config
              else PipelineConfig.from_dict(support_sections({})))
    if opts.key_columns:
        config.tagging.key_columns = list(opts.key_columns)
    elif opts.input is None:  # the shipped samples are keyed by ticket_id
        config.tagging.key_columns = [SAMPLE_KEY]
    if opts.max_tokens is not None:
        config.tagging.max_tokens = opts.max_tokens
    return config


def run_validate(opts: ValidateOptions) -> dict:
    """Run the offline comparison and return the summary (also ``out/summary.json``).

    Raises:
        InputFileError: the events are missing, empty, malformed or lack a column.
        PipelineConfigError: the config file is bad.
        FileExistsError, NotADirectoryError: ``--out`` cannot be used.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from spark_ext.sources.event_tables import read_event_table
    from spark_ext.exceptions import InputFileError
    from sts_harness.demo import prepare_out

    source = opts.input or sample_tickets()
    events = read_event_table(source, limit=opts.limit)  # bad input: nothing started
    config = _config(opts)
    if missing := [k for k in config.tagging.key_columns if k not in events.column_names]:
        raise InputFileError(f"{source}: no column {missing} (tagging.key_columns; "
                             f"the events have {events.column_names}; see --key-columns)")
    out = Path(opts.out).expanduser().resolve()
    if opts.endpoint and not (opts.results_dir or opts.config):
        raise ValueError("--endpoint needs --results-dir (the folder that sidecar writes) "
                         "or a --config with sidecar.results_dir")
    prepare_out(out, overwrite=opts.overwrite, command="sts validate", marker=MARKER,
                outputs=OUTPUTS)

    from deltalake import write_deltalake

    from spark_ext.pipeline.offline import run_offline
    from spark_ext.session import session_scope
    from sts_harness.process import start_local_sidecar
    from sts_harness.rollout_report import priority_table

    with contextlib.ExitStack() as stack:
        if opts.endpoint:  # that sidecar, with the config's credentials
            config.sidecar = dataclasses.replace(
                config.sidecar, endpoint=opts.endpoint, gpu_endpoint=None, launch="none",
                results_dir=(str(Path(opts.results_dir).resolve()) if opts.results_dir
                             else config.sidecar.results_dir))
        else:
            if opts.engine == "vllm":
                from sidecar import prepare_default_model

                print(f"Model: {prepare_default_model()}", flush=True)
            sidecar, token_file = start_local_sidecar(stack, out, opts.engine,
                                                      "validate-sidecar")
            config.sidecar = dataclasses.replace(  # ours: plaintext loopback, its token
                config.sidecar, endpoint=sidecar.target, gpu_endpoint=None, launch="none",
                results_dir=str(out / "results"), token_file=str(token_file), token_env=None,
                tls_ca_file=None, tls_cert_file=None, tls_key_file=None, tls_server_name=None)
        spark = stack.enter_context(session_scope("sts-validate"))
        run_id = f"validate-{uuid.uuid4().hex[:12]}"
        started = time.monotonic()
        print(f"sts validate: {events.num_rows} events from {source} "
              f"against {config.sidecar.endpoint}", flush=True)
        report = run_offline(spark, events, config, run_id=run_id, wave=opts.wave,
                             progress=lambda done, total: print(
                                 f"sts validate: {done}/{total} events", flush=True))
    write_deltalake(str(out / "report"), report, mode="error")
    summary = {"input": source, "events": report.num_rows, "run_id": run_id,
               "wall_s": round(time.monotonic() - started, 1),
               "engine": None if opts.endpoint else opts.engine,
               "endpoint": opts.endpoint, "report": str(out / "report"),
               "by_priority": priority_table(report.to_pylist())}
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary


def print_summary(summary: dict) -> None:
    """The per-priority table and where the report is."""
    from sts_harness.rollout_report import format_priority_table

    engine = summary["engine"] or summary["endpoint"]
    label = " (SIMULATION)" if engine == "simulated" else ""
    print(f"\n=== sts validate: {summary['events']} events, engine {engine}{label}, "
          f"{summary['wall_s']:.0f} s ===")
    for line in format_priority_table(summary["by_priority"]):
        print(line)
    print(f"delta table report    {summary['report']}")
