"""One series across InfluxDB (recent) and S3 (older), as a pandas DataFrame.

Both stores are read for the requested range (``query_hot``, ``query_cold``) and the rows are
stitched on the point's identity (time and the measurement's tags), so a record present in
both appears once (the InfluxDB row wins and ``source`` says which store answered), and so does
a record stored twice in S3 (re-sent by a producer, see ``chunks``). A store that cannot be
reached is skipped with a warning; when neither answers the error is raised. A store that
answers with a refusal (wrong token or keys, a missing bucket) raises ``StoreRefused``: the
answer would otherwise lack that store's data without a word.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import pandas as pd

from steplens import schema
from steplens.sinks import query_cold, query_hot
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
    "stacks": ("rank", "host"),
    "advice": ("action", "fingerprint"),
    "acted": ("rank", "action", "outcome"),
    "checkpoint": ("rank",),
}
# kind -> (map field in the record, field-name prefix in InfluxDB when a name is taken)
MAP_FIELDS: Final = {
    "step": ("scalars", "scalar_"),
    "eval": ("extra", "extra_"),
    "batch": ("label_counts", "label_"),
}
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


class StoreRefused(RuntimeError):
    """A store answered and refused the request (credentials, a missing bucket, a bad query):
    the answer would silently lack its data, so the query fails with the store's reason."""


def _both(
    stores: Stores, kind: str, hot_fn: Any, cold_fn: Any
) -> tuple[pd.DataFrame, pd.DataFrame]:
    hot, cold, errors = pd.DataFrame(), pd.DataFrame(), []
    if stores.influx is not None:
        try:
            hot = hot_fn(stores.influx)
        except Exception as exc:
            reason = query_hot.refusal(stores.influx, exc)
            if reason is not None:
                raise StoreRefused(reason) from exc
            log.warning("steplens query: InfluxDB not read (answering from S3 alone): %s", exc)
            errors.append(exc)
    if stores.s3 is not None:
        try:
            cold = cold_fn(stores.s3)
        except Exception as exc:
            reason = query_cold.refusal(stores.s3, exc)
            if reason is not None:
                raise StoreRefused(reason) from exc
            log.warning("steplens query: S3 not read (answering from InfluxDB alone): %s", exc)
            errors.append(exc)
    if errors and len(errors) == int(stores.influx is not None) + int(stores.s3 is not None):
        raise errors[0]
    return hot, cold


def _metric_names(kind: str, metric: str) -> tuple[str, str]:
    """(InfluxDB field, Parquet column) of a metric of ``kind``."""
    fixed = schema.payload_fields(kind)
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
        frame = query_hot.influx_frame(
            s,
            kind,
            run_id,
            rank=rank,
            since=lo,
            until=hi,
            fields=[field, f"{field}_nonfinite", "step"],
            by_rank="rank" in IDENTITY[kind],
        )
        if field not in frame:
            return pd.DataFrame()
        frame = frame.rename(columns={field: "value"})
        return frame.dropna(subset=["value"])[[c for c in [*base, "value"] if c in frame]]

    def cold(s: S3Settings) -> pd.DataFrame:
        frame = query_cold.s3_frame(
            s, kind, run_id, rank=rank, since=lo, until=hi, columns=[*base, column]
        )
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
    where: dict[str, str] | None = None,
) -> pd.DataFrame:
    """One row per record of ``kind``: the envelope and the kind's fields (the S3 columns;
    maps as ``<field>.<key>``), from both stores. For ``hw`` the InfluxDB side carries the host
    fields only; the per-GPU, disk and net lists come from S3 as JSON text. ``where``: tag (or
    S3 column) values the records must have, e.g. ``{"name": "lr_event"}`` for signals."""
    if kind not in IDENTITY:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(IDENTITY)}")
    stores = stores or Stores.from_env()
    lo, hi = _ns(since), _ns(until)

    def hot(s: InfluxSettings) -> pd.DataFrame:
        frame = query_hot.influx_frame(
            s,
            kind,
            run_id,
            rank=rank,
            since=lo,
            until=hi,
            fields=None,
            by_rank="rank" in IDENTITY[kind],
            where=where,
        )
        if frame.empty:
            return frame
        frame = frame.rename(columns=_influx_to_cold_names(kind, list(frame.columns)))
        frame["kind"] = kind
        if kind == "hw":
            frame = query_hot.with_device_lists(s, frame, run_id, lo, hi)
        return frame

    def cold(s: S3Settings) -> pd.DataFrame:
        frame = query_cold.s3_frame(s, kind, run_id, rank=rank, since=lo, until=hi, columns=None)
        for column, value in (where or {}).items():
            if column not in frame:
                return pd.DataFrame()
            frame = frame[frame[column].astype("string") == value].reset_index(drop=True)
        return frame.drop(
            columns=["payload", "time", "kafka_topic", "kafka_partition", "kafka_offset"],
            errors="ignore",
        )

    frame = stitch(*_both(stores, kind, hot, cold), [*IDENTITY[kind], "seq"])
    for name, shape in schema.payload_fields(kind).items():
        if _is_json(shape) and name in frame:
            frame[name] = frame[name].map(_from_json)
    return frame


def _is_json(shape: schema.FieldShape) -> bool:
    """Lists and free-form objects are stored as JSON text; maps of numbers are flattened."""
    return shape.python in (list, dict) and shape.numbers is None


def _from_json(value: Any) -> Any:
    """Lists and objects are JSON text in S3 (and in InfluxDB string fields)."""
    if not isinstance(value, str):
        return value
    try:
        return schema.restore(json.loads(value))
    except ValueError:
        return value


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
    known = {
        "time_ns",
        "run_id",
        "seq",
        "step",
        "host",
        *IDENTITY[kind],
        *schema.payload_fields(kind),
    }
    if kind == "batch":
        return {c: f"{map_field}.{c[len(prefix) :]}" for c in columns if c.startswith(prefix)}
    out = {}
    for c in columns:
        if c.startswith(prefix):
            out[c] = f"{map_field}.{c[len(prefix) :]}"
        elif c not in known and not c.startswith("lr_group"):
            out[c] = f"{map_field}.{c}"
    return out
