"""The JVM packages a local session gets, and the settings that come with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_ext import jvm_packages
from spark_ext.jvm_packages import LOCAL_FS_CONF, LOCAL_FS_PACKAGE


def _record(tmp_path: Path, coords: list[str]) -> list[str]:
    """Record jar files for ``coords`` the way :func:`jvm_packages.fetch` does."""
    jars = []
    for coord in coords:
        jar = tmp_path / "ivy" / jvm_packages.ivy_jar_name(coord)
        jar.parent.mkdir(parents=True, exist_ok=True)
        jar.write_bytes(b"")
        jars.append(f"file://{jar}")
    record = jvm_packages._record_path(coords)
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
