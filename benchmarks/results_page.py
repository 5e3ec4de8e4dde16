"""The tables of ``benchmarks/RESULTS.md``, generated from the results' JSON.

Each table on the page sits between ``<!-- table: NAME -->`` and ``<!-- /table -->``.
:data:`TABLES` declares, per name, the JSON files under ``benchmarks/results/`` it reads
and the function that turns them into rows; the files are read by their fields, so a
re-run of the same benchmark into the same path refreshes its table. Only what is
between the markers is rewritten; the prose around them is left alone.

    python -m benchmarks.results_page            # rewrite the tables from the JSON
    python -m benchmarks.results_page --check    # exit 1, naming each stale table
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAGE = HERE / "RESULTS.md"
RESULTS = HERE / "results"
#: A table's block on the page: its name, then what the script last wrote there.
BLOCK = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.DOTALL)
#: How the schemes of ``sts bench`` are named on the page.
SCHEMES = {"engine": "engine alone", "sts": "`sts` (files)", "sts-kafka": "`sts-kafka`",
           "sts-kafka-rtm": "`sts-kafka-rtm`", "baseline-concurrent": "concurrent `foreachBatch`",
           "baseline-sync": "blocking `foreachBatch`"}
PRIORITIES = ("high", "normal", "low")


@dataclass
class Table:
    """A Markdown table: ``align`` holds one ``l`` or ``r`` per column; ``notes`` are
    lines printed under it (inside the markers, so they are regenerated too)."""

    header: list[str]
    align: str
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        """The table as Markdown, then its notes, each after a blank line.

        Example:
            >>> print(Table(["a", "b"], "lr", [["x", "1"]], ["A note."]).markdown())
            | a | b |
            | --- | ---: |
            | x | 1 |
            <BLANKLINE>
            A note.
        """
        lines = ["| " + " | ".join(self.header) + " |",
                 "| " + " | ".join("---:" if a == "r" else "---" for a in self.align) + " |"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        for note in self.notes:
            lines += ["", note]
        return "\n".join(lines)


Doc = tuple[str, dict]  # (the file's path under results/, without ".json"; its content)


@dataclass(frozen=True)
class Source:
    """Where a table's figures come from: JSON files under ``benchmarks/results/`` and
    the function that makes the table of them (given in the same order)."""

    paths: tuple[str, ...]
    build: Callable[[list[Doc]], Table]


# Formatting ---------------------------------------------------------------------------

def num(value: float | None, digits: int = 0) -> str:
    """``1,234`` (or ``-`` for a missing value)."""
    return "-" if value is None else f"{value:,.{digits}f}"


def pct(share: float | None, digits: int = 1) -> str:
    """A share as a percentage: ``0.9306`` -> ``93.1 %``."""
    return "-" if share is None else f"{share * 100:.{digits}f} %"


def times(value: float | None, base: float | None, digits: int = 3) -> str:
    """``value`` as a multiple of ``base``: ``0.952x``."""
    return "-" if value is None or not base else f"{value / base:.{digits}f}x"


def of(pair: Sequence[int]) -> str:
    """An ``[on time, total]`` pair: ``119 / 1,010``."""
    return f"{pair[0]:,} / {pair[1]:,}"


def share(pair: Sequence[int]) -> float | None:
    """The share an ``[on time, total]`` pair gives."""
    return pair[0] / pair[1] if pair[1] else None


def pcts(shares: Sequence[float | None]) -> str:
    """Several shares, one unit: ``72.3 / 52.7 / 57.9 %``."""
    return " / ".join("-" if v is None else f"{v * 100:.1f}" for v in shares) + " %"


# Reading the documents ----------------------------------------------------------------

def by_rate(doc: dict) -> dict[float, dict[str, dict]]:
    """A ``sts bench`` document's runs by offered rate, then by scheme."""
    found: dict[float, dict[str, dict]] = {}
    for run in doc["runs"]:
        found.setdefault(run["offered_rate"], {})[run["scheme"]] = run
    return found


def hop(run: dict, name: str, stat: str = "p50") -> float | None:
    """A per-hop latency of an answer (``hops_ms``), ms; ``None`` where not measured."""
    return ((run.get("hops_ms") or {}).get(name) or {}).get(stat)


def ms(value: float | None) -> str:
    """Milliseconds: ``1,259 ms`` (or ``-``)."""
    return "-" if value is None else f"{num(value)} ms"


