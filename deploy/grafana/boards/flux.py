"""Flux for the steplens boards: every range from 5 minutes to 30 days, by one rule.

A panel reads recent data from the hot bucket and older data from the 1-minute rollups:

* ``cut`` splits the range: the rollup bucket before it, the hot bucket from it on. It lies
  within one window after ``now() - hot_window`` (the hot bucket's retention) and on a window
  boundary, so the hot bucket still holds everything after it and no window draws on both
  buckets. A range that starts after that point reads only the hot bucket; one that ends
  before it, only the rollups.
* Each part is reduced where it is read (``aggregateWindow`` right after the filters, which
  InfluxDB runs in its storage engine): windows of ``v.windowPeriod``, at least one minute on
  the rollups (their resolution). The rollup field of the panel's aggregate is read
  (``loss_max`` for a max per interval, ``lr_last`` for a last value) and renamed back
  (``loss``), so a series keeps its name across the cut.
* Grafana sizes ``v.windowPeriod`` to the panel's width (about 30 minutes for 30 days), so
  a panel returns a bounded number of points per series whatever the range.

The store's names (measurements, the run tag, the rollups' ``<field>_<aggregate>``) are those
of ``steplens.schema.store_layout``: a ``Read`` of a measurement the sinks do not write fails.

Grafana substitutes ``v.timeRangeStart``, ``v.timeRangeStop`` and ``v.windowPeriod`` as text
(and any ``word.bucket``, ``word.organization``: no record field here has such a name).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from steplens.schema.flux_literals import flux_string
from steplens.schema.store_layout import MEASUREMENTS, RUN, field_in, of_run, rolled, rollup_suffix

PREAMBLE = """import "date"
import "strings"

// the 1-minute rollups before `cut`, the hot bucket from it on (docs/demo.md, Grafana dashboards)
every = v.windowPeriod
coarse = if int(v: every) > int(v: 1m) then every else 1m
hot_from = date.add(
  d: coarse, to: date.truncate(t: date.sub(d: ${hot_window}, from: now()), unit: coarse),
)
cut = if v.timeRangeStart > hot_from then v.timeRangeStart
  else if hot_from > v.timeRangeStop then v.timeRangeStop
  else hot_from
