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
    """Load one YAML document."""
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


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
        names = {f.name for f in dataclasses.fields(section_cls)}
        if extra := set(values) - names:
            raise error(f"unknown keys in {what} section {name!r}: {sorted(extra)}")
        built[name] = section_cls(**values)
    return built
