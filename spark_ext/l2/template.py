"""L2 prompt assembly: the stable prefix first, the per-event part last.

vLLM's prefix cache only helps when requests share a leading run of tokens, so
a template is split into a *stable* part (system prompt, few-shot examples,
fixed context; no per-event fields) and a *dynamic* part (the event's fields,
last). ``cache_key`` is a hash of the stable part. A template whose per-event
fields come first is refused (pitfall 3: prefix-cache hit rate near 0).
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass, field

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_ext.exceptions import TemplateOrderError


def _fields(text: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt as ``stable`` (no fields) followed by ``dynamic`` (``{column}`` fields).

    Args:
        stable: System prompt, few-shot examples and fixed context, identical for
            every event. Must not contain ``{field}`` placeholders.
        dynamic: The per-event part, e.g. ``"Ticket: {text}\\nAnswer:"``.

    Raises:
        TemplateOrderError: The stable part has fields, is empty, or the dynamic
            part carries more fixed text than the stable part (fixed content after
            per-event content cannot be cached).

    Example:
        >>> t = PromptTemplate(stable="You triage support tickets.\\n", dynamic="Ticket: {text}")
        >>> t.fields
        ['text']
        >>> len(t.cache_key)
        16
    """

    stable: str
    dynamic: str
    fields: list[str] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if _fields(self.stable):
            raise TemplateOrderError(
                f"the stable part contains per-event fields {_fields(self.stable)}; "
                "move them to the dynamic part so the prefix is shared")
        if not self.stable.strip():
            raise TemplateOrderError("the stable part is empty: put the system prompt, "
                                     "examples and fixed context before the per-event fields")
        names = _fields(self.dynamic)
        if not names:
            raise TemplateOrderError("the dynamic part has no {field}: nothing per-event")
        fixed_after = sum(len(lit) for lit, *_ in string.Formatter().parse(self.dynamic))
        if fixed_after > len(self.stable):
            raise TemplateOrderError(
                f"{fixed_after} characters of fixed text follow the first per-event field but "
                f"only {len(self.stable)} precede it: fixed content must come first")
        object.__setattr__(self, "fields", names)

    @classmethod
    def from_string(cls, template: str) -> "PromptTemplate":
        """Split one template string at its first ``{field}``.

        Example:
            >>> PromptTemplate.from_string("{text} Classify this ticket.")
            Traceback (most recent call last):
            ...
            spark_ext.exceptions.TemplateOrderError: the stable part is empty: ...
        """
        first = None
        pos = 0
        for literal, name, spec, conv in string.Formatter().parse(template):
            pos += len(literal)
            if name is not None:
                first = pos
                break
        if first is None:
            raise TemplateOrderError("the template has no {field}: nothing per-event")
        return cls(stable=template[:first], dynamic=template[first:])

    @property
    def cache_key(self) -> str:
        """Hex hash of the stable part (16 characters)."""
        return hashlib.sha256(self.stable.encode("utf-8")).hexdigest()[:16]

    def render(self, values: dict[str, object]) -> str:
        """The full prompt for one event (plain Python, for tests and the baseline)."""
        return self.stable + self.dynamic.format(**{k: "" if v is None else v
                                                    for k, v in values.items()})

    def column(self) -> Column:
        """The prompt as a Spark column expression (nulls render as empty strings)."""
        parts: list[Column] = [F.lit(self.stable)]
        for literal, name, _, _ in string.Formatter().parse(self.dynamic):
            if literal:
                parts.append(F.lit(literal))
            if name is not None:
                parts.append(F.coalesce(F.col(name).cast("string"), F.lit("")))
        return F.concat(*parts)
