"""A real multi-executor Spark on one machine with one fake GPU per executor
(``local-cluster[N,cores,memory]``), for the GPU-cluster test and the load-step benchmark.

Each worker finds one GPU with :data:`DISCOVERY` (the first worker gets address ``0``,
the next ``1``, ...), each executor takes it, and every task asks for its share of one
(``task_gpu_amount``), so a task's GPU says which executor, and so which lazily started
sidecar, it runs on. A ``local-cluster`` session cannot share a process with a ``local``
one: run it in its own process.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Spark's GPU discovery script for one machine: every call gets the next address.
DISCOVERY = Path(__file__).with_name("fake_gpu_discovery.sh")


def _spark_home(pyspark_dir: Path, work: Path) -> Path:
    """A Spark home of links to the installed PySpark's folders: a local-cluster's
    workers write the executors' folders under ``$SPARK_HOME/work``, which must not be
    the shared site-packages."""
    home = work / "spark-home"
    home.mkdir(exist_ok=True)
    for entry in pyspark_dir.iterdir():
        if entry.name != "work" and not (home / entry.name).exists():
            (home / entry.name).symlink_to(entry)
    return home


def gpu_cluster_session(work: Path, *, workers: int = 2, cores: int = 1,
                        memory_mb: int = 1024, task_gpu_amount: float = 1.0,
                        app_name: str = "sts-gpu-cluster",
                        conf: dict[str, str] | None = None) -> Any:
    """A ``local-cluster[workers,cores,memory_mb]`` session, one fake GPU per worker and
    executor, decommissioning on (a released executor finishes its tasks first).

    Args:
        work: A folder of this application's own (the Spark home's links, the GPU
            address counter).
        task_gpu_amount: The share of a GPU each task takes (``1/cores`` lets every
            core of an executor run a task).
        conf: More Spark settings.
    """
    import pyspark
    from pyspark.sql import SparkSession

    from spark_ext.session import pin_python_workers

    pin_python_workers()  # spark.pyspark.python alone does not reach the executors' workers
    os.environ["STS_FAKE_GPU_DIR"] = str(work / "gpus")
    os.environ["SPARK_HOME"] = str(_spark_home(Path(pyspark.__file__).parent, work))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    builder = (SparkSession.builder
               .master(f"local-cluster[{workers},{cores},{memory_mb}]").appName(app_name)
               .config("spark.pyspark.python", sys.executable)
               .config("spark.executorEnv.PYTHONPATH", pythonpath)
               .config("spark.worker.resource.gpu.amount", "1")
               .config("spark.worker.resource.gpu.discoveryScript", str(DISCOVERY))
               .config("spark.executor.resource.gpu.amount", "1")
               .config("spark.executor.resource.gpu.discoveryScript", str(DISCOVERY))
               .config("spark.task.resource.gpu.amount", str(task_gpu_amount))
               .config("spark.locality.wait", "0")
               .config("spark.decommission.enabled", "true")
               .config("spark.sql.shuffle.partitions", str(max(2, workers)))
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def executors(spark: Any) -> int:
    """Executors registered now (the driver not counted)."""
    return spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1


def until_executors(spark: Any, n: int, timeout_s: float = 120.0) -> float:
    """Seconds until exactly ``n`` executors are registered.

    Raises:
        TimeoutError: Not reached within ``timeout_s``.
    """
    started = time.monotonic()
    while executors(spark) != n:
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{n} executors not reached after {timeout_s}s "
                               f"({executors(spark)} now)")
        time.sleep(0.2)
    return time.monotonic() - started
