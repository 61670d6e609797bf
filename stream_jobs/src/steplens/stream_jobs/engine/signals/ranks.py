"""Across ranks: stragglers (step time above k x the median of all ranks for the same steps)
and hangs (no step progress for ``hang_after_s`` while the run still sends hardware samples).

A rank slow before its collective does not show in its step time: the all-reduce holds every
rank until the slowest gets there, so every rank's step takes as long. Its data wait does: a
rank that waits ``e`` seconds longer for its batch than the median of the other ranks was busy
``e`` longer before the collective, while they waited for it; their own work took at most the
step time less ``e``. Its ratio is then at least ``step / (step - e)`` (``_data_ratios``). A
rank's ratio for a step is the larger of the two, and a straggler's signal says which it is:
``waits_on`` "data" (its data wait explains it) or "compute" (its step time alone, its data
wait as the others').

In a windowed run a rank's own step time comes only when its guard sent a step at once (a
jump from its own baseline); the other ranks' times for that step come, if ever, in windows
that end elsewhere. Such a step's own times are judged ``lone_step_hold_s`` after the first
came (the records' clock), without waiting for the others (the means of windows that end at
that step, a wide run's ranks ending theirs at different steps, ``Identity.phase``, wait for
their peers): when fewer than half of the ranks sent their own time
for it, each is held against the run's step time (the median of the ranks' latest windows,
``levels``), so a rank that turned slow is a straggler within three of its steps rather than
after its next window or two; when most did, the run slowed and they are held against each
other.

``tick`` runs on hardware/health records. A hang is confirmed by two checks at least
``check_every_s`` apart, so a pause of the whole process (which delays every record alike) is
not mistaken for a stuck rank. A shard of a wide run past its first (``Run.shard``) judges its
ranks' hangs without paging them: the collectives hold every rank of a run when one stops, so
the ranks of shard 0 stop too, and its detector pages the hang once for the whole run (each
shard paging its own ranks was one page per shard for one hang)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.schema import Record
from steplens.stream_jobs.engine.core import CRIT_SEV, WARN_SEV, Run, Signals, score_of
from steplens.stream_jobs.engine.signals.kernels import _insert, _median_sorted, jit, score
from steplens.stream_jobs.engine.signals.lone_waits import LoneWaits

# the most a batch span may hold a step back (bounded memory with a rank that never reports)
MAX_BATCH_SPAN = 4096
NAN = math.nan


@dataclass
class RanksConfig:
    straggler_factor: float = 1.5
    straggler_steps: int = 5  # the median ratio of this many recent steps must exceed the factor
    pending_steps: int = 8  # a step is judged once this many newer steps arrived, if incomplete
    hang_after_s: float = 60.0
    # a rank's data wait warning waits this long (the run's records' clock) for the other
    # ranks' records of its steps, to be judged a lone straggler's or the run's (lone_waits)
    lone_hold_s: float = 30.0
    # a windowed run's step sent at once by a rank's guard is judged this long after it came
    # (the records' clock): the other ranks' steps sent at once when the whole run slowed
    # come by then
    lone_step_hold_s: float = 2.0
    check_every_s: float = 1.0


@dataclass
class RanksState:
    world_size: int = 0
    pending: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> rank -> time
    ratios: dict[int, list[float]] = field(default_factory=dict)  # rank -> recent ratios
    last_step: dict[int, int] = field(default_factory=dict)
    progress_ns: dict[int, int] = field(default_factory=dict)
    clock_ns: int = 0
    checked_ns: int = 0
    hung: set[int] = field(default_factory=set)
    suspects: set[int] = field(default_factory=set)
    # rank -> (rows in a row over the data-wait share, the last row's step, whether the rank
    # sends windows)
    data_wait_streaks: dict[int, tuple[int, int, bool]] = field(default_factory=dict)
    # each rank's latest data wait share, and the warnings held for the others' (``lone_waits``)
    lone: LoneWaits = field(default_factory=LoneWaits)
    # step -> rank -> data wait (s) of the pending steps, judged with their times
    waits: dict[int, dict[int, float]] = field(default_factory=dict)
    # pending steps whose times are windows' means (sustained over the window by themselves)
    windows: set[int] = field(default_factory=set)
    # pending step -> the ranks whose time for it is the step's own (a step sent raw), which a
    # window's mean ending at that step does not replace: the two are compared apart (beside
    # ``windows``, which a state stored before it restores with)
    own: dict[int, set[int]] = field(default_factory=dict)
    # each rank's latest window mean of its step time (the run's step time is their median;
    # none: the run sends no windows), and when each pending step's first own time came in a
    # windowed run (the records' clock)
    levels: dict[int, float] = field(default_factory=dict)
    own_since: dict[int, int] = field(default_factory=dict)
    # steps spanned by the widest step batch of the run (capped): how far behind another rank's
    # batch of the same steps may still be; when to judge, not a judgement (not compared)
    batch_span: int = field(default=0, compare=False)


@functools.lru_cache(maxsize=4096)
def _scope(rank: int) -> str:
    return f"rank:{rank}"


def step_times(  # noqa: PLR0917
    state: RanksState,
    cfg: RanksConfig,
    rank: int,
    times: list[tuple[int, float]],
    behind: int,
    row: int,
    waits: list[tuple[int, float]] | None = None,
    windowed: bool = False,
    now_ns: int = 0,
) -> Signals | None:
    """Collect one rank's step times (a record's one, or a batch's, or ``windowed``: windows'
    means, each judged by itself: one window over the factor is a straggler, as
    ``straggler_steps`` steps are) and data waits (``waits``, of the same steps), then judge,
    oldest first,
    the pending steps that are complete or old enough: their signals, all on batch row ``row``.
    A step waits ``pending_steps`` newer steps of this rank, plus ``behind`` (the batch's span)
    or the span of the widest batch seen when that is more (up to ``MAX_BATCH_SPAN``): the other
    ranks' batches of the same steps may come after this one, and a rank whose batch was cut
    short (flushed at a spike) is ahead of ranks that still fill a whole one. ``now_ns``: the
    records' time (the run's clock), for a windowed run's steps sent at once."""
    state.batch_span = behind = max(min(behind, MAX_BATCH_SPAN), state.batch_span)
    state.clock_ns = max(state.clock_ns, now_ns)
    pending = state.pending
    last: int | None = None
    own = state.own
    for step, seconds in times:
        if math.isnan(seconds):
            continue
        got = pending.get(step)
        if got is None:
            got = pending[step] = {}
        if last is None or step > last:
            last = step
        if windowed:
            state.levels[rank] = seconds
            if rank in own.get(step, ()):
                continue  # the step's own time came first: it stays
            state.windows.add(step)
        else:
            own.setdefault(step, set()).add(rank)
            if state.levels:  # a windowed run
                state.own_since.setdefault(step, now_ns or state.clock_ns)
        got[rank] = seconds
    if last is None:
        return None
    for step, wait in waits or ():
        if windowed and rank in own.get(step, ()):
            continue
        if step in pending and math.isfinite(wait):
            state.waits.setdefault(step, {})[rank] = wait
    ready, lone = _ready(state, cfg, last, behind)
    judged = _judge(state, cfg, ready, row, lone) if ready or lone else None
    _forget_gone(state)
    return judged


