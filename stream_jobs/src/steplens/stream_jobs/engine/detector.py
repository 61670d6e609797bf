"""A run's detection: its state, the record's way through the stages, a rank that restarts,
the ARIMA fits and 7-day baselines asked for, and its stored form.

Stages: ``process`` routes a record by its kind and hands it once to each stage, in order,
each a module given the state it reads and returning what the next needs: a rank's own
signals (``rank_signals``), those judged across ranks (``step_tail``, the 7-day baselines),
their marks (``marks``), the evidence they name (``evidence``), the rules (``batch_rules``),
the incidents (``incidents``), and what the advice keeps of it (``advice``). A record kind
without steps goes to its record detectors (the registry's ``Records``) instead of the first
three. No stage calls back into the detector or into an earlier stage.

One path: a ``step`` record and a ``step_window`` are batches of one row, through the same
columnar code as a ``step_batch``'s entries (``process_columns``), so any batching of the same
steps gives the same signals, alerts and state. ``steplens detect`` calls ``process_columns``
on a CSV's chunks. ARIMA fits are asked for, not run, unless ``fit_inline`` is set; the caller
runs ``pending_fits`` wherever it likes and applies them (``apply_fit``).

Evidence: a breach is named as it is judged, and a record that comes after the alert fired
completes it (``evidence``).

Restarts: a rank whose steps go back restarted from a checkpoint. A job that crashed at step
5,000 and resumed from its checkpoint of step 4,000 sends step 4,000 again, with the loss it
had then: higher than at 5,000, which a detector that goes on would call a spike. The rank
restarts instead (``restart``): its baselines become what they were at the step it resumes at,
re-seeded from its stored history up to that step (the worker reads it), or, without one,
start afresh (their first values learn and none is scored, so the jump back to the earlier
level never alerts; a real regression after it does, once the baselines know the new values,
and at once past the cold anchors). What the abandoned steps left behind goes with them. A
step goes back when a record's step (a window's last) is below the last step its rank has
seen; then the rank resumes at the record's first step (a window's first). A restart that
resumes within the window it crashed in is not seen in windowed mode; there the window's mean
is its only trace.

Stored form (``dump``, ``load``): the head (the detector without its series, with the list of
its ranks) and each rank's series as values of their own, in ``state``'s format 1; a head this
release cannot read is refused with a warning (the run starts afresh), a rank whose series is
missing or unreadable starts afresh.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.schema import RUN_RANK, Record
from steplens.stream_jobs.engine import advice as advising
from steplens.stream_jobs.engine import (
    batch_rules,
    evidence,
    fits,
    incidents,
    marks,
    rank_signals,
    rules,
    run_keys,
    step_tail,
)
from steplens.stream_jobs.engine.calibration import CalibrationState
from steplens.stream_jobs.engine.columns import (
    Columns,
    entry_columns,
    window_columns,
)
from steplens.stream_jobs.engine.core import NO_STEP, Alert, Column, Run, Signals
from steplens.stream_jobs.engine.history import NO_FIRST, History, Rows
from steplens.stream_jobs.engine.policy import JudgeState
from steplens.stream_jobs.engine.rules import Amend
from steplens.stream_jobs.engine.signals import (
    arima,
    dynamic_baseline,
    lr_schedule,
    ranks,
)
from steplens.stream_jobs.engine.signals.arima_fit import ArimaParams
from steplens.stream_jobs.engine.signals.lone_waits import LoneWaits
from steplens.stream_jobs.engine.signals.registry import (
    ENTRIES,
    RECORDS,
    DetectorConfig,
    route,
)
from steplens.stream_jobs.engine.signals.seasonal_baseline import Band
from steplens.stream_jobs.engine.signals.sketches import Bloom, Distinct
from steplens.stream_jobs.engine.state import Codec

log = logging.getLogger("steplens.stream_jobs")

FitKey = fits.FitKey
Series = dict[str, dict[str, Any]]  # one rank's states: detector -> metric -> state

# the stored form's classes: every registry entry's state, and the rules' and incidents'
CODEC = Codec(
    (
        *(e.state for e in ENTRIES),
        ArimaParams,
        Bloom,
        Distinct,
        JudgeState,
        CalibrationState,
        LoneWaits,
        rules.RulesState,
        incidents.IncidentsState,
        incidents.Incident,
        incidents.Member,
        advising.AdviceState,
        rules.Firing,
        Run,
    )
)
# the head's fields (a detector without its series)
_HEAD = (
    "run_id",
    "run_states",
    "rules",
    "incidents",
    "run",
    "schedule",
    "records",
    "offsets",
    "raw_seen",
    "baseline",  # which ranks' signals still say their baselines came from history
    "slots",  # which of its two table values holds each rank's stored series
    "advice",  # the remedies, checkpoints and advice given (``engine.advice``)
)

# the signals of a warmed rank say so for this many of its values: by then the detectors'
# windows (spike 64, volatility 50, ARIMA's fit window 256) hold live values only
MARK_VALUES = 256
CHUNK = 256  # rows of one rank replayed before the next rank's (``replay``)


@dataclass
class RunDetector:
    run_id: str
    cfg: DetectorConfig = field(default_factory=DetectorConfig)
    fit_inline: bool = True
    generic: bool = False  # score unknown metrics too (offline CSVs)
    # fit the 7-day baselines' bands here from the in-run minutes (tests, benches); the worker
    # fits them in its pool from the stores (``baselines_due``, ``apply_baselines``)
    baselines_inline: bool = False
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
    # rank -> [detail, values left]: its signals say where its baselines came from (``warmed``)
    baseline: dict[int, list[Any]] = field(default_factory=dict)
    # rank -> the slot (0 or 1) of its series as the last ``dump`` stored it (``dump``)
    slots: dict[int, int] = field(default_factory=dict)
    advice: advising.AdviceState = field(default_factory=advising.AdviceState)
    # rank -> its last notes of evidence rules (a hard batch's loss) whose record-kept evidence
    # (the batch) had not come yet, each a signal of one row (``evidence.keep_record``)
    unnamed: dict[int, list[Signals]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for e in RECORDS:
            self.run_states.setdefault(e.key, e.state())
        self.run.shard = run_keys.shard(self.run_id)

    @property
    def ranks(self) -> ranks.RanksState:
        state: ranks.RanksState = self.run_states["ranks"]
        return state

    # ------------------------------------------------------------------ records
    @property
    def width(self) -> int:
        """The run's ranks: its declared world size, or the ranks seen if more (in a shard of
        a wide run: the whole run's, from its ranks' run_meta)."""
        return ranks.ranks_known(self.ranks)

    def process(self, rec: Record) -> tuple[list[Signals], list[Alert]]:
        """Route one validated record; returns its signals (a ``step_batch``'s: one row per
        entry) and the alert transitions. ``ValueError`` (with the reason) for a record whose
        content cannot be used.

        A record goes one way through the stages: routed by its kind (steps and windows to
        the rank's own signals, ``rank_signals``, then those judged across ranks,
        ``step_tail`` and the 7-day baselines; other kinds to their record detectors), the
        evidence its breaches name (``evidence``), the rules (``batch_rules``), the incidents
        (``incidents``), and what the advice keeps of it (``advice``)."""
        kind, data = rec.kind, rec.data
        if kind == "step_batch":
            return self.process_entries(rec.rank, data["records"])
        if kind == "step":
            return self.process_steps([rec])
        self.records += 1
        # a batch record or stacks, kept for the evidence; firing alerts it completes, and
        # notes it names
        amends: list[Amend] = []
        named: list[Signals] = []
        if kind in evidence.KINDS:
            amends, named = evidence.keep_record(
                self.series, self.unnamed, self.rules.firing, self.cfg, rec
            )
            self.touched.add(rec.rank)
        batch: list[Signals] = []
        loss = None
        if kind == "step_window":
            step, first, metrics, peaks, wait, spreads = window_columns(data, rec.step)
            _drop_probed(self.raw_seen.pop(rec.rank, None), first, step, peaks)
            firsts = None if first is None else [first]
            rows = _rows(rec.rank, [step], firsts, peaks=peaks, spreads=spreads)
            batch, loss = self._signals(rows, [rec.time_ns], metrics, data_times=[wait])
        elif kind == "run_meta":
            self._run_meta(data)
        for e in RECORDS:
            if kind in e.kinds:
                batch += e.on_record(
                    self.run_states[e.key], getattr(self.cfg, e.key), rec, self.run
                )
        if kind == "hw" and self.baselines_inline:
            dynamic_baseline.fit_inline(self.run_states["baseline"], self.cfg.baseline, rec.time_ns)
        self._annotate(batch, rec.rank, None)
        amended, judged = batch_rules.judge(
            self.rules, self.cfg.rules, self.run_id, batch, 1, amends=amends
        )
        alerts = incidents.update_all(
            self.incidents, self.cfg.incidents, judged, [rec.time_ns], amended=amended
        )
        if kind == "acted":  # a rank's answer to advice: its incident reported again if news
            answer = {"rank": rec.rank, "outcome": data["outcome"], "detail": data.get("detail")}
            alerts += incidents.answered(
                self.incidents,
                self.cfg.incidents,
                data["fingerprint"],
                data["action"],
                {**answer, "step": rec.step},
                world_size=self.ranks.world_size,
                time_ns=rec.time_ns,
            )
        elif kind == "checkpoint":
            advising.keep_checkpoint(self.advice, self.cfg.advice, rec.step, data["path"])
        self._track_loss(rec.rank, loss, [rec.time_ns])
        return batch + named, alerts

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
        columns = entry_columns(entries)
        rows = _rows(rank, steps, None)
        batch, loss = self._signals(rows, times, columns, data_times=waits, behind=behind)
        self._annotate(batch, rank, entries)  # their layer norms kept for the evidence
        alerts = self.evaluate(batch, n, times)
        self._track_loss(rank, loss, times)
        return batch, alerts

    def evaluate(self, batch: list[Signals], n: int, times_ns: Sequence[int]) -> list[Alert]:
        """The rules over the ``n`` rows' signals, their alerts grouped into incidents
        (``incidents``): the incidents' transitions, each at its row's time."""
        return [a for row in self.incident_rows(batch, n, times_ns) for a in row]

    def incident_rows(
        self, batch: list[Signals], n: int, times_ns: Sequence[int]
    ) -> Iterator[list[Alert]]:
        """Each of the ``n`` rows' incident transitions, at the row's time (``self.incidents``
        is the state after that row when it is yielded): the rules judge every row first."""
        _, judged = batch_rules.judge(self.rules, self.cfg.rules, self.run_id, batch, n)
        return incidents.update_rows(self.incidents, self.cfg.incidents, judged, times_ns)

    def evaluate_rows(self, batch: list[Signals], n: int) -> Iterator[list[Alert]]:
        """Each row's alert transitions (``batch_rules.evaluate_batch``), row by row (the rules'
        state is the state after a row when it is yielded)."""
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
        rows = _rows(rank, steps, firsts, peaks=peaks, spreads=spreads)
        batch, loss = self._signals(rows, times_ns, columns, data_times=data_times, behind=behind)
        self._track_loss(rank, loss, times_ns)
        return batch

    def _signals(
        self,
        rows: rank_signals.Rows,
        times_ns: Sequence[int],
        columns: Columns,
        *,
        data_times: Sequence[float | None] | None = None,
        behind: int = 0,
    ) -> tuple[list[Signals], Column | None]:
        """The signals of a rank's ``rows``: its own metrics' (``rank_signals``), then those
        judged across ranks (``step_tail``, the 7-day baselines), marked (``marks``); and its
        finite losses, for the advice."""
        cfg, rank, n = self.cfg, rows.rank, len(rows.steps)
        self._check_restart(rows)
        s = self.series.get(rank)
        if s is None:
            s = self.series[rank] = {}
        self.touched.add(rank)
        fitter = self._fitter() if self.fit_inline else None
        how = rank_signals.Scoring(cfg, self.schedule, self.generic, route, fitter)
        followed = rank < cfg.series_ranks
        if not followed:
            self.run.unfollowed += n
        scored = rank_signals.score(s, how, rows, columns, self.run, followed=followed)
        batch = scored.batch
        self.fits_wanted.update((rank, m) for m in scored.asked)  # for ``pending_fits``
        if rank != RUN_RANK and n:
            batch += step_tail.tail(
                self.ranks,
                cfg.ranks,
                cfg.thresholds,
                self.run,
                rank,
                steps=rows.steps,
                times_ns=times_ns,
                columns=columns,
                data_times=data_times,
                behind=behind,
                firsts=rows.firsts,
            )
            # an offline CSV's columns are judged by the generic detectors; a rank past the
            # followed ones keeps no 7-day baseline of its own (its step time is judged
            # against the other ranks', the followed ranks' baselines see the run slow down)
            if not self.generic and followed:
                dyn = self.run_states["baseline"]
                batch += dynamic_baseline.on_steps(
                    dyn, cfg.baseline, rank, rows.steps, times_ns, columns
                )
                if self.baselines_inline:
                    dynamic_baseline.fit_inline(dyn, cfg.baseline, int(times_ns[-1]))
        mark = self.baseline.get(rank)
        marks.mark(batch, n, rows.firsts, mark)
        if mark is not None and mark[1] <= 0:
            del self.baseline[rank]
        return batch, scored.loss

    def _track_loss(self, rank: int, loss: Column | None, times_ns: Sequence[int]) -> None:
        """A rank's finite losses, kept by the advice while it watches (what a rewind is
        judged on)."""
        if loss is not None and rank != RUN_RANK and self.advice.watch:
            advising.track_loss(
                self.advice,
                rank,
                loss.steps,
                loss.xs,
                firsts=loss.firsts,
                rows=loss.rows,
                times_ns=times_ns,
            )

    # ------------------------------------------------------------------ ARIMA fits
    def _fitter(self) -> Callable[[np.ndarray], arima.ArimaParams | None]:
        """A model fitted at once from the values a series asks for it on (``fit_inline``)."""
        cfg = self.cfg.arima
        return functools.partial(arima.fit, order=cfg.order, method=cfg.method)

    def pending_fits(self) -> list[tuple[FitKey, Any]]:
        """Inputs of the fits asked for since the last call: ``[(key, values)]``."""
        return fits.pending(self.series, self.fits_wanted, self.cfg.arima)

    def apply_fit(self, key: FitKey, params: arima.ArimaParams | None) -> None:
        if fits.apply(self.series, key, params, self.cfg.arima):
            self.touched.add(key[0])

    def resume_fits(self) -> None:
        """After a restore (``fits.resume``)."""
        fits.resume(self.series, self.cfg.arima)

    # ------------------------------------------------------------------ 7-day baselines
    def baselines_due(self, now_ns: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The series that want a band (``dynamic_baseline.due``) with their in-run minutes."""
        dyn = self.run_states["baseline"]
        return dynamic_baseline.fit_input(dyn, dynamic_baseline.due(dyn, self.cfg.baseline, now_ns))

    def apply_baselines(self, bands: dict[str, Band | None]) -> int:
        return dynamic_baseline.apply(self.run_states["baseline"], bands)

    def take_touched(self) -> set[int]:
        """The ranks whose series changed since the last call (to save only those)."""
        got, self.touched = self.touched, set()
        return got

    def advise(
        self, alerts: list[Alert], now_ns: int | None = None, wall_ns: int = 0
    ) -> advising.Decisions:
        """The advice the incident reports among ``alerts`` call for, and the judgements the
        run's losses now decide (``engine.advice``), for the remedies the run opted into, at
        ``now_ns`` (the record's time; default: the alerts') and ``wall_ns`` (the decision's
        wall-clock time; 0: the record's): given, held back, and ``alerts``
        with the advice noted on their incidents (given, or suggested and held for a person),
        plus the report of an incident advised after its last report."""
        tail = self.ranks.last_step
        run = advising.RunNow(
            max(tail.values()) if tail else self.run.last_step,
            int((self.schedule or {}).get("total_steps") or 0),
            now_ns if now_ns is not None else max((a.time_ns for a in alerts), default=0),
            wall_ns,
        )
        given, held = advising.advise(self.advice, self.cfg.advice, alerts, run)
        noted: dict[str, None] = {}
        for adv in (*given, *(h for h in held if h.held != "storm")):
            if incidents.note_advice(self.incidents, adv.data, adv.rank, adv.step, adv.held):
                noted[str(adv.data["fingerprint"])] = None
        if not noted:
            return advising.Decisions(given, held, alerts)
        out = self.with_remedies(alerts)
        reported = {a.fingerprint for a in alerts if a.scope == "incident"}
        for fp in noted:
            if fp not in reported:
                again = incidents.report_again(
                    self.incidents, self.cfg.incidents, fp, run.last_step, run.now_ns
                )
                if again is not None:
                    out.append(again)
        return advising.Decisions(given, held, out)

    def with_remedies(self, alerts: list[Alert]) -> list[Alert]:
        """``alerts`` with their incidents' advice and answers so far in the evidence."""
        return incidents.with_remedies(self.incidents, alerts)

    def _run_meta(self, data: dict[str, Any]) -> None:
        """A ``run_meta`` record: the world size, the remedies the rank opted into, and a
        declared lr schedule for every detector that reads it."""
        advising.opt_in(self.advice, data.get("remedies"))
        state = self.ranks
        state.world_size = max(state.world_size, int(data.get("world_size", 0)))
        if data.get("lr_schedule") is not None:
            # a bad schedule is refused with the reason (the record becomes a dead letter in the
            # worker); the run goes on with the schedule it had
            self.schedule = lr_schedule.check_schedule(data["lr_schedule"])
            for rank, s in self.series.items():
                for states in s.values():
                    for st in states.values():
                        if hasattr(st, "schedule"):  # a detector that reads the schedule
                            st.schedule = self.schedule
                self.touched.add(rank)

    # ------------------------------------------------------------------ evidence
    def _annotate(
        self, batch: list[Signals], rank: int, entries: list[dict[str, Any]] | None
    ) -> None:
        """The breaches of ``batch`` named, the evidence fields of the step ``entries`` kept
        (``evidence.annotate``)."""
        if evidence.annotate(
            self.series, self.unnamed, self.cfg, batch, rank=rank, entries=entries
        ):
            self.touched.add(rank)

    # ------------------------------------------------------------------ restarts
    def resume_step(self, rec: Record, after: int | None = None) -> int | None:
        """The step ``rec``'s rank resumes at when its steps go back below the last step the
        rank has seen (or ``after``, one of its steps not yet scored); None otherwise, and for
        records without steps."""
        kind, data = rec.kind, rec.data
        if kind == "step":
            step = first = rec.step
        elif kind == "step_batch":
            entries = data["records"]
            step = first = entries[0].get("step") if entries else None
        elif kind == "step_window":
            step, first = data.get("step_last", rec.step), data.get("step_first")
        else:
            return None
        if not isinstance(step, int) or rec.rank == RUN_RANK:
            return None
        last = self.ranks.last_step.get(rec.rank)
        if after is not None and (last is None or after > last):
            last = after
        if last is None or step >= last:
            return None
        return first if isinstance(first, int) and first < step else step

    def restart(self, rank: int, step: int, series: Series | None = None) -> None:
        """``rank`` resumes at ``step``: its baselines become ``series`` (re-seeded from its
        history up to that step), else start afresh. Dropped with the abandoned steps:
        straggler judgements pending from ``step`` on, the peaks remembered for its next
        window, the fits it asked for, where its baselines came from."""
        state = self.ranks
        state.last_step[rank] = step - 1  # its next steps are progress again
        advising.restarted(self.advice, step)
        for at in [at for at in state.pending if at >= step]:
            got = state.pending[at]
            got.pop(rank, None)
            if not got:
                del state.pending[at]
        self.raw_seen.pop(rank, None)
        self.fits_wanted = {k for k in self.fits_wanted if k[0] != rank}
        self.baseline.pop(rank, None)
        if series is None:
            self.series.pop(rank, None)
        else:
            self.series[rank] = series
        self.touched.add(rank)

    def _check_restart(self, rows: rank_signals.Rows) -> None:
        """Rows of a rank about to be scored: when their steps go back, the rank restarts
        afresh at the first (the worker, which has the stores, re-seeds it before this)."""
        rank = rows.rank
        first = int(rows.steps[0]) if len(rows.steps) else NO_STEP
        if first == NO_STEP or rank == RUN_RANK:
            return
        last = self.ranks.last_step.get(rank)
        if last is not None and first < last:
            self.restart(rank, first if rows.firsts is None else int(rows.firsts[0]))

    # ------------------------------------------------------------------ warm starts
    def warmed(self, rank: int, detail: dict[str, Any]) -> None:
        """``rank``'s baselines came from history: its signals say so (``detail``) for its next
        ``MARK_VALUES`` values."""
        self.baseline[rank] = [detail, MARK_VALUES]

    def replay(self, hist: History, now_ns: int) -> None:
        """A warm start: ``hist``'s rows through ``process_columns``, the code live records go
        through, their signals dropped (the rules and incidents never see them); then the
        run's clock settled. Every state, the calibrations included, is then what a detector
        that never stopped would have after those values. The ranks are replayed side by
        side, ``CHUNK`` rows of each in turn, so the cross-rank state (stragglers) sees their
        steps together as it did live. Afterwards no straggler judgement of a history step is
        left pending, and each replayed rank's last progress is ``now_ns`` (a history hours
        old is no hang)."""
        meta = hist.meta
        if meta.get("lr_schedule") is not None and self.schedule is None:
            # one refused live as well (a dead letter): the run goes on without one
            with contextlib.suppress(ValueError):
                self.schedule = lr_schedule.check_schedule(meta["lr_schedule"])
        world = meta.get("world_size")
        if isinstance(world, (int, float)) and math.isfinite(world):
            self.ranks.world_size = max(self.ranks.world_size, int(world))
        done = dict.fromkeys(hist.rows, 0)
        while done:
            for rank, rows in hist.rows.items():
                a = done.get(rank)
                if a is None:
                    continue
                b = min(a + CHUNK, len(rows))
                self._feed(rank, rows, a, b)
                if b >= len(rows):
                    del done[rank]
                else:
                    done[rank] = b
        state = self.ranks
        state.pending.clear()
        for rank in hist.rows:
            state.progress_ns[rank] = now_ns
        self.records = 0

    def _feed(self, rank: int, rows: Rows, a: int, b: int) -> None:
        """Rows ``a:b`` of a rank: each stretch of step rows, and of windows, as one batch."""
        kinds = rows.first[a:b] == NO_FIRST
        cuts = np.flatnonzero(kinds[1:] != kinds[:-1]) + 1 + a
        for lo, hi in zip([a, *cuts.tolist()], [*cuts.tolist(), b], strict=True):
            columns = {m: v[lo:hi] for m, v in rows.values.items() if not np.isnan(v[lo:hi]).all()}
            windows = rows.first[lo] != NO_FIRST
            self.process_columns(
                rank,
                rows.step[lo:hi].tolist(),
                rows.time_ns[lo:hi].tolist(),
                columns,
                firsts=rows.first[lo:hi].tolist() if windows else None,
            )

    # ------------------------------------------------------------------ stored form
    def dump(self, ranks: Iterable[int]) -> tuple[bytes, dict[int, bytes]]:
        """The run's state as table values: its head, and the series of ``ranks`` (those that
        changed), each a value of its own, to be written under ``slots[rank]`` before the head.

        Each rank has two slots and a changed one goes to the slot its stored head does not
        name, so a checkpoint cut short (some ranks written, the head not) leaves the stored
        head pointing at the series it was written with: restored, it never pairs a newer
        series with older offsets. A rank without series (past ``series_ranks``: most ranks
        of a wide run) has no value: the head lists it (``bare``), which keeps it admitted
        to the run after a restore; two changelog messages a rank and checkpoint were most
        of a wide run's."""
        series = self.series
        parts = {r: CODEC.pack(series[r]) for r in ranks if series.get(r)}
        for r in parts:  # a rank never stored starts in slot 0
            self.slots[r] = 1 - self.slots[r] if r in self.slots else 0
        head = {k: getattr(self, k) for k in _HEAD}
        head["ranks"] = sorted(r for r, s in series.items() if s)
        head["bare"] = sorted(r for r, s in series.items() if not s)
        return CODEC.pack(head), parts

    @classmethod
    def load(
        cls,
        blob: bytes,
        rank_blob: Callable[[int, int], bytes | None],
        cfg: DetectorConfig | None = None,
    ) -> RunDetector | None:
        """A run's detector from its head and its ranks' values (``rank_blob(rank, slot)``,
        slot 0 for a head stored before slots); None, with a warning, for a head this release
        cannot read."""
        try:
            head = CODEC.unpack(blob)
            det = cls(head["run_id"], cfg or DetectorConfig(), fit_inline=False)
            for k in _HEAD[1:]:
                if k in head:
                    v = head[k] if k != "run_states" else {**det.run_states, **head[k]}
                    setattr(det, k, v)
        except Exception as exc:
            log.warning("a stored run state cannot be restored (%s); the run starts afresh", exc)
            return None
        det.run.shard = run_keys.shard(det.run_id)  # the key's, not a head stored before it
        det.series.update((rank, {}) for rank in head.get("bare", []))
        for rank in head.get("ranks", []):
            part = rank_blob(rank, det.slots.setdefault(rank, 0))
            try:
                det.series[rank] = CODEC.unpack(part) if part else _missing()
            except Exception as exc:
                log.warning("rank %s of run %s starts afresh: %s", rank, det.run_id, exc)
                continue
            # a state that reads the lr schedule, stored before it did (format 1's training
            # state): the run's, as when the run declares one
            for states in det.series[rank].values():
                for st in states.values():
                    if getattr(st, "schedule", False) is None:
                        st.schedule = det.schedule
        return det

    @staticmethod
    def stored_ranks(head: bytes | None) -> list[int]:
        """The ranks a stored head lists, those without a value (``bare``) too: one that had
        a value before its series emptied (a restart) may still have it (none for a head
        this release cannot read)."""
        try:
            got = CODEC.unpack(head) if head else {}
            return [*got.get("ranks", []), *got.get("bare", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            return []


def _rows(
    rank: int,
    steps: Sequence[int | None],
    firsts: Sequence[int] | None,
    *,
    peaks: dict[str, float] | None = None,
    spreads: dict[str, tuple[float, int]] | None = None,
) -> rank_signals.Rows:
    step_a = np.array([NO_STEP if st is None else st for st in steps], dtype=np.int64)
    first_a = None if firsts is None else np.asarray(firsts, dtype=np.int64)
    return rank_signals.Rows(rank, step_a, first_a, peaks, spreads)


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


def _missing() -> Any:
    raise ValueError("no stored series")
