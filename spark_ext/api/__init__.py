"""The library a user's own Spark query imports (re-exported by :mod:`spark_ext`):
:class:`~spark_ext.api.inference.LlmInference` and what it returns. It composes the
layers below it (L1/L2 request columns, the submission, L4's ledger and writers) and is
what :class:`~spark_ext.StsPipeline` is built on."""
