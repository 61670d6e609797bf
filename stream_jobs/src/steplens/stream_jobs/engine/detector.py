"""A run's detectors: each record through the registry's detectors, then the rules.

One path: a ``step`` record and a ``step_window`` are batches of one row, through the same
columnar code as a ``step_batch``'s entries (``process_columns``), so any batching of the same
steps gives the same signals, alerts and state. ``steplens detect`` calls ``process_columns``
on a CSV's chunks. ARIMA fits are asked for, not run, unless ``fit_inline`` is set; the caller
runs ``pending_fits`` wherever it likes and applies them (``apply_fit``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.schema import RUN_RANK, Record
from steplens.stream_jobs.engine import (
    batch_rules,
    evidence,
    fits,
    incidents,
    restarts,
    rules,
    step_tail,
)
from steplens.stream_jobs.engine.columns import (
    Cells,
    Columns,
    entry_columns,
    floats_of,
    window_columns,
)
from steplens.stream_jobs.engine.config import DetectorConfig
from steplens.stream_jobs.engine.core import CRIT_SEV, NO_STEP, Alert, Column, Run, Signals
from steplens.stream_jobs.engine.policy import JudgeState, Policy, judge_signals
from steplens.stream_jobs.engine.signals import arima, lr_schedule, ranks
from steplens.stream_jobs.engine.signals.registry import RECORDS, route

FitKey = fits.FitKey


@dataclass
class RunDetector:
    run_id: str
    cfg: DetectorConfig = field(default_factory=DetectorConfig)
    fit_inline: bool = True
    generic: bool = False  # score unknown metrics too (offline CSVs)
    # rank -> series detector (registry key) -> metric -> its state
    series: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # record detector (registry key) -> its state, one per run
    run_states: dict[str, Any] = field(default_factory=dict)
    rules: rules.RulesState = field(default_factory=rules.RulesState)
    incidents: incidents.IncidentsState = field(default_factory=incidents.IncidentsState)
    run: Run = field(default_factory=Run)
    schedule: dict[str, Any] | None = None
    records: int = 0
    offsets: dict[int, int] = field(default_factory=dict)  # raw partition -> last offset applied
    fits_wanted: set[FitKey] = field(default_factory=set)
    # rank -> metric -> [step, value]: the largest value of the rank's step records since its
    # last window (``process_steps``)
    raw_seen: dict[int, dict[str, list[Any]]] = field(default_factory=dict)
    touched: set[int] = field(default_factory=set)  # ranks whose series changed (take_touched)
    baseline: dict[int, list[Any]] = field(default_factory=dict)  # ``restarts.mark``

    def __post_init__(self) -> None:
        for e in RECORDS:
            self.run_states.setdefault(e.key, e.state())

    @property
    def ranks(self) -> ranks.RanksState:
        state: ranks.RanksState = self.run_states["ranks"]
        return state

    # ------------------------------------------------------------------ records
    def process(self, rec: Record) -> tuple[list[Signals], list[Alert]]:
        """Route one validated record; returns its signals (a ``step_batch``'s: one row per
        entry) and the alert transitions. ``ValueError`` (with the reason) for a record whose
        content cannot be used."""
        kind, data = rec.kind, rec.data
        if kind == "step_batch":
            return self.process_entries(rec.rank, data["records"])
        if kind == "step":
            return self.process_steps([rec])
        self.records += 1
        # a batch record or stacks, kept for the evidence; firing alerts it completes
        amended = evidence.keep_record(self, rec) if kind in evidence.KINDS else None
        batch: list[Signals] = []
        if kind == "step_window":
            step, first, metrics, peaks, wait, spreads = window_columns(data, rec.step)
            _drop_probed(self.raw_seen.pop(rec.rank, None), first, step, peaks)
            batch = self.process_columns(
                rec.rank,
                [step],
                [rec.time_ns],
                metrics,
                data_times=[wait],
                peaks=peaks,
                firsts=None if first is None else [first],
                spreads=spreads,
            )
        elif kind == "run_meta":
            _run_meta(self, data)
        for e in RECORDS:
            if kind in e.kinds:
                batch += e.on_record(
                    self.run_states[e.key], getattr(self.cfg, e.key), rec, self.run
                )
        evidence.annotate(self, batch, rec.rank, None)
        alerts = self.evaluate(batch, 1, [rec.time_ns])
        if amended:
            alerts += incidents.update(self.incidents, self.cfg.incidents, amended, rec.time_ns)
        return batch, alerts

    def process_steps(self, recs: list[Record]) -> tuple[list[Signals], list[Alert]]:
        """``step`` records of one rank, in order, scored as one batch (a record is a batch of
        one row; the worker passes a message's consecutive step records of a rank). Each
        metric's largest value is remembered until the rank's next window: a window whose
        peak a step record already reported does not report it again (one spike, one
        alert)."""
        rank = recs[0].rank
        entries = [{**r.data, "step": r.step, "time_ns": r.time_ns} for r in recs]
        _remember_peaks(self.raw_seen.setdefault(rank, {}), entries)
        return self.process_entries(rank, entries, behind=0)

    def process_entries(
        self, rank: int, entries: list[dict[str, Any]], behind: int | None = None
    ) -> tuple[list[Signals], list[Alert]]:
        """The step records of a ``step_batch`` (its entries: step fields with ``step`` and
        ``time_ns``), scored together: row ``i`` is entry ``i``. ``behind``: how many steps
        the other ranks' steps may lag (default: this batch's span, as another rank's batch
        of the same steps may come after it; 0 for records sent one by one)."""
        n = len(entries)
        self.records += n
        steps: list[int] = [e["step"] for e in entries]
        times: list[int] = [e["time_ns"] for e in entries]
        waits = [e.get("data_time_s") for e in entries]
        waits = [w if isinstance(w, (int, float)) else None for w in waits]
        if behind is None:  # the other ranks' batches of the same steps may come after this
            behind = max(steps) - min(steps) if steps else 0
        inputs = evidence.entry_inputs(entries)  # layer norms, kept for the evidence
        batch = self.process_columns(
            rank, steps, times, entry_columns(entries), data_times=waits, behind=behind
        )
        evidence.annotate(self, batch, rank, inputs)
        return batch, self.evaluate(batch, n, times)

    def evaluate(self, batch: list[Signals], n: int, times_ns: Sequence[int]) -> list[Alert]:
        """The rules over the ``n`` rows' signals, their alerts grouped into incidents
        (``incidents``): the incidents' transitions, each at its row's time."""
        return [a for row in self.incident_rows(batch, n, times_ns) for a in row]

    def incident_rows(
        self, batch: list[Signals], n: int, times_ns: Sequence[int]
    ) -> Iterator[list[Alert]]:
        """Each of the ``n`` rows' incident transitions, at the row's time (``self.incidents``
        is the state after that row when it is yielded)."""
        for alerts, t in zip(self.evaluate_rows(batch, n), times_ns, strict=True):
            if not alerts:
                yield alerts
                continue
            for a in alerts:
                a.time_ns = t
            yield incidents.update(self.incidents, self.cfg.incidents, alerts, t)

    def evaluate_rows(self, batch: list[Signals], n: int) -> Iterator[list[Alert]]:
        """Each row's alert transitions (``batch_rules.evaluate_batch``)."""
        if not batch:
            return iter([[]] * n)
        return batch_rules.evaluate_batch(self.rules, self.cfg.rules, self.run_id, batch, n)

    # ------------------------------------------------------------------ steps
    def process_columns(
        self,
        rank: int,
        steps: Sequence[int | None],
        times_ns: Sequence[int],
        columns: Columns,
        *,
        data_times: Sequence[float | None] | None = None,
        behind: int = 0,
        peaks: dict[str, float] | None = None,
        firsts: Sequence[int] | None = None,
        spreads: dict[str, tuple[float, int]] | None = None,
    ) -> list[Signals]:
        """Score the metrics of ``len(steps)`` consecutive steps of ``rank``, one metric at a
        time (``columns``, in order). ``peaks``: a one-row window's extremes, probed for spikes
        (NaN: a non-finite value in the window); ``firsts``: its first step (its metrics are
        means over the window); ``spreads``: its metrics' standard deviations and counts. A
        non-finite value is a ``nonfinite`` signal, learnt by none."""
        cfg = self.cfg
        n = len(steps)
        restarts.check(self, rank, steps, firsts)
        s = self.series.get(rank)
        if s is None:
            s = self.series[rank] = {}
        self.touched.add(rank)
        step_a = np.array([NO_STEP if st is None else st for st in steps], dtype=np.int64)
        rows = np.arange(n, dtype=np.int64)
        first_a = None if firsts is None else np.asarray(firsts, dtype=np.int64)
        want_fit = fits.asker(self, rank)
        batch: list[Signals] = []
        for metric, cells in columns.items():
            probe = peaks.get(metric) if peaks else None
            col, bad = _finite(metric, cells, rows, step_a, first_a, rank, probe)
            if bad is not None:
                batch.append(bad)
            if col is None:
                continue
            if spreads and metric in spreads:  # a window's own spread (one row)
                std, count = spreads[metric]
                col.spreads, col.counts = np.array([std]), np.array([count], dtype=np.int64)
            col.want_fit = want_fit
            batch += _score(s, cfg, self.schedule, self.generic, metric, col)
            if metric == "loss":
                self.run.track_loss(col.xs, cfg.train_loss_alpha)
        if rank != RUN_RANK and n:
            batch += step_tail.tail(
                self.ranks,
                self.cfg,
                self.run,
                rank,
                step_a,
                times_ns,
                columns,
                data_times,
                behind,
                windowed=firsts is not None,
            )
        restarts.mark(self, rank, batch, n)
        return batch

    # ------------------------------------------------------------------ ARIMA fits
    def pending_fits(self) -> list[tuple[FitKey, Any]]:
        """Inputs of the fits asked for since the last call: ``[(key, values)]``."""
        return fits.pending(self.series, self.fits_wanted, self.cfg.arima)

    def apply_fit(self, key: FitKey, params: arima.ArimaParams | None) -> None:
        if fits.apply(self.series, key, params, self.cfg.arima):
            self.touched.add(key[0])

    def resume_fits(self) -> None:
        """After a restore (``fits.resume``)."""
        fits.resume(self.series, self.cfg.arima)

    def take_touched(self) -> set[int]:
        """The ranks whose series changed since the last call (to save only those)."""
        got, self.touched = self.touched, set()
        return got


