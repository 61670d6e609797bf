"""The remedies carried out on the rank, in real (tiny) training loops on the CPU: each run
with the remedy against the same run from the same seed without it."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.waiting import wait_until

from steplens.producer.pipeline.batch_stats import batch_payload
from steplens.producer.remedies.carry_out import Remedies
from steplens.producer.remedies.skipping import SkipList, Skipping
from steplens.schema import RUN_RANK, encode, make_record

torch = pytest.importorskip("torch")
from tests.producer.tiny_lm import (  # noqa: E402 - after the torch check
    Samples,
    TinyLM,
    clean_rows,
    corrupted_rows,
    eval_loss,
)

ALL = ["skip_samples", "rewind", "lower_lr", "profile"]


def advise(m: Any, t: Any, step: int, **data: Any) -> None:
    """Publish advice for the Monitor's run and wait until its worker has queued it."""
    rec = make_record(
        "advice", data, run_id=m.run_id, rank=RUN_RANK, step=step, time_ns=time.time_ns()
    )
    before = m.stats()["advice_received"]
    t.advise(encode(rec), key=m.run_id.encode())
    got = wait_until(lambda: m.stats()["advice_received"] > before, timeout_s=10)
    assert got, m.stats()["advice"]


def acted(t: Any, m: Any) -> dict[str, Any]:
    m.flush(5)
    return {r.data["action"]: r for r in t.records("acted")}


def back_on_trend(losses: list[float], onset: int, pre: float) -> int:
    """Iterations after ``onset`` until the eval loss is back within twice its level before
    the incident (plus 0.01) for good."""
    limit = 2 * pre + 0.01
    k = len(losses)
    while k > onset and losses[k - 1] <= limit:
        k -= 1
    return k - onset


# ---------------------------------------------------------------------- skipping, unit
def test_skipping_drops_named_ids_and_hashed_rows_from_batches_and_samplers():
    skips = SkipList()
    ds = Samples(16, {3, 9})
    loader = Skipping(torch.utils.data.DataLoader(ds, batch_size=4), skips)
    assert len(loader) == 4
    assert sum(len(b["input_ids"]) for b in loader) == 16  # nothing named: untouched
    # a hash as the batch record carries it: the worker names the rows by it
    hashes = batch_payload(ds.rows[[9]])[0]["sample_hashes"]
    skips.add(ids=["3"], hashes=hashes)
    seen = [i for b in loader for i in b["sample_id"].tolist()]
    assert seen == [i for i in range(16) if i not in (3, 9)]
    for b in loader:  # every per-row field keeps the same rows
        assert len(b["input_ids"]) == len(b["sample_id"])
    assert loader.dropped_rows == 4
    sampler = Skipping(range(8), skips)
    assert list(sampler) == [0, 1, 2, 4, 5, 6, 7]
    batches = Skipping([[0, 1], [3], [3, 4]], skips)
    assert list(batches) == [[0, 1], [4]]


def test_skip_next_drops_a_rewinds_batches_and_the_lists_are_bounded():
    skips = SkipList(max_ids=3)
    assert skips.add(ids=["a", "b", "a"], hashes=["h1", "h2"]) == 4
    assert skips.add(ids=["c", "d", "e"]) == 1
    assert skips.overflow == 2 and skips.ids == {"a", "b", "c"}
    w = Skipping(range(10), SkipList())
    it = iter(w)
    assert [next(it), next(it)] == [0, 1]
    w.skip_next(3)
    assert list(it) == [5, 6, 7, 8, 9] and w.skipped_items == 3


def test_a_batch_on_a_device_or_unreadable_is_passed_through_and_counted():
    skips = SkipList()
    skips.add(hashes=["0123456789abcdef"])
    w = Skipping([{"pixels": np.zeros((2, 3), dtype=np.float32)}], skips)
    assert len(list(w)) == 1 and w.unreadable == 1


