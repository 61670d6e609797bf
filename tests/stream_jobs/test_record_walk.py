"""The way of a record through the engine, walked call by call: the detector routes it and
hands it once to each stage, in order; no stage calls back into the detector or into
another stage.

A stay is a stage's time from the detector's hand-off until it returns (what it calls
meanwhile, its helpers and the pure signal modules, is part of its stay); a climb is a call
from a stage into the detector or into another stage's module; a return to a room left is a
stay in a stage after a later stage's stay. Stages, in their order (``detector``'s
docstring): a rank's own signals or a record kind's detectors, those judged across ranks,
the 7-day baselines, the marks, the evidence, the rules, the incidents, the advice.
"""

from __future__ import annotations

import math
import random
import sys
import types
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest

from steplens.schema import Record, make_record
from steplens.stream_jobs.engine import marks
from steplens.stream_jobs.engine.detector import RunDetector

ENGINE = "steplens.stream_jobs.engine."
ROUTER = ENGINE + "detector"
# module -> its stage's place in the order; the record detectors share the first place
STAGES = {
    "rank_signals": 0,
    "step_tail": 1,
    "signals.dynamic_baseline": 2,
    "marks": 3,
    "evidence": 4,
    "batch_rules": 5,
    "rules": 5,
    "incidents": 6,
    "advice": 7,
}
RECORD_DETECTORS = ENGINE + "signals."


def stage_of(module: str) -> int | None:
    """The place of the stage a module is, handed a record by the detector; None for the
    detector's own helpers."""
    name = module.removeprefix(ENGINE)
    if name in STAGES:
        return STAGES[name]
    if module.startswith(RECORD_DETECTORS) or name == "signals":
        return 0
    return None


@dataclass
class Walk:
    stays: list[str] = field(default_factory=list)  # each hand-off's stage module, merged
    climbs: list[str] = field(default_factory=list)
    rooms: set[str] = field(default_factory=set)  # every engine module the record went through

    @property
    def returns(self) -> list[str]:
        """Stays in a stage after a later stage's stay."""
        out, latest = [], -1
        for module in self.stays:
            place = stage_of(ENGINE + module)
            assert place is not None
            if place < latest:
                out.append(module)
            latest = max(latest, place)
        return out


def _module(frame: FrameType | None) -> str:
    return frame.f_globals.get("__name__", "") if frame is not None else ""


def walk(det: RunDetector, rec: Record) -> tuple[Walk, Any]:
    w = Walk()

    def on_call(frame: FrameType, event: str, _arg: object) -> None:
        if event != "call":
            return
        module = _module(frame)
        if not module.startswith(ENGINE):
            return
        w.rooms.add(module.removeprefix(ENGINE))
        caller = frame.f_back
        if _module(caller) == ROUTER:
            if module != ROUTER and stage_of(module) is not None:
                # a record kind's detectors (the registry's ``on_record``) are one stage
                name = "signals" if frame.f_code.co_name == "on_record" else module
                name = name.removeprefix(ENGINE)
                if not w.stays or w.stays[-1] != name:
                    w.stays.append(name)
            return
        # inside a stay: the stage handed the record by the detector, below it on the stack
        handed: FrameType | None = None
        f = caller
        while f is not None and _module(f) != ROUTER:
            handed, f = f, f.f_back
        if f is None or handed is None:
            return
        stay = _module(handed).removeprefix(ENGINE)
        name = module.removeprefix(ENGINE)
        # a signal module is a helper inside a stay; the other stages' modules are not
        other_stage = name in STAGES and name != stay and STAGES[name] != STAGES.get(stay)
        if module == ROUTER or other_stage:
            w.climbs.append(f"{stay} -> {name}.{frame.f_code.co_name}")

    sys.setprofile(on_call)
    try:
        out = det.process(rec)
    finally:
        sys.setprofile(None)
    return w, out


def _step(rank: int, i: int, **data: float) -> Record:
    return make_record("step", data, run_id="r", rank=rank, step=i, time_ns=i * 10**9)


def _warm_run() -> RunDetector:
    rng = random.Random(0)
    det = RunDetector("r")
    meta = {"world_size": 4, "remedies": ["rewind"]}
    det.process(make_record("run_meta", meta, run_id="r"))
    for i in range(100):
        for rank in range(4):
            det.process(
                _step(
                    rank,
                    i,
                    loss=2.0 + rng.gauss(0, 0.01),
                    grad_norm=1.0 + rng.gauss(0, 0.01),
                    step_time_s=0.1 + rng.gauss(0, 0.002),
                )
            )
    return det


