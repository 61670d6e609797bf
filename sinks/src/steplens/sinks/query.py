"""One series across InfluxDB (recent) and S3 (older), as a pandas DataFrame.

Both stores are read for the requested range and the rows are stitched on the point's
identity (time and the measurement's tags), so a record present in both appears once (the
InfluxDB row wins and ``source`` says which store answered). A store that cannot be reached is
skipped with a warning; when neither answers the error is raised.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Final

import pandas as pd

from steplens.producer import schema
from steplens.sinks.cold import hour_from_key, hour_of, read_parquet, run_prefix
from steplens.sinks.points import MEASUREMENT
from steplens.sinks.rollup import flux_string, flux_time
from steplens.sinks.settings import InfluxSettings, S3Settings

log = logging.getLogger("steplens.sinks")

# kind -> the tags (besides run_id) that identify a point; they are columns of both stores
IDENTITY: Final = {
    "step": ("rank", "host"),
    "step_window": ("rank", "host", "metric"),
    "eval": ("rank", "split"),
    "batch": ("rank",),
    "hw": ("host",),
    "comm": ("rank", "op", "peer"),
    "health": ("rank", "host"),
    "signal": ("rank", "name", "metric"),
    "alert": ("rule", "severity", "state", "scope"),
    "run_meta": ("rank",),
}
# kind -> (map field in the record, field-name prefix in InfluxDB when a name is taken)
MAP_FIELDS: Final = {
    "step": ("scalars", "scalar_"),
    "eval": ("extra", "extra_"),
    "batch": ("label_counts", "label_"),
}
_NONFINITE: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
SERIES_COLUMNS: Final = ["time", "time_ns", "step", "rank", "value", "source"]


@dataclass(frozen=True)
class Stores:
    influx: InfluxSettings | None
    s3: S3Settings | None

    @classmethod
    def from_env(cls) -> Stores:
        return cls(InfluxSettings.from_env(), S3Settings.from_env())


def _ns(t: datetime | str | int | float | None) -> int | None:
    """Accepts datetimes, ISO strings, pandas-style relative strings ("-2h") and ns ints."""
    if t is None:
        return None
    if isinstance(t, (int, float)):
        return int(t)
    if isinstance(t, str) and t.startswith("-"):
        return int((pd.Timestamp.now(tz="UTC") - pd.Timedelta(t[1:])).value)
    ts = pd.Timestamp(t)
    if ts.tzinfo is None:
        ts = ts.tz_localize("UTC")
    return int(ts.value)


def csv_text(value: Any) -> Any:
    """Undo the CSV encoding of InfluxDB's query answers: a newline in a string field comes
    back as CRLF (a lone carriage return does not come back at all; S3 keeps the exact text)."""
    return value.replace("\r\n", "\n") if isinstance(value, str) else value


def _to_dt(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // 1_000_000_000, tz=timezone.utc) + timedelta(
        microseconds=(ns % 1_000_000_000) // 1000
    )


# ------------------------------------------------------------------------- InfluxDB


def _influx_frame(
    s: InfluxSettings,
    kind: str,
    run_id: str,
    *,
    rank: int | None,
    since: int | None,
    until: int | None,
    fields: list[str] | None,
) -> pd.DataFrame:
    from steplens.sinks.influx import make_client

    start = flux_time(_to_dt(since)) if since is not None else "1970-01-01T00:00:00Z"
    stop = flux_time(_to_dt(until + 1000)) if until is not None else "2200-01-01T00:00:00Z"
    filters = [
        f"r._measurement == {flux_string(MEASUREMENT.get(kind) or kind.lstrip('_'))}",
        f"r.run_id == {flux_string(run_id)}",
    ]
    if rank is not None and "rank" in IDENTITY.get(kind, ()):
        filters.append(f"r.rank == {flux_string(str(rank))}")
    if fields is not None:
        wanted = " or ".join(f"r._field == {flux_string(f)}" for f in fields)
        filters.append(f"({wanted})")
    flux = (
        f"from(bucket: {flux_string(s.bucket)})\n"
        f"  |> range(start: {start}, stop: {stop})\n"
        f"  |> filter(fn: (r) => {' and '.join(filters)})\n"
        '  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
        "  |> map(fn: (r) => ({r with time_ns: int(v: r._time)}))\n"
        "  |> group()\n"
        '  |> drop(columns: ["_start", "_stop", "_time", "_measurement", "result", "table"])\n'
    )
    with make_client(s) as client:
        frames = client.query_api().query_data_frame(flux, org=s.org)
    if isinstance(frames, list):
        frames = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    frame = frames.drop(columns=["result", "table"], errors="ignore")
    for col in frame.columns:
        if frame[col].dtype == object or str(frame[col].dtype).startswith("str"):
            frame[col] = frame[col].map(csv_text)
    for col in [c for c in frame.columns if str(c).endswith("_nonfinite")]:
        base = str(col)[: -len("_nonfinite")]
        restored = frame[col].map(lambda v: _NONFINITE.get(v, None) if isinstance(v, str) else None)
        if base in frame:
            frame[base] = frame[base].astype("float64").where(restored.isna(), restored)
        else:
            frame[base] = restored.astype("float64")
        frame = frame.drop(columns=[col])
    if "time_ns" in frame:  # Flux times are microsecond-rounded above: cut exactly here
        frame = frame[
            (frame["time_ns"] >= (since if since is not None else -(2**62)))
            & (frame["time_ns"] <= (until if until is not None else 2**62))
        ].reset_index(drop=True)
    if "rank" in frame and kind != "alert":
        frame["rank"] = pd.to_numeric(frame["rank"], errors="coerce").astype("Int64")
    if "peer" in frame:
        frame["peer"] = pd.to_numeric(frame["peer"], errors="coerce").astype("Int64")
    return frame


# ------------------------------------------------------------------------- S3


def _hours(since: int | None, until: int | None) -> tuple[str, str]:
    return (
        hour_of(since) if since is not None else "",
        hour_of(until) if until is not None else "~",
    )


def _s3_objects(
    s: S3Settings, kind: str, run_id: str, since: int | None, until: int | None
) -> Iterator[tuple[Any, str]]:
    from steplens.sinks.s3 import make_s3_client

    client = make_s3_client(s)
    lo, hi = _hours(since, until)
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=s.bucket, Prefix=run_prefix(s.prefix, kind, run_id)
    )
    for page in pages:
        for obj in page.get("Contents", []):
            hour = hour_from_key(obj["Key"]) or ""
            if lo <= hour <= hi:
                yield client, obj["Key"]


def _s3_frame(
    s: S3Settings,
    kind: str,
    run_id: str,
    *,
    rank: int | None,
    since: int | None,
    until: int | None,
    columns: list[str] | None,
) -> pd.DataFrame:
    frames = []
    for client, key in _s3_objects(s, kind, run_id, since, until):
        body = client.get_object(Bucket=s.bucket, Key=key)["Body"].read()
        frame = read_parquet(body, columns).to_pandas()
        frames.append(frame)
    if not frames:
        return pd.DataFrame()
    frame = pd.concat(frames, ignore_index=True)
    keep = pd.Series(True, index=frame.index)
    if since is not None:
        keep &= frame["time_ns"] >= since
    if until is not None:
        keep &= frame["time_ns"] <= until
    if rank is not None and "rank" in frame:
        keep &= frame["rank"] == rank
    return frame[keep].reset_index(drop=True)


# ------------------------------------------------------------------------- stitching


def stitch(hot: pd.DataFrame, cold: pd.DataFrame, identity: list[str]) -> pd.DataFrame:
    """Union of both stores, one row per point (the hot row wins), ordered by time."""
    parts = []
    if len(hot):
        parts.append(hot.assign(source="influx"))
    if len(cold):
        parts.append(cold.assign(source="s3"))
    if not parts:
        return pd.DataFrame()
    frame = pd.concat(parts, ignore_index=True)
    key = [c for c in ["time_ns", *identity] if c in frame]
    for col in key:
        if col != "time_ns" and frame[col].dtype == object:
            frame[col] = frame[col].astype("string")
    frame = frame.drop_duplicates(subset=key, keep="first")
    frame = frame.sort_values(key, kind="stable").reset_index(drop=True)
    frame.insert(0, "time", pd.to_datetime(frame["time_ns"], unit="ns", utc=True))
    return frame


def _both(
    stores: Stores, kind: str, hot_fn: Any, cold_fn: Any
) -> tuple[pd.DataFrame, pd.DataFrame]:
    hot, cold, errors = pd.DataFrame(), pd.DataFrame(), []
    if stores.influx is not None:
        try:
            hot = hot_fn(stores.influx)
        except Exception as exc:
            log.warning("steplens query: InfluxDB not read: %s", exc)
            errors.append(exc)
    if stores.s3 is not None:
        try:
            cold = cold_fn(stores.s3)
        except Exception as exc:
            log.warning("steplens query: S3 not read: %s", exc)
            errors.append(exc)
    if errors and len(errors) == int(stores.influx is not None) + int(stores.s3 is not None):
        raise errors[0]
    return hot, cold


def _metric_names(kind: str, metric: str) -> tuple[str, str]:
    """(InfluxDB field, Parquet column) of a metric of ``kind``."""
    fixed = schema.KINDS[kind]
    if metric in fixed or kind not in MAP_FIELDS:
        return metric, metric
    map_field, prefix = MAP_FIELDS[kind]
    reserved = {"step", "seq", *fixed}
    return (prefix + metric if metric in reserved else metric), f"{map_field}.{metric}"


def query_series(  # noqa: PLR0917
    run_id: str,
    metric: str,
    rank: int | None = None,
    since: datetime | str | int | None = None,
    until: datetime | str | int | None = None,
    kind: str | None = None,
    *,
    stores: Stores | None = None,
) -> pd.DataFrame:
    """Columns: time (UTC), time_ns, step, rank, value, source ("influx" or "s3"), plus the
    kind's identifying tags (e.g. host)."""
    kind = kind or "step"
    if kind not in IDENTITY:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(IDENTITY)}")
    stores = stores or Stores.from_env()
    lo, hi = _ns(since), _ns(until)
    field, column = _metric_names(kind, metric)
    identity = list(IDENTITY[kind])
    base = ["time_ns", "step", *identity]

    def hot(s: InfluxSettings) -> pd.DataFrame:
        frame = _influx_frame(
            s,
            kind,
            run_id,
            rank=rank,
            since=lo,
            until=hi,
            fields=[field, f"{field}_nonfinite", "step"],
        )
        if field not in frame:
            return pd.DataFrame()
        frame = frame.rename(columns={field: "value"})
        return frame.dropna(subset=["value"])[[c for c in [*base, "value"] if c in frame]]

    def cold(s: S3Settings) -> pd.DataFrame:
        frame = _s3_frame(s, kind, run_id, rank=rank, since=lo, until=hi, columns=[*base, column])
        if column not in frame:
            return pd.DataFrame()
        frame = frame.rename(columns={column: "value"}).dropna(subset=["value"])
        return frame[[c for c in [*base, "value"] if c in frame]]

    frame = stitch(*_both(stores, kind, hot, cold), identity)
    if frame.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in SERIES_COLUMNS})
    frame["value"] = frame["value"].astype("float64")
    for col in ("step", "rank"):
        if col in frame:
            frame[col] = frame[col].astype("Int64")
    first = [c for c in SERIES_COLUMNS if c in frame]
    return frame[first + [c for c in frame.columns if c not in first]]


