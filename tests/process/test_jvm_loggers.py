"""The JVM's logging of a local session: sts-spark's log profile, and loggers turned off
for a block (a Real-Time Mode query's stop) that follow their parent again after it."""

from __future__ import annotations

import os

from spark_ext.session import LOG_PROFILE, REALTIME_STOP_LOGGERS, jvm_loggers_off


def test_the_sessions_jvm_logs_by_sts_sparks_profile(spark) -> None:
    jvm = spark.sparkContext._jvm
    named = jvm.System.getProperty("log4j2.configurationFile")
    if os.environ.get("SPARK_CONF_DIR"):  # a profile of the user's own may win there
        return
    assert named == LOG_PROFILE.as_uri()
    assert str(jvm.org.apache.logging.log4j.LogManager.getLogger(
        "org.apache.hadoop.util.NativeCodeLoader").getLevel()) == "ERROR"


def test_loggers_turned_off_for_a_block_follow_their_parent_again_after_it(spark) -> None:
    manager = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager

    def levels() -> set[str]:
        return {str(manager.getLogger(name).getLevel()) for name in REALTIME_STOP_LOGGERS}

    before = levels()
    with jvm_loggers_off(spark, REALTIME_STOP_LOGGERS):
        assert levels() == {"OFF"}
    assert levels() == before
    spark.sparkContext.setLogLevel("WARN")  # the root's level reaches them again
    try:
        assert levels() == {"WARN"}
    finally:
        spark.sparkContext.setLogLevel("ERROR")
