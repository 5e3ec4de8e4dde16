"""What one micro-batch's append of answers costs with Delta on Spark, per table setting.

The ``spark`` writer appends each answers micro-batch to ``answers``: 150 answer rows (the
table's columns, 200 events/s for ~0.75 s) as one file of one hour partition, with the
table properties the writer creates tables with. Per variant, ``--appends`` appends to a
fresh table one after the other; the first ``--warm-up`` are not counted (the first
appends of a table compile code and compact its partition once). The variants:

- ``delta-defaults``: Delta's file statistics (the first 32 columns) and version checksum;
- ``stats-time-columns``: statistics on the table's time columns only
  (``delta.dataSkippingStatsColumns``, what the writer sets);
- ``no-checksum``: no ``<version>.crc`` (``spark.databricks.delta.writeChecksumFile.enabled``);
- ``writer``: both, as the writer's tables and the answers query have them;
- ``no-stats``: no statistics at all (for reference: the MERGE could no longer skip files).

The variants run in turn, ``--rounds`` times, in one Spark session; reported per variant:
the P50 and mean append time in ms over its rounds.

    python -m benchmarks.delta_append
    python -m benchmarks.delta_append --appends 30 --rounds 1 --out /tmp/delta-append.json
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

from benchmarks.cpu_accounting import machine_info, reference_cpu_ms

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "delta_append" / "delta_append.json"
ROWS = 150

#: Variant -> (statistics on the time columns only, no version checksum, other session
#: settings).
VARIANTS: dict[str, tuple[bool, bool, dict[str, str]]] = {
    "delta-defaults": (False, False, {}),
    "stats-time-columns": (True, False, {}),
    "no-checksum": (False, True, {}),
    "writer": (True, True, {}),
    "no-stats": (False, False, {"spark.databricks.delta.stats.collect": "false"}),
}


def _resolve(variant: str) -> tuple[dict[str, str], dict[str, str]]:
    """A variant's session settings and table properties, with the writer's values."""
    from spark_ext.l4.answers import answer_schema
    from spark_ext.l4.writers.spark import QUERY_CONFS, STATS_PROPERTY, stats_columns

    time_columns_only, no_checksum, other = VARIANTS[variant]
    confs = {**(QUERY_CONFS if no_checksum else {}), **other}
    columns = answer_schema(("event_id",)).names
    props = {STATS_PROPERTY: stats_columns("answers", columns)} if time_columns_only else {}
    return confs, props


def _answer_rows(spark):
    """:data:`ROWS` rows of the ``answers`` columns: ids, texts and times as the pipeline
    writes them, one hour partition."""
    from pyspark.sql import functions as F

    from spark_ext.l4.answers import PARTITION, answer_schema
    from spark_ext.schemas import spark_schema

    columns = []
    for f in spark_schema(answer_schema(("event_id",))).fields:
        kind = f.dataType.simpleString()
        if f.name == PARTITION:
            value = F.lit("2026-12-05T13")
        elif kind == "string":
            value = F.concat(F.lit(f"{f.name}-"), F.col("id").cast("string"), F.lit("y" * 40))
        elif kind == "bigint":
            value = F.lit(1_796_000_000_000) + F.col("id")
        elif kind == "boolean":
            value = F.col("id") % 2 == 0
        else:
            value = F.lit(None).cast(kind)
        columns.append(value.alias(f.name))
    rows = spark.range(ROWS).select(*columns).cache()
    rows.count()
    return rows


def _append_ms(spark, rows, where: Path, confs: dict[str, str], props: dict[str, str],
               appends: int, warm_up: int) -> list[float]:
    """Append ``rows`` ``appends`` times to a new table at ``where``; ms per counted one."""
    from spark_ext.l4.answers import PARTITION
    from spark_ext.l4.writers.spark import TABLE_PROPERTIES

    shutil.rmtree(where, ignore_errors=True)
    for key, value in confs.items():
        spark.conf.set(key, value)
    took = []
    try:
        for i in range(appends):
            writer = (rows.coalesce(1).write.format("delta").mode("append")
                      .option("userMetadata", f"bench-{i}").partitionBy(PARTITION))
            for key, value in {**TABLE_PROPERTIES, **props}.items():
                writer = writer.option(key, value)
            start = time.perf_counter()
            writer.save(str(where))
            took.append((time.perf_counter() - start) * 1000)
    finally:
        for key in confs:
            spark.conf.unset(key)
    return took[warm_up:]


def run(appends: int, warm_up: int, rounds: int, variants: list[str]) -> dict:
    """Every variant in turn, ``rounds`` times; the figures per variant."""
    from spark_ext.session import local_session

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = local_session("sts-delta-append")
    rows = _answer_rows(spark)
    by_variant: dict[str, list[float]] = {v: [] for v in variants}
    work = Path(tempfile.mkdtemp(prefix="sts-delta-append-"))
    try:
        for _ in range(rounds):
            for variant in variants:
                confs, props = _resolve(variant)
                by_variant[variant] += _append_ms(spark, rows, work / variant, confs, props,
                                                  appends, warm_up)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    return {v: {"n": len(ms), "p50_ms": round(statistics.median(ms), 1),
                "mean_ms": round(statistics.fmean(ms), 1), "max_ms": round(max(ms), 1)}
            for v, ms in by_variant.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.delta_append",
                                description=__doc__.splitlines()[0])
    p.add_argument("--appends", type=int, default=40, help="appends per variant and round")
    p.add_argument("--warm-up", type=int, default=10, help="first appends not counted")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if unknown := [v for v in variants if v not in VARIANTS]:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if not 0 <= args.warm_up < args.appends:
        p.error("--warm-up must be >= 0 and below --appends")
    reference_ms = reference_cpu_ms()
    results = run(args.appends, args.warm_up, args.rounds, variants)
    out = {"kind": "delta_append", "rows": ROWS, "appends": args.appends,
           "warm_up": args.warm_up, "rounds": args.rounds, "machine": machine_info(),
           "reference_cpu_ms": reference_ms, "variants": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'variant':<20}{'n':>5}{'p50 ms':>9}{'mean ms':>9}{'max ms':>9}")
    for variant, r in results.items():
        print(f"{variant:<20}{r['n']:>5}{r['p50_ms']:>9.0f}{r['mean_ms']:>9.0f}"
              f"{r['max_ms']:>9.0f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
