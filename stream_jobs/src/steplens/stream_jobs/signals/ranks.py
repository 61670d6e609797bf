"""Across ranks: stragglers (step time above k x the median of all ranks for the same steps)
and hangs (no step progress for ``hang_after_s`` while the run still sends hardware samples).

``tick`` runs on hardware/health records. A hang is confirmed by two checks at least
``check_every_s`` apart, so a pause of the whole process (which delays every record alike) is
not mistaken for a stuck rank."""

from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import dataclass, field

from steplens.stream_jobs.core import CRITICAL, WARNING, Signal, median, score_of


@dataclass
class RanksConfig:
    straggler_factor: float = 1.5
    straggler_steps: int = 5  # the median ratio of this many recent steps must exceed the factor
    pending_steps: int = 8  # a step is judged once this many newer steps arrived, if incomplete
    hang_after_s: float = 60.0
    check_every_s: float = 1.0


@dataclass
class RanksState:
    world_size: int = 0
    pending: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> rank -> time
    ratios: dict[int, deque[float]] = field(default_factory=dict)  # rank -> recent ratios
    last_step: dict[int, int] = field(default_factory=dict)
    progress_ns: dict[int, int] = field(default_factory=dict)
    clock_ns: int = 0
    checked_ns: int = 0
    hung: set[int] = field(default_factory=set)
    suspects: set[int] = field(default_factory=set)


def _judge(state: RanksState, cfg: RanksConfig, step: int, times: dict[int, float]) -> list[Signal]:
    if len(times) < 2:
        return []
    med = median(times.values())
    factor, keep = cfg.straggler_factor, cfg.straggler_steps
    upper = factor * med
    ratios = state.ratios
    out = []
    for rank, t in times.items():
        ratio = t / med if med > 0 else 1.0
        recent = ratios.get(rank)
        if recent is None:
            recent = ratios[rank] = deque(maxlen=keep)
        recent.append(ratio)
        typical = median(recent)  # one slow step (GC, a checkpoint) is not a straggler
        slow = len(recent) == keep and typical > factor
        r = typical / factor
        out.append(
            Signal(
                "straggler",
                "step_time_s",
                step,
                typical,
                r / (r + 1.0) if 0.0 < r < math.inf else score_of(r),
                rank,
                _scope(rank),
                WARNING if slow else None,
                med,
                None,
                upper,
            )
        )
    return out


@functools.lru_cache(maxsize=4096)
def _scope(rank: int) -> str:
    return f"rank:{rank}"


def step_time(
    state: RanksState, cfg: RanksConfig, rank: int, step: int, seconds: float
) -> tuple[RanksState, list[Signal]]:
    """Collect one rank's step time; judge steps that are complete or old enough (the rank is
    ``pending_steps`` past them)."""
    if math.isnan(seconds):
        return state, []
    times = state.pending.get(step)
    if times is None:
        times = state.pending[step] = {}
    times[rank] = seconds
    return state, _judge_ready(state, cfg, step, 0)


def step_times(
    state: RanksState, cfg: RanksConfig, rank: int, times: list[tuple[int, float]], behind: int
) -> list[Signal]:
    """``step_time`` over a batch of one rank's steps, judged once after the last: the same
    judgements as step by step (the batch adds only this rank's times), in one pass. A step
    waits ``behind`` steps more than ``pending_steps``: the other ranks' batches of the same
    steps may come after this one."""
    pending = state.pending
    last: int | None = None
    for step, seconds in times:
        if math.isnan(seconds):
            continue
        got = pending.get(step)
        if got is None:
            got = pending[step] = {}
        got[rank] = seconds
        if last is None or step > last:
            last = step
    return [] if last is None else _judge_ready(state, cfg, last, behind)


def _judge_ready(state: RanksState, cfg: RanksConfig, step: int, behind: int) -> list[Signal]:
    """Judge, oldest first, the pending steps that are complete or ``pending_steps`` +
    ``behind`` older than ``step``, up to the first that is neither."""
    pending = state.pending
    ranks_known = max(state.world_size, len(state.last_step))
    old = step - cfg.pending_steps - behind
    first = min(pending)
    if first > old and len(pending[first]) < ranks_known:
        return []  # the oldest step waits, and every later one with it
    out: list[Signal] = []
    for s in sorted(pending):
        times = pending[s]
        if len(times) >= ranks_known or s <= old:
            out += _judge(state, cfg, s, times)
            del pending[s]
        else:
            break
    return out


def progress(state: RanksState, rank: int, step: int, time_ns: int) -> RanksState:
    if step > state.last_step.get(rank, -1):
        state.last_step[rank] = step
        state.progress_ns[rank] = time_ns
    return state


def tick(state: RanksState, cfg: RanksConfig, time_ns: int) -> tuple[RanksState, list[Signal]]:
    """Advance the run's clock (any record) and report ranks without progress."""
    state.clock_ns = max(state.clock_ns, time_ns)
    if state.clock_ns - state.checked_ns < cfg.check_every_s * 1e9 or not state.progress_ns:
        return state, []
    state.checked_ns = state.clock_ns
    out = []
    stalled_all = True
    for rank, seen in state.progress_ns.items():
        stalled = (state.clock_ns - seen) / 1e9
        late = stalled > cfg.hang_after_s
        hung = late and rank in state.suspects
        if late:
            state.suspects.add(rank)
        else:
            state.suspects.discard(rank)
        stalled_all = stalled_all and hung
        if hung or rank in state.hung:
            out.append(
                Signal(
                    "hang",
                    "progress",
                    None,
                    stalled,
                    score_of(stalled / cfg.hang_after_s),
                    rank,
                    f"rank:{rank}",
                    CRITICAL if hung else None,
                    expected=cfg.hang_after_s,
                    detail={"last_step": state.last_step.get(rank)},
                )
            )
        if hung:
            state.hung.add(rank)
        else:
            state.hung.discard(rank)
    if len(state.progress_ns) > 1 or stalled_all:
        out.append(
            Signal(
                "hang",
                "progress",
                None,
                0.0,
                1.0 if stalled_all else 0.0,
                scope="run",
                severity=CRITICAL if stalled_all else None,
            )
        )
    return state, out
