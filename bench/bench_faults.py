"""Faults a careful user tries, each against the real producer, worker and sinks.

One private stack (Kafka, InfluxDB, S3 on free ports in a temporary folder, so killing them never
touches the shared stack); each scenario starts its own worker and sinks (own topics, consumer
groups and S3 prefix), trains two ranks that log every step (full resolution), injects its fault,
waits until every consumer has committed everything, then counts in InfluxDB and in S3:

    <scenario>: sent N, stored N, lost 0, doubled 0

sent: steps the ranks logged; stored: distinct (run, rank, step) found, the fewer of InfluxDB's
and S3's; lost = sent - stored; doubled: points or rows beyond the first for one (run, rank,
step), the more of the two stores. (c) also counts ``firing`` alert points per fingerprint and
step; (f) sends hostile records beside a clean run and checks that no process died and that the
InfluxDB sink dead-lettered each hostile record with a reason.

(g) and (h) are the scale-out path (``scale_out.py``): 4 runs x 2 ranks at full resolution, a
loss spike every 150 steps, against two workers of one app id with one SIGKILLed (g), or three
with two killed one after the other (h); the alert topic is judged for lost, doubled and false
incidents and the takeover (kill to the alert of the next spike, on the slowest run). (i) is the
worker's drain of one backlog with 1 and with 2 workers, and their ratio. (j) is hostile advice
against a run with remedies on (``fault_advice.py``): every forged message refused or bounded,
the lr never below its floor, the ranks train to their last step.

    python bench/bench_faults.py               # about 10 minutes on 2 busy cores
    python bench/bench_faults.py --quick       # shorter training and outages
    python bench/bench_faults.py --only b,e
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from influxdb_client import InfluxDBClient

from steplens.schema import Record, decode, encode, make_record
from steplens.schema.flux_literals import flux_string
from steplens.schema.topics import Topics, ensure_topics
from steplens.sinks.cold import read_parquet, run_prefix
from steplens.sinks.s3 import make_s3_client
from steplens.sinks.settings import S3Settings
from steplens.stack import Stack
from steplens.stack.demo_children import Child, Children, free_port
from steplens.stack.process import free_ports

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fault_advice  # beside this file
import scale_out

SPIKE_RULE = "spike:loss"


@dataclass(frozen=True)
class Plan:
    steps: int  # per rank
    step_s: float
    outage_s: float
    ranks: int = 2
    settle_s: float = 180.0
    group_steps: int = 1800  # per rank, at 30 steps/s (g, h): a multiple of 150
    drain_steps: int = 5000  # per rank, 4 runs x 2 ranks (i)


FULL = Plan(steps=900, step_s=0.03, outage_s=20.0)
QUICK = Plan(steps=360, step_s=0.03, outage_s=8.0, group_steps=1500, drain_steps=2500)


# ------------------------------------------------------------------------------ one rank


def rank_process(run_id: str, steps: int, step_s: float, spike_at: int) -> int:
    """A training rank: the real producer, every step sent (full resolution)."""
    import steplens.producer as sl

    monitor = sl.init(
        run_id=run_id,
        full_resolution=True,
        batch_steps=20,
        batch_s=0.25,
        hw_interval_s=0,
        delivery_timeout_s=5,
    )
    for step in range(steps):
        loss = 2.0 / (1 + step / 200) + 0.01 * ((step * 7919) % 13) / 13
        if step == spike_at and monitor.identity.rank == 0:
            loss *= 50
        sl.log_step(step, loss=loss, lr=1e-3, grad_norm=1.0 + 0.05 * (step % 5))
        time.sleep(step_s)
    sl.shutdown(timeout_s=120)
    print(json.dumps(monitor.stats()), flush=True)
    return 0


# ------------------------------------------------------------------------------ a scenario


class Scenario:
    def __init__(self, stack: Stack, root: Path, key: str, plan: Plan) -> None:
        self.stack, self.key, self.plan = stack, key, plan
        tag = uuid.uuid4().hex[:6]
        self.run_id = f"faults-{key}-{tag}"
        self.topics = Topics(
            raw=f"bf.{key}.{tag}.raw",
            signals=f"bf.{key}.{tag}.signals",
            alerts=f"bf.{key}.{tag}.alerts",
            dead_letters=f"bf.{key}.{tag}.dl",
            raw_partitions=4,
            other_partitions=1,
        )
        self.dir = root / key
        self.dir.mkdir(parents=True)
        self.prefix = f"faults/{key}-{tag}"
        self.env = {
            **os.environ,
            **stack.env(),
            "STEPLENS_TOPIC_RAW": self.topics.raw,
            "STEPLENS_TOPIC_SIGNALS": self.topics.signals,
            "STEPLENS_TOPIC_ALERTS": self.topics.alerts,
            "STEPLENS_TOPIC_DEADLETTER": self.topics.dead_letters,
            "STEPLENS_S3_PREFIX": self.prefix,
            "STEPLENS_SPOOL_DIR": str(self.dir / "spool"),
        }
        self.bootstrap = self.env["STEPLENS_KAFKA_BOOTSTRAP"]
        self.children = Children(self.dir, self.env)
        self.worker: Child | None = None
        self.worker_port = free_port()
        self.s3_port = free_port()
        self.groups = {"worker": f"bf-{key}-{tag}-w", "influx": f"bf-{key}-{tag}-i"}
        self.groups["s3"] = f"bf-{key}-{tag}-s"
        self.ranks: list[subprocess.Popen[str]] = []
        ensure_topics(self.bootstrap, self.topics)

    # -- processes ----------------------------------------------------------------------
    def start_worker(self) -> None:
        args = ["worker", "--app-id", self.groups["worker"], "--web-port", str(self.worker_port)]
        args += ["--state-dir", str(self.dir / "worker"), "--no-arima", "--hang-after", "300"]
        self.worker = self.children.start("worker", args)

    def kill_worker(self) -> None:
        assert self.worker is not None
        os.killpg(self.worker.proc.pid, signal.SIGKILL)
        self.worker.proc.wait(10)
        self.children.running.remove(self.worker)

    def start_consumers(self) -> None:
        self.start_worker()
        common = ["--dead-letter-topic", self.topics.dead_letters]
        common += ["-X", "session.timeout.ms=6000"]
        names = ",".join([self.topics.raw, self.topics.signals, self.topics.alerts])
        for which in ("influx", "s3"):
            extra = ["--metrics-port", "0"]
            if which == "s3":
                extra = ["--metrics-port", str(self.s3_port), "--max-age-s", "2"]
            args = ["sink", which, "--topics", names, "--group", self.groups[which], *common]
            self.children.start(f"sink-{which}", [*args, *extra])
        self.wait_worker_ready()

    def wait_worker_ready(self, timeout_s: float = 180) -> None:
        """Until the worker has read a first record (it joined its group, got partitions)."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "log_level": 4})
        deadline = time.monotonic() + timeout_s
        while _worker_records(self.worker_port) == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start: {self.tail('worker')}")
            probe = make_record(  # each one new: the same record twice would be one
                "step", {"loss": 1.0}, run_id=f"{self.run_id}-probe", time_ns=time.time_ns()
            )
            producer.produce(self.topics.raw, encode(probe), key=probe.key)
            producer.flush(5)
            time.sleep(0.5)

    def train(self, spike_at: int = -1) -> None:
        for rank in range(self.plan.ranks):
            env = {**self.env, "RANK": str(rank), "WORLD_SIZE": str(self.plan.ranks)}
            cmd = [sys.executable, __file__, "--rank-process", self.run_id]
            cmd += [str(self.plan.steps), str(self.plan.step_s), str(spike_at)]
            log = (self.dir / f"rank{rank}.log").open("w")
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
            self.ranks.append(proc)

    def wait_trained(self) -> None:
        for rank, proc in enumerate(self.ranks):
            if proc.wait(self.plan.steps * self.plan.step_s * 4 + 300) != 0:
                raise RuntimeError(f"rank {rank} failed: {self.tail(f'rank{rank}')}")

    def tail(self, name: str, lines: int = 15) -> str:
        path = self.dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def producer_stats(self) -> str:
        """What the ranks' producers say they spooled and replayed (re-sent)."""
        spooled = replayed = 0
        for rank in range(len(self.ranks)):
            last = self.tail(f"rank{rank}", 1)
            try:
                stats = json.loads(last)
            except ValueError:
                return "producer stats unknown"
            spooled += int(stats.get("spooled", 0))
            replayed += int(stats.get("replayed", 0))
        left_out = scale_out.metric(self.s3_port, "steplens_s3_duplicate_rows_total")
        return (
            f"producers spooled {spooled}, replayed {replayed}; "
            f"S3 roller left out {left_out:.0f} duplicate rows"
        )

    def alive(self) -> list[str]:
        return [c.name for c in self.children.running if c.proc.poll() is None]

    # -- waiting ------------------------------------------------------------------------
    def settle(self) -> str:
        """Until the worker and both sinks have committed every offset, twice in a row: "",
        or what did not (the groups behind, the processes that died)."""
        deadline = time.monotonic() + self.plan.settle_s
        wanted = {
            f"{self.groups['worker']}-route": [self.topics.raw],  # the worker's route stage
            self.groups["influx"]: [self.topics.raw, self.topics.signals, self.topics.alerts],
            self.groups["s3"]: [self.topics.raw, self.topics.signals, self.topics.alerts],
        }
        done_once = False
        while time.monotonic() < deadline:
            done = all(_caught_up(self.bootstrap, g, ts) for g, ts in wanted.items())
            if done and done_once:
                return ""
            done_once = done
            time.sleep(2)
        behind = [g for g, ts in wanted.items() if not _caught_up(self.bootstrap, g, ts)]
        dead = [
            f"{c.name} (exit {c.proc.returncode})"
            for c in self.children.running
            if c.proc.poll() is not None
        ]
        return f"NOT SETTLED: behind {', '.join(behind)}; exited: {', '.join(dead) or 'none'}"

    def close(self) -> None:
        self.children.stop_all()
        for proc in self.ranks:
            if proc.poll() is None:
                proc.kill()

    # -- counting -----------------------------------------------------------------------
    def count_steps(self, run_id: str | None = None) -> tuple[int, int, str]:
        """(stored, doubled, details) for the run's steps: stored is the fewer distinct
        (rank, step) of the two stores, doubled the more extra copies."""
        run_id = run_id or self.run_id
        flux = (
            f"from(bucket: {flux_string(self.env['STEPLENS_INFLUX_BUCKET'])})"
            " |> range(start: 0)"
            f' |> filter(fn: (r) => r._measurement == "step" and r.run_id == {flux_string(run_id)}'
            ' and r._field == "step")'
        )
        hot = Counter((r.values["rank"], r.get_value()) for r in self._flux(flux))
        cold = Counter((row["rank"], row["step"]) for row in self._rows("step", run_id))
        stored = min(len(hot), len(cold))
        doubled = max(sum(hot.values()) - len(hot), sum(cold.values()) - len(cold))
        details = f"InfluxDB {len(hot)} stored/{sum(hot.values()) - len(hot)} doubled, "
        details += f"S3 {len(cold)}/{sum(cold.values()) - len(cold)}"
        return stored, doubled, f"{details}; {self.producer_stats()}"

    def count_alerts(self) -> str:
        """Firing alert points and rows per (fingerprint, step): how many, how many doubled."""
        flux = (
            f"from(bucket: {flux_string(self.env['STEPLENS_INFLUX_BUCKET'])})"
            " |> range(start: 0)"
            f' |> filter(fn: (r) => r._measurement == "alert" and r.state == "firing"'
            f" and r.run_id == {flux_string(self.run_id)})"
            ' |> filter(fn: (r) => r._field == "fingerprint" or r._field == "step")'
            ' |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")'
        )
        hot = Counter((r.values.get("fingerprint"), r.values.get("step")) for r in self._flux(flux))
        rows = [r for r in self._rows("alert", self.run_id) if r.get("state") == "firing"]
        cold = Counter((r.get("fingerprint"), r.get("step")) for r in rows)
        spikes = sum(1 for r in rows if r.get("rule") == SPIKE_RULE)
        return (
            f"alerts firing: InfluxDB {sum(hot.values())} ({sum(hot.values()) - len(hot)} "
            f"doubled), S3 {sum(cold.values())} ({sum(cold.values()) - len(cold)} doubled), "
            f"{spikes} {SPIKE_RULE} rows"
        )

    def dead_letters(self) -> list[Record]:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"bf-read-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([self.topics.dead_letters])
        out, idle = [], 0
        while idle < 3:
            got = consumer.consume(500, timeout=1.0)
            idle = 0 if got else idle + 1
            out += [
                r for m in got if m.error() is None and isinstance(r := decode(m.value()), Record)
            ]
        consumer.close()
        return out

    def _flux(self, flux: str) -> list:
        e = self.env
        url, token, org = (
            e["STEPLENS_INFLUX_URL"],
            e["STEPLENS_INFLUX_TOKEN"],
            e["STEPLENS_INFLUX_ORG"],
        )
        with InfluxDBClient(url=url, token=token, org=org, timeout=60_000) as client:
            return [r for t in client.query_api().query(flux, org=org) for r in t.records]

    def _rows(self, kind: str, run_id: str) -> list[dict]:
        s = S3Settings(
            bucket=self.env["STEPLENS_S3_BUCKET"],
            prefix=self.prefix,
            endpoint_url=self.env["STEPLENS_S3_ENDPOINT"],
            access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
        )
        client, rows = make_s3_client(s), []
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=s.bucket, Prefix=run_prefix(s.prefix, kind, run_id)
        )
        for page in pages:
            for obj in page.get("Contents", []):
                body = client.get_object(Bucket=s.bucket, Key=obj["Key"])["Body"].read()
                rows += read_parquet(body).to_pylist()
        return rows


