"""Reading one field of a JSON request body: type and range checked, errors naming the field."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from router.errors import bad_request

MISSING = object()


def is_int(value) -> bool:
    # NOTE: JSON true/false arrive as bool, which Python counts as int; a flag is never a count.
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def is_int_list(value) -> bool:
    return isinstance(value, list) and all(is_int(item) for item in value)


def read_field(body: dict, name: str, default: Any, is_valid: Callable[[Any], bool], expected: str) -> Any:
    """body[name] if valid, default when absent or null; else a 400 "'name' must be <expected>"."""
    value = body.get(name)
    if value is None:
        return default
    if not is_valid(value):
        raise bad_request(f"'{name}' must be {expected}, got {shorten(value)}", param=name)
    return value


def int_field(body: dict, name: str, default: Any, low: int, high: int | None = None) -> Any:
    def in_range(v) -> bool:
        return is_int(v) and v >= low and (high is None or v <= high)
    expected = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    return read_field(body, name, default, in_range, expected)


def bool_field(body: dict, name: str, default: bool) -> bool:
    return read_field(body, name, default, lambda v: isinstance(v, bool), "a boolean")


def only_value_field(body: dict, name: str, allowed: str, is_allowed: Callable[[Any], bool]) -> None:
    """Fields the router accepts for compatibility but supports in one setting only (n=1, echo=false, ...)."""
    read_field(body, name, None, is_allowed, f"{allowed} (the only supported value)")


def unknown_fields(body: dict, known: frozenset[str], strict: bool, prefix: str = "") -> list[str]:
    """The fields of body the router does not know, to be ignored (as vLLM does); strict: a 400 naming them."""
    unknown = sorted(f"{prefix}{name}" for name in set(body) - known)
    if unknown and strict:
        names = ", ".join(f"'{name}'" for name in unknown)
        raise bad_request(f"unknown field(s): {names}", param=unknown[0])
    return unknown


def shorten(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
