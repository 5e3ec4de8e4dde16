"""The hand-off from L2 to the sidecar (L3): fire-and-forget ``SubmitBatch`` calls from
``mapInArrow`` (:mod:`~spark_ext.submit.submission`) to the sidecar of the task's GPU,
started lazily when configured (:mod:`~spark_ext.submit.sidecar_launcher`)."""
