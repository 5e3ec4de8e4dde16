"""Delta's log store for ``file:`` in a local session (``spark_ext.delta_log_store``): the
one Delta uses there, listing what Delta's own lists, file for file."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from spark_ext import delta_log_store, jvm_packages
from tests.utils import require_tool


@pytest.fixture(autouse=True)
def _jdk() -> None:
    """The log store is compiled with the JDK's javac (skipped without it; fails under CI)."""
    require_tool("javac", "a Java 17 JDK, Debian's openjdk-17-jdk-headless")


def _table_with_a_checkpoint(spark, path: Path) -> None:
    """Twelve commits, a log checkpoint at version 5 and 10, Hadoop's .crc beside each."""
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta "
              "TBLPROPERTIES ('delta.checkpointInterval' = '5')")
    for i in range(11):
        spark.range(i, i + 1).write.format("delta").mode("append").save(str(path))


def _stores(spark, table: Path):
    """(Delta's store for the table as the session configured it, Delta's own
    ``HDFSLogStore``, the Hadoop configuration, the log's ``Path`` class)."""
    jvm = spark.sparkContext._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(table))
    hadoop_path = jvm.org.apache.hadoop.fs.Path
    delegate = log.store().getDelegate(hadoop_path((table / "_delta_log" / "x").as_uri()))
    conf = log.newDeltaHadoopConf()
    return delegate.logStoreImpl(), jvm.io.delta.storage.HDFSLogStore(conf), conf, hadoop_path


def _listed(store, path, conf) -> list[tuple[str, int, bool, int]]:
    return [(s.getPath().toString(), s.getLen(), s.isDirectory(), s.getModificationTime())
            for s in store.listFrom(path, conf)]


def test_delta_on_file_uses_the_log_store_that_lists_names_first(spark, tmp_path: Path) -> None:
    assert spark.conf.get(delta_log_store.CONF_KEY) == delta_log_store.CLASS_NAME
    assert jvm_packages.log_store_jar(jvm_packages.recorded_jars(jvm_packages.packages()))
    table = tmp_path / "t"
    spark.range(3).write.format("delta").save(str(table))
    ours, _, _, _ = _stores(spark, table)
    assert ours.getClass().getName() == delta_log_store.CLASS_NAME


def test_it_lists_what_delta_s_own_log_store_lists(spark, tmp_path: Path) -> None:
    table = tmp_path / "t"
    _table_with_a_checkpoint(spark, table)
    log_dir = table / "_delta_log"
    names = {p.name for p in log_dir.iterdir()}
    assert {"00000000000000000010.checkpoint.parquet", "_last_checkpoint",
            ".00000000000000000003.json.crc"} <= names  # a checkpoint, Hadoop's checksums
    ours, delta_s, conf, hadoop_path = _stores(spark, table)
    assert ours.getClass().getName() == delta_log_store.CLASS_NAME
    for start in ("00000000000000000000", "00000000000000000005", "00000000000000000010",
                  "00000000000000000011", "00000000000000000099"):
        path = hadoop_path((log_dir / start).as_uri())
        listed = _listed(ours, path, conf)
        assert listed == _listed(delta_s, path, conf), start
    # From 10 on: the checkpoint, its commits, the log's own files; no hidden checksum.
    from_ten = [Path(p).name for p, *_ in _listed(ours, hadoop_path(
        (log_dir / "00000000000000000010").as_uri()), conf)]
    assert from_ten[0] == "00000000000000000010.checkpoint.parquet"
    assert "00000000000000000011.json" in from_ten and "_last_checkpoint" in from_ten
    assert not any(n.startswith(".") for n in from_ten)
    # The table reads back whole through it (from the checkpoint, then the commits).
    assert spark.read.format("delta").load(str(table)).count() == 11
    assert spark.read.format("delta").option("versionAsOf", 4).load(str(table)).count() == 4


def test_a_file_removed_while_listed_is_left_out_and_a_missing_log_is_not_found(
        spark, tmp_path: Path) -> None:
    table = tmp_path / "t"
    _table_with_a_checkpoint(spark, table)
    log_dir = table / "_delta_log"
    ours, delta_s, conf, hadoop_path = _stores(spark, table)
    listing = ours.listFrom(hadoop_path((log_dir / "00000000000000000006").as_uri()), conf)
    first = listing.next()  # the rest are stat'ed as they are consumed
    (log_dir / "00000000000000000008.json").unlink()  # as the log's cleanup would
    rest = [s.getPath().getName() for s in listing]
    assert first.getPath().getName().startswith("00000000000000000006.")  # .crc, .json
    assert "00000000000000000007.json" in rest and "00000000000000000008.json" not in rest

    missing = hadoop_path((tmp_path / "none" / "_delta_log" / "00000000000000000000").as_uri())
    for store in (ours, delta_s):  # Delta takes FileNotFoundException for "no table yet"
        with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
            store.listFrom(missing, conf)


def test_it_compiles_from_its_source_into_a_jar_once(spark, tmp_path: Path) -> None:
    classpath = jvm_packages._log_store_classpath(
        jvm_packages.recorded_jars(jvm_packages.packages()))
    assert classpath is not None
    jar = delta_log_store.build(classpath, tmp_path)
    assert "io/stsspark/delta/LocalListingLogStore.class" in zipfile.ZipFile(jar).namelist()
    built = jar.stat().st_mtime_ns
    assert delta_log_store.build(classpath, tmp_path) == jar  # there already: kept
    assert jar.stat().st_mtime_ns == built
    # Without Delta's jar to compile against: javac's first line, nothing left behind.
    with pytest.raises(delta_log_store.LogStoreBuildError, match="javac failed .*io.delta"):
        delta_log_store.build(classpath[1:], tmp_path / "other")
    assert not (tmp_path / "other").exists()
