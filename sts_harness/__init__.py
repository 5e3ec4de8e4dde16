"""Harness around the library, used by ``sts demo``, the benchmarks and the tests;
nothing in ``sidecar`` or ``spark_ext`` imports it.

Modules: :mod:`sts_harness.demo` (the ``sts demo`` driver and its sample tickets),
:mod:`sts_harness.process` (a sidecar child process), :mod:`sts_harness.replay`
(events into a landing folder on schedule), :mod:`sts_harness.result_check`
(read the result channel, check exactly-once) and :mod:`sts_harness.stats`
(percentiles). The package itself imports none of them, so registering the
``sts demo`` command stays cheap.
"""

__all__: list[str] = []
