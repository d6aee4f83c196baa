"""Building a kind's ``Options`` dataclass from its table in the targets file."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, get_type_hints

from digest_cleanup.errors import TargetsFileError


def parse_dataclass(cls: type[Any], target: str, raw: Mapping[str, Any]) -> Any:
    """Build dataclass ``cls`` from a TOML table, naming the target and field on any error."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise TargetsFileError(
            f"targets.{target}: unknown field {', '.join(map(repr, unknown))}; "
            f"allowed fields are {', '.join(sorted(fields))}"
        )
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for name, field in fields.items():
        if name not in raw:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise TargetsFileError(f"targets.{target}: missing required field {name!r}")
            continue
        value = raw[name]
        expected = hints[name]
        if not _matches(value, expected):
            raise TargetsFileError(
                f"targets.{target}.{name}: expected {_type_name(expected)}, got {value!r}"
            )
        values[name] = value
    return cls(**values)


def _matches(value: Any, expected: Any) -> bool:
    args = getattr(expected, "__args__", None)
    if args and type(None) in args:
        return value is None or any(_matches(value, a) for a in args if a is not type(None))
    if args:  # a Literal or another union
        if getattr(expected, "__origin__", None) is not None and str(expected).startswith(
            "typing.Literal"
        ):
            return value in args
        return any(_matches(value, a) for a in args)
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, expected)


def _type_name(expected: Any) -> str:
    args = getattr(expected, "__args__", None)
    if args and str(expected).startswith("typing.Literal"):
        return "one of " + ", ".join(repr(a) for a in args)
    return getattr(expected, "__name__", str(expected))
