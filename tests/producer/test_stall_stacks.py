"""A rank that stops stepping while its process lives sends the stacks of its threads, once
per stall."""

from __future__ import annotations

import threading
import time

import pytest

from steplens.producer.pipeline.stall import FLOOR_S, StallWatch
from waiting import wait_until


def wait_for_a_peer_that_never_comes(released: threading.Event) -> None:
    """What a rank stuck in a collective looks like from Python: blocked in one call."""
    released.wait(30)


def test_a_blocked_loop_sends_its_stacks_once_per_stall(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(sample_rate=0.0, hang_dump_after_s=0.3)
    released = threading.Event()
    stacks = lambda: tx.records("stacks")  # noqa: E731

    def release_after(n: int, hold_s: float) -> None:
        wait_until(lambda: len(stacks()) >= n)
        time.sleep(hold_s)  # the behaviour under test: the stall goes on past the threshold
        released.set()

    step = 0
    for stall, hold_s in enumerate((1.0, 0.0)):
        for _ in range(20):
            m.log_step(step, loss=1.0)
            step += 1
        last = step - 1
        released.clear()
        helper = threading.Thread(target=release_after, args=(stall + 1, hold_s))
        helper.start()
        wait_for_a_peer_that_never_comes(released)
        helper.join()
        assert len(stacks()) == stall + 1  # one record, however long the stall
        rec = stacks()[-1]
        assert rec.step == last and rec.data["last_step"] == last
        assert rec.data["stalled_s"] >= 0.3
        main = rec.data["threads"][0]
        assert main["name"] == "MainThread"
        assert "wait_for_a_peer_that_never_comes" in main["stack"]
        assert "released.wait(30)" in main["stack"]
        names = [t["name"] for t in rec.data["threads"]]
        assert "steplens-producer" not in names  # the thread that writes the record
    m.shutdown()
    assert len(tx.records("stacks")) == 2


def test_no_stacks_before_the_first_step_or_when_off(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    every = {"health_interval_s": 0.05, "health_report_every_s": 0}  # each reading sent
    m, tx = memory_monitor(hang_dump_after_s=0.05, **every)
    off, tx_off = memory_monitor(hang_dump_after_s=0, **every)
    off.log_step(0, loss=1.0)
    # a worker's third health record comes from a tick at least 0.15 s after it started, past
    # the threshold; a dump due then would have been sent before it
    assert wait_until(lambda: min(len(t.records("health")) for t in (tx, tx_off)) >= 3)
    m.shutdown()
    off.shutdown()
    assert tx.records("stacks") == [] and tx_off.records("stacks") == []


def test_the_automatic_threshold_is_well_above_a_step() -> None:
    w = StallWatch(None)
    assert w.stalled_s(10**12) is None  # before any step
    t = 0
    for step in range(10):
        w.on_step(step, t)
        t += 5 * 10**9  # 5 s steps: 20 of them is 100 s
    last = t - 5 * 10**9
    assert w.threshold_s() == pytest.approx(100.0)
    assert w.stalled_s(last + 99 * 10**9) is None
    assert w.stalled_s(last + 101 * 10**9) == pytest.approx(101.0)
    assert w.stalled_s(last + 200 * 10**9) is None  # once per stall
    w.on_step(10, last + 201 * 10**9)
    assert w.stalled_s(last + 302 * 10**9) == pytest.approx(101.0)
    fast = StallWatch(None)
    for step in range(10):
        fast.on_step(step, step * 10**8)
    assert fast.threshold_s() == FLOOR_S
