"""L0: what flows into the queries. The events stream, one reader per ``source.format``
(:mod:`~spark_ext.sources.events`), the sources the result channels are read with
(:mod:`~spark_ext.sources.result_files`, the Kafka topics in
:mod:`~spark_ext.sources.kafka`; each channel's Spark side is in
:mod:`spark_ext.l4.channels`), and
past events for offline runs (:mod:`~spark_ext.sources.event_tables`,
:mod:`~spark_ext.sources.jsonl_input`). Nothing here imports a layer above it."""
