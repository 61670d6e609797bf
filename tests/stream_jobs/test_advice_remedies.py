"""The shared remedies (``engine.advice``): a rewind or an lr change only for damage that stays
(judged against the loss's pre-incident trend K steps after the onset, at once for a
non-finite value or a loss far off trend), to a checkpoint within reach, with its skip bounded,
its cost and evidence, at a step ahead of the run, never stacked, within the run's budget."""

from __future__ import annotations

import math
import random

import numpy as np

from steplens.schema import RUN_RANK, decode
from steplens.stream_jobs.engine.advice import (
    LOSS_ROWS,
    AdviceConfig,
    AdviceState,
    RunNow,
    advise,
    budget,
    keep_checkpoint,
    lead_steps,
    opt_in,
    restarted,
    track_loss,
)
from steplens.stream_jobs.engine.core import Alert
from steplens.stream_jobs.engine.outputs import advice_bytes

STEP_S = 0.1  # the run's pace in these tests
ROW = np.zeros(1, np.int64)  # a loss of one row
LEAD = math.ceil(5.0 / STEP_S) + 2  # the default lead of a run sending its steps one by one
CKPTS = [(s, f"/c/{s}") for s in range(0, 400, 25)]


def incident(*rules: str, severity: str = "critical", fp: str = "inc", started: int = 250):
    members = [{"rule": r, "scope": "run", "severity": severity, "firing": True} for r in rules]
    return Alert(
        rules[0],
        severity,
        "firing",
        "incident",
        "a hint",
        fp,
        "r",
        started,
        started,
        "summary",
        {"topic": "training", "members": members, "episode": 0},
        int(started * STEP_S * 1e9),
    )


def state(remedies=("rewind", "lower_lr"), checkpoints=CKPTS) -> AdviceState:
    s = AdviceState()
    opt_in(s, list(remedies))
    for step, path in checkpoints:
        keep_checkpoint(s, AdviceConfig(), step, path)
    return s


def trend(step: int) -> float:
    return 2.0 + 0.01 * math.sin(step * 1.7)


def feed(s: AdviceState, steps, loss=trend) -> None:
    for i in steps:
        track_loss(
            s,
            0,
            np.array([i]),
            np.array([loss(i)]),
            firsts=None,
            rows=ROW,
            times_ns=[int(i * STEP_S * 1e9)],
        )


def run_at(s: AdviceState, step: int, total: int = 0) -> RunNow:
    return RunNow(step, total, int(step * STEP_S * 1e9))


def step_on(s, cfg, steps, loss, total=0):
    """Steps one by one, each followed by a decision without alerts: (step, advice) pairs."""
    out = []
    for i in steps:
        feed(s, [i], loss)
        given, held = advise(s, cfg, [], run_at(s, i, total))
        out += [(i, a) for a in given + held]
    return out


def test_a_blip_back_on_trend_gets_no_rewind_and_no_lr_change():
    s, cfg = state(), AdviceConfig(lower_lr_repeats=1)
    feed(s, range(250))
    feed(s, [250], lambda i: 60.0)
    inc = incident("spike:loss", "correlation:loss_grad")
    assert advise(s, cfg, [inc], run_at(s, 250)) == ([], [])
    assert s.pending  # judged later
    assert step_on(s, cfg, range(251, 320), trend) == []
    assert s.pending == [] and s.advised == {}  # judged once, back on trend: nothing


