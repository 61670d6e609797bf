"""The demo command's options and its printed scorecard (no stack needed)."""

from __future__ import annotations

from demo_output import scorecard

from steplens.stack.demo import QUICK_HANG_AFTER_S, parse_args
from steplens.stack.demo_incidents import format_scorecard, plan_incidents, score


def test_quick_mode_is_short_and_its_stall_outlasts_the_hang_threshold():
    args = parse_args(["--quick"], "steplens demo")
    assert args.steps == 240
    assert args.hang_after_s == QUICK_HANG_AFTER_S
    assert args.stall_s > args.hang_after_s
    assert args.run_id.startswith("demo-")
    full = parse_args([], "steplens demo")
    assert full.steps > args.steps and full.stall_s > full.hang_after_s


def test_scorecard_lists_catches_misses_and_false_alarms():
    plan = plan_incidents(240)
    blow = plan[0]
    alerts = [
        {
            "rule": "spike:loss",
            "step": blow.first_step + 1,
            "rank": 1,
            "state": "firing",
            "severity": "critical",
            "scope": "rank:1",
            "hint": "inspect the batch",
        },
        {
            "rule": "spike:loss",
            "step": 20,
            "rank": 0,
            "state": "firing",
            "severity": "warning",
            "scope": "rank:0",
            "hint": "early",
        },
    ]
    text = format_scorecard(plan, score(plan, alerts))
    marks = scorecard(text)
    assert marks["lr_blowup"] == "CAUGHT"
    assert [k for k, m in marks.items() if m == "MISSED"] == [i.kind for i in plan[1:]]
    assert "inspect the batch" in text and "rank 1" in text
    assert "false alarms (outside every incident): 1  (spike:loss x1)" in text
    assert "caught 1 of 5 incidents, 1 false alarm(s)" in text


def _incident(state: str, step: int, severity: str, *member_rules: tuple[str, int, int]) -> dict:
    return {
        "rule": member_rules[0][0],
        "scope": "incident",
        "fingerprint": "inc-200",
        "state": state,
        "step": step,
        "started_step": 200,
        "severity": severity,
        "hint": "lr",
        "evidence": {
            "members": [{"rule": r, "started_step": s, "rank": k} for r, s, k in member_rules]
        },
    }


def test_an_incident_open_since_an_earlier_event_catches_a_later_one_only_if_it_pages():
    """The lr blow-up's incident (step 200) lists a loss spike of step 260 on rank 0 when it is
    reported again at step 300: that does not catch the corrupted batch of step 260 unless the
    incident was reported again for it (escalated) in that window, led by a rule of that kind
    (the strict scorecard: a page led by the lr rule catches no corrupted batch)."""
    plan = plan_incidents(500)
    blow, corrupt = plan[0], plan[1]
    assert (blow.first_step, corrupt.first_step) == (200, 260)
    lr = ("lr_schedule:lr", 200, -1)
    late = ("spike:loss", 260, 0)
    opened = _incident("firing", 200, "warning", lr)
    later = _incident("firing", 300, "critical", lr, late, ("data:over_length_share", 300, 0))
    silent = [opened, later, _incident("resolved", 500, "critical", lr, late)]
    card = score(plan, silent)
    assert "lr_blowup" in card.caught and "corrupted_batch" not in card.caught
    assert not card.false_alarms
    paged = [opened, _incident("firing", 260, "critical", lr, late)]
    assert "corrupted_batch" not in score(plan, paged).caught
    led = [opened, _incident("firing", 260, "critical", late, lr)]
    assert "corrupted_batch" in score(plan, led).caught
