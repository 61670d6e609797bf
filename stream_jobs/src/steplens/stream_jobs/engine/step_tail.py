"""What a rank's steps give besides their metrics' signals: the data waits, the rank's progress
and its step times judged against the other ranks'."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from steplens.stream_jobs.engine.columns import Columns, floats_of
from steplens.stream_jobs.engine.core import NO_STEP, Run, Signals
from steplens.stream_jobs.engine.signals import lone_waits, ranks, thresholds


def tail(
    state: ranks.RanksState,
    ranks_cfg: ranks.RanksConfig,
    thresholds_cfg: thresholds.ThresholdConfig,
    run: Run,
    rank: int,
    *,
    steps: np.ndarray,
    times_ns: Sequence[int],
    columns: Columns,
    data_times: Sequence[float | None] | None,
    behind: int,
    firsts: np.ndarray | None,
) -> list[Signals]:
    """After the metrics of a rank's steps: the data waits (per row; ``firsts``: the rows are
    windows' means, from these steps on), a lone one a straggler (``lone_waits``); the rank's
    progress; its step times judged against the other ranks', once, after the last row (their
    signals carry their own steps)."""
    out: list[Signals] = []
    windowed = firsts is not None
    has = steps != NO_STEP
    if not has.any():
        return out
    n = len(steps)
    rows = np.arange(n, dtype=np.int64)
    cells = columns.get("step_time_s")
    step_times = floats_of(cells)[0] if cells is not None else None
    if step_times is not None and data_times is not None and any(w is not None for w in data_times):
        waits, _ = floats_of(data_times)
        got, state.data_wait_streaks[rank] = thresholds.data_wait(
            thresholds_cfg,
            waits,
            step_times,
            steps,
            rows,
            rank,
            sustained=windowed,
            streak=state.data_wait_streaks.get(rank, (0, -1, False)),
        )
        if got is not None:  # one rank of several waiting alone is a straggler
            # held warnings the batch lets judge: before the batch's own signals, so the
            # straggler leads what its steps set off here (a slower step's forecast)
            hold = ranks_cfg.lone_hold_s
            spans = None if firsts is None else firsts.tolist()
            out += lone_waits.judge(state.lone, got, rank, 0, times_ns, hold, spans)
    at = np.flatnonzero(has)
    top = int(at[np.argmax(steps[at])])  # the first row of the largest step
    ranks.progress(state, rank, int(steps[top]), times_ns[top])
    now_ns = max(times_ns) if times_ns else 0  # the records' clock, for the step times
    run.last_step_ns = max(run.last_step_ns, now_ns)
    run.last_step = max(run.last_step, int(steps[top]))
    timed: list[tuple[int, float]] = []
    waited: list[tuple[int, float]] | None = None
    if cells is not None and step_times is not None:
        timed = [
            (st, x)
            for st, x, c, h in zip(
                steps.tolist(), step_times.tolist(), cells, has.tolist(), strict=True
            )
            if c is not None and h
        ]
        if data_times is not None:  # a rank slow before its collective waits on its data
            waited = [
                (st, w)
                for st, w, h in zip(steps.tolist(), data_times, has.tolist(), strict=True)
                if w is not None and h
            ]
    judged = ranks.step_times(
        state, ranks_cfg, rank, timed, behind, n - 1, waited, windowed, now_ns
    )
    if judged is not None:
        out.append(judged)
    if not windowed and timed and state.levels:  # a windowed run's steps sent at once
        got = ranks.early(state, ranks_cfg, rank, n - 1)
        if got is not None:
            out.append(got)
    return out
