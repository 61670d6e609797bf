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
