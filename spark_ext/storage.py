"""Small file operations on any location the pipeline uses (a local folder or an object
store URI): local paths through the file system, everything else through Spark itself,
so they work wherever Spark reaches the storage (its Hadoop settings, a Spark Connect
server) and never need the JVM gateway of a classic session."""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_ext.uris import is_local_uri, local_path


def _hadoop_path(spark: SparkSession, uri: str):
    """``(file system, path)`` of ``uri`` through a classic session's JVM (Hadoop's
    ``FileSystem``, with the session's settings); ``None`` on Spark Connect."""
    from spark_ext.session import is_connect

    if is_connect(spark):
        return None
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def exists(spark: SparkSession, uri: str) -> bool:
    """Whether ``uri`` (a file or a folder) exists: asked of the file system (a local
    one, or Hadoop's in a classic session) where it can be, since Spark's reader logs a
    WARN with a Java stack trace for a missing path; on Spark Connect through a read,
    the client's ERROR log of the expected failure kept off the log."""
    from spark_ext.session import connect_errors_expected

    if is_local_uri(uri):
        return local_path(uri).exists()
    if (found := _hadoop_path(spark, uri)) is not None:
        fs, path = found
        return bool(fs.exists(path))
    try:
        with connect_errors_expected():
            spark.read.format("binaryFile").load(uri).select("path").limit(1).collect()
    except Exception:  # noqa: BLE001 - Spark raises PATH_NOT_FOUND for a missing path
        return False
    return True


def has_files(spark: SparkSession, uri: str) -> bool:
    """Whether folder ``uri`` holds at least one file (at any depth)."""
    if is_local_uri(uri):
        folder = local_path(uri)
        return folder.is_dir() and any(p.is_file() for p in folder.rglob("*"))
    if (found := _hadoop_path(spark, uri)) is not None:
        fs, path = found
        return bool(fs.exists(path) and fs.listFiles(path, True).hasNext())
    try:
        return bool(spark.read.format("binaryFile").option("recursiveFileLookup", "true")
                    .load(uri).select("path").limit(1).collect())
    except Exception:  # noqa: BLE001 - no such folder
        return False


def read_text(spark: SparkSession, uri: str) -> str | None:
    """The text stored at ``uri`` by :func:`write_text` (``None`` when there is none)."""
    if is_local_uri(uri):
        path = local_path(uri)
        return path.read_text(encoding="utf-8").strip() if path.is_file() else None
    if not exists(spark, uri):
        return None
    rows = spark.read.text(uri).collect()
    return "\n".join(r["value"] for r in rows).strip() if rows else None


def write_text(spark: SparkSession, uri: str, text: str) -> None:
    """Store a short ``text`` at ``uri``, replacing what was there: a file for a local
    path (written under a temporary name, then renamed), a one-file text dataset (a
    folder) on an object store."""
    if is_local_uri(uri):
        path = local_path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.tmp")
        staging.write_text(text + "\n", encoding="utf-8")
        staging.replace(path)
        return
    spark.createDataFrame([(text,)], "value STRING").coalesce(1).write.mode("overwrite") \
        .text(uri)


def unreachable(spark: SparkSession, uri: str) -> str | None:
    """Why this Spark cannot use ``uri`` at all (no file system for its scheme), in one
    line; ``None`` when it can (a missing path is fine: it is created when written).

    Example:
        >>> unreachable(None, "/tmp/sts") is None   # local paths need no file system
        True
    """
    if is_local_uri(uri):
        return None
    try:
        if _hadoop_path(spark, uri) is None:  # Spark Connect: ask the server by a read
            spark.read.format("binaryFile").load(uri).select("path").limit(1).collect()
    except Exception as e:  # noqa: BLE001 - most errors are a path not there yet
        text = str(e)
        if "No FileSystem for scheme" in text or "UnsupportedFileSystemException" in text:
            scheme = uri.partition(":")[0]
            return f'this Spark has no file system for "{scheme}://"'
    return None


__all__ = ["exists", "has_files", "read_text", "unreachable", "write_text"]
