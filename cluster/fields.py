"""Type-checked reads of JSON fields, shared by the two readers of the border (convert.py for the
scheduling path, kinds.py for every other object): every wrong type becomes a
:class:`MalformedObject` naming the field — an :class:`~solver.InvalidInput` too, so the
scheduling path's callers catch it as they always did."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from solver import InvalidInput


class MalformedObject(InvalidInput):
    """An API object whose field has the wrong type; the message names the object and the field."""


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    if type(value) is dict:  # what JSON decodes to; the isinstance check below costs ten times this
        return value
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    raise MalformedObject(f"{where} must be an object, got {type(value).__name__}")


def items(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    raise MalformedObject(f"{where} must be a list, got {type(value).__name__}")


def text(value: Any, where: str, required: bool = False) -> str:
    if value is None or value == "":
        if required:
            raise MalformedObject(f"{where} must be a non-empty string")
        return ""
    if not isinstance(value, str):
        raise MalformedObject(f"{where} must be a string, got {value!r}")
    return value


def string_map(value: Any, where: str) -> dict[str, str]:
    out = {}
    for key, value_ in mapping(value, where).items():
        if not isinstance(key, str) or not isinstance(value_, str):
            raise MalformedObject(f"{where} must map strings to strings, got {key!r}: {value_!r}")
        out[key] = value_
    return out
