"""Reading JSON-lines input files (articles, labelled examples) with errors by line.

Every bad line is reported with its number (up to :data:`MAX_REPORTED`), and
nothing is returned unless the whole file is good, so a command that reads a file
never writes half of it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from spark_ext.exceptions import InputFileError

#: Bad lines named in one error message.
MAX_REPORTED = 10

#: Checks a field's value; returns an error message or ``None``.
FieldCheck = Callable[[Any], "str | None"]


def non_empty_string(value: Any) -> str | None:
    """A check: a string with more than whitespace."""
    if not isinstance(value, str) or not value.strip():
        return "must be a non-empty string"
    return None


def one_of(*choices: str) -> FieldCheck:
    """A check: one of ``choices``."""
    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of {list(choices)}, got {value!r}"
    return check


def read_jsonl(path: str | os.PathLike[str], *, required: Mapping[str, FieldCheck],
               optional: Mapping[str, FieldCheck] | None = None, unique: str | None = None,
               what: str = "records") -> list[dict[str, Any]]:
    """All records of a JSON-lines file, each checked; blank lines are skipped.

    Args:
        path: The file.
        required: Field -> check, for fields every record must have.
        optional: Field -> check, for fields a record may have; other fields are kept.
        unique: A field whose values must not repeat.
        what: What the records are, for messages (``articles``).

    Raises:
        InputFileError: The file is missing or unreadable, has no records, or has
            lines that are not JSON objects or fail a check (with line numbers).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        ...     _ = f.write('{"id": "a", "text": "hi"}\\n\\nnot json\\n{"id": "a", "text": "ho"}\\n{"id": "b"}\\n')
        >>> read_jsonl(f.name, required={"id": non_empty_string, "text": non_empty_string},
        ...            unique="id", what="articles")
        Traceback (most recent call last):
        ...
        spark_ext.exceptions.InputFileError: ...: 3 bad lines: line 3: not a JSON object (Expecting value); line 4: id 'a' repeats line 1; line 5: missing 'text'
        >>> os.unlink(f.name)
    """
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"{p}: no such file")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputFileError(f"{p}: cannot read it: {e}") from e
    optional = optional or {}
    records: list[dict[str, Any]] = []
    errors: list[str] = []
    seen: dict[Any, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            errors.append(f"line {number}: not a JSON object ({e.msg})")
            continue
        if not isinstance(record, dict):
            errors.append(f"line {number}: not a JSON object")
            continue
        problems = [f"missing {name!r}" for name in required if name not in record]
        for name, check in [*required.items(), *optional.items()]:
            if name in record and (msg := check(record[name])):
                problems.append(f"{name} {msg}")
        if unique and unique in record and not problems:
            key = record[unique]
            if key in seen:
                problems.append(f"{unique} {key!r} repeats line {seen[key]}")
            else:
                seen[key] = number
        if problems:
            errors.append(f"line {number}: " + ", ".join(problems))
        else:
            records.append(record)
    if errors:
        more = f"; ... {len(errors) - MAX_REPORTED} more" if len(errors) > MAX_REPORTED else ""
        raise InputFileError(f"{p}: {len(errors)} bad line{'s' * (len(errors) > 1)}: "
                             + "; ".join(errors[:MAX_REPORTED]) + more)
    if not records:
        raise InputFileError(f"{p}: no {what} (the file is empty)")
    return records
