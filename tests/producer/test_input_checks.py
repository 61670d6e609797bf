"""Bad input from the caller or on the wire: refused with a reason, dropped and counted, never
raised into the training loop, and the rest of the step kept."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import pytest

from steplens.schema import DecodeError, Record, decode, encode, make_record


def _step_wire(**changes: Any) -> bytes:
    d = json.loads(encode(make_record("step", {"loss": 1.0}, run_id="r", step=1)))
    d.update(changes)
    return json.dumps(d).encode()


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        (_step_wire(step=2**70), "step", "<= 9223372036854775807"),
        (_step_wire(step=-1), "step", ">= 0"),
        (_step_wire(data={"scalars": {"": 1.0}}), "data.scalars", "name"),
        (_step_wire(data={"scalars": {"a\nb": 1.0}}), "data.scalars", "control"),
        (_step_wire(data={"scalars": {"x" * 300: 1.0}}), "data.scalars", "name"),
        (_step_wire(kind="eval", data={"split": "v", "extra": {"\t": 1.0}}), "data.extra", "name"),
    ],
)
def test_the_decoder_refuses_with_a_reason(raw: bytes, path: str, words: str) -> None:
    out = decode(raw)
    assert isinstance(out, DecodeError), out
    assert out.path.startswith(path) and words in out.reason, out


def test_a_batch_entry_with_a_negative_step_is_refused() -> None:
    d = json.loads(encode(make_record("step", {"loss": 1.0}, run_id="r", step=1)))
    d.update(kind="step_batch", data={"records": [{"step": -5, "time_ns": 1, "loss": 1.0}]})
    out = decode(json.dumps(d).encode())
    assert isinstance(out, DecodeError) and out.path == "data.records[0].step", out


def test_a_window_with_a_bad_metric_name_is_refused() -> None:
    stats = {"count": 1, "mean": 1.0, "min": 1.0, "max": 1.0, "last": 1.0, "nonfinite": 0}
    d = json.loads(encode(make_record("step", {"loss": 1.0}, run_id="r", step=1)))
    d.update(kind="step_window", data={"step_first": 1, "step_last": 1, "count": 1,
                                       "metrics": {"ok": stats, "": stats}})  # fmt: skip
    out = decode(json.dumps(d).encode())
    assert isinstance(out, DecodeError) and out.path.startswith("data.metrics"), out


def test_the_producer_drops_a_bad_name_and_keeps_the_step(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(sample_rate=1.0)
    m.log_step(1, loss=1.0, **{"": 1.0, "ok": 2.0, "a\nb": 3.0, "y" * 300: 4.0})
    m.log_step(-3, loss=1.0)  # a negative step: dropped and counted
    m.log_step(2**70, loss=1.0)
    m.log_step(2, loss=2.0)
    m.shutdown()
    steps = {r.step: r.data for r in tx.records("step")}
    assert set(steps) == {1, 2}
    assert steps[1]["loss"] == 1.0 and steps[1]["scalars"] == {"ok": 2.0}
    health = tx.records("health")[-1].data
    assert health["errors"]["bad_name"] == 3 and health["dropped"]["bad_step"] == 2
    windowed = {name for w in tx.records("step_window") for name in w.data["metrics"]}
    assert "ok" in windowed and "" not in windowed


def test_log_eval_validates_what_it_sends(memory_monitor, caplog) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor()
    m.log_eval("x", split=None)  # type: ignore[arg-type]
    m.log_eval(5, split=None, loss=1.0)  # type: ignore[arg-type]
    m.log_eval(-1, loss=1.0)
    m.log_eval(6, split="val", loss="bad", accuracy=0.5, **{"": 1.0, "em": 0.25})
    m.log_eval(7, split="x" * 5000, loss=1.0)
    m.shutdown()
    for _, raw in tx.messages:
        assert isinstance(decode(raw), Record)
    evals = {r.step: r.data for r in tx.records("eval")}
    assert set(evals) == {6}
    assert evals[6] == {"split": "val", "accuracy": 0.5, "extra": {"em": 0.25}}
    health = tx.records("health")[-1].data
    assert health["dropped"]["bad_eval"] == 4
    said = [r.getMessage() for r in caplog.records if "log_eval" in r.getMessage()]
    assert len(said) == 3, said  # one warning per reason: step, negative step, split


def test_bad_calls_warn_once_per_reason_then_count(memory_monitor, caplog) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(sample_rate=1.0)
    with caplog.at_level(logging.WARNING, logger="steplens"):
        for i in range(3):
            m.log_step(-1 - i, loss=1.0)  # a negative step
            m.log_step(10 + i, loss="x")  # a value that is not a number
            m.log_step(20 + i, **{"": 1.0})  # a name that is not valid
            m.log_eval(30 + i, split="val")  # no metric
        m.log_eval(40, split="val", loss="bad")  # no metric that is a number
        m.shutdown()
    said = [r.getMessage() for r in caplog.records if "counted in health" in r.getMessage()]
    assert len(said) == 4, said
    assert sum("log_step(-1" in x for x in said) == 1
    assert sum("no metric" in x for x in said) == 1
    assert not tx.records("eval")  # an eval without metrics is refused, not stored empty
    health = tx.records("health")[-1].data
    assert health["dropped"]["bad_eval"] == 4 and health["dropped"]["bad_step"] == 3
    assert health["errors"]["bad_value"] == 4 and health["errors"]["bad_name"] == 3


def test_bad_values_in_every_call_never_raise(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor()
    m.log_batch("x", object())  # type: ignore[arg-type]
    m.log_batch(-2, [[1, 2]])
    m.log_eval(math.nan, loss=1.0)  # type: ignore[arg-type]
    m.shutdown()
    for _, raw in tx.messages:
        assert isinstance(decode(raw), Record)
    assert not tx.records("batch") and not tx.records("eval")
