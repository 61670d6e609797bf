"""One rank of several waiting for its data alone: a straggler; waits of most ranks, the run's
data wait; a rank waiting before the others' records of its steps came, held, then judged."""

from __future__ import annotations

import numpy as np

from steplens.stream_jobs.engine.core import INFO_SEV, NO_SEV, WARN_SEV, Signals
from steplens.stream_jobs.engine.signals.lone_waits import MAX_HELD, LoneWaits, judge

LIMIT = 0.3


def waits(rank: int, steps: list[int], shares: list[float]) -> Signals:
    """One rank's data wait signals as ``thresholds.data_wait`` gives them (a share over the
    line warns)."""
    share = np.array(shares)
    return Signals.of(
        "threshold",
        "data_wait_share",
        np.arange(len(steps)),
        np.array(steps, dtype=np.int64),
        share,
        share / (share + LIMIT),
        np.where(share > LIMIT, WARN_SEV, NO_SEV),
        LIMIT,
        None,
        LIMIT,
        rank,
        f"rank:{rank}",
    )


def warnings(out: list[Signals]) -> list[tuple[str, int, int]]:
    """(rule, rank, step) of every warning in ``out``."""
    got = []
    for s in out:
        for k in np.flatnonzero(s.severity == WARN_SEV).tolist():
            rank = int(s.rank[k]) if isinstance(s.rank, np.ndarray) else s.rank
            got.append((s.rule, rank, int(s.step[k])))
    return got


HOLD_S = 2.0  # 200 steps of 10 ms


def feed(state: LoneWaits, rank: int, steps: list[int], shares: list[float]) -> list:
    """One rank's rows of ``steps`` (10 ms a step), judged: the warnings that come out."""
    times = [s * 10**7 for s in steps]
    return warnings(judge(state, waits(rank, steps, shares), rank, 0, times, HOLD_S))


def test_a_run_of_one_rank_is_judged_as_before():
    state = LoneWaits()
    assert feed(state, 0, [10, 11], [0.1, 0.9]) == [("threshold:data_wait_share", 0, 11)]
    assert state.held == {}


def test_a_rank_waiting_while_the_others_do_not_is_a_straggler_that_names_it():
    state = LoneWaits()
    for rank in (0, 2, 3):
        assert feed(state, rank, [10, 11], [0.02, 0.03]) == []
    out = judge(state, waits(1, [10, 11], [0.05, 0.8]), 1, 0, [10**8, 11 * 10**7], HOLD_S)
    assert warnings(out) == [("straggler:data_wait_share", 1, 11)]
    straggler, threshold = out
    assert straggler.detail == [{"rank": 1, "waits_on": "data"}]
    assert straggler.scope == ["rank:1"]
    assert threshold.severity.tolist() == [NO_SEV, INFO_SEV]  # a note, no page of its own


def test_most_ranks_waiting_is_the_runs_data_wait():
    state = LoneWaits()
    for rank in (0, 2):
        feed(state, rank, [10, 11], [0.5, 0.7])
    assert feed(state, 1, [10, 11], [0.6, 0.8]) == [
        ("threshold:data_wait_share", 1, 10),
        ("threshold:data_wait_share", 1, 11),
    ]


def test_a_warning_before_the_others_records_is_held_then_judged_when_they_come():
    state = LoneWaits()
    feed(state, 0, [9], [0.02])  # rank 0 known, its records not yet at step 11
    assert feed(state, 1, [10, 11], [0.1, 0.8]) == []
    assert [step for step, *_ in state.held[1]] == [11]
    # rank 0's steps 10-12 come, not waiting: rank 1's held warning is a straggler's
    assert feed(state, 0, [10, 11, 12], [0.02, 0.02, 0.02]) == [
        ("straggler:data_wait_share", 1, 11)
    ]
    assert state.held == {}


def test_a_held_warning_of_a_shared_wait_is_the_data_waits_when_the_others_come():
    state = LoneWaits()
    feed(state, 0, [9], [0.02])
    assert feed(state, 1, [10], [0.8]) == []
    got = feed(state, 0, [10], [0.7])  # rank 0 waits too: still held for rank 1's records
    assert ("threshold:data_wait_share", 1, 10) in got
    assert all(rule == "threshold:data_wait_share" for rule, _, _ in got)


def test_a_held_warning_is_released_as_the_data_waits_when_the_others_never_reach_it():
    state = LoneWaits()
    feed(state, 0, [9], [0.02])  # then rank 0 sends nothing
    assert feed(state, 1, [10], [0.8]) == []
    assert feed(state, 1, [150], [0.1]) == []  # 1.4 s on: still held
    assert feed(state, 1, [210], [0.1]) == [("threshold:data_wait_share", 1, 10)]
    assert state.held == {}


def test_a_held_warning_waits_for_the_others_however_far_its_own_steps_jump():
    """Its own next record, a window 90 steps on, is no reason to give up on the others: the
    others' windows of the same steps come next."""
    state = LoneWaits()
    feed(state, 0, [9], [0.02])
    assert feed(state, 1, [10, 11, 12], [0.8, 0.8, 0.8]) == []
    assert feed(state, 1, [99], [0.4]) == []  # its window, still held (same moment)
    got = feed(state, 0, [99], [0.02])  # rank 0's window of the same steps
    assert got == [("straggler:data_wait_share", 1, s) for s in (10, 11, 12, 99)]


def test_held_warnings_are_bounded_per_rank():
    state = LoneWaits()
    feed(state, 0, [0], [0.02])
    steps = list(range(1, 1 + 2 * MAX_HELD))
    share = [0.9] * len(steps)
    out = judge(state, waits(1, steps, share), 1, 0, [0] * len(steps), HOLD_S)
    assert warnings(out) == []
    assert len(state.held[1]) == MAX_HELD and state.held[1][-1][0] == steps[-1]
