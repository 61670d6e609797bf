"""Full resolution: the StepBatch builder, and the Monitor sending every step in step_batch."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

import steplens.producer as sl
from steplens.producer.pipeline.step_batch import StepBatch, halves, payload
from steplens.schema import MAX_RECORD_BYTES, Record, unbatch


def _wait(cond: Any, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


def steps_of(records: list[Record]) -> list[Record]:
    return [s for r in records if r.kind == "step_batch" for s in unbatch(r)]


# ------------------------------------------------------------------ the builder


def test_batch_is_due_when_full_or_old() -> None:
    b = StepBatch(max_steps=3, max_s=2.0)
    assert not b.due(10**12) and len(b) == 0  # empty: never due
    b.add(1, 111, {"loss": 1.0}, now_ns=1_000)
    b.add(2, 222, {"loss": 2.0, "reason": "guard"}, now_ns=2_000)
    assert not b.due(1_000 + 2_000_000_000 - 1)
    assert b.due(1_000 + 2_000_000_000)  # 2 s after the first entry
    b.add(3, 333, {}, now_ns=3_000)
    assert b.due(3_000) and len(b) == 3  # full
    assert b.take() == [
        {"step": 1, "time_ns": 111, "loss": 1.0},
        {"step": 2, "time_ns": 222, "loss": 2.0, "reason": "guard"},
        {"step": 3, "time_ns": 333},
    ]
    assert len(b) == 0 and not b.due(10**15) and b.take() == []
    b.add(4, 444, {}, now_ns=50_000)  # the clock restarts with the next first entry
    assert not b.due(50_000 + 1_999_999_999) and b.due(50_000 + 2_000_000_000)


def test_halves_keep_order_and_every_entry() -> None:
    entries = [{"step": i, "time_ns": i} for i in range(7)]
    first, second = halves(entries)
    assert (len(first), len(second)) == (3, 4) and first + second == entries
    assert payload(entries) == {"records": entries}


# ------------------------------------------------------------------ the Monitor


def test_every_step_once_in_order_and_nothing_else(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(full_resolution=True, batch_steps=64, batch_s=3600, sample_rate=1.0)
    logged = {}
    for step in range(1000):
        loss = 2.0 + 0.01 * math.sin(step)
        m.log_step(step, loss=loss, lr=1e-3, tokens=4096, step_time_s=0.1, acc=step / 1000)
        logged[step] = loss
    m.shutdown()
    recs = tx.records()
    assert not [r for r in recs if r.kind in ("step", "step_window")]
    batches = [r for r in recs if r.kind == "step_batch"]
    steps = steps_of(recs)
    assert [s.step for s in steps] == list(range(1000))
    assert [s.data["loss"] for s in steps] == [logged[i] for i in range(1000)]
    assert all(s.data["scalars"] == {"acc": s.step / 1000} for s in steps)
    assert all(s.data["tokens"] == 4096 and s.data["step_time_s"] == 0.1 for s in steps)
    assert all("reason" not in s.data for s in steps)  # steady values: nothing guarded
    assert [len(b.data["records"]) for b in batches] == [64] * 15 + [40]  # the rest at close
    for b in batches:  # the envelope's step and time are the last entry's
        last = b.data["records"][-1]
        assert (b.step, b.time_ns) == (last["step"], last["time_ns"])
    times = [s.time_ns for s in steps]
    assert times == sorted(times) and abs(times[0] - time.time_ns()) < 60e9  # wall clock
    assert sorted(r.seq for r in recs) == list(range(len(recs)))
    meta = tx.records("run_meta")[0].data["config"]
    assert (meta["full_resolution"], meta["batch_steps"], meta["batch_s"]) == (True, 64, 3600)


def test_a_guarded_step_leaves_at_once(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(full_resolution=True, batch_steps=4096, batch_s=3600)
    for step in range(40):
        m.log_step(step, loss=2.0 + 0.001 * (step % 3), step_time_s=0.1)
    m.log_step(40, loss=500.0, step_time_s=0.1)
    m.log_step(41, loss=2.0, step_time_s=0.1)
    # neither full nor old, not flushed: the spike's batch is sent by itself
    assert _wait(lambda: tx.records("step_batch"))
    (batch,) = tx.records("step_batch")
    steps = unbatch(batch)
    assert [s.step for s in steps] == list(range(41))
    assert steps[-1].data["reason"] == "guard" and steps[-1].data["loss"] == 500.0
    assert all("reason" not in s.data for s in steps[:-1])
    m.shutdown()
    assert [s.step for s in steps_of(tx.records())] == list(range(42))


def test_an_old_batch_leaves_without_more_steps(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(full_resolution=True, batch_steps=4096, batch_s=0.2)
    m.log_step(1, loss=1.0)
    m.log_step(2, loss=1.0)
    # no further step, no flush: the worker's periodic tick sends it
    assert _wait(lambda: tx.records("step_batch"))
    assert [s.step for s in steps_of(tx.records())] == [1, 2]
    m.shutdown()


def test_flush_sends_the_partial_batch(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(full_resolution=True, batch_steps=4096, batch_s=3600)
    for step in range(10):
        m.log_step(step, loss=1.0, step_time_s=0.1)
    assert m.flush(10)
    assert [s.step for s in steps_of(tx.records())] == list(range(10))
    m.shutdown()


def test_a_batch_too_large_for_one_record_is_split(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(
        full_resolution=True,
        batch_steps=100,
        batch_s=3600,
        max_metric_names=100_000,
        max_scalars=100_000,
    )
    wide = {f"metric_{i:05d}": 0.5 + i for i in range(2000)}  # ~50 kB per step
    huge = {f"metric_{i:06d}": 0.5 + i for i in range(60000)}  # over the record limit alone
    for step in range(250):
        m.log_step(step, loss=1.0, step_time_s=0.1, **(huge if step == 123 else wide))
    assert m.flush(120)  # 12 MB of steps to encode: on a loaded machine, past shutdown's wait
    m.shutdown()
    sizes = [len(v) for _, v in tx.messages]
    assert max(sizes) <= MAX_RECORD_BYTES
    steps = steps_of(tx.records())
    assert [s.step for s in steps] == [s for s in range(250) if s != 123]
    assert all(s.data["scalars"] == wide for s in steps)
    assert m.stats()["dropped"] == {"encode": 1}  # only the step no record can hold


def test_off_by_default_and_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    m = sl.Monitor("x", transport=sl.MemoryTransport(), hw_interval_s=0)
    assert (m.config.full_resolution, m.config.batch_steps, m.config.batch_s) == (False, 100, 1.0)
    assert m._pipeline.steps.batch is None
    m.shutdown()
    monkeypatch.setenv("STEPLENS_FULL_RESOLUTION", "true")
    monkeypatch.setenv("STEPLENS_BATCH_STEPS", "500")
    monkeypatch.setenv("STEPLENS_BATCH_S", "0.5")
    m = sl.Monitor("x", transport=sl.MemoryTransport(), hw_interval_s=0)
    assert (m.config.full_resolution, m.config.batch_steps, m.config.batch_s) == (True, 500, 0.5)
    m.shutdown()
    m = sl.Monitor("x", transport=sl.MemoryTransport(), hw_interval_s=0, full_resolution=False)
    assert not m.config.full_resolution  # the keyword wins
    m.shutdown()
    monkeypatch.setenv("STEPLENS_FULL_RESOLUTION", "maybe")
    monkeypatch.setenv("STEPLENS_BATCH_STEPS", "5000")  # over the entries of one record
    m = sl.Monitor("x", transport=sl.MemoryTransport(), hw_interval_s=0)
    assert (m.config.full_resolution, m.config.batch_steps) == (False, 100)  # warned, defaults
    m.shutdown()


@pytest.mark.parametrize(
    "bad", [{"batch_steps": 0}, {"batch_steps": 4097}, {"batch_s": 0}, {"full_resolution": 1}]
)
def test_bad_batch_keywords_raise(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        sl.Monitor("x", transport=sl.MemoryTransport(), hw_interval_s=0, **bad)
