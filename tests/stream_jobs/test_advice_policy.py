"""From incident to action (``engine.advice``): which incident reports advise which remedy,
only for a run that opted in, once per incident and action, with a storm limited per run; and
through ``RunDetector`` from records (run_meta, checkpoint, batch, step) to the advice."""

from __future__ import annotations

import random

from steplens.schema import RUN_RANK, decode, make_record
from steplens.stream_jobs.engine.advice import (
    AdviceConfig,
    AdviceState,
    advise,
    keep_checkpoint,
    opt_in,
)
from steplens.stream_jobs.engine.core import Alert
from steplens.stream_jobs.engine.detector import CODEC, RunDetector
from steplens.stream_jobs.engine.outputs import advice_bytes

ALL = ["skip_samples", "rewind", "lower_lr", "profile"]
SAMPLES = {"step": 250, "n_samples": 2, "hashes": ["h1", "h2"], "ids": ["doc-1", "doc-2"]}


def incident(
    *members: dict,
    severity: str = "warning",
    fp: str = "inc-1",
    started: int = 250,
    step: int = 250,
    state: str = "firing",
    episode: int = 0,
    t_s: float = 100.0,
) -> Alert:
    return Alert(
        members[0]["rule"],
        severity,
        state,
        "incident",
        "a hint",
        fp,
        "r",
        step,
        started,
        "summary",
        {"topic": "training", "members": list(members), "episode": episode},
        int(t_s * 1e9),
    )


def member(rule: str, **evidence) -> dict:
    return {"rule": rule, "scope": "run", "severity": "warning", "firing": True, **evidence}


def state(remedies=ALL, checkpoints=()) -> AdviceState:
    s = AdviceState()
    opt_in(s, remedies)
    for step, path in checkpoints:
        keep_checkpoint(s, AdviceConfig(), step, path)
    return s


def actions(given) -> list[str]:
    return [a.action for a in given]


def test_nothing_is_advised_to_a_run_that_did_not_opt_in():
    s = state(remedies=[])
    given, held = advise(s, AdviceConfig(), [incident(member("spike:loss", samples=SAMPLES))])
    assert given == [] and held == []


def test_a_loss_spike_with_its_samples_advises_skipping_them_by_id_else_hash():
    s = state(remedies=["skip_samples"])
    [adv], _ = advise(s, AdviceConfig(), [incident(member("spike:loss", rank=1, samples=SAMPLES))])
    assert adv.rank == RUN_RANK and adv.step == 250
    assert adv.data == {
        "action": "skip_samples",
        "fingerprint": "inc-1",
        "rule": "spike:loss",
        "reason": "a hint",
        "onset_step": 250,
        "sample_ids": ["doc-1", "doc-2"],
    }
    no_ids = {**SAMPLES, "ids": []}
    [adv], _ = advise(s, AdviceConfig(), [incident(member("spike:loss", samples=no_ids), fp="b")])
    assert adv.data["sample_hashes"] == ["h1", "h2"] and "sample_ids" not in adv.data


def test_no_samples_no_skip_until_the_evidence_names_them():
    s = state(remedies=["skip_samples"])
    assert advise(s, AdviceConfig(), [incident(member("spike:loss"))]) == ([], [])
    # the batch record came after the spike: the incident is reported again with it
    given, _ = advise(s, AdviceConfig(), [incident(member("spike:loss", samples=SAMPLES))])
    assert actions(given) == ["skip_samples"]


def test_each_incident_and_action_is_advised_once():
    s = state()
    inc = incident(member("spike:loss", samples=SAMPLES))
    assert actions(advise(s, AdviceConfig(), [inc])[0]) == ["skip_samples"]
    assert advise(s, AdviceConfig(), [inc]) == ([], [])  # reported again (amended)
    resolved = incident(member("spike:loss", samples=SAMPLES), state="resolved")
    assert advise(s, AdviceConfig(), [resolved]) == ([], [])


def test_a_critical_spike_rewinds_to_the_checkpoint_before_its_onset():
    s = state(remedies=["rewind"], checkpoints=[(100, "/c/100"), (200, "/c/200"), (300, "/c/300")])
    warning = incident(member("spike:loss"), severity="warning")
    assert advise(s, AdviceConfig(), [warning]) == ([], [])  # a warning does not rewind
    critical = incident(member("spike:loss"), severity="critical")
    [adv], _ = advise(s, AdviceConfig(), [critical])  # it escalated: the same incident
    assert adv.data["checkpoint"] == "/c/200" and adv.data["checkpoint_step"] == 200
    assert adv.data["skip_batches"] == 250 - 200 + 200
    far = state(remedies=["rewind"], checkpoints=[(10, "/c/10")])
    cfg = AdviceConfig(rewind_max_skip=300)
    [adv], _ = advise(far, cfg, [critical])
    assert adv.data["skip_batches"] == 300  # capped


def test_no_checkpoint_before_the_onset_no_rewind():
    s = state(remedies=["rewind"], checkpoints=[(250, "/c/250"), (400, "/c/400")])
    assert advise(s, AdviceConfig(), [incident(member("nonfinite:loss"), severity="critical")]) == (
        [],
        [],
    )


def test_checkpoints_kept_are_the_latest_per_run_one_per_step():
    s = AdviceState()
    cfg = AdviceConfig(max_checkpoints=3)
    for step in (5, 1, 3, 4, 2, 4):
        keep_checkpoint(s, cfg, step, f"/c/{step}")
    keep_checkpoint(s, cfg, None, "/c/none")
    assert s.checkpoints == [[3, "/c/3"], [4, "/c/4"], [5, "/c/5"]]