def test_damage_that_stays_rewinds_k_steps_after_the_onset_to_a_checkpoint_before_it():
    s, cfg = state(remedies=["rewind"]), AdviceConfig()
    feed(s, range(250))
    feed(s, [250], lambda i: 60.0)
    assert advise(s, cfg, [incident("spike:loss")], run_at(s, 250)) == ([], [])
    # +15 %: off the trend (5 %) but not far off it (4 x 5 %): judged at onset + K
    got = step_on(s, cfg, range(251, 300), lambda i: 1.15 * trend(i))
    [(step, adv)] = got
    assert step == 250 + cfg.rewind_confirm_steps and adv.held is None
    assert (adv.rank, adv.step) == (RUN_RANK, step)
    d = adv.data
    assert (d["checkpoint"], d["checkpoint_step"]) == ("/c/225", 225)  # not 250: after it
    assert d["at_step"] == step + LEAD
    assert d["steps_lost"] == d["at_step"] - 225
    assert d["skip_batches"] == d["batches_skipped"] == 100  # the margin: 97 + 100 <= 500
    assert "+15 %" in d["evidence"] and "20 steps after the onset" in d["evidence"]
    assert "checkpoint 25 steps before the onset" in d["evidence"]
    assert s.steps_lost == d["steps_lost"]
    rec = decode(advice_bytes("r", adv))  # the wire takes it
    assert rec.data["at_step"] == d["at_step"] and rec.data["evidence"] == d["evidence"]


def test_the_skip_keeps_what_is_not_trained_on_within_the_cap():
    for max_skip, want in ((150, 150 - (270 + LEAD - 225)), (50, 0)):
        s, cfg = state(remedies=["rewind"]), AdviceConfig(rewind_max_skip=max_skip)
        feed(s, range(251))
        advise(s, cfg, [incident("spike:loss")], run_at(s, 250))
        [(_, adv)] = step_on(s, cfg, range(251, 280), lambda i: 1.15 * trend(i))
        assert adv.data["skip_batches"] == want


def test_no_checkpoint_within_reach_no_rewind_the_incident_says_a_person_decides():
    s, cfg = (
        state(remedies=["rewind"], checkpoints=[(40, "/c/40"), (250, "/c/250")]),
        AdviceConfig(),
    )
    feed(s, range(251))
    advise(s, cfg, [incident("spike:loss")], run_at(s, 250))
    [(_, adv)] = step_on(s, cfg, range(251, 280), lambda i: 1.15 * trend(i))
    assert adv.held == "no_checkpoint" and "checkpoint" not in adv.data
    assert (
        "no checkpoint within 200 steps before the onset; a person decides"
        in (adv.data["evidence"])
    )
    assert (s.given, s.held) == (0, 1)
    near = state(remedies=["rewind"], checkpoints=[(40, "/c/40")])
    feed(near, range(251))
    cfg = AdviceConfig(rewind_max_back=250, remedy_budget_floor=1000)
    advise(near, cfg, [incident("spike:loss")], run_at(near, 250))
    [(_, adv)] = step_on(near, cfg, range(251, 280), lambda i: 1.15 * trend(i))
    assert adv.held is None and adv.data["checkpoint_step"] == 40


def test_a_rewind_named_past_the_runs_last_step_is_held_not_sent():
    """No rank would reach its at_step: the incident says so and a person decides."""
    for total, held in ((300, "run_ends"), (400, None)):
        s, cfg = state(remedies=["rewind"]), AdviceConfig()
        feed(s, range(251))
        advise(s, cfg, [incident("spike:loss")], run_at(s, 250, total))
        [(_, adv)] = step_on(s, cfg, range(251, 280), lambda i: 1.15 * trend(i), total)
        assert adv.held == held and adv.data["at_step"] == 270 + LEAD
        assert (s.given, s.held) == ((0, 1) if held else (1, 0))
        ends = f"the run ends at step {total}, before step {270 + LEAD}"
        assert (ends in adv.data["evidence"]) == bool(held)