def _remember_peaks(seen: dict[str, list[Any]], entries: list[dict[str, Any]]) -> None:
    """Keep in ``seen`` each metric's largest value of the step records ``entries`` (with its
    step), until the rank's next window (``_drop_probed``)."""
    for e in entries:
        for name, x in (*e.items(), *(e.get("scalars") or {}).items()):
            if type(x) is float and (name not in seen or x > seen[name][1]):
                seen[name] = [e["step"], x]


def _drop_probed(
    seen: dict[str, list[Any]] | None, first: int | None, last: int | None, peaks: dict[str, float]
) -> None:
    """Drop from a window's ``peaks`` those a step record of its steps already reported
    (``seen``: the rank's, since its last window; the window's maximum is that value)."""
    if not seen or first is None or last is None:
        return
    for name, (step, x) in seen.items():
        peak = peaks.get(name)
        if peak is not None and first <= step <= last and x >= peak:
            del peaks[name]


def _run_meta(det: RunDetector, data: dict[str, Any]) -> None:
    """A ``run_meta`` record: the world size, and a declared lr schedule for every detector
    that reads it."""
    state = det.ranks
    state.world_size = max(state.world_size, int(data.get("world_size", 0)))
    if data.get("lr_schedule") is not None:
        # a bad schedule is refused with the reason (the record becomes a dead letter in the
        # worker); the run goes on with the schedule it had
        det.schedule = lr_schedule.check_schedule(data["lr_schedule"])
        for rank, s in det.series.items():
            for states in s.values():
                for st in states.values():
                    if hasattr(st, "schedule"):  # a detector that reads the schedule
                        st.schedule = det.schedule
            det.touched.add(rank)


