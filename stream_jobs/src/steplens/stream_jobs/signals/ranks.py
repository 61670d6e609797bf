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
from itertools import chain
from typing import Any

import numpy as np

from steplens.stream_jobs.core import (
    CRITICAL,
    WARNING,
    Signal,
    SignalGrid,
    median,
    score_of,
)
from steplens.stream_jobs.signals import kernels

# signals (steps x ranks) judged at once, and ranks per step, from which the compiled grid
# pays (``_judge_many``: about 65 us a call and 3 us a step of 32 ranks; one by one, 3 us a
# signal, and a ``Signal`` built for each)
_MANY_SIGNALS, _MANY_RANKS = 24, 4
# the most a batch span may hold a step back (bounded memory with a rank that never reports)
MAX_BATCH_SPAN = 4096


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
    # steps spanned by the widest step batch of the run (capped): how far behind another rank's
    # batch of the same steps may still be; when to judge, not a judgement (not compared)
    batch_span: int = field(default=0, compare=False)


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
) -> SignalGrid | None:
    """``_judge`` over consecutive steps that all have the same ranks, each with ``keep``
    recent ratios, compiled (``kernels.stragglers``): the same signals in the same order, and
    the same floats (the medians ``core.median`` takes, each rank's recent ratios as its deque
    holds them), as a grid. ``None`` otherwise (a run's first steps, ranks that differ):
    ``_judge`` takes them."""
    keys = times[0].keys()
    if any(t.keys() != keys for t in times):
        return None
    order = list(keys)
    keep, factor = cfg.straggler_steps, cfg.straggler_factor
    ratios = state.ratios
    got = [ratios.get(rank) for rank in order]
    recents = [d for d in got if d is not None and d.maxlen == keep and len(d) == keep]
    if len(recents) < len(got):
        return None
    n = len(order)
    grid = np.fromiter(chain.from_iterable(map(t.__getitem__, order) for t in times), float)
    last = np.fromiter(chain.from_iterable(recents), float, n * keep).reshape(n, keep)
    med, typical, scores, window = kernels.stragglers(grid.reshape(-1, n), last, factor)
    for d, row in zip(recents, window.tolist(), strict=True):
        d.extend(row)  # bounded at ``keep``: the row replaces what it held
    per_step: list[list[int]] | None = None
    if any(list(t) != order for t in times):  # a step that has its ranks in another order
        index = {rank: k for k, rank in enumerate(order)}
        per_step = [[index[rank] for rank in t] for t in times]
    return SignalGrid(
        "straggler",
        "step_time_s",
        steps,
        order,
        [_scope(rank) for rank in order],
        typical,
        scores,
        typical > factor,
        WARNING,
        med.tolist(),
        (factor * med).tolist(),
        per_step,
    )


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
) -> list[Signal | SignalGrid]:
    """``step_time`` over a batch of one rank's steps, judged once after the last: the same
    judgements as step by step (the batch adds only this rank's times), in one pass. A step
    waits ``behind`` steps more than ``pending_steps``, or the span of the widest batch seen
    when that is more (up to ``MAX_BATCH_SPAN``): the other ranks' batches of the same steps
    may come after this one, and a rank whose batch was cut short (flushed at a spike) is
    ahead of ranks that still fill a whole one. Runs of steps judged at once come as
    ``SignalGrid``s, in their place among the signals."""
    state.batch_span = behind = max(min(behind, MAX_BATCH_SPAN), state.batch_span)
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
    return [] if last is None else _judge_ready(state, cfg, last, behind, grids=True)


def _judge_ready(
    state: RanksState, cfg: RanksConfig, step: int, behind: int, grids: bool = False
) -> list[Any]:
    """Judge, oldest first, the pending steps that are complete or ``pending_steps`` +
    ``behind`` older than ``step``, up to the first that is neither: their signals (with
    ``grids``, those judged at once as one ``SignalGrid``)."""
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
    n_ranks = len(judged[0])
    if n_ranks >= _MANY_RANKS and len(ready) * n_ranks >= _MANY_SIGNALS:
        many = _judge_many(state, cfg, ready, judged)
        if many is not None:
            return [many] if grids else many.signals()
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