def both(a: float | None, b: float | None, digits: int = 0) -> str:
    """Two figures in ms (the Kafka and the files path, P50 and P99): ``363 / 295 ms``."""
    return f"{num(a, digits)} / {num(b, digits)} ms"


# The tables ---------------------------------------------------------------------------

def goodput_table(docs: list[Doc]) -> Table:
    """Per run and rate: goodput of the engine alone and of both pipeline paths."""
    table = Table(["run", "events/s", "events", "engine alone", "`sts-kafka` (x engine)",
                   "`sts`, files (x engine)", "`high` within SLA: engine / Kafka / files",
                   "backlog at the cut-off"], "lrrrrrrr")
    for label, doc in docs:
        for rate, runs in by_rate(doc).items():
            eng, kafka, files = runs["engine"], runs["sts-kafka"], runs["sts"]
            table.rows.append([
                f"`{label}`", f"{rate:g}", num(eng["offered"]), pct(eng["goodput"]),
                f"{pct(kafka['goodput'])} ({times(kafka['goodput'], eng['goodput'])})",
                f"{pct(files['goodput'])} ({times(files['goodput'], eng['goodput'])})",
                pcts([share(r["llm_on_time_by_priority"]["high"]) for r in (eng, kafka, files)]),
                " / ".join(str(r["final_backlog"]) for r in (eng, kafka, files))])
    return table


def deployed_path_table(docs: list[Doc]) -> Table:
    """Per run and rate: every event answered, the answer's way back, when it is readable."""
    table = Table(["run", "events/s", "answered, Kafka / files", "*event -> submitted* P50",
                   "*finished -> answer landed* P50 (Kafka / files)",
                   "readable by the deadline"], "lrrrrr")
    for label, doc in docs:
        for rate, runs in by_rate(doc).items():
            kafka, files = runs["sts-kafka"], runs["sts"]
            landed = [hop(r, "finished -> answer landed") for r in (kafka, files)]
            table.rows.append([
                f"`{label}`", f"{rate:g}",
                f"{kafka['answered']:,} / {files['answered']:,} of {kafka['offered']:,}",
                both(hop(kafka, "event -> submitted"), hop(files, "event -> submitted")),
                f"{both(*landed)} ({times(landed[0], landed[1], 2)})",
                pcts([r.get("goodput_readable") for r in (kafka, files)])])
    return table


def priority_table(docs: list[Doc]) -> Table:
    """Per overload factor: what each priority got from the sidecar alone."""
    table = Table(["offered", "engine", "`high` on time", "`high` answer P50 / P99",
                   "`normal` on time", "`low` on time", "preemptions",
                   "one row per request; order kept"], "llrrrrrl")
    for _, doc in docs:
        got = doc["overload"]["by_priority"]
        high = got["high"]
        engine = doc["engine"] + (" (SIMULATION)" if doc["simulated"] else "")
        table.rows.append([
            f"{doc['settings']['factor']:g}x of {doc['capacity']['requests_per_s']} requests/s",
            engine, f"{high['on_time']} / {high['sent']} ({pct(high['on_time_rate'], 0)})",
            both(high["ok_latency_ms_p50"], high["ok_latency_ms_p99"]),
            pct(got["normal"]["on_time_rate"]), pct(got["low"]["on_time_rate"]),
            num(doc["overload"]["preemptions"]),
            f"{_yes(doc['overload']['exactly_one_row'])}; {_yes(doc['overload']['order_kept'])}"])
    return table


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def trace_table(docs: list[Doc]) -> Table:
    """Every scheme on one replayed trace: goodput next to the engine's, per priority."""
    (_, doc), = docs
    table = Table(["scheme", "goodput (x engine)", "`high` by the model within SLA",
                   "`normal`", "`low`", "P50 / P99", "answered", "backlog at the cut-off"],
                  "lrrrrrrr")
    for rate, runs in by_rate(doc).items():
        engine = runs["engine"]["goodput"]
        for scheme, run in runs.items():
            lat = run["latency_ms"]
            table.rows.append([
                SCHEMES.get(scheme, scheme),
                f"{pct(run['goodput'])} ({times(run['goodput'], engine, 2)})",
                *(of(run["llm_on_time_by_priority"][p]) for p in PRIORITIES),
                both(lat["p50"], lat["p99"]), num(run["answered"]), num(run["final_backlog"])])
        cut = doc["trace"]["rates"][str(rate)]
        table.notes.append(
            f"`{doc['trace']['file']}` at {rate:g} requests/s, its first "
            f"{doc['options']['duration_s']:g} s: {cut['requests']:,} requests; prompts cut "
            f"{cut['inputs_capped']}, outputs cut {cut['outputs_capped']}; "
            f"profile `{doc['profile']}`, engine `{doc['engine']}`.")
    return table


