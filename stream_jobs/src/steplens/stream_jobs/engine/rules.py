"""Signals to alerts: one alert per run, rule and scope while it lasts (firing once, resolved
once), a diagnosis hint per rule, and correlation rules that combine what is firing."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from steplens.stream_jobs.engine.core import CRITICAL, INFO, WARNING, Alert, Signal
from steplens.stream_jobs.engine.hints import hint_for

SEVERITY_ORDER = {INFO: 0, WARNING: 1, CRITICAL: 2}
# judged across ranks for every rank at each step, behind the ranks' own records
CROSS_RANK = ("straggler:step_time_s",)
Amend = tuple[tuple[str, str], dict[str, Any]]  # evidence for the alert of (rule, scope)


def fingerprint(run_id: str, rule: str, scope: str) -> str:
    return hashlib.sha1(f"{run_id}|{rule}|{scope}".encode()).hexdigest()[:16]


@dataclass
class RulesConfig:
    resolve_after: int = 10  # steps without a breach (or clean samples, for step-less signals)
    # steps the run's latest may run ahead of a rank's alert before it is swept regardless
    sweep_lag: int = 200
    correlation_steps: int = 20  # how recent a breach must be to correlate
    note_steps: int = 2  # how recent a note must be (a loss jump with a gradient jump)
    # rules whose info-level breaches only feed correlations, never alert on their own
    silent: frozenset[str] = frozenset({"threshold:data_wait_share"})
    # detectors whose info-level breaches are notes of the alert policy: they feed the
    # correlations, never alert on their own
    notes: frozenset[str] = frozenset({"spike", "arima", "volatility"})


@dataclass
class Firing:
    severity: str
    started_step: int | None
    last_step: int | None
    clean: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class RulesState:
    firing: dict[tuple[str, str], Firing] = field(default_factory=dict)
    recent: dict[str, int] = field(default_factory=dict)  # rule -> last breach step
    noted: dict[str, int] = field(default_factory=dict)  # rule -> last note step
    swept_step: int = -1
    latest_step: int = -1
    correlating: bool = False  # a correlation is firing or a breach is recent
    # rank -> the latest step of its signals seen while something fires: a rank's alert is
    # swept by its own steps (ranks' batches of the same steps arrive at different times)
    rank_steps: dict[int, int] = field(default_factory=dict)


def _evidence(sig: Signal) -> dict[str, Any]:
    ev: dict[str, Any] = {"metric": sig.metric, "value": sig.value}
    if sig.score == sig.score:  # not NaN (no score yet)
        ev["score"] = round(sig.score, 4)
    if sig.rank >= 0:
        ev["rank"] = sig.rank
    if sig.expected is not None:
        ev["expected"] = sig.expected
    if sig.upper is not None:
        ev["upper"] = sig.upper
    if sig.lower is not None:
        ev["lower"] = sig.lower
    if sig.detail:
        ev.update(sig.detail)
    return ev


def _summary(rule: str, sig: Signal) -> str:
    where = f" on rank {sig.rank}" if sig.rank >= 0 else ""
    return f"{rule}{where} at step {sig.step}: {sig.metric}={sig.value:.6g}"


def evaluate(
    state: RulesState, cfg: RulesConfig, run_id: str, signals: list[Signal]
) -> tuple[RulesState, list[Alert]]:
    """Feed this record's signals; returns the alert transitions they cause."""
    alerts: list[Alert] = []
    firing = state.firing
    if not firing and not state.correlating:
        # the common case: nothing firing, nothing to correlate; only a breach changes that
        for sig in signals:
            if sig.severity is not None:
                break
        else:
            quiet(state, signals[-1].step if signals else None)
            return state, alerts
    breached = False
    note_rank_steps(state, ((sig.rank, sig.step) for sig in signals))
    for sig in signals:
        rule = f"{sig.name}:{sig.metric}"
        key = (rule, sig.scope)
        cur = firing.get(key)
        if sig.severity is None:
            if cur is not None and _resolves(cfg, cur, sig):
                del firing[key]
                alerts.append(_resolved(run_id, key, cur, sig.step))
            continue
        breached = True
        note = sig.severity == INFO and sig.name in cfg.notes
        if sig.step is not None:
            (state.noted if note else state.recent)[rule] = sig.step
        if note or (sig.severity == INFO and rule in cfg.silent):
            continue
        if cur is None:
            ev = _evidence(sig)
            started = sig.detail.get("since_step", sig.step) if sig.detail else sig.step
            cur = firing[key] = Firing(sig.severity, started, sig.step, 0, ev)
            alerts.append(_alert(run_id, key, cur, sig.step, _summary(rule, sig)))
        else:
            cur.clean = 0
            cur.last_step = sig.step
            if SEVERITY_ORDER[sig.severity] > SEVERITY_ORDER[cur.severity]:
                cur.severity = sig.severity  # escalation keeps the same alert
    last = signals[-1].step if signals else None
    if last is not None and last > state.latest_step:
        state.latest_step = last
    if signals and (breached or state.correlating):
        state, more = _correlate(state, cfg, run_id, signals)
        alerts += more
        step = signals[-1].step
        if step is not None and step > state.latest_step:
            state.latest_step = step
        if firing and step is not None and step > state.swept_step:
            state.swept_step = step
            alerts += _sweep(state, cfg, run_id, step)
    return state, alerts


