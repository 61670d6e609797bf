"""Warm starts from history, without the stores: the effective history of a run that
restarted, the bounded reading, and a replay that leaves the detectors as if they had never
stopped."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import orjson
from history_helpers import STEP_NS, T0, firing, rows_of, scored, series_signals, steps

from steplens.schema import encode, make_record
from steplens.stream_jobs.engine.detector import MARK_VALUES, RunDetector
from steplens.stream_jobs.engine.history import (
    DAY_NS,
    NO_FIRST,
    History,
    Rows,
    effective,
    lineage,
    read_history,
    read_run,
    reference_of,
)
from steplens.stream_jobs.engine.run_keys import shard_key
from steplens.stream_jobs.engine.signals.registry import DetectorConfig
from steplens.stream_jobs.worker.history_loads import WarmJob, first_sight, warm_job
from steplens.stream_jobs.worker.run_shards import shard_ranks_of
from steplens.stream_jobs.worker.settings import HistorySettings


def test_the_surviving_line_of_steps_of_a_run_that_restarted():
    # crashed at 5, resumed from 3; crashed at 6, resumed from 6 (the same step again)
    steps_ = np.array([0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 6, 7])
    keep = lineage(steps_)
    assert steps_[keep].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert np.flatnonzero(keep).tolist() == [0, 1, 2, 6, 7, 8, 10, 11]
    assert steps_[lineage(steps_, cut=5)].tolist() == [0, 1, 2, 3, 4]
    # windowed mode: a raw sample (45), then its window (0..49, at its last step 49)
    assert lineage(np.array([45, 49, 55, 99])).all()


def rows(steps_: list[int], t0: int = 0, **values: list[float]) -> Rows:
    n = len(steps_)
    return Rows(
        np.arange(t0, t0 + n, dtype=np.int64),
        np.array(steps_, dtype=np.int64),
        np.full(n, NO_FIRST, dtype=np.int64),
        {m: np.array(v, dtype=float) for m, v in values.items()},
    )


def test_effective_history_keeps_the_newest_rows_of_the_surviving_line():
    r = rows([0, 1, 2, 3, 4, 5, 3, 4], loss=[9, 8, 7, 6, 5, 4, 6.1, 5.1])
    got = effective(r, cut=None, max_points=4)
    assert got.step.tolist() == [1, 2, 3, 4]
    assert got.values["loss"].tolist() == [8, 7, 6.1, 5.1]
    assert effective(r, cut=3, max_points=10).step.tolist() == [0, 1, 2]


class Reads:
    """A store holding ``per_s`` rows a second of each rank for a week."""

    def __init__(self, ranks: dict[int, float], until: int) -> None:
        self.ranks, self.until, self.spans = ranks, until, []

    def __call__(self, run: str, lo: int, hi: int) -> dict[int, Rows]:
        self.spans.append((lo, hi))
        out = {}
        for rank, per_s in self.ranks.items():
            every = int(1e9 / per_s)
            times = np.arange(lo - lo % every + every, hi, every, dtype=np.int64)
            times = times[(times >= lo) & (times < hi)]
            steps_ = ((times - (self.until - 7 * DAY_NS)) // every).tolist()
            out[rank] = rows(steps_, loss=[1.0] * len(steps_))
            out[rank].time_ns = times
        return out


def test_reading_stops_once_every_rank_has_its_rows():
    until = T0
    read = Reads({0: 2.0, 1: 2.0}, until)
    counts = [0, 0]
    got = read_run(
        read, "r", since_ns=until - 7 * DAY_NS, until_ns=until, max_points=4096, counts=counts
    )
    assert counts[1] == 2  # 15 minutes: 1,800 rows a rank; then the hour before: enough
    assert read.spans[0] == (until - 15 * 60 * 10**9, until)
    assert {k: len(effective(r, None, 4096)) for k, r in got.items()} == {0: 4096, 1: 4096}
    assert all(np.all(np.diff(r.time_ns) > 0) for r in got.values())


def test_a_rank_that_sends_rarely_does_not_make_the_others_read_a_week():
    until = T0
    read = Reads({0: 10.0, 1: 1 / 3600}, until)  # rank 1: once an hour
    counts = [0, 0]
    got = read_run(
        read, "r", since_ns=until - 7 * DAY_NS, until_ns=until, max_points=1000, counts=counts
    )
    assert counts[0] <= 4 * 4 * 1000 * 2  # the read budget (4 x the cap a rank), one span over
    assert len(got[0]) <= 4 * 1000
    assert read.spans[-1][0] > until - 7 * DAY_NS


class Store:
    """An in-memory store of runs (the stores' reading is tested against the real ones)."""

    def __init__(self, runs: dict[str, list], meta: dict[str, dict] | None = None) -> None:
        self.runs, self._meta = runs, meta or {}

    def meta(self, run, since_ns, until_ns):
        return self._meta.get(run, {})

    def extent(self, run, since_ns, until_ns):
        times = [r.time_ns for r in self.runs.get(run, []) if since_ns <= r.time_ns < until_ns]
        return (min(times), max(times) + 1) if times else None

    def rows(self, run, lo, hi, metrics):
        recs = [r for r in self.runs.get(run, []) if lo <= r.time_ns < hi]
        return rows_of(recs) if recs else {}


def test_a_run_resumed_under_a_new_id_starts_from_its_parents_history():
    """Run "b" resumes run "a" (crashed at 1,500) from its checkpoint of step 1,000: its
    history is a's up to step 1,000, then its own."""
    a = steps("a", 0, 1500)
    b = steps("b", 1000, 1100, t0=T0 + 1600 * STEP_NS)
    store = Store({"a": a, "b": b}, {"b": {"lineage": {"parent_run": "a"}}})
    cfg, settings = DetectorConfig(), HistorySettings(max_points=500)
    until = T0 + 1700 * STEP_NS
    hist = read_history(store, "b", until_ns=until, settings=settings, metrics=cfg.metrics())
    assert hist.runs == ["a", "b"]
    assert hist.rows[0].step.tolist() == [*range(600, 1000), *range(1000, 1100)]
    # the first message of b, before any of it was stored: a's history up to its first step
    hist = read_history(
        Store({"a": a}),
        "b",
        until_ns=until,
        settings=settings,
        metrics=cfg.metrics(),
        meta={"baseline_run": "a"},
        cuts={0: 1000},
    )
    assert hist.rows[0].step.tolist() == list(range(500, 1000))
    assert reference_of({"baseline_run": "x", "lineage": {"parent_run": "y"}}) == "x"
    assert reference_of({"lineage": {"checkpoint": 1}}) is None


def test_a_run_first_seen_is_read_up_to_its_first_message():
    meta = {"world_size": 2, "baseline_run": "a"}

    def text(rec):
        return encode(rec).decode()

    value = orjson.dumps(
        [
            [0, 7, text(make_record("run_meta", meta, run_id="b", time_ns=T0 + 99))],
            [0, 8, text(steps("b", 1000, 1001, t0=T0 + 5)[0])],
            [1, 3, text(steps("b", 1001, 1003, ranks=(1,), t0=T0 + 9)[1])],
            [1, 4, "not json"],
        ]
    )
    sight = first_sight(value)
    assert (sight.until_ns, sight.cuts, sight.meta) == (T0 + 5, {0: 1000, 1: 1002}, meta)
    assert not sight.fresh
    assert first_sight(orjson.dumps([[0, 9, text(steps("c", 0, 1)[0])]])).fresh


def test_a_warm_start_scores_on_as_a_detector_that_never_stopped():
    """A run's history replayed (alerting off) into a new detector: it then gives the
    signals and alerts of the detector that saw the run live, its signals say that their
    baseline came from history for ``MARK_VALUES`` values, and a history hours old is no
    hang."""
    past = steps("r", 0, 2000, ranks=(0, 1))
    live = steps("r", 2000, 2600, ranks=(0, 1), t0=T0 + 2000 * STEP_NS, regression=(2400, 1.3))
    never = RunDetector("r")
    _, old_alerts = scored(never, past)
    assert firing(old_alerts) == []
    job = WarmJob("r", DetectorConfig(), HistorySettings(), live[0].time_ns)
    result = warm_job(job, Store({"r": past}))
    assert result.points == {0: 2000, 1: 2000}
    warm = RunDetector.load(result.head, lambda r, _s: result.ranks.get(r))  # as the worker gets it
    assert warm is not None
    for rank, n in result.points.items():
        warm.warmed(rank, {"baseline": "history", "history_points": n})
    sigs, alerts = scored(warm, live)
    expected, expected_alerts = scored(never, live)
    assert series_signals(sigs) == series_signals(expected)
    assert firing(alerts) == firing(expected_alerts) == [("spike:loss", 2400)]
    marked = {s.step for s in sigs if s.detail and s.detail.get("baseline") == "history"}
    assert marked == set(range(2000, 2000 + MARK_VALUES))
    hw = make_record("hw", {"cpu_percent": 1.0}, run_id="r", time_ns=live[-1].time_ns + 10**9)
    batch, _ = warm.process(hw)
    assert not [s for s in batch if s.name == "hang" and s.severity.any()]


def test_a_shard_of_a_wide_run_warms_from_its_own_ranks_of_its_run():
    """A shard's by-run key names its run and shard: its warm start reads that run's history
    and replays only the shard's ranks."""
    past = steps("r", 0, 300, ranks=(0, 1, 2, 3))
    store = Store({"r": past})
    for shard, ranks in ((0, [0, 1]), (1, [2, 3])):
        key = shard_key("r", shard)
        job = WarmJob(key, DetectorConfig(), HistorySettings(), T0 + 10**12)
        job = replace(job, ranks=shard_ranks_of(key, 2, 2))  # as ``HistoryLoads.begin`` gives it
        result = warm_job(job, store)
        assert sorted(result.points) == ranks
        assert result.runs == ["r"]
    whole = warm_job(WarmJob("r", DetectorConfig(), HistorySettings(), T0 + 10**12), store)
    assert sorted(whole.points) == [0, 1, 2, 3]  # runs not split: every rank


def test_a_checkpoint_keeps_saying_where_the_baselines_came_from():
    """Signals marked ``baseline="history"`` after a warm start stay marked, for the same
    ``MARK_VALUES`` values, across a checkpoint and restore in the middle."""
    past = steps("r", 0, 2000)
    live = steps("r", 2000, 2400, t0=T0 + 2000 * STEP_NS)
    job = WarmJob("r", DetectorConfig(), HistorySettings(), live[0].time_ns)
    warm = RunDetector.load(*_restored(warm_job(job, Store({"r": past}))))
    assert warm is not None
    warm.warmed(0, {"baseline": "history", "history_points": 2000})
    cut = MARK_VALUES // 2
    first, _ = scored(warm, live[:cut])
    head, ranks = warm.dump(warm.series)
    again = RunDetector.load(head, lambda r, _s: ranks.get(r))
    assert again is not None
    rest, _ = scored(again, live[cut:])
    marked = {s.step for s in [*first, *rest] if s.detail and s.detail.get("baseline")}
    assert marked == set(range(2000, 2000 + MARK_VALUES))


def _restored(result):
    return result.head, lambda r, _s: result.ranks.get(r)


def test_a_replayed_history_is_never_alerted_on():
    past = steps("r", 0, 1500, regression=(1000, 2.0))  # a real jump, long ago
    _, alerts = scored(RunDetector("r"), past)
    assert firing(alerts) == [("spike:loss", 1000)]  # live, it alerted
    det = RunDetector("r")
    det.replay(History(rows=rows_of(past)), T0 + 1600 * STEP_NS)
    assert not det.rules.firing and not det.incidents.open
    head, ranks = det.dump(det.series)
    assert RunDetector.load(head, lambda r, _s: ranks.get(r)) is not None


def test_windows_and_raw_samples_replay_as_they_were_scored():
    """Windowed mode: a window's mean is learnt over its first..last steps, raw samples in
    between; the replay feeds each stretch of one kind as one batch."""
    n = 60
    r = Rows(
        np.arange(n, dtype=np.int64),
        np.array([i * 10 + 9 for i in range(n)], dtype=np.int64),
        np.array([i * 10 if i % 3 else NO_FIRST for i in range(n)], dtype=np.int64),
        {"loss": np.array([2.0 + 0.01 * math.sin(i) for i in range(n)])},
    )
    det = RunDetector("r")
    det.replay(History(rows={0: r}), n)
    assert len(det.series[0]["spike"]["loss"].values) == n
    assert det.ranks.last_step[0] == (n - 1) * 10 + 9
