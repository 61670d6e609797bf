"""From incident to action: the advice the stream jobs give a run's ranks, each remedy only
when the damage it undoes is worth what it costs (pure).

An incident report (an ``Alert`` of scope "incident", firing: opened, escalated or amended)
becomes advice for the remedies the run opted into (its ``run_meta``'s ``remedies``):

* ``skip_samples``: a training incident with a loss or gradient spike (or a non-finite value)
  whose member names the samples of its batch (``signals.samples``): their ids, else hashes.
  It costs nothing: no step lost, no batch skipped; its evidence names how many samples.
* ``rewind`` (shared by every rank): only for damage that stays. A loss spike (or non-finite
  loss or gradient) of at least ``rewind_severity`` is judged against the loss's trend before
  its onset: the median of the last ``trend_steps`` finite losses before it (the run's lowest
  rank's: the weights' damage shows on every rank; in windowed mode its windows'). K
  (``rewind_confirm_steps``) steps after the onset (windowed: at the first window that starts
  past onset + K/2), the median loss of the latest K/2 steps (past onset + K/2) still above the
  trend by more than its tolerance (``trend_tolerance`` of the trend, or 3 MADs of those
  losses, whichever is more) is damage that stays; back within it, a blip: no rewind, no lr
  change. A non-finite loss or gradient is damage at once; a loss far above the trend (4
  tolerances) at every step since the onset, and not falling, is damage before K steps. The
  checkpoint: the latest the run reported before the onset and at most ``rewind_max_back``
  steps before it (PaLM restarted about 100 steps before a spike); none: not sent, the
  incident says what was suggested and that a person decides. The loader is not rewound: after
  the reload the run goes on with its next batches, so the ``steps_lost`` (``at_step`` - the
  checkpoint's step) batches trained on since the checkpoint are not trained on again, and
  ``skip_batches`` = min(``rewind_skip_margin``, ``rewind_max_skip`` - ``steps_lost``), at
  least 0, skips a margin more: ``batches_skipped``, at most ``rewind_max_skip`` in all (PaLM:
  200 to 500).
* ``lower_lr`` (shared): a loss and gradient correlation that keeps coming back (its
  ``lower_lr_repeats``-th incident or episode within ``lower_lr_window`` steps), when its damage
  stays (judged as for a rewind); the lr is multiplied by ``lr_factor``.
* ``profile``: a straggler or low GPU utilisation: ``profile_s`` seconds of profile, on the
  straggler's rank when the evidence names one, else on every rank.

Shared remedies never stack: an incident gets one (a rewind when one is possible, else the lr
change), never both at once; the other only when the loss is still off the pre-incident trend
K steps after the first's ``at_step`` (evidence that it did not work). Each is carried out by
every rank at the end of its ``at_step``: the run's last reported step (the most of any rank),
plus the steps the ranks have run since that report by the run's pace (a worker that is behind
its records still names a step ahead of the ranks: the decision's wall-clock time against the
report's), plus a lead covering the advice's latency and, in windowed mode, the window a rank
may be ahead of its last report: lead = clamp(ceil(``lead_s`` / the run's seconds per step) +
the steps of its last window + 2, 2, ``max_lead_steps``) (``max_lead_steps`` while the pace is
unknown). What a late decision adds to ``at_step`` adds to a rewind's cost, which the budget
and ``rewind_max_back`` then weigh.

A budget bounds what remedies cost a run: its steps lost stay within max(``remedy_budget`` x
its steps (the lr schedule's declared ``total_steps``, else the last step seen),
``remedy_budget_floor``). Past it the advice is held (reason "budget"): not sent; the incident's
evidence says what was suggested and that a person decides. A rewind without a checkpoint in
range is held the same way (reason "no_checkpoint"), and so is shared advice whose ``at_step``
is past the run's declared ``total_steps`` (reason "run_ends": no rank would carry it out).

Each piece of advice carries its cost (``steps_lost``, ``batches_skipped``) and its evidence
(what it was judged on). Each (incident, action) is advised once: the pair is remembered
(``max_advised``, oldest forgotten); a rank ignores a pair it already has, so a replay after a
restart is harmless. A storm is limited per run by a token bucket on the records' time
(``burst`` at once, one more every ``refill_s``): what it holds back is counted (``held``,
reason "storm") and not sent later. Incidents waiting for their judgement are kept per run
(``MAX_PENDING``, the oldest dropped and counted), with the run's losses of its last
``LOSS_ROWS`` steps (``track_loss``: a few array writes per step batch of its lowest rank, only
for a run that opted into a shared remedy).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from steplens.schema import MAX_LIST_LEN, MAX_STR_LEN, RUN_RANK
from steplens.stream_jobs.engine.core import CRITICAL, INFO, WARNING, Alert

_RANK = {INFO: 0, WARNING: 1, CRITICAL: 2}
ACTIONS = ("skip_samples", "rewind", "lower_lr", "profile")
SHARED = ("rewind", "lower_lr")  # carried out by every rank at ``at_step``; a rewind first
SAMPLE_RULES = frozenset(
    f"{name}:{metric}"
    for name in ("spike", "nonfinite")
    for metric in ("loss", "grad_norm", "grad_norm_preclip")
)
NONFINITE_RULES = frozenset(
    f"nonfinite:{metric}" for metric in ("loss", "grad_norm", "grad_norm_preclip")
)
REWIND_RULES = frozenset({"spike:loss", *NONFINITE_RULES})
LOSS_GRAD = "correlation:loss_grad"
# "straggler": any of its rules (a slow step, a lone data wait)
PROFILE_RULES = frozenset({"straggler", "threshold:gpu_util", "correlation:data_bottleneck"})

TREND_MADS = 3.0  # a loss is off its trend past this many MADs (x 1.4826) of the pre-onset ones
DIVERGED_TOLERANCES = 4.0  # ... and diverging past this many tolerances at every step
LOSS_ROWS = 1024  # slots of the run's loss rows (steps, or windows: the latest ones)
MAX_PENDING = 16  # incidents of a run waiting for their judgement
MIN_TREND = 5  # finite losses before the onset needed to judge against them
EMA = 0.2  # weight of the latest pace in the run's seconds per step


@dataclass
class AdviceConfig:
    skip_severity: str = WARNING  # least severity of an incident whose samples are skipped
    rewind_severity: str = CRITICAL  # least severity of a loss spike judged for a rewind
    rewind_confirm_steps: int = 20  # K: steps after the onset the damage is judged at
    trend_steps: int = 50  # finite losses before the onset whose median is the trend
    trend_tolerance: float = 0.05  # share of the trend a loss may be above it (or 3 MADs)
    rewind_max_back: int = 200  # a checkpoint at most this many steps before the onset
    rewind_skip_margin: int = 100  # batches skipped after the reload ...
    rewind_max_skip: int = 500  # ... so that at most this many are not trained on in all
    lr_factor: float = 0.5
    lower_lr_repeats: int = 2
    lower_lr_window: int = 2000  # steps
    remedy_budget: float = 0.05  # share of the run's steps remedies may undo ...
    remedy_budget_floor: int = 200  # ... or this many, whichever is more
    lead_s: float = 5.0  # seconds of advice latency a shared remedy's at_step covers
    max_lead_steps: int = 200  # at_step at most this far past the last reported step
    profile_s: float = 30.0
    burst: int = 4  # pieces of advice a run may get at once ...
    refill_s: float = 300.0  # ... and one more every this many seconds (records' time)
    max_checkpoints: int = 16  # kept per run, the latest
    max_advised: int = 1024


def _no_rows() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass
class AdviceState:
    remedies: list[str] = field(default_factory=list)  # what the run opted into
    checkpoints: list[list[Any]] = field(default_factory=list)  # [step, path], by step
    advised: dict[str, int] = field(default_factory=dict)  # "fingerprint|action" -> step
    loss_grad: list[list[Any]] = field(default_factory=list)  # [incident, episode, step]
    tokens: float = -1.0  # the bucket (-1: full, before the first advice)
    refilled_ns: int = 0
    given: int = 0
    held: int = 0  # held back: by the storm limit, the budget, no checkpoint in range
    # the run's loss (``track_loss``): its lowest rank's (the weights' damage shows on every
    # rank), each step (a window: its last) in slot step % LOSS_ROWS: the step (-1: none),
    # the loss, the first step (a window's)
    loss_rank: int = -1
    loss_step: np.ndarray = field(default_factory=_no_rows, compare=False)
    loss_x: np.ndarray = field(default_factory=_no_rows, compare=False)
    loss_first: np.ndarray = field(default_factory=_no_rows, compare=False)
    last_step: int = -1  # the largest step of the losses
    paced_step: int = -1  # the step and time the run's pace was last measured at
    paced_ns: int = 0
    step_s: float = 0.0  # seconds per step (EMA; 0: unknown)
    window: int = 0  # steps of the run's last window (0: steps are sent one by one)
    # incidents waiting for their judgement (``_register``), oldest first
    pending: list[dict[str, Any]] = field(default_factory=list)
    dropped: int = 0  # pending judgements dropped past ``MAX_PENDING``
    shared: dict[str, list[Any]] = field(default_factory=dict)  # fingerprint -> [action, at_step]
    steps_lost: int = 0  # by the remedies sent (the budget's use)

    @property
    def watch(self) -> bool:
        """Whether the run opted into a shared remedy (its losses are tracked)."""
        return "rewind" in self.remedies or "lower_lr" in self.remedies


@dataclass(frozen=True)
class Advised:
    """One piece of advice: its envelope's rank and step, the record's time, the payload;
    ``held``: why it was not sent ("storm", "budget", "no_checkpoint", "run_ends"), None when
    given."""

    rank: int
    step: int | None
    time_ns: int
    data: dict[str, Any]
    held: str | None = None

    @property
    def action(self) -> str:
        return str(self.data["action"])


class RunNow(NamedTuple):
    """What a decision reads of its run: the last step any rank reported, the steps it declared
    (its lr schedule's ``total_steps``; 0: none), the time of the record being scored and the
    wall-clock time of the decision (0: taken as the record's)."""

    last_step: int
    total_steps: int
    now_ns: int
    wall_ns: int = 0


class Decisions(NamedTuple):
    given: list[Advised]
    held: list[Advised]
    alerts: list[Alert]  # the incident reports, with the advice they carry now


def opt_in(state: AdviceState, remedies: Any) -> None:
    """A ``run_meta``'s remedies: every rank's together (a rank that did not opt in refuses)."""
    for name in remedies or ():
        if name in ACTIONS and name not in state.remedies:
            state.remedies.append(name)


def keep_checkpoint(state: AdviceState, cfg: AdviceConfig, step: int | None, path: str) -> None:
    """A ``checkpoint`` record: the latest ``max_checkpoints`` by step (one path a step)."""
    if step is None:
        return
    kept = [c for c in state.checkpoints if c[0] != step]
    kept.append([step, path])
    kept.sort(key=lambda c: c[0])
    state.checkpoints = kept[-cfg.max_checkpoints :]


# ------------------------------------------------------------------ the run's loss
def track_loss(
    state: AdviceState,
    rank: int,
    steps: np.ndarray,
    xs: np.ndarray,
    *,
    firsts: np.ndarray | None,
    rows: np.ndarray,
    times_ns: Sequence[int],
) -> None:
    """A rank's finite losses at ``steps`` (windowed: means over ``firsts``..``steps``), of
    batch ``rows`` (each row's time in ``times_ns``): kept when it is the run's lowest rank (a
    lower one takes over), with the run's pace (seconds per step) and its window."""
    if state.loss_rank < 0 or rank < state.loss_rank:
        state.loss_rank = rank
    elif rank != state.loss_rank or not len(steps):
        return
    if len(state.loss_step) != LOSS_ROWS:
        state.loss_step = np.full(LOSS_ROWS, -1, np.int64)
        state.loss_x = np.zeros(LOSS_ROWS)
        state.loss_first = np.zeros(LOSS_ROWS, np.int64)
    if firsts is None:
        firsts = steps
    if steps.min() < 0:  # rows without a step
        ok = steps >= 0
        steps, xs, firsts, rows = steps[ok], xs[ok], firsts[ok], rows[ok]
        if not len(steps):
            return
    at = steps % LOSS_ROWS
    state.loss_step[at] = steps
    state.loss_x[at] = xs
    state.loss_first[at] = firsts
    k = int(np.argmax(steps))
    top = int(steps[k])
    time_ns = int(times_ns[int(rows[k])])
    state.last_step = max(state.last_step, top)
    if firsts is not steps:  # windows: the last one's steps
        state.window = max(1, int(steps[-1]) - int(firsts[-1]) + 1)
    if top > state.paced_step:
        if state.paced_step >= 0 and time_ns > state.paced_ns:
            pace = (time_ns - state.paced_ns) / 1e9 / (top - state.paced_step)
            state.step_s = pace if state.step_s <= 0 else (1 - EMA) * state.step_s + EMA * pace
        state.paced_step, state.paced_ns = top, time_ns


def restarted(state: AdviceState, step: int) -> None:
    """A rank resumes at ``step`` (a rewind, a restart): the losses of the abandoned steps go,
    and the pace is measured again from its next steps."""
    state.loss_step[state.loss_step >= step] = -1
    state.last_step = int(state.loss_step.max()) if len(state.loss_step) else -1
    state.paced_step = -1


def steps_since_report(state: AdviceState, run: RunNow) -> int:
    """Steps the ranks have run since their last report was timed, by the run's pace, when the
    decision comes later than that report (a worker behind its records); 0 while unknown."""
    if run.wall_ns <= 0 or state.step_s <= 0 or state.paced_step < 0:
        return 0
    return max(0, int((run.wall_ns - state.paced_ns) / 1e9 / state.step_s))


def lead_steps(state: AdviceState, cfg: AdviceConfig) -> int:
    """Steps a shared remedy's ``at_step`` is ahead of the run's last reported step."""
    if state.step_s <= 0:
        return max(2, cfg.max_lead_steps)
    lead = math.ceil(cfg.lead_s / state.step_s) + state.window + 2
    return max(2, min(lead, cfg.max_lead_steps))


def budget(cfg: AdviceConfig, run: RunNow) -> int:
    """Steps the run's remedies may undo in all."""
    steps = run.total_steps if run.total_steps > 0 else max(run.last_step, 0)
    return max(int(cfg.remedy_budget * steps), cfg.remedy_budget_floor)


def _trend(state: AdviceState, cfg: AdviceConfig, onset: int) -> list[float] | None:
    """[trend, tolerance]: the median of the last ``trend_steps`` finite losses before the onset
    and how far above it a loss may be; None without ``MIN_TREND`` of them."""
    _, xs, _ = _rows(state, state.loss_step < onset)
    xs = xs[-cfg.trend_steps :]
    if len(xs) < MIN_TREND:
        return None
    trend = float(np.median(xs))
    mad = float(np.median(np.abs(xs - trend)))
    return [trend, max(cfg.trend_tolerance * abs(trend), TREND_MADS * 1.4826 * mad)]


def _rows(state: AdviceState, where: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kept loss rows ``where`` says, by step: (steps, losses, first steps)."""
    pick = np.flatnonzero(where & (state.loss_step >= 0))
    order = pick[np.argsort(state.loss_step[pick], kind="stable")]
    return state.loss_step[order], state.loss_x[order], state.loss_first[order]


def _verdict(state: AdviceState, cfg: AdviceConfig, c: dict[str, Any]) -> tuple[bool, str] | None:
    """Whether the damage of pending incident ``c`` stays (with the evidence), judged from its
    ``base`` (its onset, or its first remedy's ``at_step``); None: not yet."""
    base, (trend, tol) = c["base"], c["trend"]
    k = cfg.rewind_confirm_steps
    since = "the onset" if c["first"] is None else f"the {c['first']}'s step {base}"
    if not len(state.loss_step):
        return None
    steps, values, firsts = _rows(state, state.loss_first > base)
    if not len(steps):
        return None
    after = list(zip(steps.tolist(), values.tolist(), firsts.tolist(), strict=True))
    xs = values.tolist()
    half = len(xs) // 2
    far = trend + DIVERGED_TOLERANCES * tol
    if (
        len(xs) >= max(3, k // 4)
        and min(xs) > far
        and statistics.fmean(xs[half:]) >= statistics.fmean(xs[:half])
    ):
        return True, (
            f"far off trend, not coming back: loss {xs[-1]:.4g} vs trend {trend:.4g} "
            f"({_pct(xs[-1], trend)}), that far above it at every step since {since} "
            f"({after[-1][0] - base} steps)"
        )
    if state.last_step < base + k:
        return None
    recent = _latest([r for r in after if r[2] > base + k // 2], max(1, k // 2))
    if not recent:
        return None
    now = statistics.median(recent)
    n = after[-1][0] - base
    text = f"loss {now:.4g} vs trend {trend:.4g} ({_pct(now, trend)}) {n} steps after {since}"
    if now > trend + tol:
        return True, text
    return False, f"back on trend: {text}"


def _latest(rows: list[tuple[int, float, int]], steps: int) -> list[float]:
    """The losses of the latest ``rows`` (step, loss, first step) that cover ``steps`` steps."""
    out: list[float] = []
    covered = 0
    for step, x, first in reversed(rows):
        out.append(x)
        covered += step - first + 1
        if covered >= steps:
            break
    return out


def _pct(x: float, trend: float) -> str:
    return f"{100 * (x - trend) / abs(trend):+.0f} %" if trend else "n/a"


# ------------------------------------------------------------------ advice
def advise(
    state: AdviceState, cfg: AdviceConfig, alerts: list[Alert], run: RunNow | None = None
) -> tuple[list[Advised], list[Advised]]:
    """The advice the incident reports among ``alerts`` call for, and the pending judgements
    the run's losses now decide: (given, held back)."""
    given: list[Advised] = []
    held: list[Advised] = []
    if not state.remedies:
        return given, held
    if run is None:
        run = RunNow(state.last_step, 0, max((a.time_ns for a in alerts), default=0))
    for a in alerts:
        if a.scope != "incident" or a.state != "firing":
            continue
        for adv in _immediate(state, cfg, a):
            _emit(state, cfg, adv, run.now_ns, given, held)
        _register(state, cfg, a)
    for c in list(state.pending):
        if c["evidence"]:  # non-finite: damage at once
            got: tuple[bool, str] | None = (True, c["evidence"])
        elif c["trend"] is None:  # nothing to judge it against
            got = (False, "")
        else:
            got = _verdict(state, cfg, c)
        if got is None:
            continue
        state.pending.remove(c)
        if got[0]:
            _decide(state, cfg, c, got[1], run, given, held)
    return given, held


def _base(a: Alert, onset: int | None) -> dict[str, Any]:
    return {
        "fingerprint": a.fingerprint,
        "rule": a.rule,
        "reason": a.hint[:MAX_STR_LEN],
        **({"onset_step": onset} if onset is not None and onset >= 0 else {}),
    }


def _immediate(state: AdviceState, cfg: AdviceConfig, a: Alert) -> list[Advised]:
    """The advice an incident report calls for at once: its samples skipped, a profile."""
    members = list(a.evidence.get("members") or ())
    rules = {m.get("rule") for m in members}
    base = _base(a, a.started_step)
    out: list[Advised] = []

    def add(action: str, rank: int = RUN_RANK, **data: Any) -> None:
        if action in state.remedies:
            out.append(Advised(rank, a.step, a.time_ns, {"action": action, **base, **data}))

    if _RANK.get(a.severity, 0) >= _RANK[cfg.skip_severity]:
        ids, hashes = _samples(members)
        named: dict[str, Any] | None = (
            {"sample_ids": ids} if ids else {"sample_hashes": hashes} if hashes else None
        )
        if named:
            n = len(ids or hashes)
            at = f" of the batch at step {a.started_step}" if a.started_step is not None else ""
            add(
                "skip_samples",
                **named,
                steps_lost=0,
                batches_skipped=0,
                evidence=f"{n} samples{at} ({a.rule}); nothing undone, no batch skipped",
            )
    if any(r in PROFILE_RULES or str(r).split(":", 1)[0] in PROFILE_RULES for r in rules):
        add("profile", _straggler_rank(members), duration_s=cfg.profile_s)
    return out


def _register(state: AdviceState, cfg: AdviceConfig, a: Alert) -> None:
    """The shared remedies an incident report may call for, to be judged (``pending``)."""
    members = list(a.evidence.get("members") or ())
    rules = {m.get("rule") for m in members}
    onset = a.started_step
    want: list[str] = []
    if (
        rules & REWIND_RULES
        and _RANK.get(a.severity, 0) >= _RANK[cfg.rewind_severity]
        and onset is not None
    ):
        want.append("rewind")
    if LOSS_GRAD in rules and _loss_grad_again(state, cfg, a):
        want.append("lower_lr")
    fp = a.fingerprint
    want = [w for w in want if w in state.remedies and f"{fp}|{w}" not in state.advised]
    if not want or onset is None:
        return
    c = next((p for p in state.pending if p["fp"] == fp), None)
    if c is not None:
        c["want"] = [w for w in SHARED if w in c["want"] or w in want]  # a rewind first
        return
    first = state.shared.get(fp)
    c = {
        "fp": fp,
        "onset": onset,
        "base": onset if first is None else first[1],
        "first": None if first is None else first[0],
        "want": want,
        "trend": _trend(state, cfg, onset),
        "data": _base(a, onset),
        "step": a.step,
        "evidence": "",
    }
    if rules & NONFINITE_RULES and first is None:  # damage at once, whatever the trend
        metric = sorted(r for r in rules if r in NONFINITE_RULES)[0].split(":", 1)[1]
        c["evidence"] = f"non-finite {metric} at step {onset}"
    elif c["trend"] is None:
        return  # no trend to judge against: no shared remedy
    state.pending.append(c)
    while len(state.pending) > MAX_PENDING:
        state.pending.pop(0)
        state.dropped += 1


def _decide(  # noqa: PLR0917
    state: AdviceState,
    cfg: AdviceConfig,
    c: dict[str, Any],
    evidence: str,
    run: RunNow,
    given: list[Advised],
    held: list[Advised],
) -> None:
    """Damage that stays: the first shared remedy of ``c`` that can be given (a rewind, else
    the lr change); the rest wait for evidence that it did not work."""
    fp = c["fp"]
    last = max(run.last_step, state.last_step, c["base"])
    at_step = last + steps_since_report(state, run) + lead_steps(state, cfg)
    for i, action in enumerate(c["want"]):
        if f"{fp}|{action}" in state.advised:
            continue
        if action == "rewind":
            adv = _rewind(state, cfg, c, evidence, at_step, run)
        else:
            text = (
                f"{evidence}; the loss and gradient correlation came back "
                f"({cfg.lower_lr_repeats} incidents within {cfg.lower_lr_window} steps)"
            )
            data = {"lr_factor": cfg.lr_factor, "steps_lost": 0, "batches_skipped": 0}
            adv = _advised(c, run, "lower_lr", at_step, text, data)
        if adv.held is None and 0 < run.total_steps <= at_step:
            adv = _too_late(adv, run.total_steps)
        outcome = _emit(state, cfg, adv, run.now_ns, given, held)
        if outcome == "sent":
            state.steps_lost += int(adv.data.get("steps_lost") or 0)
            state.shared[fp] = [action, at_step]
            while len(state.shared) > cfg.max_advised:
                del state.shared[next(iter(state.shared))]
            rest = [w for w in c["want"][i + 1 :] if f"{fp}|{w}" not in state.advised]
            if rest:  # judged again from this one's step: only if it did not work
                again = {"base": at_step, "first": action, "want": rest, "evidence": ""}
                state.pending.append({**c, **again})
            return
        if outcome == "storm":  # not sent later, and nothing else now
            return


def _rewind(  # noqa: PLR0917
    state: AdviceState,
    cfg: AdviceConfig,
    c: dict[str, Any],
    evidence: str,
    at_step: int,
    run: RunNow,
) -> Advised:
    """A rewind to the latest checkpoint before the onset within ``rewind_max_back`` steps,
    held when there is none or it is past the run's budget."""
    onset = c["onset"]
    ckpt = next(
        (ck for ck in reversed(state.checkpoints) if onset - cfg.rewind_max_back <= ck[0] < onset),
        None,
    )
    if ckpt is None:
        text = (
            f"{evidence}; rewind suggested, not sent: no checkpoint within "
            f"{cfg.rewind_max_back} steps before the onset; a person decides"
        )
        return _advised(c, run, "rewind", at_step, text, {}, held="no_checkpoint")
    lost = at_step - ckpt[0]
    skip = max(0, min(cfg.rewind_skip_margin, cfg.rewind_max_skip - lost))
    data = {
        "checkpoint": ckpt[1],
        "checkpoint_step": ckpt[0],
        "skip_batches": skip,
        "steps_lost": lost,
        "batches_skipped": skip,
    }
    text = (
        f"{evidence}; checkpoint {onset - ckpt[0]} steps before the onset; {lost} steps undone "
        f"(their batches not trained on again), {skip} more batches skipped"
    )
    limit = budget(cfg, run)
    if state.steps_lost + lost > limit:
        text += (
            f"; not sent: past the run's remedy budget ({state.steps_lost} + {lost} of "
            f"{limit} steps); a person decides"
        )
        return _advised(c, run, "rewind", at_step, text, data, held="budget")
    return _advised(c, run, "rewind", at_step, text, data)


def _too_late(adv: Advised, total_steps: int) -> Advised:
    """``adv`` held: the run's declared last step comes before its ``at_step``, so no rank
    would carry it out."""
    text = (
        f"{adv.data['evidence']}; not sent: the run ends at step {total_steps}, before step "
        f"{adv.data['at_step']} where every rank would carry it out; a person decides"
    )
    return replace(adv, data={**adv.data, "evidence": text[:MAX_STR_LEN]}, held="run_ends")


def _advised(  # noqa: PLR0917
    c: dict[str, Any],
    run: RunNow,
    action: str,
    at_step: int,
    evidence: str,
    data: dict[str, Any],
    held: str | None = None,
) -> Advised:
    payload = {
        "action": action,
        **c["data"],
        **data,
        "at_step": at_step,
        "evidence": evidence[:MAX_STR_LEN],
    }
    return Advised(RUN_RANK, max(run.last_step, 0), run.now_ns, payload, held)


def _emit(  # noqa: PLR0917
    state: AdviceState,
    cfg: AdviceConfig,
    adv: Advised,
    now_ns: int,
    given: list[Advised],
    held: list[Advised],
) -> str | None:
    """Give ``adv`` once per (incident, action), within the storm limit: "sent", why it was
    held, or None (advised before)."""
    key = f"{adv.data['fingerprint']}|{adv.action}"
    if key in state.advised:
        return None
    state.advised[key] = adv.step if adv.step is not None else -1
    while len(state.advised) > cfg.max_advised:
        del state.advised[next(iter(state.advised))]
    if adv.held is None and _take_token(state, cfg, now_ns):
        state.given += 1
        given.append(adv)
        return "sent"
    state.held += 1
    held.append(adv if adv.held is not None else replace(adv, held="storm"))
    return held[-1].held


def _samples(members: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The sample ids and hashes the spike members name (each once, at most MAX_LIST_LEN)."""
    ids: dict[str, None] = {}
    hashes: dict[str, None] = {}
    for m in members:
        got = m.get("samples")
        if m.get("rule") in SAMPLE_RULES and isinstance(got, dict):
            ids.update(dict.fromkeys(str(v) for v in got.get("ids") or ()))
            hashes.update(dict.fromkeys(str(v) for v in got.get("hashes") or ()))
    return list(ids)[:MAX_LIST_LEN], list(hashes)[:MAX_LIST_LEN]


def _loss_grad_again(state: AdviceState, cfg: AdviceConfig, a: Alert) -> bool:
    """Whether this loss and gradient correlation is the ``lower_lr_repeats``-th of the last
    ``lower_lr_window`` steps (an incident opening again counts as another)."""
    step = a.started_step if a.started_step is not None else a.step
    if step is None:
        return False
    episode = int(a.evidence.get("episode") or 0)
    seen = state.loss_grad
    if not any(s[0] == a.fingerprint and s[1] == episode for s in seen):
        seen.append([a.fingerprint, episode, step])
    recent = [s for s in seen if step - s[2] <= cfg.lower_lr_window]
    state.loss_grad = recent[-max(cfg.lower_lr_repeats, 1) :]
    return len(recent) >= cfg.lower_lr_repeats


def _straggler_rank(members: list[dict[str, Any]]) -> int:
    ranks = {
        m["rank"]
        for m in members
        if str(m.get("rule")).split(":", 1)[0] == "straggler"
        and isinstance(m.get("rank"), int)
        and m["rank"] >= 0
    }
    return ranks.pop() if len(ranks) == 1 else RUN_RANK


def _take_token(state: AdviceState, cfg: AdviceConfig, now_ns: int) -> bool:
    if state.tokens < 0:
        state.tokens, state.refilled_ns = float(cfg.burst), now_ns
    elif now_ns > state.refilled_ns and cfg.refill_s > 0:
        gained = (now_ns - state.refilled_ns) / 1e9 / cfg.refill_s
        state.tokens = min(float(cfg.burst), state.tokens + gained)
        state.refilled_ns = now_ns
    if state.tokens >= 1.0:
        state.tokens -= 1.0
        return True
    return False
