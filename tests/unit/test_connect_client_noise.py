"""The Spark Connect client's known-harmless warning stays off the log; others stay."""

from __future__ import annotations

import logging

import pytest

from spark_ext.session import quiet_connect_client

CLOSED = ('ReleaseExecute failed with exception: <_InactiveRpcError ... details = '
          '"[INVALID_HANDLE.SESSION_CLOSED] The handle 6f59 is invalid. Session was closed.">.')


def test_a_release_after_the_session_closed_is_dropped_and_other_warnings_kept(
        caplog: pytest.LogCaptureFixture) -> None:
    quiet_connect_client()
    quiet_connect_client()  # twice: one filter
    client = logging.getLogger("pyspark.sql.connect.logging")
    assert len(client.filters) == 1
    with caplog.at_level(logging.WARNING, logger="pyspark.sql.connect.logging"):
        client.warning(CLOSED)
        client.warning("ReleaseExecute failed with exception: UNAVAILABLE")
        client.warning("Some other warning")
    assert [r.getMessage() for r in caplog.records] == [
        "ReleaseExecute failed with exception: UNAVAILABLE", "Some other warning"]
