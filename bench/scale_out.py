"""Workers as a group: runs trained against several workers of one app id, some SIGKILLed.

The pieces of the scale-out scenario, shared by ``bench_faults.py`` (a private stack) and the
stack test ``tests/stream_jobs/test_worker_group.py`` (the shared one):

* ``Group``: ``steplens worker`` processes of one ``--app-id`` (one consumer group), each in a
  process group of its own, so a SIGKILL takes its fit pool with it;
* ``Training``: runs of ranks logging every step (full resolution) at a steady rate, a loss
  spike on rank 0 every ``spike_every`` steps, each record at the wall time it is sent;
* ``AlertWatch``: the alert topic read as it is written, each record with its arrival time;
* ``judge``: lost spikes (no incident fired at its step), doubled ones (fired under more than
  one identity: fingerprint and time), false incidents (fired at a step that is no spike), and
  the takeover: from a kill to the alert of the first spike sent after it, on every run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer

from steplens.schema import Record, decode, encode, make_record


def metric(port: int, name: str) -> float:
    """The sum of a metric's samples on a worker's /metrics (0 when it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    lines = text.splitlines()
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith((name + "{", name + " ")))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Group:
    """Worker processes of one app id; ``env`` names the topics and the broker."""

    def __init__(self, env: dict[str, str], root: Path, app_id: str, *extra: str) -> None:
        self.env, self.root, self.app_id, self.extra = env, root, app_id, extra
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []

    def start(self) -> int:
        """Start one more worker; returns its index."""
        i, port = len(self.procs), free_port()
        state = self.root / f"worker{i}"
        state.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "steplens.schema.command", "worker", "--app-id"]
        args += [self.app_id, "--state-dir", str(state), "--web-port", str(port), *self.extra]
        log = (self.root / f"worker{i}.log").open("ab")
        proc = subprocess.Popen(
            args, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append(proc)
        self.ports.append(port)
        return i

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p.poll() is None]

    def wait_ready(self, raw_partitions: int, timeout_s: float = 180.0) -> None:
        """Until the live workers hold every raw partition between them, each some."""
        deadline = time.monotonic() + timeout_s
        while True:
            live = self.alive()
            if len(live) < len(self.procs):
                raise RuntimeError(f"a worker exited: {self.tail()}")
            held = [metric(self.ports[i], "steplens_worker_raw_partitions") for i in live]
            if all(h > 0 for h in held) and sum(held) == raw_partitions:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready: raw partitions held {held}")
            time.sleep(0.3)

    def tail(self, lines: int = 20) -> str:
        out = []
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                text = (self.root / f"worker{i}.log").read_text(errors="replace")
                tail = "\n".join(text.splitlines()[-lines:])
                out.append(f"worker{i} (exit {p.returncode}): {tail}")
        return "\n".join(out)

    def kill(self, i: int) -> None:
        os.killpg(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait(30)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


def loss_at(step: int, spike: bool) -> float:
    loss = 2.0 / (1 + step / 200) + 0.01 * ((step * 7919) % 13) / 13
    return loss * 50 if spike else loss


class Training(threading.Thread):
    """``runs`` runs of ``ranks`` ranks, ``steps`` steps each at ``rate`` steps per second,
    every step sent, ``batch_steps`` to a ``step_batch`` record as the producer's full
    resolution sends them (one producer for all: the ranks' keys and order are the
    producers')."""

    def __init__(
        self,
        bootstrap: str,
        raw_topic: str,
        runs: list[str],
        ranks: int,
        steps: int,
        rate: float,
        spike_every: int,
        batch_steps: int = 5,
    ) -> None:
        super().__init__(daemon=True)
        self.batch_steps = batch_steps  # steps per step_batch record (the producer's batches)
        self.bootstrap, self.raw_topic = bootstrap, raw_topic
        self.runs, self.ranks, self.steps = runs, ranks, steps
        self.rate, self.spike_every = rate, spike_every
        self.step = -1  # the last step sent
        self.stepped = threading.Condition()
        self.failed: str | None = None

    def spikes(self) -> list[int]:
        return list(range(self.spike_every, self.steps, self.spike_every))

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        t0 = time.monotonic()
        batches: dict[tuple[str, int], list[dict[str, float | int]]] = defaultdict(list)
        for step in range(self.steps):
            now = time.time_ns()
            for run_id in self.runs:
                for rank in range(self.ranks):
                    spike = rank == 0 and step > 0 and step % self.spike_every == 0
                    entries = batches[(run_id, rank)]
                    entries.append(
                        {
                            "step": step,
                            "time_ns": now,
                            "loss": loss_at(step, spike),
                            "grad_norm": 1.0 + 0.05 * (step % 5),
                            "lr": 1e-3,
                        }
                    )
                    if len(entries) < self.batch_steps and step < self.steps - 1:
                        continue
                    rec = make_record(
                        "step_batch",
                        {"records": entries},
                        run_id=run_id,
                        rank=rank,
                        step=step,
                        seq=step,
                        time_ns=now,
                    )
                    producer.produce(self.raw_topic, encode(rec), key=rec.key)
                    batches[(run_id, rank)] = []
            producer.poll(0)
            with self.stepped:
                self.step = step
                self.stepped.notify_all()
            time.sleep(max(0.0, t0 + (step + 1) / self.rate - time.monotonic()))
        if producer.flush(30):
            self.failed = "records left unsent"

    def wait_step(self, step: int, timeout_s: float) -> None:
        with self.stepped:
            if not self.stepped.wait_for(lambda: self.step >= step, timeout_s):
                raise RuntimeError(f"training did not reach step {step}")


@dataclass
class Seen:
    at: float  # wall time it arrived, s
    rec: Record


class AlertWatch(threading.Thread):
    """The alert topic from its start, as it is written."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.got: list[Seen] = []
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.subscribed = threading.Event()

    def run(self) -> None:
        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"watch-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        c.subscribe([self.topic])
        self.subscribed.set()
        try:
            while not self.halt.is_set():
                for m in c.consume(200, timeout=0.2):
                    if m.error() is not None:
                        continue
                    rec = decode(m.value())
                    if isinstance(rec, Record):
                        with self.lock:
                            self.got.append(Seen(time.time(), rec))
        finally:
            c.close()

    def records(self) -> list[Seen]:
        with self.lock:
            return list(self.got)

    def wait(self, cond: Callable[[list[Seen]], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not cond(self.records()):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


@dataclass
class Verdict:
    spikes: int  # spikes sent, all runs
    lost: int  # spikes without a firing incident at their step
    doubled: int  # incidents beyond one per spike, and reports beyond one time per step
    false: int  # firing reports of incidents that started at a step that is no spike
    records: int  # alert records in all
    takeover_s: list[float] = field(default_factory=list)  # per kill, on the slowest run
    details: list[str] = field(default_factory=list)

    def line(self) -> str:
        takeover = ", ".join(f"{t:.1f}" for t in self.takeover_s) or "-"
        return (
            f"spikes {self.spikes}, lost {self.lost}, doubled {self.doubled}, "
            f"false {self.false}, alert records {self.records}, takeover {takeover} s"
        )


def firings(seen: list[Seen], run_id: str) -> list[Seen]:
    return [s for s in seen if s.rec.run_id == run_id and s.rec.data.get("state") == "firing"]


def judge(
    seen: list[Seen],
    runs: list[str],
    spikes: list[int],
    kills: list[tuple[float, int]],
) -> Verdict:
    """``kills``: (wall time of a kill, the first spike step sent after it)."""
    v = Verdict(spikes=len(runs) * len(spikes), lost=0, doubled=0, false=0, records=len(seen))
    wanted = set(spikes)
    for run_id in runs:
        fired = firings(seen, run_id)
        fps: dict[int, set[str]] = defaultdict(set)  # spike step -> its incidents
        times: dict[tuple[str, int | None], set[int]] = defaultdict(set)  # a report's times
        for s in fired:
            started = s.rec.data.get("started_step", s.rec.step)
            if started in wanted:
                fps[started].add(s.rec.data["fingerprint"])
                times[(s.rec.data["fingerprint"], s.rec.step)].add(s.rec.time_ns)
            else:
                v.false += 1
                v.details.append(f"{run_id}: false {s.rec.data['rule']} at step {started}")
        for step in spikes:
            got = fps.get(step, set())
            v.lost += not got
            v.doubled += max(0, len(got) - 1)
            if len(got) > 1:
                v.details.append(f"{run_id}: spike {step} fired as {sorted(got)}")
        for (fp, step), ts in times.items():  # one report, at two times: two points
            v.doubled += len(ts) - 1
            if len(ts) > 1:
                v.details.append(f"{run_id}: {fp} at step {step} fired at {len(ts)} times")
    for at, step in kills:
        slowest = 0.0
        for run_id in runs:
            first = [
                s.at
                for s in firings(seen, run_id)
                if s.rec.data.get("started_step", s.rec.step) == step
            ]
            slowest = max(slowest, min(first) - at if first else float("inf"))
        v.takeover_s.append(slowest)
    return v


@dataclass(frozen=True)
class Plan:
    runs: int = 4
    ranks: int = 2
    rate: float = 20.0  # steps per second, per rank
    spike_every: int = 150
    steps: int = 1200
    kills: tuple[int, ...] = (890,)  # steps at which a worker is killed (just before a spike)
    workers: int = 2
    settle_s: float = 60.0


def scale_out(
    env: dict[str, str],
    raw_topic: str,
    alerts_topic: str,
    root: Path,
    plan: Plan,
    worker_args: tuple[str, ...] = ("--no-arima", "--no-history"),
) -> Verdict:
    """Train ``plan.runs`` runs against ``plan.workers`` workers, SIGKILL one at each step of
    ``plan.kills``, and judge the alert topic."""
    bootstrap = env["STEPLENS_KAFKA_BOOTSTRAP"]
    tag = uuid.uuid4().hex[:6]
    runs = [f"group-{tag}-{k}" for k in range(plan.runs)]
    group = Group(env, root, f"sj-group-{tag}", *worker_args)
    watch = AlertWatch(bootstrap, alerts_topic)
    watch.start()
    try:
        for _ in range(plan.workers):
            group.start()
        raw_partitions = _partitions(bootstrap, raw_topic)
        group.wait_ready(raw_partitions)
        train = Training(
            bootstrap, raw_topic, runs, plan.ranks, plan.steps, plan.rate, plan.spike_every
        )
        train.start()
        kills: list[tuple[float, int]] = []
        for step in plan.kills:
            train.wait_step(step, plan.steps / plan.rate * 3)
            victim = group.alive()[-1]
            at = time.time()
            group.kill(victim)
            kills.append((at, (step // plan.spike_every + 1) * plan.spike_every))
        train.join()
        if train.failed:
            raise RuntimeError(train.failed)
        last = train.spikes()[-1]

        def settled(got: list[Seen]) -> bool:
            return all(
                any(s.rec.data.get("started_step") == last for s in firings(got, r)) for r in runs
            )

        watch.wait(settled, plan.settle_s)
        time.sleep(3.0)  # what a rebalance replays comes after the last spike's alert
        got = watch.records()
        with (root / "alerts.txt").open("w") as f:  # for a look at what went wrong
            for s in got:
                d = s.rec.data
                f.write(
                    f"{s.at:.2f} {s.rec.run_id} step {s.rec.step} {d['state']} {d['rule']} "
                    f"{d['fingerprint']} started {d.get('started_step')} time {s.rec.time_ns}\n"
                )
        return judge(got, runs, train.spikes(), kills)
    finally:
        watch.halt.set()
        group.stop()


def _partitions(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"meta-{uuid.uuid4().hex[:6]}"})
    try:
        return len(c.list_topics(topic, timeout=10).topics[topic].partitions)
    finally:
        c.close()


def drain(
    env: dict[str, str],
    raw_topic: str,
    root: Path,
    workers: int,
    plan: Plan,
    worker_args: tuple[str, ...] = ("--no-arima", "--no-history"),
) -> float:
    """Seconds ``workers`` workers take to score a backlog of ``plan.runs`` runs of
    ``plan.steps`` steps a rank (sent at once once the workers hold their partitions)."""
    bootstrap = env["STEPLENS_KAFKA_BOOTSTRAP"]
    tag = uuid.uuid4().hex[:6]
    runs = [f"drain-{tag}-{k}" for k in range(plan.runs)]
    group = Group(env, root, f"sj-drain-{tag}", *worker_args)
    try:
        for _ in range(workers):
            group.start()
        group.wait_ready(_partitions(bootstrap, raw_topic))
        total = plan.runs * plan.ranks * plan.steps
        train = Training(bootstrap, raw_topic, runs, plan.ranks, plan.steps, 1e9, 10**9, 20)
        t0 = time.monotonic()
        train.run()  # as fast as the producer goes: a backlog
        deadline = t0 + plan.settle_s + total / 500
        while sum(metric(p, "steplens_worker_records_total") for p in group.ports) < total:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the backlog was not scored: {group.tail()}")
            time.sleep(0.1)
        return time.monotonic() - t0
    finally:
        group.stop()