#: The soak's windows the page shows (minutes since the replay began, both ends in).
SOAK_WINDOWS = ((2, 6), (26, 30), (56, 60))


def above_knee_table(docs: list[Doc]) -> Table:
    """The real engine below and above its knee, a CPU split per document: goodput and
    `high` for the engine alone, the pipeline (its rows readable by the deadline) and the
    concurrent baseline, with the engine's tokens/s under each."""
    table = Table(["CPU split", "events/s", "goodput: engine / `sts` / concurrent",
                   "`sts` readable in time (x engine)",
                   "`high` in time: engine / `sts` readable / concurrent",
                   "`sts` `high` x engine", "shares in order: engine / `sts`",
                   "engine tokens/s"], "lrrrrrlr")
    for _, doc in docs:
        split = doc.get("cpu_split", {}).get("mode", "shared")
        for rate, runs in by_rate(doc).items():
            eng, sts, conc = runs["engine"], runs["sts"], runs["baseline-concurrent"]
            readable = sts["llm_readable_on_time_by_priority"]
            high = [eng["llm_on_time_by_priority"]["high"], readable["high"],
                    conc["llm_on_time_by_priority"]["high"]]
            ordered = [_in_order(eng["llm_on_time_by_priority"]), _in_order(readable)]
            table.rows.append([
                split, f"{rate:g}", pcts([r["goodput"] for r in (eng, sts, conc)]),
                f"{pct(sts['goodput_readable'])} "
                f"({times(sts['goodput_readable'], eng['goodput'], 2)})",
                " / ".join(f"{h[0]}" for h in high) + f" of {high[0][1]}",
                times(share(high[1]), share(high[0]), 2),
                " / ".join("yes" if o else "no" for o in ordered),
                " / ".join(num(r["engine_tokens_per_s"]) for r in (eng, sts, conc))])
    return table


def _in_order(by_priority: dict[str, Sequence[int]]) -> bool:
    """Whether the shares within SLA fall from `high` to `low`."""
    shares = [share(by_priority[p]) or 0.0 for p in PRIORITIES]
    return shares[0] >= shares[1] >= shares[2]


def soak_table(docs: list[Doc]) -> Table:
    """The hour: the answers micro-batch and what grows, by window of minutes."""
    (_, doc), = docs
    samples = doc["samples"]
    table = Table(["minutes", "answers micro-batch P50 (x minutes 2-6)", "of it: the ledger",
                   "the answers' append", "Delta log files", "Kafka lag", "sidecar RSS",
                   "driver JVM RSS"], "lrrrrrrr")
    first = None
    for lo, hi in SOAK_WINDOWS:
        window = [s for s in samples if lo <= s["minute"] <= hi]
        batch = _median(window, lambda s: s.get("answers_batch_ms_p50"))
        first = first or batch
        table.rows.append([
            f"{lo}-{hi}", f"{num(batch)} ms ({times(batch, first, 2)})",
            f"{num(_median(window, _write_ms('ledger')))} ms",
            f"{num(_median(window, _write_ms('answers')))} ms",
            num(window[-1]["table_log_files"]), num(max(s.get("kafka_lag") or 0 for s in window)),
            f"{num(window[-1]['sidecar']['rss_mb'])} MB",
            f"{num(window[-1]['driver_jvm']['rss_mb'])} MB"])
    got = doc["summary"]
    table.notes.append(
        f"{doc['minutes']:g} minutes at {doc['rate']:g} events/s (source `{doc['source']}`, "
        f"writer `{doc['writer']}`, engine `{doc['engine']}`): {got['events']:,} events, "
        f"{got['answers']:,} answer rows ({got['answers_by_source']['llm']:,} by the model, "
        f"{got['answers_by_source']['fallback']:,} fallbacks); write conflicts retried "
        f"{max(s.get('conflicts_retried') or 0 for s in samples)}.")
    return table


def _median(samples: list[dict], value: Callable[[dict], float | None]) -> float | None:
    found = [v for v in map(value, samples) if v is not None]
    return statistics.median(found) if found else None


