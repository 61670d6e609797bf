"""The incident plan and how alerts are scored against it."""

from __future__ import annotations

import itertools

import pytest

from steplens.stack.demo_incidents import (
    estimate_steps,
    load_plan,
    plan_incidents,
    save_plan,
    score,
)

KINDS = {"lr_blowup", "corrupted_batch", "straggler", "duplicates", "stall"}


@pytest.mark.parametrize("steps", [120, 240, 600, 5000])
def test_plan_leaves_a_clean_baseline_and_keeps_incidents_apart(steps):
    plan = plan_incidents(steps)
    assert {i.kind for i in plan} == KINDS
    assert plan[0].first_step >= steps // 3
    assert plan[-1].last_step < steps
    for a, b in itertools.pairwise(plan):
        assert a.last_step < b.first_step


def test_plan_refuses_runs_too_short_for_a_baseline():
    with pytest.raises(ValueError):
        plan_incidents(60)


def test_plan_round_trips_through_json(tmp_path):
    plan = plan_incidents(600, stall_s=42.0)
    save_plan(plan, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json") == plan


def _alert(rule, step=None, rank=-1, state="firing", **kw):
    return {
        "rule": rule,
        "step": step,
        "started_step": step,
        "rank": rank,
        "state": state,
        "severity": "warning",
        "scope": f"rank:{rank}" if rank >= 0 else "run",
        "hint": "",
        **kw,
    }


def test_alerts_in_the_window_with_a_matching_rule_catch_the_incident():
    plan = plan_incidents(600)
    blow = next(i for i in plan if i.kind == "lr_blowup")
    card = score(plan, [_alert("spike:loss", blow.first_step + 1)])
    assert list(card.caught) == ["lr_blowup"]
    assert {i.kind for i in card.missed} == KINDS - {"lr_blowup"}
    assert card.false_alarms == []


def test_alert_outside_every_window_is_a_false_alarm():
    plan = plan_incidents(600)
    card = score(plan, [_alert("spike:loss", 30)])
    assert not card.caught
    assert len(card.false_alarms) == 1


def test_other_rule_inside_a_window_is_related_not_a_catch_nor_a_false_alarm():
    plan = plan_incidents(600)
    dup = next(i for i in plan if i.kind == "duplicates")
    alert = _alert("spike:grad_norm", dup.first_step)
    card = score(plan, [alert])
    assert not card.caught and card.false_alarms == []
    assert card.related == {"duplicates": [alert]}


def test_rank_must_match_for_a_rank_local_incident():
    plan = plan_incidents(600)
    bad = next(i for i in plan if i.kind == "corrupted_batch")
    card = score(plan, [_alert("data:over_length_share", bad.first_step, rank=1)])
    assert "corrupted_batch" not in card.caught and len(card.false_alarms) == 1
    card = score(plan, [_alert("data:over_length_share", bad.first_step, rank=0)])
    assert "corrupted_batch" in card.caught


def test_a_straggler_is_caught_by_the_cross_rank_rule_naming_its_rank():
    """A slow rank slows every rank's step: a slow step on rank 0 is related, not a catch."""
    plan = plan_incidents(600)
    slow = next(i for i in plan if i.kind == "straggler")
    card = score(plan, [_alert("arima:step_time_s", slow.first_step + 3, rank=0)])
    assert "straggler" not in card.caught and "straggler" in card.related
    card = score(plan, [_alert("straggler:step_time_s", slow.first_step + 3, rank=1)])
    assert "straggler" in card.caught


def test_an_incident_catches_only_when_its_lead_rule_is_of_the_kind():
    """The demo's straggler opened an incident led by a disk-latency threshold with the data
    wait as a member: not a catch. Led by the straggler rule, the same incident is one."""
    plan = plan_incidents(600)
    slow = next(i for i in plan if i.kind == "straggler")
    at = slow.first_step + 2
    disk = {"rule": "threshold:disk_io_latency_ms", "step": at, "started_step": at, "rank": 1}
    wait = {**disk, "rule": "threshold:data_wait_share"}
    led_by_disk = _incident("fp1", "firing", [wait, disk])
    card = score(plan, [led_by_disk])
    assert "straggler" not in card.caught and "straggler" in card.related
    lagging = {**disk, "rule": "straggler:step_time_s", "waits_on": "data"}
    led = _incident("fp1", "firing", [wait, disk, lagging])
    assert score(plan, [led_by_disk, led]).caught == {"straggler": [led]}


def test_stepless_alert_gets_the_last_step_seen_before_it():
    alerts = [_alert("hang:progress", None, time_ns=250), _alert("spike:loss", 7, time_ns=5)]
    estimate_steps(alerts, [(100, 10), (200, 11), (300, 12)])
    assert alerts[0]["estimated_step"] == 11
    assert "estimated_step" not in alerts[1]
    plan = plan_incidents(600)
    stall = next(i for i in plan if i.kind == "stall")
    hang = _alert("hang:progress", None, rank=0, time_ns=10**12)
    estimate_steps([hang], [(10**12 - 10**9, stall.first_step)])
    assert "stall" in score(plan, [hang]).caught


def test_stepless_hang_alert_is_matched_by_time():
    plan = plan_incidents(600, stall_s=75.0)
    started = {"stall": 1_000_000_000_000}
    hang = _alert("hang:progress", None, rank=0, time_ns=started["stall"] + 70_000_000_000)
    assert "stall" in score(plan, [hang], started_ns=started).caught
    late = dict(hang, time_ns=started["stall"] + 600_000_000_000)
    assert score(plan, [late], started_ns=started).false_alarms == [late]


def test_resolved_transitions_are_not_counted():
    plan = plan_incidents(600)
    card = score(plan, [_alert("spike:loss", 30, state="resolved")])
    assert card.false_alarms == [] and not card.caught


def _incident(fp, state, members, **kw):
    lead = members[-1]
    return {
        **_alert(lead["rule"], lead["step"], state=state, **kw),
        "scope": "incident",
        "fingerprint": fp,
        "evidence": {"topic": "training", "members": members},
    }


def test_an_incident_catches_by_any_member_and_counts_once_with_its_escalations():
    """steplens reports incidents: a member's rule and rank decide the catch, and an incident
    reported again when it escalates is still one."""
    plan = plan_incidents(600)
    bad = next(i for i in plan if i.kind == "corrupted_batch")
    grad = {"rule": "spike:grad_norm", "step": bad.first_step, "started_step": bad.first_step}
    data = {**grad, "rule": "data:over_length_share", "rank": 0}
    opened = _incident("fp1", "firing", [grad], severity="warning")
    escalated = _incident("fp1", "firing", [grad, data], severity="critical")
    card = score(plan, [opened, escalated])
    assert list(card.caught) == ["corrupted_batch"] and card.caught["corrupted_batch"] == [
        escalated
    ]
    far = _incident("fp2", "firing", [{**grad, "step": 30, "started_step": 30}])
    assert score(plan, [far]).false_alarms == [far]
