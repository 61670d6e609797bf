"""Training data across both stores: per-layer norms, and the batch of one step on one rank.

``query_layers``: the ``layer`` points of InfluxDB and the ``layer_*_norms.<layer>`` columns of
the step rows in S3, as one long frame (a row per step, rank and layer). ``query_batch``: what a
rank logged with ``log_batch`` at one step (its samples' hashes and ids, the length histogram),
which ``steplens query --batch`` prints: the samples behind a spike.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import pandas as pd

from steplens.sinks import query_cold, query_hot
from steplens.sinks.points import LENGTH_BIN
from steplens.sinks.query import Stores, _both, _ns, query_records, stitch
from steplens.sinks.settings import InfluxSettings, S3Settings

LAYER_COLUMNS: Final = ["time_ns", "step", "rank", "layer", "grad_norm", "param_norm", "source"]
_MAPS: Final = {"layer_grad_norms.": "grad_norm", "layer_param_norms.": "param_norm"}


def query_layers(
    run_id: str,
    rank: int | None = None,
    since: datetime | str | int | None = None,
    until: datetime | str | int | None = None,
    *,
    stores: Stores | None = None,
) -> pd.DataFrame:
    """Per-layer gradient and parameter norms: ``LAYER_COLUMNS``, one row per point."""
    stores = stores or Stores.from_env()
    lo, hi = _ns(since), _ns(until)

    def hot(s: InfluxSettings) -> pd.DataFrame:
        frame = query_hot.influx_frame(
            s, "_layer", run_id, rank=rank, since=lo, until=hi, fields=None, by_rank=True
        )
        keep = [c for c in LAYER_COLUMNS if c in frame]
        return frame[keep] if "layer" in frame else pd.DataFrame()

    def cold(s: S3Settings) -> pd.DataFrame:
        frame = query_cold.s3_frame(s, "step", run_id, rank=rank, since=lo, until=hi, columns=None)
        parts = []
        for prefix, value in _MAPS.items():
            cols = [c for c in frame.columns if str(c).startswith(prefix)]
            if not cols:
                continue
            long = frame[["time_ns", "step", "rank", *cols]].melt(
                id_vars=["time_ns", "step", "rank"], var_name="layer", value_name=value
            )
            long["layer"] = long["layer"].str.slice(len(prefix))
            keys = ["time_ns", "step", "rank", "layer"]
            parts.append(long.dropna(subset=[value]).set_index(keys))
        if not parts:
            return pd.DataFrame()
        return pd.concat(parts, axis=1).reset_index()

    frame = stitch(*_both(stores, "step", hot, cold), ["rank", "layer"])
    if frame.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in LAYER_COLUMNS})
    for col in ("grad_norm", "param_norm"):
        frame[col] = frame[col].astype("float64") if col in frame else float("nan")
    for col in ("step", "rank"):
        frame[col] = frame[col].astype("Int64")
    return frame[[c for c in ["time", *LAYER_COLUMNS] if c in frame]]


@dataclass
class Batch:
    """One ``log_batch`` record: its samples and lengths."""

    run_id: str
    rank: int
    step: int
    n_samples: int
    source: str
    hashes: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    lengths: list[tuple[int, int, int]] = field(default_factory=list)  # (from, below, count)
    facts: dict[str, Any] = field(default_factory=dict)  # length_max, epoch, max_len, ...


_FACTS: Final = (
    "length_max",
    "length_mean",
    "max_len",
    "over_length",
    "epoch",
    "supervised_share",
)


def query_batch(
    run_id: str,
    rank: int,
    step: int,
    since: datetime | str | int | None = None,
    until: datetime | str | int | None = None,
    *,
    stores: Stores | None = None,
) -> Batch | None:
    """The batch ``rank`` logged at ``step`` (the newest, if it logged two), or None."""
    frame = query_records(run_id, "batch", rank=rank, since=since, until=until, stores=stores)
    if frame.empty or "step" not in frame:
        return None
    rows = frame[frame["step"].astype("Int64") == step]
    if rows.empty:
        return None
    row = rows.sort_values("time_ns").iloc[-1].to_dict()
    out = Batch(run_id, rank, step, int(row.get("n_samples") or 0), str(row.get("source")))
    out.hashes = [str(h) for h in _list(row.get("sample_hashes"))]
    out.ids = [str(i) for i in _list(row.get("sample_ids"))]
    out.lengths = length_bins(row)
    out.facts = {k: row[k] for k in _FACTS if k in row and not _missing(row[k])}
    labels = {k[len("label_counts.") :]: v for k, v in row.items() if k.startswith("label_counts.")}
    if any(not _missing(v) for v in labels.values()):
        out.facts["label_counts"] = {k: int(v) for k, v in labels.items() if not _missing(v)}
    return out


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _list(value: Any) -> list[Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return list(value) if isinstance(value, (list, tuple)) else []


def length_bins(row: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(from, below, count) per length bin of one batch record (a row of either store): S3
    keeps the record's edges and counts, InfluxDB a ``len_lt_<edge>`` field per bin (the
    edges are powers of two: each bin starts at the one before)."""
    edges, counts = _list(row.get("length_edges")), _list(row.get("length_counts"))
    if edges and len(edges) == len(counts) + 1:
        return [(int(a), int(b), int(c)) for a, b, c in zip(edges, edges[1:], counts, strict=False)]
    bins = sorted(
        (int(k[len(LENGTH_BIN) :]), int(v))
        for k, v in row.items()
        if k.startswith(LENGTH_BIN) and k[len(LENGTH_BIN) :].isdigit() and not _missing(v)
    )
    out, start = [], 0
    for upper, count in bins:
        out.append((start, upper, count))
        start = upper
    return out


def format_batch(b: Batch) -> str:
    """The batch as text: facts, the length histogram, then one line per sample."""
    facts = ", ".join(
        f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in b.facts.items()
    )
    lines = [
        f"batch of run {b.run_id}, rank {b.rank}, step {b.step} (from {b.source}): "
        f"{b.n_samples} samples" + (f"; {facts}" if facts else ""),
        "lengths: " + ", ".join(f"[{lo},{hi}) {n}" for lo, hi, n in b.lengths if n),
    ]
    if len(b.hashes) < b.n_samples:
        lines.append(f"({b.n_samples - len(b.hashes)} samples past the record's limit not listed)")
    lines.append(f"{'sample':>6}  {'hash':<16}  id")
    for i, h in enumerate(b.hashes):
        lines.append(f"{i:>6}  {h:<16}  {b.ids[i] if i < len(b.ids) else ''}")
    return "\n".join(lines)
