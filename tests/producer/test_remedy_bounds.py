"""What a rank does with advice, whatever the advice says: shared advice waits for its
``at_step`` (or is counted late), and the bounds of issue 38 hold (the lr floor, the skip cap,
rewinds per hour, the rate limit), on a real (tiny) model on the CPU."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from tests.producer.test_remedies import ALL, _Advice
from tests.waiting import wait_until

from steplens.schema import RUN_RANK, encode, make_record

torch = pytest.importorskip("torch")
from tests.producer.tiny_lm import TinyLM, clean_rows  # noqa: E402 - after the torch check


def sgd(lr: float = 0.1) -> tuple[Any, Any, Any]:
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, opt, sched


def lower(fp: str, **data: Any) -> _Advice:
    return _Advice("lower_lr", fp, **{"lr_factor": 0.5, **data})


# ---------------------------------------------------------------------- at_step
def test_shared_advice_waits_for_its_step_and_a_late_one_is_counted(memory_monitor):
    m, _ = memory_monitor(remedies=ALL, lr_floor=0.01)
    _, opt, _ = sgd(1.0)
    r = m.remedies
    lrs = []
    for step in range(8):
        got = [lower("on-time", at_step=4)] if step == 1 else []
        got += [lower("late", at_step=3)] if step == 6 else []
        r.act(step, advice=got, optimizer=opt)
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == [1.0] * 4 + [0.5] * 2 + [0.25] * 2  # at the end of 4; the late one at 6
    details = {a[1]: a[3] for a in r.answers}
    assert details["on-time"] == "lr x0.5 from step 5: 1 -> 0.5"
    assert details["late"] == "lr x0.5 from step 7: 0.5 -> 0.25; 3 steps after the agreed step 3"
    # without at_step (older stream jobs): at once, counted the same way
    r.act(8, advice=[lower("unagreed")], optimizer=opt)
    assert "names no step for every rank (at_step)" in r.answers[-1][3]
    # advice for this rank alone needs no agreement
    r.act(9, advice=[lower("mine", rank=0)], optimizer=opt)
    assert r.answers[-1][3] == "lr x0.5 from step 10: 0.125 -> 0.0625"
    assert r.counts == {"late": 1, "no_at_step": 1}
    assert m._caller_counters()[1] == {"remedy_late": 1, "remedy_no_at_step": 1}


def test_a_rewind_under_a_loader_that_reads_ahead_reloads_at_its_step(memory_monitor):
    m, _ = memory_monitor(remedies=["rewind"])
    r = m.remedies
    r.read_ahead = 1  # the Trainers' loaders: one batch read ahead
    loader = m.skipping(range(100))
    m.checkpoint(5, "/ckpt/5")
    loaded: list[str] = []
    rewind = _Advice("rewind", "r", checkpoint="/ckpt/5", skip_batches=2, at_step=10)
    batches = iter(loader)
    ahead = next(batches)
    seen, rewound = [], []
    for step in range(14):
        batch, ahead = ahead, next(batches)  # the loader reads one batch ahead
        seen.append(batch)
        back = m.act(step, advice=[rewind] if step == 3 else [], load=loaded.append)
        if back != step:
            rewound.append((step, back))
    assert loaded == ["/ckpt/5"] and rewound == [(10, 5)]  # at the end of step 10: on time
    assert r.answers[-1][3].endswith("at step 10; skipped the 2 batches after")
    # the batch read ahead at step 9 (10) was trained on, then the 2 after it skipped
    assert seen[9:13] == [9, 10, 13, 14]
    assert r.counts == {}


# ---------------------------------------------------------------------- lr floor
def test_a_vanishing_lr_factor_is_held_at_the_floor_and_then_refused(memory_monitor, caplog):
    m, t = memory_monitor(remedies=ALL, lr_schedule={"kind": "constant", "peak_lr": 0.1})
    _, opt, sched = sgd(0.1)
    r = m.remedies
    with caplog.at_level(logging.WARNING, logger="steplens"):
        r.act(
            3, advice=[lower("tiny", lr_factor=5e-324, at_step=3)], optimizer=opt, scheduler=sched
        )
        assert opt.param_groups[0]["lr"] == pytest.approx(0.01)  # 0.1 of the schedule's, not 0
        assert sched.base_lrs == [pytest.approx(0.01)]
        assert "held at its floor" in r.answers[-1][3]
        for i in range(5):
            r.act(4 + i, advice=[lower(f"more-{i}", at_step=4 + i)], optimizer=opt)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    assert [a[2] for a in r.answers[-5:]] == ["refused"] * 5
    assert "the lr is at its floor: 0.1" in r.answers[-1][3]
    assert r.counts == {"lr_floor_held": 1, "lr_floor": 5}
    said = [rec for rec in caplog.records if "at its floor" in rec.getMessage()]
    assert len(said) == 1  # logged once, answered each time
    m.flush(5)
    scale = t.records("run_meta")[-1].data["lr_schedule"]["lr_scale"]
    assert scale == [[4, pytest.approx(0.1)]]  # the declared schedule follows the lr held


def test_a_flood_of_new_fingerprints_cannot_take_the_lr_below_its_floor(memory_monitor):
    """Issue 38: 3,000 x0.5 messages with new fingerprints took the lr from 0.1 to 6e-233."""
    m, t = memory_monitor(remedies=ALL)
    model, opt, _ = sgd(0.1)
    key = m.run_id.encode()
    for i in range(3000):
        rec = make_record(
            "advice",
            {"action": "lower_lr", "fingerprint": f"flood-{i}", "lr_factor": 0.5, "at_step": 2},
            run_id=m.run_id,
            rank=RUN_RANK,
            step=1,
            time_ns=time.time_ns(),
        )
        t.advise(encode(rec), key=key)
    done = wait_until(lambda: sum((m.stats()["advice"] or {}).values()) >= 2996, timeout_s=30)
    assert done, m.stats()["advice"]
    gen = torch.Generator().manual_seed(0)
    for step in range(6):
        loss = model(clean_rows(8, gen))["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        m.act(step, optimizer=opt)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3 * 0.8)  # 3 halvings, then held
    assert opt.param_groups[0]["lr"] >= 0.01 - 1e-12
    assert m.stats()["advice"]["rate_limited"] > 0  # the rest: refused, whatever the reason
    assert [a[2] for a in m.remedies.answers] == ["acted"] * 4
    m.flush(5)
    acted = t.records("acted")
    assert len(acted) < 100  # refusals answered at a bounded rate, the rest counted


# ---------------------------------------------------------------------- rewinds
def test_a_rewind_skipping_a_billion_batches_is_refused_and_training_goes_on(memory_monitor):
    """Issue 38: such a rewind emptied the loader; training stopped silently."""
    m, _ = memory_monitor(remedies=["rewind"])
    model, opt, _ = sgd()
    m.watch(model, opt, every=100)
    loader = m.skipping(range(50))
    m.checkpoint(0, "/ckpt/0")
    hostile = _Advice("rewind", "h", checkpoint="/ckpt/0", skip_batches=10**9, at_step=3)
    trained = 0
    for step, _batch in enumerate(loader):
        m.act(step, advice=[hostile] if step == 3 else [], load=lambda p: None)
        trained += 1
    assert trained == 50
    assert m.remedies.answers[-1][2:4] == (
        "refused",
        "skip_batches 1000000000 is past the cap of 500 (max_skip_batches)",
    )
    m.flush(5)
    assert m._caller_counters()[0] == {"remedy_skip_cap": 1}


def test_at_most_n_rewinds_an_hour_by_the_advices_time(memory_monitor):
    m, _ = memory_monitor(remedies=["rewind"], max_rewinds_per_hour=2)
    loaded: list[str] = []
    t0 = time.time_ns() - 10 * 3600 * 10**9
    hour = 3600 * 10**9
    for k, at in enumerate((0, hour // 2, hour - 1, hour + hour // 4)):
        m.checkpoint(10 * k, f"/ckpt/{k}")
        adv = _Advice("rewind", f"r{k}", checkpoint=f"/ckpt/{k}", at_step=10 * k + 5)
        adv.time_ns = adv.received_ns = t0 + at  # type: ignore[attr-defined]
        m.act(10 * k + 5, advice=[adv], load=loaded.append)
    assert loaded == ["/ckpt/0", "/ckpt/1", "/ckpt/3"]  # the third within the hour: refused
    third = next(a for a in m.remedies.answers if a[1] == "r2")
    assert third[2] == "refused" and "(max_rewinds_per_hour)" in third[3]


# ---------------------------------------------------------------------- answers
def test_a_decline_names_its_step_never_none(memory_monitor, caplog):
    m, t = memory_monitor(remedies=["rewind"])
    with caplog.at_level(logging.WARNING, logger="steplens"):
        m.act(7, advice=[_Advice("rewind", "fp-x", at_step=7)])
    [line] = [r.getMessage() for r in caplog.records if "fp-x" in r.getMessage()]
    assert line == (
        "steplens: rewind declined at step 7 (incident fp-x): the advice names no checkpoint"
    )
    m.flush(5)
    [rec] = t.records("acted")
    assert rec.step == 7


def test_act_with_nothing_pending_touches_nothing(memory_monitor):
    """The loop's common case: no advice, nothing held: ``act`` returns the step and makes
    no targets (no watched model read, no collective)."""
    m, _ = memory_monitor(remedies=ALL)
    r = m.remedies
    r.handle = None  # type: ignore[assignment,method-assign] - it must not be reached
    for step in range(100):
        assert m.act(step) == step
    assert m.counts.caller == 0
