"""``NAME:KEY=VALUE,...`` workload specs: the one parser the synthetic workload kinds share.

A kind declares its keys as a frozen dataclass whose fields carry defaults and types (``int``, ``float``, ``bool``
written 0/1, or ``str``); ``parse_spec`` returns an instance, or raises ``InputError`` naming the ``workload``
field with the item that is wrong.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from ..errors import InputError

T = TypeVar("T")


def _value(kind: str, key: str, value: str, text: str) -> Any:
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "bool":
            if value not in ("0", "1", "true", "false"):
                raise ValueError
            return value in ("1", "true")
    except ValueError:
        raise InputError(f"{key}={value!r} in {text!r} is not a{'n integer' if kind == 'int' else ' number' if kind == 'float' else ' 0 or 1'}",
                         "workload") from None
    return value


def parse_spec(text: str, names: tuple[str, ...], cls: type[T]) -> T:
    """``NAME`` or ``NAME:KEY=VALUE,...`` (``NAME`` one of ``names``) as an instance of the dataclass ``cls``."""
    name, _, rest = text.partition(":")
    if name not in names:
        raise InputError(f"{text!r} is not a {' / '.join(names)} workload", "workload")
    types = {f.name: f.type if isinstance(f.type, str) else f.type.__name__ for f in fields(cls)}  # type: ignore[arg-type]
    kw: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in types:
            raise InputError(f"{item!r} in {text!r}: expected KEY=VALUE with KEY one of {', '.join(types)}", "workload")
        kw[key] = _value(types[key], key, value.strip(), text)
    return cls(**kw)


def check(text: str, checks: list[tuple[bool, str]]) -> None:
    """Raise ``InputError`` with the first failed check's message."""
    for ok, msg in checks:
        if not ok:
            raise InputError(f"{text!r}: {msg}", "workload")
