"""L2: feature lookup, a stream-static join of the events with a Delta feature table.

With ``features.enabled`` the submit query's events are left-joined on
``features.key`` (e.g. ``customer_id``) with a Delta table of per-key features (e.g.
``tier``, ``open_tickets``) before L1 runs, so ``routing.rules`` can use them::

    features: {enabled: true, table: ./features/customers, key: customer_id}
    routing:
      rules: [{when: "tier = 'enterprise'", priority: high}]

The table is read with ``deltalake`` (no Delta jars on Spark's classpath needed) once,
when the query is built: it is a snapshot of the table at pipeline start (restart the
pipeline to pick up a new version). A table of at most ``max_inline_rows`` rows becomes a
map literal in the plan (no extra Spark job per micro-batch; measured on the demo: the
broadcast join's job added about 0.4 s to each submit micro-batch on one busy core); a
bigger one is broadcast-joined. An event without a
match (or without a key) keeps null features, so a rule on them simply does not hold:
no event is dropped or duplicated by the lookup (keys must be unique in the table).
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING

from spark_ext.config import FeaturesConfig
from spark_ext.exceptions import PipelineConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)


def read_features(config: FeaturesConfig, storage_options: dict[str, str] | None = None
                  ) -> "pa.Table":
    """The feature table's ``key`` and feature columns, checked (``storage_options``:
    delta-rs's object-store settings, ``output.storage_options``).

    Raises:
        PipelineConfigError: No Delta table at ``config.table``, a named column is
            missing, or a key occurs more than once.
    """
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    try:
        table = DeltaTable(config.table, storage_options=storage_options or None) \
            .to_pyarrow_table()
    except Exception as e:  # deltalake raises TableNotFoundError, OSError, ...
        raise PipelineConfigError(f"features.table: no readable Delta table at "
                                  f"{config.table} ({type(e).__name__})") from None
    wanted = config.columns or [c for c in table.column_names if c != config.key]
    if missing := [c for c in (config.key, *wanted) if c not in table.column_names]:
        raise PipelineConfigError(f"features: columns {missing} are not in the feature table "
                                  f"{config.table} ({table.column_names})")
    table = table.select([config.key, *wanted])
    keys = table.column(config.key)
    if pc.count_distinct(keys).as_py() != len(keys) - keys.null_count:
        raise PipelineConfigError(f"features: key {config.key!r} repeats in {config.table}; "
                                  "each key must be unique (the join would duplicate events)")
    return table


def join_features(events: "DataFrame", config: FeaturesConfig, spark: "SparkSession",
                  storage_options: dict[str, str] | None = None) -> "DataFrame":
    """``events`` left-joined with the feature table on ``config.key`` (see the module
    docstring).

    Raises:
        PipelineConfigError: See :func:`read_features`; or ``key`` is not a column of
            the events, or a feature column is already one.
    """
    from pyspark.sql import functions as F

    if config.key not in events.columns:
        raise PipelineConfigError(f"features.key={config.key!r} is not a column of the events "
                                  f"({events.columns}); add it to source.schema")
    table = read_features(config, storage_options)
    features = [c for c in table.column_names if c != config.key]
    if clash := sorted(set(features) & set(events.columns)):
        raise PipelineConfigError(f"features: columns {clash} of {config.table} are already "
                                  "columns of the events; name the others in features.columns")
    static = spark.createDataFrame(table)
    key_type = events.schema[config.key].dataType
    if 0 < table.num_rows <= config.max_inline_rows:
        # A map literal in the plan: no broadcast job per micro-batch.
        types = {f.name: f.dataType for f in static.schema.fields}
        entries = itertools.chain.from_iterable(
            (F.lit(r[config.key]).cast(key_type),
             F.struct(*[F.lit(r[c]).cast(types[c]).alias(c) for c in features]))
            for r in table.to_pylist() if r[config.key] is not None)
        found = F.try_element_at(F.create_map(*entries), F.col(config.key))
        logger.info("Feature lookup: %d rows of %s inlined, keyed on %s.", table.num_rows,
                    config.table, config.key)
        return events.select("*", *[found[c].alias(c) for c in features])
    static = static.withColumn(config.key, F.col(config.key).cast(key_type))
    logger.info("Feature lookup: %d rows of %s joined on %s.", table.num_rows, config.table,
                config.key)
    return events.join(F.broadcast(static), on=config.key, how="left")
