"""The remedies scorecard of `demo --act` (pure): the scenarios' plans, recovery per incident,
the final loss against the run without remedies, and each scenario's verdict."""

import itertools
import json

import pytest

from steplens.stack.demo_recovery import (
    TOLERANCE,
    LossRun,
    back_on_trend,
    read_run,
    scenario_lines,
    scorecard,
)
from steplens.stack.demo_scenarios import checkpoint_every, plan_scenario, visits


def falling(n: int) -> dict[int, float]:
    return {s: 4.0 / (1 + s / 50) for s in range(n)}


def test_back_on_trend_counts_the_steps_until_the_loss_stays_back():
    losses = falling(400)
    for s in range(200, 260):  # a blow-up that decays over 60 steps
        losses[s] += 2.0 * (260 - s) / 60
    assert 40 <= back_on_trend(losses, 200) <= 60
    quick = falling(400)
    quick[200] += 3.0  # one bad step
    assert back_on_trend(quick, 200) <= 1
    never = {s: (x if s < 200 else 5.0) for s, x in falling(400).items()}
    assert back_on_trend(never, 200) is None
    relapse = dict(quick)  # back, then away again: not back for good
    for s in range(350, 400):
        relapse[s] = 5.0
    assert back_on_trend(relapse, 200) is None


def test_the_plans_put_each_incident_where_a_remedy_has_room_to_act():
    for steps in (200, 300):
        [blip] = plan_scenario("blip", steps)
        [blow] = plan_scenario("lr_blowup", steps)
        [shard] = plan_scenario("bad_shard", steps)
        assert blip.first_step == blow.first_step == int(0.45 * steps)
        assert blow.last_step - blow.first_step == 3 and blow.params["factor"] >= 50
        seen = visits(shard)
        assert len(seen) >= 4 and seen[-1] <= steps - 30
        assert len({b - a for a, b in itertools.pairwise(seen)}) == 1  # it recurs
        assert plan_scenario("healthy", steps) == []
    assert (checkpoint_every(200), checkpoint_every(300), checkpoint_every(6000)) == (25, 50, 1000)
    with pytest.raises(ValueError, match="unknown scenario"):
        plan_scenario("nope", 300)


def run_of(losses, final, acted=(), advice=(), shard_rows=None) -> LossRun:
    return LossRun(
        losses=dict(losses),
        steps={i: i for i in losses},
        shard_rows=dict(shard_rows or {}),
        final=final,
        iterations=len(losses),
        acted=list(acted),
        advice=list(advice),
    )


REWIND = {
    "action": "rewind",
    "fingerprint": "f",
    "onset_step": 135,
    "at_step": 207,
    "checkpoint_step": 100,
    "steps_lost": 107,
    "batches_skipped": 100,
    "evidence": "loss 3.80 vs trend 2.10 (+81 %) 20 steps after the onset",
}
ANSWER = {"action": "rewind", "fingerprint": "f", "outcome": "acted", "step": 207}


def test_a_rewound_blowup_shows_its_cost_recovery_and_final_loss_against_the_run_without():
    plan = plan_scenario("lr_blowup", 300)
    without = falling(300)
    for s in range(135, 300):
        without[s] += 1.0
    with_ = dict(without)
    for s in range(207, 407):  # the rewound run: from the checkpoint's loss, on its trend
        with_[s] = falling(300)[s - 107]
    lines, failed = scenario_lines(
        "lr_blowup", plan, run_of(with_, 1.84, [ANSWER], [REWIND]), run_of(without, 2.82)
    )
    text = "\n".join(lines)
    assert failed == []
    assert "advice rewind to step 100 at step 207 (acted); cost 107 steps lost, 100 batches" in text
    assert "evidence: loss 3.80 vs trend 2.10" in text
    back = back_on_trend(with_, 135)
    assert back is not None and 72 < back < 100  # after the rewind, from the checkpoint's loss
    assert f"back on trend after {back} steps (without: not by the end)" in text
    assert "final loss 1.840 (without: 2.820, -34.8 %)" in text
    assert text.splitlines()[-1].startswith("  OK (rewind carried out")
    # not rewound, or not better: broken promises
    _, failed = scenario_lines("lr_blowup", plan, run_of(with_, 2.80), run_of(without, 2.82))
    assert failed == ["rewind not carried out", "final loss not better by more than 1 %"]


def test_a_blip_fails_on_a_rewind_or_a_worse_end_and_a_healthy_run_on_any_advice():
    plan = plan_scenario("blip", 300)
    loss = falling(300)
    skip = {"action": "skip_samples", "fingerprint": "b", "onset_step": 135}
    ok, failed = scenario_lines(
        "blip",
        plan,
        run_of(loss, 1.836, [{**skip, "outcome": "acted", "step": 136}], [skip]),
        run_of(loss, 1.836),
    )
    assert failed == [] and "advice skip_samples at step 136 (acted)" in "\n".join(ok)
    worse = 1.836 * (1 + 2 * TOLERANCE)
    _, failed = scenario_lines(
        "blip", plan, run_of(loss, worse, [], [{**REWIND, "onset_step": 135}]), run_of(loss, 1.836)
    )
    assert failed == ["rewind advised", "final loss 2.0 % worse"]
    lines, failed = scenario_lines("healthy", [], run_of(loss, 1.8), run_of(loss, 1.8))
    assert failed == [] and "  no advice" in lines
    profile = {"action": "profile", "fingerprint": "p", "step": 80}
    lines, failed = scenario_lines(
        "healthy", [], run_of(loss, 1.8, [], [profile]), run_of(loss, 1.8)
    )
    assert failed == ["advice given: profile"]
    assert any(x.startswith("  other advice: advice profile") for x in lines)


def test_a_skipped_shard_counts_its_rows_per_visit_and_the_card_sums_up(tmp_path):
    plan = plan_scenario("bad_shard", 300)
    seen = visits(plan[0])
    rows_without = dict.fromkeys(seen, 32)
    rows_with = {seen[0]: 32}
    path = tmp_path / "with.jsonl"
    lines = [{"it": i, "step": i, "loss": x} for i, x in falling(300).items()]
    for row in lines:
        if row["it"] in rows_with:
            row["shard_rows"] = rows_with[row["it"]]
    lines += [
        {"final": 1.85, "iterations": 300},
        {"acted": {"action": "skip_samples", "fingerprint": "s", "outcome": "acted", "step": 76}},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    with_ = read_run(path)
    assert with_.final == 1.85 and with_.shard_rows == rows_with and len(with_.acted) == 1
    with_.advice = [{"action": "skip_samples", "fingerprint": "s", "onset_step": seen[0]}]
    without = run_of(falling(300), 1.89, shard_rows=rows_without)
    text, failed = scorecard([("bad_shard", plan, with_, without)], seed=1234)
    assert failed == 0
    got = [x.strip() for x in text.splitlines() if "shard rows trained on" in x]
    assert got == ["shard rows trained on: 32 (without: 32)"] + [
        "shard rows trained on: 0 (without: 32)"
    ] * (len(seen) - 1)
    assert text.splitlines()[-1] == "remedies: 1 of 1 scenarios as promised"
