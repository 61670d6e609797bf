"""Incidents: grouping, inhibition, one severity and one hint, over random alert histories."""

from __future__ import annotations

import copy
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from steplens.stream_jobs.engine import incidents as inc_mod
from steplens.stream_jobs.engine.core import Alert
from steplens.stream_jobs.engine.detector import CODEC
from steplens.stream_jobs.engine.hints import hint_for
from steplens.stream_jobs.engine.incidents import IncidentsConfig, IncidentsState, update
from steplens.stream_jobs.engine.rules import fingerprint

RULES = [
    "spike:loss",
    "spike:grad_norm",
    "correlation:loss_grad",
    "arima:loss",
    "volatility:loss",
    "straggler:step_time_s",
    "hang:progress",
    "threshold:gpu_mem_pct",
    "data:duplicate_rate",
    "data:over_length_share",
    "plateau:eval_loss",
]
SEVERITIES = ["info", "warning", "critical"]


def alert(rule: str, state: str, step: int, started: int, severity: str = "warning") -> Alert:
    return Alert(
        rule,
        severity,
        state,
        "run",
        hint_for(rule),
        fingerprint("r", rule, "run"),
        "r",
        step,
        started,
        f"{rule} {state}",
        {"metric": rule.rsplit(":", maxsplit=1)[-1]},
    )


@st.composite
def histories(draw: st.DrawFn) -> list[Alert]:
    """Alert transitions as the rules make them: per rule and scope, firing, then resolved
    later, then maybe firing again; steps never go back."""
    out: list[Alert] = []
    firing: dict[str, int] = {}
    step = 0
    for _ in range(draw(st.integers(0, 40))):
        step += draw(st.integers(1, 30))
        rule = draw(st.sampled_from(RULES))
        if rule in firing:
            out.append(alert(rule, "resolved", step, firing.pop(rule)))
        else:
            firing[rule] = step
            out.append(alert(rule, "firing", step, step, draw(st.sampled_from(SEVERITIES))))
    for rule, started in firing.items():  # every alert resolves in the end
        step += 10
        out.append(alert(rule, "resolved", step, started))
    return out


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(0, 5))
def test_each_incident_opens_resolves_last_and_never_steps_down(history, join):
    state = IncidentsState()
    reports: list[Alert] = []
    for a in history:
        reports += update(state, IncidentsConfig(join_steps=join), [a])
    assert not state.open and not state.of_alert  # everything resolved
    by_id: dict[str, list[Alert]] = {}
    for r in reports:
        by_id.setdefault(r.fingerprint, []).append(r)
    firing_alerts = [a for a in history if a.state == "firing"]
    members = sum(len({m["rule"] for m in rs[-1].evidence["members"]}) for rs in by_id.values())
    # every firing alert is a member of exactly one incident (a rule that fires twice in one
    # incident is one member); a follower an incident kept quiet after it resolved is not
    # reported
    assert members <= len(firing_alerts)
    listed = {m["rule"] for rs in by_id.values() for m in rs[-1].evidence["members"]}
    assert listed <= {a.rule for a in firing_alerts}
    assert {a.rule for a in firing_alerts if not inc_mod.follower(a.rule)} <= listed
    for rs in by_id.values():
        assert rs[0].state == "firing" and rs[-1].state == "resolved"
        # it opens again only soon after it resolved (an event breaching on and off), or
        # after a follower it kept quiet since moved
        topic = rs[0].evidence["topic"]
        for before, after in itertools.pairwise(rs):
            if before.state == "resolved":
                assert after.state == "firing"
                quiet = [
                    a.step
                    for a in history
                    if inc_mod.follower(a.rule)
                    and inc_mod.topic_of(a.rule) == topic
                    and before.step <= a.step <= after.step
                ]
                gap = max(
                    inc_mod.join_gap_of(IncidentsConfig(), m["rule"], after.step)
                    for m in after.evidence["members"]
                )
                assert after.step - max([before.step, *quiet]) <= gap
        ranks = [inc_mod.RANK[r.severity] for r in rs]
        assert ranks == sorted(ranks)  # escalates, never steps down
        top = max(inc_mod.RANK[m["severity"]] for m in rs[-1].evidence["members"])
        assert ranks[-1] == top
        lead = max(inc_mod.specificity(m["rule"]) for m in rs[-1].evidence["members"])
        assert inc_mod.specificity(rs[-1].rule) == lead  # the most specific hint
        assert rs[-1].hint == hint_for(rs[-1].rule)


@settings(max_examples=100, deadline=None)
@given(histories(), st.data())
def test_a_replay_after_a_restart_reports_the_same_incidents(history, data):
    """A worker checkpoints its incidents' state (packed as the run's state is), goes on, and is
    restarted: the next one restores the checkpoint and replays the alerts since; it reports
    exactly what the first one reported for them (identity from run, topic and step)."""
    cut = data.draw(st.integers(0, len(history)), label="checkpoint")
    cfg, first = IncidentsConfig(), IncidentsState()
    for x in copy.deepcopy(history[:cut]):
        update(first, cfg, [x])
    checkpoint = CODEC.pack(first)
    went_on = [r for x in copy.deepcopy(history[cut:]) for r in update(first, cfg, [x])]
    restored = CODEC.unpack(checkpoint)
    assert isinstance(restored, IncidentsState)
    replayed = [r for x in copy.deepcopy(history[cut:]) for r in update(restored, cfg, [x])]
    assert replayed == went_on