def test_a_non_finite_loss_rewinds_at_once():
    s, cfg = state(remedies=["rewind"]), AdviceConfig()
    feed(s, range(250))
    [adv], _ = advise(s, cfg, [incident("nonfinite:loss")], run_at(s, 250))
    assert adv.data["checkpoint_step"] == 225 and adv.data["at_step"] == 250 + LEAD
    assert adv.data["evidence"].startswith("non-finite loss at step 250")
    fresh = state(remedies=["rewind"])  # no trend yet: the damage still stays
    feed(fresh, range(27, 30))
    inc = incident("nonfinite:grad_norm", started=30)
    [adv], _ = advise(fresh, cfg, [inc], run_at(fresh, 30))
    assert adv.data["checkpoint_step"] == 25


def test_a_loss_far_off_trend_at_every_step_rewinds_before_k_steps():
    s, cfg = state(remedies=["rewind"]), AdviceConfig()
    feed(s, range(251))
    advise(s, cfg, [incident("spike:loss")], run_at(s, 250))
    [(step, adv)] = step_on(s, cfg, range(251, 300), lambda i: 3.0 + 0.1 * (i - 250))
    assert step == 250 + cfg.rewind_confirm_steps // 4  # five steps above it, rising
    assert adv.data["evidence"].startswith("far off trend, not coming back")
    # falling back from far above: waits for the judgement, which finds it back
    s = state(remedies=["rewind"])
    feed(s, range(251))
    advise(s, cfg, [incident("spike:loss")], run_at(s, 250))
    assert step_on(s, cfg, range(251, 300), lambda i: trend(i) + 8.0 * 0.7 ** (i - 250)) == []


def test_windows_are_judged_once_one_starts_past_half_the_confirm_steps():
    s, cfg = state(remedies=["rewind"]), AdviceConfig()

    def window(last: int, loss: float) -> None:
        t = int(last * STEP_S * 1e9)
        track_loss(
            s,
            0,
            np.array([last]),
            np.array([loss]),
            firsts=np.array([last - 9]),
            rows=ROW,
            times_ns=[t],
        )

    for last in range(9, 250, 10):
        window(last, trend(last))
    window(259, 8.0)  # the window of the spike at 250
    advise(s, cfg, [incident("spike:loss", started=250)], run_at(s, 259))
    window(269, 1.15 * trend(269))  # ends past onset + K ... but starts before onset + K/2
    assert advise(s, cfg, [], run_at(s, 269)) == ([], [])
    window(279, 1.15 * trend(279))
    [adv], _ = advise(s, cfg, [], run_at(s, 279))
    assert s.window == 10
    assert adv.data["at_step"] == 279 + math.ceil(5.0 / STEP_S) + 10 + 2


def test_rewind_and_lower_lr_never_stack_a_second_only_if_the_first_did_not_work():
    cfg = AdviceConfig(lower_lr_repeats=1)
    for after, second in ((trend, []), (lambda i: 1.15 * trend(i), ["lower_lr"])):
        s = state()
        feed(s, range(251))
        advise(s, cfg, [incident("spike:loss", "correlation:loss_grad")], run_at(s, 250))
        [(_, first)] = step_on(s, cfg, range(251, 271), lambda i: 1.15 * trend(i))
        assert first.action == "rewind"
        at = first.data["at_step"]
        # the ranks rewind at ``at``: their steps go back to the checkpoint, then on
        restarted(s, first.data["checkpoint_step"] + 1)
        got = step_on(s, cfg, range(first.data["checkpoint_step"] + 1, at + 40), after)
        assert [a.action for _, a in got] == second
        if second:
            ((step, adv),) = got
            assert step == at + cfg.rewind_confirm_steps
            assert f"after the rewind's step {at}" in adv.data["evidence"]
            assert adv.data["at_step"] > step


def test_lower_lr_alone_when_the_correlation_came_back_and_the_damage_stays():
    s, cfg = state(remedies=["lower_lr"]), AdviceConfig(lr_factor=0.3)
    feed(s, range(251))
    corr = incident("correlation:loss_grad", fp="a", started=100)
    assert advise(s, cfg, [corr], run_at(s, 250)) == ([], [])  # the first one: not again
    advise(s, cfg, [incident("correlation:loss_grad", fp="b")], run_at(s, 250))
    [(step, adv)] = step_on(s, cfg, range(251, 300), lambda i: 1.15 * trend(i))
    assert adv.data["lr_factor"] == 0.3 and adv.data["fingerprint"] == "b"
    assert adv.data["at_step"] == step + LEAD and adv.data["steps_lost"] == 0
    assert "came back (2 incidents within 2000 steps)" in adv.data["evidence"]


