"""The support-ticket application that ``sts demo``, ``sts validate``, the quickstart
notebook and the benchmarks run: its prompt, its fallback and its rule answer. The
library's own defaults (:mod:`spark_ext.config`) are an application's no more."""

from __future__ import annotations

from typing import Any

#: The prompt: the assistant's instructions first (shared by every request), the ticket last.
SUPPORT_TEMPLATE = {
    "stable": ("You are a support assistant. Reply to the customer's ticket in one short, "
               "polite sentence.\n"),
    "dynamic": "Ticket: {text}",
}
#: The answer of a ticket the model did not answer by its deadline.
SUPPORT_FALLBACK = "Thanks for your message. An agent will get back to you shortly."
#: The answer of a ticket L1 routed to the rule (a greeting, a thank-you).
SUPPORT_RULE_TEXT = "Hello! Thanks for your message. How can we help you today?"


def support_sections(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a pipeline config as a mapping) with the application's texts wherever it
    sets none.

    Example:
        >>> s = support_sections({"template": {"dynamic": "Ticket: {text}\\n{kb_context}"}})
        >>> s["template"]["stable"][:25], s["template"]["dynamic"][-12:]
        ('You are a support assista', '{kb_context}')
        >>> s["answers"]["fallback_text"] == SUPPORT_FALLBACK
        True
    """
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for key, value in SUPPORT_TEMPLATE.items():
        out.setdefault("template", {}).setdefault(key, value)
    out.setdefault("answers", {}).setdefault("fallback_text", SUPPORT_FALLBACK)
    out.setdefault("routing", {}).setdefault("rule_text", SUPPORT_RULE_TEXT)
    return out
