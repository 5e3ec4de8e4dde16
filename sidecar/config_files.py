"""Loading YAML config files into dataclasses: one section per dataclass.

Shared by the sidecar's config and the pipeline's, so both report unknown
sections and keys the same way.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import yaml


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Load one YAML document holding a mapping (``None`` for an empty file).

    Raises:
        ValueError: one line, ``<what> (<path>[, line N])``: the file is missing or
            unreadable, is not YAML, or does not hold a mapping.

    Example:
        >>> read_yaml("/no/such/sidecar.yaml")
        Traceback (most recent call last):
        ...
        ValueError: config file not found (/no/such/sidecar.yaml)
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ValueError(f"config file not found ({path})") from None
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"cannot read the config file: {why} ({path})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        where = f"{path}, line {mark.line + 1}" if mark is not None else str(path)
        raise ValueError(f"config file is not valid YAML: {problem} ({where})") from None
    if data is not None and not isinstance(data, dict):
        raise ValueError(f"config file must hold a mapping of sections, not a "
                         f"{type(data).__name__} ({path})")
    return data


def as_dataclass(cls: type, value: Any, where: str, base: Any = None) -> Any:
    """Accept an instance of ``cls`` or a mapping of its fields (from YAML); fields
    missing from the mapping come from ``base`` (else the class defaults)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a mapping, got {type(value).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    if extra := set(value) - names:
        raise ValueError(f"unknown keys in {where}: {sorted(extra)}")
    merged = dataclasses.asdict(base) if base is not None else {}
    return cls(**(merged | value))


def build_sections(sections: dict[str, type], data: dict[str, Any] | None, *, what: str,
                   error: type[Exception] = ValueError) -> dict[str, Any]:
    """Instantiate one dataclass per section from a nested mapping.

    Unknown sections and unknown keys raise ``error`` naming them; missing
    sections get their defaults.
    """
    data = dict(data or {})
    if unknown := set(data) - set(sections):
        raise error(f"unknown {what} sections: {sorted(unknown)}")
    built = {}
    for name, section_cls in sections.items():
        values = data.get(name) or {}
        if not isinstance(values, dict):
            raise error(f"{what} section {name!r} must be a mapping, got "
                        f"{type(values).__name__}")
        names = {f.name for f in dataclasses.fields(section_cls)}
        if extra := set(values) - names:
            raise error(f"unknown keys in {what} section {name!r}: {sorted(extra)}")
        try:
            built[name] = section_cls(**values)
        except (TypeError, AttributeError) as e:  # a value of the wrong type
            raise error(f"bad value in {what} section {name!r}: {e}") from None
    return built