def _write_ms(step: str) -> Callable[[dict], float | None]:
    """A soak sample's P50 of one step of the answers micro-batch (``answers_write_ms``)."""
    return lambda sample: (sample.get("answers_write_ms") or {}).get(step)


def realtime_table(docs: list[Doc]) -> Table:
    """The submit query in Real-Time Mode next to micro-batches and the engine alone; the
    intake measured alone in a note."""
    *benches, (_, intake) = docs
    table = Table(["engine (profile)", "events/s", "scheme", "goodput (x engine)",
                   "`high` within SLA", "*event -> submitted* P50",
                   "*event -> answer landed* P50"], "lrlrrrr")
    for _, doc in benches:
        for rate, runs in by_rate(doc).items():
            engine = runs["engine"]["goodput"]
            for scheme, run in runs.items():
                table.rows.append([
                    f"{doc['engine']} ({doc['profile']})", f"{rate:g}", SCHEMES.get(scheme, scheme),
                    f"{pct(run['goodput'])} ({times(run['goodput'], engine)})",
                    of(run["llm_on_time_by_priority"]["high"]),
                    ms(hop(run, "event -> submitted")), ms(hop(run, "event -> answer landed"))])
    parts = [f"{r['mode']} at {r['rate']:g}/s {num(hop(r, 'event -> sidecar received'))} / "
             f"{num(hop(r, 'event -> sidecar received', 'p99'))} ms" for r in intake["runs"]]
    table.notes.append("The submit query alone, *event -> sidecar received* P50 / P99: "
                       + "; ".join(parts) + ".")
    return table


def sidecar_cost_table(docs: list[Doc]) -> Table:
    """The gateway on one core per batch size; its latency at low load and its memory
    over the hour in notes."""
    (_, gateway), (_, soak) = docs
    table = Table(["batch size", "submissions/s", "ack P50 / P99 per RPC",
                   "sidecar CPU per request", "sidecar core busy"], "rrrrr")
    for row in gateway["throughput"]:
        ack = row["ack_ms_per_rpc"]
        table.rows.append([str(row["batch_size"]), num(row["submissions_per_s"]),
                           both(ack["p50"], ack["p99"], 1),
                           f"{num(row['sidecar_cpu_us_per_request'], 1)} µs",
                           pct(row["sidecar_cpu_util"], 0)])
    low = gateway["added_latency"]
    ref = gateway["machine"].get("reference_cpu_ms") or {}
    rss = [s["sidecar"]["rss_mb"] for s in soak["samples"] if s["sidecar"].get("rss_mb")]
    table.notes.append(
        f"Measured {gateway['started'][:10]} on {gateway['machine']['cpu_model']} (reference "
        f"loop {ref.get('before_ms')} ms before, {ref.get('after_ms')} after). At low load "
        f"({low['samples']} single requests {low['interval_ms']:g} ms apart) the ack round "
        f"trip takes {low['ack_rtt_ms']['p50']:.2f} ms P50, {low['ack_rtt_ms']['p99']:.2f} ms "
        f"P99. The sidecar's memory over the hour at {soak['rate']:g} events/s: "
        f"{num(rss[0])} -> {num(rss[-1])} MB RSS.")
    return table


def elastic_table(docs: list[Doc]) -> Table:
    """Each autoscaling policy on each traffic of the fleet simulation: its GPU-seconds
    as a multiple of the oracle's, and `high` within SLA; the recorded real load-step runs
    in a note."""
    (_, doc), = docs
    results = doc["results"]
    heads = []
    for r in results:
        where = (f"trace at {r['oracle_peak_gpus']} GPUs" if r["traffic"] != "load-step"
                 else "load step, 1-4 GPUs")
        heads.append(f"{where}: GPU-s x oracle, `high`")
    table = Table(["policy", *heads], "l" + "r" * len(results))
    for i, run in enumerate(results[0]["runs"]):
        name = run["policy"] if not run["policy"].startswith("static peak") else "static peak"
        cells = []
        for r in results:
            row = r["runs"][i]
            cells.append(f"{row['x_oracle']:.2f}x, {pct(row['within_sla']['high'], 2)}")
        table.rows.append([name, *cells])
    note = ("Oracle GPU-seconds: " + ", ".join(
        f"{r['oracle_gpu_seconds']:,.0f} ({r['requests']:,} requests, cold start "
        f"{r['cold_start_s']:g} s)" for r in results)
        + f"; a GPU: {doc['gpu']['batch']} sequences, "
        f"{doc['gpu']['capacity_tokens_per_s']:,.0f} output tokens/s.")
    for r in results:
        if recorded := r.get("recorded"):
            note += " The load step run for real (`local-cluster`, `results/load-step/`): " + \
                "; ".join(f"{x['run']} {x['gpu_seconds'] / r['oracle_gpu_seconds']:.2f}x, "
                          f"`high` {pct(x['within_sla']['high'], 2)}" for x in recorded) + "."
    table.notes.append(note)
    return table