def _worker_records(port: int) -> float:
    return scale_out.metric(port, "steplens_worker_records_total")


def _caught_up(bootstrap: str, group: str, topics: list[str]) -> bool:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = []
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            tps += [TopicPartition(topic, p) for p in meta.partitions]
        done = consumer.committed(tps, timeout=10)
        for tp in done:
            end = consumer.get_watermark_offsets(tp, timeout=10)[1]
            if end > 0 and tp.offset < end:
                return False
        return True
    except Exception:  # the broker is still coming back
        return False
    finally:
        consumer.close()


def _wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


# ------------------------------------------------------------------------------ the faults


def _steps_line(sc: Scenario, label: str, *extra: str) -> str:
    sent = sc.plan.steps * sc.plan.ranks
    stored, doubled, details = sc.count_steps()
    tail = "".join(f"; {e}" for e in extra if e)
    return (
        f"{label}: sent {sent}, stored {stored}, lost {sent - stored}, doubled {doubled} "
        f"({details}){tail}"
    )


def _during_training(sc: Scenario, at: float, fault: Callable[[], None]) -> None:
    """Start the ranks, run ``fault`` once ``at`` of the training time has passed."""
    sc.train()
    time.sleep(sc.plan.steps * sc.plan.step_s * at)
    fault()
    sc.wait_trained()


