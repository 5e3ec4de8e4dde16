"""The local Spark Connect server's command line (no server is started here)."""

from __future__ import annotations

from pathlib import Path

from spark_ext.session import LOCAL_JAVA_OPTIONS
from sts_harness.connect_server import SparkConnectServer


def test_the_connect_server_jvm_gets_a_local_sessions_code_cache(tmp_path: Path) -> None:
    """With the quick JIT only and the JVM's default 48 MB code cache, the server's
    compiler filled it within 3 minutes of ``sts demo`` and was disabled ("CodeCache is
    full"): every micro-batch then ran interpreted (the answers micro-batch 1.5-1.6x
    slower than with the cache a local session gets)."""
    command = SparkConnectServer(tmp_path, port=15099).command()
    java_options = command[command.index("--driver-java-options") + 1]
    assert java_options.startswith(LOCAL_JAVA_OPTIONS + " ")
    assert "-XX:ReservedCodeCacheSize=240m" in java_options
