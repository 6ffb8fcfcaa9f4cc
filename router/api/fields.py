"""Reading a JSON request body and its fields: type and range checked, errors naming the field."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from router.api.errors import bad_request

MISSING = object()
MAX_NAMED_FIELDS = 20


def decode_json(body: bytes):
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as error:
        raise bad_request(f"the request body is not valid JSON: {error}") from None


def is_int(value) -> bool:
    # NOTE: JSON true/false arrive as bool, which Python counts as int; a flag is never a count.
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


TEXT = "valid Unicode text (no lone surrogate such as \\ud800)"
"""What is_text checks, as error messages name it."""


def is_text(value) -> bool:
    """A str that UTF-8 can encode. NOTE: JSON's escapes can spell lone surrogates ("\\ud800"), which json.loads
    accepts and the tokenizer, the chat template's output and every UTF-8 writer refuse."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def is_int_list(value) -> bool:
    """A JSON list of integers. NOTE: by exact type (JSON gives int, never a subclass; bool is not int here), in C:
    a 500-token prompt is checked in ~11 us where a call of is_int per item took ~55."""
    return isinstance(value, list) and INT_TYPE.issuperset(map(type, value))


INT_TYPE = frozenset({int})


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


def lax_bool_field(body: dict, name: str, default: bool) -> bool:
    """A boolean as pydantic's lax mode reads one (vLLM's request models): also 0/1 and their strings, "true",
    "false", "yes", "no", "on", "off", "t", "f", "y", "n" in any case (a client sending "logprobs": "true")."""
    value = read_field(body, name, default, lambda v: lax_bool(v) is not None, "a boolean")
    return lax_bool(value)


LAX_BOOL_STRINGS = {"true": True, "1": True, "yes": True, "on": True, "t": True, "y": True,
                    "false": False, "0": False, "no": False, "off": False, "f": False, "n": False}


def lax_bool(value) -> bool | None:
    if isinstance(value, bool):
        return value
    if is_int(value) and value in (0, 1):
        return bool(value)
    return LAX_BOOL_STRINGS.get(value.lower()) if isinstance(value, str) else None


def unknown_fields(body: dict, known: frozenset[str], strict: bool, prefix: str = "") -> list[str]:
    """The fields of body the router does not know, to be ignored (as vLLM does); strict: a 400 naming them.
    At most MAX_NAMED_FIELDS are named, then how many more (a 32 MiB body can hold millions)."""
    unknown = sorted(f"{prefix}{name}" for name in set(body) - known)
    more = [f"and {len(unknown) - MAX_NAMED_FIELDS} more"] if len(unknown) > MAX_NAMED_FIELDS else []
    if unknown and strict:
        names = ", ".join([shorten(name) for name in unknown[:MAX_NAMED_FIELDS]] + more)
        raise bad_request(f"unknown field(s): {names}", param=shorten(unknown[0], quote=False))
    return [shorten(name, quote=False) for name in unknown[:MAX_NAMED_FIELDS]] + more


def shorten(value, limit: int = 60, quote: bool = True) -> str:
    """repr(value) (quote=False: a str as itself), cut at limit characters."""
    text = value if isinstance(value, str) and not quote else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
