"""A run's minutes for the 7-day baselines: the rollup bucket's 1-minute means (``steplens.sinks``'
rollup task) of its GPUs, disks and network interfaces (``gpu``, ``disk``, ``net``
measurements) and of its ranks' step time and tokens/s (``step``), as the series
``dynamic_baseline`` keys them. The rollups keep 30 days, so 7 are always there when the run
is that old; raw S3 records would have to be aggregated first, so they are not read here.
A rank's step time and tokens/s come from both its step rollups and its step windows' (the
producer's default mode sends windows of 100 steps and 1 % of the steps raw).

Runs in the worker's fit pool (``baseline_fits``), never on its event loop; needs
``steplens-sinks`` (imported on use).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import numpy as np

from steplens.schema.flux_literals import flux_string, flux_time
from steplens.schema.store_layout import (
    DEVICE_LISTS,
    HOST,
    MEASUREMENT,
    RANK,
    field_in,
    of_run,
    read,
    rolled,
    rollup_suffix,
    tag_in,
)
from steplens.stream_jobs.engine.signals.dynamic_baseline import (
    DISK_FIELDS,
    GPU_FIELDS,
    NET_FIELDS,
    STEP_METRICS,
    Key,
    key_of,
    split_key,
)

Series = dict[Key, tuple[np.ndarray, np.ndarray]]  # key -> (minute starts, means)

STEP, WINDOW = MEASUREMENT["step"], MEASUREMENT["step_window"]
_DEVICE = {m: tag for m, tag, _ in DEVICE_LISTS.values()}  # measurement -> its item's tag
# measurement -> (the tag naming its item, its fields as rolled up -> the series' metric)
WANTED: dict[str, tuple[str, dict[str, str]]] = {
    "gpu": (_DEVICE["gpu"], {rolled(f, "mean"): m for f, m in GPU_FIELDS.items()}),
    "disk": (_DEVICE["disk"], {rolled(f, "mean"): "disk_mb_s" for f in DISK_FIELDS}),
    "net": (_DEVICE["net"], {rolled(f, "mean"): "net_mb_s" for f in NET_FIELDS}),
    STEP: (RANK, {rolled(m, "mean"): m for m in STEP_METRICS}),
}
WINDOW_MEAN = rolled("mean", "mean")  # a minute's step windows' mean


def wanted_items(keys: Iterable[Key]) -> dict[str, set[str]]:
    """Per measurement, the hosts (``gpu``, ``disk``, ``net``) or ranks (``step``) whose rows
    the series ``keys`` need."""
    out: dict[str, set[str]] = {}
    for key in keys:
        scope = split_key(key)[0]
        kind, _, item = scope.partition(":")
        if kind == "rank":
            out.setdefault(STEP, set()).add(item)
        elif kind in WANTED:
            out.setdefault(kind, set()).add(item.rpartition("/")[0])
    return out


def flux(  # noqa: PLR0917
    bucket: str,
    run: str,
    measurement: str,
    since_ns: int,
    until_ns: int,
    items: Iterable[str] | None = None,
) -> str:
    """The rollup points of ``measurement``'s ``WANTED`` fields for ``run`` in
    [since_ns, until_ns) (of the hosts or ranks ``items`` only, when given), long form, as one
    table (one CSV header)."""
    tag, fields = WANTED[measurement]
    where = f"{of_run(measurement, flux_string(run))} and ({field_in(fields)})"
    if items is not None:
        where += f" and ({tag_in(RANK if measurement == STEP else HOST, sorted(items))})"
    return _rows(bucket, since_ns, until_ns, where, [HOST, tag])


def _rows(bucket: str, since_ns: int, until_ns: int, where: str, tags: list[str]) -> str:
    """Flux: the points of ``bucket`` in [since_ns, until_ns) that meet ``where``, long form
    (time, value, field and ``tags``), as one table (one CSV header)."""
    keep = ", ".join(flux_string(c) for c in ["_time", "_value", "_field", *tags])
    return (
        read(bucket, flux_time(_utc(since_ns)), flux_time(_utc(until_ns)), where)
        + f"  |> keep(columns: [{keep}])\n"
        + "  |> group()\n"
    )


def _utc(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)


def read_rollups(
    influx: Any, run: str, since_ns: int, until_ns: int, keys: Iterable[Key] | None = None
) -> Series:
    """``run``'s series from the rollup bucket (``influx``: ``InfluxSettings``): those of the
    hosts and ranks of ``keys`` when given, else all; raises when InfluxDB cannot be read (the
    caller falls back to the in-run minutes). Each measurement's
    rows come as plain CSV, parsed by pandas as they stream in (the client's own frame
    builder makes a Python object of every row: 3x slower and 2x the memory for 645k)."""
    import pandas as pd
    from influxdb_client import Dialect

    from steplens.sinks.influx import make_client

    plain = Dialect(header=True, annotations=[], date_time_format="RFC3339")
    frames = []
    with make_client(influx) as client:
        api = client.query_api()

        def rows(query: str, tags: list[str]) -> Any:
            body = api.query_raw(query, org=influx.org, dialect=plain)
            try:
                wanted = {"_time", "_value", "_field", *tags}
                return pd.read_csv(
                    body,
                    usecols=lambda c: c in wanted,
                    dtype={"_field": "category", **dict.fromkeys(tags, "category")},
                )
            except pd.errors.EmptyDataError:  # no rows: an empty body
                return None
            finally:
                body.release_conn()

        items = None if keys is None else wanted_items(keys)
        for measurement, (tag, _) in WANTED.items():
            only = None if items is None else items.get(measurement)
            if items is not None and not only:
                continue
            got = rows(
                flux(influx.rollup_bucket, run, measurement, since_ns, until_ns, only),
                [HOST, tag],
            )
            if got is not None and len(got):
                frames.append(got.assign(_measurement=measurement))
            if measurement == STEP:  # and the windows' means (the producer's default mode)
                got = rows(
                    windows_flux(influx.rollup_bucket, run, since_ns, until_ns, only),
                    [RANK, "metric"],
                )
                if got is not None and len(got):
                    field = got.pop("metric").astype(str) + rollup_suffix("mean")
                    frames.append(got.assign(_measurement=STEP, _field=field))
    if not frames:
        return {}
    frame = pd.concat(frames, ignore_index=True)
    times = pd.to_datetime(frame.pop("_time"), utc=True, format="ISO8601")
    frame["time_ns"] = times.dt.as_unit("ns").astype("int64")
    return series_of(frame)


def windows_flux(
    bucket: str, run: str, since_ns: int, until_ns: int, ranks: Iterable[str] | None = None
) -> str:
    """The rollups of the step windows' means of ``STEP_METRICS`` (``mean_mean``: a minute's
    windows' mean) for ``run``, of ``ranks`` when given."""
    where = f"{of_run(WINDOW, flux_string(run))} and r._field == {flux_string(WINDOW_MEAN)}"
    where += f" and ({tag_in('metric', STEP_METRICS)})"
    if ranks is not None:
        where += f" and ({tag_in(RANK, sorted(ranks))})"
    return _rows(bucket, since_ns, until_ns, where, [RANK, "metric"])


