"""Numeric query parameters of the UI's API, parsed and bounded in one place.

Every number a request carries is a user's: it is parsed from at most MAX_PARAM_CHARS
characters, refused when it is not a finite number (`inf`, `nan`, `1e999`), and clamped into
the range the handler can use, so no request number sizes a structure or overflows numpy.
A list of ids is de-duplicated and capped the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

MAX_PARAM_CHARS = 64
MAX_LIST_PARAM_CHARS = 16_384
NS_LIMIT = 1 << 62  # a time in ns, either side of the profile's origin: fits int64 with room


class ParameterError(ValueError):
    """A query parameter the request got wrong (a 400)."""


def _raw(query: Mapping[str, str], name: str, limit: int) -> str:
    value = query.get(name)
    if value is None or value == "":
        raise ParameterError(f"missing query parameter {name!r}")
    if len(value) > limit:
        raise ParameterError(f"{name} is longer than {limit} characters")
    return value


def _number(text: str, name: str) -> float:
    try:
        number = float(text)
    except ValueError as exc:
        raise ParameterError(f"{name} must be a number") from exc
    if not math.isfinite(number):
        raise ParameterError(f"{name} must be a finite number")
    return number


def clamped_int(query: Mapping[str, str], name: str, *, low: int, high: int) -> int:
    """Parameter `name` as an integer in [low, high] (out-of-range values are clamped)."""
    number = _number(_raw(query, name, MAX_PARAM_CHARS), name)
    return int(min(max(number, low), high))


def int_set(
    query: Mapping[str, str], name: str, *, low: int, high: int, max_items: int
) -> list[int]:
    """Parameter `name` as comma-separated integers: de-duplicated in first-seen order, those
    outside [low, high] dropped; more than `max_items` distinct ones is refused."""
    value = query.get(name) or ""
    if len(value) > MAX_LIST_PARAM_CHARS:
        raise ParameterError(f"{name} is longer than {MAX_LIST_PARAM_CHARS} characters")
    seen: dict[int, None] = {}
    for part in value.split(","):
        if not part:
            continue
        text = part.strip()
        digits = text[1:] if text.startswith("-") else text
        if len(text) > MAX_PARAM_CHARS or not (digits.isascii() and digits.isdigit()):
            raise ParameterError(f"{name} must be comma-separated integers")
        item = int(text)
        if low <= item <= high:
            seen[item] = None
            if len(seen) > max_items:
                raise ParameterError(f"{name}: at most {max_items} distinct values")
    return list(seen)
