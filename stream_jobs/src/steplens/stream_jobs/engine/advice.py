"""From incident to action: the advice the stream jobs give a run's ranks (pure).

An incident report (an ``Alert`` of scope "incident", firing: opened, escalated or amended)
becomes advice for the remedies the run opted into (its ``run_meta``'s ``remedies``):

* ``skip_samples``: a training incident with a loss or gradient spike (or a non-finite value)
  whose member names the samples of its batch (``signals.samples``): their ids, else hashes;
* ``rewind``: a loss spike or non-finite loss/gradient of at least ``rewind_severity``, when
  the run reported a checkpoint before the onset: the latest such, and ``skip_batches``, the
  steps from it to the onset plus ``rewind_skip_after`` (at most ``rewind_max_skip``). PaLM
  restarted about 100 steps before a spike and skipped 200 to 500 batches: at the defaults a
  checkpoint 100 steps back skips 300;
* ``lower_lr``: a loss and gradient correlation that keeps coming back: its
  ``lower_lr_repeats``-th incident (or episode) within ``lower_lr_window`` steps; the lr is
  multiplied by ``lr_factor``;
* ``profile``: a straggler or low GPU utilisation: ``profile_s`` seconds of profile, on the
  straggler's rank when the evidence names one, else on every rank.

Each (incident, action) is advised once: the pair is remembered (``max_advised``, oldest
forgotten); a rank ignores a pair it already has, so a replay after a restart is harmless. A
storm is limited per run by a token bucket on the records' time (``burst`` at once, one more
every ``refill_s``): what it holds back is counted (``held``) and not sent later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from steplens.schema import MAX_LIST_LEN, MAX_STR_LEN, RUN_RANK
from steplens.stream_jobs.engine.core import CRITICAL, INFO, WARNING, Alert

_RANK = {INFO: 0, WARNING: 1, CRITICAL: 2}
ACTIONS = ("skip_samples", "rewind", "lower_lr", "profile")
SAMPLE_RULES = frozenset(
    f"{name}:{metric}"
    for name in ("spike", "nonfinite")
    for metric in ("loss", "grad_norm", "grad_norm_preclip")
)
REWIND_RULES = frozenset(
    {"spike:loss", "nonfinite:loss", "nonfinite:grad_norm", "nonfinite:grad_norm_preclip"}
)
LOSS_GRAD = "correlation:loss_grad"
PROFILE_RULES = frozenset({"straggler", "threshold:gpu_util", "correlation:data_bottleneck"})


@dataclass
class AdviceConfig:
    skip_severity: str = WARNING  # least severity of an incident whose samples are skipped
    rewind_severity: str = CRITICAL
    rewind_skip_after: int = 200  # batches skipped past the onset, after reloading
    rewind_max_skip: int = 1000
    lr_factor: float = 0.5
    lower_lr_repeats: int = 2
    lower_lr_window: int = 2000  # steps
    profile_s: float = 30.0
    burst: int = 4  # pieces of advice a run may get at once ...
    refill_s: float = 300.0  # ... and one more every this many seconds (records' time)
    max_checkpoints: int = 16  # kept per run, the latest
    max_advised: int = 1024


@dataclass
class AdviceState:
    remedies: list[str] = field(default_factory=list)  # what the run opted into
    checkpoints: list[list[Any]] = field(default_factory=list)  # [step, path], by step
    advised: dict[str, int] = field(default_factory=dict)  # "fingerprint|action" -> step
    loss_grad: list[list[Any]] = field(default_factory=list)  # [incident, episode, step]
    tokens: float = -1.0  # the bucket (-1: full, before the first advice)
    refilled_ns: int = 0
    given: int = 0
    held: int = 0  # held back by the storm limit


@dataclass(frozen=True)
class Advised:
    """One piece of advice: its envelope's rank and step, the record's time, the payload."""

    rank: int
    step: int | None
    time_ns: int
    data: dict[str, Any]

    @property
    def action(self) -> str:
        return str(self.data["action"])


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


def advise(
    state: AdviceState, cfg: AdviceConfig, alerts: list[Alert]
) -> tuple[list[Advised], list[Advised]]:
    """The advice the incident reports among ``alerts`` call for: (given, held back)."""
    given: list[Advised] = []
    held: list[Advised] = []
    if not state.remedies:
        return given, held
    for a in alerts:
        if a.scope != "incident" or a.state != "firing":
            continue
        for adv in _wanted(state, cfg, a):
            key = f"{a.fingerprint}|{adv.action}"
            if key in state.advised:
                continue
            state.advised[key] = a.step if a.step is not None else -1
            while len(state.advised) > cfg.max_advised:
                del state.advised[next(iter(state.advised))]
            if _take_token(state, cfg, a.time_ns):
                state.given += 1
                given.append(adv)
            else:
                state.held += 1
                held.append(adv)
    return given, held


def _wanted(state: AdviceState, cfg: AdviceConfig, a: Alert) -> list[Advised]:
    members = list(a.evidence.get("members") or ())
    rules = {m.get("rule") for m in members}
    sev = _RANK.get(a.severity, 0)
    onset = a.started_step
    base = {
        "fingerprint": a.fingerprint,
        "rule": a.rule,
        "reason": a.hint[:MAX_STR_LEN],
        **({"onset_step": onset} if onset is not None and onset >= 0 else {}),
    }
    out: list[Advised] = []

    def add(action: str, rank: int = RUN_RANK, **data: Any) -> None:
        if action in state.remedies:
            out.append(Advised(rank, a.step, a.time_ns, {"action": action, **base, **data}))

    if sev >= _RANK[cfg.skip_severity]:
        ids, hashes = _samples(members)
        if ids:
            add("skip_samples", sample_ids=ids)
        elif hashes:
            add("skip_samples", sample_hashes=hashes)
    if rules & REWIND_RULES and sev >= _RANK[cfg.rewind_severity] and onset is not None:
        ckpt = next((c for c in reversed(state.checkpoints) if c[0] < onset), None)
        if ckpt is not None:
            skip = min(cfg.rewind_max_skip, onset - ckpt[0] + cfg.rewind_skip_after)
            add("rewind", checkpoint=ckpt[1], checkpoint_step=ckpt[0], skip_batches=skip)
    if LOSS_GRAD in rules and _loss_grad_again(state, cfg, a):
        add("lower_lr", lr_factor=cfg.lr_factor)
    if rules & PROFILE_RULES:
        add("profile", _straggler_rank(members), duration_s=cfg.profile_s)
    return out


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
        if m.get("rule") == "straggler" and isinstance(m.get("rank"), int) and m["rank"] >= 0
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
