"""L0: what flows into the queries. The events stream, one reader per ``source.format``
(:mod:`~spark_ext.sources.events`), the sidecar's results stream, one reader per result
channel (:mod:`~spark_ext.sources.results`, :mod:`~spark_ext.sources.result_files`), and
past events for offline runs (:mod:`~spark_ext.sources.event_tables`,
:mod:`~spark_ext.sources.jsonl_input`). Nothing here imports a layer above it."""
