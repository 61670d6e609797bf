"""The input length distribution of a run, per window: the length histograms of its ``batch``
records (all ranks) summed over ``window`` records, one ``length_histogram`` signal per window
(value: the window's mean length; detail: the bin edges, the counts, the over-length share), for
the board and the report. A record, not a judgement: published whole, never an alert (the
over-length share is judged per batch by ``data_quality``).

Bounded: one histogram of at most ``max_bins`` bins; a record whose edges differ from the
window's (another max length) closes the window early and starts one with its edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from steplens.schema import Record
from steplens.stream_jobs.engine.core import Run, Signals, one

NAME = "length_histogram"


@dataclass
class LengthConfig:
    window: int = 20  # batch records per histogram
    max_bins: int = 64  # a record with more bins is not counted


@dataclass
class LengthState:
    edges: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    records: int = 0  # in the open window
    over: int = 0  # over-length samples in the open window
    total_len: float = 0.0  # the sum of the records' mean lengths times their samples
    first_step: int | None = None


def _ints(v: Any) -> list[int] | None:
    if not isinstance(v, list) or not all(type(x) is int for x in v):
        return None
    return v


def on_record(state: LengthState, cfg: LengthConfig, rec: Record, run: Run) -> list[Signals]:
    data = rec.data
    edges, counts = _ints(data.get("length_edges")), _ints(data.get("length_counts"))
    if not edges or counts is None or len(edges) != len(counts) + 1 or len(counts) > cfg.max_bins:
        return []
    out: list[Signals] = []
    if state.records and edges != state.edges:  # another max length: the window ends here
        out.append(_close(state, rec.step))
    if not state.records:
        state.edges, state.counts = list(edges), [0] * len(counts)
        state.first_step = rec.step
    state.counts = [a + b for a, b in zip(state.counts, counts, strict=True)]
    n = sum(counts)
    state.records += 1
    over = data.get("over_length")
    state.over += over if type(over) is int else 0
    mean = data.get("length_mean")
    if isinstance(mean, (int, float)) and math.isfinite(mean):
        state.total_len += float(mean) * n
    if state.records >= cfg.window:
        out.append(_close(state, rec.step))
    return out


def _close(state: LengthState, step: int | None) -> Signals:
    n = sum(state.counts)  # the open window's samples
    detail = {
        "edges": state.edges,
        "counts": state.counts,
        "samples": n,
        "over_length_share": state.over / n if n else 0.0,
        "first_step": state.first_step,
    }
    mean = state.total_len / n if n else math.nan
    sig = one(NAME, "length", step, mean, 0.0, detail=detail)
    state.records = state.over = 0
    state.total_len = 0.0
    return sig
