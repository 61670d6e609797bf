"""Words for a record the codec refused: msgspec's reason, at the path in the record's own terms.

msgspec names the rule that failed and where (``$.data.records[3].loss``; ``[...]`` for a
map's value, ``key`` for a map's key). This module turns the place into a path
(``data.scalars.my_metric``: the offending key found by converting the map's items with their
declared type) and keeps
msgspec's wording except where the declared type says more than msgspec can: the schema version
and the known kinds, a number that may be spelled "NaN", "Infinity" or "-Infinity", a finite
number, a value out of an enumeration, a bad metric name. It runs only for refused records.
"""

from __future__ import annotations

import math
import re
import types
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

import msgspec

from steplens.schema.kinds import (
    ENVELOPES,
    MAX_NAME_LEN,
    NAN_NAMES,
    SCHEMA_VERSION,
    FNum,
    MetricName,
    Num,
    WireRecord,
)
from steplens.schema.record import DecodeError

_SEGMENT: Final = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_FIELD: Final = re.compile(r"^Object (missing required|contains unknown) field `([^`]*)`")
_UNIONS: Final = (Union, types.UnionType)
_JSON_TYPE: Final = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    list: "array",
}  # msgspec's


class _Place:
    """Where the walk along msgspec's path is: the value there and its declared type."""

    def __init__(self, value: Any) -> None:
        self.value, self.path = value, ""
        self.type: Any = WireRecord

    def enter(self, name: str) -> None:
        self.path = f"{self.path}.{name}" if self.path else name
        if self.type is WireRecord and isinstance(self.value, dict):  # the kind picks the type
            kind = self.value.get("kind")
            self.type = ENVELOPES.get(kind) if isinstance(kind, str) else None
        struct = _bare(self.type)
        declared = {}
        if isinstance(struct, type) and issubclass(struct, msgspec.Struct):
            declared = {f.name: f.type for f in msgspec.structs.fields(struct)}
        self.value = self.value.get(name) if isinstance(self.value, dict) else None
        self.type = declared.get(name)

    def index(self, i: int) -> None:
        self.path = f"{self.path}[{i}]"
        ok = isinstance(self.value, list) and i < len(self.value)
        self.value = self.value[i] if ok else None
        self.type = _args(self.type, list)[0]

    def bad_item(self, key_error: bool) -> None:
        """Resolve ``[...]``: the first key (or value) of this map its declared type refuses."""
        key_type, value_type = _args(self.type, dict)
        for k, v in self.value.items() if isinstance(self.value, dict) else ():
            if key_error and not _fits(k, key_type):
                self.type, self.value = key_type, k  # the path stays the map's
                return
            if not key_error and not _fits(v, value_type):
                self.path = f"{self.path}.{k}"
                self.type, self.value = value_type, v
                return
        self.type = key_type if key_error else value_type


def explain(obj: Any, message: str, raw_prefix: bytes) -> DecodeError:
    """The DecodeError for msgspec's ``message`` about ``obj`` (the parsed record)."""
    text, _, where = message.partition(" - at `")
    where = where.rstrip("`")
    key_error = where.startswith("key` in `")
    if key_error:
        where = where[len("key` in `") :]
    place = _Place(obj)
    for m in _SEGMENT.finditer(where):
        name, index = m.groups()
        if name is not None:
            place.enter(name)
        elif index != "...":
            place.index(int(index))
        else:
            place.bad_item(key_error=False)
    if key_error:
        place.bad_item(key_error=True)
    field = _FIELD.match(text)
    if field is not None:
        place.enter(field.group(2))
        missing = field.group(1) == "missing required"
        return DecodeError(
            f"{'missing required' if missing else 'unknown'} field", place.path, raw_prefix
        )
    return DecodeError(_reason(text, place), place.path, raw_prefix)


def _reason(text: str, place: _Place) -> str:
    value, typ, path = place.value, place.type, place.path
    if path == "v":
        return f"unsupported schema version {value!r} (this decoder reads {SCHEMA_VERSION})"
    if path == "kind":  # the tag: msgspec's JSON decoder names no type it got
        if isinstance(value, str):
            return f"unknown kind {value!r} (known: {', '.join(ENVELOPES)})"
        return f"expected `str`, got `{_json_type(value)}`"
    if typ is not None and _bare(typ) == MetricName:
        return (
            f"bad metric name {str(value)[:40]!r}: must be 1 to {MAX_NAME_LEN} characters, "
            "no control characters"
        )
    if typ is not None and _bare(typ) == Num:
        return f'expected a number, "NaN", "Infinity" or "-Infinity", got `{_json_type(value)}`'
    nonfinite = value in NAN_NAMES or (isinstance(value, float) and not math.isfinite(value))
    if typ is not None and _bare(typ) == _bare(FNum) and nonfinite:
        return "non-finite value not allowed here"
    if typ is not None and get_origin(_bare(typ)) is Literal and text.startswith("Invalid"):
        return f"expected one of {get_args(_bare(typ))}, got {value!r}"
    return text[0].lower() + text[1:]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return _JSON_TYPE.get(type(value), "object")


def _fits(value: Any, typ: Any) -> bool:
    try:
        msgspec.convert(value, typ)
    except msgspec.ValidationError:
        return False
    return True


def _bare(t: Any) -> Any:
    """``t`` without ``None`` (null reads as absent) and, unless it is a leaf, its constraints."""
    if get_origin(t) in _UNIONS and type(None) in get_args(t):
        rest = tuple(a for a in get_args(t) if a is not type(None))
        t = rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007 - built at run time
    if get_origin(t) is Annotated and get_origin(get_args(t)[0]) in (list, dict):
        t = get_args(t)[0]
    return t


def _args(t: Any, container: type) -> tuple[Any, ...]:
    """The item types of ``t`` when it is a ``container`` (list or dict), else Nones."""
    t = _bare(t)
    if get_origin(t) is container:
        return get_args(t)
    return (None, None)
