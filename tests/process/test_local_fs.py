"""The local session's ``file:`` file system: Hadoop's own, with file permissions set by
Java instead of a ``chmod`` process per file (``spark_ext.jvm_packages.LOCAL_FS_CONF``)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from spark_ext.jvm_packages import LOCAL_FS_CONF


def _children_cpu_ticks(pid: int) -> int:
    """CPU time (clock ticks) of ``pid``'s finished children: each ``chmod`` Hadoop runs
    adds its own."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[13]) + int(fields[14])  # cutime, cstime


def test_the_local_session_writes_local_files_without_a_process_per_file(
        spark, tmp_path: Path) -> None:
    jvm = spark.sparkContext._jvm
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), hadoop)
    assert fs.getClass().getName() == LOCAL_FS_CONF["spark.hadoop.fs.file.impl"]

    # 200 files made through it start no process (Hadoop's own: a chmod for each).
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    before = _children_cpu_ticks(pid)
    for i in range(200):
        out = fs.create(jvm.org.apache.hadoop.fs.Path((tmp_path / "made" / f"{i}").as_uri()))
        out.write(b"x")
        out.close()
    assert _children_cpu_ticks(pid) - before < 10  # Hadoop's own: ~90 (a chmod ~4.7 ms)
    # With the permissions Hadoop's would give them (its umask applied), checksums kept.
    umask = int(hadoop.get("fs.permissions.umask-mode", "022"), 8)
    assert stat.S_IMODE((tmp_path / "made" / "0").stat().st_mode) == 0o666 & ~umask
    assert (tmp_path / "made" / ".0.crc").exists()

    # Tables and streaming checkpoints on local disk work as before.
    table = str(tmp_path / "table")
    spark.range(10).repartition(2).write.format("delta").save(table)
    spark.range(10, 15).write.format("delta").mode("append").save(table)
    assert spark.read.format("delta").load(table).count() == 15
    query = (spark.readStream.format("delta").load(table).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.lastProgress["numInputRows"] == 15
    # A missing file is Hadoop's FileNotFoundException, which Delta and Spark rely on.
    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        fs.getFileStatus(jvm.org.apache.hadoop.fs.Path((tmp_path / "nothing").as_uri()))