def _send_left_spool(sc: Scenario) -> str:
    """A rank that ends before Kafka answers again keeps the rest in its spool and says how
    to send it: what a user then does, once Kafka answers. "" when no rank left any."""
    left = sc.dir / "spool"
    if not (left.is_dir() and any(p.is_file() for p in left.rglob("*"))):
        return ""
    cmd = [sys.executable, "-m", "steplens.schema.command", "spool", "send", str(left)]
    done = subprocess.run(cmd, env=sc.env, capture_output=True, text=True, check=False)
    return f"after the run `steplens spool send`: {done.stderr.strip().splitlines()[-1:]}"


def fault_kafka_kill(sc: Scenario) -> str:
    def fault() -> None:
        sc.stack.kill("kafka")
        time.sleep(min(5.0, sc.plan.outage_s))
        sc.stack.start("kafka")

    _during_training(sc, 0.3, fault)
    sent = _send_left_spool(sc)
    return _steps_line(sc, "a kafka SIGKILL + restart", sc.settle(), sent)


def fault_kafka_freeze(sc: Scenario) -> str:
    def fault() -> None:
        sc.stack.pause("kafka")
        time.sleep(sc.plan.outage_s)
        sc.stack.resume("kafka")

    _during_training(sc, 0.3, fault)
    sent = _send_left_spool(sc)
    return _steps_line(sc, f"b kafka SIGSTOP {sc.plan.outage_s:.0f} s", sc.settle(), sent)


