"""Progressive rollout: which LLM-routed events the model answers (``rollout`` config).

Every LLM-routed request row gets a ``rollout_arm``:

``llm``     submitted; its result is the served answer (``full``, and ``canary``
            events whose :func:`canary_bucket` is below ``canary_share``);
``rule``    not submitted: answered at once with the rule answer
            (``answers.fallback_text``; ``answer_source = rule``,
            ``reason = rollout:<mode>``): the rest of ``canary``, all of ``offline``;
``shadow``  answered at once like ``rule`` *and* submitted, tagged with the
            :data:`SHADOW_ATTRIBUTE`; its result goes to the ``shadow_answers`` table
            (:mod:`spark_ext.l4.ledger`), never to ``answers``.

The bucket is a SHA-256 of ``request_id`` mapped to [0, 1), computed the same way in
Python and in Spark SQL, so an event lands in the same arm on every replay, restart
and mode switch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from spark_ext.config import RolloutConfig
from spark_ext.l4.answers import fast_answers

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: Column of the request rows naming their arm.
ARM_COLUMN = "rollout_arm"
#: Request attribute (echoed on the result row) that marks a shadow request.
SHADOW_ATTRIBUTE = "sts.shadow"
#: Hex digits of the SHA-256 used for the bucket: 52 bits, exact in a double.
_HEX_DIGITS = 13
_SCALE = float(16 ** _HEX_DIGITS)


def canary_bucket(request_id: str) -> float:
    """The event's place in [0, 1): the first 52 bits of SHA-256(``request_id``).

    Example:
        >>> round(canary_bucket("a1b2"), 4), 0 <= canary_bucket("another id") < 1
        (0.5203, True)
    """
    digest = hashlib.sha256(request_id.encode("utf-8")).hexdigest()
    return int(digest[:_HEX_DIGITS], 16) / _SCALE


def bucket_column(request_id: "Column") -> "Column":
    """:func:`canary_bucket` as a Spark column expression (same value, exactly)."""
    from pyspark.sql import functions as F

    digits = F.substring(F.sha2(request_id.cast("string"), 256), 1, _HEX_DIGITS)
    return F.conv(digits, 16, 10).cast("long").cast("double") / F.lit(_SCALE)


def arm_for(mode: str, bucket: float, canary_share: float) -> str:
    """The arm of an LLM-routed event (the Python twin of :func:`with_arm`).

    Example:
        >>> [arm_for(m, 0.25, 0.3) for m in ("full", "canary", "shadow", "offline")]
        ['llm', 'llm', 'shadow', 'rule']
        >>> arm_for("canary", 0.3, 0.3)
        'rule'
    """
    if mode == "canary":
        return "llm" if bucket < canary_share else "rule"
    return {"full": "llm", "shadow": "shadow", "offline": "rule"}[mode]


def with_arm(requests: "DataFrame", config: RolloutConfig) -> "DataFrame":
    """``requests`` with :data:`ARM_COLUMN` (null for events L1 did not route ``llm``)
    and a ``route`` column (``llm`` when L1/L2 did not add one)."""
    from pyspark.sql import functions as F

    if "route" not in requests.columns:
        requests = requests.withColumn("route", F.lit("llm"))
    if config.mode == "canary":
        arm = F.when(bucket_column(F.col("request_id")) < F.lit(float(config.canary_share)),
                     F.lit("llm")).otherwise(F.lit("rule"))
    else:
        arm = F.lit(arm_for(config.mode, 0.0, config.canary_share))
    return requests.withColumn(ARM_COLUMN, F.when(F.col("route") == "llm", arm))


def rollout_answers(rows: Iterable[Mapping[str, Any]], *, mode: str, key_columns: list[str],
                    rule_text: str) -> list[dict]:
    """The rule answers served at once for ``rule`` and ``shadow`` arm rows (built by
    :func:`spark_ext.l4.answers.fast_answers`), ``reason = rollout:<mode>``.

    Example:
        >>> rows = [{"request_id": "r1", "priority": "low", "route": "llm",
        ...          "rollout_arm": "rule", "event_id": "e1"}]
        >>> [(a["answer"], a["answer_source"], a["status"], a["reason"], a["event_id"])
        ...  for a in rollout_answers(rows, mode="canary", key_columns=["event_id"],
        ...                           rule_text="An agent will reply.")]
        [('An agent will reply.', 'rule', 'ok', 'rollout:canary', 'e1')]
    """
    held = [dict(r, route="rule") for r in rows]
    return [dict(a, reason=f"rollout:{mode}")
            for a in fast_answers(held, key_columns=key_columns, rule_text=rule_text)]
