"""What a report needs, read from the stores: ``RunData`` and ``load_run``.

Everything is read through the query layer (``steplens.sinks.query``: InfluxDB for recent
data, S3 for older), so a report can be built for any run still in either store.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from steplens.sinks.report_plot import column

if TYPE_CHECKING:
    from steplens.sinks.query import Stores

STEP_FIELDS = (
    "loss",
    "lr",
    "grad_norm",
    "grad_norm_preclip",
    "clipped",
    "step_time_s",
    "data_time_s",
    "tokens_per_s",
    "mfu",
)


@dataclass
class RunData:
    """What a report needs, as DataFrames with at least ``step``/``time`` columns.

    ``steps``: one row per (rank, step) with the step fields as columns.
    ``signals``, ``alerts``: stream-job outputs, one row per record, fields as columns.
    ``evals``: one row per eval record (step, split, loss, accuracy, f1, bleu, rouge, ...).
    ``batches``: one row per batch record (step, rank, ``lengths`` as (from, below, count)
    bins, over_length_share, supervised_share, ...).
    ``layers``: per-layer norms, one row per (step, rank, layer).
    ``lr_events``: the worker's ``lr_event`` signals (step, text).
    ``gpu``, ``host``, ``disks``, ``nets``: hardware samples (``time``, ``host``, the device
    (``gpu``, ``device``, ``iface``) and its fields as columns).
    ``comm``: the inter-rank communication probe, one row per record.
    ``checks``: the checks of the design each rank runs (``run_meta``'s ``checks``): one row
    per rank and check (``rank``, ``check``, ``state``, ``needs``, ``why``, ``enable``).
    ``advice``, ``acted``: the advice the stream jobs gave the run's ranks and their answers,
    one row per record (``fingerprint``, ``action``, the kind's fields).
    """

    run_id: str
    steps: pd.DataFrame
    signals: pd.DataFrame = field(default_factory=pd.DataFrame)
    alerts: pd.DataFrame = field(default_factory=pd.DataFrame)
    gpu: pd.DataFrame = field(default_factory=pd.DataFrame)
    host: pd.DataFrame = field(default_factory=pd.DataFrame)
    lr_schedule: dict[str, Any] | None = None
    evals: pd.DataFrame = field(default_factory=pd.DataFrame)
    batches: pd.DataFrame = field(default_factory=pd.DataFrame)
    layers: pd.DataFrame = field(default_factory=pd.DataFrame)
    lr_events: pd.DataFrame = field(default_factory=pd.DataFrame)
    disks: pd.DataFrame = field(default_factory=pd.DataFrame)
    nets: pd.DataFrame = field(default_factory=pd.DataFrame)
    comm: pd.DataFrame = field(default_factory=pd.DataFrame)
    checks: pd.DataFrame = field(default_factory=pd.DataFrame)
    advice: pd.DataFrame = field(default_factory=pd.DataFrame)
    acted: pd.DataFrame = field(default_factory=pd.DataFrame)
    baselines: pd.DataFrame = field(default_factory=pd.DataFrame)


CHECK_COLUMNS = ["rank", "check", "state", "needs", "why", "enable"]
SIGNAL_FIELDS = ("value", "expected", "lower", "upper", "score")


def load_run(run_id: str) -> RunData:
    """Read a run through the query layer into a ``RunData``."""
    from steplens.sinks import query, query_data

    series = []
    for metric in STEP_FIELDS:
        df = query.query_series(run_id, metric)
        if df is not None and not df.empty:
            series.append(df.assign(metric=metric))
    if series:
        long = pd.concat(series, ignore_index=True)
        steps = long.pivot_table(
            index=["rank", "step"], columns="metric", values="value", aggfunc="last"
        ).reset_index()
        if "time_ns" in long.columns:
            first_seen = long.groupby(["rank", "step"])["time_ns"].min().rename("time_ns")
            steps = steps.merge(first_seen.reset_index(), on=["rank", "step"], how="left")
    else:
        steps = pd.DataFrame(columns=["rank", "step", "loss", "lr"])
    alerts = _records(query, run_id, "alert")
    meta = _records(query, run_id, "run_meta")
    hw = _host_wide(_records(query, run_id, "hw"))
    return RunData(
        run_id=run_id,
        steps=steps,
        signals=_signals(query, run_id),
        alerts=_with_steps(alerts, steps),
        gpu=_explode_gpus(hw),
        host=hw,
        lr_schedule=_schedule(meta),
        evals=_records(query, run_id, "eval"),
        batches=_batches(_records(query, run_id, "batch")),
        layers=query_data.query_layers(run_id),
        lr_events=_lr_events(query.query_records(run_id, "signal", where={"name": "lr_event"})),
        disks=_explode(hw, "disks", "device"),
        nets=_explode(hw, "nets", "iface"),
        comm=_records(query, run_id, "comm"),
        checks=checks_of(meta),
        advice=_records(query, run_id, "advice"),
        acted=_records(query, run_id, "acted"),
        baselines=_baselines(query.query_records(run_id, "signal", where={"name": "baseline"})),
    )


def _baselines(frame: pd.DataFrame) -> pd.DataFrame:
    """The 7-day baselines' minute signals: time, metric, scope (a GPU, disk, interface or
    rank), the minute's value, the band (expected, lower, upper) and which baseline it was
    (``7d`` or ``in-run``)."""
    cols = ["time", "metric", "scope", "value", "expected", "lower", "upper", "baseline"]
    if frame.empty or "metric" not in frame:
        return pd.DataFrame(columns=cols)
    details = [_detail(d) for d in frame.get("detail", pd.Series([None] * len(frame)))]
    scope = frame["scope"] if "scope" in frame else pd.Series([None] * len(frame))
    pairs = zip(scope, details, strict=True)
    out = frame.assign(
        scope=[s if isinstance(s, str) else d.get("scope", "run") for s, d in pairs],
        baseline=[d.get("baseline") for d in details],
    )
    for c in cols:
        if c not in out:
            out[c] = np.nan
    return out[cols].sort_values("time").reset_index(drop=True)


def _detail(detail: Any) -> dict[str, Any]:
    if isinstance(detail, str):
        try:
            detail = json.loads(detail)
        except ValueError:
            return {}
    return detail if isinstance(detail, dict) else {}


def _batches(frame: pd.DataFrame) -> pd.DataFrame:
    """Batch records with their length bins as one column of (from, below, count) lists, and
    the over-length share wherever the record allows it."""
    if frame.empty or "step" not in frame:
        return frame
    from steplens.sinks.query_data import length_bins

    out = frame.copy()
    out["lengths"] = [length_bins(row) for row in frame.to_dict("records")]
    if "over_length" in out and "n_samples" in out:
        share = out["over_length"].astype("float64") / out["n_samples"].astype("float64")
        out["over_length_share"] = share.where(out["n_samples"] > 0)
    return out


def _lr_events(frame: pd.DataFrame) -> pd.DataFrame:
    """The lr events the worker found (step and its words), in step order."""
    if frame.empty or "step" not in frame:
        return pd.DataFrame(columns=["step", "text"])
    texts = [_event_text(d) for d in frame.get("detail", pd.Series([None] * len(frame)))]
    out = pd.DataFrame({"step": frame["step"].astype("float64"), "text": texts})
    return out.dropna(subset=["step"]).drop_duplicates().sort_values("step").reset_index(drop=True)


def _event_text(detail: Any) -> str:
    if isinstance(detail, str):
        try:
            detail = json.loads(detail)
        except ValueError:
            return detail
    if isinstance(detail, dict):
        for key in ("text", "event", "summary", "message"):
            if isinstance(detail.get(key), str):
                return str(detail[key])
        return ", ".join(f"{k}={v}" for k, v in detail.items() if k != "scope")
    return "" if detail is None else str(detail)


def _signals(query: Any, run_id: str) -> pd.DataFrame:
    """Signals field by field (a run publishes many; one wide read of all is slow)."""
    keys = ["time_ns", "step", "rank", "name", "metric"]
    merged: pd.DataFrame | None = None
    for name in SIGNAL_FIELDS:
        df = query.query_series(run_id, name, kind="signal")
        if df is None or df.empty or not set(keys) <= set(df.columns):
            continue
        df = df[[*keys, "value"]].rename(columns={"value": name})
        merged = df if merged is None else merged.merge(df, on=keys, how="outer")
    return merged if merged is not None else pd.DataFrame()


def _with_steps(alerts: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Alerts about time without progress carry no step: use the last step stored before."""
    if alerts.empty or "time_ns" not in alerts or "time_ns" not in steps or steps.empty:
        return alerts
    timeline = steps.dropna(subset=["time_ns"]).sort_values("time_ns")
    times = timeline["time_ns"].to_numpy(dtype="int64")
    reached = timeline["step"].cummax().to_numpy()
    out = alerts.copy()
    if "step" not in out:
        out["step"] = np.nan
    missing = out["step"].isna() & out["time_ns"].notna()
    if not missing.any():
        return out
    idx = np.searchsorted(times, out.loc[missing, "time_ns"].to_numpy(dtype="int64"), "right")
    out.loc[missing, "step"] = [float(reached[i - 1]) if i > 0 else np.nan for i in idx]
    return out


def _records(query: Any, run_id: str, kind: str) -> pd.DataFrame:
    df = query.query_records(run_id, kind)
    return df if df is not None else pd.DataFrame()


def checks_of(meta: pd.DataFrame) -> pd.DataFrame:
    """``CHECK_COLUMNS`` from ``run_meta`` records: each rank's newest list of checks."""
    if meta.empty or "checks" not in meta.columns:
        return pd.DataFrame(columns=CHECK_COLUMNS)
    order = [c for c in ("time_ns", "time") if c in meta.columns]
    newest = meta.sort_values(order) if order else meta
    if "rank" in newest.columns:
        newest = newest.groupby("rank", sort=True).tail(1)
    rows = []
    for rec in newest.to_dict("records"):
        found = rec.get("checks")
        if isinstance(found, str):
            try:
                found = json.loads(found)
            except ValueError:
                continue
        if not isinstance(found, (list, tuple, np.ndarray)):
            continue
        for c in found:
            if isinstance(c, dict) and c.get("check"):
                rows.append({"rank": rec.get("rank"), **{k: c.get(k) for k in CHECK_COLUMNS[1:]}})
    out = pd.DataFrame(rows, columns=CHECK_COLUMNS)
    return out.sort_values(["rank"], kind="stable").reset_index(drop=True)


def _schedule(meta: pd.DataFrame) -> dict[str, Any] | None:
    if meta.empty or "lr_schedule" not in meta.columns:
        return None
    value = meta["lr_schedule"].dropna()
    if value.empty:
        return None
    first = value.iloc[0]
    if isinstance(first, str):
        try:
            parsed = json.loads(first)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return first if isinstance(first, dict) else None


def _explode(hw: pd.DataFrame, column: str, key: str) -> pd.DataFrame:
    """hw records carry lists of devices (GPUs, disks, network interfaces): one row per
    (time, host, device) with every field of the entry."""
    if hw.empty or column not in hw.columns:
        return pd.DataFrame()
    rows = []
    for when, host, value in zip(hw["time"], hw["host"], hw[column], strict=True):
        items = value
        if isinstance(value, str):  # the stores keep the list as JSON text
            try:
                items = json.loads(value)
            except ValueError:
                continue
        if not isinstance(items, (list, tuple, np.ndarray)):
            continue
        rows += [{"time": when, "host": host, **d} for d in items if isinstance(d, dict)]
    out = pd.DataFrame(rows)
    if not out.empty and key not in out.columns:
        out[key] = 0 if key == "index" else "?"
    return out


def _host_wide(hw: pd.DataFrame) -> pd.DataFrame:
    """The host-wide samples (local rank 0's, with ``gpu_status``): the other ranks' ``hw``
    records carry only their PyTorch allocator's GPU figures, which would read as gaps in
    NVML's and the host's series."""
    if hw.empty or "gpu_status" not in hw.columns:
        return hw
    return hw[hw["gpu_status"].notna()].reset_index(drop=True)


def _explode_gpus(hw: pd.DataFrame) -> pd.DataFrame:
    """One row per (time, host, gpu) with every field of the GPU entry, and mem_used_pct."""
    gpu = _explode(hw, "gpus", "index").rename(columns={"index": "gpu"})
    if gpu.empty:
        return gpu
    used = pd.to_numeric(column(gpu, "mem_used_bytes"), errors="coerce")
    total = pd.to_numeric(column(gpu, "mem_total_bytes"), errors="coerce")
    gpu["mem_used_pct"] = 100 * used.fillna(0) / total.where(total > 0)
    return gpu


def last_steps(run_id: str, stores: Stores | None = None) -> dict[int, int]:
    """rank -> the last step stored for it (in ``stores``, default both): a step record's (with
    a loss) or the last step of a ``step_window`` (windowed runs store one step in many raw)."""
    from steplens.sinks import query

    out: dict[int, int] = {}
    steps = query.query_series(run_id, "loss", stores=stores)
    windows = query.query_series(run_id, "step_last", kind="step_window", stores=stores)
    for frame, col in ((steps, "step"), (windows, "value")):
        if frame.empty or col not in frame:
            continue
        for rank, last in frame.dropna(subset=[col]).groupby("rank")[col].max().items():
            out[int(rank)] = max(out.get(int(rank), -1), int(last))
    return out


def _world_size(run_id: str, stores: Stores | None) -> int | None:
    from steplens.sinks import query

    meta = query.query_records(run_id, "run_meta", stores=stores)
    if meta.empty or "world_size" not in meta:
        return None
    size = pd.to_numeric(meta["world_size"], errors="coerce").max()
    return None if pd.isna(size) else int(size)


def missing_steps(last: dict[int, int], last_step: int, world_size: int | None) -> str | None:
    """What keeps ``last_step`` from being stored on every rank (of ``world_size``, else of the
    ranks seen), in words; None when nothing does."""
    ranks = range(world_size) if world_size else sorted(last)
    if not ranks:
        return "no step of the run is stored"
    behind = [
        f"rank {r}: {_gap(last.get(r), last_step)}" for r in ranks if last.get(r, -1) < last_step
    ]
    return "; ".join(behind) or None


def _gap(last: int | None, last_step: int) -> str:
    if last is None:
        return "nothing stored"
    first = last + 1
    return (
        f"step {last_step} missing" if first == last_step else f"steps {first}-{last_step} missing"
    )


def wait_for_steps(
    run_id: str, last_step: int, timeout_s: float, stores: Stores | None = None
) -> str | None:
    """Poll the stores until every rank of the run stored ``last_step`` (as a step or as the
    end of a window), within ``timeout_s``; None then, else what is missing. A store that does
    not answer (a timeout) is asked again; one that refuses raises ``StoreRefused``."""
    from steplens.sinks.query import StoreRefused

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = last_steps(run_id, stores)
            missing = missing_steps(found, last_step, _world_size(run_id, stores))
        except StoreRefused:
            raise
        except Exception as exc:
            missing = f"the stores did not answer: {exc}"
        if missing is None or time.monotonic() >= deadline:
            return missing
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def checks_by_name(checks: pd.DataFrame) -> pd.DataFrame:
    """One row per check, in the producer's order: ``state`` (one state, or each rank's when
    they differ: ``"off on ranks 1, 2; on on rank 0"``), ``detail`` (what feeds it, or why it is
    off) and ``enable`` (the line that turns it on)."""
    cols = ["check", "state", "detail", "enable"]
    if checks.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for name, g in checks.groupby("check", sort=False):
        states = g.groupby("state", sort=False)["rank"].apply(list)
        if len(states) == 1:
            state = str(states.index[0])
        else:
            state = "; ".join(
                f"{s} on rank{'s' if len(r) > 1 else ''} {', '.join(str(x) for x in r)}"
                for s, r in states.items()
            )
        detail = [d for col in ("why", "needs") for d in g[col].dropna().unique() if d]
        enable = [e for e in g["enable"].dropna().unique() if e]
        rows.append([name, state, "; ".join(map(str, detail)), "; ".join(map(str, enable))])
    return pd.DataFrame(rows, columns=cols)