def fault_worker_kill(sc: Scenario) -> str:
    spike_at = sc.plan.steps * 2 // 3
    seen = threading.Event()
    stop = threading.Event()

    def watch() -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": sc.bootstrap,
                "group.id": f"bf-watch-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([sc.topics.alerts])
        while not stop.is_set() and not seen.is_set():
            for m in consumer.consume(100, timeout=0.2):
                rec = decode(m.value()) if m.error() is None else None
                if (
                    isinstance(rec, Record)
                    and rec.run_id == sc.run_id
                    and (rec.data.get("rule"), rec.data.get("state")) == (SPIKE_RULE, "firing")
                ):
                    seen.set()
        consumer.close()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    sc.train(spike_at=spike_at)
    killed = ""
    try:
        _wait_for(seen.is_set, sc.plan.steps * sc.plan.step_s * 3 + 60, "the spike's alert")
        sc.kill_worker()
        sc.start_worker()
        killed = "worker SIGKILLed at its spike alert and restarted"
    except RuntimeError as exc:
        killed = f"no spike alert seen ({exc}); worker not killed"
    finally:
        stop.set()
    sc.wait_trained()
    settled = sc.settle()
    return _steps_line(
        sc, "c worker SIGKILL after a loss spike", sc.count_alerts(), killed, settled
    )


