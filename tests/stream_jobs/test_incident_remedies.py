"""The advice given for an incident and the ranks' answers travel in its reports: the report
that opened it carries the advice, advice decided on later steps reports it again, and so does
an answer that is news."""

from __future__ import annotations

import random

from steplens.schema import make_record
from steplens.stream_jobs.engine.detector import RunDetector


def _t(i: int) -> int:
    return (i + 1) * 10**8


def _spiked_run() -> tuple[RunDetector, list, list]:
    """A 2-rank run that opted into skipping samples and rewinding, a checkpoint at step 200
    and a loss spike at 250 after which the loss stays 50 % up: (the detector, the advice
    given, the incident reports that carried advice given at their step)."""
    rng = random.Random(3)
    det = RunDetector("r")
    meta = {"world_size": 2, "remedies": ["skip_samples", "rewind"]}
    det.process(make_record("run_meta", meta, run_id="r", time_ns=_t(0)))
    given, reports = [], []
    for i in range(330):
        if i == 200:
            det.process(make_record("checkpoint", {"path": "/ck/200"}, run_id="r", step=200))
        ids = [f"doc-{i}-{k}" for k in range(4)]
        data = {"n_samples": 4, "sample_ids": ids}
        det.process(make_record("batch", data, run_id="r", step=i, time_ns=_t(i)))
        loss = 3.0 * (1 - i / 4000) + rng.gauss(0, 0.01)
        loss = 60.0 if i == 250 else 1.5 * loss if 250 < i < 320 else loss
        rec = make_record(
            "step", {"loss": loss, "grad_norm": 1.0}, run_id="r", step=i, time_ns=_t(i)
        )
        _, alerts = det.process(rec)
        now, _, out = det.advise(alerts, _t(i))
        given += now
        if now:
            reports += [a for a in out if a.scope == "incident"]
    return det, given, reports


def _acted(det: RunDetector, rank: int, fp: str, action: str, outcome: str, detail: str = ""):
    data = {"action": action, "fingerprint": fp, "outcome": outcome}
    if detail:
        data["detail"] = detail
    rec = make_record("acted", data, run_id="r", rank=rank, step=260, time_ns=_t(400 + rank))
    return det.process(rec)[1]


def test_the_reports_that_advised_carry_the_advice_its_cost_and_evidence():
    _, given, reports = _spiked_run()
    assert [a.action for a in given] == ["skip_samples", "rewind"]
    first, then = reports  # the report that opened it; the one the rewind's step reported
    assert first.step == 250 and [r["action"] for r in first.evidence["remedies"]] == [
        "skip_samples"
    ]
    assert then.fingerprint == first.fingerprint and then.step == given[1].step > 250
    skip, rewind = then.evidence["remedies"]
    assert skip["n_samples"] == 4 and skip["rank"] == -1 and skip["answers"] == []
    assert (skip["steps_lost"], skip["batches_skipped"]) == (0, 0)
    assert "4 samples" in skip["evidence"]
    assert (rewind["checkpoint"], rewind["checkpoint_step"]) == ("/ck/200", 200)
    assert rewind["at_step"] > then.step and rewind["steps_lost"] == rewind["at_step"] - 200
    assert rewind["skip_batches"] == rewind["batches_skipped"] == 100
    assert "vs trend" in rewind["evidence"] and "held" not in rewind
    assert "answered" not in rewind  # the ranks that answered stay in the worker's state


def test_an_answer_reports_the_incident_again_when_it_is_news():
    det, given, _ = _spiked_run()
    fp = given[0].data["fingerprint"]
    (again,) = _acted(det, 0, fp, "rewind", "acted", "reloaded /ck/200")
    assert again.fingerprint == fp and again.scope == "incident"
    assert again.state == "resolved"  # the loss came back at 320: reported in its state
    rewind = again.evidence["remedies"][1]
    assert rewind["answers"] == [
        {"outcome": "acted", "n": 1, "ranks": [0], "details": ["reloaded /ck/200"]}
    ]
    assert _acted(det, 0, fp, "rewind", "acted", "reloaded /ck/200") == []  # a repeat
    (last,) = _acted(det, 1, fp, "rewind", "acted", "reloaded /ck/200")  # the last rank's
    assert last.evidence["remedies"][1]["answers"][0] == {
        "outcome": "acted",
        "n": 2,
        "ranks": [0, 1],
        "details": ["reloaded /ck/200"],
    }
    (declined,) = _acted(det, 1, fp, "skip_samples", "declined", "no sampler")  # a new outcome
    assert declined.evidence["remedies"][0]["answers"][0]["outcome"] == "declined"
    assert _acted(det, 0, "no-such-incident", "rewind", "acted") == []
    head, parts = det.dump(det.series)
    back = RunDetector.load(head, lambda r, _slot: parts.get(r))
    assert back is not None

    def remedies(d: RunDetector) -> list:  # the spike's incident may have resolved by now
        inc = d.incidents.open.get(fp) or d.incidents.closed.get(fp)
        assert inc is not None
        return inc.remedies

    assert remedies(back) == remedies(det)
