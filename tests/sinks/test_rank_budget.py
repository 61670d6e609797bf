"""A run's per-rank telemetry reaches InfluxDB for a first few ranks and the ranks that stand
out; the rest is left to S3 and counted."""

from __future__ import annotations

import time

import pytest
from influx_helpers import count_points, settings_from
from prometheus_client import REGISTRY
from sinks_helpers import unique

from steplens.schema import make_record
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.rank_budget import RankBudget, RankLimits


def step(run: str, rank: int, k: int = 0):
    return make_record(
        "step", {"loss": 2.0}, run_id=run, rank=rank, step=k, seq=k, time_ns=time.time_ns() + k
    )


def signal(run: str, rank: int, score: float):
    data = {"name": "spike", "metric": "loss", "value": 9.0, "score": score}
    return make_record("signal", data, run_id=run, rank=rank, step=0)


def incident(run: str, members: list[dict]):
    data = {"rule": members[0]["rule"], "severity": "warning", "state": "firing"}
    data |= {"scope": "incident", "hint": "h", "fingerprint": "f", "evidence": {"members": members}}
    return make_record("alert", data, run_id=run, time_ns=time.time_ns())


def test_a_first_few_ranks_and_those_that_stand_out_are_admitted() -> None:
    budget = RankBudget(RankLimits(per_run=2, standouts=1, tracked_runs=2))
    assert [budget.admits(step("r", k)) for k in (3, 1, 2, 3)] == [True, True, False, True]
    assert budget.admits(step("r", 0))  # rank 0 always: the run's own curves and run_meta
    meta = make_record("run_meta", {"world_size": 8}, run_id="r", rank=4)
    assert not budget.admits(meta)  # a rank's run_meta and design checks are per-rank too
    assert budget.admits(step("r", -1))  # run-wide records always
    # a rank's signals are per-rank series too: written for the ranks admitted; a signal
    # admits nobody (a run-wide spike scores on every rank)
    assert budget.admits(signal("r", 1, 0.99)) and budget.admits(signal("r", -1, 0.99))
    assert not budget.admits(signal("r", 5, 0.99))
    assert not budget.admits(step("r", 5))
    # an incident names its members' ranks: by rank, or by a rank's scope
    members = [
        {"rule": "straggler", "scope": "rank:6"},
        {"rule": "xid", "scope": "gpu:n/1", "rank": 8},
    ]
    assert budget.admits(incident("r", members))
    assert budget.admits(step("r", 6))
    assert not budget.admits(step("r", 8))  # past the standouts' budget (1)
    assert budget.admits(step("other", 9))  # each run its own budget


def test_runs_remembered_are_bounded() -> None:
    budget = RankBudget(RankLimits(per_run=1, standouts=0, tracked_runs=2))
    for run in ("a", "b", "c"):
        assert budget.admits(step(run, 1)) and not budget.admits(step(run, 2))
    assert budget.admits(step("a", 2))  # "a" was forgotten: first come again


def test_a_budget_of_no_ranks_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid rank limits"):
        RankLimits(per_run=0)


def test_ranks_past_the_budget_are_left_to_s3_and_counted(stack_env) -> None:
    """Ranks 1 to 10 of one run with a budget of three (and one standout): three ranks' steps
    are stored, the others' are skipped (acknowledged, not written) and counted; once an
    incident names rank 8, its steps are stored too."""
    s = settings_from(stack_env)
    run = unique("ranks")
    before = REGISTRY.get_sample_value("steplens_sink_ranks_left_out_total", {"sink": "influx"})
    with make_client(s) as client:
        sink = InfluxSink(client, s, ranks=RankLimits(per_run=3, standouts=1))
        got = sink.export([step(run, rank) for rank in range(1, 11)])
        assert (got.accepted, got.skipped, got.rejected) == (3, 7, [])
        named = incident(run, [{"rule": "straggler:step_time_s", "scope": "rank:8"}])
        assert sink.export([named]).accepted == 1
        got = sink.export([step(run, 8, 1), step(run, 9, 1)])
        assert (got.accepted, got.skipped) == (1, 1)
        sink.shutdown()
    assert count_points(s, run) == 4  # ranks 1, 2, 3 at step 0; rank 8 at step 1
    after = REGISTRY.get_sample_value("steplens_sink_ranks_left_out_total", {"sink": "influx"})
    assert (after or 0) - (before or 0) == 8
