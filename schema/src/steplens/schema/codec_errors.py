"""Words for a record the codec refused: the field path and a reason a person can act on.

msgspec names the rule that failed and where (``$.data.records[3].loss``, ``[...]`` for a map
value, ``key`` for a map key). This module turns that into the path in the record's own terms
(``data.scalars.my_metric``) and a reason phrased from the schema's tables and the offending
value. It runs only for refused records, so it may take its time.
"""

from __future__ import annotations

import re
from typing import Any, Final

from steplens.schema.tables import (
    ALERT_STATES,
    BOOL,
    ENVELOPE,
    FNUM,
    INT,
    INT_LIST,
    INT_MAP,
    KINDS,
    MAX_BATCH_ENTRIES,
    MAX_LIST_LEN,
    MAX_NAME_LEN,
    MAX_STR_LEN,
    NUM,
    NUM_LIST,
    NUM_MAP,
    OBJ,
    OBJ_LIST,
    SCHEMA_VERSION,
    SEVERITIES,
    STEP_ENTRIES,
    STEP_ENTRY,
    STR,
    STR_LIST,
    DecodeError,
    Field,
    valid_name,
)

_SEGMENT: Final = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_ENTRY_TABLE: Final = "a step_batch entry"
_I64_MAX: Final = (1 << 63) - 1
_NAMES: Final = ("NaN", "Infinity", "-Infinity")
_MAP_VALUE: Final = {NUM_MAP: NUM, INT_MAP: INT}
_OBJECT: Final = "object"  # an item that must be an object
_ITEM: Final = {
    STR_LIST: STR,
    NUM_LIST: NUM,
    INT_LIST: INT,
    OBJ_LIST: _OBJECT,
    STEP_ENTRIES: _OBJECT,
}


def _type_name(value: Any) -> str:
    return type(value).__name__


class _Place:
    """Where the walk along a path is: the value, its field spec, the table it belongs to."""

    def __init__(self, value: Any, spec: Field | None, table: dict[str, Field], what: str):
        self.value, self.spec, self.table, self.what = value, spec, table, what
        self.path = ""

    def enter(self, name: str, value: Any, spec: Field | None) -> None:
        self.path = f"{self.path}.{name}" if self.path else name
        self.value, self.spec = value, spec

    def index(self, i: int) -> None:
        self.path = f"{self.path}[{i}]"
        self.value = self.value[i] if isinstance(self.value, list) else None
        typ = self.spec.type if self.spec is not None else None
        if typ == STEP_ENTRIES:
            self.table, self.what = STEP_ENTRY, _ENTRY_TABLE
        self.spec = Field(_ITEM[typ]) if typ in _ITEM else None


def explain(obj: Any, message: str, raw_prefix: bytes) -> DecodeError:
    """The DecodeError for msgspec's ``message`` about ``obj`` (the parsed record)."""
    text, _, where = message.partition(" - at `")
    where = where.rstrip("`")
    key_error = where.startswith("key` in `")
    if key_error:
        where = where[len("key` in `") :]
    if not isinstance(obj, dict):
        return DecodeError(f"expected a JSON object, got {_type_name(obj)}", "", raw_prefix)
    place = _Place(obj, None, ENVELOPE, "envelope")
    for m in _SEGMENT.finditer(where):
        name, index = m.groups()
        if name is not None:
            if name == "data" and place.table is ENVELOPE:
                kind = obj.get("kind")
                place.enter("data", obj.get("data"), ENVELOPE["data"])
                place.table = KINDS.get(kind, {}) if isinstance(kind, str) else {}
                place.what = f"kind {kind!r}"
            else:
                place.enter(name, place.value.get(name), place.table.get(name))
        elif index != "...":
            place.index(int(index))
        else:
            _find_bad_item(place, key_error)
    if key_error:
        return DecodeError(_key_reason(text, place), place.path, raw_prefix)
    field_m = re.search(r"(missing required|contains unknown) field `([^`]*)`", text)
    if field_m is not None:
        missing = field_m.group(1) == "missing required"
        name = field_m.group(2)
        place.enter(name, None, place.table.get(name))
        return DecodeError(_field_reason(missing, place, name), place.path, raw_prefix)
    return DecodeError(_value_reason(text, place), place.path, raw_prefix)


