"""The stores a run's history is read from (``history``): S3's Parquet records, InfluxDB's hot
bucket, and its rollup bucket where S3 does not reach.

Needs ``steplens-sinks`` (imported only when reading: the worker runs without it). A store that
fails is logged once and asked no more by that source: history is best effort.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import numpy as np

from steplens.schema.flux_literals import flux_time_ns
from steplens.schema.store_layout import (
    MEASUREMENT,
    RUN,
    SEQ,
    field_in,
    measurement_in,
    nonfinite,
    read,
    rolled,
    tag_in,
)
from steplens.stream_jobs.engine.history import NO_FIRST, Rows
from steplens.stream_jobs.engine.signals.registry import SERIES

log = logging.getLogger("steplens.stream_jobs")


class Source:
    """Rows and run_meta from the stores (``steplens.sinks``): InfluxDB's hot bucket, S3, and
    the rollup bucket where S3 does not reach."""

    def __init__(self, stores: Any) -> None:
        from steplens.sinks import query, query_cold, query_hot

        self.stores = stores
        self.down: set[str] = set()  # stores that failed: not asked again by this source
        self._query, self._hot, self._cold = query, query_hot, query_cold

    @classmethod
    def from_env(cls) -> Source:
        from steplens.sinks.query import Stores

        return cls(Stores.from_env())

    def _try(self, store: str, what: str, fn: Callable[[], Any]) -> Any:
        """A store's answer, or None (logged once; the store is not asked again)."""
        if store in self.down:
            return None
        try:
            return fn()
        except Exception as exc:
            self.down.add(store)
            why = f"{type(exc).__name__}: {exc}"
            log.warning("history: %s not read from %s (asked no more): %s", what, store, why)
            return None

    def extent(self, run: str, since_ns: int, until_ns: int) -> tuple[int, int] | None:
        """Where the run's stored steps and windows begin and end in [since_ns, until_ns)
        (None: it has none): the hours of its S3 objects, and InfluxDB's hot points and
        rollup minutes; the whole range when a store cannot tell."""
        found = [*self._influx_extent(run, since_ns, until_ns)]
        found += self._s3_extent(run, since_ns, until_ns)
        if any(f is None for f in found):
            return since_ns, until_ns
        if not found:
            return None
        first = min(f[0] for f in found if f is not None)
        last = max(f[1] for f in found if f is not None)
        return max(since_ns, first), min(until_ns, last)

    def _s3_extent(self, run: str, since_ns: int, until_ns: int) -> list[tuple[int, int] | None]:
        """The hours of the run's step and window objects in S3 (one listing of each kind)."""
        from steplens.sinks.cold import hour_from_key

        s = self.stores.s3
        if s is None or "S3" in self.down:
            return []
        hours: set[str] = set()
        try:
            for kind in KINDS:
                for _, key in self._cold.s3_objects(s, kind, run, since_ns, until_ns):
                    hours.add(hour_from_key(key) or "")  # listed: within the range, so named
        except Exception as exc:
            self.down.add("S3")
            log.warning("history: S3 not listed (asked no more): %s: %s", type(exc).__name__, exc)
            return [None]
        if not hours:
            return []
        first = datetime.strptime(min(hours), "%Y-%m-%dT%H").replace(tzinfo=timezone.utc)
        last = datetime.strptime(max(hours), "%Y-%m-%dT%H").replace(tzinfo=timezone.utc)
        one = 3600 * 10**9
        return [(int(first.timestamp()) * 10**9, int(last.timestamp()) * 10**9 + one)]

    def _influx_extent(
        self, run: str, since_ns: int, until_ns: int
    ) -> list[tuple[int, int] | None]:
        """The first and last of the run's hot points and rollup minutes."""
        from steplens.sinks.influx import make_client

        s = self.stores.influx
        if s is None or "InfluxDB" in self.down:
            return []
        kinds = measurement_in(MEASUREMENT[k] for k in KINDS)
        where = f"{tag_in(RUN, [run])} and ({kinds})"
        span = (flux_time_ns(since_ns), flux_time_ns(until_ns))
        found: list[tuple[int, int]] = []
        try:
            with make_client(s) as client:
                api = client.query_api()
                for bucket, fields, after in (
                    (s.bucket, [SEQ], 1000),  # times come back in microseconds
                    (s.rollup_bucket, [rolled("step", "max"), rolled("step_last", "max")], MINUTE),
                ):
                    flux = (
                        "data = "
                        + read(bucket, *span, f"{where} and ({field_in(fields)})")
                        + "union(tables: [data |> first(), data |> last()])"
                        + ' |> group() |> keep(columns: ["_time"])'
                    )
                    for table in api.query(flux, org=s.org):
                        times = [_ns_of(rec.get_time()) for rec in table.records]
                        found += [(t, t + after) for t in times]
        except Exception as exc:
            self.down.add("InfluxDB")
            log.warning(
                "history: InfluxDB not read (asked no more): %s: %s", type(exc).__name__, exc
            )
            return [None]
        return [(min(f for f, _ in found), max(t for _, t in found))] if found else []

    def meta(self, run: str, since_ns: int, until_ns: int) -> dict[str, Any]:
        """The fields of the run's latest run_meta in [since_ns, until_ns) ({} when none)."""
        frame = self._try(
            "stores",
            "run_meta",
            lambda: self._query.query_records(
                run, "run_meta", since=since_ns, until=until_ns - 1, stores=self.stores
            ),
        )
        if frame is None or frame.empty:
            return {}
        last = frame.sort_values("time_ns").iloc[-1].to_dict()
        return {k: v for k, v in last.items() if _present(v)}

    def rows(self, run: str, lo: int, hi: int, metrics: list[str]) -> dict[int, Rows]:
        """Each rank's step and window rows of [lo, hi), time order. S3 first; InfluxDB for
        what S3 does not have yet (a rank's records reach S3 in order, so from the earliest of
        the ranks' last rows there); the rollup bucket's minutes where neither has the span."""
        influx, s3 = self.stores.influx, self.stores.s3
        hot_from = time.time_ns() - (influx.hot_retention_s + 300) * 10**9 if influx else 0
        frames = []
        for kind in KINDS:
            hot = cold = None
            if s3 is not None:
                cold = self._try("S3", kind, functools.partial(self._cold_rows, kind, run, lo, hi))
            since = lo
            if cold is not None and len(cold):
                since = max(lo, int(cold.groupby("rank")["time_ns"].max().min()))
            if influx is not None and hi > max(since, hot_from):
                span = (kind, run, since, hi)
                hot = self._try("InfluxDB", kind, functools.partial(self._hot_rows, *span))
            if _empty(hot) and _empty(cold) and influx is not None:
                # neither raw store has the span (S3 does not reach it): its minutes
                span = (kind, run, lo, hi)
                cold = self._try("rollups", kind, functools.partial(self._rollups, *span))
            frames.append(self._query.stitch(_frame(hot), _frame(cold), ["rank"]))
        return _by_rank([f for f in frames if len(f)], metrics)

    def _hot_rows(self, kind: str, run: str, lo: int, hi: int) -> Any:
        s = self.stores.influx
        if kind == "step":
            fields = ["step", *(f for m in _METRICS for f in (m, nonfinite(m)))]
            return self._hot.influx_frame(
                s, kind, run, rank=None, since=lo, until=hi - 1, fields=fields, by_rank=True
            )
        frame = self._hot.influx_frame(
            s,
            kind,
            run,
            rank=None,
            since=lo,
            until=hi - 1,
            fields=["step_first", "step_last", "mean", "last"],
            by_rank=True,
        )
        return _windows_of_points(frame)

    def _cold_rows(self, kind: str, run: str, lo: int, hi: int) -> Any:
        s = self.stores.s3
        cols = ["time_ns", "rank", "step"]
        cols += list(_METRICS) if kind == "step" else ["step_first", "step_last", "metrics"]
        frame = self._cold.s3_frame(s, kind, run, rank=None, since=lo, until=hi - 1, columns=cols)
        if kind == "step" or frame.empty:
            return frame
        return _windows_of_records(frame)

    def _rollups(self, kind: str, run: str, lo: int, hi: int) -> Any:
        s = self.stores.influx
        rollups = replace(s, bucket=s.rollup_bucket)
        if kind == "step":
            # a minute's steps: its first and last; each metric: its mean
            names = {rolled(m, "mean"): m for m in _METRICS}
            names.update({rolled("step", "min"): "step_first", rolled("step", "max"): "step"})
        else:
            names = {
                rolled("step_first", "min"): "step_first",
                rolled("step_last", "max"): "step_last",
                rolled("mean", "mean"): "mean",
            }
        frame = self._hot.influx_frame(
            rollups, kind, run, rank=None, since=lo, until=hi - 1, fields=list(names), by_rank=True
        )
        if frame.empty:
            return frame
        frame = frame.rename(columns=names)
        return frame if kind == "step" else _windows_of_points(frame)