# ---------------------------------------------------------------------- outcomes
def test_outcomes_refused_declined_failed_and_once_per_fingerprint(memory_monitor, tmp_path):
    m, t = memory_monitor(remedies=["rewind", "skip_samples", "lower_lr"])
    m.log_step(0, loss=1.0)
    bogus = tmp_path / "gone.pt"
    m.checkpoint(0, str(bogus))  # reported, then lost
    advise(m, t, 1, action="skip_samples", fingerprint="f1", sample_ids=["7"])  # no skipping()
    advise(m, t, 1, action="rewind", fingerprint="f2", checkpoint="/etc/passwd")
    advise(m, t, 1, action="rewind", fingerprint="f3", checkpoint=str(bogus), checkpoint_step=0)
    advise(m, t, 1, action="lower_lr", fingerprint="f4", lr_factor=0.5)  # no optimizer
    assert m.act(1, model=TinyLM()) == 1
    m.flush(5)
    got = {r.data["fingerprint"]: r.data for r in t.records("acted")}
    assert got["f1"]["outcome"] == "declined" and "skipping()" in got["f1"]["detail"]
    assert (
        got["f2"]["outcome"] == "declined"
        and "not a checkpoint this run reported" in (got["f2"]["detail"])
    )
    assert got["f3"]["outcome"] == "failed" and "no checkpoint at" in got["f3"]["detail"]
    assert got["f4"]["outcome"] == "declined" and "optimizer" in got["f4"]["detail"]
    # the same pair again is not carried out twice, even handed over directly
    r = m.remedies
    again = [a for a in r.answers if a[1] == "f3"]
    r.act(2, advice=[_Advice("rewind", "f3", checkpoint=str(bogus))])
    assert [a for a in r.answers if a[1] == "f3"] == again
    # an action the run did not opt into
    r.act(2, advice=[_Advice("profile", "f5")])
    assert r.answers[-1][:3] == ("profile", "f5", "refused")


class _Advice:
    """Advice handed to ``Remedies.act`` directly (as ``sl.advice()`` yields it); for every
    rank unless ``rank`` is given."""

    def __init__(self, action: str, fingerprint: str, **data: Any) -> None:
        self.action, self.fingerprint, self.rule = action, fingerprint, None
        self.rank = data.get("rank", RUN_RANK)
        for k in (
            "sample_ids",
            "sample_hashes",
            "checkpoint",
            "checkpoint_step",
            "skip_batches",
            "lr_factor",
            "duration_s",
            "at_step",
            "time_ns",
            "received_ns",
        ):
            setattr(self, k, data.get(k))


def test_a_remedy_that_raises_never_reaches_the_loop(memory_monitor):
    m, _ = memory_monitor(remedies=ALL)
    r = Remedies(m, ALL)
    r._lower_lr = None  # type: ignore[assignment,method-assign] - a remedy that blows up
    assert r.act(5, advice=[_Advice("lower_lr", "x")]) == 5
    assert r.answers[-1][2] == "failed"
    assert r.act(6, advice=[object()]) == 6  # not advice at all
    assert m.counts.caller == 1


