from hypothesis import given, settings
from hypothesis import strategies as st
from reference import ranks_ref

from steplens.stream_jobs.engine.core import Signal
from steplens.stream_jobs.engine.signals import ranks
from steplens.stream_jobs.engine.signals.ranks import RanksConfig, RanksState, progress


def step_time(st, cfg, rank, step, t):
    """A step record's time: judged as the detector does for a record (a batch of one)."""
    got = ranks.step_times(st, cfg, rank, [(step, t)], 0, 0)
    return st, [] if got is None else got.views()


def tick(st, cfg, time_ns):
    got = ranks.tick(st, cfg, time_ns)
    return st, [] if got is None else got.views()


def test_straggler_needs_most_recent_steps_slow():
    st = RanksState(world_size=4)
    cfg = RanksConfig()
    flagged = []
    for step in range(10):
        for rank in range(4):
            t = 0.3 if rank == 2 and step >= 4 else 0.1
            st, sigs = step_time(st, cfg, rank, step, t)
            flagged += [(s.step, s.rank) for s in sigs if s.severity]
    # the median of the last 5 ratios crosses 1.5 once 3 of them are slow
    assert flagged[0] == (4 + cfg.straggler_steps // 2, 2)
    assert {r for _, r in flagged} == {2}


def test_one_window_whose_rank_waited_on_data_is_a_straggler_by_itself():
    """Windows' means: each is sustained over its steps, so one window over the factor
    fires (steps need ``straggler_steps`` of them); the rank waited on its data."""
    st = RanksState(world_size=2)
    cfg = RanksConfig()
    fired = []
    for k, extra in enumerate([0.0, 0.0, 0.0, 0.08, 0.0, 0.03]):  # rank 1's mean extra wait
        step = 100 * k + 99
        for rank in (0, 1):
            wait = 0.002 + (extra if rank == 1 else 0.0)
            # the all-reduce holds both ranks: the same mean step time
            got = ranks.step_times(st, cfg, rank, [(step, 0.1 + extra)], 0, 0, [(step, wait)], True)
            fired += [
                (s.step, s.rank, s.detail)
                for s in ([] if got is None else got.views())
                if s.severity
            ]
    # 0.18 s steps of which rank 1 waited 0.08 s more: the others worked 0.1 s, it 0.18 s
    # (x1.8); at 0.03 s more, x1.3: under the factor
    assert fired == [(399, 1, {"rank": 1, "waits_on": "data"})]


def test_isolated_slow_steps_are_not_a_straggler():
    st = RanksState(world_size=4)
    cfg = RanksConfig()
    for step in range(40):
        for rank in range(4):
            t = 0.9 if rank == 1 and step % 3 == 0 else 0.1
            st, sigs = step_time(st, cfg, rank, step, t)
            assert not [s for s in sigs if s.severity]


def test_incomplete_steps_are_judged_once_old_enough():
    st = RanksState(world_size=3)
    cfg = RanksConfig(pending_steps=2, straggler_steps=1)
    out = []
    for step in range(6):
        for rank in (0, 1):  # rank 2 never reports
            st, sigs = step_time(st, cfg, rank, step, 0.1 if rank == 0 else 0.5)
            out += sigs
    assert out and all(s.step <= 4 for s in out)


def test_hang_fires_for_the_stuck_rank_then_for_the_run():
    st = RanksState()
    cfg = RanksConfig(hang_after_s=10)
    sec = 10**9
    for t in range(30):
        for rank in (0, 1):
            if rank == 1 and t > 5:
                continue
            progress(st, rank, t, t * sec)
    st, sigs = tick(st, cfg, 28 * sec)  # late: a suspect until the next check confirms it
    assert not [s for s in sigs if s.severity]
    st, sigs = tick(st, cfg, 29 * sec)
    assert [(s.scope, s.severity) for s in sigs if s.severity] == [("rank:1", "critical")]
    st, sigs = tick(st, cfg, 59 * sec)
    st, sigs = tick(st, cfg, 60 * sec)
    assert {s.scope for s in sigs if s.severity} == {"rank:0", "rank:1", "run"}


def test_a_shard_past_the_first_reports_its_hung_ranks_without_paging():
    """Every rank stops at a hang; a wide run's shard 0 pages it, the others stay quiet."""
    sec = 10**9
    got = {}
    for pages in (True, False):
        st, cfg = RanksState(), RanksConfig(hang_after_s=10)
        for t in range(6):
            for rank in (0, 1):
                progress(st, rank, t, t * sec)
        views = []
        for now in (28, 29):
            out = ranks.tick(st, cfg, now * sec, pages=pages)
            views += [] if out is None else out.views()
        got[pages] = views
    assert {s.scope for s in got[True] if s.severity} == {"rank:0", "rank:1", "run"}
    assert not [s for s in got[False] if s.severity]
    stalled = {s.scope: s.value for s in got[False] if s.scope.startswith("rank:")}
    assert stalled == {"rank:0": 24.0, "rank:1": 24.0}  # judged all the same, at the last check


def test_a_pause_of_the_whole_process_is_not_a_hang():
    st = RanksState()
    cfg = RanksConfig(hang_after_s=10)
    sec = 10**9
    for rank in (0, 1):
        progress(st, rank, 1, 1 * sec)
    st, sigs = tick(st, cfg, 20 * sec)  # the first record after a 19 s pause
    for rank in (0, 1):
        progress(st, rank, 2, 21 * sec)  # ... and everyone moves on
    st, sigs2 = tick(st, cfg, 22 * sec)
    assert not [s for s in sigs + sigs2 if s.severity]


@settings(max_examples=150, deadline=None)
@given(
    n_ranks=st.integers(2, 7),
    keep=st.integers(1, 6),
    batch=st.integers(1, 12),
    n_batches=st.integers(1, 5),
    times=st.lists(st.sampled_from([0.0, 0.1, 0.1, 0.1, 0.2, 0.3, 1.0, 5.0]), min_size=1),
    missing=st.sets(st.tuples(st.integers(0, 60), st.integers(0, 6)), max_size=6),
)
def test_steps_judged_together_equal_the_reference(
    n_ranks: int,
    keep: int,
    batch: int,
    n_batches: int,
    times: list[float],
    missing: set[tuple[int, int]],
) -> None:
    """Batches of every rank's steps (``step_times``), judged in the compiled loop, give the
    signals and the ranks' recent ratios of the reference judging the same steps one at a
    time, in the same order; every step with two ranks or more is judged once."""
    cfg = RanksConfig(straggler_steps=keep, pending_steps=3)
    state = RanksState(world_size=n_ranks)
    sent: dict[int, dict[int, float]] = {}
    got: list[Signal] = []
    k = 0
    for b in range(n_batches):
        # the ranks' batches come in another order each time, as from Kafka
        for rank in [(r + b * 3) % n_ranks for r in range(n_ranks)]:
            pairs = []
            for step in range(b * batch, (b + 1) * batch):
                if (step, rank) not in missing:
                    pairs.append((step, times[k % len(times)] * (1 + rank % 2)))
                    sent.setdefault(step, {})[rank] = pairs[-1][1]
                    k += 1
            judged = ranks.step_times(state, cfg, rank, pairs, batch, 0)
            got += [] if judged is None else judged.views()
    ratios: dict = {}
    want: list[Signal] = []
    for step in dict.fromkeys(g.step for g in got):  # the steps in the order judged
        want += ranks_ref.judge(ratios, cfg, step, sent[step])
    assert got == want
    assert state.ratios == {r: list(d) for r, d in ratios.items()}
    judged_steps = {g.step for g in got}
    assert judged_steps == {s for s, t in sent.items() if len(t) >= 2} - set(state.pending)
