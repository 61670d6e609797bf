"""Incidents that end and events told apart: an incident resolves when its signals are back in
their bands, whatever its followers do; a second event while the first is open is paged on its
own; a hard batch (a loss a few percent up for one step) is a note naming its batch, a
corrupted one (several times the loss) an incident."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from steplens.schema import make_record
from steplens.stream_jobs.engine.core import Alert, flatten
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.hints import hint_for
from steplens.stream_jobs.engine.incidents import IncidentsConfig, IncidentsState, update
from steplens.stream_jobs.engine.rules import RulesConfig, fingerprint


def alert(
    rule: str,
    state: str,
    step: int,
    started: int,
    severity: str = "warning",
    **evidence: Any,
) -> Alert:
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
        {"metric": rule.rsplit(":", maxsplit=1)[-1], **evidence},
    )


def feed(state: IncidentsState, history: list) -> list:
    cfg = IncidentsConfig()
    return [r for a in history for r in update(state, cfg, [a])]


def test_an_lr_incident_resolves_once_the_lr_is_back_in_band_for_its_persistence():
    """An lr blow-up at steps 200-203 (the lr back on its schedule from 204): the rule resolves
    ``resolve_after`` steps later, and so does the incident, although the loss volatility and
    forecast excursions it left behind go on firing (on and off) to the end of the run; they
    are never paged."""
    back = 204 + RulesConfig().resolve_after
    state = IncidentsState()
    history = [
        alert("lr_schedule:lr", "firing", 200, 200),
        alert("volatility:loss", "firing", 203, 203),
        alert("arima:loss", "firing", 210, 210),
        alert("lr_schedule:lr", "resolved", back, 200),
    ]
    step = back
    for k in range(12):  # the followers breach on and off, 9 steps apart, to step 500
        step += 9
        name = ("volatility:loss", "arima:loss")[k % 2]
        first = 203 if name == "volatility:loss" else 210
        started = first if k < 2 else step - 18
        history.append(alert(name, "resolved", step, started))
        history.append(alert(name, "firing", step + 9, step + 9))
    history += [alert("volatility:loss", "resolved", 500, step + 9)]
    reports = feed(state, history)
    assert [(r.state, r.step) for r in reports] == [("firing", 200), ("resolved", back)]
    assert reports[-1].rule == "lr_schedule:lr"
    assert f"resolved step {back}" in reports[-1].summary


def test_a_later_larger_spike_on_another_rank_is_paged_with_its_own_step():
    """The lr blow-up's incident (step 200) is still open (its lr deviation lasts) when rank 1
    reads a corrupted batch at step 260: the loss is larger than at 201, on another rank, and
    the first spike came back in its band long ago. The person paged at 200 is paged again,
    for step 260, with its hint; a spike as large again on the same rank soon after is the
    same event."""
    state = IncidentsState()
    first = [
        alert("lr_schedule:lr", "firing", 200, 200),
        alert("spike:loss", "firing", 201, 201, rank=0, value=3.4),
        alert("correlation:loss_grad", "firing", 201, 201),
        alert("spike:loss", "resolved", 211, 201),
        alert("volatility:loss", "firing", 212, 212),  # the loss still moving
        alert("volatility:loss", "resolved", 225, 212),
        alert("correlation:loss_grad", "resolved", 231, 201),
        alert("volatility:loss", "firing", 232, 232),
        alert("volatility:loss", "resolved", 240, 232),
        alert("volatility:loss", "firing", 245, 245),
    ]
    opened = feed(state, first)
    assert {r.fingerprint for r in opened} == {opened[0].fingerprint}
    assert opened[-1].state == "firing"
    second = update(  # one record's alerts
        state,
        IncidentsConfig(),
        [
            alert("correlation:loss_grad", "firing", 260, 260),
            alert("spike:loss", "firing", 260, 260, "critical", rank=1, value=8.3),
        ],
    )
    assert [r.state for r in second] == ["firing"]
    page = second[0]
    assert page.fingerprint != opened[0].fingerprint and page.started_step == 260
    assert "since step 260" in page.summary and page.severity == "critical"
    assert page.rule == "correlation:loss_grad"
    assert {m["rule"] for m in page.evidence["members"]} == {
        "spike:loss",
        "correlation:loss_grad",
    }
    # the same rank's spike again 3 steps later, no larger: more of the same event
    again = feed(
        state,
        [
            alert("spike:loss", "resolved", 262, 260),
            alert("spike:loss", "firing", 263, 263, rank=1, value=8.0),
        ],
    )
    assert {r.fingerprint for r in again} <= {page.fingerprint}


def _blow_up(state: IncidentsState) -> list[Alert]:
    """An lr blow-up at step 900: its deviation, a first gradient spike (0.43 at 901, back in
    its band at 903) and their correlation."""
    return feed(
        state,
        [
            alert("lr_schedule:lr", "firing", 900, 900),
            alert("spike:grad_norm", "firing", 901, 901, rank=0, value=0.43),
            alert("correlation:loss_grad", "firing", 901, 901),
            alert("spike:grad_norm", "resolved", 903, 901),
        ],
    )


def test_a_blow_ups_spike_still_growing_a_few_steps_on_is_the_same_event():
    """At full resolution the blown-up step's gradient spike (901) is followed by a larger one
    on the same rank at 906, as the optimizer's state carries the blow-up on: no second page;
    the incident is reported again, escalated to critical. A larger spike on that rank more
    than ``join_gap`` steps after the first is a new event (a corrupted batch), paged."""
    state = IncidentsState()
    opened = _blow_up(state)
    grew = feed(
        state, [alert("spike:grad_norm", "firing", 906, 906, "critical", rank=0, value=3.1)]
    )
    assert {r.fingerprint for r in grew} == {opened[0].fingerprint}
    assert grew and grew[-1].severity == "critical"
    feed(state, [alert("spike:grad_norm", "resolved", 910, 906)])
    later = feed(state, [alert("spike:grad_norm", "firing", 925, 925, rank=0, value=5.0)])
    assert [r.state for r in later] == ["firing"]
    assert later[0].fingerprint != opened[0].fingerprint and later[0].started_step == 925


def test_a_window_whose_peak_is_the_spike_already_paged_joins_its_incident():
    """A windowed rank sent the blown-up steps raw (paged at 900); the window of steps 901-1000
    then reports its peak, larger than the first raw spike, at its last step: it covers the
    same steps, so it joins the incident rather than paging at 1000."""
    state = IncidentsState()
    opened = _blow_up(state)
    window = alert("spike:grad_norm", "firing", 1000, 1000, rank=0, value=3.1)
    window.evidence["span_first"] = 901
    assert {r.fingerprint for r in feed(state, [window])} <= {opened[0].fingerprint}


def test_the_loss_volatility_a_spike_leaves_behind_is_not_paged_after_it_resolved():
    """A corrupted batch's incident (step 260) resolves at 290; the loss volatility of the
    windows that still hold its spike fires at 346 (on and off): inhibited by it, no page.
    Volatility far later (step 500) is an incident of its own."""
    state = IncidentsState()
    event = [
        alert("spike:loss", "firing", 260, 260, "critical", rank=0, value=8.3),
        alert("correlation:loss_grad", "firing", 260, 260),
        alert("spike:loss", "resolved", 270, 260),
        alert("correlation:loss_grad", "resolved", 290, 260),
    ]
    reports = feed(state, event)
    assert [r.state for r in reports] == ["firing", "firing", "resolved"]
    after = [
        alert("volatility:loss", "firing", 346, 346),
        alert("volatility:loss", "resolved", 356, 346),
        alert("volatility:loss", "firing", 366, 366),
        alert("volatility:loss", "resolved", 376, 366),
    ]
    assert feed(state, after) == []
    late = feed(state, [alert("volatility:loss", "firing", 500, 500)])
    assert [(r.state, r.started_step) for r in late] == [("firing", 500)]


# --------------------------------------------------------------------- hard and corrupted batches


def t(i: int) -> int:
    return (i + 1) * 10**8


def md5(x: object) -> str:
    return hashlib.md5(str(x).encode()).hexdigest()[:16]


def records(bumps: dict[int, float], steps: int = 420) -> list:
    """A healthy small-batch run (loss 3.0 falling slowly, 0.3 % noise): ``bumps``: step ->
    factor on its loss; each step's batch record is sent after its step record (as
    ``log_step`` then ``log_batch``)."""
    rng = random.Random(11)
    out = []
    for i in range(steps):
        loss = 3.0 * (1 - i / 4000) * (1 + rng.gauss(0, 0.003)) * bumps.get(i, 1.0)
        grad = 1.0 + rng.gauss(0, 0.03)
        data = {"loss": loss, "grad_norm": grad}
        out.append(make_record("step", data, run_id="r", rank=0, step=i, time_ns=t(i)))
        ids = [f"doc-{i}-{k}" for k in range(4)]
        batch = {"n_samples": 4, "sample_hashes": [md5(x) for x in ids], "sample_ids": ids}
        out.append(make_record("batch", batch, run_id="r", rank=0, step=i, time_ns=t(i)))
    return out


def run(recs: list) -> tuple[list, list]:
    det = RunDetector("r")
    reports, sigs = [], []
    for rec in recs:
        got, alerts = det.process(rec)
        reports += alerts
        sigs += flatten(got)
    return reports, sigs


def test_a_one_step_loss_bump_that_returns_is_a_note_naming_its_batch():
    """A loss 8 % above its baseline for one step, back at the next (a hard batch in a small
    batch): no incident; an info signal of the loss spike, with that step's samples."""
    reports, sigs = run(records({350: 1.08}))
    assert [r for r in reports if r.state == "firing"] == []
    notes = [s for s in sigs if s.name == "spike" and s.metric == "loss" and s.step == 350]
    assert notes and {s.severity for s in notes} == {"info"}
    named = [s for s in notes if "samples" in (s.detail or {})]
    assert named and named[-1].detail["samples"]["ids"] == [f"doc-350-{k}" for k in range(4)]
    assert named[-1].value > 1.05 * named[-1].expected