# ---------------------------------------------------------------------- skip samples
def run_skip_samples(memory_monitor, remedy: bool) -> tuple[list[float], list[int], Any]:
    """8 epochs over 64 samples, 4 of them corrupted; with the remedy, the advice names the
    corrupted rows of the first batch that held one by their hashes (as the batch record
    sent them), after that batch's step."""
    m, t = memory_monitor(remedies=ALL)
    torch.manual_seed(0)
    ds = Samples(64, {3, 17, 40, 51})
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    m.watch(model, opt, every=10)
    loader = m.skipping(
        torch.utils.data.DataLoader(
            ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1)
        )
    )
    losses, seen_after, step, advised = [], [], 0, False
    for _epoch in range(8):
        for batch in loader:
            ids = batch["input_ids"]
            loss = model(ids)["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
            m.log_step(step, loss=loss.detach())
            bad = [s for s in batch["sample_id"].tolist() if s in ds.poisoned]
            if advised:
                seen_after += bad
            elif bad:  # the spike: the first batch with a corrupted row
                advised = True
                if remedy:  # the worker names the corrupted rows it saw, by their hashes
                    hashes = batch_payload(ds.rows[sorted(ds.poisoned)])[0]["sample_hashes"]
                    advise(
                        m, t, step, action="skip_samples", fingerprint="s-1", sample_hashes=hashes
                    )
            step = m.act(step) + 1
        losses.append(eval_loss(model))
    return losses, seen_after, acted(t, m)


@pytest.mark.slow
def test_skip_samples_keeps_the_corrupted_rows_out_and_the_loss_lower(memory_monitor):
    without, seen_without, _ = run_skip_samples(memory_monitor, remedy=False)
    with_, seen_with, answers = run_skip_samples(memory_monitor, remedy=True)
    assert seen_without and not seen_with  # never trained on again
    assert answers["skip_samples"].data["outcome"] == "acted"
    assert "0 ids, 4 hashes" in answers["skip_samples"].data["detail"]
    # the clean loss over the last 4 epochs: the corrupted rows kept it up without the remedy
    assert max(with_[4:]) < 0.2 * max(without[4:]), (with_, without)


# ---------------------------------------------------------------------- rewind
def run_rewind(memory_monitor, tmp_path, remedy: bool) -> tuple[list[float], Any, Any, list]:
    """100 batches; 40-45 corrupted. Checkpoints every 10 steps; with the remedy, advice at
    step 42 to reload the checkpoint of step 39 and skip the next 3 batches."""
    m, t = memory_monitor(remedies=ALL)
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    m.watch(model, opt, sched, every=10)
    gen = torch.Generator().manual_seed(1)

    def batches() -> Any:
        for i in range(100):
            yield corrupted_rows(16, gen) if 40 <= i < 46 else clean_rows(16, gen)

    loader = m.skipping(batches())
    losses, steps, step, advised = [], [], 0, False
    for ids in loader:
        loss = model(ids)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        m.log_step(step, loss=loss.detach())
        if step % 10 == 9:
            path = str(tmp_path / f"ckpt-{remedy}-{step}.pt")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
            m.checkpoint(step, path)
        if remedy and step == 42 and not advised:
            advised = True
            ckpt = str(tmp_path / f"ckpt-{remedy}-39.pt")
            advise(
                m,
                t,
                42,
                action="rewind",
                fingerprint="spike-2",
                onset_step=40,
                checkpoint=ckpt,
                checkpoint_step=39,
                skip_batches=3,
                at_step=42,
            )
        step = m.act(step) + 1
        steps.append(step)
        losses.append(eval_loss(model))
    return losses, acted(t, m), loader, steps


@pytest.mark.slow
def test_rewind_reloads_skips_and_the_loss_is_back_on_trend_sooner(memory_monitor, tmp_path):
    without, _, _, _ = run_rewind(memory_monitor, tmp_path, remedy=False)
    with_, answers, loader, steps = run_rewind(memory_monitor, tmp_path, remedy=True)
    pre = without[38]
    assert with_[38] == pytest.approx(pre)  # the same run until the incident
    back_with, back_without = back_on_trend(with_, 40, pre), back_on_trend(without, 40, pre)
    assert back_with <= 3 < 15 < back_without, (back_with, back_without)
    assert with_[-1] <= without[-1]
    detail = answers["rewind"].data["detail"]
    assert answers["rewind"].data["outcome"] == "acted"
    assert "restored model, optimizer" in detail and "skipped the 3 batches after" in detail
    assert loader.skipped_items == 3
    assert steps[42] == 40  # act() gave the checkpoint's step: the loop goes on from 40


# ---------------------------------------------------------------------- lower the lr
def run_lower_lr(memory_monitor, remedy: bool) -> tuple[list[float], Any, Any, Any]:
    """A linear regression with SGD at an lr near its stability limit (the loss wanders);
    with the remedy, advice at step 15 to halve it."""
    schedule = {"kind": "constant", "peak_lr": 0.8}
    m, t = memory_monitor(remedies=ALL, lr_schedule=schedule)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    m.watch(model, opt, sched, every=5)
    gen = torch.Generator().manual_seed(1)
    w = torch.arange(1.0, 9.0)[:, None] / 8
    losses = []
    for step in range(60):
        x = torch.randn(32, 8, generator=gen)
        y = x @ w + 0.1 * torch.randn(32, 1, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        m.log_step(step, loss=loss.detach())
        losses.append(float(loss.detach()))
        if remedy and step == 15:
            advise(m, t, 15, action="lower_lr", fingerprint="corr-1", lr_factor=0.5, at_step=15)
        m.act(step)
    return losses, acted(t, m), (opt, sched), t


@pytest.mark.slow
def test_lower_lr_scales_groups_and_schedule_and_the_loss_settles(memory_monitor):
    without, _, _, _ = run_lower_lr(memory_monitor, remedy=False)
    with_, answers, (opt, sched), t = run_lower_lr(memory_monitor, remedy=True)
    assert with_[:16] == pytest.approx(without[:16])
    assert np.mean(with_[30:]) < 0.1 * np.mean(without[30:]), (with_[30:], without[30:])
    # after 44 scheduler steps the lr is still the lowered one: the base lr was scaled too
    assert opt.param_groups[0]["lr"] == pytest.approx(0.4)
    assert sched.base_lrs == [pytest.approx(0.4)]
    data = answers["lower_lr"].data
    assert data["outcome"] == "acted" and data["detail"] == "lr x0.5 from step 16: 0.8 -> 0.4"
    assert answers["lower_lr"].step == 15
    metas = t.records("run_meta")
    assert metas[0].data["lr_schedule"] == {"kind": "constant", "peak_lr": 0.8}
    assert metas[-1].data["lr_schedule"]["lr_scale"] == [[16, 0.5]]
    assert metas[-1].data["remedies"] == ALL


# ---------------------------------------------------------------------- profile
@pytest.mark.slow
def test_profile_writes_one_bounded_trace_and_names_it(memory_monitor, tmp_path, monkeypatch):
    monkeypatch.delenv("STEPLENS_S3_BUCKET", raising=False)  # kept local
    m, t = memory_monitor(remedies=["profile"])
    m.remedies.profile_dir = str(tmp_path)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    advise(m, t, 0, action="profile", fingerprint="slow-rank-1", duration_s=0.3)
    advise(m, t, 0, action="profile", fingerprint="slow-rank-2", duration_s=0.3)
    t0 = time.monotonic()
    for step in range(200):
        loss = model(clean_rows(16, gen))["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        m.log_step(step, loss=loss.detach())
        m.act(step)
        if len(m.remedies.answers) == 2:
            break
    assert wait_until(lambda: len(m.remedies.answers) == 2, timeout_s=20)  # stored: answered
    answers = {a[1]: a for a in m.remedies.answers}
    assert answers["slow-rank-2"][2] == "declined"  # one trace at a time
    _, _, outcome, detail, _ = answers["slow-rank-1"]
    assert outcome == "acted"
    path = detail.split("trace ")[1].split(":")[0]
    assert path.startswith(str(tmp_path)) and os.path.getsize(path) > 0
    trace = json.loads(gzip.decompress(Path(path).read_bytes()))
    assert any("aten::" in e.get("name", "") for e in trace["traceEvents"])
    assert time.monotonic() - t0 < 20
    # stopped at a step boundary within its bounds (20 steps or its duration)
    steps = int(detail.split(": ")[1].split(" steps")[0])
    assert 1 <= steps <= 20
    got = acted(t, m)
    assert got["profile"].data["detail"] == detail


# ---------------------------------------------------------------------- ranks agree
STEPS = 12


def _rank_main(rank: int, port: int, out: str) -> None:
    """Two runs of ``STEPS`` steps with a gradient all-reduce each (DDP's share): rank 0
    receives the advice at step 2, rank 1 at step 5, agreed for step 8. In the first rank 1
    calls ``act`` every step, in the second only at odd steps."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    calls = [0]
    all_reduce = dist.all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return all_reduce(*args, **kwargs)

    dist.all_reduce = counted  # every collective of the process is the loop's own
    result: dict[str, Any] = {}
    t0 = time.monotonic()
    for run, every in (("each", 1), ("odd", 2)):
        m, t = _monitor(run, rank)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        lrs, calls[0] = [], 0
        for step in range(STEPS):
            loss = model(torch.ones(4, 2)).sum()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            if step == (2 if rank == 0 else 5):
                advise(m, t, step, action="lower_lr", fingerprint="c-1", lr_factor=0.5, at_step=8)
            if rank == 0 or step % every == every - 1:
                m.act(step, optimizer=opt)
            lrs.append(opt.param_groups[0]["lr"])
        m.flush(5)
        answers = [r.data["detail"] for r in t.records("acted")]
        result[run] = {
            "lrs": lrs,
            "collectives": calls[0],
            "answers": answers,
            "errors": m.stats()["remedies"],
        }
        m.shutdown(2)
    result["seconds"] = time.monotonic() - t0
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def _monitor(run: str, rank: int) -> tuple[Any, Any]:
    from steplens.producer.delivery.transport import MemoryTransport
    from steplens.producer.monitor import Monitor

    t = MemoryTransport()
    m = Monitor(f"agree-{run}", transport=t, rank=rank, hw_interval_s=0, remedies=ALL)
    return m, t


@pytest.mark.slow
def test_ranks_agree_by_at_step_without_a_collective(tmp_path):
    """No collective in ``act``: a rank that calls it every other step does not stall the
    other; the advice is carried out at its step on both ranks, or counted late."""
    import socket

    mp = torch.multiprocessing.get_context("spawn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        mp.Process(target=_rank_main, args=(r, port, str(tmp_path / f"r{r}.json")))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0, 0]
    got = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    at_8 = [1.0] * 8 + [0.5] * (STEPS - 8)
    for r in range(2):
        assert got[r]["each"]["collectives"] == got[r]["odd"]["collectives"] == 2 * STEPS
        assert got[r]["seconds"] < 120
    # both call act each step: both lower the lr at the end of step 8, on time
    assert got[0]["each"]["lrs"] == got[1]["each"]["lrs"] == at_8
    assert (
        got[0]["each"]["answers"] == got[1]["each"]["answers"] == ["lr x0.5 from step 9: 1 -> 0.5"]
    )
    assert got[1]["each"]["errors"] == {}
    # rank 1 skips act at step 8: it lowers the lr at step 9 and says so
    assert got[0]["odd"]["lrs"] == at_8
    assert got[1]["odd"]["lrs"] == [1.0] * 9 + [0.5] * (STEPS - 9)
    [late] = got[1]["odd"]["answers"]
    assert late == "lr x0.5 from step 10: 1 -> 0.5; 1 step after the agreed step 8"
    assert got[1]["odd"]["errors"] == {"late": 1}


def test_a_rewind_forgets_the_checkpoints_of_the_steps_it_left_behind(memory_monitor):
    m, _ = memory_monitor(remedies=["rewind"])
    for s in (10, 20, 30):
        m.checkpoint(s, f"/ckpt/{s}")
    loaded: list[str] = []
    first = _Advice("rewind", "a", checkpoint="/ckpt/10", checkpoint_step=10)
    assert m.act(25, advice=[first], load=loaded.append) == 10
    assert loaded == ["/ckpt/10"] and list(m.remedies.checkpoints) == ["/ckpt/10", "/ckpt/30"]
    again = _Advice("rewind", "b", checkpoint="/ckpt/20", checkpoint_step=20)
    assert m.act(15, advice=[again], load=loaded.append) == 15
    assert m.remedies.answers[-1][2] == "declined" and "left behind" in m.remedies.answers[-1][3]
    m.checkpoint(20, "/ckpt/20")  # saved again on the new trajectory: usable
    assert m.act(22, advice=[_Advice("rewind", "c", checkpoint="/ckpt/20")], load=loaded.append)
    assert loaded == ["/ckpt/10", "/ckpt/20"]
