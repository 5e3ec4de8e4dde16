"""A classic local Spark session with Delta and hadoop-aws against the test S3 server, run
as a child process by ``test_deploy_harness.py`` (a classic session gets the JVM packages it
starts with, and the test session's shared ``spark`` has no hadoop-aws).

    python -m tests.process.deploy_s3a_job '{"hadoop_conf": {...}, "base": "s3a://b/p"}'

Prints one JSON line with what it saw; the test asserts on it.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    args = json.loads(argv[0])
    from spark_ext.session import local_session

    spark = local_session("deploy-s3a", jvm_features=("delta", "s3"))
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in args["hadoop_conf"].items():
        hadoop.set(key, value)
    spark.conf.set("spark.databricks.delta.snapshotPartitions", "2")
    base = args["base"].rstrip("/")
    out: dict = {}

    # Idempotent appends: Delta app transactions (txnAppId, txnVersion).
    table = f"{base}/t2"

    def append(version: int, ids: list[int]) -> None:
        (spark.createDataFrame([(i, f"v{i}") for i in ids], "id long, v string")
         .write.format("delta").option("txnAppId", "deploy-app").option("txnVersion", version)
         .mode("append").save(table))

    append(0, [1, 2])
    append(1, [3])
    append(1, [3])  # the same transaction again: Delta skips it
    out["rows_after_txn"] = spark.read.format("delta").load(table).count()
    out["versions"] = sorted(r.version for r in spark.sql(f"DESCRIBE HISTORY delta.`{table}`")
                             .select("version").collect())

    spark.createDataFrame([(3, "V3"), (4, "v4")], "id long, v string") \
        .createOrReplaceTempView("deploy_src")
    spark.sql(f"MERGE INTO delta.`{table}` t USING deploy_src s ON t.id = s.id "
              "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
    out["after_merge"] = sorted([r.id, r.v] for r in spark.read.format("delta").load(table)
                                .collect())

    # A streaming query with its checkpoint on s3a: files -> foreachBatch -> Delta (txn).
    source, sink, checkpoint = f"{base}/in", f"{base}/stream_out", f"{base}/ckpt"

    def to_delta(df, batch_id: int) -> None:
        (df.write.format("delta").option("txnAppId", "deploy-stream")
         .option("txnVersion", batch_id).mode("append").save(sink))

    def run_available_now() -> None:
        query = (spark.readStream.schema("id long").parquet(source).writeStream
                 .foreachBatch(to_delta).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))

    spark.range(5).write.mode("append").parquet(source)
    run_available_now()
    out["stream_rows_first"] = spark.read.format("delta").load(sink).count()
    run_available_now()  # restarted from the checkpoint: nothing new
    out["stream_rows_restart"] = spark.read.format("delta").load(sink).count()
    spark.range(3).write.mode("append").parquet(source)
    run_available_now()
    out["stream_rows_more"] = spark.read.format("delta").load(sink).count()

    # s3:// works too when fs.s3.impl is S3AFileSystem.
    s3_table = base.replace("s3a://", "s3://", 1) + "/t5"
    spark.range(3).write.format("delta").save(s3_table)
    out["s3_scheme_rows"] = spark.read.format("delta").load(s3_table).count()

    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
