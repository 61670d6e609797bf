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

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from steplens.stream_jobs.core import CRITICAL, WARNING, Signal, median, score_of, scores_of

# steps judged at once, and ranks per step, from which numpy pays (``_judge_many``: about
# 0.5 ms a call, as much as judging 8 steps of 32 ranks one by one)
_MANY_STEPS, _MANY_RANKS = 12, 4


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


def _judge_many(
    state: RanksState, cfg: RanksConfig, steps: list[int], times: list[dict[int, float]]
) -> list[Signal] | None:
    """``_judge`` over consecutive steps that all have the same ranks, each with ``keep``
    recent ratios, with numpy: the same signals in the same order, and the same floats (the
    medians ``core.median`` takes, each rank's recent ratios as its deque holds them).
    ``None`` otherwise (a run's first steps, ranks that differ): ``_judge`` takes them."""
    keys = times[0].keys()
    if any(t.keys() != keys for t in times):
        return None
    order = list(keys)
    keep, factor = cfg.straggler_steps, cfg.straggler_factor
    ratios = state.ratios
    recents = [ratios.get(rank) for rank in order]
    if not all(d is not None and d.maxlen == keep and len(d) == keep for d in recents):
        return None
    grid = np.array([[t[r] for r in order] for t in times], dtype=float)
    med = np.median(grid, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(med[:, None] > 0, grid / med[:, None], 1.0)
    # each rank's windows of its ``keep`` latest ratios, one ending at each step
    seq = np.concatenate((np.array(recents, dtype=float), ratio.T), axis=1)
    windows = np.sort(sliding_window_view(seq, keep, axis=1)[:, 1:, :], axis=2)
    h = keep // 2
    typical = (windows[:, :, h] if keep % 2 else (windows[:, :, h - 1] + windows[:, :, h]) / 2).T
    for rank, row in zip(order, seq[:, -keep:].tolist(), strict=True):
        ratios[rank] = deque(row, maxlen=keep)
    score = scores_of(typical / factor)
    slow = typical > factor
    typical_l, score_l, slow_l = typical.tolist(), score.tolist(), slow.tolist()
    med_l, upper_l = med.tolist(), (factor * med).tolist()
    index = {rank: k for k, rank in enumerate(order)}
    scopes = [_scope(rank) for rank in order]
    out: list[Signal] = []
    append = out.append
    for j, step in enumerate(steps):
        ty, sc, sl, m, up = typical_l[j], score_l[j], slow_l[j], med_l[j], upper_l[j]
        for rank in times[j]:
            k = index[rank]
            append(
                Signal(
                    "straggler",
                    "step_time_s",
                    step,
                    ty[k],
                    sc[k],
                    rank,
                    scopes[k],
                    WARNING if sl[k] else None,
                    m,
                    None,
                    up,
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
    ready: list[int] = []
    for s in sorted(pending):
        if len(pending[s]) >= ranks_known or s <= old:
            ready.append(s)
        else:
            break
    judged = [pending.pop(s) for s in ready]
    if len(ready) >= _MANY_STEPS and len(judged[0]) >= _MANY_RANKS:
        many = _judge_many(state, cfg, ready, judged)
        if many is not None:
            return many
    out: list[Signal] = []
    for s, times in zip(ready, judged, strict=True):
        out += _judge(state, cfg, s, times)
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
