"""The demo's remedies lines: recovery and end loss of the same run with and without."""

import json

from steplens.stack.demo_incidents import plan_incidents
from steplens.stack.demo_recovery import LossRun, back_on_trend, end_loss, read_run, remedy_lines


def falling(n: int) -> dict[int, float]:
    return {s: 4.0 / (1 + s / 50) for s in range(n)}


def test_back_on_trend_counts_the_steps_until_the_loss_stays_back():
    losses = falling(400)
    for s in range(200, 260):  # a blow-up that decays over 60 steps
        losses[s] += 2.0 * (260 - s) / 60
    assert back_on_trend(losses, 200) is not None
    assert 40 <= back_on_trend(losses, 200) <= 60
    quick = falling(400)
    quick[200] += 3.0  # one bad step
    assert back_on_trend(quick, 200) <= 1
    never = {s: (x if s < 200 else 5.0) for s, x in falling(400).items()}
    assert back_on_trend(never, 200) is None
    # back, then away again: not back for good
    relapse = dict(quick)
    for s in range(350, 400):
        relapse[s] = 5.0
    assert back_on_trend(relapse, 200) is None


def test_remedy_lines_compare_each_loss_incident_with_the_run_without(tmp_path):
    plan = plan_incidents(500)
    blow = next(i for i in plan if i.kind == "lr_blowup").first_step
    without = falling(500)
    for s in range(blow, blow + 80):
        without[s] += 1.5 * (blow + 80 - s) / 80
    with_ = dict(without)
    for s in range(blow + 5, blow + 80):
        with_[s] = falling(500)[s]
    path = tmp_path / "act.jsonl"
    rows = [{"step": s, "loss": x} for s, x in with_.items()]
    rows.append(
        {
            "acted": {
                "action": "rewind",
                "fingerprint": "f",
                "outcome": "acted",
                "detail": "restored model, optimizer from step-175.pt",
                "step": blow + 4,
            }
        }
    )
    path.write_text("\n".join(json.dumps(r) for r in rows))
    run = read_run(path)
    assert run.losses == with_ and len(run.acted) == 1
    lines = remedy_lines(plan, run, LossRun(losses=without))
    [line] = [x for x in lines if x.startswith("lr_blowup")]
    assert f"acted on: rewind at step {blow + 4}" in line
    back, back_without = back_on_trend(with_, blow), back_on_trend(without, blow)
    assert back is not None and back_without is not None and back < back_without
    assert f"back on trend after {back} steps (without: {back_without} steps)" in line
    assert f"loss at the end {end_loss(with_):.3f}" in line
    [other] = [x for x in lines if x.startswith("corrupted_batch")]
    assert "advice none; acted on: nothing" in other
