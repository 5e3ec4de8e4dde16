"""The JVM packages the pipeline uses, as Maven coordinates for ``spark.jars.packages``.

Spark resolves them itself (Ivy, from Maven Central, cached under ``~/.ivy2.5.2``), the
way Spark users get connectors (``--packages``). Which versions: the Kafka connector is
Spark's own release (it must match the running Spark exactly), Delta the release built
for the running Spark's minor version, hadoop-aws the version of the Hadoop client that
Spark ships.

``python -m spark_ext.jvm_packages --fetch`` (``scripts/install.sh`` runs it) resolves
them once and records the jars Spark resolved in ``$STS_CACHE_DIR/jvm-packages/``; a
local session then gets those files as ``spark.jars`` and starts without resolving
anything (no network, no Ivy report on the console). Without the record it falls back to
``spark.jars.packages``.

    python -m spark_ext.jvm_packages                 # the coordinates, comma-separated
    spark-submit --packages "$(python -m spark_ext.jvm_packages)" spark_ext/pipeline/job.py ...
    python -m spark_ext.jvm_packages --with s3 --fetch   # resolve into Ivy's cache now
    python -m spark_ext.jvm_packages --log-store          # the jar of Delta's log store for file:
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Literal, get_args

from spark_ext import delta_log_store

logger = logging.getLogger(__name__)

#: What a session can be given: Spark's Kafka source and sink, Delta on Spark, the
#: ``s3a://`` file system (hadoop-aws with the AWS SDK bundle, ~600 MB: only on request)
#: and a local file system that sets file permissions without a ``chmod`` process
#: (:data:`LOCAL_FS_CONF`).
JvmFeature = Literal["kafka", "delta", "s3", "localfs"]
JVM_FEATURES: tuple[str, ...] = get_args(JvmFeature)
#: The features a local session gets unless told otherwise.
DEFAULT_FEATURES: tuple[JvmFeature, ...] = ("kafka", "delta", "localfs")
#: The ``localfs`` package: Hadoop's local file system with its shell commands replaced by
#: Java's own file calls (Apache-2.0, a subclass of Hadoop's ``RawLocalFileSystem``).
LOCAL_FS_PACKAGE = "com.globalmentor:hadoop-bare-naked-local-fs:0.1.0"
#: ``file:`` through that package. Without Hadoop's native library (PySpark from PyPI has
#: none), Hadoop's own local file system starts a ``chmod`` process for every file it
#: creates and a ``readlink`` for some lookups: at 200 events/s on 2 cores, ~39 processes
#: a second (~10 with it: Delta's commits go through Hadoop's ``FileContext``, which keeps
#: its own) and 11-15 ms of each checkpoint write (measured with and without it).
#: The files on disk are the same (checksums included).
LOCAL_FS_CONF = {
    "spark.hadoop.fs.file.impl": "com.globalmentor.apache.hadoop.fs.BareLocalFileSystem"}
#: The Delta release built for each Spark minor version (delta-spark's pom names the Spark
#: it was built against; a Delta jar does not load on another minor).
DELTA_FOR_SPARK = {"4.0": "4.0.1", "4.1": "4.3.1", "4.2": "4.4.0"}
#: Spark's Delta settings: the SQL extension (MERGE, ``delta.`path```), the catalog that
#: makes ``spark_catalog`` tables Delta tables, and few partitions for reading a table's
#: log (Delta's default of 50 is for logs of thousands of files; measured here, 2 cores:
#: an append of 500 rows took 9.5 s with 50 and 1.8 s with 2, most of it generating code
#: in each of those tasks).
DELTA_SESSION_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "2",
}
#: Overrides the coordinates a local session gets (comma-separated; empty: none).
PACKAGES_ENV = "STS_SPARK_PACKAGES"
SCALA_BINARY = "2.13"


def spark_home() -> Path:
    """The folder of the installed PySpark's Spark (its ``jars/`` and ``bin/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


def spark_version() -> str:
    """The installed PySpark's version without a ``.dev``/``rc`` suffix, e.g. ``4.2.0``."""
    import pyspark

    match = re.match(r"\d+\.\d+\.\d+", pyspark.__version__)
    if not match:
        raise ValueError(f"cannot read a Spark version from {pyspark.__version__!r}")
    return match.group(0)


def hadoop_api_jar(jars: Path | None = None) -> Path:
    """The Hadoop client API jar that Spark ships (in ``jars``, default Spark's ``jars/``)."""
    folder = jars or spark_home() / "jars"
    for jar in sorted(folder.glob("hadoop-client-api-*.jar")):
        return jar
    raise FileNotFoundError(f"no hadoop-client-api jar in {folder}")


