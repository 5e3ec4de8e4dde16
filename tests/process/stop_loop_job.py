"""A user's job started and stopped ``N`` times in one session (run by
tests/process/test_inference_api.py in its own process, whose stderr the test reads):
``python stop_loop_job.py <sidecar> <results_dir> <work_dir> <N>``."""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import functions as F

from spark_ext import LlmInference
from spark_ext.session import local_session

TEMPLATE = "You answer questions in one short sentence.\nQuestion: {text}\nAnswer:"


def main(target: str, results_dir: str, work_dir: str, rounds: int) -> int:
    spark = local_session("sts-stop-loop")
    work = Path(work_dir)
    for i in range(rounds):
        llm = LlmInference(spark, key="id", checkpoint_location=str(work / f"chk{i}"),
                           sidecar=target, results_dir=results_dir, fallback_text="Later.")
        events = (spark.readStream.format("rate").option("rowsPerSecond", 20).load()
                  .select(F.col("value").cast("string").alias("id"),
                          F.lit("What is one plus one?").alias("text")))
        queries = llm.start(llm.requests(events, template=TEMPLATE, max_tokens=4),
                            answers_table=str(work / f"answers{i}"))
        # stopped while its micro-batches run (the answers' writes among them)
        queries.answers.awaitTermination(3)
        queries.stop()
        failed = [f"{q.name} ({str(q.exception()).splitlines()[0][:200]})" for q in queries
                  if q.exception() is not None]
        print(f"stop {i}: {'failed ' + ', '.join(failed) if failed else 'clean'}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