"""

RUN_PICKED = '"${run_id}"'  # Grafana's run picker; every query filters by it


def names(columns: Sequence[str]) -> str:
    """A Flux array of column names."""
    return "[" + ", ".join(f'"{c}"' for c in columns) + "]"


@dataclass(frozen=True)
class Read:
    """What a panel reads: a measurement, its fields (names or a pattern), tag conditions."""

    measurement: str
    fields: Sequence[str] = ()  # () with no pattern: every field
    pattern: str = ""  # a field-name regex, e.g. "(dropped|error)_.+"
    where: str = ""  # more conditions, in Flux
    keep: Sequence[str] = ()  # tag columns the panel shows (besides _time, _value, _field)
    rolled_fields: Sequence[str] | None = None  # other fields in the rollups (text is not kept)

    def __post_init__(self) -> None:
        if self.measurement not in MEASUREMENTS:
            raise ValueError(f"the sinks write no measurement {self.measurement!r}")

    def filters(self, aggregate: str | None = None) -> str:
        """The filters of the hot bucket's points, or of the rollups' by ``aggregate``."""
        tags = of_run(self.measurement, RUN_PICKED)
        if self.where:
            tags += f" and {self.where}"
        of_rollups = aggregate is not None and self.rolled_fields is not None
        fields = self.rolled_fields if of_rollups else self.fields
        suffix = "" if aggregate is None else rollup_suffix(aggregate)
        names = list(fields) if aggregate is None else [rolled(f, aggregate) for f in fields]
        wanted = [field_in(names)] if names else []
        if self.pattern:
            wanted.append(f"r._field =~ /^{self.pattern}{suffix}$/")
        out = f"  |> filter(fn: (r) => {tags})\n"
        return out + (f"  |> filter(fn: (r) => {' or '.join(wanted)})\n" if wanted else "")

    def numeric(self) -> list[str]:
        """Floats (the rollups' type) and the panel's columns."""
        return ["toFloat()", f"keep(columns: {names(('_time', '_value', '_field', *self.keep))})"]


def _steps(steps: Sequence[str]) -> str:
    return "".join(f"  |> {s}\n" for s in steps)


def stitched(
    read: Read,
    aggregate: str,
    *,
    reduce_hot: Sequence[str] = (),
    reduce_rolled: Sequence[str] = (),
    after: Sequence[str] = (),
    shape_hot: Sequence[str] | None = None,
    shape_rolled: Sequence[str] | None = None,
    imports: Sequence[str] = (),
    defs: str = "",
) -> str:
    """The query. Each part is filtered, reduced (``reduce_*``) and shaped (``shape_*``, by
    default ``read.numeric()``); the rollup part reads ``<field>_<aggregate>``, renamed back
    before it is shaped. ``after`` works on both parts together; ``defs`` are Flux
    definitions it uses."""
    trim = f"strings.trimSuffix(v: r._field, suffix: {flux_string(rollup_suffix(aggregate))})"
    rename = f"map(fn: (r) => ({{r with _field: {trim}}}))"
    head = "".join(f'import "{i}"\n' for i in imports)
    rollups = [*reduce_rolled, rename, *(read.numeric() if shape_rolled is None else shape_rolled)]
    hot = [*reduce_hot, *(read.numeric() if shape_hot is None else shape_hot)]
    return (
        head
        + PREAMBLE
        + (defs + "\n" if defs else "")
        + 'rolled = () => from(bucket: "${rollup_bucket}")\n'
        + "  |> range(start: v.timeRangeStart, stop: cut)\n"
        + read.filters(aggregate)
        + _steps(rollups)
        + 'hot = () => from(bucket: "${bucket}")\n'
        + "  |> range(start: cut, stop: v.timeRangeStop)\n"
        + read.filters()
        + _steps(hot)
        + "data = if cut <= v.timeRangeStart then hot()\n"
        + "  else if cut >= v.timeRangeStop then rolled()\n"
        + "  else union(tables: [rolled(), hot()])\n"
        + "data\n"
        + _steps(after)
    ).rstrip("\n")


def per_interval(
    read: Read,
    fn: str,
    *,
    group: Sequence[str] = (),
    after: Sequence[str] = (),
    imports: Sequence[str] = (),
    defs: str = "",
) -> str:
    """``fn`` (max, min, mean, last) per window, from ``<field>_<fn>`` in the rollups.

    ``group``: the columns series are merged by before aggregating (e.g. all ranks)."""
    regroup = [f"group(columns: {names(group)})"] if group else []
    return stitched(
        read,
        fn,
        reduce_hot=[*regroup, f"aggregateWindow(every: every, fn: {fn}, createEmpty: false)"],
        reduce_rolled=[*regroup, f"aggregateWindow(every: coarse, fn: {fn}, createEmpty: false)"],
        after=['sort(columns: ["_time"])', *after],
        imports=imports,
        defs=defs,
    )


def latest(read: Read) -> str:
    """The newest value of each series in the range (``<field>_last`` before the cut)."""
    return stitched(
        read,
        "last",
        reduce_hot=["last()"],
        reduce_rolled=["last()"],
        after=['sort(columns: ["_time"])', "last()"],
    )


def hot_only(read: Read, steps: Sequence[str]) -> str:
    """Text fields, which the rollups do not keep: the hot bucket only (the last hour)."""
    return (
        'from(bucket: "${bucket}")\n'
        "  |> range(start: v.timeRangeStart, stop: v.timeRangeStop)\n"
        + read.filters()
        + _steps(steps)
    ).rstrip("\n")


def run_ids() -> str:
    """The run picker: runs with data in either bucket in the range or the last 30 days."""
    run = flux_string(RUN)
    return (
        'import "date"\n'
        'import "influxdata/influxdb/schema"\n'
        "month = date.sub(d: 30d, from: now())\n"
        "since = if v.timeRangeStart < month then v.timeRangeStart else month\n"
        "union(tables: [\n"
        f'  schema.tagValues(bucket: "${{bucket}}", tag: {run}, start: since),\n'
        f'  schema.tagValues(bucket: "${{rollup_bucket}}", tag: {run}, start: since),\n'
        "])\n"
        "  |> group()\n"
        "  |> distinct()\n"
        "  |> sort()"
    )
