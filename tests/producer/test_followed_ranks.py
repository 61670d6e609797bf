"""A rank past the followed ones (``schema.followed_ranks``) sends at once only what the stream
jobs judge from it: a non-finite value and a step time out of line, not a finite loss spike,
which stays in its window's aggregates; a followed rank sends all three."""

from __future__ import annotations

import math

import pytest

from steplens.schema.followed_ranks import FOLLOWED_RANKS

SPIKE, SLOW, NAN = 537, 655, 777


def _run(memory_monitor, rank: int, **config):  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(rank=rank, world_size=4 * FOLLOWED_RANKS, **config)
    for step in range(1, 1001):
        loss = {SPIKE: 50.0, NAN: math.nan}.get(step, 2.0 + 0.01 * math.sin(step))
        m.log_step(step, loss=loss, step_time_s=5.0 if step == SLOW else 0.1)
    m.shutdown()
    return tx


ALL = {SPIKE, SLOW, NAN}


@pytest.mark.parametrize(
    ("rank", "at_once"), [(0, ALL), (FOLLOWED_RANKS - 1, ALL), (FOLLOWED_RANKS, {SLOW, NAN})]
)
def test_a_rank_sends_at_once_what_is_judged_from_it(  # type: ignore[no-untyped-def]
    memory_monitor, rank, at_once
) -> None:
    tx = _run(memory_monitor, rank, window_steps=100)
    raw = {r.step: r.data for r in tx.records("step") if r.data["reason"] == "guard"}
    assert set(raw) == at_once
    windows = tx.records("step_window")
    held = next(w.data for w in windows if w.data["step_first"] <= SPIKE <= w.data["step_last"])
    assert held["metrics"]["loss"]["max"] == 50.0  # the spike, kept either way
    assert sum(w.data["count"] for w in windows) == 1000


def test_at_full_resolution_every_step_travels_and_only_a_followed_spike_is_marked(
    memory_monitor,  # type: ignore[no-untyped-def]
) -> None:
    for rank, marked in ((0, ALL), (FOLLOWED_RANKS, {SLOW, NAN})):
        tx = _run(memory_monitor, rank, full_resolution=True)
        entries = [e for r in tx.records("step_batch") for e in r.data["records"]]
        assert [e["step"] for e in entries] == list(range(1, 1001))
        assert {e["step"] for e in entries if e.get("reason") == "guard"} == marked
        assert next(e for e in entries if e["step"] == SPIKE)["loss"] == 50.0
