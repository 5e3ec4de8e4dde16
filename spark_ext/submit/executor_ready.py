"""A new GPU executor takes no task until its GPU's sidecar serves (issue 64: scale-up
without a stall of the stream).

A micro-batch waits for its slowest task, and the first stream task on a new executor
pays for starting that GPU's sidecar, its Python worker and the submit path's imports:
at every scale-up the whole stream stood still. Spark itself has the gate: it offers an
executor tasks only once the executor's constructor has returned, and the constructor
runs the executor plugins' ``init``. ``ExecutorReadyPlugin`` (``jvm/ExecutorReadyPlugin.java``,
shipped as source, compiled against the session's Spark by :func:`plugin_jar`) asks the
driver for what the pipeline announced (:func:`announce`: the ``sidecar`` section, when
``launch: lazy``) and runs this module on the executor (:func:`main`) with it; the
executor comes up when the sidecar serves, and until then the stream's tasks run on the
executors that serve. It holds on a cluster as it does here: every executor, on any
cluster manager, is offered tasks only after its plugins' ``init``.

Turn it on where the session is made (``spark.plugins`` is read once, at start)::

    from spark_ext.submit.executor_ready import with_plugin
    builder.config(map=with_plugin({...your settings...}))   # or spark-submit --conf ...

``python -m spark_ext.submit.executor_ready --conf`` prints the ``--conf`` flags. The
pipeline announces its settings at start; without the plugin nothing changes, and
without an announcement (a pipeline whose sidecars the cluster starts) an executor comes
up at once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from spark_ext.config import SidecarEndpointConfig

logger = logging.getLogger(__name__)

#: The plugin's class (``spark.plugins``).
PLUGIN_CLASS = "io.stsspark.spark.ExecutorReadyPlugin"
#: Its Java source, shipped in the package.
SOURCE = Path(__file__).resolve().parents[1] / "jvm" / "ExecutorReadyPlugin.java"
#: Longest an executor is held for its sidecar (beyond it, it takes tasks; the plugin's
#: ``spark.sts.executorReady.timeoutS``).
TIMEOUT_CONF = "spark.sts.executorReady.timeoutS"


def _spark_jars() -> list[str]:
    from spark_ext.jvm_packages import spark_home

    return sorted(str(p) for p in (spark_home() / "jars").glob("*.jar"))


def plugin_jar(out_dir: Path | None = None) -> Path:
    """The plugin compiled against this PySpark's Spark (built once, then reused).

    Raises:
        spark_ext.jvm_build.JvmBuildError: no ``javac``, or it failed.
    """
    from spark_ext import jvm_build
    from spark_ext.jvm_packages import jars_dir

    classpath = [j for j in _spark_jars()
                 if Path(j).name.startswith(("spark-core_", "spark-common-utils", "slf4j-api"))]
    folder = out_dir or jars_dir()
    return jvm_build.build_jar(SOURCE, classpath,
                               folder / jvm_build.jar_name("sts-executor-ready", SOURCE,
                                                           classpath))


def plugin_conf(timeout_s: float | None = None) -> dict[str, str]:
    """The session settings that load the plugin: ``spark.plugins`` and its jar in
    ``spark.jars`` (merge them with settings of your own of the same names)."""
    conf = {"spark.plugins": PLUGIN_CLASS, "spark.jars": plugin_jar().as_uri()}
    if timeout_s is not None:
        conf[TIMEOUT_CONF] = f"{int(timeout_s)}"
    return conf


def with_plugin(conf: dict[str, str], timeout_s: float | None = None) -> dict[str, str]:
    """``conf`` plus the plugin's settings, list settings (``spark.plugins``,
    ``spark.jars``) joined rather than replaced.

    Example:
        >>> merged = with_plugin({"spark.jars": "file:/a.jar", "spark.x": "1"})
        >>> merged["spark.jars"].startswith("file:/a.jar,file:"), merged["spark.x"]
        (True, '1')
    """
    out = dict(conf)
    for key, value in plugin_conf(timeout_s).items():
        if key in ("spark.plugins", "spark.jars") and out.get(key):
            kept = [v.strip() for v in out[key].split(",") if v.strip()]
            out[key] = ",".join(kept + [value] * (value not in kept))
        else:
            out[key] = value
    return out


def plugin_loaded(spark: Any) -> bool:
    """Whether the session runs the plugin (a classic session with it in ``spark.plugins``;
    a Spark Connect client never knows: its server's executors decide)."""
    from spark_ext.session import is_connect

    if spark is None or is_connect(spark):
        return False
    get_conf = getattr(getattr(spark, "sparkContext", None), "getConf", None)
    if get_conf is None:  # not a classic session
        return False
    plugins = get_conf().get("spark.plugins", "") or ""
    return PLUGIN_CLASS in [p.strip() for p in plugins.split(",")]


def announcement(sidecar: SidecarEndpointConfig) -> str | None:
    """What the plugin hands a new executor: ``sidecar`` as tasks get it (relative
    folders made the driver's), when its sidecars start lazily; else ``None``.

    Example:
        >>> import os
        >>> spec = json.loads(announcement(SidecarEndpointConfig(launch="lazy", run_dir="run")))
        >>> spec["sidecar"]["run_dir"] == os.path.join(os.getcwd(), "run")
        True
        >>> announcement(SidecarEndpointConfig(launch="none")) is None
        True
    """
    from spark_ext.submit.sidecar_launcher import for_tasks

    if sidecar.launch != "lazy":
        return None
    return json.dumps({"sidecar": dataclasses.asdict(for_tasks(sidecar))})


def announce(spark: Any, sidecar: SidecarEndpointConfig) -> bool:
    """Tell the plugin what new executors wait for (:func:`announcement`; nothing: an
    executor comes up at once). Returns whether something was announced."""
    if not plugin_loaded(spark):
        return False
    spec = announcement(sidecar)
    spark.sparkContext._jvm.io.stsspark.spark.ExecutorReadyPlugin.announce(spec)
    return spec is not None


def ready(spec: dict[str, Any], gpus: list[str]) -> tuple[bool, str]:
    """Start and await the sidecar of the first of ``gpus`` (or the default endpoint) as a
    task would (:func:`~spark_ext.submit.sidecar_launcher.ensure_sidecar`), and read the
    submit path's modules once. Returns whether it serves, and a line saying so."""
    from spark_ext.submit.sidecar_launcher import endpoint_for, ensure_sidecar

    config = SidecarEndpointConfig(**spec["sidecar"])
    gpu = gpus[0] if gpus else None
    endpoint = endpoint_for(config, gpu)
    began = time.monotonic()
    serving = ensure_sidecar(config, gpu, endpoint)
    import spark_ext.submit.submission  # noqa: F401  (the stream's tasks import it next)

    took = time.monotonic() - began
    state = "serves" if serving else f"does not serve after {config.start_timeout_s:g} s"
    return serving, f"sts executor ready: GPU {gpu}'s sidecar at {endpoint} {state} ({took:.1f} s)"


def main(argv: list[str] | None = None) -> int:
    """The executor side (run by the plugin): the announcement on stdin, the executor's
    GPUs in ``STS_EXECUTOR_GPUS``. ``--conf`` prints the session flags instead."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--conf"]:
        print(" ".join(f"--conf {k}={v}" for k, v in plugin_conf().items()))
        return 0
    if args:
        print("usage: python -m spark_ext.submit.executor_ready [--conf]", file=sys.stderr)
        return 2
    try:
        spec = json.loads(sys.stdin.read())
        gpus = [g for g in os.environ.get("STS_EXECUTOR_GPUS", "").split(",") if g]
        serving, line = ready(spec, gpus)
    except Exception as e:  # one line in the executor's log; the executor comes up anyway
        print(f"sts executor ready: failed: {type(e).__name__}: {e}".splitlines()[0],
              file=sys.stderr)
        return 1
    print(line, file=sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