def fault_influx_kill(sc: Scenario) -> str:
    def fault() -> None:
        sc.stack.kill("influxdb")
        time.sleep(min(5.0, sc.plan.outage_s))
        sc.stack.start("influxdb")

    _during_training(sc, 0.3, fault)
    return _steps_line(sc, "d influxdb SIGKILL + restart", sc.settle())


def fault_s3_freeze(sc: Scenario) -> str:
    def fault() -> None:
        sc.stack.pause("s3")
        time.sleep(sc.plan.outage_s)
        sc.stack.resume("s3")

    _during_training(sc, 0.3, fault)
    return _steps_line(sc, f"e s3 SIGSTOP {sc.plan.outage_s:.0f} s", sc.settle())


def hostile_records(run_id: str) -> list[tuple[str, bytes]]:
    """(what, bytes) of records a broken or hostile producer could send."""
    now = time.time_ns()

    def wire(data: dict, **envelope: object) -> bytes:
        base = {"v": 1, "kind": "step", "run_id": run_id, "rank": 0, "local_rank": 0}
        base |= {"host": "h", "pid": 1, "seq": 0, "time_ns": now, "step": 1, "data": data}
        return json.dumps({**base, **envelope}).encode()

    return [
        ("malformed JSON", b'{"v": 1, "kind": "step", "run_id": '),
        ("wrong types", wire({"loss": "low", "lr": [1]}, seq=1)),
        ("huge values", wire({"loss": 1.0}, seq=2, step=2**70)),
        ("a huge string", wire({"loss": 1.0, "reason": "x" * 200_000}, seq=3)),
        ("control characters", wire({"loss": 1.0}, seq=4, host="node\x01\n7")),
        ("10,000 names", wire({"scalars": {f"m{i}": 1.0 for i in range(10_000)}}, seq=5)),
    ]


