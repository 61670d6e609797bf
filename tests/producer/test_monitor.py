"""The Monitor on the in-memory transport: what is sent, sampling, robustness, spooling."""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import pytest

import steplens.producer as sl
from steplens.schema import Record, decode, record_key


def _noting_thread(call, threads: set[int]):  # type: ignore[no-untyped-def]
    """``call``, noting in ``threads`` the id of every thread that makes it."""

    def noted(*args, **kwargs):  # type: ignore[no-untyped-def]
        threads.add(threading.get_ident())
        return call(*args, **kwargs)

    return noted


def _wait(cond, timeout_s: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_sample_rate_one_sends_every_step_with_contiguous_seq(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(sample_rate=1.0, window_steps=50)
    for step in range(500):
        m.log_step(step, loss=2.0 - step * 1e-3, lr=1e-3, grad_norm=0.5, tokens=4096, acc=0.1)
    assert m.flush(10)
    m.shutdown()
    recs = tx.records()
    steps = [r for r in recs if r.kind == "step"]
    assert [r.step for r in steps] == list(range(500))
    assert sorted(r.seq for r in recs) == list(range(len(recs)))
    assert all(k == record_key(m.run_id, m.rank) for k, _ in tx.messages)
    assert recs[0].kind == "run_meta" and recs[-1].kind == "health"
    health = recs[-1].data  # with this process's memory and its host's (a leak's evidence)
    assert health["mem_total_bytes"] > health["mem_available_bytes"] > 0
    assert health["rss_bytes"] > 0
    windows = [r for r in recs if r.kind == "step_window"]
    assert sum(w.data["count"] for w in windows) == 500
    s = steps[10].data
    assert s["reason"] == "sample" and s["scalars"] == {"acc": 0.1} and s["tokens"] == 4096
    assert s["step_time_s"] > 0 and s["tokens_per_s"] == pytest.approx(4096 / s["step_time_s"])


def test_default_sampling_never_hides_a_spike(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(window_steps=100)
    for step in range(1, 1001):
        loss = 50.0 if step == 537 else 2.0 + 0.01 * math.sin(step)
        # a steady step time: the measured one of this tight loop (microseconds) jitters by
        # multiples on a busy machine, and the guard sends such steps raw too
        m.log_step(step, loss=loss, step_time_s=0.1, nan_probe=math.nan if step == 777 else 0.0)
    m.shutdown()
    steps = {r.step: r.data for r in tx.records("step")}
    sampled = set(range(100, 1001, 100))
    assert {s for s, d in steps.items() if d["reason"] == "sample"} == sampled
    assert {s for s, d in steps.items() if d["reason"] == "guard"} == {537, 777}
    assert steps[537]["reason"] == "guard" and steps[537]["loss"] == 50.0
    assert steps[777]["reason"] == "guard" and math.isnan(steps[777]["scalars"]["nan_probe"])
    window = next(
        r.data
        for r in tx.records("step_window")
        if r.data["step_first"] <= 537 <= r.data["step_last"]
    )
    assert window["metrics"]["loss"]["max"] == 50.0
    assert len(steps) < 100  # a sample, not every step


def test_mfu_and_run_meta(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    sched = {"kind": "cosine", "peak_lr": 3e-4, "warmup_steps": 10, "total_steps": 100}
    m, tx = memory_monitor(
        sample_rate=1.0,
        flops_per_token=6e9,
        peak_flops=1e15,
        lr_schedule=sched,
        model_info={"name": "tiny"},
    )
    m.log_step(0, tokens=1000)
    time.sleep(0.01)
    m.log_step(1, tokens=1000)
    m.shutdown()
    meta = tx.records("run_meta")[0].data
    assert meta["lr_schedule"] == sched and meta["peak_flops"] == 1e15
    assert meta["model"] == {"name": "tiny", "flops_per_token": 6e9}
    d = tx.records("step")[1].data
    assert d["mfu"] == pytest.approx(d["tokens_per_s"] * 6e9 / 1e15)


def test_eval_batch_and_data_time(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(sample_rate=1.0)

    def slow_loader():  # type: ignore[no-untyped-def]
        for i in range(3):
            time.sleep(0.02)
            yield i

    for step in m.timed(slow_loader()):
        m.log_step(step, loss=1.0)
    m.log_eval(3, split="test", loss=1.5, perplexity=math.exp(1.5), accuracy=0.7, em=0.2)
    m.log_batch(
        3,
        [[1, 2, 3, 0], [4, 5, 0, 0]],
        attention_mask=[[1, 1, 1, 0], [1, 1, 0, 0]],
        labels=[1, 0],
        max_len=2,
    )
    m.shutdown()
    assert all(r.data["data_time_s"] >= 0.015 for r in tx.records("step"))
    ev = tx.records("eval")[0].data
    assert ev["split"] == "test" and ev["extra"] == {"em": 0.2} and ev["accuracy"] == 0.7
    b = tx.records("batch")[0].data
    assert b["n_samples"] == 2 and b["length_max"] == 3 and b["over_length"] == 1
    assert b["label_counts"] == {"1": 1, "0": 1} and len(b["sample_hashes"]) == 2


def test_bad_values_never_raise_and_are_counted(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(sample_rate=1.0)
    m.log_step(0, loss=math.nan, lr=math.inf, grad_norm=-math.inf, tokens=10)
    m.log_step(1, loss="abc", lr=object(), tokens=2**70, big=1e308, huge=10**400)
    m.log_step("two", loss=1.0)  # type: ignore[arg-type]
    m.log_step(3, loss=[1, 2], **{"x" * 5000: 1.0})
    m.log_eval(4, split=None, loss="bad")  # type: ignore[arg-type]
    m.log_batch(5, object())
    m.log_step(6, **{f"{'y' * 4000}{i}": float(i) for i in range(500)})  # names too long
    m.log_step(7, **{f"s{i}": float(i) for i in range(20_000)})  # over max_scalars
    m.shutdown()
    steps = {r.step: r.data for r in tx.records("step")}
    assert math.isnan(steps[0]["loss"]) and steps[0]["lr"] == math.inf
    assert steps[1]["scalars"]["big"] == 1e308 and steps[1]["scalars"]["huge"] == math.inf
    assert "loss" not in steps[1] and "tokens" not in steps[1]
    assert "scalars" not in steps[6]  # the step is kept, its bad names are not
    assert list(steps[7]["scalars"]) == [f"s{i}" for i in range(1024)]
    health = tx.records("health")[-1].data
    assert health["errors"]["bad_value"] >= 4 and health["errors"]["bad_name"] == 501
    assert health["dropped"]["bad_step"] == 1 and health["dropped"]["bad_eval"] == 1
    assert health["dropped"]["scalars_cap"] == 20_000 - 1024
    windowed = set()
    for w in tx.records("step_window"):
        windowed |= set(w.data["metrics"])
    assert {f"s{i}" for i in range(1024)} <= windowed
    for _, raw in tx.messages:
        assert isinstance(decode(raw), Record)  # every record sent decodes


def test_distinct_metric_names_are_capped_per_run(memory_monitor, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("STEPLENS_MAX_METRIC_NAMES", "100")
    m, tx = memory_monitor(sample_rate=1.0)
    assert m.config.max_metric_names == 100
    for step in range(50):  # 20 new names a step: 1,000 names asked for
        m.log_step(step, loss=1.0, **{f"layer{step}.n{k}": 1.0 for k in range(20)})
    m.log_eval(50, loss=1.0, brand_new=1.0)
    m.shutdown()
    stored = {n for r in tx.records("step") for n in r.data.get("scalars", {})}
    stored |= {n for r in tx.records("step_window") for n in r.data["metrics"]}
    assert len(stored - {"loss", "step_time_s"}) == 100
    assert all(r.data["loss"] == 1.0 for r in tx.records("step"))  # every step kept
    assert "extra" not in tx.records("eval")[0].data
    assert tx.records("health")[-1].data["dropped"]["name_cap"] == 1000 - 100 + 1


def test_calls_before_init_and_after_shutdown(tmp_path: Path) -> None:
    sl.shutdown()
    sl.log_step(1, loss=1.0)
    sl.log_eval(1, loss=1.0)
    sl.log_batch(1, [[1]])
    sl.watch(None, None)
    sl.probe_comm(10)
    assert sl.flush(0.1) is False
    tx = sl.MemoryTransport()
    m = sl.init("early", transport=tx, hw_interval_s=0, spool_dir=str(tmp_path))
    sl.log_step(1, loss=1.0)
    sl.shutdown()
    m.log_step(2, loss=1.0)
    m.flush()
    m.shutdown()
    sl.log_step(3, loss=1.0)
    assert m.stats()["refused"] == 2
    assert tx.records("health")[-1].data["errors"]["not_running"] >= 6


def test_bad_keyword_raises_at_init_bad_env_warns(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        sl.Monitor("x", transport=sl.MemoryTransport(), sample_rate=2.0)
    with pytest.raises(ValueError):
        sl.Monitor("x", transport=sl.MemoryTransport(), no_such_setting=1)
    monkeypatch.setenv("STEPLENS_SAMPLE_RATE", "lots")
    monkeypatch.setenv("STEPLENS_WINDOW_STEPS", "7")
    m = sl.Monitor("x", transport=sl.MemoryTransport(), hw_interval_s=0)
    assert m.config.sample_rate == 0.01 and m.config.window_steps == 7
    m.shutdown()


def test_queue_full_drops_oldest_and_counts(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(sample_rate=1.0, queue_max=100, flush_interval_s=5.0)
    m._wake = threading.Event()  # not the worker's: it sleeps flush_interval_s meanwhile
    for step in range(1000):
        m.log_step(step, loss=1.0)
    m.shutdown()
    steps = [r.step for r in tx.records("step")]
    health = tx.records("health")[-1].data
    assert health["dropped"]["queue_full"] >= 900 - 1
    assert steps == sorted(steps) and steps[-1] == 999 and len(steps) <= 100


def test_outage_spools_then_replays_in_order(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(sample_rate=1.0, spool_max_bytes=10 << 20)
    m.delivery.probe_interval_s = 0.05
    for step in range(100):
        m.log_step(step, loss=1.0)
    assert m.flush(5)
    tx.available = False
    # the caller's thread does none of the delivery: no transport call, no spool file work
    workers: set[int] = set()
    for obj, name in [(tx, "produce"), (tx, "poll"), (m.delivery.spool, "append")]:
        setattr(obj, name, _noting_thread(getattr(obj, name), workers))
    for step in range(100, 2100):
        m.log_step(step, loss=1.0)
    assert _wait(lambda: m.stats()["spooled"] >= 1900)
    assert m.stats()["state"] == "down" and m.delivery.spool.total_bytes > 0
    tx.available = True
    assert m.flush(10)
    m.shutdown()
    recs = tx.records()
    seqs = [r.seq for r in recs]
    assert sorted(set(seqs)) == list(range(max(seqs) + 1))  # nothing missing
    assert [r.step for r in recs if r.kind == "step"] == list(range(2100))
    # the caller's cost in CPU time is asserted by the Kafka outage test
    assert m.stats()["replayed"] >= 1900
    assert workers and threading.get_ident() not in workers
    assert not os.path.exists(m.delivery.spool.directory)  # emptied, then removed


def test_spool_bound_holds_during_a_long_outage(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(sample_rate=1.0, spool_max_bytes=200_000)
    tx.available = False
    for step in range(20_000):
        m.log_step(step, loss=1.0, lr=1e-4)
        if step % 1000 == 0:
            assert m.delivery.spool.total_bytes <= 200_000
    assert _wait(lambda: m.stats()["queue_len"] == 0)
    assert m.delivery.spool.total_bytes <= 200_000
    tx.available = True
    m.delivery.probe_interval_s = 0.05
    m.flush(10)
    m.shutdown()
    health = tx.records("health")[-1].data
    assert health["dropped"]["spool_full"] > 0
    delivered = len(tx.records("step"))
    assert delivered + health["dropped"]["spool_full"] >= 20_000


def test_fork_child_never_reuses_parent_state(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    m, tx = memory_monitor(sample_rate=1.0)
    m.log_step(0, loss=1.0)
    assert m.flush(5)
    parent_delivery = m.delivery
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report what it sees, never touch the parent's client
        ok = (
            m.delivery is not parent_delivery
            and not m._pipeline.thread.is_alive()
            and m._pipeline.delivery is m.delivery
            and m.delivery.transport is None
            and len(m._q) == 0
            and m.pid == os.getpid()
        )
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    m.log_step(1, loss=1.0)
    m.shutdown()
    assert [x.step for x in tx.records("step")] == [0, 1]


def test_caller_step_time_wins_over_the_measured_one(memory_monitor) -> None:  # type: ignore[no-untyped-def]
    """A rank's own step time (measured before the collective) is what shows a straggler."""
    mon, tx = memory_monitor(sample_rate=1.0)
    for step in range(3):
        mon.log_step(step, loss=1.0, tokens=1000, step_time_s=0.5, my_metric=2.0)
    mon.flush()
    steps = tx.records("step")
    assert len(steps) == 3
    for rec in steps:
        assert rec.data["step_time_s"] == 0.5
        assert rec.data["tokens_per_s"] == 2000.0
        assert rec.data["scalars"] == {"my_metric": 2.0}
