"""Figures of a rollout: the arms' shares in the demo, and the per-priority table of
``sts validate``'s report."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Any

from sidecar import percentiles
from sidecar.contract import PRIORITY_NAMES


def rule_arm(answer: Mapping[str, Any]) -> bool:
    """Whether an answer row was served by the rollout's rule arm (not the model's)."""
    return str(answer.get("reason") or "").startswith("rollout:")


def rollout_shares(answers: list[dict], shadow: list[dict], *, mode: str,
                   canary_share: float) -> dict:
    """How the events split between the arms, and what the shadow table holds.

    Example:
        >>> a = [{"answer_source": "llm", "reason": None},
        ...      {"answer_source": "rule", "reason": "rollout:canary"}]
        >>> rollout_shares(a, [], mode="canary", canary_share=0.3)["llm_arm_share"]
        0.5
    """
    rule = sum(1 for a in answers if rule_arm(a))
    return {"mode": mode, "canary_share": canary_share, "events": len(answers),
            "llm_arm": len(answers) - rule, "rule_arm": rule,
            "llm_arm_share": (len(answers) - rule) / len(answers) if answers else None,
            "shadow_answers": len(shadow),
            "shadow_by_source": dict(collections.Counter(s["answer_source"] for s in shadow)),
            "shadow_invalid": sum(1 for s in shadow if s["status"] == "invalid")}


def format_rollout(r: Mapping[str, Any]) -> str:
    """One summary line for :func:`rollout_shares`."""
    share = f"{r['llm_arm_share']:.0%}" if r["llm_arm_share"] is not None else "n/a"
    line = (f"rollout {r['mode']:<8} model's arm {r['llm_arm']}/{r['events']} ({share}), "
            f"rule arm {r['rule_arm']}")
    if r["mode"] == "canary":
        line += f" (canary_share {r['canary_share']:g})"
    if r["shadow_answers"]:
        line += (f"; shadow_answers {r['shadow_answers']} {r['shadow_by_source']}, "
                 f"{r['shadow_invalid']} invalid")
    return line


def priority_table(report: Iterable[Mapping[str, Any]]) -> list[dict]:
    """Per priority (then ``all``): events, LLM answers (``status = ok``), validation
    failure rate among them, latency P50/P99 of the LLM answers, prompt and completion
    tokens per LLM answer.

    Example:
        >>> rows = [{"priority": "high", "status": "ok", "validation": "pass",
        ...          "latency_ms": 100, "prompt_tokens": 40, "output_tokens": 10},
        ...         {"priority": "high", "status": "ok", "validation": "pii:email",
        ...          "latency_ms": 300, "prompt_tokens": 60, "output_tokens": 20},
        ...         {"priority": "low", "status": "shed", "validation": None,
        ...          "latency_ms": None, "prompt_tokens": None, "output_tokens": None}]
        >>> t = priority_table(rows)
        >>> [(r["priority"], r["events"], r["llm_answered"], r["invalid_rate"]) for r in t]
        [('high', 2, 2, 0.5), ('low', 1, 0, None), ('all', 3, 2, 0.5)]
    """
    rows = list(report)
    present = [p for p in PRIORITY_NAMES if any(r["priority"] == p for r in rows)]
    present += sorted({str(r["priority"]) for r in rows} - set(PRIORITY_NAMES))
    out = []
    for name in [*present, "all"]:
        mine = [r for r in rows if name == "all" or str(r["priority"]) == name]
        ok = [r for r in mine if r["status"] == "ok" and r.get("validation") is not None]
        lat = [r["latency_ms"] for r in ok if r["latency_ms"] is not None]
        pct = percentiles(lat, (50, 99), digits=None) if lat else {"p50": None, "p99": None}

        def mean(col: str) -> float | None:
            vals = [r[col] for r in ok if r[col] is not None]
            return sum(vals) / len(vals) if vals else None

        out.append({"priority": name, "events": len(mine), "llm_answered": len(ok),
                    "invalid_rate": (sum(r["validation"] != "pass" for r in ok) / len(ok)
                                     if ok else None),
                    "latency_p50_ms": pct.get("p50"), "latency_p99_ms": pct.get("p99"),
                    "prompt_tokens": mean("prompt_tokens"),
                    "completion_tokens": mean("output_tokens")})
    return out


def format_priority_table(table: list[dict]) -> list[str]:
    """The table of :func:`priority_table` as text lines."""
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [f"{'priority':<9}{'events':>7}{'LLM answered':>14}{'invalid':>9}"
             f"{'latency p50':>13}{'p99 (ms)':>10}{'tokens/answer (prompt+completion)':>36}"]
    for r in table:
        tokens = (f"{num(r['prompt_tokens'], '.0f')} + {num(r['completion_tokens'], '.0f')}"
                  if r["llm_answered"] else "-")
        lines.append(f"{r['priority']:<9}{r['events']:>7}{r['llm_answered']:>14}"
                     f"{num(r['invalid_rate'], '.0%'):>9}{num(r['latency_p50_ms'], '.0f'):>13}"
                     f"{num(r['latency_p99_ms'], '.0f'):>10}{tokens:>36}")
    return lines