def hadoop_version(jars: Path | None = None) -> str:
    """The version of the Hadoop client jar that Spark ships (hadoop-aws must match it)."""
    return hadoop_api_jar(jars).name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def packages(features: Iterable[JvmFeature] = DEFAULT_FEATURES, *,
             version: str | None = None) -> list[str]:
    """Maven coordinates for ``features`` on Spark ``version`` (default: the installed one).

    Raises:
        ValueError: an unknown feature, or no Delta release is known for that Spark.

    Example:
        >>> packages(["kafka", "delta"], version="4.2.0")
        ['org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0', 'io.delta:delta-spark_2.13:4.4.0']
        >>> packages(["localfs"], version="4.2.0")
        ['com.globalmentor:hadoop-bare-naked-local-fs:0.1.0']
    """
    version = version or spark_version()
    coords = []
    for feature in dict.fromkeys(features):
        if feature == "kafka":
            coords.append(f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{version}")
        elif feature == "delta":
            minor = ".".join(version.split(".")[:2])
            if minor not in DELTA_FOR_SPARK:
                raise ValueError(f"no Delta release known for Spark {version} "
                                 f"(known: {', '.join(sorted(DELTA_FOR_SPARK))}); "
                                 "use output.writer: deltalake")
            coords.append(f"io.delta:delta-spark_{SCALA_BINARY}:{DELTA_FOR_SPARK[minor]}")
        elif feature == "s3":
            coords.append(f"org.apache.hadoop:hadoop-aws:{hadoop_version()}")
        elif feature == "localfs":
            coords.append(LOCAL_FS_PACKAGE)
        else:
            raise ValueError(f"unknown JVM feature {feature!r} (one of {', '.join(JVM_FEATURES)})")
    return coords


def session_conf(features: Iterable[JvmFeature] = DEFAULT_FEATURES) -> dict[str, str]:
    """The settings that give a new session ``features``: the jars recorded by
    :func:`fetch` as ``spark.jars``, else ``spark.jars.packages`` (``$STS_SPARK_PACKAGES``
    overrides the coordinates); with Delta, its extension and catalog; with ``localfs``
    (once its jar is recorded), :data:`LOCAL_FS_CONF` and the jar on the class path; with
    Delta and the log store built by :func:`build_log_store`, that log store for ``file:``
    (:mod:`spark_ext.delta_log_store`)."""
    override = os.environ.get(PACKAGES_ENV)
    coords = ([c.strip() for c in override.split(",") if c.strip()] if override is not None
              else packages(features))
    if not coords:
        return {}
    jars = recorded_jars(coords)
    conf = {"spark.jars": ",".join(jars)} if jars else {"spark.jars.packages": ",".join(coords)}
    if any(c.startswith("io.delta:") for c in coords):
        conf.update(DELTA_SESSION_CONF)
        if store := log_store_jar(jars):
            conf["spark.jars"] += f",{store.as_uri()}"
            conf[delta_log_store.CONF_KEY] = delta_log_store.CLASS_NAME
    if local_fs := [j for j in jars if _jar_of(LOCAL_FS_PACKAGE, j)]:
        # On the JVMs' own class path: Hadoop loads ``file:``'s class before Spark has
        # added ``spark.jars`` (so only where the jar is already on disk).
        path = _file_path(local_fs[0])
        conf.update(LOCAL_FS_CONF, **{"spark.driver.extraClassPath": path,
                                      "spark.executor.extraClassPath": path})
    return conf


def ivy_jar_name(coordinate: str) -> str:
    """The file name Spark's Ivy gives ``coordinate``'s jar (in ``~/.ivy2.5.2/jars``).

    Example:
        >>> ivy_jar_name(LOCAL_FS_PACKAGE)
        'com.globalmentor_hadoop-bare-naked-local-fs-0.1.0.jar'
    """
    group, artifact, version = coordinate.split(":")
    return f"{group}_{artifact}-{version}.jar"


def _jar_of(coordinate: str, jar: str) -> bool:
    """Whether ``jar`` (a path or URI Ivy resolved) is ``coordinate``'s artifact."""
    return Path(_file_path(jar)).name == ivy_jar_name(coordinate)


def jars_dir() -> Path:
    """Where the records of resolved jars and the jars built here go."""
    root = Path(os.environ.get("STS_CACHE_DIR") or Path.home() / ".cache" / "sts-spark")
    return root / "jvm-packages"


def _record_path(coords: Iterable[str]) -> Path:
    key = hashlib.sha1(",".join(sorted(coords)).encode()).hexdigest()[:16]
    return jars_dir() / f"{key}.txt"


def _log_store_classpath(jars: Iterable[str]) -> list[str] | None:
    """What the log store compiles against: the resolved ``delta-storage`` jar and Spark's
    Hadoop client API (``None`` without Delta among ``jars`` or without that jar)."""
    storage = next((_file_path(j) for j in jars
                    if Path(_file_path(j)).name.startswith("io.delta_delta-storage-")), None)
    try:
        return [storage, str(hadoop_api_jar())] if storage else None
    except FileNotFoundError:  # a Spark without Hadoop's client jar: Delta's own store
        return None


def log_store_jar(jars: Iterable[str]) -> Path | None:
    """The log store built for the recorded ``jars`` (:func:`build_log_store`), if it is."""
    classpath = _log_store_classpath(jars)
    if classpath is None:
        return None
    jar = jars_dir() / delta_log_store.jar_name(classpath)
    return jar if jar.is_file() else None


def build_log_store(features: Iterable[JvmFeature] = DEFAULT_FEATURES) -> Path:
    """Compile Delta's log store for ``file:`` (:mod:`spark_ext.delta_log_store`) against
    the jars :func:`fetch` recorded for ``features``, unless it is built already.

    Raises:
        LogStoreBuildError: nothing recorded with Delta, no ``javac``, or it failed.
    """
    classpath = _log_store_classpath(recorded_jars(packages(features)))
    if classpath is None:
        raise delta_log_store.LogStoreBuildError(
            "no resolved Delta jars recorded (python -m spark_ext.jvm_packages --fetch)")
    return delta_log_store.build(classpath, jars_dir())


def recorded_jars(coords: Iterable[str]) -> list[str]:
    """The jar files :func:`fetch` recorded for ``coords``, if every one still exists
    (else ``[]``: they are resolved again)."""
    try:
        jars = _record_path(coords).read_text(encoding="utf-8").split()
    except OSError:
        return []
    return jars if jars and all(Path(_file_path(j)).is_file() for j in jars) else []


def _file_path(uri: str) -> str:
    """``file:///a/b.jar`` -> ``/a/b.jar`` (plain paths unchanged)."""
    return uri[len("file://"):] if uri.startswith("file://") else uri.removeprefix("file:")


#: What the resolving ``spark-submit`` runs: print the jars Spark resolved (its
#: ``spark.jars``; no SparkContext is started).
_PRINT_JARS = ("from pyspark import SparkConf, SparkContext\n"
               "SparkContext._ensure_initialized()  # the submitting JVM's conf, not a new one\n"
               "print('STS_JARS=' + SparkConf().get('spark.jars', ''))\n")


def fetch(features: Iterable[JvmFeature] = DEFAULT_FEATURES) -> list[str]:
    """Resolve ``features``' packages now (``spark-submit --packages`` over a script that
    prints what Spark resolved) and record the jar files, so later local sessions start
    from them without the network; with Delta, build its log store for ``file:``
    (:func:`build_log_store`; without a JDK's ``javac``, a warning). Returns the
    coordinates.

    Raises:
        RuntimeError: Spark could not resolve them (its last output lines say why).
    """
    features = list(features)
    coords = packages(features)
    with tempfile.TemporaryDirectory(prefix="sts-jvm-") as tmp:
        script = Path(tmp) / "print_jars.py"
        script.write_text(_PRINT_JARS, encoding="utf-8")
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_HOME=str(spark_home()))
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        proc = subprocess.run(
            [str(spark_home() / "bin" / "spark-submit"), "--packages", ",".join(coords),
             str(script)], env=env, capture_output=True, text=True, check=False)
    jars = next((line.removeprefix("STS_JARS=").split(",") for line in proc.stdout.splitlines()
                 if line.startswith("STS_JARS=")), [])
    jars = [j for j in jars if j]
    if proc.returncode != 0 or not jars:
        tail = " | ".join(line.strip() for line in proc.stderr.splitlines()[-5:] if line.strip())
        raise RuntimeError(f"Spark could not resolve {','.join(coords)}: {tail}")
    record = _record_path(coords)
    record.parent.mkdir(parents=True, exist_ok=True)
    staging = record.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text("\n".join(jars) + "\n", encoding="utf-8")
    staging.replace(record)
    if "delta" in features:
        try:
            build_log_store(features)
        except delta_log_store.LogStoreBuildError as e:
            logger.warning("sts: %s; Delta tables on file: then list their whole log at "
                           "each commit (spark_ext.delta_log_store)", e)
    return coords


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_ext.jvm_packages",
                                     description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--with", dest="extra", action="append", default=[],
                        choices=JVM_FEATURES, help="add a feature (s3: hadoop-aws)")
    parser.add_argument("--only", action="append", choices=JVM_FEATURES,
                        help="these features instead of the defaults (kafka, delta, localfs)")
    parser.add_argument("--fetch", action="store_true",
                        help="resolve them into Spark's package cache now")
    parser.add_argument("--log-store", action="store_true",
                        help="print the jar of Delta's log store for file: (built from the "
                             "fetched jars if it is not yet; spark_ext.delta_log_store)")
    args = parser.parse_args(argv)
    features = list(args.only or DEFAULT_FEATURES) + args.extra
    try:
        if args.log_store:
            print(build_log_store(features))
            return 0
        coords = fetch(features) if args.fetch else packages(features)
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        print(f"sts: {' '.join(str(e).split())} (spark_ext.jvm_packages)", file=sys.stderr)
        return 1
    print(",".join(coords))
    return 0


if __name__ == "__main__":
    sys.exit(main())
