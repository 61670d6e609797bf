"""Per-run state and routing: which record feeds which signal module, then the rules.

``RunDetector`` is plain Python and picklable: the worker keeps one per run in a Faust table,
``steplens detect`` keeps one for a CSV. ARIMA fits are requested, not run, unless
``fit_inline`` is set; the caller runs ``pending_fits`` wherever it likes and applies them.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, field
from math import isfinite
from typing import Any, cast

from steplens.producer.schema import RUN_RANK, Record
from steplens.stream_jobs import rules
from steplens.stream_jobs.config import (
    ARIMA_METRICS,
    GRAD_METRICS,
    NONFINITE_METRICS,
    NOT_SERIES,
    SPIKE_METRICS,
    VOLATILITY_METRICS,
    DetectorConfig,
)
from steplens.stream_jobs.core import CRITICAL, Alert, Signal, SignalGrid, SignalRun
from steplens.stream_jobs.signals import (
    arima,
    data_quality,
    evals,
    lr_schedule,
    ranks,
    spike,
    thresholds,
    training,
    volatility,
)

FitKey = tuple[int, str]  # (rank, metric)

_GRAD, _SPIKE, _GENERIC = 1, 2, 3  # which spike settings a metric uses (0: none)


def _route(metric: str, generic: bool) -> tuple[int, bool, bool, bool]:
    """Which detectors score ``metric``: (spike settings, volatility, ARIMA, own signal).
    Cached in ``_ROUTES``."""
    if metric in SPIKE_METRICS:
        spike_kind = _GRAD if metric in GRAD_METRICS else _SPIKE
    elif generic and metric not in NONFINITE_METRICS and metric != "lr":
        spike_kind = _GENERIC
    else:
        spike_kind = 0
    return (
        spike_kind,
        metric in VOLATILITY_METRICS,
        metric in ARIMA_METRICS or (generic and metric != "lr"),
        metric in ("lr", "update_ratio", "param_norm", "loss"),
    )


# per metric name, its route, for schema-only (False) and generic (True) detectors
_ROUTES: dict[bool, dict[str, tuple[int, bool, bool, bool]]] = {False: {}, True: {}}


# entry fields that are not series of their own (scalars are, one by one)
_NOT_BATCH_SERIES = NOT_SERIES | {"step", "time_ns"}


def _all_finite(xs: list[float | None]) -> bool:
    """Whether the floats ``xs`` are all finite: their sum is unless one is not (or the sum
    overflows, a false no)."""
    return isfinite(sum(cast(list[float], xs)))


def _number(x: Any) -> bool:
    return type(x) is float or (isinstance(x, (int, float)) and not isinstance(x, bool))


def _entry_columns(entries: list[dict[str, Any]]) -> dict[str, list[float | None]]:
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
        if not all(type(v) is float for v in got):  # the common case, checked first
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


@dataclass(slots=True)
class Part:
    """Signals of some rows of a batch (``RunDetector.process_columns``): one per row in
    ``rows`` (a run of one detector) or a list per row."""

    rows: list[int]  # ascending
    signals: SignalRun | list[list[Signal]] | SignalGrid  # a grid: all on its one row

    def where(self, n: int) -> list[int]:
        """For each of ``n`` rows, its index in ``rows``, or -1."""
        at = [-1] * n
        for k, i in enumerate(self.rows):
            at[i] = k
        return at

    def any_breach(self) -> bool:
        sigs = self.signals
        if isinstance(sigs, SignalRun):
            return sigs.severities.count(None) != len(sigs.severities)
        if isinstance(sigs, SignalGrid):
            return sigs.any_breach()
        return any(g.severity for got in sigs for g in got)

    def breaching(self) -> list[int]:
        sigs = self.signals
        if isinstance(sigs, SignalRun):
            return [i for i, sev in zip(self.rows, sigs.severities, strict=True) if sev is not None]
        if isinstance(sigs, SignalGrid):
            return self.rows if sigs.any_breach() else []
        return [i for i, got in zip(self.rows, sigs, strict=True) if any(g.severity for g in got)]

    def steps(self) -> Iterator[tuple[int, int | None]]:
        """Each row with the step of its last signal here."""
        sigs = self.signals
        if isinstance(sigs, SignalRun):
            return zip(self.rows, sigs.steps, strict=True)
        if isinstance(sigs, SignalGrid):
            return iter([(self.rows[0], sigs.steps[-1])])
        return ((i, got[-1].step) for i, got in zip(self.rows, sigs, strict=True))

    def lists(self) -> Iterator[tuple[int, list[Signal]]]:
        """Each row with its signals here (a ``SignalRun``'s one each)."""
        sigs = self.signals
        if isinstance(sigs, SignalRun):
            return ((i, [sigs.signal(k)]) for k, i in enumerate(self.rows))
        if isinstance(sigs, SignalGrid):
            return iter([(self.rows[0], sigs.signals())])
        return zip(self.rows, sigs, strict=True)


def _last_steps(parts: list[Part], n: int) -> list[int | None]:
    """Each of the ``n`` rows' step of its last signal (None for a row without signals)."""
    last: list[int | None] = [None] * n
    for part in parts:  # in order: a row's last part sets its step last
        sigs = part.signals
        if isinstance(sigs, SignalRun) and len(part.rows) == n:
            last[:] = sigs.steps  # every row, in order
        else:
            for i, st in part.steps():
                last[i] = st
    return last


_NO_SIGNAL: Any = object()  # ``_top_steps`` of a row without signals


def _top_steps(parts: list[Part], n: int) -> list[int | None]:
    """Each of the ``n`` rows' largest step of its signals (None when none has a step,
    ``_NO_SIGNAL`` for a row without signals)."""
    top: list[Any] = [_NO_SIGNAL] * n
    for part in parts:
        sigs = part.signals
        if isinstance(sigs, SignalRun):
            pairs: Iterable[tuple[int, int | None]] = zip(part.rows, sigs.steps, strict=True)
        elif isinstance(sigs, SignalGrid):
            pairs = [(part.rows[0], sigs.steps[-1])]  # ascending steps
        else:
            pairs = [
                (i, max((g.step for g in got if g.step is not None), default=None))
                for i, got in zip(part.rows, sigs, strict=True)
            ]
        for i, st in pairs:
            cur = top[i]
            if cur is _NO_SIGNAL or (st is not None and (cur is None or st > cur)):
                top[i] = st
    return top


def row_signals(
    parts: list[Part],
    where: list[list[int]],
    i: int,
    firing: Container[tuple[str, str]] | None = None,
) -> list[Signal]:
    """Row ``i``'s signals, in order (``where``: each part's ``where``); with ``firing``, of a
    grid only those the rules act on (``SignalGrid.signals``)."""
    out: list[Signal] = []
    for part, at in zip(parts, where, strict=True):
        k = at[i]
        if k >= 0:
            sigs = part.signals
            if isinstance(sigs, SignalRun):
                out.append(sigs.signal(k))
            elif isinstance(sigs, SignalGrid):
                out += sigs.signals(firing)
            else:
                out += sigs[k]
    return out


@dataclass
class RankSeries:
    spikes: dict[str, spike.SpikeState] = field(default_factory=dict)
    arimas: dict[str, arima.ArimaState] = field(default_factory=dict)
    vol: dict[str, volatility.VolatilityState] = field(default_factory=dict)
    train: training.TrainingState = field(default_factory=training.TrainingState)
    lr: lr_schedule.LrState = field(default_factory=lr_schedule.LrState)


@dataclass
class RunDetector:
    run_id: str
    cfg: DetectorConfig = field(default_factory=DetectorConfig)
    fit_inline: bool = True
    generic: bool = False  # score unknown metrics too (offline CSVs)
    series: dict[int, RankSeries] = field(default_factory=dict)
    ranks: ranks.RanksState = field(default_factory=ranks.RanksState)
    thresholds: thresholds.ThresholdState = field(default_factory=thresholds.ThresholdState)
    data: data_quality.DataState = field(default_factory=data_quality.DataState)
    evals: evals.EvalState = field(default_factory=evals.EvalState)
    rules: rules.RulesState = field(default_factory=rules.RulesState)
    schedule: dict[str, Any] | None = None
    train_loss: float | None = None
    last_step_ns: int = 0
    fits_wanted: set[FitKey] = field(default_factory=set)
    records: int = 0
    offsets: dict[int, int] = field(default_factory=dict)  # raw partition -> last offset applied
    touched: set[int] = field(default_factory=set)  # ranks whose series changed (take_touched)

    # ------------------------------------------------------------------ records
    def process(self, rec: Record) -> tuple[list[Signal], list[Alert]]:
        """Route one validated record; returns its signals and the alert transitions.
        ``ValueError`` (with the reason) for a record whose content cannot be used."""
        kind, data = rec.kind, rec.data
        if kind == "step_batch":
            parts, alerts = self.process_entries(rec.rank, data["records"])
            n = len(data["records"])
            where = [part.where(n) for part in parts]
            return [sig for i in range(n) for sig in row_signals(parts, where, i)], alerts
        self.records += 1
        sigs: list[Signal] = []
        if kind == "step":
            metrics = {k: v for k, v in data.items() if k not in NOT_SERIES}
            for k, v in (data.get("scalars") or {}).items():
                metrics.setdefault(k, v)
            sigs = self.process_step(
                rec.rank, rec.step, rec.time_ns, metrics, data_time=data.get("data_time_s")
            )
        elif kind == "step_window":
            sigs = self._window(rec)
        elif kind == "run_meta":
            self.ranks.world_size = max(self.ranks.world_size, int(data.get("world_size", 0)))
            if data.get("lr_schedule") is not None:
                # a bad schedule is refused with the reason (the record becomes a dead letter
                # in the worker); the run goes on with the schedule it had
                self.schedule = lr_schedule.check_schedule(data["lr_schedule"])
                for s in self.series.values():
                    s.lr.schedule = self.schedule
                self.touched.update(self.series)
        elif kind == "eval":
            sigs = self._eval(rec)
        elif kind == "batch":
            self.data, sigs = data_quality.update(
                self.data, self.cfg.data, data, rec.step, rec.rank
            )
        elif kind == "hw":
            busy = rec.time_ns - self.last_step_ns < 30e9 if self.last_step_ns else False
            self.thresholds, sigs = thresholds.hw(
                self.thresholds, self.cfg.thresholds, data, rec.host, rec.step, rec.rank, busy
            )
        elif kind == "comm":
            sigs = thresholds.comm(self.cfg.thresholds, data, rec.step, rec.rank)
        if kind in ("hw", "health") and rec.time_ns:  # the run is alive: is every rank moving?
            self.ranks, more = ranks.tick(self.ranks, self.cfg.ranks, rec.time_ns)
            sigs += more
        return sigs, self.evaluate(sigs)

    def evaluate(self, sigs: list[Signal]) -> list[Alert]:
        if not sigs:
            return []
        self.rules, alerts = rules.evaluate(self.rules, self.cfg.rules, self.run_id, sigs)
        return alerts

    def _rank(self, rank: int) -> RankSeries:
        s = self.series.get(rank)
        if s is None:
            s = self.series[rank] = RankSeries()
            s.lr.schedule = self.schedule
        return s

    # ------------------------------------------------------------------ steps
    def process_step(  # noqa: PLR0917
        self,
        rank: int,
        step: int | None,
        time_ns: int,
        metrics: dict[str, Any],
        peaks: dict[str, float] | None = None,
        data_time: float | None = None,
        first_step: int | None = None,
    ) -> list[Signal]:
        """Score one step's metrics. ``peaks``: a window's extremes, probed for spikes;
        ``first_step``: the window's first step (its metrics are means over the window)."""
        cfg = self.cfg
        s = self.series.get(rank)
        if s is None:
            s = self._rank(rank)
        self.touched.add(rank)
        out: list[Signal] = []
        arima_on = cfg.arima_enabled
        routes = _ROUTES[self.generic]
        spike_cfgs = (cfg.spike, cfg.grad_spike, cfg.spike, cfg.generic_spike)  # by _route kind
        spikes, vols, arimas = s.spikes, s.vol, s.arimas
        for metric, raw in metrics.items():
            if type(raw) is float:  # the common case, checked first
                x = raw
            elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
                x = float(raw)
            else:
                continue
            route = routes.get(metric)
            if route is None:
                route = routes[metric] = _route(metric, self.generic)
            spike_kind, vol, arima_too, special = route
            if spike_kind:
                peak = peaks.get(metric) if peaks else None
                st = spikes.get(metric)
                if st is None:
                    st = spikes[metric] = spike.SpikeState()
                out += spike.update(st, spike_cfgs[spike_kind], metric, x, step, rank, peak)[1]
            elif not isfinite(x) or (
                peaks and (peak := peaks.get(metric)) is not None and not isfinite(peak)
            ):
                out.append(Signal("nonfinite", metric, step, x, 1.0, rank, severity=CRITICAL))
                continue
            if vol:
                vs = vols.get(metric)
                if vs is None:
                    vs = vols[metric] = volatility.VolatilityState()
                out += volatility.update(vs, cfg.volatility, metric, x, step)[1]
            if arima_on and arima_too:
                a = arimas.get(metric)
                if a is None:
                    a = arimas[metric] = arima.ArimaState()
                out += arima.update(a, cfg.arima, metric, x, step, rank)[1]
                if a.wants_fit:
                    self._want_fit(rank, metric, a)
            if special:
                out += self._special(s, metric, x, step, rank, first_step)
        out += self._step_tail(rank, step, time_ns, metrics.get("step_time_s"), data_time)
        return out

    def _special(  # noqa: PLR0917
        self,
        s: RankSeries,
        metric: str,
        x: float,
        step: int | None,
        rank: int,
        first_step: int | None,
    ) -> list[Signal]:
        """The signals of a metric with a detector of its own (lr, update ratio, param norm)."""
        cfg = self.cfg
        if metric == "lr":
            return lr_schedule.update(s.lr, cfg.lr, x, step, rank, first_step)[1]
        if metric == "update_ratio":
            return training.update_ratio(s.train, cfg.training, x, step, rank)[1]
        if metric == "param_norm":
            return training.param_norm(s.train, cfg.training, x, step, rank)[1]
        if metric == "loss" and isfinite(x):
            self._track_loss((x,))
        return []

    def _track_loss(self, xs: Iterable[float]) -> None:
        """The training loss's EMA (finite values), for the train/validation gap."""
        a_ = self.cfg.train_loss_alpha
        ema = self.train_loss
        for x in xs:
            ema = x if ema is None else (1 - a_) * ema + a_ * x
        self.train_loss = ema

    def _step_tail(
        self, rank: int, step: int | None, time_ns: int, st_time: Any, data_time: float | None
    ) -> list[Signal]:
        """Per step, after its metrics: the rank's step time against the others, and progress."""
        if step is None or rank == RUN_RANK:
            return []
        out: list[Signal] = []
        if isinstance(st_time, (int, float)):
            self.ranks, out = ranks.step_time(self.ranks, self.cfg.ranks, rank, step, st_time)
            if data_time is not None:
                out += thresholds.data_wait(self.cfg.thresholds, data_time, st_time, step, rank)
        ranks.progress(self.ranks, rank, step, time_ns)
        if time_ns:
            self.last_step_ns = max(self.last_step_ns, time_ns)
        return out

    def process_columns(
        self,
        rank: int,
        steps: list[int],
        times_ns: list[int],
        columns: dict[str, list[float | None]],
        *,
        data_times: list[float | None] | None = None,
        behind: int = 0,
    ) -> list[Part]:
        """``process_step`` over many steps at once, one metric at a time, for the metrics in
        ``columns`` (a row's value, ``None`` where the row has none). Returns the signals as
        parts; row ``i``'s signals, in order, are those of the parts that cover it, in part
        order (``row_signals``): the same, and in the same order, as ``process_step`` per row
        would return. The detectors take each metric's values in one call (``update_many``)."""
        cfg = self.cfg
        s = self.series.get(rank)
        if s is None:
            s = self._rank(rank)
        self.touched.add(rank)
        parts: list[Part] = []
        routes = _ROUTES[self.generic]
        spike_cfgs = (cfg.spike, cfg.grad_spike, cfg.spike, cfg.generic_spike)
        for metric, cells in columns.items():
            route = routes.get(metric)
            if route is None:
                route = routes[metric] = _route(metric, self.generic)
            spike_kind, vol, arima_too, special = route
            at: list[int]  # the rows of the finite values
            xs: list[float]
            if None not in cells and _all_finite(cells):  # the common case, without a loop
                at, xs, st = list(range(len(cells))), cast(list[float], cells), steps
            else:
                at, xs = [], []
                bad: list[int] = []
                bad_sigs: list[list[Signal]] = []
                for i, x in enumerate(cells):
                    if x is None:
                        continue
                    if isfinite(x):
                        at.append(i)
                        xs.append(x)
                    else:  # as process_step: a nonfinite signal, nothing learnt
                        bad.append(i)
                        sig = Signal("nonfinite", metric, steps[i], x, 1.0, rank, severity=CRITICAL)
                        bad_sigs.append([sig])
                if bad:
                    parts.append(Part(bad, bad_sigs))
                if not xs:
                    continue
                st = [steps[i] for i in at]
            if spike_kind:
                state = s.spikes.get(metric)
                if state is None:
                    state = s.spikes[metric] = spike.SpikeState()
                parts.append(
                    Part(at, spike.update_many(state, spike_cfgs[spike_kind], metric, xs, st, rank))
                )
            if vol:
                vs = s.vol.get(metric)
                if vs is None:
                    vs = s.vol[metric] = volatility.VolatilityState()
                parts.append(Part(at, volatility.update_many(vs, cfg.volatility, metric, xs, st)))
            if cfg.arima_enabled and arima_too:
                a = s.arimas.get(metric)
                if a is None:
                    a = s.arimas[metric] = arima.ArimaState()
                run = SignalRun("arima", metric, rank)
                done = 0
                while done < len(xs):  # a fit asked for is applied before the next value
                    done += arima.update_many(
                        a, cfg.arima, metric, xs[done:], st[done:], rank, out=run
                    )[1]
                    if a.wants_fit:
                        self._want_fit(rank, metric, a)
                parts.append(Part(at, run))
            if special and metric == "loss":  # no signal of its own
                self._track_loss(xs)
            elif special and metric == "lr":
                parts.append(Part(at, lr_schedule.update_many(s.lr, cfg.lr, xs, st, rank)))
            elif special:
                special_of = self._special
                got = [
                    special_of(s, metric, x, steps[i], rank, None)
                    for i, x in zip(at, xs, strict=True)
                ]
                rows = [i for i, g in zip(at, got, strict=True) if g]
                if rows:
                    parts.append(Part(rows, [g for g in got if g]))
        if rank != RUN_RANK:
            parts += self._batch_tail(rank, steps, times_ns, columns, data_times, behind)
        return parts

    def _batch_tail(  # noqa: PLR0917
        self,
        rank: int,
        steps: list[int],
        times_ns: list[int],
        columns: dict[str, list[float | None]],
        data_times: list[float | None] | None,
        behind: int,
    ) -> list[Part]:
        """``_step_tail`` over the batch's rows: the data waits per row; the step times judged
        once, after the last row (their signals carry their own steps)."""
        step_times = columns.get("step_time_s")
        tail_rows: list[int] = []
        tails: list[list[Signal]] = []
        timed: list[tuple[int, float]] = []
        if step_times is not None:
            timed = [(st, x) for st, x in zip(steps, step_times, strict=True) if x is not None]
            if data_times is not None and any(w is not None for w in data_times):
                for i, (step, x, wait) in enumerate(
                    zip(steps, step_times, data_times, strict=True)
                ):
                    if x is not None and wait is not None:
                        got = thresholds.data_wait(self.cfg.thresholds, wait, x, step, rank)
                        if got:
                            tail_rows.append(i)
                            tails.append(got)
        if steps:
            # progress row by row keeps the first row of the largest step: the same, at once
            top = max(range(len(steps)), key=steps.__getitem__)
            ranks.progress(self.ranks, rank, steps[top], times_ns[top])
        if times_ns:
            self.last_step_ns = max(self.last_step_ns, *times_ns)
        judged = ranks.step_times(self.ranks, self.cfg.ranks, rank, timed, behind)
        grid = judged[0] if judged and isinstance(judged[0], SignalGrid) else None
        if judged and grid is None:
            sigs = cast(list[Signal], judged)
            if tail_rows and tail_rows[-1] == len(steps) - 1:
                tails[-1] = tails[-1] + sigs
            else:
                tail_rows.append(len(steps) - 1)
                tails.append(sigs)
        out = [Part(tail_rows, tails)] if tail_rows else []
        if grid is not None:  # after the row's other signals, as its judgements come
            out.append(Part([len(steps) - 1], grid))
        return out

    def process_entries(
        self, rank: int, entries: list[dict[str, Any]]
    ) -> tuple[list[Part], list[Alert]]:
        """The step records of a ``step_batch`` (its entries: step fields with ``step`` and
        ``time_ns``), scored together: the same signals and alerts as ``process`` gives them one
        record at a time (the signals of a step come in the order of the batch's columns)."""
        n = len(entries)
        self.records += n
        steps: list[int] = [e["step"] for e in entries]
        times: list[int] = [e["time_ns"] for e in entries]
        waits = [e.get("data_time_s") for e in entries]
        waits = [w if isinstance(w, (int, float)) else None for w in waits]
        columns = _entry_columns(entries)
        # the other ranks' batches of the same steps may come after this one
        behind = max(steps) - min(steps) if steps else 0
        parts = self.process_columns(rank, steps, times, columns, data_times=waits, behind=behind)
        alerts: list[Alert] = []
        for got in self.evaluate_parts(parts, n):
            alerts += got
        return parts, alerts

    def evaluate_parts(self, parts: list[Part], n: int) -> Iterator[list[Alert]]:
        """The rules over each of the ``n`` rows' signals (``process_columns``), row after row:
        yields each row's alert transitions, as ``evaluate`` per row would (``self.rules`` is the
        state after that row). A row with no breach while nothing fires or correlates only
        moves the rules' latest step, without building its signals."""
        last_step = _last_steps(parts, n)
        state = self.rules
        if not (state.firing or state.correlating or any(p.any_breach() for p in parts)):
            # every row is quiet: each moves the latest step on, to its last signal's step
            steps = [st for st in last_step if st is not None]
            if steps:
                rules.quiet(state, max(steps))
            for _ in range(n):
                yield []
            return
        full = [False] * n  # rows with a breach: their signals are built
        for part in parts:
            for i in part.breaching():
                full[i] = True
        where: list[list[int]] = []  # each part's ``where``, once a row needs its signals
        top: list[int | None] = []  # each row's largest step, once a row needs it
        for i in range(n):  # a row without signals yields no alert and changes nothing
            state = self.rules
            if full[i]:
                where = where or [part.where(n) for part in parts]
                yield self.evaluate(row_signals(parts, where, i, state.firing))
            elif state.correlating:  # a quiet row: resolutions, then the correlations
                where = where or [part.where(n) for part in parts]
                top = top or _top_steps(parts, n)
                if top[i] is _NO_SIGNAL:
                    yield []
                    continue
                sigs = self._firing_signals(parts, where, i)
                yield rules.quiet_while_correlating(
                    state, self.cfg.rules, self.run_id, sigs, last_step[i], top[i]
                )
            elif state.firing:  # a quiet row only counts towards resolving what fires
                where = where or [part.where(n) for part in parts]
                sigs = self._firing_signals(parts, where, i)
                yield rules.quiet_while_firing(
                    state, self.cfg.rules, self.run_id, sigs, last_step[i]
                )
            else:
                rules.quiet(state, last_step[i])
                yield []

    def _firing_signals(self, parts: list[Part], where: list[list[int]], i: int) -> list[Signal]:
        """Row ``i``'s signals of firing rules and scopes, in order: all that ``evaluate`` reads
        of a row without a breach (a column's signals have the scope "run")."""
        firing = self.rules.firing
        sigs: list[Signal] = []
        for part, at in zip(parts, where, strict=True):
            k = at[i]
            if k < 0:
                continue
            got = part.signals
            if isinstance(got, SignalRun):
                if (got.rule, "run") in firing:
                    sigs.append(got.signal(k))
            elif isinstance(got, SignalGrid):
                sigs += [g for g in got.signals(firing) if (g.rule, g.scope) in firing]
            else:
                sigs += [g for g in got[k] if (g.rule, g.scope) in firing]
        return sigs

    def _window(self, rec: Record) -> list[Signal]:
        metrics: dict[str, float] = {}
        peaks: dict[str, float] = {}
        for name, stats in rec.data["metrics"].items():
            if not isinstance(stats, dict):
                continue
            mean = stats.get("mean", stats.get("last"))
            if not isinstance(mean, (int, float)):
                continue
            metrics[name] = float(mean)
            if stats.get("nonfinite"):
                peaks[name] = math.nan
            elif isinstance(stats.get("max"), (int, float)):
                peaks[name] = float(stats["max"])
        step = rec.data.get("step_last", rec.step)
        first = rec.data.get("step_first")
        dt = rec.data["metrics"].get("data_time_s", {})
        data_time = dt.get("mean") if isinstance(dt, dict) else None
        return self.process_step(
            rec.rank,
            step,
            rec.time_ns,
            metrics,
            peaks,
            data_time,
            first if isinstance(first, int) else None,
        )

    def _eval(self, rec: Record) -> list[Signal]:
        d = rec.data
        vals = {
            k: float(d[k])
            for k in ("loss", "perplexity", "accuracy", "f1", "bleu", "rouge")
            if isinstance(d.get(k), (int, float))
        }
        vals.update({k: float(v) for k, v in (d.get("extra") or {}).items()})
        self.evals, sigs = evals.update(
            self.evals, self.cfg.evals, d["split"], vals, self.train_loss, rec.step
        )
        return sigs

    # ------------------------------------------------------------------ ARIMA fits
    def _want_fit(self, rank: int, metric: str, a: arima.ArimaState) -> None:
        if self.fit_inline:
            params = arima.fit(
                arima.fit_input(a, self.cfg.arima), self.cfg.arima.order, self.cfg.arima.method
            )
            arima.apply_fit(a, self.cfg.arima, params)
        else:
            self.fits_wanted.add((rank, metric))

    def pending_fits(self) -> list[tuple[FitKey, Any]]:
        """Inputs of the fits requested since the last call: ``[(key, values)]``."""
        out = []
        for rank, metric in self.fits_wanted:
            a = self.series[rank].arimas[metric]
            out.append(((rank, metric), arima.fit_input(a, self.cfg.arima)))
        self.fits_wanted.clear()
        return out

    def apply_fit(self, key: FitKey, params: arima.ArimaParams | None) -> None:
        s = self.series.get(key[0])
        if s is not None and key[1] in s.arimas:
            arima.apply_fit(s.arimas[key[1]], self.cfg.arima, params)
            self.touched.add(key[0])

    def take_touched(self) -> set[int]:
        """The ranks whose series changed since the last call (to save only those)."""
        got, self.touched = self.touched, set()
        return got

    def firing(self) -> list[tuple[str, str]]:
        return list(self.rules.firing)
