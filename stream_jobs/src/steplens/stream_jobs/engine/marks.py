"""What a batch's signals say besides their values: the first step a window's breaches cover,
and, for a rank warm-started from history, where its baselines came from."""

from __future__ import annotations

from typing import Any

import numpy as np

from steplens.stream_jobs.engine.core import Signals
from steplens.stream_jobs.engine.signals import dynamic_baseline


def mark(
    batch: list[Signals], n: int, firsts: np.ndarray | None, baseline: list[Any] | None
) -> None:
    """``batch``, the signals of ``n`` rows: a window's breaches name the first step it covers
    (``firsts``: each row's); while the rank's ``baseline`` mark lasts ([detail, values left],
    from a warm start) its signals say where its baselines came from, and the values left
    count down by ``n``."""
    if firsts is not None:
        _mark_spans(batch, firsts)
    if baseline is not None:
        _mark_baseline(batch, baseline, n)


def _mark_spans(batch: list[Signals], firsts: np.ndarray) -> None:
    """A window's breaches name the first step it covers (``span_first``): an aggregate is
    judged over its span, and one that covers an incident already over adds to it
    (``incidents``); a warning held from another rank's window keeps that one's."""
    for sigs in batch:
        hot = np.flatnonzero(sigs.severity).tolist()
        if not hot:
            continue
        if sigs.detail is None:
            sigs.detail = [None] * len(sigs)
        for k in hot:
            first = int(firsts[int(sigs.row[k])])
            sigs.detail[k] = {"span_first": first, **(sigs.detail[k] or {})}


def _mark_baseline(batch: list[Signals], baseline: list[Any], n: int) -> None:
    detail = baseline[0]
    for sigs in batch:
        if sigs.name == dynamic_baseline.NAME:  # says its own baseline (7d or in-run)
            continue
        d = sigs.detail  # one dict shared: the outputs copy it
        if d is None:
            sigs.detail = [detail] * len(sigs)
        else:
            sigs.detail = [detail if x is None else {**x, **detail} for x in d]
    baseline[1] -= n