def test_a_loss_grad_correlation_lowers_the_lr_when_it_comes_back():
    s = state(remedies=["lower_lr"])
    cfg = AdviceConfig(lr_factor=0.3, lower_lr_repeats=2, lower_lr_window=1000)
    corr = member("correlation:loss_grad")
    assert advise(s, cfg, [incident(corr, fp="a", started=100, step=100)]) == ([], [])
    [adv], _ = advise(s, cfg, [incident(corr, fp="b", started=600, step=600)])
    assert adv.data["lr_factor"] == 0.3 and adv.data["fingerprint"] == "b"
    # one that comes back long after: a first again
    s2 = state(remedies=["lower_lr"])
    advise(s2, cfg, [incident(corr, fp="a", started=100, step=100)])
    assert advise(s2, cfg, [incident(corr, fp="c", started=1500, step=1500)]) == ([], [])
    # an incident opening again counts as another time
    given, _ = advise(s2, cfg, [incident(corr, fp="c", started=1500, step=1600, episode=1)])
    assert actions(given) == ["lower_lr"]


def test_a_straggler_is_profiled_on_its_rank_low_utilisation_on_every_rank():
    s = state(remedies=["profile"])
    cfg = AdviceConfig(profile_s=12.0)
    [adv], _ = advise(s, cfg, [incident(member("straggler", rank=3), fp="s")])
    assert (adv.rank, adv.data["duration_s"]) == (3, 12.0)
    [adv], _ = advise(s, cfg, [incident(member("threshold:gpu_util"), fp="u")])
    assert adv.rank == RUN_RANK


def test_a_storm_is_limited_per_run_and_counted():
    s = state(remedies=["profile"])
    cfg = AdviceConfig(burst=2, refill_s=60.0)
    sent = []
    for i in range(5):  # five incidents in five seconds
        given, _ = advise(s, cfg, [incident(member("straggler"), fp=f"f{i}", t_s=100 + i)])
        sent += given
    assert len(sent) == 2 and (s.given, s.held) == (2, 3)
    given, _ = advise(s, cfg, [incident(member("straggler"), fp="late", t_s=100 + 5 + 60)])
    assert actions(given) == ["profile"]  # a minute later: one more


def test_the_advice_encodes_as_a_wire_record_and_refuses_what_the_schema_does():
    s = state(remedies=["skip_samples"])
    [adv], _ = advise(s, AdviceConfig(), [incident(member("spike:loss", samples=SAMPLES))])
    rec = decode(advice_bytes("r", adv))
    assert rec.kind == "advice" and rec.rank == RUN_RANK and rec.step == 250
    assert rec.data["sample_ids"] == ["doc-1", "doc-2"]
    bad = AdviceState()
    opt_in(bad, ["lower_lr"])
    [adv], _ = advise(
        bad,
        AdviceConfig(lr_factor=2.0, lower_lr_repeats=1),
        [incident(member("correlation:loss_grad"))],
    )
    try:
        advice_bytes("r", adv)
    except ValueError as exc:
        assert "lr_factor" in str(exc)
    else:
        raise AssertionError("an lr factor above 1 was encoded")


# ------------------------------------------------------------------ through the detector
def _t(i: int) -> int:
    return (i + 1) * 10**8


def test_the_detector_advises_from_records_and_keeps_its_state_across_a_restart():
    rng = random.Random(3)
    det = RunDetector("r")
    meta = {"world_size": 1, "remedies": ["skip_samples", "rewind"]}
    det.process(make_record("run_meta", meta, run_id="r", time_ns=_t(0)))
    given = []
    for i in range(300):
        if i == 200:
            det.process(make_record("checkpoint", {"path": "/ck/200"}, run_id="r", step=200))
        ids = [f"doc-{i}-{k}" for k in range(4)]
        data = {"n_samples": 4, "sample_ids": ids, "sample_hashes": [f"{i}-{k}" for k in ids]}
        det.process(make_record("batch", data, run_id="r", step=i, time_ns=_t(i)))
        loss = 60.0 if i == 250 else 3.0 * (1 - i / 4000) + rng.gauss(0, 0.01)
        rec = make_record(
            "step", {"loss": loss, "grad_norm": 1.0}, run_id="r", step=i, time_ns=_t(i)
        )
        _, alerts = det.process(rec)
        given += det.advise(alerts)[0]
    got = {a.action: a for a in given}
    assert got["skip_samples"].data["sample_ids"] == [f"doc-250-{k}" for k in range(4)]
    assert got["skip_samples"].data["onset_step"] == 250
    rewind = got["rewind"].data  # a loss spike this large is critical
    assert (rewind["checkpoint"], rewind["checkpoint_step"]) == ("/ck/200", 200)
    assert rewind["skip_batches"] == 250 - 200 + 200
    assert det.advice.checkpoints == [[200, "/ck/200"]]
    head, parts = det.dump(det.series)
    back = RunDetector.load(head, lambda r, _slot: parts.get(r))
    assert back is not None
    assert back.advice.remedies == ["skip_samples", "rewind"]
    assert back.advice.advised == det.advice.advised
    assert CODEC.unpack(CODEC.pack(det.advice)) == det.advice
