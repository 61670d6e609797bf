"""A rank slow before its collective: a straggler incident that names the rank and what it
waits on, led by the straggler rule (not by a disk or a data-wait threshold)."""

from __future__ import annotations

import pytest

from steplens.stream_jobs.engine.detector import RunDetector

SLOW = range(200, 240)


def entry(step: int, rank: int, *, synced: bool, on_data: bool) -> dict:
    """Rank 1 is 0.5 s slower on the ``SLOW`` steps: waiting for its batch (``on_data``) or
    computing. ``synced``: an all-reduce in the step holds every rank as long."""
    slow = step in SLOW
    late = 0.5 if slow and rank == 1 else 0.0
    step_time = 0.1 + (0.5 if slow and synced else late)
    data = 0.002 + (late if on_data else 0.0)
    return {
        "step": step,
        "time_ns": step * 10**8 + rank,
        "loss": 3.0 - step * 1e-4,
        "step_time_s": step_time,
        "data_time_s": data,
    }


def run(*, synced: bool, on_data: bool, order=(0, 1), everyone_waits: bool = False) -> list:
    """400 steps of two ranks, sent in batches of 10 steps (``full_resolution``), each
    batch of steps by the ranks in ``order``. ``everyone_waits``: a slow shared store, every
    rank waits 0.5 s for its batch on the ``SLOW`` steps."""
    det = RunDetector("r")
    reports = []
    for lo in range(0, 400, 10):
        for rank in order:
            es = [entry(s, rank, synced=synced, on_data=on_data) for s in range(lo, lo + 10)]
            for e in es:
                if everyone_waits and e["step"] in SLOW:
                    e["data_time_s"] = 0.502
            reports += det.process_entries(rank, es)[1]
    return reports


@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["others-first", "straggler-first"])
def test_a_rank_slow_on_its_data_before_the_all_reduce_is_a_straggler(order):
    """Every rank's step takes 0.6 s (the all-reduce waits for rank 1), so the step times
    say nothing; rank 1 waited 0.5 s longer for its batch than rank 0. Whichever rank's
    records come first, the first page names the straggler."""
    opened = [a for a in run(synced=True, on_data=True, order=order) if a.state == "firing"]
    assert opened, "nothing paged"
    first = opened[0]  # the page: its lead names the straggler, not the data wait
    assert first.rule == "straggler:data_wait_share"
    assert SLOW.start <= first.started_step <= SLOW.start + 5
    assert all(a.rule.startswith("straggler") for a in opened)
    assert len({a.fingerprint for a in opened}) == 1
    for rule in ("straggler:data_wait_share", "straggler:step_time_s"):
        member = next(m for m in opened[-1].evidence["members"] if m["rule"] == rule)
        assert member["rank"] == 1 and member["waits_on"] == "data"


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_every_rank_waiting_on_data_is_the_runs_data_wait_not_a_straggler(order):
    reports = run(synced=True, on_data=True, order=order, everyone_waits=True)
    opened = [a for a in reports if a.state == "firing"]
    assert opened and not any("straggler" in a.rule for a in opened)
    assert opened[0].rule == "threshold:data_wait_share"
    assert SLOW.start <= opened[0].started_step <= SLOW.start + 5


def test_a_rank_that_computes_slowly_is_a_straggler_that_computes():
    opened = [a for a in run(synced=False, on_data=False) if a.state == "firing"]
    assert [a.rule for a in opened] == ["straggler:step_time_s"]
    member = opened[0].evidence["members"][0]
    assert member["rank"] == 1 and member["waits_on"] == "compute"