def query_records(
    run_id: str,
    kind: str,
    rank: int | None = None,
    since: datetime | str | int | None = None,
    until: datetime | str | int | None = None,
    *,
    stores: Stores | None = None,
) -> pd.DataFrame:
    """One row per record of ``kind``: the envelope and the kind's fields (the S3 columns;
    maps as ``<field>.<key>``), from both stores. For ``hw`` the InfluxDB side carries the host
    fields only; the per-GPU, disk and net lists come from S3 as JSON text."""
    if kind not in IDENTITY:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(IDENTITY)}")
    stores = stores or Stores.from_env()
    lo, hi = _ns(since), _ns(until)

    def hot(s: InfluxSettings) -> pd.DataFrame:
        frame = _influx_frame(s, kind, run_id, rank=rank, since=lo, until=hi, fields=None)
        if frame.empty:
            return frame
        frame = frame.rename(columns=_influx_to_cold_names(kind, list(frame.columns)))
        frame["kind"] = kind
        if kind == "hw":
            frame = _with_device_lists(s, frame, run_id, lo, hi)
        return frame

    def cold(s: S3Settings) -> pd.DataFrame:
        frame = _s3_frame(s, kind, run_id, rank=rank, since=lo, until=hi, columns=None)
        return frame.drop(
            columns=["payload", "time", "kafka_topic", "kafka_partition", "kafka_offset"],
            errors="ignore",
        )

    frame = stitch(*_both(stores, kind, hot, cold), [*IDENTITY[kind], "seq"])
    for name, spec in schema.KINDS[kind].items():
        if spec.type in JSON_TYPES and name in frame:
            frame[name] = frame[name].map(_from_json)
    return frame


