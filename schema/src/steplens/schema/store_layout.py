"""The layout of the InfluxDB store, in one place: the influx sink writes it, the query layer,
the worker's history, the rollups and the boards read it (docs/architecture.md, "InfluxDB
layout").

The hot bucket holds a measurement per record kind (``MEASUREMENT``; a hw record's device
lists are measurements of their own, ``DEVICE_LISTS``), tagged with the run (``RUN``) and,
most, the rank (``RANK``) or host (``HOST``). The rollup bucket holds each numeric field's
minutes as ``<field>_<aggregate>`` (``rolled``), and the rollups' own marks (``COVERAGE``,
``LEASE``). The Flux builders here are plain strings (no client library): conditions for a
``filter`` and whole reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from steplens.schema.flux_literals import flux_string

# kind -> measurement of its main point (hw is split into host, gpu, disk and net points)
MEASUREMENT: Final = {
    "step": "step",
    "step_batch": "step",  # written as its step records
    "step_window": "step_window",
    "eval": "eval",
    "batch": "batch",
    "hw": "host",
    "comm": "comm",
    "health": "producer_health",
    "signal": "signal",
    "alert": "alert",
    "run_meta": "run_meta",
    "stacks": "stacks",
    "advice": "advice",
    "acted": "acted",
    "checkpoint": "checkpoint",
}
LAYER: Final = "layer"  # a step's per-layer norms, one point per layer
CHECK: Final = "check"  # run_meta's checks, one point per check
# hw list -> (its measurement, the tag holding an item's id, the id's name in the item)
DEVICE_LISTS: Final = {
    "gpus": ("gpu", "gpu", "index"),
    "disks": ("disk", "device", "device"),
    "nets": ("net", "iface", "iface"),
}
MEASUREMENTS: Final = frozenset(
    {*MEASUREMENT.values(), LAYER, CHECK, *(m for m, _, _ in DEVICE_LISTS.values())}
)

RUN: Final = "run_id"  # every point's
RANK: Final = "rank"
HOST: Final = "host"
SEQ: Final = "seq"  # every point's record sequence number (not rolled up)
NONFINITE: Final = "_nonfinite"  # suffix of the string field a non-finite number goes to

AGGREGATES: Final = ("mean", "min", "max", "last")  # of each numeric field, per minute
# A field that is itself a summary (a step window's, a signal's band) is rolled up by the
# fold of it that means something: a minute's largest window maximum, its last band; every
# other numeric field by every one of ``AGGREGATES``. Each aggregate of each series is a pass
# of the rollups over it: a step window's ten fields kept four ways each were 9/20 of a
# run's time at 1,024 ranks.
FOLDS: Final[dict[str, dict[str, tuple[str, ...]]]] = {
    "step_window": {
        "count": ("mean",),
        "duration_s": ("mean",),
        "mean": ("mean",),
        "std": ("mean",),
        "min": ("min",),
        "step_first": ("min",),
        "max": ("max",),
        "step_last": ("max",),
        "nonfinite": ("max",),
        "last": ("last",),
    },
    "signal": {
        "score": ("max",),
        "step": ("max",),
        "expected": ("last",),
        "lower": ("last",),
        "upper": ("last",),
    },
}
COVERAGE: Final = "rollup_coverage"  # the rollups' coverage marks (no tags) ...
COVERAGE_FIELD: Final = "points"  # ... counting the points a run wrote
LEASE: Final = "rollup_lease"  # the lease of the sink that makes the rollup runs ...
LEASE_FIELD: Final = "owner"  # ... naming it


def nonfinite(field: str) -> str:
    """The string field holding ``field``'s non-finite values ("NaN", "Infinity", ...)."""
    return field + NONFINITE


def rollup_suffix(aggregate: str) -> str:
    """What the rollups append to a field's name for ``aggregate`` (one of ``AGGREGATES``)."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"the rollups keep no {aggregate!r}; choose from {AGGREGATES}")
    return "_" + aggregate


def rolled(field: str, aggregate: str) -> str:
    """The rollup field of ``field``'s minutes by ``aggregate``: ``loss`` -> ``loss_mean``."""
    return field + rollup_suffix(aggregate)


def folds(measurement: str, field: str) -> tuple[str, ...]:
    """The aggregates the rollups keep of ``measurement``'s numeric ``field`` (``FOLDS``)."""
    return FOLDS.get(measurement, {}).get(field, AGGREGATES)


_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def column(name: str) -> str:
    """A record's column in a Flux function: ``r.rank``, or ``r["a tag"]`` for other names."""
    return f"r.{name}" if _NAME.fullmatch(name) else f"r[{flux_string(name)}]"


def tag_in(tag: str, values: Iterable[str]) -> str:
    """Flux condition: ``tag`` has one of ``values`` (an ``or`` of them: parenthesize it)."""
    return " or ".join(f"{column(tag)} == {flux_string(v)}" for v in values)


def field_in(fields: Iterable[str]) -> str:
    """Flux condition: the field is one of ``fields`` (an ``or``: parenthesize it)."""
    return " or ".join(f"r._field == {flux_string(f)}" for f in fields)


def measurement_in(measurements: Iterable[str]) -> str:
    """Flux condition: the measurement is one of ``measurements`` (parenthesize it)."""
    return " or ".join(f"r._measurement == {flux_string(m)}" for m in measurements)


def of_run(measurement: str, run: str) -> str:
    """Flux condition: a point of ``measurement`` of the run ``run``, a Flux expression
    (``flux_string(run_id)``, or a dashboard's variable)."""
    return f"r._measurement == {flux_string(measurement)} and r.{RUN} == {run}"


def read(bucket: str, start: str, stop: str, where: str) -> str:
    """Flux: the points of ``bucket`` in [start, stop) (Flux time expressions) that meet
    ``where``, a Flux condition; more steps may follow."""
    return (
        f"from(bucket: {flux_string(bucket)})\n"
        f"  |> range(start: {start}, stop: {stop})\n"
        f"  |> filter(fn: (r) => {where})\n"
    )


def last_mark(bucket: str, measurement: str, field: str, since_s: int) -> str:
    """Flux: the newest point of ``measurement``'s ``field`` in ``bucket`` within the last
    ``since_s`` seconds (the rollups' marks: ``COVERAGE``, ``LEASE``)."""
    return (
        f"from(bucket: {flux_string(bucket)})\n"
        f"    |> range(start: -{int(since_s)}s, stop: 1m)\n"
        f"    |> filter(fn: (r) => {mark_is(measurement, field)})\n"
        "    |> last()\n"
    )


def mark_is(measurement: str, field: str) -> str:
    """Flux condition: a point of a rollup mark (``COVERAGE``, ``LEASE``)."""
    return f"r._measurement == {flux_string(measurement)} and r._field == {flux_string(field)}"