def ranks_known(state: RanksState) -> int:
    """The run's width: its declared world size, or the ranks seen if more."""
    return max(state.world_size, len(state.last_step))


def _run_step_time(state: RanksState) -> float:
    """A windowed run's step time: the median of its ranks' latest window means."""
    return float(np.median(list(state.levels.values())))


def _against_run(state: RanksState, sent: int, known: int) -> bool:
    """Whether a windowed run's own times of a step, which ``sent`` ranks sent, are held
    against the run's step time (fewer than half of the ranks sent theirs: a rank turned
    slow) rather than against each other (the run slowed)."""
    return 2 * sent < known and len(state.levels) >= 3


def early(state: RanksState, cfg: RanksConfig, rank: int, row: int) -> Signals | None:
    """A windowed run's rank whose own steps (sent at once) are still held, paged without
    waiting for them: once one of its steps was judged slow alone (the run had not slowed
    then: those ranks' steps are held against each other), its held steps that few ranks
    sent their own time for yet are as good as judged against the run's step time, and the
    median of its latest ``straggler_steps`` ratios, the held ones included, says straggler
    or not. With 1 s steps the third slow step pages as it comes, not ``lone_step_hold_s``
    later; its judgement after the hold keeps the alert firing (or lets it go)."""
    factor, keep = cfg.straggler_factor, cfg.straggler_steps
    judged = state.ratios.get(rank)
    if not judged or max(judged[-keep:]) <= factor:
        return None
    known = ranks_known(state)
    held = [  # its held steps few ranks sent their own time for yet: the run did not slow
        (s, got[rank])
        for s, got in state.pending.items()
        if rank in got
        and rank in (own := state.own.get(s, ()))
        and _against_run(state, len(own), known)
    ]
    if not held:
        return None
    level = _run_step_time(state)
    if level <= 0:
        return None
    held.sort()
    recent = (judged + [t / level for _, t in held])[-keep:]
    typical = float(np.median(recent))
    if len(recent) < keep or typical <= factor:
        return None
    return Signals.of(
        "straggler",
        "step_time_s",
        np.array([row], dtype=np.int64),
        np.array([held[-1][0]], dtype=np.int64),
        [typical],
        [score(typical / factor)],
        np.array([WARN_SEV], dtype=np.int8),
        [level],
        None,
        [factor * level],
        np.array([rank], dtype=np.int64),
        [_scope(rank)],
        [{"rank": rank, "waits_on": "compute", "held_steps": len(held)}],
    )