def note_rank_steps(state: RulesState, pairs: Iterable[tuple[int, int | None]]) -> None:
    """Each rank's latest step, from (rank, step) pairs of signals (run-wide and step-less
    ones left out): what ``_sweep`` judges a rank's alert by."""
    ranks = state.rank_steps
    for rank, step in pairs:
        if rank >= 0 and step is not None and step > ranks.get(rank, -1):
            ranks[rank] = step


def quiet_while_firing(
    state: RulesState, cfg: RulesConfig, run_id: str, signals: list[Signal], last: int | None
) -> list[Alert]:
    """What ``evaluate`` does with signals none of which breaches while something fires and
    nothing correlates: ``signals`` are those of the firing rules and scopes (in order; the
    others change nothing), ``last`` the step of the record's last signal."""
    alerts: list[Alert] = []
    firing = state.firing
    for sig in signals:
        key = (sig.rule, sig.scope)
        cur = firing.get(key)
        if cur is not None and _resolves(cfg, cur, sig):
            del firing[key]
            alerts.append(_resolved(run_id, key, cur, sig.step))
    quiet(state, last)
    return alerts


def _resolves(cfg: RulesConfig, cur: Firing, sig: Signal) -> bool:
    """A quiet signal of what fires: whether it resolves now (``resolve_after`` steps after
    the last breach, or that many clean samples for signals without a step)."""
    if sig.step is not None and cur.last_step is not None:
        return sig.step - cur.last_step >= cfg.resolve_after
    cur.clean += 1
    return cur.clean >= cfg.resolve_after


def quiet_while_correlating(
    state: RulesState,
    cfg: RulesConfig,
    run_id: str,
    signals: list[Signal],
    *,
    last: int | None,
    top: int | None,
) -> list[Alert]:
    """What ``evaluate`` does with signals none of which breaches while a correlation is open
    or a breach is recent: ``signals`` are those of the firing rules and scopes (in order; the
    others change nothing), ``last`` the step of the record's last signal and ``top`` the
    largest step of its signals (None when none has one)."""
    alerts = quiet_while_firing(state, cfg, run_id, signals, last)
    state, more = _correlate_at(state, cfg, run_id, top if top is not None else state.latest_step)
    alerts += more
    if state.firing and last is not None and last > state.swept_step:
        state.swept_step = last
        alerts += _sweep(state, cfg, run_id, last)
    return alerts