def fault_hostile(sc: Scenario) -> str:
    hostile_run = f"{sc.run_id}-hostile"
    records = hostile_records(hostile_run)
    sc.train()
    producer = Producer({"bootstrap.servers": sc.bootstrap, "message.max.bytes": 2_000_000})
    offsets: dict[str, tuple[int, int]] = {}

    def delivered(what: str) -> Callable[[object, object], None]:
        def on(err: object, msg: object) -> None:
            if err is None:
                offsets[what] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

        return on

    for what, body in records:
        producer.produce(sc.topics.raw, body, key=f"{hostile_run}:0", on_delivery=delivered(what))
    producer.flush(30)
    sc.wait_trained()
    settled = sc.settle()
    letters = [d for d in sc.dead_letters() if d.data.get("source_topic") == sc.topics.raw]
    by_influx = {
        (d.data["partition"], d.data["offset"]): d.data["reason"]
        for d in letters
        if d.data.get("consumer") == sc.groups["influx"]
    }
    lettered = [w for w, at in offsets.items() if by_influx.get(at)]
    missing = [w for w, _ in records if w not in lettered]
    alive = sc.alive()
    extra = (
        f"hostile records: {len(records)} sent, {len(lettered)} dead-lettered with a reason"
        f"{' (not: ' + ', '.join(missing) + ')' if missing else ''}; {len(letters)} dead letters "
        f"in all (worker and both sinks); alive {len(alive)} of 3 ({', '.join(alive)})"
    )
    return _steps_line(sc, "f hostile records", extra, settled)


def fault_hostile_advice(sc: Scenario) -> str:
    advice_topic = sc.topics.advice
    sc.env["STEPLENS_TOPIC_ADVICE"] = advice_topic
    sc.ranks = fault_advice.start_ranks(
        sc.env, sc.run_id, sc.plan.ranks, sc.plan.steps, sc.plan.step_s, sc.dir
    )
    ckpt = fault_advice.first_checkpoint(sc.bootstrap, sc.topics.raw, sc.run_id, timeout_s=120)
    messages = fault_advice.forged(sc.run_id, ckpt)
    sent = fault_advice.send(sc.bootstrap, advice_topic, messages)
    sc.wait_trained()
    settled = sc.settle()
    lettered = sum(1 for d in sc.dead_letters() if d.data.get("source_topic") == advice_topic)
    seen = [fault_advice.rank_seen(sc.dir / f"rank{r}.log") for r in range(sc.plan.ranks)]
    line, held = fault_advice.judge(seen, sent, sc.plan.steps, messages, lettered)
    return _steps_line(sc, "j hostile advice", line + ("" if held else "; NOT HELD"), settled)


def _group_kill(sc: Scenario, label: str, workers: int, kills: tuple[int, ...]) -> str:
    steps = sc.plan.group_steps
    plan = scale_out.Plan(workers=workers, kills=kills, steps=steps, rate=30.0)
    v = scale_out.scale_out(
        sc.env, sc.topics.raw, sc.topics.alerts, sc.dir, plan, ("--no-history",)
    )
    return f"{label}: {v.line()}"


def _before_spike(steps: int, part: float) -> int:
    """A step 10 before a spike, about ``part`` of the way (the takeover is timed to it)."""
    return int(steps * part) // 150 * 150 - 10