def _window(step: int, loss_max: float) -> Record:
    def stats(mean: float, top: float) -> dict[str, float]:
        return {"count": 10, "mean": mean, "min": mean - 0.1, "max": top, "last": mean}

    data = {
        "step_first": step - 9,
        "step_last": step,
        "count": 10,
        "metrics": {"loss": stats(2.0, loss_max), "step_time_s": stats(0.1, 0.11)},
    }
    return make_record("step_window", data, run_id="r", rank=1, step=step, time_ns=step * 10**9)


def _batch(first: int, loss: float) -> Record:
    entries = [
        {"step": i, "time_ns": i * 10**9, "loss": loss if i == first + 3 else 2.0,
         "step_time_s": 0.1}
        for i in range(first, first + 5)
    ]  # fmt: skip
    return make_record(
        "step_batch", {"records": entries}, run_id="r", rank=2, step=first + 4,
        time_ns=(first + 4) * 10**9,
    )  # fmt: skip


def _hw(step: int) -> Record:
    gpu = {"index": 0, "util_pct": 97.0, "mem_used_bytes": 6e10, "mem_total_bytes": 8e10,
           "temp_c": 70.0, "ecc_dbe": 2, "xid": 1, "xid_last": 48}  # fmt: skip
    return make_record("hw", {"gpus": [gpu]}, run_id="r", rank=0, step=step, time_ns=step * 10**9)


CASES = {
    "a step whose loss spikes": lambda: _step(0, 100, loss=40.0, grad_norm=1.0, step_time_s=0.1),
    "a step whose loss is not finite": lambda: _step(3, 100, loss=math.nan, step_time_s=0.1),
    "a straggler's step": lambda: _step(1, 100, loss=2.0, step_time_s=0.9),
    "a window with a loss peak": lambda: _window(109, 60.0),
    "a batch of steps with a spike": lambda: _batch(101, 50.0),
    "a hardware sample with ECC and XID errors": lambda: _hw(100),
    "a checkpoint": lambda: make_record(
        "checkpoint", {"path": "/ckpt/100"}, run_id="r", rank=0, step=100, time_ns=10**11
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_record_is_handed_once_to_each_stage_in_order(case: str) -> None:
    det = _warm_run()
    w, _ = walk(det, CASES[case]())
    assert w.stays, "the record reached no stage"
    assert w.climbs == [], w.climbs
    assert w.returns == [], w.stays


def test_the_walk_sees_what_it_is_meant_to_see() -> None:
    """The walk of a spike: the stages a step goes through, an alert out of it; and a
    detector that called back would be seen."""
    det = _warm_run()
    w, (_signals, alerts) = walk(det, CASES["a step whose loss spikes"]())
    assert [a.rule for a in alerts if a.state == "firing"] == ["spike:loss"]
    assert w.stays[0] == "rank_signals"
    assert {"step_tail", "batch_rules", "incidents"} <= set(w.stays)
    assert stage_of(ENGINE + "signals.spike") == 0

    backwards = Walk(stays=["rank_signals", "incidents", "batch_rules"])
    assert backwards.returns == ["batch_rules"]


def test_a_stage_that_calls_back_is_a_climb(monkeypatch: pytest.MonkeyPatch) -> None:
    det = _warm_run()

    def mark(batch: object, n: int, firsts: object, mark: object) -> None:
        assert det.ranks is not None  # a stage reading the detector back

    # the same code as the marks module's own (its globals): a stay in that stage
    in_marks = types.FunctionType(mark.__code__, vars(marks), "mark", None, mark.__closure__)
    monkeypatch.setattr(marks, "mark", in_marks)
    w, _ = walk(det, CASES["a step whose loss spikes"]())
    assert w.climbs == ["marks -> detector.ranks"]


if __name__ == "__main__":  # the walks, for reading
    for case in sorted(CASES):
        w, _ = walk(_warm_run(), CASES[case]())
        print(
            f"{case}: {len(w.stays)} stays ({' -> '.join(w.stays)}), {len(w.rooms)} rooms, "
            f"{len(w.climbs)} climbs, {len(w.returns)} returns"
        )
