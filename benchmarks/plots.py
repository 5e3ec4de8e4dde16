"""PNG plots of a ``sts bench`` result document (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sts_capacity.profiles import TrafficProfile  # noqa: E402

_COLORS = {"engine": "tab:gray", "sts": "tab:green", "sts-kafka": "tab:cyan",
           "sts-kafka-rtm": "tab:purple", "baseline-sync": "tab:red",
           "baseline-concurrent": "tab:orange"}


def _by_scheme(runs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in runs:
        out.setdefault(r["scheme"], []).append(r)
    for rows in out.values():
        rows.sort(key=lambda r: r["offered_rate"])
    return out


def _save(fig: plt.Figure, path: Path, written: list[Path]) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)


def _label(doc: dict) -> str:
    sim = " (SIMULATION)" if doc.get("simulation") else ""
    return f"profile {doc['profile']}, engine {doc['engine']}{sim}"


def plot_bench(doc: dict, profile: TrafficProfile, out: Path) -> list[Path]:
    """Latency vs rate (with the SLA line), goodput vs rate, backlog over time at the
    highest rate, and for ``--knee`` runs the throughput/P99 curve with the knee."""
    schemes = _by_scheme(doc["runs"])
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for scheme, rows in schemes.items():
        rates = [r["offered_rate"] for r in rows]
        color = _COLORS.get(scheme)
        ax.plot(rates, [(r["latency_ms"]["p99"] or float("nan")) / 1000 for r in rows],
                "o-", color=color, label=f"{scheme} P99")
        ax.plot(rates, [(r["latency_ms"]["p50"] or float("nan")) / 1000 for r in rows],
                "o--", color=color, alpha=0.6, label=f"{scheme} P50")
    for prio, sla in sorted(profile.sla_ms.items(), key=lambda kv: kv[1]):
        ax.axhline(sla / 1000, color="black", lw=0.8, ls=":")
        ax.text(ax.get_xlim()[0], sla / 1000, f" SLA {prio}", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("offered events/s")
    ax.set_ylabel("end-to-end latency, s (log)")
    ax.set_title(f"Latency vs offered rate: {_label(doc)}", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    _save(fig, out / "latency_vs_rate.png", written)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for scheme, rows in schemes.items():
        rates = [r["offered_rate"] for r in rows]
        ax.plot(rates, [r["goodput"] or 0 for r in rows], "o-", color=_COLORS.get(scheme),
                label=f"{scheme}: LLM answer within SLA")
        ax.plot(rates, [r["on_time_rate"] or 0 for r in rows], "x:", color=_COLORS.get(scheme),
                alpha=0.6, label=f"{scheme}: any answer within SLA")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("offered events/s")
    ax.set_ylabel("share of offered events")
    ax.set_title(f"Deadline hit rate: {_label(doc)}", fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, out / "goodput_vs_rate.png", written)

    top = max((r["offered_rate"] for r in doc["runs"]), default=None)
    if top is not None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for scheme, rows in schemes.items():
            run = next((r for r in rows if r["offered_rate"] == top), None)
            if run and run["backlog"]:
                t, b = zip(*run["backlog"])
                ax.plot(t, b, color=_COLORS.get(scheme), label=scheme)
        ax.set_xlabel("seconds since the run started")
        ax.set_ylabel("backlog: offered - answered events")
        ax.set_title(f"Backlog at {top:g} events/s: {_label(doc)}", fontsize=9)
        ax.legend(fontsize=8)
        _save(fig, out / "backlog.png", written)

    if doc.get("knee") and "engine" in schemes:
        rows = schemes["engine"]
        fig, ax1 = plt.subplots(figsize=(7, 4.5))
        rates = [r["offered_rate"] for r in rows]
        ax1.plot(rates, [r["llm_throughput_per_s"] for r in rows], "o-", color="tab:blue",
                 label="completed LLM answers/s")
        ax1.plot(rates, rates, ":", color="tab:blue", alpha=0.4, label="offered")
        ax1.set_xlabel("offered requests/s")
        ax1.set_ylabel("answers/s", color="tab:blue")
        ax2 = ax1.twinx()
        ax2.plot(rates, [(r["latency_ms"]["p99"] or float("nan")) / 1000 for r in rows],
                 "s-", color="tab:red", label="P99 latency")
        ax2.set_ylabel("P99 latency, s", color="tab:red")
        knee = doc["knee"].get("knee_rate")
        if knee is not None:
            ax1.axvline(knee, color="black", ls="--", lw=1)
            ax1.text(knee, ax1.get_ylim()[1] * 0.95, f" knee {knee:g}/s", fontsize=8)
        ax1.set_title(f"Sidecar throughput and P99: {_label(doc)}", fontsize=9)
        handles = ax1.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax1.legend(handles=handles, fontsize=7, loc="center right")
        _save(fig, out / "knee.png", written)
    return written