def _score(  # noqa: PLR0917
    s: dict[str, dict[str, Any]],
    cfg: DetectorConfig,
    schedule: dict[str, Any] | None,
    generic: bool,
    metric: str,
    col: Column,
) -> list[Signals]:
    """Every enabled detector of ``metric`` over ``col`` (rank series ``s``), each detector's
    signals judged by its policy."""
    out: list[Signals] = []
    for e in route(metric, generic):
        if e.enabled is not None and not getattr(cfg, e.enabled):
            continue
        st = _state(s, e.key, metric, e.state, schedule)
        ecfg = getattr(cfg, e.key)
        got = e.update(st, ecfg, metric, col)
        if got is not None and len(got):
            policy = getattr(ecfg, "policy", None)
            if policy is not None:
                if metric in getattr(ecfg, "notes_only", ()):
                    policy = _notes(policy)
                judged = _state(s, f"judge:{e.key}", metric, JudgeState, None)
                judge_signals(judged, cfg.calibration, policy, got)
            out.append(got)
    return out


def _finite(  # noqa: PLR0917
    metric: str,
    cells: Cells,
    rows: np.ndarray,
    steps: np.ndarray,
    firsts: np.ndarray | None,
    rank: int,
    peak: float | None,
) -> tuple[Column | None, Signals | None]:
    """A metric's rows with a finite value (and a finite ``peak``, a one-row window's), as a
    column, and its non-finite values (or peak) as ``nonfinite`` signals."""
    xs, present = floats_of(cells)
    ok = np.isfinite(xs)
    probes = None
    if peak is not None:
        probes = np.array([peak])
        ok &= np.isfinite(probes)
    if present is None and ok.all():  # the common case: every value finite
        return Column(xs, steps, rows, rank, probes, firsts), None
    bad = ~ok if present is None else present & ~ok
    sigs = None
    if bad.any():
        value = xs[bad]
        if probes is not None and not np.isfinite(probes[0]):
            value = probes  # a window's non-finite peak (one row)
        sigs = Signals.of(
            "nonfinite", metric, rows[bad], steps[bad], value, 1.0, CRIT_SEV, rank=rank
        )
    if present is not None:
        ok &= present
    if not ok.any():
        return None, sigs
    col = Column(xs[ok], steps[ok], rows[ok], rank, None, None if firsts is None else firsts[ok])
    return col, sigs


def _state(s: dict[str, dict[str, Any]], key: str, metric: str, new: Any, schedule: Any) -> Any:
    """Rank series ``s``'s state of detector ``key`` for ``metric``, made at first use (one
    that reads the run's declared lr schedule gets it)."""
    states = s.get(key)
    if states is None:
        states = s[key] = {}
    st = states.get(metric)
    if st is None:
        st = states[metric] = new()
        if hasattr(st, "schedule"):
            st.schedule = schedule
    return st


@functools.cache
def _notes(policy: Policy) -> Policy:
    """``policy`` whose breaches are notes (the metric's alerts come from another detector)."""
    return dataclasses.replace(policy, alerts=False)
