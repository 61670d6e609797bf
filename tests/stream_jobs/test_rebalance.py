"""A rebalance and the worker's runs (``RunStore.revoked``, ``RunStore.assigned``): a run whose
by-run partition the worker keeps stays in memory, ahead of its checkpoint, so what Faust
delivers again is skipped by the offsets it applied; a run whose partition moved is dropped
and restored from the table by its next owner. The worker's wiring of the same is in
test_worker_group."""

from __future__ import annotations

from types import SimpleNamespace

from steplens.schema import make_record
from steplens.stream_jobs.engine.signals.registry import DetectorConfig
from steplens.stream_jobs.worker.store import RunStore


def message(partition: int) -> SimpleNamespace:
    return SimpleNamespace(value=b"[]x", message=SimpleNamespace(partition=partition))


def scored(store: RunStore, run: str, partition: int, offset: int) -> None:
    """``run`` scores a step record of raw offset ``offset`` from by-run ``partition``."""
    store.ready(run, message(partition))
    det = store.cache[run]
    rec = make_record("step", {"loss": 2.0}, run_id=run, rank=0, step=offset, time_ns=1)
    det.process(rec)
    det.offsets[3] = offset
    for due, _ in store.hold(partition, run, message(partition)):
        store.checkpoint(due)


def test_kept_runs_stay_ahead_of_the_table_moved_runs_are_dropped() -> None:
    table: dict[bytes, bytes] = {}
    store = RunStore(table, DetectorConfig(), checkpoint_s=3600.0)
    scored(store, "kept", 0, 10)  # each run's first message is checkpointed at once
    scored(store, "moved", 1, 10)
    scored(store, "kept", 0, 11)  # held: not in the table
    kept = store.cache["kept"]
    generation = store.generation
    store.revoked()
    assert store.generation == generation + 1  # a message being scored is left to the replay
    assert store.held == {}  # not acknowledged: delivered again from the committed offset
    store.assigned({0, 2})
    assert store.cache == {"kept": kept} and kept.offsets[3] == 11  # skips what it applied
    store.ready("moved", message(1))  # back later: from the table, at its checkpoint
    assert store.cache["moved"] is not kept and store.cache["moved"].offsets[3] == 10
