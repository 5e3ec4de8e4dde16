"""A probe's expected failure on Spark Connect (a table not written yet) is kept off the log,
for the probing thread and the probe only (:func:`spark_ext.session.connect_errors_expected`)."""

from __future__ import annotations

import logging
import threading

from spark_ext.session import connect_errors_expected


class _Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_only_the_probing_threads_records_are_dropped_and_only_during_the_probe() -> None:
    client = logging.getLogger("pyspark.sql.connect.logging")
    seen = _Seen()
    client.addHandler(seen)
    filters = list(client.filters)
    try:
        with connect_errors_expected():
            client.error("GRPC Error received: DELTA_MISSING_DELTA_TABLE")  # the probe's
            other = threading.Thread(target=client.error, args=("another thread's error",))
            other.start()
            other.join()
        client.error("after the probe")
    finally:
        client.removeHandler(seen)
    assert seen.messages == ["another thread's error", "after the probe"]
    assert client.filters == filters
