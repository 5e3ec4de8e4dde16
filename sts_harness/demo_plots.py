"""The demo's two plots: latency per priority over the run, and answers by source.

Written next to the tables (``<out>/plots/``) and listed in the summary, because a
person reads a plot of a few hundred answers faster than a table of them.
"""

from __future__ import annotations

import collections
from pathlib import Path

from sidecar.contract import PRIORITY_NAMES

#: Answer sources in the order they are stacked and their colours.
SOURCES = {"llm": "tab:green", "backfill": "tab:olive", "fallback": "tab:red",
           "rule": "tab:blue", "kb": "tab:purple"}


def plot_demo(answers: list[dict], out: Path, sla_ms: dict[str, int]) -> list[Path]:
    """Write ``latency_over_time.png`` and ``answers_by_source.png`` into ``out``;
    return their paths (none when there are no answers)."""
    if not answers:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    t0 = min(a["enqueue_ts"] for a in answers)
    written = []

    fig, axes = plt.subplots(1, len(PRIORITY_NAMES), figsize=(13, 3.4), sharey=True)
    for ax, priority in zip(axes, PRIORITY_NAMES):
        mine = [a for a in answers if a["priority"] == priority and a["latency_ms"] is not None]
        for source, colour in SOURCES.items():
            pts = [a for a in mine if a["answer_source"] == source]
            if pts:
                ax.scatter([(a["enqueue_ts"] - t0) / 1000 for a in pts],
                           [a["latency_ms"] / 1000 for a in pts], s=12, color=colour,
                           label=f"{source} ({len(pts)})")
        if priority in sla_ms:
            ax.axhline(sla_ms[priority] / 1000, color="k", ls="--", lw=1, label="SLA")
        ax.set_title(f"{priority}: {len(mine)} events")
        ax.set_xlabel("event time, s after the first")
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("event -> answer, s")
    fig.tight_layout()
    path = out / "latency_over_time.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    counts = {p: collections.Counter(a["answer_source"] for a in answers if a["priority"] == p)
              for p in PRIORITY_NAMES}
    fig, ax = plt.subplots(figsize=(6, 3.4))
    bottom = [0] * len(PRIORITY_NAMES)
    for source, colour in SOURCES.items():
        heights = [counts[p][source] for p in PRIORITY_NAMES]
        if any(heights):
            ax.bar(PRIORITY_NAMES, heights, bottom=bottom, color=colour, label=source)
            bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylabel("answers")
    ax.set_title("answers by source and priority")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "answers_by_source.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
