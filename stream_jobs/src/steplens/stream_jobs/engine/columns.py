"""Step records as columns: a ``step_batch``'s entries (and ``step`` records, as entries) and a
``step_window`` become a metric -> values-per-row table, the one shape
``RunDetector.process_columns`` scores."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import numpy as np

Cells = Sequence[float | None] | np.ndarray  # a metric's value per row (None: the row has none)
Columns = Mapping[str, Cells]

# step fields that are flags (bool), scored as 1.0 or 0.0
FLAGS = frozenset({"clipped"})
# step fields that are not series to score on their own
NOT_SERIES = frozenset(
    {
        "tokens",
        "group_lrs",
        "reason",
        "scalars",
        "data_time_s",
        "layer_grad_norms",
        "layer_param_norms",
    }
)

# entry fields that are not series of their own (scalars are, one by one)
_NOT_BATCH_SERIES = NOT_SERIES | {"step", "time_ns"}


def _number(x: Any) -> TypeGuard[float]:
    return type(x) is float or (isinstance(x, (int, float)) and not isinstance(x, bool))


def entry_columns(entries: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """The series of a step_batch's entries as columns (a row's value, or ``None``), in the
    order the fields first appear, then the scalars' (a step field of the same name wins)."""
    n = len(entries)
    columns: dict[str, list[float | None]] = {}
    names = dict.fromkeys(entries[0]) if entries else {}
    for e in entries:
        if e.keys() != names.keys():
            names.update(dict.fromkeys(e))
    for name in names:
        if name in _NOT_BATCH_SERIES:
            continue
        got: list[Any] = [e.get(name) for e in entries]
        if name in FLAGS:  # a flag (clipped): 1.0 or 0.0
            got = [None if type(v) is not bool else float(v) for v in got]
            if all(v is None for v in got):
                continue
        elif not all(type(v) is float for v in got):  # the common case, checked first
            got = [float(v) if _number(v) else None for v in got]
            if all(v is None for v in got):
                continue
        columns[name] = got
    if "scalars" in names:
        for i, e in enumerate(entries):
            for name, x in (e.get("scalars") or {}).items():
                if _number(x):
                    col = columns.get(name)
                    if col is None:
                        col = columns[name] = [None] * n
                    if col[i] is None:
                        col[i] = float(x)
    return columns


# metrics a window stands for by its last value, not its mean: the lr now is what the schedule
# declares; a blow-up of a few steps inside a window is judged on the raw steps the producer's
# guard sends, and a mean that still holds it 100 steps later is old news
LAST_OF_WINDOW = frozenset({"lr"})

Window = tuple[
    int | None,
    int | None,
    dict[str, list[float | None]],
    dict[str, float],
    float | None,
    dict[str, tuple[float, int]],
]


def window_columns(data: dict[str, Any], step: int | None) -> Window:
    """A ``step_window``'s last and first step, its metrics' means (``LAST_OF_WINDOW``: last
    values) as one-row columns, their extremes (NaN: a non-finite value in the window), its
    mean data wait (without its longest: ``_typical_wait``), and each metric's own spread:
    its standard deviation over the window's steps (NaN when not sent) and its count of
    finite values."""
    columns: dict[str, list[float | None]] = {}
    peaks: dict[str, float] = {}
    spreads: dict[str, tuple[float, int]] = {}
    for name, stats in data["metrics"].items():
        if not isinstance(stats, dict):
            continue
        if name in LAST_OF_WINDOW:
            mean = stats.get("last", stats.get("mean"))
        else:
            mean = stats.get("mean", stats.get("last"))
        if not _number(mean):
            continue
        columns[name] = [float(mean)]
        if stats.get("nonfinite"):
            peaks[name] = math.nan
        elif _number(stats.get("max")):
            peaks[name] = float(stats["max"])
        count, std = stats.get("count"), stats.get("std")
        if isinstance(count, int) and not isinstance(count, bool):
            spreads[name] = (float(std) if _number(std) else math.nan, count)
    last = data.get("step_last", step)
    first = data.get("step_first")
    wait = _typical_wait(data["metrics"].get("data_time_s"))
    return (
        last if isinstance(last, int) else None,
        first if isinstance(first, int) else None,
        columns,
        peaks,
        float(wait) if _number(wait) else None,
        spreads,
    )


def _typical_wait(stats: Any) -> float | None:
    """A window's mean data wait without its longest one (a loader's start, a shard opened):
    one slow batch is no input pipeline that holds the steps back."""
    if not isinstance(stats, dict) or not _number(stats.get("mean")):
        return None
    mean, count, top = float(stats["mean"]), stats.get("count"), stats.get("max")
    if isinstance(count, int) and count > 1 and _number(top):
        return max(0.0, (mean * count - float(top)) / (count - 1))
    return mean


def floats_of(cells: Cells | Sequence[float | None]) -> tuple[np.ndarray, np.ndarray | None]:
    """A column as floats (NaN where a row has none) and which rows have a value (None: all)."""
    if isinstance(cells, np.ndarray):
        return cells.astype(np.float64, copy=False), None
    xs = np.array(cells, dtype=np.float64)  # None becomes NaN
    if None not in cells:
        return xs, None
    return xs, np.array([c is not None for c in cells], dtype=np.bool_)
