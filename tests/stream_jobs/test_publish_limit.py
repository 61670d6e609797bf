import itertools

from steplens.stream_jobs.engine.core import CRITICAL, Signal
from steplens.stream_jobs.engine.publish_limit import QuietLimiter


def quiet(step, rank=0, metric="loss", score=0.1):
    return Signal("spike", metric, step, 1.0, score, rank)


def published(lim, sigs_at):
    return [(s.step, t) for s, t in sigs_at if lim.wanted("run", s, t)]


def test_breaches_always_go_out():
    lim = QuietLimiter(every=50, interval_s=5.0)
    loud = Signal("spike", "loss", 3, 9.0, 0.9, 0, severity=CRITICAL)
    assert all(lim.wanted("run", loud, 0.0) for _ in range(5))
    assert lim.wanted("run", quiet(4, score=0.6), 0.0)  # at or above the alert threshold


def gaps(values):
    return [b - a for a, b in itertools.pairwise(values)]


def test_quiet_signals_need_both_steps_and_seconds():
    lim = QuietLimiter(every=50, interval_s=5.0)
    # a step every 0.2 s: 50 steps take 10 s, so the step rule decides
    fast_clock = [(quiet(s), s * 0.2) for s in range(300)]
    steps = [s for s, _ in published(lim, fast_clock)]
    assert steps[0] == 0 and 1 <= steps[1] <= 50  # the series' first wait: a part of the limit
    assert gaps(steps[1:]) == [50] * (len(steps) - 2) and len(steps) >= 6
    # windows of 100 steps each second: the seconds decide
    lim = QuietLimiter(every=50, interval_s=5.0)
    windows = [(quiet(99 + 100 * i), float(i)) for i in range(20)]
    times = [t for _, t in published(lim, windows)]
    assert times[0] == 0.0 and 1.0 <= times[1] <= 5.0
    assert gaps(times[1:]) == [5.0] * (len(times) - 2) and len(times) >= 4


def test_series_first_seen_together_come_due_spread_over_the_interval():
    """Every rank of a run starts at once: their quiet signals must not all come due in the
    same second each interval (a burst of thousands of sends), but each series keeps its
    limit."""
    lim = QuietLimiter(every=50, interval_s=15.0)
    ranks = 1000
    per_second: list[int] = []
    last_at: dict[int, float] = {}
    for t in range(61):  # a window of 100 steps from every rank each second
        sent = 0
        for rank in range(ranks):
            if lim.wanted("run", quiet(99 + 100 * t, rank=rank), float(t)):
                if rank in last_at and len(per_second) > 16:
                    assert t - last_at[rank] >= 15.0
                last_at[rank] = float(t)
                sent += 1
        per_second.append(sent)
    assert per_second[0] == ranks  # the first of each series goes out at once
    # then about ranks / 15 a second, never a burst of them all
    assert max(per_second[1:]) <= 0.15 * ranks
    assert sum(per_second[1:16]) == ranks  # each series again within its first 15 s
    assert sum(per_second[1:]) == 4 * ranks  # and then every 15 s


def test_a_wide_run_sends_about_the_quiet_signals_of_a_run_of_width_ranks():
    """A run 16 times wider than ``width_ranks``: its ranks' quiet signals are spread so the
    run sends about what a run of ``width_ranks`` ranks sends, with no burst when every rank
    starts at once, and each rank's series still comes out, within 16 intervals."""

    def sent(ranks: int, seconds: int) -> tuple[list[int], dict[int, list[float]]]:
        lim = QuietLimiter(every=50, interval_s=15.0, width_ranks=16)
        per_second, at = [], {}
        for t in range(seconds):  # a window of 100 steps from every rank each second
            n = 0
            for rank in range(ranks):
                if lim.wanted("run", quiet(99 + 100 * t, rank=rank), float(t), width=ranks):
                    at.setdefault(rank, []).append(float(t))
                    n += 1
            per_second.append(n)
        return per_second, at

    narrow, _ = sent(16, 481)
    wide, at = sent(256, 481)
    assert narrow[0] == 16  # a narrow run's series go out at once, as before
    assert wide[0] == 0 and max(wide) <= 8  # no burst: about 256 / 240 a second
    assert 0.5 * sum(narrow) <= sum(wide) <= 1.2 * sum(narrow)
    assert sorted(at) == list(range(256))  # every rank's series, within 240 s
    for ts in at.values():
        assert ts[0] <= 240 and all(b - a >= 240 for a, b in itertools.pairwise(ts))
    loud = Signal("spike", "loss", 3, 9.0, 0.9, 5, severity=CRITICAL)
    lim = QuietLimiter(every=50, interval_s=15.0, width_ranks=16)
    assert lim.wanted("run", loud, 0.0, width=100_000)  # breaches still always go out