JSON_TYPES: Final = {schema.STR_LIST, schema.NUM_LIST, schema.INT_LIST, schema.OBJ_LIST, schema.OBJ}


def _from_json(value: Any) -> Any:
    """Lists and objects are JSON text in S3 (and in InfluxDB string fields)."""
    if not isinstance(value, str):
        return value
    try:
        return schema._restore(json.loads(value))
    except ValueError:
        return value


# hw list field -> (InfluxDB measurement, tag holding the item's id, the id's name in the item)
DEVICE_LISTS: Final = {
    "gpus": ("gpu", "gpu", "index"),
    "disks": ("disk", "device", "device"),
    "nets": ("net", "iface", "iface"),
}


def _with_device_lists(
    s: InfluxSettings, host: pd.DataFrame, run_id: str, lo: int | None, hi: int | None
) -> pd.DataFrame:
    """Fold the gpu, disk and net points of each hw record back into its lists (JSON text)."""
    host = host.copy()
    for name, (measurement, tag, key) in DEVICE_LISTS.items():
        kind = {"gpu": "_gpu", "disk": "_disk", "net": "_net"}[measurement]
        frame = _influx_frame(s, kind, run_id, rank=None, since=lo, until=hi, fields=None)
        lists: dict[tuple[int, str], list[dict[str, Any]]] = {}
        if not frame.empty:
            frame = frame.drop(columns=["run_id", "seq"], errors="ignore")
            for row in frame.to_dict("records"):
                item = {
                    k: v
                    for k, v in row.items()
                    if k not in ("time_ns", "host", tag) and not _missing(v)
                }
                ident = row.get(tag)
                item[key] = int(ident) if key == "index" and str(ident).isdigit() else ident
                lists.setdefault((int(row["time_ns"]), str(row.get("host"))), []).append(item)
        host[name] = [
            json.dumps(lists.get((int(t), str(h)), []))
            for t, h in zip(host["time_ns"], host["host"], strict=True)
        ]
    return host


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _influx_to_cold_names(kind: str, columns: list[str]) -> dict[str, str]:
    if kind == "health":
        return {
            c: ("dropped." + c[8:]) if c.startswith("dropped_") else "errors." + c[6:]
            for c in columns
            if c.startswith(("dropped_", "error_"))
        }
    if kind not in MAP_FIELDS:
        return {}
    map_field, prefix = MAP_FIELDS[kind]
    known = {"time_ns", "run_id", "seq", "step", "host", *IDENTITY[kind], *schema.KINDS[kind]}
    if kind == "batch":
        return {c: f"{map_field}.{c[len(prefix) :]}" for c in columns if c.startswith(prefix)}
    out = {}
    for c in columns:
        if c.startswith(prefix):
            out[c] = f"{map_field}.{c[len(prefix) :]}"
        elif c not in known and not c.startswith("lr_group"):
            out[c] = f"{map_field}.{c}"
    return out
