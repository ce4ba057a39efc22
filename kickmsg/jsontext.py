"""The one way this package writes JSON: strict JSON that any parser reads.

JSON has no numbers for NaN and the infinities, and Python's ``json``
writes them as the bare words ``NaN``, ``Infinity`` and ``-Infinity``,
which strict parsers (JavaScript's ``JSON.parse``, ``jq``) reject. Here a
non-finite float is written as the *string* ``"NaN"``, ``"Infinity"`` or
``"-Infinity"`` (as MCAP recordings have always done), and
``allow_nan=False`` guards the rest: a value that would still need a bare
word is a ValueError, never invalid output.
"""
import json
import math
from collections.abc import Callable
from typing import Any

__all__ = ["NON_FINITE", "dumps", "finite", "number"]

NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}  # the strings -> the floats


def number(value: float) -> float | str:
    """A float as JSON data: itself if finite, else ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


def finite(data: Any) -> Any:
    """``data`` with every non-finite float (in dicts, lists and tuples) replaced by its string."""
    if isinstance(data, float):
        return number(data)
    if isinstance(data, dict):
        return {key: finite(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(value) for value in data]
    return data


def dumps(data: Any, indent: int | None = None, separators: tuple[str, str] | None = None,
          default: Callable[[Any], Any] | None = None) -> str:
    """``json.dumps`` of ``data`` as strict JSON (see the module's docstring);
    ``default`` turns what json does not know into JSON data."""
    return json.dumps(finite(data), indent=indent, separators=separators, default=default, allow_nan=False)