def test_past_the_budget_a_rewind_is_held_and_the_lr_change_goes_instead():
    cfg = AdviceConfig(lower_lr_repeats=1, remedy_budget=0.01, remedy_budget_floor=50)
    s = state()
    feed(s, range(251))
    advise(s, cfg, [incident("spike:loss", "correlation:loss_grad")], run_at(s, 250))
    got = step_on(s, cfg, range(251, 280), lambda i: 1.15 * trend(i), total=3000)
    [(_, rewind), (_, lower)] = sorted(got, key=lambda g: g[1].action, reverse=True)
    assert rewind.held == "budget" and lower.held is None and lower.action == "lower_lr"
    lost = rewind.data["steps_lost"]
    assert (
        f"past the run's remedy budget (0 + {lost} of 50 steps); a person decides"
        in (rewind.data["evidence"])
    )
    assert (s.given, s.held, s.steps_lost) == (1, 1, 0)


def test_the_budget_is_a_share_of_the_declared_steps_else_the_steps_seen_with_a_floor():
    cfg = AdviceConfig(remedy_budget=0.05, remedy_budget_floor=200)
    assert budget(cfg, RunNow(100, 10_000, 0)) == 500
    assert budget(cfg, RunNow(8000, 0, 0)) == 400
    assert budget(cfg, RunNow(100, 0, 0)) == 200
    s, cfg = state(remedies=["rewind"]), AdviceConfig(remedy_budget_floor=150)
    s.steps_lost = 100  # an earlier rewind's
    feed(s, range(251))
    advise(s, cfg, [incident("spike:loss")], run_at(s, 250))
    [(_, adv)] = step_on(s, cfg, range(251, 280), lambda i: 1.15 * trend(i))
    assert adv.held == "budget"


def test_the_lead_covers_the_latency_in_steps_and_the_window():
    s, cfg = AdviceState(), AdviceConfig(lead_s=5.0, max_lead_steps=200)
    assert lead_steps(s, cfg) == 200  # pace unknown: the most
    s.step_s = 0.25
    assert lead_steps(s, cfg) == 20 + 2
    s.window = 40
    assert lead_steps(s, cfg) == 20 + 40 + 2
    s.step_s = 0.001
    assert lead_steps(s, cfg) == 200
    s.step_s, s.window = 100.0, 0
    assert lead_steps(s, cfg) == 3  # one step of 100 s covers 5 s, plus 2
    assert lead_steps(s, AdviceConfig(lead_s=0.0)) == 2


def test_the_loss_and_pace_are_the_lowest_ranks():
    s = AdviceState()
    rng = random.Random(1)
    for i in range(0, 100, 10):  # batches of 10 steps, rank 1's first
        steps = np.arange(i, i + 10)
        for rank in (1, 0):
            times = [int((j * 0.2 + rank * 0.03 + rng.uniform(0, 0.01)) * 1e9) for j in steps]
            xs = np.full(10, 2.0 + rank)
            track_loss(s, rank, steps, xs, firsts=None, rows=np.arange(10), times_ns=times)
    assert s.loss_rank == 0 and abs(s.step_s - 0.2) < 0.02
    assert (s.loss_step[50], s.loss_x[50], s.last_step) == (50, 2.0, 99)  # rank 0's


def test_the_losses_of_abandoned_steps_go_with_a_restart():
    s = AdviceState()
    feed(s, range(100))
    restarted(s, 60)
    assert s.loss_step.max() == 59 and s.last_step == 59 and s.paced_step == -1
    feed(s, range(60, 70), lambda i: 5.0)
    assert s.loss_x[65] == 5.0


