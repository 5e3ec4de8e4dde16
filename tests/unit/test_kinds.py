"""Every kind (engines, result channels and their Spark sides, event sources, writers) is
registered once, in one way (:class:`sidecar.KindRegistry`), and everything else reads
the registry: the config checks, the ``--engine``/``--writer``/``--source`` flags, the
factories, the shipped config. A toy kind is one registration away; no second list of
names is spelled anywhere in the code."""

from __future__ import annotations

import argparse
import ast
import itertools
from pathlib import Path

import pytest

from sidecar import ENGINES, RESULT_CHANNELS, KindRegistry, SidecarConfig
from sidecar.cli import build_parser
from sidecar.config import EngineConfig, ResultChannelConfig
from sidecar.engines import build_engine
from sidecar.result_channels import build_result_channel
from spark_ext.exceptions import PipelineConfigError
from spark_ext.kinds import CHANNEL_SIDES, EVENT_SOURCES, WRITERS, writer_choices
from tests.conftest import CONF
from tests.utils import REPO, library_modules

REGISTRIES = {"engines": ENGINES, "result channels": RESULT_CHANNELS,
              "event sources": EVENT_SOURCES, "channel sides": CHANNEL_SIDES,
              "writers": WRITERS}
#: Where the names are registered: the only places that may spell them as a list.
REGISTRY_MODULES = ("sidecar/kinds.py", "spark_ext/kinds.py")


def _choices(command: str, dest: str) -> tuple[str, ...]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if a.dest == dest)
    return tuple(action.choices)


def test_every_flag_offers_the_registered_names() -> None:
    assert ENGINES.names == ("vllm", "simulated")
    for command in ("sidecar", "demo", "validate", "bench"):
        assert _choices(command, "engine") == ENGINES.names, command
    for command in ("demo", "bench"):
        assert _choices(command, "writer") == writer_choices() == ("auto", *WRITERS.names)
    assert _choices("demo", "source") == CHANNEL_SIDES.names


def test_config_checks_name_the_field_and_the_registered_names() -> None:
    with pytest.raises(ValueError, match="engine.kind: 'tgi' is not one of vllm, simulated"):
        EngineConfig(kind="tgi")
    with pytest.raises(ValueError, match="results.kind: 's3' is not one of files, kafka"):
        ResultChannelConfig(kind="s3")
    from spark_ext.config import PipelineConfig

    for data, match in ((({"source": {"format": "xml"}}), "source.format: 'xml'"),
                        ({"output": {"writer": "iceberg"}}, "output.writer: 'iceberg'"),
                        ({"sidecar": {"result_channel": "s3"}}, "sidecar.result_channel: 's3'")):
        with pytest.raises(PipelineConfigError, match=match):
            PipelineConfig.from_dict(data)
    assert list(SidecarConfig.sections()) == ["server", "engine", "scheduler", "results",
                                              "warmup", "intake"]


def test_the_factories_build_each_kind(tmp_path: Path) -> None:
    assert build_engine(EngineConfig(kind="simulated")).kind == "simulated"
    cluster = build_engine(EngineConfig(kind="simulated", simulated={"replicas": 2}))
    assert type(cluster).__name__ == "SimulatedCluster" and cluster.batches == 2
    channel = build_result_channel(ResultChannelConfig(results_dir=str(tmp_path)), "s0")
    assert channel.kind == "files" and not channel.bounded
    for registry in REGISTRIES.values():  # every entry imports
        for name in registry.names:
            assert callable(registry.load(name)), (registry.kind, name)


def test_the_pipeline_reads_every_channel_the_sidecar_writes() -> None:
    assert set(CHANNEL_SIDES.names) == set(RESULT_CHANNELS.names)


def test_a_toy_kind_is_one_registration() -> None:
    """Registered, a toy writer is accepted by the config and built by the factory;
    a toy event source and a toy result channel's Spark side likewise (the channel's
    acks writer is what the submit tasks get)."""
    import pyarrow as pa

    from spark_ext.config import PipelineConfig
    from spark_ext.l4.channels import channel_side
    from spark_ext.l4.writers import writer_class
    from spark_ext.sources.events import event_source
    from tests.unit.toy_kinds import TOY_ACKS

    WRITERS.register("toy", "tests.unit.toy_kinds", "ToyWriter")
    EVENT_SOURCES.register("toy", "tests.unit.toy_kinds", "ToyEventSource")
    CHANNEL_SIDES.register("toy", "tests.unit.toy_kinds", "ToyChannelSide")
    try:
        config = PipelineConfig.from_dict({"output": {"writer": "toy"},
                                           "source": {"format": "toy"},
                                           "sidecar": {"result_channel": "toy"}})
        assert writer_class(config.output.writer).__name__ == "ToyWriter"
        assert type(event_source(config)).__name__ == "ToyEventSource"
        assert "toy" in writer_choices()
        side = channel_side(config, "p1")
        assert (type(side).__name__, side.source(), side.folders()) == \
            ("ToyChannelSide", "the toy channel", [])
        side.ack_channel("run1", 5).write([pa.record_batch({"request_id": ["r1", "r2"]})])
        assert TOY_ACKS == [("p1", "run1", 2)]
    finally:
        WRITERS._entries.pop("toy")
        EVENT_SOURCES._entries.pop("toy")
        CHANNEL_SIDES._entries.pop("toy")


