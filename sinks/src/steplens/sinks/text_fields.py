"""The fields of the hot bucket that are not numbers, per measurement: the rollups leave them
out by name.

InfluxDB's storage engine types a field per measurement and shard, and refuses to aggregate
a text or boolean field in a query whose range touches a shard where it is one, even where
the series or the minute asked holds none of it. A rollup therefore names the fields to
leave out. They are learnt from the hot bucket once (the last value of every field, a scan
that the rollup used to make on every run) and then from every point the sink writes; a
rollup that still meets one (written by another sink) marks the set stale, and the next run
scans again.

Bounded: at most ``max_fields`` names in all (each a field key the sink's name limits
admitted); past it a name is counted (``overflow``) and not kept: a rollup run that meets it
fails and is counted, a case the name limits keep far away.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime

from influxdb_client import QueryApi

from steplens.schema.flux_literals import flux_string, flux_time
from steplens.schema.store_layout import SEQ
from steplens.sinks.point_builder import PointBuilder
from steplens.sinks.settings import InfluxSettings

MAX_FIELDS = 10_000


def _numeric(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class TextFields:
    def __init__(self, max_fields: int = MAX_FIELDS) -> None:
        self.max_fields = max_fields
        self.overflow = 0
        self.scans = 0
        self._by: dict[str, set[str]] = {}
        self._n = 0
        self._stale = True
        self._lock = threading.Lock()

    def add(self, measurement: str, field: str) -> None:
        with self._lock:
            names = self._by.setdefault(measurement, set())
            if field in names:
                return
            if self._n >= self.max_fields:
                self.overflow += 1
                return
            names.add(field)
            self._n += 1

    def observe(self, builders: Iterable[PointBuilder]) -> None:
        """The non-numeric fields of points about to be written."""
        for b in builders:
            for key, value in b.fields.items():
                if not _numeric(value) and key not in self._by.get(b.measurement, ()):
                    self.add(b.measurement, key)

    def count(self) -> int:
        return self._n

    def mark_stale(self) -> None:
        self._stale = True

    def scan_if_stale(
        self,
        query_api: QueryApi,
        s: InfluxSettings,
        around: tuple[datetime, datetime] | None = None,
    ) -> bool:
        """Learn the hot bucket's non-numeric fields when the set is stale; True if it did.
        ``around``: a past range to roll up (a backfill): the shards it touches are scanned
        (a week either side: the longest shard group), else the hot window."""
        if not self._stale:
            return False
        if around is None:
            span = f"start: -{max(s.hot_retention_s, 60) + 3600}s"
        else:
            first, last = (flux_time(t) for t in around)
            span = f"start: date.sub(d: 7d, from: {first}), stop: date.add(d: 7d, to: {last})"
        flux = f"""import "types"
import "date"
from(bucket: {flux_string(s.bucket)})
    |> range({span})
    |> filter(fn: (r) => r._field != {flux_string(SEQ)})
    |> last()
    |> filter(fn: (r) => not types.isNumeric(v: r._value))
    |> keep(columns: ["_measurement", "_field"])
    |> group(columns: ["_measurement"])
    |> unique(column: "_field")
"""
        found = [
            (str(r.values["_measurement"]), str(r.values["_field"]))
            for table in query_api.query(flux, org=s.org)
            for r in table.records
        ]
        for measurement, field in found:
            self.add(measurement, field)
        self._stale = False
        self.scans += 1
        return True

    def flux_dict(self) -> str:
        """A Flux dictionary: measurement -> a regular expression of its non-numeric fields."""
        with self._lock:
            items = sorted((m, sorted(f)) for m, f in self._by.items() if f)
        if not items:
            return '["": "^$"]'
        return (
            "["
            + ", ".join(f"{flux_string(m)}: {flux_string(_pattern(fields))}" for m, fields in items)
            + "]"
        )


def _pattern(fields: list[str]) -> str:
    import re

    return "^(" + "|".join(re.escape(f) for f in fields) + ")$"
