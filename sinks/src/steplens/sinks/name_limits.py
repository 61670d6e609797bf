"""Limits on distinct metric names in InfluxDB: per run and per measurement.

InfluxDB keeps every field key of a measurement in the index of each shard it appears in, and
its housekeeping of a shard grows with them: 200,000 new field keys from one broken producer
once grew influxd to 23.5 GB. Names here are field keys, and for ``step_window`` the values of
its ``metric`` tag (a series each).

A new name is admitted while its run has fewer than ``per_run`` names in that measurement and
the measurement fewer than ``per_measurement`` names in the hot bucket. The measurement's names
are read from InfluxDB when first needed (so a restarted sink respects the limit) and read
again, at most every ``refresh_s``, while the limit is reached (the retention drops old ones).
A run's names are this process's memory of the last ``tracked_runs`` runs it wrote, so after a
restart a run may add up to ``per_run`` names again, still within ``per_measurement``. Several
sink processes each admit up to the limit between their reads.

Names over a limit are left out of the point (a ``step_window`` point whose metric is over the
limit is left out whole); the sink stores the rest of the record and dead-letters it with the
names it left out.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from steplens.sinks.points import PointBuilder

# (measurement, name tag or None for field keys) -> the names InfluxDB holds now
StoredNames = Callable[[str, "str | None"], set[str]]
PER_RUN, PER_MEASUREMENT = "per run", "per measurement"


@dataclass(frozen=True)
class NameLimits:
    per_run: int = 1000  # per-layer norms of a 100-layer model, with room to spare
    per_measurement: int = 5000
    tracked_runs: int = 4096  # (measurement, run) pairs remembered
    refresh_s: float = 300.0

    def __post_init__(self) -> None:
        if min(self.per_run, self.per_measurement, self.tracked_runs) < 1:
            raise ValueError(f"invalid name limits {self}")


@dataclass
class _Measurement:
    names: set[str]
    read_at: float


class NameBudget:
    def __init__(self, limits: NameLimits, stored: StoredNames) -> None:
        self.limits = limits
        self._stored = stored
        self._runs: OrderedDict[tuple[str, str], set[str]] = OrderedDict()
        self._last: tuple[tuple[str, str], set[str]] = (("", ""), set())
        self._measurements: dict[str, _Measurement] = {}

    def admit(self, b: PointBuilder, run_id: str) -> tuple[bool, list[tuple[str, str]]]:
        """Leave out of ``b`` the names over a limit. Returns whether to write the point at
        all, and the (name, limit) pairs left out."""
        names = self._run_names(b.measurement, run_id)
        if b.name_tag is not None:
            name = b.tags.get(b.name_tag)
            if name is None or name in names:
                return True, []
            why = self._take(b, names, name)
            return why is None, [] if why is None else [(name, why)]
        if names.issuperset(b.fields):
            return True, []
        dropped = []
        for key in [k for k in b.fields if k not in names]:
            why = self._take(b, names, key)
            if why is not None:
                b.drop(key)
                dropped.append((key, why))
        return True, dropped

    def _run_names(self, measurement: str, run_id: str) -> set[str]:
        key = (measurement, run_id)
        if key == self._last[0]:  # most points follow one of the same run and measurement
            return self._last[1]
        names = self._runs.get(key)
        if names is None:
            names = self._runs[key] = set()
            if len(self._runs) > self.limits.tracked_runs:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(key)
        self._last = (key, names)
        return names

    def _take(self, b: PointBuilder, run_names: set[str], name: str) -> str | None:
        """Admit ``name`` for the run; the limit that refuses it, if any."""
        if len(run_names) >= self.limits.per_run:
            return PER_RUN
        known = self._measurement(b)
        if name not in known.names:
            if len(known.names) >= self.limits.per_measurement:
                if time.monotonic() - known.read_at < self.limits.refresh_s:
                    return PER_MEASUREMENT
                known = self._read(b)
                if name not in known.names and len(known.names) >= self.limits.per_measurement:
                    return PER_MEASUREMENT
            known.names.add(name)
        run_names.add(name)
        return None

    def _measurement(self, b: PointBuilder) -> _Measurement:
        known = self._measurements.get(b.measurement)
        return known if known is not None else self._read(b)

    def _read(self, b: PointBuilder) -> _Measurement:
        known = _Measurement(self._stored(b.measurement, b.name_tag), time.monotonic())
        self._measurements[b.measurement] = known
        return known


def refusal_reason(dropped: list[tuple[str, str, str]], limits: NameLimits) -> str:
    """One dead-letter reason for the (measurement, name, limit) triples left out of a record."""
    parts = []
    groups: dict[tuple[str, str], list[str]] = {}
    for measurement, name, why in dropped:
        groups.setdefault((measurement, why), []).append(name)
    for (measurement, why), names in groups.items():
        limit = limits.per_run if why == PER_RUN else limits.per_measurement
        shown = ", ".join(repr(n[:40]) for n in names[:5])
        more = f" and {len(names) - 5:,} more" if len(names) > 5 else ""
        parts.append(
            f"{len(names):,} names over the limit of {limit:,} names {why} in measurement "
            f"{measurement!r} left out ({shown}{more})"
        )
    return "; ".join(parts) + "; the rest of the record is stored"
