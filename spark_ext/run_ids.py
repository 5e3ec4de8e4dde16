"""Run identities: what the Delta transaction ids of a query's writes are named after.

A ``foreachBatch`` write is made idempotent by Delta's app transaction
(``txnAppId`` = the query and table, ``txnVersion`` = the batch id). Batch ids restart at
0 whenever a query's checkpoint starts over (deleted, moved, emptied): with an app id
derived from the checkpoint's path, the writes of the new batches 0, 1, ... would be
skipped as "already committed" and their events answered by the safety net's fallback.
So the app id names a *run* of the checkpoint instead: a random id kept in the
checkpoint (``<checkpoint>/sts-run-id``) while it holds offsets, and a new one whenever
it has none. Restarts from the same checkpoint keep their id (replays are skipped, as
they must be); a reset checkpoint with the tables kept is a new run and writes again.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from pyspark.sql import SparkSession

from spark_ext import storage
from spark_ext.uris import join_uri

logger = logging.getLogger(__name__)

#: Where a query's run id is kept, inside its checkpoint.
RUN_ID_NAME = "sts-run-id"
#: Where the identity of the queries under a checkpoint folder is kept, inside it.
NAMESPACE_NAME = "sts-namespace"


@dataclass(frozen=True)
class QueryRun:
    """One run of a query's checkpoint."""

    id: str
    """Random, kept in the checkpoint while it has offsets."""
    started_ms: int
    """When the run began (epoch ms; 0 for a run kept by an older version)."""


def query_run_id(spark: SparkSession, checkpoint: str) -> str:
    """The run id of the query checkpointed at ``checkpoint``: the one kept there while
    the checkpoint has offsets, else a new one (kept there from now on)."""
    return query_run(spark, checkpoint).id


def query_run(spark: SparkSession, checkpoint: str) -> QueryRun:
    """The run of the query checkpointed at ``checkpoint`` (see :func:`query_run_id`),
    with its start time."""
    return _run_id(spark, checkpoint)[0]


def is_new_checkpoint(spark: SparkSession, checkpoint: str) -> bool:
    """Whether the query at ``checkpoint`` starts from nothing (no offsets yet)."""
    return not storage.has_files(spark, join_uri(checkpoint, "offsets"))


def _run_id(spark: SparkSession, checkpoint: str) -> tuple[QueryRun, bool]:
    marker = join_uri(checkpoint, RUN_ID_NAME)
    kept = (storage.read_text(spark, marker) or "").split()
    if kept and not is_new_checkpoint(spark, checkpoint):
        return QueryRun(kept[0], int(kept[1]) if len(kept) > 1 else 0), False
    run = QueryRun(uuid.uuid4().hex[:16], int(time.time() * 1000))
    if kept:
        logger.warning("Checkpoint %s has no offsets: its batch ids start again at 0, so it "
                       "runs as a new run (%s, was %s); the tables are kept and nothing the "
                       "new batches write is skipped.", checkpoint, run.id, kept[0])
    storage.write_text(spark, marker, f"{run.id} {run.started_ms}")
    return run, True


def checkpoint_namespace_id(spark: SparkSession, checkpoint_dir: str) -> str:
    """The identity of the queries checkpointed under ``checkpoint_dir``: a random id kept
    in ``<checkpoint_dir>/sts-namespace`` from their first start until the folder is
    deleted (a new folder, or the same one deleted, is a new identity).

    Unlike a query's run (:func:`query_run`), it survives a checkpoint without offsets: a
    Real-Time Mode query writes its first offsets only when its first batch ends, so a
    job killed before that has submitted requests from a checkpoint that has none, and
    its restart must name them the same.
    """
    marker = join_uri(checkpoint_dir, NAMESPACE_NAME)
    kept = (storage.read_text(spark, marker) or "").strip()
    if kept:
        return kept
    new = uuid.uuid4().hex[:16]
    storage.write_text(spark, marker, new)
    return new
