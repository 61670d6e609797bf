"""From incident to action (``engine.advice``): which incident reports advise skipping samples
or a profile, only for a run that opted in, once per incident and action, with a storm limited
per run. The shared remedies (rewind, lower_lr) are in ``test_advice_remedies.py``."""

from __future__ import annotations

from steplens.schema import RUN_RANK, decode
from steplens.stream_jobs.engine.advice import (
    AdviceConfig,
    AdviceState,
    advise,
    keep_checkpoint,
    opt_in,
)
from steplens.stream_jobs.engine.core import Alert
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
        "steps_lost": 0,
        "batches_skipped": 0,
        "evidence": "2 samples of the batch at step 250 (spike:loss); nothing undone, "
        "no batch skipped",
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


def test_checkpoints_kept_are_the_latest_per_run_one_per_step():
    s = AdviceState()
    cfg = AdviceConfig(max_checkpoints=3)
    for step in (5, 1, 3, 4, 2, 4):
        keep_checkpoint(s, cfg, step, f"/c/{step}")
    keep_checkpoint(s, cfg, None, "/c/none")
    assert s.checkpoints == [[3, "/c/3"], [4, "/c/4"], [5, "/c/5"]]


def test_a_straggler_is_profiled_on_its_rank_low_utilisation_on_every_rank():
    s = state(remedies=["profile"])
    cfg = AdviceConfig(profile_s=12.0)
    [adv], _ = advise(s, cfg, [incident(member("straggler:step_time_s", rank=3), fp="s")])
    assert (adv.rank, adv.data["duration_s"]) == (3, 12.0)
    [adv], _ = advise(s, cfg, [incident(member("straggler:data_wait_share", rank=5), fp="d")])
    assert adv.rank == 5
    [adv], _ = advise(s, cfg, [incident(member("threshold:gpu_util"), fp="u")])
    assert adv.rank == RUN_RANK


def test_a_storm_is_limited_per_run_and_counted():
    s = state(remedies=["profile"])
    cfg = AdviceConfig(burst=2, refill_s=60.0)
    sent = []
    for i in range(5):  # five incidents in five seconds
        slow = incident(member("straggler:step_time_s"), fp=f"f{i}", t_s=100 + i)
        given, _ = advise(s, cfg, [slow])
        sent += given
    assert len(sent) == 2 and (s.given, s.held) == (2, 3)
    late = incident(member("straggler:step_time_s"), fp="late", t_s=100 + 5 + 60)
    given, _ = advise(s, cfg, [late])
    assert actions(given) == ["profile"]  # a minute later: one more


def test_the_advice_encodes_as_a_wire_record_and_refuses_what_the_schema_does():
    s = state(remedies=["skip_samples"])
    [adv], _ = advise(s, AdviceConfig(), [incident(member("spike:loss", samples=SAMPLES))])
    rec = decode(advice_bytes("r", adv))
    assert rec.kind == "advice" and rec.rank == RUN_RANK and rec.step == 250
    assert rec.data["sample_ids"] == ["doc-1", "doc-2"]
    bad = AdviceState()
    opt_in(bad, ["skip_samples"])
    long_ids = {**SAMPLES, "ids": ["x" * 10_000]}
    [adv], _ = advise(bad, AdviceConfig(), [incident(member("spike:loss", samples=long_ids))])
    try:
        advice_bytes("r", adv)
    except ValueError as exc:
        assert "sample_ids" in str(exc)
    else:
        raise AssertionError("a sample id past the schema's length was encoded")
