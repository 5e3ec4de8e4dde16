"""Where an answer's time went: per-hop latencies from the answers table's timestamps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sidecar import percentiles

#: Hop name -> (from column, to column); all epoch-ms columns of the answers table.
HOPS: dict[str, tuple[str, str]] = {
    "event -> submitted": ("enqueue_ts", "submit_ts"),
    "submitted -> sidecar received": ("submit_ts", "received_ts"),
    "received -> finished": ("received_ts", "finish_ts"),
    "finished -> answer landed": ("finish_ts", "answered_ts"),
    "event -> answer landed": ("enqueue_ts", "answered_ts"),
}
#: Hops to when the row became readable (``readable_ts``: its commit,
#: :mod:`sts_harness.readable`), where the rows carry it. *Landed* above is
#: ``answered_ts``: the start of the answers micro-batch that decided the row.
READABLE_HOPS: dict[str, tuple[str, str]] = {
    "answer landed -> readable": ("answered_ts", "readable_ts"),
    "event -> answer readable": ("enqueue_ts", "readable_ts"),
}


def hop_latencies(rows: Iterable[Mapping], *, sources: tuple[str, ...] = ("llm", "fallback")
                  ) -> dict[str, dict[str, float | None]]:
    """P50/P99 (ms) and count of every hop over answer rows of ``sources`` that have
    both timestamps (backfilled rows are left out: their answer landed twice); the
    :data:`READABLE_HOPS` too when some row has ``readable_ts``.

    Example:
        >>> rows = [{"answer_source": "llm", "enqueue_ts": 0, "submit_ts": 10,
        ...          "received_ts": 12, "finish_ts": 512, "answered_ts": 800}]
        >>> hop_latencies(rows)["finished -> answer landed"]
        {'p50': 288.0, 'p99': 288.0, 'n': 1}
        >>> rows[0]["readable_ts"] = 1_700
        >>> hop_latencies(rows)["answer landed -> readable"]
        {'p50': 900.0, 'p99': 900.0, 'n': 1}
    """
    rows = [r for r in rows if r.get("answer_source") in sources]
    hops = {**HOPS, **(READABLE_HOPS if any(r.get("readable_ts") is not None for r in rows)
                       else {})}
    out = {}
    for hop, (a, b) in hops.items():
        values = [r[b] - r[a] for r in rows if r.get(a) is not None and r.get(b) is not None]
        out[hop] = percentiles(values, (50, 99), digits=1) | {"n": len(values)}
    return out


def format_hops(hops: Mapping[str, Mapping]) -> list[str]:
    """Lines of a small table: hop, n, P50, P99."""
    lines = [f"{'hop':<32}{'n':>7}{'p50 ms':>10}{'p99 ms':>10}"]
    for hop, v in hops.items():
        p50 = f"{v['p50']:.0f}" if v.get("p50") is not None else "-"
        p99 = f"{v['p99']:.0f}" if v.get("p99") is not None else "-"
        lines.append(f"{hop:<32}{v['n']:>7}{p50:>10}{p99:>10}")
    return lines
