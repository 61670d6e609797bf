"""The ``profile`` remedy, on by default: advice for a slow rank yields one bounded trace per
incident, taken at ``log_step`` without ``sl.act()``, in a real (tiny) CPU training loop."""

from __future__ import annotations

import gzip
import json
import os
import time
from typing import Any

import pytest
from tests.waiting import wait_until

from steplens.producer.config import ProducerConfig
from steplens.producer.remedies.rank_profile import MAX_STEPS
from steplens.producer.remedies.trace_upload import trace_key
from steplens.schema import RUN_RANK, encode, make_record

torch = pytest.importorskip("torch")
from tests.producer.tiny_lm import TinyLM, clean_rows  # noqa: E402 - after the torch check


def advise(m: Any, t: Any, step: int, **data: Any) -> None:
    """Publish advice for the Monitor's run and wait until its worker has taken it."""
    rec = make_record(
        "advice", data, run_id=m.run_id, rank=RUN_RANK, step=step, time_ns=time.time_ns()
    )
    before = taken(m)
    t.advise(encode(rec), key=m.run_id.encode())
    assert wait_until(lambda: taken(m) > before, timeout_s=10), m.stats()["advice"]


def taken(m: Any) -> int:
    """Advice messages the Monitor's worker took: queued, or kept out (a duplicate)."""
    stats = m.stats()
    return stats["advice_received"] + sum((stats["advice"] or {}).values())


def train(m: Any, steps: int, until: Any = None) -> int:
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        loss = model(clean_rows(16, gen))["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        m.log_step(step, loss=loss.detach())  # no act(): log_step carries the trace out
        if until is not None and until():
            return step
    return steps


def test_profile_is_on_by_default_and_turned_off_by_either_setting(monkeypatch):
    assert ProducerConfig.resolve().remedies == ["profile"]
    assert ProducerConfig.resolve(remedies=[]).remedies == []
    assert ProducerConfig.resolve(profile=False, remedies=["profile", "rewind"]).remedies == [
        "rewind"
    ]
    monkeypatch.setenv("STEPLENS_PROFILE", "0")
    assert ProducerConfig.resolve().remedies == []


def test_trace_key_names_run_fingerprint_and_rank():
    key = trace_key("/cold/", "run-1", 3, "straggler/abc")
    assert key == "cold/traces/run_id=run-1/straggler_abc-rank3.json.gz"
    assert trace_key("", "r", 0, "f") == "traces/run_id=r/f-rank0.json.gz"


def test_no_consumer_when_the_run_turns_profile_off(memory_monitor):
    m, _ = memory_monitor(remedies=[])
    assert m._pipeline.advice is None
    m, _ = memory_monitor(profile=False)
    assert m._pipeline.advice is None
    m, _ = memory_monitor()
    assert m._pipeline.advice is not None


@pytest.mark.slow
def test_one_bounded_trace_per_incident_without_act(memory_monitor, tmp_path, monkeypatch):
    monkeypatch.delenv("STEPLENS_S3_BUCKET", raising=False)  # kept local
    m, t = memory_monitor()  # the default remedies: profile only
    traces = tmp_path / "traces"
    m.remedies.profile_dir = str(traces)
    advise(m, t, 0, action="profile", fingerprint="slow-rank-1", duration_s=30.0)
    advise(m, t, 0, action="profile", fingerprint="slow-rank-1", duration_s=30.0)  # again
    train(m, 400, until=lambda: len(m.remedies.answers) >= 1)
    assert wait_until(lambda: m.remedies.answers, timeout_s=20)
    # the same incident advised again, later: no second trace
    advise(m, t, 0, action="profile", fingerprint="slow-rank-1", duration_s=30.0)
    train(m, 30)
    m.remedies.close()
    assert len(m.remedies.answers) == 1, m.remedies.answers
    action, fp, outcome, detail, _ = m.remedies.answers[0]
    assert (action, fp, outcome) == ("profile", "slow-rank-1", "acted")
    path = detail.split("trace ")[1].split(":")[0]
    assert path.startswith(str(traces)) and path.endswith(".json.gz")
    assert [p.name for p in traces.iterdir()] == [os.path.basename(path)]
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    assert any("aten::" in e.get("name", "") for e in trace["traceEvents"])
    # bounded in steps: stopped at MAX_STEPS although 30 s were asked
    steps = int(detail.split(": ")[1].split(" steps")[0])
    assert steps == MAX_STEPS
    m.flush(5)
    got = [r.data for r in t.records("acted")]
    assert [(g["action"], g["outcome"]) for g in got] == [("profile", "acted")]
    assert got[0]["detail"] == detail
    assert not m._due and m._plain_path  # back on the short path
