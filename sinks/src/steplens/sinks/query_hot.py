"""The query layer's reads from InfluxDB (the hot store): a run's points as DataFrames.

Non-finite numbers come back from their ``<field>_nonfinite`` strings; string fields lose the
CR that InfluxDB's CSV answers add before a newline. An answer that refuses the request
(credentials, a missing bucket or org, a bad query: HTTP 4xx) is a ``refusal``, which the
query layer reports instead of falling back to S3.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from typing import Any, Final

import pandas as pd
from influxdb_client.rest import ApiException

from steplens.schema.flux_literals import flux_string, flux_time
from steplens.schema.store_layout import (
    DEVICE_LISTS,
    MEASUREMENT,
    NONFINITE,
    RANK,
    field_in,
    of_run,
    read,
    tag_in,
)
from steplens.sinks.settings import InfluxSettings

_NONFINITE: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


# InfluxDB's answer when its query queue is full (HTTP 400): busy, not a refusal
BUSY = "queue length exceeded"


def refusal(s: InfluxSettings, exc: BaseException) -> str | None:
    """Why InfluxDB refused a request for good (an HTTP 4xx but 429), or None (unreachable,
    busy, failing: worth skipping)."""
    if not isinstance(exc, ApiException) or exc.status is None:
        return None
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else exc.body
    if exc.status >= 500 or exc.status == 429 or BUSY in (body or ""):
        return None
    hint = {
        401: "check STEPLENS_INFLUX_TOKEN",
        403: "the token may not read this bucket",
        404: "check STEPLENS_INFLUX_ORG and STEPLENS_INFLUX_BUCKET",
    }.get(exc.status, "")
    detail = f"InfluxDB at {s.url} answered HTTP {exc.status} ({(body or exc.reason or '')[:200]})"
    return f"{detail}: {hint}" if hint else detail


def csv_text(value: Any) -> Any:
    """Undo the CSV encoding of InfluxDB's query answers: a newline in a string field comes
    back as CRLF (a lone carriage return does not come back at all; S3 keeps the exact text)."""
    return value.replace("\r\n", "\n") if isinstance(value, str) else value


def _to_dt(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // 1_000_000_000, tz=timezone.utc) + timedelta(
        microseconds=(ns % 1_000_000_000) // 1000
    )


def influx_frame(
    s: InfluxSettings,
    kind: str,
    run_id: str,
    *,
    rank: int | None,
    since: int | None,
    until: int | None,
    fields: list[str] | None,
    by_rank: bool,
    where: dict[str, str] | None = None,
) -> pd.DataFrame:
    """The run's points of ``kind``, pivoted (one row per time and series, a column per
    field); ``where``: tag values the points must have."""
    from steplens.sinks.influx import make_client

    start = flux_time(_to_dt(since)) if since is not None else "1970-01-01T00:00:00Z"
    stop = flux_time(_to_dt(until + 1000)) if until is not None else "2200-01-01T00:00:00Z"
    measurement = MEASUREMENT.get(kind) or kind.lstrip("_")
    filters = [of_run(measurement, flux_string(run_id))]
    if rank is not None and by_rank:
        filters.append(tag_in(RANK, [str(rank)]))
    for tag, value in (where or {}).items():
        filters.append(tag_in(tag, [value]))
    if fields is not None:
        filters.append(f"({field_in(fields)})")
    flux = (
        read(s.bucket, start, stop, " and ".join(filters))
        + '  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
        + "  |> map(fn: (r) => ({r with time_ns: int(v: r._time)}))\n"
        + "  |> group()\n"
        + '  |> drop(columns: ["_start", "_stop", "_time", "_measurement", "result", "table"])\n'
    )
    with make_client(s) as client:
        frames = client.query_api().query_data_frame(flux, org=s.org)
    if isinstance(frames, list):
        frames = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    frame = frames.drop(columns=["result", "table"], errors="ignore")
    for col in frame.columns:
        if frame[col].dtype == object or str(frame[col].dtype).startswith("str"):
            frame[col] = frame[col].map(csv_text)
    for col in [c for c in frame.columns if str(c).endswith(NONFINITE)]:
        base = str(col)[: -len(NONFINITE)]
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


def with_device_lists(
    s: InfluxSettings, host: pd.DataFrame, run_id: str, lo: int | None, hi: int | None
) -> pd.DataFrame:
    """Fold the gpu, disk and net points of each hw record back into its lists (JSON text)."""
    host = host.copy()
    for name, (measurement, tag, key) in DEVICE_LISTS.items():
        frame = influx_frame(
            s, f"_{measurement}", run_id, rank=None, since=lo, until=hi, fields=None, by_rank=False
        )
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