def _forget_gone(state: RanksState) -> None:
    """What the steps no longer pending left behind (judged, or dropped by a restart)."""
    pending = state.pending
    for by_step in (state.waits, state.own, state.own_since):
        if len(by_step) > len(pending):
            for step in [s for s in by_step if s not in pending]:
                del by_step[step]
    if len(state.windows) > len(pending):
        state.windows.intersection_update(pending)


def _ready(
    state: RanksState, cfg: RanksConfig, step: int, behind: int
) -> tuple[list[int], list[int]]:
    """The pending steps, oldest first, that are complete or ``pending_steps`` + ``behind``
    older than ``step``, up to the first that is neither; and, apart, a windowed run's other
    steps that ranks' own times came for, ``lone_step_hold_s`` after the first came."""
    pending = state.pending
    known = ranks_known(state)
    old = step - cfg.pending_steps - behind
    ready: list[int] = []
    first = min(pending)
    if first <= old or len(pending[first]) >= known:  # else it waits, and all after it
        for s in sorted(pending):
            if len(pending[s]) >= known or s <= old:
                ready.append(s)
            else:
                break
    return ready, _held_long_enough(state, cfg, set(ready))


def _held_long_enough(state: RanksState, cfg: RanksConfig, taken: set[int]) -> list[int]:
    """A windowed run's pending steps with ranks' own times, the first of them
    ``lone_step_hold_s`` ago or more (the records' clock), but those in ``taken``."""
    if not state.own_since:
        return []
    held = state.clock_ns - int(cfg.lone_step_hold_s * 1e9)
    return [s for s, since in state.own_since.items() if since <= held and s not in taken]


def _take(
    state: RanksState, step: int, own_only: bool
) -> tuple[dict[int, float], dict[int, float], bool, set[int]]:
    """A ready step's times, data waits, whether windows end at it and its ranks' own times,
    taken from the pending ones; ``own_only``: only its own times, the windows' means ending
    at it stay pending for their peers."""
    own = state.own.pop(step, set())
    state.own_since.pop(step, None)
    if own_only:
        got = state.pending[step]
        mine = {r: got.pop(r) for r in own if r in got}
        waits = state.waits.get(step) or {}
        waited = {r: waits.pop(r) for r in own if r in waits}
        if not got:  # no window's mean came for it after all
            del state.pending[step]
            state.waits.pop(step, {})
            state.windows.discard(step)
        return mine, waited, False, own
    waited = state.waits.pop(step, {})
    window = step in state.windows
    state.windows.discard(step)
    return state.pending.pop(step), waited, window, own


