"""A local session's JVM gets sts-spark's log profile unless the user has one."""

from __future__ import annotations

from pathlib import Path

from spark_ext.session import LOG_PROFILE, log_profile_option


def test_the_profile_ships_with_the_package_and_quiets_hadoops_native_library_note() -> None:
    text = LOG_PROFILE.read_text(encoding="utf-8")
    assert "org.apache.hadoop.util.NativeCodeLoader" in text
    assert log_profile_option("", {"SPARK_CONF_DIR": "/nonexistent"}) == \
        f"-Dlog4j2.configurationFile={LOG_PROFILE.as_uri()}"


def test_a_profile_in_sparks_conf_folder_wins(tmp_path: Path) -> None:
    (tmp_path / "log4j2.properties").write_text("rootLogger.level = info\n", encoding="utf-8")
    assert log_profile_option("", {"SPARK_CONF_DIR": str(tmp_path)}) == ""
    assert log_profile_option("", {"SPARK_HOME": str(tmp_path.parent),
                                   "SPARK_CONF_DIR": str(tmp_path)}) == ""
    home = tmp_path / "home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "log4j2.xml").write_text("<Configuration/>", encoding="utf-8")
    assert log_profile_option("", {"SPARK_HOME": str(home)}) == ""


def test_a_profile_named_on_the_command_line_wins(tmp_path: Path) -> None:
    env = {"SPARK_CONF_DIR": str(tmp_path)}
    assert log_profile_option("-Dlog4j2.configurationFile=/etc/mine.xml", env) == ""
    assert log_profile_option("", {**env, "SPARK_SUBMIT_OPTS":
                                   "-Dlog4j.configurationFile=/etc/mine.xml"}) == ""
    assert log_profile_option("", {**env, "JAVA_TOOL_OPTIONS":
                                   "-Dlog4j2.configurationFile=x"}) == ""


def test_a_folder_with_a_space_is_named_as_a_uri(tmp_path: Path, monkeypatch) -> None:
    import spark_ext.session as session
    profile = tmp_path / "with space" / "log4j2.properties"
    monkeypatch.setattr(session, "LOG_PROFILE", profile)
    option = log_profile_option("", {"SPARK_CONF_DIR": str(tmp_path)})
    assert " " not in option and option.endswith("with%20space/log4j2.properties")