def _find_bad_item(place: _Place, key_error: bool) -> None:
    """Resolve ``[...]`` (a map's value or key) to the first item that breaks the rule."""
    items = place.value.items() if isinstance(place.value, dict) else ()
    spec = place.spec
    inner = _MAP_VALUE.get(spec.type) if spec is not None else None
    for k, v in items:
        if key_error:
            bad = not (valid_name(k) if spec is not None and spec.names else len(k) <= MAX_STR_LEN)
        elif inner is not None:
            bad = _check_scalar(v, inner) is not None
        else:  # an object in a list[obj]: its values must be scalars
            bad = isinstance(v, (dict, list))
        if bad:
            if key_error:
                place.value = k  # the offending name, for the reason; the path is the map's
                return
            place.enter(k, v, Field(inner) if inner else Field("flat-value"))
            return


def _key_reason(text: str, place: _Place) -> str:
    if place.spec is not None and place.spec.names:
        return (
            f"bad metric name {str(place.value)[:40]!r}: must be 1 to {MAX_NAME_LEN} characters, "
            "no control characters"
        )
    if "length <=" in text:
        return "key too long"
    return text[0].lower() + text[1:]


def _field_reason(missing: bool, place: _Place, name: str) -> str:
    if place.table is ENVELOPE:
        if missing and name == "v":
            return f"unsupported schema version None (this decoder reads {SCHEMA_VERSION})"
        return "missing required field" if missing else f"unknown envelope field(s) [{name!r}]"
    return f"{'missing required' if missing else 'unknown'} field for {place.what}"


def _check_scalar(value: Any, typ: str) -> str | None:
    """The reason a value does not fit a scalar type (or None when it does)."""
    if typ in (NUM, FNUM):
        if isinstance(value, bool):
            return "expected a number, got a boolean"
        if isinstance(value, str) and value in _NAMES:
            return "non-finite value not allowed here" if typ == FNUM else None
        if not isinstance(value, (int, float)):
            return f"expected a number, got {_type_name(value)}"
        if typ == FNUM and value - value != 0:  # NaN or an infinity
            return "non-finite value not allowed here"
        return None
    if typ == INT:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer, got {_type_name(value)}"
        if abs(value) > _I64_MAX:
            return "integer out of range (64-bit signed)"
        return None
    if typ == STR:
        if not isinstance(value, str):
            return f"expected a string, got {_type_name(value)}"
        return f"string longer than {MAX_STR_LEN} characters" if len(value) > MAX_STR_LEN else None
    if typ == BOOL:
        return None if isinstance(value, bool) else f"expected a boolean, got {_type_name(value)}"
    return None


def _value_reason(text: str, place: _Place) -> str:
    value, spec, path = place.value, place.spec, place.path
    if path == "v":
        return f"unsupported schema version {value!r} (this decoder reads {SCHEMA_VERSION})"
    if path == "kind" and isinstance(value, str):
        return f"unknown kind {value!r} (known: {', '.join(KINDS)})"
    if path == "data.severity":
        return f"severity must be one of {SEVERITIES}"
    if path == "data.state":
        return f"state must be one of {ALERT_STATES}"
    if spec is None:
        if path == "" and "got" in text:
            return f"expected a JSON object, got {text.rsplit('`', 2)[-2]}"
        return text[0].lower() + text[1:]
    if value is None and spec.required:
        return f"missing required field for {place.what}"
    typ = spec.type
    reason = _check_scalar(value, typ)
    if reason is not None:
        return reason
    if typ in (INT, STR) and spec.low is not None:
        if typ == STR:
            return "must not be empty"
        if path == "rank":
            return f"must be >= {spec.low} ({spec.low}: the whole run)"
        return f"must be >= {spec.low}"
    if typ == STEP_ENTRIES:
        if not isinstance(value, list):
            return f"expected a list, got {_type_name(value)}"
        return f"expected 1 to {MAX_BATCH_ENTRIES} entries, got {len(value)}"
    if typ == "flat-value":
        return "nested values not allowed here"
    if typ in (OBJ, NUM_MAP, INT_MAP, _OBJECT, "payload") and not isinstance(value, dict):
        return f"expected an object, got {_type_name(value)}"
    if typ.startswith("list"):
        if not isinstance(value, list):
            return f"expected a list, got {_type_name(value)}"
        if len(value) > MAX_LIST_LEN:
            return f"list longer than {MAX_LIST_LEN}"
    if "out of range" in text:
        return "number out of range"
    return text[0].lower() + text[1:]