def test_series_are_limited_separately_and_a_restart_publishes():
    lim = QuietLimiter(every=50, interval_s=0.0)
    assert lim.wanted("run", quiet(10, rank=0), 0.0)
    assert lim.wanted("run", quiet(10, rank=1), 0.0)
    assert lim.wanted("run", quiet(10, metric="grad_norm"), 0.0)
    assert not lim.wanted("run", quiet(20, rank=0), 1.0)
    assert lim.wanted("run", quiet(0, rank=0), 2.0)  # the run restarted from step 0


def test_off_and_bounded():
    assert not QuietLimiter(every=0).wanted("run", quiet(100), 0.0)
    lim = QuietLimiter(every=1, interval_s=0.0, max_keys=10)
    for rank in range(25):
        lim.wanted("run", quiet(1, rank=rank), 0.0)
    assert len(lim.last) <= 10


def test_picked_from_a_run_is_what_wanted_lets_through_one_by_one():
    import random

    from steplens.stream_jobs.engine.core import Signals

    rng = random.Random(5)
    for every, interval in ((50, 5.0), (10, 0.0), (0, 0.0), (3, 1.0)):
        one, many = QuietLimiter(every, interval), QuietLimiter(every, interval)
        step = 0
        for t in range(40):
            sigs = []
            for _ in range(rng.randint(0, 30)):
                step += rng.choice([1, 1, 1, 5, -20]) if step > 20 else 1
                sev = CRITICAL if rng.random() < 0.05 else None
                sig = Signal("spike", "loss", step, 1.0, rng.choice([0.1, 0.2, 0.7]), 2, "run", sev)
                sigs.append(sig)
            run = Signals.of(
                "spike",
                "loss",
                list(range(len(sigs))),
                [g.step for g in sigs],
                [g.value for g in sigs],
                [g.score for g in sigs],
                [g.severity for g in sigs],
                rank=2,
            )
            now = t * 0.7
            want = [k for k, sig in enumerate(sigs) if one.wanted("run", sig, now)]
            assert many.picked("run", run, now) == want
            assert many.last == one.last


def test_signals_of_many_ranks_are_picked_as_their_signals_one_by_one():
    """``picked`` of signals of many ranks (stragglers) lets through the signals ``wanted``
    lets through, asked one after the other (each rank's series in step order), and leaves the
    limiter in the same state."""
    import copy
    import random

    import numpy as np

    from steplens.stream_jobs.engine.core import Signals

    rng = random.Random(3)
    loud_seen = quiet_seen = 0
    for _ in range(300):
        n_steps, n_ranks = rng.randrange(1, 40), rng.randrange(1, 9)
        start = rng.randrange(0, 500)
        ranks = rng.sample(range(64), n_ranks)
        n = n_steps * n_ranks
        score = np.array([rng.uniform(0.0, 0.6) for _ in range(n)])
        breach = np.array([rng.random() < 0.03 for _ in range(n)])
        sigs = Signals.of(
            "straggler",
            "step_time_s",
            np.zeros(n, dtype=np.int64),
            np.repeat(np.arange(start, start + n_steps), n_ranks),
            score,
            score,
            np.where(breach, 2, 0),
            1.0,
            None,
            1.5,
            np.array(ranks * n_steps),
            [f"rank:{r}" for r in ranks] * n_steps,
        )
        lim = QuietLimiter(
            every=rng.choice([0, 1, 10, 50]),
            interval_s=rng.choice([0.0, 5.0]),
            width_ranks=rng.choice([0, 4, 256]),
        )
        width = rng.choice([1, 64, 1000])
        now = rng.uniform(0, 20)
        for r in rng.sample(ranks, rng.randrange(0, n_ranks + 1)):  # series seen before
            lim.last[("run", r, "straggler", "step_time_s")] = (
                start - rng.randrange(0, 80),
                rng.randrange(1, 60),
                now + rng.uniform(-5, 5),
            )
        one = copy.deepcopy(lim)
        by_rank = sorted(sigs.views(), key=lambda s: (s.rank, s.step))
        want = sorted(map(repr, (s for s in by_rank if one.wanted("run", s, now, width))))
        got = sorted(map(repr, sigs.views(lim.picked("run", sigs, now, width))))
        assert got == want
        assert lim.last == one.last
        loud_seen += any("severity='warning'" in g or "score=0.5" in g for g in got)
        quiet_seen += any("severity=None" in g for g in got)
    assert loud_seen > 50 and quiet_seen > 50