def test_a_toy_engine_and_result_channel_serve_a_request() -> None:
    """Registered, a toy engine and a toy result channel are accepted by the sidecar's
    config, built by its factories, and serve a request from admission to its row."""
    import asyncio

    from sidecar import SchedulerConfig
    from sidecar.scheduler import Scheduler
    from tests.utils import make_sidecar_request, until

    ENGINES.register("toy", "tests.unit.toy_kinds", "ToyEngine")
    RESULT_CHANNELS.register("toy", "tests.unit.toy_kinds", "ToyResultChannel")
    try:
        config = SidecarConfig.from_dict({"engine": {"kind": "toy"},
                                          "results": {"kind": "toy"}})
        engine = build_engine(config.engine)
        channel = build_result_channel(config.results, "s0")
        assert (type(engine).__name__, type(channel).__name__) == ("ToyEngine",
                                                                   "ToyResultChannel")
        assert "toy" in _choices("sidecar", "engine")

        async def serve() -> None:
            await engine.start()
            scheduler = Scheduler(engine, channel.emit, SchedulerConfig(), "s0",
                                  results=channel)
            scheduler.start()
            try:
                [ack] = scheduler.submit_batch([make_sidecar_request("t1", max_tokens=4)])
                assert ack.accepted, ack
                await until(lambda: len(channel.rows) == 1)
            finally:
                await scheduler.abort_all()
                await engine.shutdown()

        asyncio.run(serve())
        assert [(r.request_id, r.status) for r in channel.rows] == [("t1", "ok")]
    finally:
        ENGINES._entries.pop("toy")
        RESULT_CHANNELS._entries.pop("toy")


def test_a_name_registered_twice_is_refused() -> None:
    registry: KindRegistry = KindRegistry("thing", "x.kind")
    registry.register("a", "math", "sqrt")
    registry.register("a", "math", "sqrt")  # the same again: harmless
    with pytest.raises(ValueError, match="thing 'a' is registered already"):
        registry.register("a", "math", "floor")


def _string_groups(tree: ast.AST):
    """Tuples, lists and sets of string constants, and ``Literal[...]`` subscripts."""
    for node in ast.walk(tree):
        elts = None
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elts = node.elts
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple):
            elts = node.slice.elts
        if elts:
            values = {e.value for e in elts if isinstance(e, ast.Constant)
                      and isinstance(e.value, str)}
            if len(values) >= 2:
                yield node.lineno, values


def test_no_second_list_of_a_kinds_names() -> None:
    """Outside the registries, no code spells two or more names of one kind together
    (a ``Literal``, a tuple of choices, a dict's keys would be a second list)."""
    found = []
    for name, path in library_modules(("sidecar", "spark_ext", "sts_harness",
                                       "benchmarks")).items():
        rel = str(path.relative_to(REPO))
        if rel in REGISTRY_MODULES or "/pb/" in rel:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        dict_keys = [(n.lineno, {k.value for k in n.keys if isinstance(k, ast.Constant)
                                 and isinstance(k.value, str)})
                     for n in ast.walk(tree) if isinstance(n, ast.Dict)]
        for (line, values), (kind, registry) in itertools.product(
                [*_string_groups(tree), *dict_keys], REGISTRIES.items()):
            if len(values & set(registry.names)) >= 2:
                found.append(f"{rel}:{line} spells {kind} {sorted(values & set(registry.names))}")
    assert not found, "\n".join(found)


def test_the_shipped_config_documents_every_kind() -> None:
    text = Path(CONF).read_text(encoding="utf-8")
    engine_line = next(line for line in text.splitlines() if line.strip().startswith("kind: vllm"))
    assert all(kind in engine_line for kind in ENGINES.names)
    results_line = next(line for line in text.splitlines()
                        if line.strip().startswith("kind: files"))
    assert all(kind in results_line for kind in RESULT_CHANNELS.names)
