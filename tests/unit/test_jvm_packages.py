"""The JVM packages a local session gets, and the settings that come with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_ext import delta_log_store, jvm_build, jvm_packages
from spark_ext.jvm_packages import LOCAL_FS_CONF, LOCAL_FS_PACKAGE


def _record(tmp_path: Path, coords: list[str], key: list[str] | None = None) -> list[str]:
    """Record jar files for ``coords`` the way :func:`jvm_packages.fetch` does (as what
    Spark resolved for ``key``, default ``coords``: a dependency's jar is among them)."""
    jars = []
    for coord in coords:
        jar = tmp_path / "ivy" / jvm_packages.ivy_jar_name(coord)
        jar.parent.mkdir(parents=True, exist_ok=True)
        jar.write_bytes(b"")
        jars.append(f"file://{jar}")
    record = jvm_packages._record_path(key or coords)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("\n".join(jars) + "\n", encoding="utf-8")
    return jars


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(jvm_packages.PACKAGES_ENV, raising=False)
    return tmp_path


def test_a_local_session_gets_the_local_file_system_without_shell_commands(cache: Path) -> None:
    coords = jvm_packages.packages(version="4.2.0")
    assert LOCAL_FS_PACKAGE in coords
    jars = _record(cache, jvm_packages.packages())
    conf = jvm_packages.session_conf()
    assert conf["spark.jars"] == ",".join(jars)
    for key, value in LOCAL_FS_CONF.items():
        assert conf[key] == value
    # on the JVMs' class path: Hadoop loads file:'s class before spark.jars are added
    local_fs = str(cache / "ivy" / jvm_packages.ivy_jar_name(LOCAL_FS_PACKAGE))
    assert conf["spark.driver.extraClassPath"] == local_fs
    assert conf["spark.executor.extraClassPath"] == local_fs


def test_unresolved_packages_leave_hadoop_s_own_local_file_system(cache: Path) -> None:
    conf = jvm_packages.session_conf()  # nothing recorded: Spark resolves them at start
    assert LOCAL_FS_PACKAGE in conf["spark.jars.packages"].split(",")
    assert not set(LOCAL_FS_CONF) & set(conf)
    assert "spark.driver.extraClassPath" not in conf


def test_without_the_feature_nothing_changes_file_s_file_system(cache: Path) -> None:
    _record(cache, jvm_packages.packages(["kafka", "delta"]))
    conf = jvm_packages.session_conf(["kafka", "delta"])
    assert not set(LOCAL_FS_CONF) & set(conf)
    assert "spark.driver.extraClassPath" not in conf


def _fake_log_store(cache: Path, jars: list[str]) -> Path:
    """A file where :func:`jvm_packages.build_log_store` would put the jar for ``jars``."""
    classpath = jvm_packages._log_store_classpath(jars)
    assert classpath is not None
    jar = jvm_packages.jars_dir() / delta_log_store.jar_name(classpath)
    jar.parent.mkdir(parents=True, exist_ok=True)
    jar.write_bytes(b"")
    return jar


def test_with_delta_a_built_log_store_is_delta_s_for_file(cache: Path) -> None:
    jars = _record(cache, [*jvm_packages.packages(), "io.delta:delta-storage:4.4.0"],
                   key=jvm_packages.packages())
    assert delta_log_store.CONF_KEY not in jvm_packages.session_conf()  # not built yet

    store = _fake_log_store(cache, jars)
    conf = jvm_packages.session_conf()
    assert conf[delta_log_store.CONF_KEY] == delta_log_store.CLASS_NAME
    assert conf["spark.jars"].split(",") == [*jars, store.as_uri()]  # beside delta-storage
    # Without Delta, nothing of it.
    _record(cache, jvm_packages.packages(["kafka"]))
    assert delta_log_store.CONF_KEY not in jvm_packages.session_conf(["kafka"])


def test_a_changed_source_is_another_jar(cache: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    classpath = ["/ivy/io.delta_delta-storage-4.4.0.jar", "/spark/hadoop-client-api-3.5.0.jar"]
    before = delta_log_store.jar_name(classpath)
    assert before != delta_log_store.jar_name(["/ivy/io.delta_delta-storage-4.3.1.jar",
                                               classpath[1]])
    edited = tmp_path / "LocalListingLogStore.java"
    edited.write_text(delta_log_store.SOURCE.read_text() + "\n// edited\n")
    monkeypatch.setattr(delta_log_store, "SOURCE", edited)
    assert delta_log_store.jar_name(classpath) != before


def test_the_log_store_is_not_built_without_a_compiler_or_delta(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(delta_log_store.LogStoreBuildError, match="no resolved Delta jars"):
        jvm_packages.build_log_store()
    monkeypatch.setattr(jvm_build, "javac", lambda: None)
    with pytest.raises(delta_log_store.LogStoreBuildError, match="no javac"):
        delta_log_store.build(["/x/io.delta_delta-storage-4.4.0.jar"], cache / "out")
    assert not (cache / "out").exists()
    assert jvm_packages.main(["--log-store"]) == 1  # a one-line error, no traceback


def test_a_spark_without_hadoop_s_client_jar_keeps_delta_s_own_log_store(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jars = _record(cache, [*jvm_packages.packages(), "io.delta:delta-storage:4.4.0"],
                   key=jvm_packages.packages())
    _fake_log_store(cache, jars)

    def no_jar(jars: Path | None = None) -> Path:
        raise FileNotFoundError("no hadoop-client-api jar in /spark/jars")

    monkeypatch.setattr(jvm_packages, "hadoop_api_jar", no_jar)
    conf = jvm_packages.session_conf()  # starts as before, without it
    assert delta_log_store.CONF_KEY not in conf
    assert conf["spark.jars"].split(",") == jars