def quiet(state: RulesState, step: int | None) -> None:
    """What ``evaluate`` does with signals none of which breaches while nothing fires or
    correlates: the latest step (of the last signal) moves on."""
    if step is not None and step > state.latest_step:
        state.latest_step = step


def _resolved(run_id: str, key: tuple[str, str], cur: Firing, step: int | None) -> Alert:
    summary = f"{key[0]} resolved at step {step}"
    return _alert(run_id, key, cur, step, summary, state="resolved")


def _sweep(state: RulesState, cfg: RulesConfig, run_id: str, step: int) -> list[Alert]:
    """Resolve step-based alerts whose signal stopped coming (e.g. a non-finite value): a
    rank's by its own latest step, as its records come (the run's latest may be another
    rank's batch, ahead), never past the step judged now; a rule judged across ranks
    (``CROSS_RANK``: it reports every rank at every step it judges, quiet or not) only by its
    own quiet signals. Either, past ``sweep_lag`` steps of the run's latest (a rank that
    stopped sending)."""
    out = []
    for key, cur in list(state.firing.items()):
        if key[0].startswith("correlation:") or cur.last_step is None:
            continue
        rank = cur.evidence.get("rank")
        at = min(state.rank_steps.get(rank, step), step) if isinstance(rank, int) else step
        if key[0].startswith(CROSS_RANK):
            at = -1
        gap = cfg.resolve_after + 1
        if at - cur.last_step >= gap or step - cur.last_step >= gap + cfg.sweep_lag:
            del state.firing[key]
            out.append(_resolved(run_id, key, cur, step))
    return out


def _recent(state: RulesState, rule: str, step: int | None, window: int) -> bool:
    seen = state.recent.get(rule)
    return seen is not None and (step is None or step - seen <= window)


def _correlate(
    state: RulesState, cfg: RulesConfig, run_id: str, signals: list[Signal]
) -> tuple[RulesState, list[Alert]]:
    """Fire a correlation when all its parts are recent; keep it while all still are, and
    ``resolve_after`` steps more (a long event whose parts breach on and off is one incident:
    the incident stays open while its members fire). Records without a step (hardware
    samples) are judged at the latest step seen; before any step is known nothing is judged,
    so every correlation alert carries its steps.
    """
    steps = [s.step for s in signals if s.step is not None]
    spans = [
        s.detail["span_first"]
        for s in signals
        if s.detail and isinstance(s.detail.get("span_first"), int)
    ]
    top = max(steps) if steps else state.latest_step
    return _correlate_at(state, cfg, run_id, top, min(spans) if spans else None)


def _correlate_at(
    state: RulesState, cfg: RulesConfig, run_id: str, step: int, span: int | None = None
) -> tuple[RulesState, list[Alert]]:
    """``_correlate`` at ``step``, the largest step of the record's signals; ``span``: the
    first step a window's breaches cover (a correlation a window fires is an aggregate over
    it: ``span_first``, so it adds to an incident its span covers, never a second page)."""
    if step < 0:
        return state, []
    w = cfg.correlation_steps
    groups = _correlation_parts(state, step, w, cfg.note_steps)
    out: list[Alert] = []
    for rule, parts in groups.items():
        key = (rule, "run")
        cur = state.firing.get(key)
        live = [p for p in parts if p]
        if cur is None:
            if not _fires(state, cfg, rule, parts, step):
                continue
            because = [r for p in parts for r in p]
            seen = {**state.noted, **state.recent}
            started = min((seen[r] for r in because if r in seen), default=step)
            ev: dict[str, Any] = {"because": because}
            if span is not None:
                ev["span_first"] = span
            cur = state.firing[key] = Firing(WARNING, started, step, 0, ev)
            out.append(
                _alert(run_id, key, cur, step, f"{rule} at step {step}: {', '.join(because)}")
            )
        elif len(live) == len(parts):  # every part still moves: the correlation holds
            cur.last_step = max(step, cur.last_step if cur.last_step is not None else step)
        elif cur.last_step is None or step - cur.last_step >= cfg.resolve_after:
            del state.firing[key]
            out.append(_resolved(run_id, key, cur, step))
    state.correlating = (
        any(_recent(state, r, step, w) for r in state.recent)
        or any(_noted(state, r, step, cfg.note_steps) for r in state.noted)
        or any(k[0].startswith("correlation:") for k in state.firing)
    )
    return state, out


