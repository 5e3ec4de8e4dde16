"""Output validation: is the model's answer fit to send?

Rules from the ``validation`` config section, applied to every ``ok`` result before it
becomes an ``llm`` (or ``backfill``) answer, in this order: length (``min_chars``,
``max_chars``), forbidden patterns (``must_not_match``, by name), personal data
(``pii``: ``email``, ``phone``, ``card``; cards are digit runs that pass the Luhn check),
and an optional JSON Schema for structured tasks. The first rule an answer breaks is
its verdict; the pipeline then answers with the fallback (``status = invalid``, the rule
in ``reason``) and puts the model's text in the ``review_queue`` table for a person.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from spark_ext.config import ValidationConfig
from spark_ext.exceptions import PipelineConfigError

#: Personal-data detectors by name.
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}")
_PHONE = re.compile(r"(?<![\w+])\+?\d[\d\s().-]{6,}\d(?!\w)")
_DATE = re.compile(r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{4}")
_CARD = re.compile(r"(?<!\d)\d(?:[ -]?\d){12,18}(?!\d)")


def luhn_ok(digits: str) -> bool:
    """Whether a digit string passes the Luhn checksum (payment card numbers do).

    Example:
        >>> luhn_ok("4111111111111111"), luhn_ok("4111111111111112")
        (True, False)
    """
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _has_card(text: str) -> bool:
    return any(luhn_ok(re.sub(r"\D", "", m.group())) for m in _CARD.finditer(text))


def _has_phone(text: str) -> bool:
    """7-15 digits written as a phone number: with a leading ``+`` or grouped by
    separators (a bare run of digits is more often an order or ticket number)."""
    for m in _PHONE.finditer(text):
        found = m.group()
        if _DATE.fullmatch(found.strip()):
            continue
        digits = re.sub(r"\D", "", found)
        if 7 <= len(digits) <= 15 and (found.startswith("+") or len(digits) < len(found)):
            return True
    return False


#: Personal-data detectors by name (the names :data:`spark_ext.config.PII_DETECTOR_NAMES`
#: lists for the config check).
PII_DETECTORS: dict[str, Callable[[str], bool]] = {
    "email": lambda text: _EMAIL.search(text) is not None,
    "phone": _has_phone,
    "card": _has_card,
}


class AnswerValidator:
    """Applies a :class:`ValidationConfig` to answer texts.

    Example:
        >>> v = AnswerValidator(ValidationConfig(must_not_match={"refund_promise": r"full refund"}))
        >>> v.check("We will look into your order today.") is None
        True
        >>> v.check("Write to jane.doe@example.com for a full refund.")
        'must_not_match:refund_promise'
        >>> v.check("Call me at +1 (415) 555-0199.")
        'pii:phone'
        >>> v.check("Your card 4111 1111 1111 1111 was charged.")
        'pii:card'
    """

    def __init__(self, config: ValidationConfig) -> None:
        self.config = config
        self._patterns = {name: re.compile(p, re.IGNORECASE)
                          for name, p in config.must_not_match.items()}
        self._schema_validator = None
        if config.json_schema is not None:
            import jsonschema

            schema = config.json_schema
            if isinstance(schema, str):
                try:
                    schema = json.loads(Path(schema).read_text(encoding="utf-8"))
                except (OSError, ValueError) as e:
                    raise PipelineConfigError(
                        f"validation.json_schema: cannot read {schema} ({e})") from None
            cls = jsonschema.validators.validator_for(schema)
            try:
                cls.check_schema(schema)
            except jsonschema.SchemaError as e:
                raise PipelineConfigError(
                    f"validation.json_schema: not a valid schema ({e.message})") from None
            self._schema_validator = cls(schema)

    @property
    def rules(self) -> list[str]:
        """Every verdict :meth:`check` can give with this config, in its order (the
        driver's metrics start each at 0).

        Example:
            >>> AnswerValidator(ValidationConfig(pii=["email"])).rules
            ['min_chars', 'max_chars', 'pii:email']
        """
        cfg = self.config
        if not cfg.enabled:
            return []
        return ["min_chars", *(["max_chars"] if cfg.max_chars is not None else []),
                *(f"must_not_match:{name}" for name in self._patterns),
                *(f"pii:{name}" for name in sorted(cfg.pii, key=lambda n: n != "card")),
                *(["json_schema"] if self._schema_validator is not None else [])]

    def check(self, text: str | None) -> str | None:
        """The first rule ``text`` breaks, or ``None`` when it may be sent."""
        cfg = self.config
        if not cfg.enabled:
            return None
        body = (text or "").strip()
        if len(body) < cfg.min_chars:
            return "min_chars"
        if cfg.max_chars is not None and len(body) > cfg.max_chars:
            return "max_chars"
        for name, pattern in self._patterns.items():
            if pattern.search(body):
                return f"must_not_match:{name}"
        # Cards before phones: a card number also looks like a long phone number.
        for name in sorted(cfg.pii, key=lambda n: n != "card"):
            if PII_DETECTORS[name](body):
                return f"pii:{name}"
        if self._schema_validator is not None:
            try:
                doc = json.loads(body)
            except ValueError:
                return "json_schema"
            if not self._schema_validator.is_valid(doc):
                return "json_schema"
        return None
