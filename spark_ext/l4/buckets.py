"""The ledger's buckets (:mod:`spark_ext.l4.ledger`): how many, and which key values.

The answers query groups its candidates by a bucket of ``request_id`` and Spark calls
the ledger once per bucket and micro-batch. Each call has a fixed cost (the pandas
frames in and out, the state's three Arrow blobs, the flush check) that the rows do not
change, so the buckets are as few as the tasks that run them: **one per shuffle
partition** of the answers query (its task slots, at most :data:`MAX_BUCKETS`).

Spark sends bucket ``b`` to partition ``pmod(hash(b), partitions)`` (Murmur3, seed 42:
``HashPartitioning``), and the small integers 0, 1, ... do not spread: 0 and 1 both
land on partition 1 of 2. So each bucket's key is the smallest integer that lands on
*its* partition (:func:`bucket_keys`), computed here with Spark's own hash
(:func:`spark_int_hash`), and every task runs exactly one ledger call.

A checkpoint keeps its buckets (the state is stored per key): a new one writes its
keys into the checkpoint (:data:`KEYS_FILE`); one begun before this file existed has
the eight buckets 0-7 (:data:`LEGACY_KEYS`) and keeps them.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from spark_ext import storage
from spark_ext.uris import join_uri

#: Most buckets (and shuffle partitions) of the answers query.
MAX_BUCKETS = 8
#: The bucket keys of a checkpoint begun before :data:`KEYS_FILE` was kept.
LEGACY_KEYS: tuple[int, ...] = tuple(range(8))
#: Where a checkpoint keeps its bucket keys (comma-separated), next to its run id.
KEYS_FILE = "sts-ledger-buckets"

_SEED = 42
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def spark_int_hash(value: int) -> int:
    """Spark SQL's ``hash()`` of an ``INT`` (Murmur3 x86 32-bit, seed 42), signed.

    Example:
        >>> [spark_int_hash(v) % 2 for v in range(8)]   # Spark: pmod(hash(v), 2)
        [1, 1, 0, 1, 0, 0, 1, 1]
        >>> [spark_int_hash(v) % 8 for v in range(8)]
        [7, 3, 6, 3, 6, 2, 1, 3]
    """
    k1 = (value & _MASK) * _C1 & _MASK
    k1 = _rotl(k1, 15) * _C2 & _MASK
    h1 = _rotl(_SEED ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def bucket_keys(partitions: int) -> tuple[int, ...]:
    """One bucket key per shuffle partition: key ``i`` is the smallest non-negative
    integer Spark's hash partitioning sends to partition ``i``.

    Example:
        >>> bucket_keys(1), bucket_keys(2), bucket_keys(4)
        ((0,), (2, 0), (12, 6, 2, 0))
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1 (got {partitions})")
    keys: dict[int, int] = {}
    value = 0
    while len(keys) < partitions:
        keys.setdefault(spark_int_hash(value) % partitions, value)
        value += 1
    return tuple(keys[p] for p in range(partitions))


def checkpoint_bucket_keys(spark: SparkSession, checkpoint: str, *, partitions: int,
                           new_run: bool) -> tuple[int, ...]:
    """The bucket keys of the answers query checkpointed at ``checkpoint``: those it
    keeps, :data:`LEGACY_KEYS` for a checkpoint with state that keeps none, and for a
    new run (``new_run``: no offsets yet) ``bucket_keys(partitions)``, kept there from
    now on."""
    marker = join_uri(checkpoint, KEYS_FILE)
    if not new_run:
        kept = (storage.read_text(spark, marker) or "").strip()
        return tuple(int(k) for k in kept.split(",")) if kept else LEGACY_KEYS
    keys = bucket_keys(partitions)
    storage.write_text(spark, marker, ",".join(map(str, keys)))
    return keys