#: Each table of the page: the JSON it is made of (under ``benchmarks/results/``) and how.
TABLES: dict[str, Source] = {
    "goodput": Source(("issue60-ab/new-R-0938.json", "issue60-ab/new-R-0950.json"),
                      goodput_table),
    "deployed-path": Source(("issue60-ab/new-R-0938.json", "issue60-ab/new-R-0950.json",
                             "deployed-path-today/bench-800.json"), deployed_path_table),
    "priority": Source(("overload-slow-cpu-real/2x.json", "overload-slow-cpu-real/4x.json"),
                       priority_table),
    "real-traffic": Source(("trace-seed-scale/bench.json",), trace_table),
    "above-knee": Source(("above-knee-vllm/pinned.json", "above-knee-vllm/shared.json",
                          "above-knee-vllm/pinned-2.json"), above_knee_table),
    "soak": Source(("soak-kafka-spark-60-logstore/soak.json",), soak_table),
    "realtime": Source(("deployed-path-today/bench-rtm.json", "realtime-real-model/bench.json",
                        "realtime_mode/realtime_intake.json"), realtime_table),
    "sidecar-cost": Source(("gateway_overhead.json", "soak-kafka-spark-60-logstore/soak.json"),
                           sidecar_cost_table),
    "elastic": Source(("fleet-sim/fleet_sim.json",), elastic_table),
}


# The page -----------------------------------------------------------------------------

def render(name: str, results: Path = RESULTS) -> str:
    """Table ``name`` as the page should hold it, from its JSON under ``results``."""
    source = TABLES[name]
    docs = [(p.removesuffix(".json"), json.loads((results / p).read_text(encoding="utf-8")))
            for p in source.paths]
    return source.build(docs).markdown()


def refresh(text: str, results: Path = RESULTS) -> tuple[str, list[str]]:
    """``text`` with every table block rewritten from its JSON, and the names of the
    blocks that changed.

    Raises:
        ValueError: a block names no table of :data:`TABLES`, or a table has no block.
    """
    names = [m.group(2) for m in BLOCK.finditer(text)]
    if unknown := sorted(set(names) - set(TABLES)):
        raise ValueError(f"the page has blocks for tables {unknown}, which TABLES does not "
                         "declare")
    if missing := [n for n in TABLES if n not in names]:
        raise ValueError(f"the page has no <!-- table: NAME --> block for {missing}")
    stale: list[str] = []

    def rewrite(m: re.Match[str]) -> str:
        new = render(m.group(2), results) + "\n"
        if new != m.group(3):
            stale.append(m.group(2))
        return m.group(1) + new + m.group(4)

    return BLOCK.sub(rewrite, text), stale


def main(argv: list[str] | None = None) -> int:
    """Rewrite the page's tables, or with ``--check`` say which ones are stale."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.results_page",
                                description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if a table differs from what its JSON gives")
    p.add_argument("--page", type=Path, default=PAGE)
    p.add_argument("--results", type=Path, default=RESULTS, help="the JSON's folder")
    args = p.parse_args(argv)
    text = args.page.read_text(encoding="utf-8")
    try:
        new, stale = refresh(text, args.results)
    except (ValueError, OSError) as e:
        print(f"results_page: {e}", file=sys.stderr)
        return 2
    except KeyError as e:
        print(f"results_page: a field a table reads is missing from its JSON: {e}",
              file=sys.stderr)
        return 2
    for name in stale:
        files = ", ".join(TABLES[name].paths)
        print(f"{'stale' if args.check else 'rewrote'}: table {name!r} (from {files})")
    if args.check:
        if stale:
            print(f"{args.page}: run `python -m benchmarks.results_page` to refresh",
                  file=sys.stderr)
        return 1 if stale else 0
    if new != text:
        args.page.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
