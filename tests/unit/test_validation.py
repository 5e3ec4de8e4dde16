"""Output validation rules, one by one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_ext.config import PipelineConfig
from spark_ext.exceptions import PipelineConfigError
from spark_ext.l4.validation import AnswerValidator, ValidationConfig, luhn_ok


def _check(text: str, **cfg) -> str | None:
    return AnswerValidator(ValidationConfig(**cfg)).check(text)


def test_length_rules() -> None:
    assert _check("   ") == "min_chars"
    assert _check("ok", min_chars=5) == "min_chars"
    assert _check("x" * 2001) == "max_chars"
    assert _check("x" * 50, max_chars=None) is None
    assert _check("Thanks, we are on it.") is None


def test_must_not_match_names_the_rule_and_ignores_case() -> None:
    rules = {"legal_advice": r"\bsue\b", "refund_promise": r"full refund"}
    assert _check("You should SUE them.", must_not_match=rules) == "must_not_match:legal_advice"
    assert _check("A Full Refund is on its way.", must_not_match=rules) == \
        "must_not_match:refund_promise"
    assert _check("We issued a partial credit.", must_not_match=rules) is None


@pytest.mark.parametrize(("text", "verdict"), [
    ("Mail us at help.desk+tickets@example.co.uk today.", "pii:email"),
    ("Call +1 (415) 555-0199 any time.", "pii:phone"),
    ("Our line is 020 7946 0958.", "pii:phone"),
    ("Card 4111 1111 1111 1111 was charged.", "pii:card"),
    ("Card 4111-1111-1111-1111 was charged.", "pii:card"),
    ("Order 4111111111111112 shipped.", None),      # 16 digits, fails Luhn: not a card
    ("Order 12345678 shipped on 2026-11-30.", None),  # an order id and a date
])
def test_personal_data_detectors(text: str, verdict: str | None) -> None:
    assert _check(text) == verdict


def test_detectors_can_be_chosen() -> None:
    assert _check("Mail a@b.example", pii=["phone", "card"]) is None
    with pytest.raises(PipelineConfigError, match="unknown detectors"):
        ValidationConfig(pii=["passport"])


def test_luhn() -> None:
    assert luhn_ok("79927398713") and not luhn_ok("79927398710")


def test_json_schema(tmp_path: Path) -> None:
    schema = {"type": "object", "required": ["category"],
              "properties": {"category": {"enum": ["billing", "shipping"]}}}
    assert _check('{"category": "billing"}', json_schema=schema) is None
    assert _check('{"category": "weather"}', json_schema=schema) == "json_schema"
    assert _check("not json", json_schema=schema) == "json_schema"
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    assert _check('{"category": "shipping"}', json_schema=str(path)) is None


def test_config_mistakes_are_one_line_errors() -> None:
    with pytest.raises(PipelineConfigError, match="bad regular expression"):
        ValidationConfig(must_not_match={"broken": "("})
    with pytest.raises(PipelineConfigError, match="min_chars <= max_chars"):
        ValidationConfig(min_chars=10, max_chars=5)
    with pytest.raises(PipelineConfigError, match="not a valid schema"):
        AnswerValidator(ValidationConfig(json_schema={"type": "no-such-type"}))


def test_disabled_and_in_the_pipeline_config() -> None:
    assert _check("a@b.example", enabled=False) is None
    cfg = PipelineConfig.from_dict({"validation": {"max_chars": 100, "pii": ["email"]}})
    assert cfg.validation.max_chars == 100 and cfg.validation.pii == ["email"]