def _noted(state: RulesState, rule: str, step: int | None, window: int) -> bool:
    seen = state.noted.get(rule)
    return seen is not None and (step is None or step - seen <= window)


def _fires(
    state: RulesState, cfg: RulesConfig, rule: str, parts: list[list[str]], step: int
) -> bool:
    """Whether a correlation that does not fire yet fires: each part breached in the last
    ``correlation_steps`` steps; for the loss and the gradient also each part moved (a breach
    or a note) in the last ``note_steps`` steps, one event seen in both (a note pairs with
    nothing older)."""
    w, note_w = cfg.correlation_steps, cfg.note_steps
    if not all(parts):
        return False
    if rule != "correlation:loss_grad":
        return True

    def any_of(p: list[str], note: bool) -> bool:
        near = note_w if note else w
        return any(
            _recent(state, r, step, near) or (note and _noted(state, r, step, near)) for r in p
        )

    return all(any_of(p, False) for p in parts) or all(any_of(p, True) for p in parts)


LOSS_PARTS = ("spike:loss", "volatility:loss", "arima:loss")
GRAD_PARTS = tuple(
    f"{name}:{metric}"
    for metric in ("grad_norm", "grad_norm_preclip")
    for name in ("spike", "arima", "nonfinite")
)


def _correlation_parts(
    state: RulesState, step: int, w: int, note_w: int
) -> dict[str, list[list[str]]]:
    """Per correlation rule, its parts: the rules now breaching (recent or firing) for each;
    the loss and gradient parts also count the notes of the last ``note_w`` steps (``_fires``
    says when they are enough)."""

    def bad(*rules: str) -> list[str]:
        return [
            r for r in rules if _recent(state, r, step, w) or any(k[0] == r for k in state.firing)
        ]

    def moved(rules: tuple[str, ...]) -> list[str]:
        return [r for r in rules if _recent(state, r, step, w) or _noted(state, r, step, note_w)]

    return {
        "correlation:loss_grad": [moved(LOSS_PARTS), moved(GRAD_PARTS)],
        "correlation:data_bottleneck": [
            bad("threshold:gpu_util"),
            bad("threshold:data_wait_share", "threshold:disk_io_latency_ms"),
        ],
        "correlation:eval_unstable": [
            [k[0] for k in state.firing if k[0].startswith("eval_unstable")]
        ],
    }


def _alert(
    run_id: str,
    key: tuple[str, str],
    cur: Firing,
    step: int | None,
    summary: str,
    *,
    state: str = "firing",
) -> Alert:
    """The ``state`` transition at ``step`` of the alert of ``key`` (rule, scope), as ``cur``
    fires: its severity, its first step and its evidence (a copy)."""
    rule, scope = key
    return Alert(
        rule,
        cur.severity,
        state,
        scope,
        hint_for(rule),
        fingerprint(run_id, rule, scope),
        run_id,
        step,
        cur.started_step,
        summary,
        dict(cur.evidence),
    )


def amend(
    state: RulesState, run_id: str, key: tuple[str, str], extra: dict[str, Any]
) -> Alert | None:
    """Evidence that came after the alert of ``key`` fired: added to it; its ``firing``
    transition again, with the evidence now known, for its incident to report (None: it no
    longer fires)."""
    cur = state.firing.get(key)
    if cur is None:
        return None
    cur.evidence.update(extra)
    return _alert(run_id, key, cur, cur.last_step, f"{key[0]}: evidence added ({', '.join(extra)})")