def test_one_bad_batch_is_one_incident_with_the_correlation_hint():
    """Loss spike, gradient spike, their correlation, an ARIMA excursion and the over-length
    share of the same step: one incident, critical once the gradient spike is, with the
    correlation's hint; the members are inhibited; it resolves with its last member."""
    state, cfg = IncidentsState(), IncidentsConfig()
    steps = [
        alert("spike:loss", "firing", 100, 100),
        alert("data:over_length_share", "firing", 100, 100),
        alert("spike:grad_norm", "firing", 100, 100, "critical"),
        alert("correlation:loss_grad", "firing", 100, 100),
        alert("arima:loss", "firing", 102, 100),
    ]
    got = [r for a in steps for r in update(state, cfg, [a])]
    assert len({r.fingerprint for r in got}) == 1
    # reported as it opens, escalates, gets a better hint or a member of a new rule; never a
    # second incident
    assert [r.state for r in got] == ["firing"] * len(got) and len(got) <= 5
    assert got[-1].severity == "critical" and got[-1].rule == "correlation:loss_grad"
    assert got[-1].hint == hint_for("correlation:loss_grad")
    ends = [alert(a.rule, "resolved", 120, 100) for a in steps]
    out = [r for a in ends for r in update(state, cfg, [a])]
    assert [r.state for r in out] == ["resolved"] and out[0].fingerprint == got[0].fingerprint
    assert len(out[0].evidence["members"]) == 5


def test_unrelated_alerts_far_apart_are_separate_incidents():
    state, cfg = IncidentsState(), IncidentsConfig()
    a = update(state, cfg, [alert("spike:loss", "firing", 100, 100)])
    b = update(state, cfg, [alert("straggler:step_time_s", "firing", 300, 300)])
    assert len(a) == len(b) == 1 and a[0].fingerprint != b[0].fingerprint


def test_a_follower_joins_silently_a_new_finding_is_reported():
    """The volatility a loss spike leaves behind joins its incident without a second page; a
    straggler (as specific a finding as the disk latency it joined) is reported again."""
    state, cfg = IncidentsState(), IncidentsConfig()
    opened = update(state, cfg, [alert("spike:loss", "firing", 45, 45, "critical")])
    assert [r.state for r in opened] == ["firing"]
    assert update(state, cfg, [alert("volatility:loss", "firing", 49, 49, "critical")]) == []
    assert update(state, cfg, [alert("arima:loss", "firing", 50, 50)]) == []
    ends = [alert(r, "resolved", 60, s) for r, s in [("spike:loss", 45), ("arima:loss", 50)]]
    ends.append(alert("volatility:loss", "resolved", 60, 49))
    out = [r for a in ends for r in update(state, cfg, [a])]
    assert [r.state for r in out] == ["resolved"] and out[0].evidence["member_count"] == 3

    state = IncidentsState()
    disk = alert("threshold:disk_io_latency_ms", "firing", 200, 200)
    assert len(update(state, cfg, [disk])) == 1
    again = update(state, cfg, [alert("straggler:step_time_s", "firing", 201, 201)])
    assert len(again) == 1 and "straggler:step_time_s" in again[0].summary


def window_alert(rule: str, first: int, last: int) -> Alert:
    """A window's alert: it fires at the window's last step, its evidence from ``first``."""
    a = alert(rule, "firing", last, last)
    a.evidence["span_first"] = first
    return a


def test_the_next_window_of_a_condition_that_resolved_is_the_same_event():
    """A data wait on rank 1 at steps 482-496 (steps sent raw) resolved at 496; the window of
    steps 500-599 still holds the stall's last steps (to 519, never sent raw) and breaches:
    counted from its first step it is 4 steps after the event, the same incident, no page."""
    state, cfg = IncidentsState(), IncidentsConfig()
    rule = "straggler:data_wait_share"
    [opened] = update(state, cfg, [alert(rule, "firing", 482, 482)])
    update(state, cfg, [alert(rule, "resolved", 496, 482)])
    again = update(state, cfg, [window_alert(rule, 500, 599)])
    assert all(r.fingerprint == opened.fingerprint for r in again)
    far = update(state, cfg, [window_alert(rule, 700, 799)])  # 204 steps on: a new event
    assert [r.state for r in far] == ["firing"] and far[0].fingerprint != opened.fingerprint


def test_a_window_over_an_open_incidents_steps_joins_it():
    """An incident opened at step 1302 by a rank's raw steps; the window 1300-1399 (its alert
    at 1399) of another rule of its topic joins it rather than paging on its own."""
    state, cfg = IncidentsState(), IncidentsConfig()
    [opened] = update(state, cfg, [alert("straggler:data_wait_share", "firing", 1302, 1302)])
    got = update(state, cfg, [window_alert("straggler:step_time_s", 1300, 1399)])
    assert all(r.fingerprint == opened.fingerprint for r in got)
