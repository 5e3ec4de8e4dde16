"""The ledger's bucket keys (:mod:`spark_ext.l4.buckets`) on real Spark: its hash is
Spark's, and a hash exchange on the keys (what ``applyInPandasWithState`` puts before
the ledger) gives every partition exactly one bucket."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from spark_ext.l4.buckets import bucket_keys, spark_int_hash

pytestmark = pytest.mark.timeout(300)


def test_the_hash_is_the_one_spark_computes(spark) -> None:
    values = [-1, 0, 1, 2, 7, 12, 123456789]
    rows = spark.createDataFrame([(v,) for v in values], "v INT") \
        .select("v", F.hash("v").alias("h")).collect()
    assert {r["v"]: r["h"] for r in rows} == {v: spark_int_hash(v) for v in values}


@pytest.mark.parametrize("partitions", [2, 4, 8])
def test_a_hash_exchange_on_the_keys_gives_each_partition_one_bucket(
        spark, partitions: int) -> None:
    keys = bucket_keys(partitions)
    placed = (spark.createDataFrame([(k,) for k in keys], "_bucket INT")
              .repartition(partitions, "_bucket")
              .select("_bucket", F.spark_partition_id().alias("partition")).collect())
    assert sorted((r["partition"], r["_bucket"]) for r in placed) == list(enumerate(keys))
    # the first integers, as the ledger had them: several buckets on one partition
    first = (spark.createDataFrame([(k,) for k in range(partitions)], "_bucket INT")
             .repartition(partitions, "_bucket")
             .select(F.spark_partition_id().alias("partition")).distinct().count())
    assert first < partitions
