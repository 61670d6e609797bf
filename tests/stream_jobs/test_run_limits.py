"""What a worker keeps is bounded: runs past ``max_runs`` are not scored (counted), an idle
run is retired from the table and memory, ranks past ``max_ranks`` are left out. The store
with a plain dict for its table, a clock the test moves; the worker's wiring of the same is
in test_stream_worker."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from steplens.schema import RUN_RANK
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals.registry import DetectorConfig
from steplens.stream_jobs.engine.state import rank_key
from steplens.stream_jobs.worker.compat import NUDGE
from steplens.stream_jobs.worker.run_limits import RunLimits, rank_admitted
from steplens.stream_jobs.worker.settings import LimitSettings
from steplens.stream_jobs.worker.store import RunStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def message(value: bytes = b'[[0, 1, "{}"]]', partition: int = 0) -> SimpleNamespace:
    return SimpleNamespace(value=value, message=SimpleNamespace(partition=partition))


def make_store(
    table: dict[bytes, bytes], checkpoint_s: float = 0.0, **settings: float
) -> tuple[RunStore, Counter, Clock]:
    counts: Counter[str] = Counter()
    clock = Clock()

    def count(outcome: str, n: int) -> None:
        counts[outcome] += n

    limits = RunLimits(LimitSettings(**settings), table.keys, count, clock)  # type: ignore[arg-type]
    store = RunStore(table, DetectorConfig(), checkpoint_s, limits=limits)
    return store, counts, clock


def stored(table: dict[bytes, bytes], run: str, ranks: tuple[int, ...]) -> None:
    det = RunDetector(run)
    for rank in ranks:
        det.series[rank] = {"spike": {}}  # a series of its own: stored as a value
    head, parts = det.dump(det.series)
    table[run.encode()] = head
    for rank, blob in parts.items():
        table[rank_key(run, rank).encode()] = blob


def test_runs_past_the_limit_are_refused_and_counted() -> None:
    table: dict[bytes, bytes] = {}
    stored(table, "old", (0, 1, 2))  # in the table: kept (its ranks' keys are not runs)
    store, counts, _ = make_store(table, max_runs=2)
    assert store.admit("new", message())
    assert not store.admit("third", message())
    assert not store.admit("third", message())
    assert store.admit("old", message()) and store.admit("new", message())
    assert counts == {"refused_messages": 2}
    assert store.limits.known == {"old", "new"}
    assert store.limits.unwarned == 1  # one warning named "third", the next waits a minute


def test_an_idle_run_is_retired_by_its_nudge_and_makes_room() -> None:
    table: dict[bytes, bytes] = {}
    stored(table, "a", (0, 1))
    stored(table, "b", (0,))
    store, counts, clock = make_store(table, max_runs=2, idle_s=3600)
    assert store.admit("b", message())
    assert store.ready("b", message()) and "b" in store.cache
    assert store.idle_runs() == []  # "a" counts from its first sight in the table
    clock.now += 1800
    assert store.admit("b", message())  # "b" had a record scored half-way
    clock.now += 1800
    assert store.idle_runs() == ["a"]
    assert not store.admit("c", message())  # no room yet
    assert not store.admit("a", message(NUDGE))  # retired: acknowledged, not scored
    assert sorted(table) == [b"b", rank_key("b", 0).encode()]
    assert counts["retired_runs"] == 1 and "a" not in store.limits.known
    assert store.admit("c", message())  # room again
    # a nudge for "b", not idle, goes on (it checkpoints), one for a run not kept does not
    assert store.admit("b", message(NUDGE))
    assert not store.admit("unknown", message(NUDGE))


def test_a_retired_run_s_rank_whose_series_emptied_leaves_no_value_behind() -> None:
    """A rank stored with a value whose series then emptied (a restart) is listed in the
    head without one (``bare``); its earlier value still goes with the run."""
    table: dict[bytes, bytes] = {}
    det = RunDetector("a")
    det.series.update({0: {"spike": {}}, 3: {"spike": {}}})
    _, parts = det.dump(det.series)
    for rank, blob in parts.items():
        table[rank_key("a", rank, det.slots[rank]).encode()] = blob
    det.series[3] = {}
    head, parts = det.dump(det.series)
    assert set(parts) == {0} and RunDetector.stored_ranks(head) == [0, 3]
    table[b"a"] = head
    assert rank_key("a", 3).encode() in table
    store, counts, clock = make_store(table, max_runs=2, idle_s=60)
    assert store.admit("a", message())  # known from the table, idle from now on
    clock.now += 120
    assert store.idle_runs() == ["a"]
    assert not store.admit("a", message(NUDGE))
    assert table == {} and counts["retired_runs"] == 1


def test_a_run_holding_messages_or_in_memory_is_retired_with_all_its_state() -> None:
    table: dict[bytes, bytes] = {}
    store, _, clock = make_store(table, checkpoint_s=1e12, idle_s=60)
    ev = message()
    assert store.admit("r", ev) and store.ready("r", ev)
    det = store.cache["r"]
    det.series.update({0: {"spike": {}}, 5: {"spike": {}}})
    det.touched.update((0, 5))
    for due, _acknowledged in store.hold(0, "r", ev):  # a run's first message: at once
        store.checkpoint(due)
    store.hold(0, "r", message())  # scored, waiting for its checkpoint
    clock.now += 120
    assert store.idle_runs() == []  # busy: its messages wait for a checkpoint
    assert store.admit("r", message(NUDGE))  # ... so its nudge goes on (to a checkpoint)
    store.checkpoint_s = 0.0  # the nudge's checkpoint is due: its messages are let go
    for due, _acknowledged in store.hold(0, "r", message(NUDGE)):
        store.checkpoint(due)
    assert sorted(table) == sorted([b"r", rank_key("r", 0).encode(), rank_key("r", 5).encode()])
    assert store.idle_runs() == ["r"]
    assert not store.admit("r", message(NUDGE))
    assert table == {} and "r" not in store.cache


def test_revoked_partitions_read_the_kept_runs_again() -> None:
    table: dict[bytes, bytes] = {}
    store, _, _ = make_store(table, max_runs=1)
    assert store.admit("a", message())
    store.revoked()  # "a" was never checkpointed here: the table does not keep it
    assert store.admit("b", message())
    assert store.limits.known == {"b"}


def test_ranks_past_the_limit_are_left_out_the_run_rank_never() -> None:
    series = {RUN_RANK: {}, 0: {}, 1: {}}
    assert rank_admitted(series, 1, max_ranks=2)
    assert not rank_admitted(series, 2, max_ranks=2)
    assert rank_admitted(series, RUN_RANK, max_ranks=2)
    assert rank_admitted({RUN_RANK: {}}, 7, max_ranks=1)
    # a rank admitted whose records wait to be scored (a batch of its steps) counts too
    assert not rank_admitted({0: {}}, 2, max_ranks=2, pending=1)
    assert rank_admitted({0: {}}, 1, max_ranks=2, pending=1)
    assert rank_admitted({0: {}}, 2, max_ranks=2, pending=0)
