"""One InfluxDB point as it is built: names checked, field types kept stable, fields that a
sink may still leave out (see ``PointBuilder``).

Line protocol cannot carry a backslash or a control character (newline, tab, ...) in a tag
value, tag key or field key unchanged, so such names are refused (``UnwritableRecord``).
Non-finite numbers are stored as a string field ``<name>_nonfinite``.
"""

from __future__ import annotations

import functools
import json
import math
import unicodedata
from typing import Any, Final

from influxdb_client import Point, WritePrecision

from steplens.schema import Record
from steplens.schema.store_layout import nonfinite

MAX_STRING_FIELD: Final = 60_000  # InfluxDB caps string fields at 64 KiB


class UnwritableRecord(ValueError):
    """The record cannot be represented as line protocol; the message is the reason."""


def _nonfinite_name(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


@functools.lru_cache(maxsize=65536)
def _name_problem(value: str) -> str | None:
    if "\\" in value:
        return "contains a backslash"
    for ch in value:
        if unicodedata.category(ch) == "Cc":
            return f"contains control character {ch!r}"
    return None


def check_name(value: str, what: str) -> str:
    """Reject names line protocol would alter: backslashes and control characters."""
    problem = _name_problem(value)
    if problem is not None:
        raise UnwritableRecord(f"{what} {value[:80]!r} {problem}")
    return value


class PointBuilder:
    """One point: checks every name, keeps field types stable per field name.

    The point is built as it goes, and its tags and fields are kept as dicts too, so a sink
    can see the names and leave fields out (the name limits, ``drop``) before the line is made:
    only then is the point built again from the dicts. ``name_tag``: the tag whose values are
    metric names (``step_window``'s ``metric``), limited like field keys."""

    __slots__ = ("_point", "_rebuild", "fields", "measurement", "name_tag", "tags", "time_ns")

    def __init__(self, measurement: str, rec: Record, name_tag: str | None = None) -> None:
        self.measurement = measurement
        self.time_ns = rec.time_ns
        self.name_tag = name_tag
        self.tags: dict[str, str] = {}
        self.fields: dict[str, Any] = {"seq": rec.seq}
        self._point = Point(measurement).field("seq", rec.seq)
        self._rebuild = False

    def drop(self, key: str) -> None:
        """Leave field ``key`` out of the point."""
        del self.fields[key]
        self._rebuild = True

    def point(self) -> Point:
        if self._rebuild:
            self._point = Point(self.measurement)
            for key, value in self.tags.items():
                self._point.tag(key, value)
            for key, value in self.fields.items():
                self._point.field(key, value)
            self._rebuild = False
        return self._point.time(self.time_ns, WritePrecision.NS)

    def line(self) -> str:
        return str(self.point().to_line_protocol())

    def tag(self, key: str, value: Any) -> PointBuilder:
        if value is None or value == "":
            return self
        key, text = check_name(key, "tag key"), check_name(str(value), f"tag {key}")
        self.tags[key] = text
        self._point.tag(key, text)
        return self

    def _field(self, key: str, value: Any) -> None:
        self.fields[key] = value
        self._point.field(key, value)

    def num(self, key: str, value: Any) -> PointBuilder:
        """A float field; non-finite values go to ``<key>_nonfinite``."""
        if value is None:
            return self
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UnwritableRecord(f"field {key[:80]!r} is not a number: {value!r:.80}")
        check_name(key, "field key")
        f = float(value)
        if math.isfinite(f):
            self._field(key, f)
        else:
            self._field(nonfinite(key), _nonfinite_name(f))
        return self

    def integer(self, key: str, value: Any) -> PointBuilder:
        if value is None:
            return self
        if isinstance(value, bool) or not isinstance(value, int):
            raise UnwritableRecord(f"field {key[:80]!r} is not an integer: {value!r:.80}")
        self._field(check_name(key, "field key"), value)
        return self

    def text(self, key: str, value: Any) -> PointBuilder:
        if value is None:
            return self
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        self._field(check_name(key, "field key"), text[:MAX_STRING_FIELD])
        return self

    def flag(self, key: str, value: Any) -> PointBuilder:
        if value is None:
            return self
        self._field(check_name(key, "field key"), bool(value))
        return self

    def any(self, key: str, value: Any) -> PointBuilder:
        """Free-form scalar: numbers as floats (stable type), text, booleans."""
        if isinstance(value, bool):
            return self.flag(key, value)
        if isinstance(value, (int, float)):
            return self.num(key, value)
        return self.text(key, value)