def fault_group_one_kill(sc: Scenario) -> str:
    return _group_kill(
        sc, "g 2 workers, 1 SIGKILL", 2, (_before_spike(sc.plan.group_steps, 2 / 3),)
    )


def fault_group_two_kills(sc: Scenario) -> str:
    n = sc.plan.group_steps
    kills = (_before_spike(n, 1 / 3), _before_spike(n, 2 / 3))
    return _group_kill(sc, "h 3 workers, 2 SIGKILLs", 3, kills)


def drain_ratio(sc: Scenario) -> str:
    plan = scale_out.Plan(steps=sc.plan.drain_steps)
    times = []
    for workers in (1, 2):
        topics = Topics(raw=f"{sc.topics.raw}.{workers}", raw_partitions=8)
        ensure_topics(sc.bootstrap, topics)
        env = {**sc.env, "STEPLENS_TOPIC_RAW": topics.raw}
        times.append(scale_out.drain(env, topics.raw, sc.dir / f"drain{workers}", workers, plan))
    n = plan.runs * plan.ranks * plan.steps
    return (
        f"i drain of {n} steps: 1 worker {times[0]:.1f} s ({n / times[0]:.0f} steps/s), "
        f"2 workers {times[1]:.1f} s ({n / times[1]:.0f} steps/s), ratio {times[0] / times[1]:.2f}"
    )


SCENARIOS: dict[str, Callable[[Scenario], str]] = {
    "a": fault_kafka_kill,
    "b": fault_kafka_freeze,
    "c": fault_worker_kill,
    "d": fault_influx_kill,
    "e": fault_s3_freeze,
    "f": fault_hostile,
    "g": fault_group_one_kill,
    "h": fault_group_two_kills,
    "i": drain_ratio,
    "j": fault_hostile_advice,
}
GROUPS = frozenset("ghi")  # scenarios that start their own workers and no sinks
BAD_GROUP = r"(lost|doubled|false) [1-9]|takeover inf"  # a scale-out line that went wrong


def run(keys: list[str], plan: Plan, root: Path) -> list[str]:
    kafka, controller, influx, s3 = free_ports(4)
    stack = Stack(
        home=root / "stack",
        ports={"kafka": kafka, "kafka_controller": controller, "influxdb": influx, "s3": s3},
        progress=lambda _line: None,
    )
    lines = []
    stack.up(services=("kafka", "influxdb", "s3"))  # the faults need no live view
    try:
        for key in keys:
            sc = Scenario(stack, root, key, plan)
            t0 = time.monotonic()
            try:
                if key not in GROUPS:
                    sc.start_consumers()
                line = SCENARIOS[key](sc)
            except Exception as exc:
                line = f"{key}: failed: {type(exc).__name__}: {exc}"
            finally:
                sc.close()
            print(f"{line}  [{time.monotonic() - t0:.0f} s]", flush=True)
            lines.append(line)
    finally:
        stack.down(deadline_s=15)
    return lines


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-process":
        run_id, steps, step_s, spike_at = sys.argv[2:6]
        return rank_process(run_id, int(steps), float(step_s), int(spike_at))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter training and outages")
    ap.add_argument("--only", default="abcdefghij", help="scenarios to run, e.g. a,c")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    args = ap.parse_args()
    keys = [k for k in args.only.replace(",", "") if k in SCENARIOS]
    root = Path(tempfile.mkdtemp(prefix="steplens-faults-"))
    t0 = time.monotonic()
    lines = run(keys, QUICK if args.quick else FULL, root)
    print(f"{len(lines)} scenarios in {time.monotonic() - t0:.0f} s (logs: {root})")
    trouble = any(
        ": failed:" in line
        or "NOT SETTLED" in line
        or "NOT HELD" in line
        or re.search(BAD_GROUP, line)
        for line in lines
    )
    if not args.keep and not trouble:  # logs of a scenario that went wrong are kept
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 1 if trouble else 0


if __name__ == "__main__":
    sys.exit(main())
