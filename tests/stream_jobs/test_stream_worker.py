"""The worker against the real Kafka: alerts, dead letters, health, resume after SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from steplens.schema import encode, make_record
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.run_keys import shard_key
from steplens.stream_jobs.engine.state import rank_key
from steplens.stream_jobs.worker.fit_queue import FIT_NICENESS

pytestmark = pytest.mark.stack


def alerts_matching(records, **want):
    return [r for r in records if all(r.data.get(k) == v for k, v in want.items())]


def steps(
    run: str, first: int, last: int, rank: int = 0, spike_at: int | None = None, seed: int = 0
) -> list:
    rng = random.Random(seed + first)
    out = []
    for i in range(first, last):
        loss = 40.0 if i == spike_at else 2.0 + rng.gauss(0, 0.01)
        out.append(
            make_record(
                "step",
                {"loss": loss, "grad_norm": 1.0 + rng.gauss(0, 0.01), "step_time_s": 0.1},
                run_id=run,
                rank=rank,
                step=i,
                seq=i,
                time_ns=1_700_000_000_000_000_000 + i * 10**8,
            )
        )
    return out


def stored_state(msgs: list, run: str):
    """``run``'s detector as the latest changelog values in ``msgs`` store it, or None."""
    latest = {k.decode(): v for k, v in msgs if k and v}
    if run not in latest:
        return None
    return RunDetector.load(latest[run], lambda r, slot: latest.get(rank_key(run, r, slot)))


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` with ``labels`` in a metrics page (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def wait_scored(worker, n: int, timeout_s: float = 90.0) -> None:
    """Until ``worker`` has scored ``n`` step records in all."""
    deadline = time.monotonic() + timeout_s
    while f'records_total{{kind="step"}} {n}.0' not in worker.metrics():
        assert time.monotonic() < deadline, worker.metrics()
        time.sleep(0.1)


def test_spike_alert_and_dead_letters(kafka, workers):
    run = f"run-{uuid.uuid4().hex[:6]}"
    w = workers("--no-arima", "--fetch-wait-ms", "40").start()
    w.wait_metrics()
    # a declared schedule that cannot be read: refused, and the run goes on without it
    meta = {"world_size": 1, "lr_schedule": {"peak_lr": 1e-3, "warmup_steps": "ten"}}
    kafka.send([make_record("run_meta", meta, run_id=run, rank=0)])
    kafka.send([make_record("step", {"loss": 2.0, "lr": 1e-3}, run_id=run, rank=0, step=0)])
    kafka.send(steps(run, 1, 60, spike_at=50))
    kafka.send([b"{not json", b'{"v": 1, "kind": "step"}'], key=f"{run}:0".encode())
    ahead = time.time_ns() + 3600 * 10**9  # a clock an hour ahead: not a signal
    kafka.send([make_record("step", {"loss": 2.0}, run_id=run, step=60, time_ns=ahead)])
    alerts = kafka.collect(
        kafka.topics.alerts, lambda got: bool(alerts_matching(got, rule="spike:loss"))
    )
    fired = alerts_matching(alerts, rule="spike:loss", state="firing")
    assert len(fired) == 1 and fired[0].step == 50 and fired[0].data["severity"] == "critical"
    assert fired[0].run_id == run and fired[0].data["hint"]
    dead = kafka.collect(kafka.topics.dead_letters, lambda got: len(got) >= 4)
    reasons = sorted(d.data["reason"] for d in dead)
    assert reasons[0].startswith("lr_schedule.warmup_steps: must be a whole number")
    assert reasons[1].startswith("not valid JSON")
    assert reasons[2] == "run_id: missing required field"
    assert reasons[3].startswith("time is ") and reasons[3].endswith("clock skew allowed)")
    assert all(d.data["source_topic"] == kafka.topics.raw for d in dead)
    sigs = kafka.collect(
        kafka.topics.signals,
        lambda got: any(s.data["name"] == "spike" and s.step == 50 for s in got),
    )
    assert any(s.data["name"] == "spike" and s.step == 50 and s.data["score"] > 0.5 for s in sigs)
    text = w.metrics()
    assert sample(text, "steplens_worker_dead_letters_total") == 4
    assert sample(text, "steplens_worker_records_total", kind="step") == 60
    assert sample(text, "steplens_worker_out_of_time_total", reason="future") == 1
    # the consumer fetches with the wait asked for, read back from its fetcher
    assert "steplens_worker_fetch_wait_seconds 0.04" in text
    assert "Crashed" not in w.log.read_text()
    # what Faust made in the state folder is private (the worker runs under umask 077)
    state = w.log.parent
    assert [p for p in state.rglob("*") if p.is_dir() and p.stat().st_mode & 0o077] == []
    assert any(p.is_dir() for p in state.rglob("*"))


def test_step_batches_are_scored_step_by_step(kafka, workers):
    """Steps sent as step_batch records give the alerts and signals of the same steps sent one
    record each: the spike's alert names its own step, every step is counted."""
    run = f"run-{uuid.uuid4().hex[:6]}"
    w = workers("--no-arima").start()
    w.wait_metrics()
    batches = []
    for lo in range(0, 120, 40):
        entries = [
            {"step": r.step, "time_ns": r.time_ns, **r.data}
            for r in steps(run, lo, lo + 40, spike_at=90)
        ]
        batches.append(
            make_record("step_batch", {"records": entries}, run_id=run, step=lo + 39, seq=lo)
        )
    kafka.send(batches)
    alerts = kafka.collect(
        kafka.topics.alerts, lambda got: bool(alerts_matching(got, rule="spike:loss"))
    )
    fired = alerts_matching(alerts, rule="spike:loss", state="firing")
    assert len(fired) == 1 and fired[0].step == 90 and fired[0].data["severity"] == "critical"
    sigs = kafka.collect(
        kafka.topics.signals,
        lambda got: any(s.data["name"] == "spike" and s.step == 90 for s in got),
    )
    assert any(s.data["name"] == "spike" and s.step == 90 and s.data["score"] > 0.5 for s in sigs)
    # quiet signals are thinned out as for single records: not one per step and rule
    assert len({(s.data["name"], s.step) for s in sigs}) < 40
    # the spike's batch is the last one: once its alert is out, every step was counted
    text = w.metrics()
    assert 'steplens_worker_records_total{kind="step"} 120.0' in text
    # the default fetch wait, not the 1.5 s of Faust's consumer
    assert "steplens_worker_fetch_wait_seconds 0.1" in text


def test_backlog_of_step_batches_larger_than_a_kafka_message(kafka, workers):
    """A backlog whose share of one run in a routed batch is megabytes (step batches waiting
    while no worker ran): every step is scored; the route agent cuts it into messages Kafka
    takes instead of failing to forward it."""
    run = f"run-{uuid.uuid4().hex[:6]}"
    batches = []
    for lo in range(0, 20_000, 100):
        entries = [
            {"step": r.step, "time_ns": r.time_ns, **r.data} for r in steps(run, lo, lo + 100)
        ]
        batches.append(make_record("step_batch", {"records": entries}, run_id=run, step=lo + 99))
    kafka.send(batches)  # before the worker starts: its first batches take many at once
    assert sum(len(encode(b)) for b in batches) > 2 << 20  # more than a Kafka message holds
    w = workers("--no-arima").start()
    deadline = time.monotonic() + 90
    text = w.wait_metrics()
    while 'records_total{kind="step"} 20000.0' not in text and time.monotonic() < deadline:
        time.sleep(0.5)
        text = w.metrics()
    assert 'steplens_worker_records_total{kind="step"} 20000.0' in text
    assert "Crashed" not in w.log.read_text()


def test_the_state_of_a_run_with_many_ranks_reaches_the_changelog(kafka, workers):
    """A run of 128 ranks: its state (megabytes with the ARIMA histories) is checkpointed as
    one value per rank, each small enough for Kafka, and loads back whole."""
    run = f"wide-{uuid.uuid4().hex[:6]}"
    w = workers("--checkpoint-s", "0").start()
    w.wait_metrics()
    batches = []
    for rank in range(128):
        entries = [
            {"step": r.step, "time_ns": r.time_ns, **r.data}
            for r in steps(run, 0, 100, rank=rank, seed=rank)
        ]
        batches.append(make_record("step_batch", {"records": entries}, run_id=run, rank=rank))
    kafka.send(batches)

    def restored(msgs):
        det = stored_state(msgs, run)
        return det is not None and det.records == 12_800 and len(det.series) == 128

    msgs = kafka.collect(f"{w.app_id}-runs-changelog", restored, 90, raw=True)
    latest = {k.decode(): v for k, v in msgs if k and v}
    det = RunDetector.load(latest[run], lambda r, slot: latest.get(rank_key(run, r, slot)))
    assert det is not None
    assert sum(len(v) for k, v in latest.items() if k.startswith(run)) > 1 << 20
    assert all(len(s["arima"]["loss"].history) == 100 for s in det.series.values())
    assert "TooLarge" not in w.log.read_text()


def by_run_partitions(bootstrap: str, topic: str, keys: set[str], timeout_s: float = 30.0):
    """The by-run partitions each of ``keys`` was written to (read from the topic's start)."""
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    got: dict[str, set[int]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not keys <= got.keys():
            msg = c.poll(0.5)
            if msg is not None and not msg.error() and msg.key():
                got.setdefault(msg.key().decode(), set()).add(msg.partition())
    finally:
        c.close()
    return got


def test_a_wide_runs_shards_are_scored_apart_and_named_as_their_run(kafka, workers):
    """``--shard-ranks 2``: ranks 2 and 3 of a run of 4 are a shard of their own, on a by-run
    partition of its own; each shard's state holds its ranks only, the followed ranks are
    shard 0's, and what a shard publishes names the run."""
    run = f"wide-{uuid.uuid4().hex[:6]}"
    w = workers("--no-arima", "--checkpoint-s", "0", "--shard-ranks", "2").start()
    w.wait_metrics()
    for rank in range(4):
        recs = steps(run, 0, 40, rank=rank, spike_at=35 if rank in (0, 3) else None, seed=rank)
        if rank == 3:
            recs[30] = replace(recs[30], data={**recs[30].data, "loss": float("nan")})
        kafka.send(recs)

    def paged(got):
        return {(a.data["rule"], a.step) for a in alerts_matching(got, state="firing")}

    alerts = kafka.collect(
        kafka.topics.alerts,
        lambda got: {("spike:loss", 35), ("nonfinite:loss", 30)} <= paged(got),
        90,
    )
    assert {a.run_id for a in alerts} == {run}  # never the shard's key
    # rank 3's NaN is seen by shard 1 (the only detector with rank 3), which follows no rank's
    # loss: the spike at 35 on ranks 0 and 3 pages once, from shard 0
    assert [a.step for a in alerts_matching(alerts, rule="spike:loss", state="firing")] == [35]
    second = shard_key(run, 1)

    def both(msgs):
        states = [stored_state(msgs, key) for key in (run, second)]
        return all(d is not None and d.records == 80 for d in states)

    msgs = kafka.collect(f"{w.app_id}-runs-changelog", both, 60, raw=True)
    assert sorted(stored_state(msgs, run).series) == [0, 1]
    assert sorted(stored_state(msgs, second).series) == [2, 3]
    parts = by_run_partitions(kafka.bootstrap, f"{w.app_id}-by-run", {run, second})
    assert len(parts[run]) == len(parts[second]) == 1 and parts[run] != parts[second], parts


def test_a_hang_of_a_wide_run_pages_once(kafka, workers):
    """Every rank of a run of two shards stops stepping while its nodes still sample: shard
    0 pages the hang, and shard 1 judges its ranks hung without a page of its own."""
    run = f"hung-{uuid.uuid4().hex[:6]}"
    w = workers("--no-arima", "--checkpoint-s", "0", "--shard-ranks", "2", "--hang-after-s", "3")
    w.start().wait_metrics()
    for rank in range(4):
        kafka.send(steps(run, 0, 20, rank=rank, seed=rank))  # the last at 1.9 s
    wait_scored(w, 80)
    t0 = steps(run, 0, 1)[0].time_ns
    gpus = {"gpus": [{"index": 0, "util_gpu": 0.0}]}
    kafka.send(
        [
            make_record("hw", gpus, run_id=run, rank=rank, host=f"n{rank}", time_ns=t)
            for t in range(t0 + 2 * 10**9, t0 + 22 * 10**9, 10**9)
            for rank in (0, 2)  # each shard's node
        ]
    )

    def hang_pages(got):
        return [
            a
            for a in alerts_matching(got, state="firing")
            if any(m["rule"] == "hang:progress" for m in a.data["evidence"]["members"])
        ]

    kafka.collect(kafka.topics.alerts, lambda got: bool(hang_pages(got)), 90)
    second = shard_key(run, 1)

    def judged(msgs):  # each shard's 40 steps and 20 samples applied
        states = [stored_state(msgs, key) for key in (run, second)]
        return all(d is not None and d.records == 60 for d in states)

    det = stored_state(kafka.collect(f"{w.app_id}-runs-changelog", judged, 60, raw=True), second)
    assert det.run_states["ranks"].hung == {2, 3}
    # every firing transition the worker sent by then, hang or not, read back
    sent = sample(w.metrics(), "steplens_worker_alerts_total", state="firing")
    got = kafka.collect(
        kafka.topics.alerts, lambda got: len(alerts_matching(got, state="firing")) >= sent
    )
    pages = hang_pages(got)
    assert len(pages) == 1 and pages[0].run_id == run, [a.data for a in pages]
    ranks = {m["scope"] for m in pages[0].data["evidence"]["members"]}
    assert {"run", "rank:0", "rank:1"} <= ranks and "rank:2" not in ranks


def test_arima_fits_of_a_wide_run_go_to_the_pool_together(kafka, workers):
    """32 ranks whose series all come due for their fits at once: every fit comes back from
    the pool, in far fewer jobs than fits, and the signals after it carry the model's
    forecast and interval."""
    run = f"arima-{uuid.uuid4().hex[:6]}"
    w = workers("--signal-every", "50", "--signal-interval", "0").start()
    w.wait_metrics()

    def send(lo: int, hi: int) -> None:
        batches = []
        for rank in range(32):
            entries = [
                {"step": r.step, "time_ns": r.time_ns, **r.data}
                for r in steps(run, lo, hi, rank=rank, seed=rank)
            ]
            batches.append(make_record("step_batch", {"records": entries}, run_id=run, rank=rank))
        kafka.send(batches)

    def arima_metrics() -> dict[str, float]:
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in w.metrics().splitlines()
            if line.startswith("steplens_worker_arima") and "_created" not in line
        }

    ok = 'steplens_worker_arima_fits_total{outcome="ok"}'

    def wait_fits(n: int) -> dict[str, float]:
        deadline = time.monotonic() + 60
        got = arima_metrics()
        while got.get(ok, 0) < n and time.monotonic() < deadline:
            time.sleep(0.2)
            got = arima_metrics()
        assert got.get(ok, 0) >= n and len(got) == 2, got  # none skipped, none failed
        return got

    # the 96 series (loss, grad_norm, step_time_s) ask for their first fit at 64 values
    send(0, 100)
    wait_fits(96)
    send(100, 300)  # and again at 256
    wait_scored(w, 32 * 300)
    got = wait_fits(2 * 96)
    assert 2 <= got["steplens_worker_arima_fit_jobs_total"] <= got[ok] / 8, got

    def fitted(got):
        return [s for s in got if s.data["name"] == "arima" and "expected" in s.data]

    sigs = fitted(
        kafka.collect(kafka.topics.signals, lambda got: len({s.rank for s in fitted(got)}) == 32)
    )
    assert all(s.data["lower"] < s.data["expected"] < s.data["upper"] for s in sigs)
    assert {s.rank for s in sigs} == set(range(32)) and min(s.step for s in sigs) >= 100
    # the fits and history loads are background work: the fit pool's process and the history
    # process run at a lower CPU priority
    assert w.proc is not None
    mine = nice_of(w.proc.pid)
    pool = [nice_of(c) for c in children_of(w.proc.pid) if "spawn_main" in cmdline_of(c)]
    assert pool == [min(19, mine + FIT_NICENESS)] * 2, (mine, pool)


def test_fits_go_on_after_the_fit_processes_were_killed(kafka, workers):
    """The worker's spawned processes (the fit pool's, the history loader's) SIGKILLed, as
    the out-of-memory killer would: each pool starts again at its next job, and a run's ARIMA
    fits come back as before."""
    run = f"arima-kill-{uuid.uuid4().hex[:6]}"
    w = workers().start()
    w.wait_metrics()
    assert w.proc is not None
    deadline = time.monotonic() + 60
    while len(spawned := [c for c in children_of(w.proc.pid) if "spawn_main" in cmdline_of(c)]) < 2:
        assert time.monotonic() < deadline, "the worker's pools did not start"
        time.sleep(0.2)
    for pid in spawned:
        os.kill(pid, signal.SIGKILL)
    batches = []
    for rank in range(8):  # 24 series ask for their first fit at 64 values
        entries = [
            {"step": r.step, "time_ns": r.time_ns, **r.data}
            for r in steps(run, 0, 100, rank=rank, seed=rank)
        ]
        batches.append(make_record("step_batch", {"records": entries}, run_id=run, rank=rank))
    kafka.send(batches)
    wait_scored(w, 8 * 100)
    deadline = time.monotonic() + 90
    while sample(w.metrics(), "steplens_worker_arima_fits_total", outcome="ok") < 24:
        assert time.monotonic() < deadline, w.metrics()
        time.sleep(0.2)
    assert sample(w.metrics(), "steplens_worker_fit_pool_restarts_total") >= 1
    assert w.proc.poll() is None


def children_of(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def cmdline_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def nice_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_full_resolution_producer_to_alert(kafka, workers, tmp_path):
    """The producer in full resolution, the worker scoring its step batches: a loss spike
    alerts at its own step, and every logged step is scored once."""
    from steplens.producer.monitor import Monitor

    w = workers("--no-arima").start()
    w.wait_metrics()
    m = Monitor(
        f"full-{uuid.uuid4().hex[:6]}",
        kafka_bootstrap=kafka.bootstrap,
        topic=kafka.topics.raw,
        hw_interval_s=0,
        spool_dir=str(tmp_path),
        full_resolution=True,
        batch_steps=50,
        batch_s=3600,
    )
    rng = random.Random(3)
    for step in range(300):
        loss = 60.0 if step == 250 else 2.0 + rng.gauss(0, 0.01)
        m.log_step(step, loss=loss, grad_norm=1.0 + rng.gauss(0, 0.01), step_time_s=0.1)
    m.close()
    alerts = kafka.collect(
        kafka.topics.alerts, lambda got: bool(alerts_matching(got, rule="spike:loss"))
    )
    fired = alerts_matching(alerts, rule="spike:loss", state="firing")
    assert [a.step for a in fired] == [250] and fired[0].run_id == m.run_id
    deadline = time.monotonic() + 30
    while 'records_total{kind="step"} 300.0' not in w.metrics() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert 'steplens_worker_records_total{kind="step"} 300.0' in w.metrics()


def test_sigkill_between_checkpoints_loses_no_record(kafka, workers):
    """A run's messages are acknowledged only once a checkpoint holds them: a worker killed
    long after it scored them, but before its next checkpoint, leaves them to be scored again
    by the next worker, and the run's state ends with every record applied once."""
    run = f"held-{uuid.uuid4().hex[:6]}"
    first = workers("--no-arima", "--checkpoint-s", "3600").start()
    first.wait_metrics()
    kafka.send(steps(run, 0, 5))  # the run's first message is checkpointed at once
    wait_scored(first, 5)
    for first_step in range(5, 40, 5):  # these only at the next checkpoint, an hour away
        kafka.send(steps(run, first_step, first_step + 5))
        wait_scored(first, first_step + 5)
    # the behaviour under test is an absence, so no condition can end this wait: offsets
    # acknowledged by mistake would be committed within Faust's commit interval (2.8 s)
    time.sleep(8)
    first.kill()
    second = workers("--no-arima", "--checkpoint-s", "0", state="w1").start()
    second.wait_metrics()
    kafka.send(steps(run, 40, 45))

    def done(msgs):
        det = stored_state(msgs, run)
        return det is not None and det.records >= 45

    changelog = f"{first.app_id}-runs-changelog"
    det = stored_state(kafka.collect(changelog, done, 150, raw=True), run)
    assert det is not None
    assert det.records == 45  # every record applied once: none lost, none twice
    # the first checkpoint held the run's first message (up to 5 records): the rest was
    # scored again by the second worker, and the 5 new records
    scored = [ln for ln in second.metrics().splitlines() if "records_total{" in ln]
    assert len(scored) == 1 and float(scored[0].rsplit(" ", 1)[1]) >= 40, scored


def test_a_run_that_goes_quiet_is_checkpointed(kafka, workers):
    """The last messages of a run that stops sending are checkpointed (and so acknowledged)
    without any later message of its own."""
    run = f"quiet-{uuid.uuid4().hex[:6]}"
    w = workers("--no-arima", "--checkpoint-s", "1").start()
    w.wait_metrics()
    kafka.send(steps(run, 0, 5))  # checkpointed at once: the run's first message
    wait_scored(w, 5)
    kafka.send(steps(run, 5, 10))  # under a second later: held for the next checkpoint

    def all_ten(msgs):
        det = stored_state(msgs, run)
        return det is not None and det.records == 10

    msgs = kafka.collect(f"{w.app_id}-runs-changelog", all_ten, 30, raw=True)
    det = stored_state(msgs, run)
    assert det is not None and det.records == 10


def test_sigkill_resumes_state_and_two_workers_share_partitions(kafka, workers):
    runs = [f"run-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    first = workers("--no-arima", "--checkpoint-s", "0").start()
    first.wait_metrics()
    # warm up every run's baseline (the spike detector needs 16 values) and fire one alert each
    for run in runs:
        kafka.send(steps(run, 0, 40, spike_at=30))
    kafka.collect(
        kafka.topics.alerts,
        lambda got: len(alerts_matching(got, rule="spike:loss")) >= len(runs),
        90,
    )
    # the state of every run, with all 40 records applied, has reached the table's changelog
    changelog = f"{first.app_id}-runs-changelog"

    def checkpointed(msgs):
        latest = {k.decode(): v for k, v in msgs if k and v}
        states = {
            run: RunDetector.load(
                latest[run], lambda r, slot, run=run: latest.get(rank_key(run, r, slot))
            )
            for run in runs
            if run in latest
        }
        return all(
            states.get(run) is not None and states[run].records >= 40 and states[run].series
            for run in runs
        )

    kafka.collect(changelog, checkpointed, 60, raw=True)
    first.kill()  # SIGKILL: no clean shutdown, state only in the changelog
    second = workers("--no-arima", "--checkpoint-s", "0", state="w1").start()
    third = workers("--no-arima", "--checkpoint-s", "0", state="w2").start()
    second.wait_metrics()
    third.wait_metrics()
    # a spike right after the restart only alerts if the baseline was restored
    for run in runs:
        kafka.send(steps(run, 40, 60, spike_at=45))

    def spikes(got, run):
        return [
            a.step
            for a in got
            if a.run_id == run and a.data["state"] == "firing" and a.data["rule"] == "spike:loss"
        ]

    # until every run's spike at 45 is in (another rule may fire at 45 too)
    alerts = kafka.collect(
        kafka.topics.alerts, lambda got: all(45 in spikes(got, run) for run in runs), 180
    )
    for run in runs:
        assert spikes(alerts, run) == [30, 45], alerts
    # the runs were restored from the table: said in a log line and counted
    restored = [w for w in (second, third) if "restored from the runs table" in w.log.read_text()]
    assert restored, "no worker said it restored a run"
    assert sum(sample(w.metrics(), "steplens_worker_run_restores_total") for w in restored) >= 1

    def shares():
        return sorted(
            int(float(line.rsplit(" ", 1)[1]))
            for w in (second, third)
            for line in w.metrics().splitlines()
            if line.startswith("steplens_worker_raw_partitions ")
        )

    deadline = time.monotonic() + 60  # a rebalance may still be settling
    while shares() != [4, 4] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert shares() == [4, 4]  # the 8 raw partitions are split between the two workers
    # records replayed after the kill (uncommitted offsets) were not applied twice
    transitions = [(a.run_id, a.data["fingerprint"], a.data["state"], a.step) for a in alerts]
    assert len(transitions) == len(set(transitions))


def test_a_spike_alert_names_its_batch_and_lr_events_are_published(kafka, workers):
    """Through the worker: a loss spike's incident names the samples of that step's batch on
    its rank (kept from a batch record of another message), and the declared warmup's end is
    an ``lr_event`` signal on the signals topic, published though quiet."""
    run = f"run-{uuid.uuid4().hex[:6]}"
    w = workers("--no-arima").start()
    w.wait_metrics()
    sched = {"kind": "constant", "peak_lr": 1e-3, "warmup_steps": 10}
    kafka.send([make_record("run_meta", {"world_size": 1, "lr_schedule": sched}, run_id=run)])
    recs = []
    for r in steps(run, 0, 80, spike_at=60):
        ids = [f"doc-{r.step}-{k}" for k in range(4)]
        hashes = [f"{r.step:08x}{k:08x}" for k in range(4)]
        data = {"n_samples": 4, "sample_hashes": hashes, "sample_ids": ids}
        recs.append(make_record("batch", data, run_id=run, step=r.step, time_ns=r.time_ns))
        lr = 1e-3 * min(1.0, (r.step + 1) / 10)
        recs.append(make_record("step", {**r.data, "lr": lr}, run_id=run, step=r.step,
                                seq=r.seq, time_ns=r.time_ns))  # fmt: skip
    kafka.send(recs)
    alerts = kafka.collect(
        kafka.topics.alerts, lambda got: bool(alerts_matching(got, state="firing"))
    )
    fired = alerts_matching(alerts, state="firing")
    assert fired[0].step == 60 and fired[0].data["rule"] == "spike:loss"
    member = next(m for m in fired[0].data["evidence"]["members"] if m["rule"] == "spike:loss")
    assert member["samples"]["ids"] == [f"doc-60-{k}" for k in range(4)]
    assert member["samples"]["hashes"][0] == f"{60:08x}{0:08x}"
    sigs = kafka.collect(
        kafka.topics.signals, lambda got: any(s.data["name"] == "lr_event" for s in got)
    )
    events = [s for s in sigs if s.data["name"] == "lr_event"]
    assert [
        (e.step, e.data["detail"]["kind"], e.data["detail"]["declared_step"]) for e in events
    ] == [(9, "warmup_end", 10)]
    assert "Crashed" not in w.log.read_text()


def test_runs_and_ranks_past_the_limits_are_left_out_and_idle_runs_retired(kafka, workers):
    """`--max-runs 1 --max-ranks 2`: a second run is not scored while the first is kept, and a
    third rank's records are dead letters that name the limit. Once the first run has been
    idle for `--run-idle-hours` it is retired (tombstones for its state in the changelog), and
    the second run is scored."""
    tag = uuid.uuid4().hex[:6]
    a, b = f"lim-a-{tag}", f"lim-b-{tag}"
    idle_s = 12.0
    w = workers(
        "--no-arima",
        "--no-history",
        "--checkpoint-s",
        "1",
        "--max-runs",
        "1",
        "--max-ranks",
        "2",
        "--run-idle-hours",
        str(idle_s / 3600),
    ).start()
    w.wait_metrics()
    kafka.send(steps(a, 0, 20, rank=0) + steps(a, 0, 20, rank=1))
    wait_scored(w, 40)
    kafka.send(steps(a, 0, 5, rank=2))  # ranks are kept first come, first served
    dead = kafka.collect(kafka.topics.dead_letters, lambda got: len(got) >= 5)
    assert {d.data["reason"] for d in dead} == {f"rank 2: run {a} has its 2 ranks (--max-ranks)"}
    kafka.send(steps(b, 0, 10))

    def limited(outcome: str) -> float:
        return sample(w.metrics(), "steplens_worker_run_limits_total", outcome=outcome)

    deadline = time.monotonic() + 30
    while limited("refused_messages") < 1:
        assert time.monotonic() < deadline, w.metrics()
        time.sleep(0.1)
    assert limited("refused_records") == 5
    assert f"run {b} is not scored" in w.log.read_text()
    deadline = time.monotonic() + 60
    while limited("retired_runs") < 1:
        assert time.monotonic() < deadline, w.metrics()
        time.sleep(0.2)
    changelog = kafka.collect(
        f"{w.app_id}-runs-changelog",
        lambda got: any(k == a.encode() and v is None for k, v in got),
        30,
        raw=True,
    )
    last = {k.decode(): v for k, v in changelog if k and k.startswith(a.encode())}
    # every key the run had (its head and its kept ranks' series, in whatever slots) is gone
    assert a in last and all(v is None for v in last.values()), last
    kept = {r for r in range(3) for slot in (0, 1) if rank_key(a, r, slot) in last}
    assert kept == {0, 1}, last
    kafka.send(steps(b, 10, 20))
    wait_scored(w, 50)  # a's 40, then b's second 10 (its first 10 were refused)


def test_the_route_stage_starts_where_the_worker_group_left_the_raw_topic(kafka, workers):
    """A worker group whose raw offsets were committed by its Faust agent (earlier versions)
    and whose route group has none: the route stage starts at those offsets, not at the start
    of the topic. Then a worker stopped and started again goes on from its own commits: every
    step is scored once."""
    from confluent_kafka import Consumer, TopicPartition

    run = f"run-{uuid.uuid4().hex[:6]}"
    kafka.send(steps(run, 0, 100))  # routed and committed by the worker group before
    w = workers("--no-arima", "--fetch-wait-ms", "40")
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": w.app_id})
    parts = c.list_topics(kafka.topics.raw, timeout=10).topics[kafka.topics.raw].partitions
    ends = [
        TopicPartition(
            kafka.topics.raw, p, c.get_watermark_offsets(TopicPartition(kafka.topics.raw, p))[1]
        )
        for p in parts
    ]
    c.commit(offsets=ends, asynchronous=False)
    c.close()
    kafka.send(steps(run, 100, 150))
    w.start().wait_metrics()

    def settled(n: int) -> None:
        """Until ``n`` step records are scored and the route stage is at the raw topic's end;
        then no more come."""
        deadline = time.monotonic() + 90
        while True:
            text = w.metrics()
            done = sample(text, "steplens_worker_records_total", kind="step") >= n
            if done and sample(text, "steplens_worker_consumer_lag") == 0:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
        time.sleep(2.0)
        assert sample(w.metrics(), "steplens_worker_records_total", kind="step") == n

    settled(50)
    w.stop()
    kafka.send(steps(run, 150, 170))
    w.start().wait_metrics()
    settled(20)  # a new process: its count starts at 0, and the route group's commits hold