def series_of(frame: Any) -> Series:
    """Long-form rollup rows (``time_ns``, ``_measurement``, ``_field``, ``_value``, ``host``
    and the item tags) as the baselines' series; a disk's read and write (an interface's rx
    and tx) of a minute summed, a rank's step and window rollups of a minute averaged."""
    out: Series = {}
    for measurement, (tag, fields) in WANTED.items():
        part = frame[(frame["_measurement"] == measurement) & frame["_field"].isin(list(fields))]
        if part.empty or tag not in part:
            continue
        part = part.assign(metric=part["_field"].map(fields), value=part["_value"].astype(float))
        by = ["metric", tag] if measurement == STEP else ["metric", HOST, tag]
        grouped = part.groupby([*by, "time_ns"], sort=True, observed=True)["value"]
        # a minute's step rollup and windows' rollup: their mean; a disk's read and write: sum
        summed = grouped.mean() if measurement == STEP else grouped.sum(min_count=1)
        for ident, values in summed.groupby(level=list(range(len(by))), sort=False):
            metric, *item = ident
            if measurement == STEP:
                scope = f"rank:{int(float(item[0]))}"
            else:
                scope = f"{measurement}:{item[0]}/{item[1]}"
            times = values.index.get_level_values("time_ns").to_numpy(np.int64)
            out[key_of(scope, str(metric))] = (times, values.to_numpy(float))
    return out


def merged(stored: Series, live: Series) -> Series:
    """Each live series with its stored minutes before it (a minute in both: their mean, as
    ``seasonal_baseline.minute_grid`` takes them)."""
    out: Series = {}
    for key, (t, v) in live.items():
        old = stored.get(key)
        if old is None:
            out[key] = (t, v)
        else:
            out[key] = (np.concatenate([old[0], t]), np.concatenate([old[1], v]))
    return out