KINDS = ("step", "step_window")  # the record kinds history reads
MINUTE = 60 * 10**9  # a rollup's span, ns

# every step field a detector may read: the rows carry them all, each run's detectors use theirs
_METRICS: tuple[str, ...] = tuple(sorted({m for e in SERIES for m in e.metrics}))


def _ns_of(t: Any) -> int:
    """A datetime as integer nanoseconds (its microseconds exactly)."""
    whole = t.replace(microsecond=0).timestamp()
    return int(whole) * 10**9 + t.microsecond * 1000


def _present(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _empty(x: Any) -> bool:
    return x is None or len(x) == 0


def _frame(x: Any) -> Any:
    import pandas as pd

    return x if x is not None else pd.DataFrame()


def _windows_of_points(frame: Any) -> Any:
    """InfluxDB's step_window points (one per window and metric) as one row per window: the
    metrics' means as columns, ``step_first`` and ``step`` (the last)."""
    if frame.empty or "metric" not in frame:
        return frame.iloc[0:0]
    value = frame["mean"] if "mean" in frame else frame.get("last")
    if value is None:
        return frame.iloc[0:0]
    frame = frame.assign(value=value.astype("float64"))
    keys = ["time_ns", "rank"]
    wide = frame.pivot_table(index=keys, columns="metric", values="value", aggfunc="last")
    steps = frame.groupby(keys)[["step_first", "step_last"]].max()
    out = wide.join(steps).reset_index()
    out.columns = [str(c) for c in out.columns]
    return out.rename(columns={"step_last": "step"})


def _windows_of_records(frame: Any) -> Any:
    """S3's step_window rows (``metrics`` as JSON text) as one row per window, each metric's
    mean (else its last value) a column."""
    import pandas as pd

    means = []
    for text in frame["metrics"]:
        try:
            stats = json.loads(text) if isinstance(text, str) else {}
        except ValueError:
            stats = {}
        means.append(
            {
                m: _number(s.get("mean", s.get("last")))
                for m, s in (stats.items() if isinstance(stats, dict) else ())
                if isinstance(s, dict)
            }
        )
    wide = pd.DataFrame(means, index=frame.index)
    base = frame[["time_ns", "rank", "step_first", "step_last"]].rename(
        columns={"step_last": "step"}
    )
    return pd.concat([base, wide], axis=1)


def _number(v: Any) -> float:
    if isinstance(v, str):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(v, math.nan)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _by_rank(frames: list[Any], metrics: list[str]) -> dict[int, Rows]:
    """Stitched frames of both kinds as each rank's rows in time order (``metrics`` only)."""
    import pandas as pd

    if not frames:
        return {}
    frame = pd.concat(frames, ignore_index=True)
    frame = frame.dropna(subset=["rank", "step"])
    if "step_first" not in frame:
        frame["step_first"] = np.nan
    frame = frame.sort_values("time_ns", kind="stable")
    out: dict[int, Rows] = {}
    for rank, part in frame.groupby("rank", sort=True):
        values = {
            m: part[m].to_numpy(dtype="float64", na_value=math.nan) for m in metrics if m in part
        }
        values = {m: v for m, v in values.items() if not np.isnan(v).all()}
        out[int(rank)] = Rows(
            part["time_ns"].to_numpy(dtype="int64"),
            part["step"].to_numpy(dtype="int64"),
            part["step_first"].fillna(NO_FIRST).to_numpy(dtype="int64"),
            values,
        )
    return out