def _judge(
    state: RanksState, cfg: RanksConfig, ready: list[int], row: int, lone: list[int]
) -> Signals | None:
    """Each of the ``ready`` steps and the ``lone`` ones, oldest first, taken from pending
    (of a lone step that windows end at too, the ranks' own times only), with two ranks or
    more: each rank's time against the step's median, and its typical ratio (the median of
    its latest ``straggler_steps``: one slow step, a GC or a checkpoint, is not a
    straggler)."""
    steps: list[int] = []
    ranks: list[int] = []
    times: list[float] = []
    data: list[float] = []  # each time's ratio from its data wait (0: none)
    sustained: list[bool] = []  # each time's step is a window's (its ratio is its typical)
    starts = [0]
    refs: list[float] = []  # each group's step time to hold its times against (NaN: its median)
    known = ranks_known(state)
    held = state.windows.intersection(lone)  # lone steps windows end at: own times only
    for s in sorted(ready + lone):
        got, waited, window, own = _take(state, s, s in held)
        # steps' own times and windows' means: never one against the other
        for group, sust, ref in _groups(state, got, own, window, known):
            sustained += [sust] * len(group)
            steps += [s] * len(group)
            ranks += group.keys()
            times += group.values()
            data += _data_ratios(group, waited)
            starts.append(len(times))
            refs.append(ref)
    if not times:
        return None
    keep = cfg.straggler_steps
    index: dict[int, int] = {}
    for r in ranks:
        index.setdefault(r, len(index))
    table = np.zeros((len(index), keep))
    counts = np.zeros(len(index), np.int64)
    ratios = state.ratios
    for r, k in index.items():
        recent = ratios.get(r)
        if recent:
            recent = recent[-keep:]
            table[k, : len(recent)] = recent
            counts[k] = len(recent)
    by_data = np.array(data)
    med, typical, scores, full = _stragglers(
        np.array(times),
        by_data,
        np.array(sustained, dtype=np.bool_),
        np.array(starts, dtype=np.int64),
        np.array(refs),
        np.array([index[r] for r in ranks], dtype=np.int64),
        table,
        counts,
        float(cfg.straggler_factor),
    )
    for r, k in index.items():
        ratios[r] = table[k, : counts[k]].tolist()
    factor = cfg.straggler_factor
    sev = np.where(full & (typical > factor), WARN_SEV, 0).astype(np.int8)
    detail: list[dict[str, Any] | None] | None = None
    if sev.any():  # a straggler: which rank, and what it waits on
        detail = [None] * len(times)
        for k in np.flatnonzero(sev).tolist():
            on_data = by_data[k] > 1.0 and by_data[k] * med[k] >= times[k]
            detail[k] = {"rank": ranks[k], "waits_on": "data" if on_data else "compute"}
    return Signals(
        "straggler",
        "step_time_s",
        np.full(len(times), row, dtype=np.int64),
        np.array(steps, dtype=np.int64),
        typical,
        scores,
        sev,
        med,
        np.full(len(times), NAN),
        factor * med,
        np.array(ranks, dtype=np.int64),
        [_scope(r) for r in ranks],
        detail,
    )


def _groups(
    state: RanksState, got: dict[int, float], own: set[int], window: bool, ranks_known: int
) -> list[tuple[dict[int, float], bool, float]]:
    """A step's times in the groups judged apart: (times, whether they are windows' means,
    the step time they are held against, NaN: their median). In a windowed run the ranks'
    own times are a group of their own: held against the run's step time when fewer than
    half of the ranks sent theirs (a rank turned slow), else against each other (the run
    slowed)."""
    if not own or not state.levels:  # not a windowed run's own times
        return [(got, window, NAN)] if len(got) >= 2 else []
    mine = {r: t for r, t in got.items() if r in own}
    rest = {r: t for r, t in got.items() if r not in own}
    out: list[tuple[dict[int, float], bool, float]] = []
    if _against_run(state, len(mine), ranks_known):
        out.append((mine, False, _run_step_time(state)))
    elif len(mine) >= 2:
        out.append((mine, False, NAN))
    if len(rest) >= 2:
        out.append((rest, window, NAN))
    return out


RATIO_CAP = 100.0  # the most a data wait's ratio says (a wait as long as the step)


def _data_ratios(times: dict[int, float], waits: dict[int, float]) -> list[float]:
    """Each rank of a step's (``times``, in their order) ratio from its data wait: a rank that
    waited ``e`` s longer than the median of the other ranks did their work in at most the
    step's median time ``m`` less ``e``, so its own took ``m / (m - e)`` times theirs (0: no
    longer wait, or waits of fewer than two ranks: its step time alone says)."""
    out = [0.0] * len(times)
    if len(waits) < 2:
        return out
    m = float(np.median(list(times.values())))
    for i, r in enumerate(times):
        w = waits.get(r)
        if w is None or m <= 0:
            continue
        others = [x for q, x in waits.items() if q != r]
        e = w - float(np.median(others))
        if e > 0:
            out[i] = m / (m - e) if m - e > m / RATIO_CAP else RATIO_CAP
    return out


