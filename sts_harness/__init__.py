"""Harness around the library, used by ``sts demo``, ``sts validate``, the benchmarks and
the tests; nothing in ``sidecar`` or ``spark_ext`` imports it.

Public names, re-exported from their modules and loaded on first use (so registering the
``sts`` commands stays cheap): :class:`SidecarProcess` (a sidecar child process),
:class:`KafkaBroker` (a local Kafka broker, KRaft, from Apache Kafka's Maven jars),
:class:`EventReplayer` (events into a landing folder on schedule), :func:`read_results`
and :func:`wait_for_results` (the result channel read outside Spark, exactly-once
checked), :func:`run_demo` and :func:`run_validate` (``sts demo``, ``sts validate``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar import lazy_exports

#: Public name -> the module it comes from.
_EXPORTS = {
    "SidecarProcess": "sts_harness.process",
    "KafkaBroker": "sts_harness.kafka_broker",
    "EventReplayer": "sts_harness.replay",
    "read_results": "sts_harness.result_check",
    "wait_for_results": "sts_harness.result_check",
    "run_demo": "sts_harness.demo",
    "run_validate": "sts_harness.validate",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads them
    from sts_harness.demo import run_demo
    from sts_harness.kafka_broker import KafkaBroker
    from sts_harness.process import SidecarProcess
    from sts_harness.replay import EventReplayer
    from sts_harness.result_check import read_results, wait_for_results
    from sts_harness.validate import run_validate