def test_a_corrupted_batch_three_times_the_loss_for_one_step_is_an_incident():
    """Three times the loss for one step (a corrupted batch) is paged in that step, critical,
    though it is back at the next, with its samples; a hard batch (8 %) just before changes
    nothing. It resolves once the loss has been back in its band for the rule's persistence,
    though the loss volatility of the window that holds it goes on."""
    reports, _ = run(records({340: 1.08, 350: 3.0}))
    opened = [r for r in reports if r.state == "firing"]
    assert opened and {r.fingerprint for r in reports} == {opened[0].fingerprint}
    assert opened[0].started_step == 350 and opened[0].step == 350
    assert opened[0].severity == "critical" and opened[0].rule == "spike:loss"
    members = {m["rule"]: m for m in opened[-1].evidence["members"]}
    assert members["spike:loss"]["samples"]["ids"][0] == "doc-350-0"
    ends = [r for r in reports if r.state == "resolved"]
    assert [r.step for r in ends] == [351 + RulesConfig().resolve_after - 1]


def test_a_condition_breaching_on_and_off_is_one_incident_a_second_spike_is_not():
    """A straggler that resolves and breaches again 30 steps later is the same incident, opened
    again (no second page); a loss spike 30 steps after the last one resolved is a new event."""
    state = IncidentsState()
    slow = feed(
        state,
        [
            alert("straggler:step_time_s", "firing", 312, 312),
            alert("straggler:step_time_s", "resolved", 330, 312),
            alert("straggler:step_time_s", "firing", 360, 360),
            alert("straggler:step_time_s", "resolved", 380, 360),
        ],
    )
    opened = [r for r in slow if r.state == "firing"]
    assert len({r.fingerprint for r in opened}) == 1
    assert [r.evidence["episode"] for r in opened] == [0, 1]
    spikes = feed(
        IncidentsState(),
        [
            alert("spike:loss", "firing", 100, 100, value=3.0),
            alert("spike:loss", "resolved", 110, 100),
            alert("spike:loss", "firing", 140, 140, value=3.0),
        ],
    )
    assert len({r.fingerprint for r in spikes if r.state == "firing"}) == 2


def test_a_condition_breaching_again_while_its_incident_holds_is_the_same_incident():
    """A straggler waiting on data breaches on and off through its stall: its data-wait rule
    fires at 902, resolves at 915 and fires again at 937 while the incident holds (its step
    time still fires). A condition is one event within ``follow_steps`` of its last start, so
    the second breach joins the open incident: no second page."""
    state = IncidentsState()
    history = [
        alert("straggler:data_wait_share", "firing", 902, 902, rank=1),
        alert("straggler:step_time_s", "firing", 905, 905, rank=1),
        alert("straggler:data_wait_share", "resolved", 915, 902, rank=1),
        alert("straggler:data_wait_share", "firing", 937, 937, rank=1),
    ]
    out = feed(state, history)
    firing = [a for a in out if a.state == "firing"]
    assert len({a.fingerprint for a in firing}) == 1
    assert not [a for a in out if a.state == "firing" and a.started_step == 937]