@jit
def _stragglers(  # noqa: PLR0917
    times: np.ndarray,
    by_data: np.ndarray,
    sustained: np.ndarray,
    starts: np.ndarray,
    refs: np.ndarray,
    who: np.ndarray,
    recents: np.ndarray,
    counts: np.ndarray,
    factor: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each step's ranks against the median of the step (or ``refs[j]``, where not NaN):
    step ``j``'s times are
    ``times[starts[j]:starts[j + 1]]``, of the ranks ``who`` (rows of ``recents``: each rank's
    latest ratios, oldest first, ``counts`` of them; both updated in place, a full row drops
    its oldest); a time's ratio is at least its ``by_data`` (``_data_ratios``); a
    ``sustained`` time (a window's mean) is its own typical ratio. Returns each
    time's step median, its rank's typical ratio (the median of its latest), its score and
    whether the rank's window is full. Medians as ``statistics.median``."""
    keep = recents.shape[1]
    n = len(times)
    med = np.empty(n)
    typical = np.empty(n)
    scores = np.empty(n)
    full = np.zeros(n, np.bool_)
    row = np.empty(n + 1)
    w = np.empty(keep + 1)
    for j in range(len(starts) - 1):
        a, b = starts[j], starts[j + 1]
        k = 0
        for t in range(a, b):
            _insert(row, k, times[t])
            k += 1
        m = _median_sorted(row, k) if np.isnan(refs[j]) else refs[j]
        for t in range(a, b):
            med[t] = m
            ratio = times[t] / m if m > 0 else 1.0
            ratio = max(ratio, by_data[t])
            r = who[t]
            c = counts[r]
            if c == keep:
                for u in range(keep - 1):
                    recents[r, u] = recents[r, u + 1]
                recents[r, keep - 1] = ratio
            else:
                recents[r, c] = ratio
                c += 1
                counts[r] = c
            if sustained[t]:
                ty = ratio
                full[t] = True
            else:
                for u in range(c):
                    _insert(w, u, recents[r, u])
                ty = _median_sorted(w, c)
                full[t] = c == keep
            typical[t] = ty
            scores[t] = score(ty / factor)
    return med, typical, scores, full


def progress(state: RanksState, rank: int, step: int, time_ns: int) -> RanksState:
    if step > state.last_step.get(rank, -1):
        state.last_step[rank] = step
        state.progress_ns[rank] = time_ns
    return state


def tick(
    state: RanksState, cfg: RanksConfig, time_ns: int, row: int = 0, pages: bool = True
) -> Signals | None:
    """Advance the run's clock (any record) and report ranks without progress (breaches
    where ``pages``, else quiet signals: a shard past a wide run's first)."""
    state.clock_ns = max(state.clock_ns, time_ns)
    if state.clock_ns - state.checked_ns < cfg.check_every_s * 1e9 or not state.progress_ns:
        return None
    state.checked_ns = state.clock_ns
    cols: list[list[Any]] = [[], [], [], [], [], []]  # rank, scope, value, score, sev, detail
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
            got: tuple[Any, ...] = (
                rank,
                f"rank:{rank}",
                stalled,
                score_of(stalled / cfg.hang_after_s),
                CRIT_SEV if hung and pages else 0,
                {"last_step": state.last_step.get(rank)},
            )
            for c, v in zip(cols, got, strict=True):
                c.append(v)
        if hung:
            state.hung.add(rank)
        else:
            state.hung.discard(rank)
    expected = [cfg.hang_after_s] * len(cols[0])
    if len(state.progress_ns) > 1 or stalled_all:
        run_sev = CRIT_SEV if stalled_all and pages else 0
        got = (-1, "run", 0.0, 1.0 if stalled_all else 0.0, run_sev, None)
        for c, v in zip(cols, got, strict=True):
            c.append(v)
        expected.append(NAN)
    if not cols[0]:
        return None
    rank_, scope, value, score_, sev, detail = cols
    return Signals.of(
        "hang",
        "progress",
        np.full(len(rank_), row),
        None,
        value,
        score_,
        np.array(sev, dtype=np.int8),
        expected,
        None,
        None,
        np.array(rank_, dtype=np.int64),
        [str(s) for s in scope],
        list(detail),
    )


def on_record(state: RanksState, cfg: RanksConfig, rec: Record, run: Run) -> list[Signals]:
    """A ``hw`` or ``health`` record: the run is alive; is every rank moving? And the steps
    of a windowed run held long enough by the clock it moved (``lone_step_hold_s``)."""
    if not rec.time_ns:
        return []
    out = []
    got = tick(state, cfg, rec.time_ns, pages=run.shard == 0)
    if got is not None:
        out.append(got)
    lone = _held_long_enough(state, cfg, set())
    if lone:
        judged = _judge(state, cfg, [], 0, lone)
        if judged is not None:
            out.append(judged)
    return out


def warm_up_kernel() -> None:
    st = RanksState(world_size=2)
    step_times(st, RanksConfig(), 0, [(0, 1.0)], 0, 0)
    step_times(st, RanksConfig(), 1, [(0, 1.0)], 0, 0)
