"""Typed, frozen records built from plain JSON/YAML data, and back.

Every artifact is a tree of ``@record`` dataclasses. ``from_data`` walks the
dataclass fields and their type hints, so each record states its schema once,
in its annotations:

* unknown keys and missing required keys are rejected;
* ``int``/``float``/``str``/``bool`` are checked (an ``int`` is accepted for a
  ``float``; a ``bool`` is never a number);
* ``tuple[X, ...]`` reads a list, ``dict[str, X]`` a mapping, a ``StrEnum``
  one of its values, ``X | None`` an optional value, nested records recurse;
* the record's ``__post_init__`` checks invariants and raises ``ValueError``
  with the numbers in the message; it is turned into ``InvalidArtifact``
  naming the field path.

``to_data`` is the inverse; fields equal to their default are left out so that
written files stay short, and ``from_data(to_data(r)) == r`` always holds.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from .errors import InvalidArtifact

T = TypeVar("T")


def record(cls: type[T]) -> type[T]:
    """Decorator: a frozen, keyword-only, slotted dataclass usable with ``from_data``."""
    return dataclasses.dataclass(frozen=True, kw_only=True, slots=True)(cls)


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(hint: Any) -> str:
    if hint is float:
        return "a number"
    if hint is int:
        return "an integer"
    if hint is str:
        return "a string"
    if hint is bool:
        return "true or false"
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return "a mapping"
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "a list"
    if origin is dict:
        return "a mapping"
    return str(hint)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None:
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for option in inner:
            try:
                return _convert(option, value, where)
            except InvalidArtifact as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise InvalidArtifact(f"value {_short(value)} has the wrong type", field=where)
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise InvalidArtifact(f"expected true or false, got {_short(value)}", field=where)
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise InvalidArtifact(f"expected an integer, got {_short(value)}", field=where)
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
            if not math.isfinite(value):
                raise InvalidArtifact(f"expected a finite number, got {value}", field=where)
            return value
        raise InvalidArtifact(f"expected a number, got {_short(value)}", field=where)
    if hint is str:
        if isinstance(value, str):
            return value
        raise InvalidArtifact(f"expected a string, got {_short(value)}", field=where)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            valid = ", ".join(str(m.value) for m in hint)
            raise InvalidArtifact(
                f"unknown value {_short(value)}; valid: {valid}", field=where
            ) from None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_data(hint, value, where=where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise InvalidArtifact(f"expected a list, got {_short(value)}", field=where)
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise InvalidArtifact(
                f"expected a list of {len(args)} items, got {len(value)}", field=where
            )
        return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise InvalidArtifact(f"expected a mapping, got {_short(value)}", field=where)
        key_hint, value_hint = typing.get_args(hint)
        out = {}
        for k, v in value.items():
            key = _convert(key_hint, k, where)
            out[key] = _convert(value_hint, v, f"{where}.{k}" if where else str(k))
        return out
    raise TypeError(f"records cannot hold {hint!r}")  # a programming error, not bad input


def from_data(cls: type[T], data: Any, *, where: str = "") -> T:
    """Build record ``cls`` from plain data, validating keys, types and invariants."""
    if not isinstance(data, dict):
        raise InvalidArtifact(f"expected {_type_name(cls)}, got {_short(data)}", field=where)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise InvalidArtifact(
            f"unknown key {unknown[0]!r} (valid keys: {', '.join(fields)})", field=where
        )
    hints = _hints(cls)
    kwargs = {}
    for name, field in fields.items():
        path = f"{where}.{name}" if where else name
        if name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise InvalidArtifact(f"missing required key {name!r}", field=where)
            continue
        kwargs[name] = _convert(hints[name], data[name], path)
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise InvalidArtifact(str(exc), field=where) from None
    except InvalidArtifact as exc:
        raise exc.at(prefix=where) from None


def _default_of(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_data(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {(k.value if isinstance(k, enum.Enum) else k): _plain(v) for k, v in value.items()}
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()  # a numpy scalar: YAML writes only Python's own numbers
    return value


def to_data(rec: Any) -> dict[str, Any]:
    """Plain JSON-ready data of a record; fields at their default are omitted."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(rec):
        value = getattr(rec, field.name)
        if value == _default_of(field) and field.name not in ("kind", "schema_version"):
            continue
        out[field.name] = _plain(value)
    return out


def check(condition: bool, message: str | Callable[[], str]) -> None:
    """Raise ``ValueError(message)`` unless ``condition``; used in ``__post_init__``."""
    if not condition:
        raise ValueError(message() if callable(message) else message)


def unique(items: typing.Iterable[str], what: str) -> None:
    """Raise ``ValueError`` naming the first duplicate in ``items``."""
    seen: set[str] = set()
    for item in items:
        if item in seen:
            raise ValueError(f"duplicate {what} {item!r}")
        seen.add(item)
