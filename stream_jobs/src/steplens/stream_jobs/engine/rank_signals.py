"""A rank's own signals: the metrics of consecutive steps (a batch's rows) of one rank through
the series detectors the registry routes each to, one metric at a time, each detector's
signals judged by its policy.

A non-finite value is a ``nonfinite`` signal, learnt by none. A series that asks for an ARIMA
model gets it at once from the run's ``fitter`` (offline), or, without one, is listed in what
``score`` returns for the caller to fit elsewhere.

A rank that is not ``followed`` (past the run's ``series_ranks``) keeps no series (nor a 7-day
baseline of its step time): its values are checked for non-finite ones and its losses still
feed the run's average; what is judged across ranks (its step times) is judged as for any
rank, after this.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.stream_jobs.engine.columns import Cells, Columns, floats_of
from steplens.stream_jobs.engine.core import CRIT_SEV, Column, Run, Signals
from steplens.stream_jobs.engine.policy import JudgeState, Policy, judge_signals
from steplens.stream_jobs.engine.signals import training

States = dict[str, dict[str, Any]]  # one rank's states: detector -> metric -> state


@dataclass(frozen=True)
class Scoring:
    """How a run scores its ranks' metrics: its ``DetectorConfig``, its declared lr schedule,
    the registry's routing (``route(metric, generic)``: the series entries that score a
    metric) and an ARIMA ``fitter`` when models are fitted at once."""

    cfg: Any
    schedule: dict[str, Any] | None
    generic: bool
    route: Callable[[str, bool], Sequence[Any]]
    fitter: Callable[[np.ndarray], Any] | None = None


@dataclass(frozen=True)
class Rows:
    """The rows of one rank being scored: their steps (``NO_STEP``: none), a window's first
    steps (its metrics are means over the window), a one-row window's extremes probed for
    spikes (``peaks``; NaN: a non-finite value in the window) and its metrics' standard
    deviations and counts (``spreads``)."""

    rank: int
    steps: np.ndarray
    firsts: np.ndarray | None = None
    peaks: dict[str, float] | None = None
    spreads: dict[str, tuple[float, int]] | None = None


@dataclass
class Scored:
    """A rank's signals, the metrics whose ARIMA series asked for a fit not made here, and its
    finite losses (what the advice judges a rewind on)."""

    batch: list[Signals] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    loss: Column | None = None


def score(
    states: States, how: Scoring, rows: Rows, columns: Columns, run: Run, *, followed: bool = True
) -> Scored:
    """Score ``columns`` (metric -> one cell per row, in order) of ``rows`` with the rank's
    ``states`` (none kept when not ``followed``: its non-finite values only); the run's
    training-loss average follows its losses."""
    cfg = how.cfg
    row_a = np.arange(len(rows.steps), dtype=np.int64)
    out = Scored()
    lrs = columns.get("lr")  # the update share's floor follows the logged lr, row by row
    if followed and (lrs is not None or "training" in states):
        st = _state(states, "training", "update_ratio", training.TrainingState, how.schedule)
        training.observe_lrs(st, None if lrs is None else floats_of(lrs)[0])
    for metric, cells in columns.items():
        probe = rows.peaks.get(metric) if rows.peaks else None
        if not followed and metric != "loss" and _all_finite(cells, probe):
            continue  # no series: only a non-finite value would count
        col, bad = _finite(metric, cells, row_a, rows, probe)
        if bad is not None:
            out.batch.append(bad)
        if col is None:
            continue
        if metric == "loss":
            run.track_loss(col.xs, cfg.train_loss_alpha)
            out.loss = col
        if not followed:
            continue
        if rows.spreads and metric in rows.spreads:  # a window's own spread (one row)
            std, count = rows.spreads[metric]
            col.spreads, col.counts = np.array([std]), np.array([count], dtype=np.int64)
        col.fitter = how.fitter
        out.batch += _score(states, how, metric, col)
        if col.asked:
            out.asked.append(metric)
    return out


def _score(states: States, how: Scoring, metric: str, col: Column) -> list[Signals]:
    """Every enabled detector of ``metric`` over ``col``, each detector's signals judged by
    its policy."""
    cfg = how.cfg
    out: list[Signals] = []
    for e in how.route(metric, how.generic):
        if e.enabled is not None and not getattr(cfg, e.enabled):
            continue
        st = _state(states, e.key, metric, e.state, how.schedule)
        ecfg = getattr(cfg, e.key)
        got = e.update(st, ecfg, metric, col)
        if got is not None and len(got):
            policy = getattr(ecfg, "policy", None)
            if policy is not None:
                if metric in getattr(ecfg, "notes_only", ()):
                    policy = _notes(policy)
                judged = _state(states, f"judge:{e.key}", metric, JudgeState, None)
                judge_signals(judged, cfg.calibration, policy, got)
            out.append(got)
    return out


def _all_finite(cells: Cells, peak: float | None) -> bool:
    """Every row has a finite value (and ``peak`` is finite): what ``_finite`` finds for a
    rank's one-row window without making arrays (most ranks of a wide run keep no series, so
    this is all their metrics but the loss need)."""
    if peak is not None and not math.isfinite(peak):
        return False
    if isinstance(cells, np.ndarray):
        return bool(np.isfinite(cells).all())
    return all(c is not None and math.isfinite(c) for c in cells)


def _finite(
    metric: str, cells: Cells, row_a: np.ndarray, rows: Rows, peak: float | None
) -> tuple[Column | None, Signals | None]:
    """A metric's rows with a finite value (and a finite ``peak``, a one-row window's), as a
    column, and its non-finite values (or peak) as ``nonfinite`` signals."""
    steps, firsts, rank = rows.steps, rows.firsts, rows.rank
    xs, present = floats_of(cells)
    ok = np.isfinite(xs)
    probes = None
    if peak is not None:
        probes = np.array([peak])
        ok &= np.isfinite(probes)
    if present is None and ok.all():  # the common case: every value finite
        return Column(xs, steps, row_a, rank, probes, firsts), None
    bad = ~ok if present is None else present & ~ok
    sigs = None
    if bad.any():
        value = xs[bad]
        if probes is not None and not np.isfinite(probes[0]):
            value = probes  # a window's non-finite peak (one row)
        sigs = Signals.of(
            "nonfinite", metric, row_a[bad], steps[bad], value, 1.0, CRIT_SEV, rank=rank
        )
    if present is not None:
        ok &= present
    if not ok.any():
        return None, sigs
    col = Column(xs[ok], steps[ok], row_a[ok], rank, None, None if firsts is None else firsts[ok])
    return col, sigs


def _state(states: States, key: str, metric: str, new: Any, schedule: Any) -> Any:
    """The rank's state of detector ``key`` for ``metric``, made at first use (one that reads
    the run's declared lr schedule gets it)."""
    by_metric = states.get(key)
    if by_metric is None:
        by_metric = states[key] = {}
    st = by_metric.get(metric)
    if st is None:
        st = by_metric[metric] = new()
        if hasattr(st, "schedule"):
            st.schedule = schedule
    return st


@functools.cache
def _notes(policy: Policy) -> Policy:
    """``policy`` whose breaches are notes (the metric's alerts come from another detector)."""
    return dataclasses.replace(policy, alerts=False)
