"""What finding a Delta table's newest commits costs as its log grows, per log store.

Before each write, Delta on Spark lists the table's ``_delta_log`` from its last
checkpoint on (``LogStore.listFrom``). This lays out logs of ``--commits`` commits as a
streaming table's look on a local disk (``<v>.json`` and Hadoop's hidden ``.<v>.json.crc``
per commit, a checkpoint every 100 commits with its own ``.crc``, ``_last_checkpoint``;
empty files: only the names and the stat calls matter to a listing) and times that
listing from the last checkpoint, consumed whole in the JVM, with Delta's own store for ``file:``
(``io.delta.storage.HDFSLogStore``) and sts-spark's
(:mod:`spark_ext.delta_log_store`), in one Spark session, ``--rounds`` times each.

    python -m benchmarks.delta_log_listing
    python -m benchmarks.delta_log_listing --commits 500,4000 --rounds 20 --out /tmp/ll.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.cli_args import positive_ints
from benchmarks.cpu_accounting import machine_info

DEFAULT_OUT = (Path(__file__).resolve().parent / "results" / "delta_log_listing"
               / "delta_log_listing.json")
CHECKPOINT_INTERVAL = 100


def lay_out_log(log: Path, commits: int) -> int:
    """Empty files named as a log of ``commits`` commits; the last checkpoint's version."""
    log.mkdir(parents=True)
    last_checkpoint = 0
    for version in range(commits):
        names = [f"{version:020d}.json"]
        if version and version % CHECKPOINT_INTERVAL == 0:
            names.append(f"{version:020d}.checkpoint.parquet")
            last_checkpoint = version
        for name in names:
            (log / name).touch()
            (log / f".{name}.crc").touch()
    (log / "_last_checkpoint").write_text(json.dumps({"version": last_checkpoint}))
    return last_checkpoint


def _listing_ms(jvm, store, path, conf, rounds: int) -> tuple[list[float], int]:
    """ms per whole listing of ``path`` by ``store``, consumed in the JVM (one call from
    Python: ``Iterators.size`` of Spark's Guava), and how many files it gave."""
    size = jvm.org.sparkproject.guava.collect.Iterators.size
    took, count = [], 0
    for _ in range(rounds):
        start = time.perf_counter()
        count = size(store.listFrom(path, conf))
        took.append((time.perf_counter() - start) * 1000)
    return took, count


def run(commit_counts: list[int], rounds: int) -> dict:
    """Per log length, the listing's P50 and mean per store (the first round not counted)."""
    from spark_ext import delta_log_store
    from spark_ext.session import local_session

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = local_session("sts-delta-log-listing")
    jvm = spark.sparkContext._jvm
    if spark.conf.get(delta_log_store.CONF_KEY, None) != delta_log_store.CLASS_NAME:
        spark.stop()
        raise SystemExit("the session has no sts-spark log store: run "
                         "python -m spark_ext.jvm_packages --fetch first")
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    stores = {"delta-hdfs-log-store": jvm.io.delta.storage.HDFSLogStore(conf),
              "sts-local-listing": jvm.io.stsspark.delta.LocalListingLogStore(conf)}
    work = Path(tempfile.mkdtemp(prefix="sts-log-listing-"))
    out = []
    try:
        for commits in commit_counts:
            log = work / f"{commits}" / "_delta_log"
            checkpoint = lay_out_log(log, commits)
            path = jvm.org.apache.hadoop.fs.Path((log / f"{checkpoint:020d}").as_uri())
            row: dict = {"commits": commits, "entries": sum(1 for _ in log.iterdir()),
                         "from_version": checkpoint}
            for name, store in stores.items():
                took, count = _listing_ms(jvm, store, path, conf, rounds + 1)
                took = took[1:]
                row[name] = {"p50_ms": round(statistics.median(took), 2),
                             "mean_ms": round(statistics.fmean(took), 2), "files": count}
            out.append(row)
            print(f"{commits:>6} commits ({row['entries']} entries): Delta's "
                  f"{row['delta-hdfs-log-store']['p50_ms']:8.2f} ms, sts-spark's "
                  f"{row['sts-local-listing']['p50_ms']:6.2f} ms (P50 of {rounds}; "
                  f"{count} files from version {checkpoint})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    return {"rounds": rounds, "machine": machine_info(), "by_commits": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.delta_log_listing",
                                description=__doc__.splitlines()[0])
    p.add_argument("--commits", default="400,1000,2000,3600,7200",
                   help="log lengths, comma-separated (3,600: an hour at a commit a second)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    result = run(positive_ints(p, "--commits", args.commits), args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
