"""The wiring: :class:`~spark_ext.pipeline.sts_pipeline.StsPipeline` (the streaming
queries and the driver's tickers), the offline run (:mod:`~spark_ext.pipeline.offline`),
the driver's ``/metrics`` (:mod:`~spark_ext.pipeline.metrics`) and the ``spark-submit``
entry point (``spark_ext/pipeline/job.py``)."""