def test_the_latest_steps_take_over_the_slots_of_older_ones():
    s = AdviceState()
    feed(s, range(LOSS_ROWS + 10))
    assert s.loss_step[5] == LOSS_ROWS + 5
    assert s.loss_step.min() == 10


def test_pending_judgements_are_capped_and_counted():
    s, cfg = state(remedies=["rewind"]), AdviceConfig()
    feed(s, range(251))
    for k in range(20):
        advise(s, cfg, [incident("spike:loss", fp=f"f{k}")], run_at(s, 250))
    assert len(s.pending) == 16 and s.dropped == 4


def test_a_shared_remedy_the_storm_limit_holds_is_not_replaced_by_the_other():
    cfg = AdviceConfig(lower_lr_repeats=1, burst=1, refill_s=3600.0)
    s = state(remedies=["profile", "rewind", "lower_lr"])
    feed(s, range(251))
    [profile], _ = advise(s, cfg, [incident("straggler:step_time_s", fp="slow")], run_at(s, 250))
    assert profile.action == "profile"  # the one token
    advise(s, cfg, [incident("spike:loss", "correlation:loss_grad")], run_at(s, 250))
    got = step_on(s, cfg, range(251, 280), lambda i: 1.15 * trend(i))
    assert [(a.action, a.held) for _, a in got] == [("rewind", "storm")]
    assert s.shared == {} and s.pending == []


def test_an_incident_that_escalates_while_judged_is_rewound_before_its_lr_is_lowered():
    cfg = AdviceConfig(lower_lr_repeats=1)
    s = state()
    feed(s, range(251))
    warned = incident("spike:loss", "correlation:loss_grad", severity="warning")
    advise(s, cfg, [warned], run_at(s, 250))
    assert [c["want"] for c in s.pending] == [["lower_lr"]]
    feed(s, range(251, 256), lambda i: 1.15 * trend(i))
    advise(s, cfg, [incident("spike:loss", "correlation:loss_grad")], run_at(s, 255))
    got = step_on(s, cfg, range(256, 280), lambda i: 1.15 * trend(i))
    assert [a.action for _, a in got] == ["rewind"]


def test_a_decision_behind_its_records_names_a_step_ahead_of_where_the_ranks_are_now():
    """A worker 3 s behind a run of 0.1 s steps: the ranks are 30 steps past their last report,
    so at_step is that much further on, and the rewind's cost counts those steps too."""
    s, cfg = state(remedies=["rewind"]), AdviceConfig()
    feed(s, range(250))
    late = RunNow(250, 0, int(250 * STEP_S * 1e9), int((250 * STEP_S + 3.0) * 1e9))
    [adv], _ = advise(s, cfg, [incident("nonfinite:loss")], late)
    assert adv.data["at_step"] == 250 + 30 + LEAD
    assert adv.data["steps_lost"] == adv.data["at_step"] - 225
    # a decision on time (wall clock at the report's time, or unknown) adds nothing
    for wall_ns in (int(250 * STEP_S * 1e9), 0):
        s = state(remedies=["rewind"])
        feed(s, range(250))
        on_time = RunNow(250, 0, int(250 * STEP_S * 1e9), wall_ns)
        [adv], _ = advise(s, cfg, [incident("nonfinite:loss")], on_time)
        assert adv.data["at_step"] == 250 + LEAD
    # far behind, the cost outgrows the budget: held for a person, not sent
    s = state(remedies=["rewind"])
    feed(s, range(250))
    far = RunNow(250, 0, int(250 * STEP_S * 1e9), int((250 * STEP_S + 60.0) * 1e9))
    given, [held] = advise(s, cfg, [incident("nonfinite:loss")], far)
    assert given == [] and held.held == "budget"
