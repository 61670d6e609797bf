"""One `steplens worker` process against the real Kafka: throughput and log_step -> alert latency.

Baselines measured in the same run, on the same pre-filled raw topic:
  * a plain confluent-kafka consumer (the broker's floor),
  * a Faust agent that does nothing but count (``take_events`` with the worker's batch and
    ``within``): what Faust's per-record machinery alone costs on this machine (the worker's
    route stage was such an agent), and
  * the worker's route stage alone (``worker.router``: read, group by run, forward to a by-run
    topic, commit), with its CPU per record.
Then the worker (every signal on, ARIMA fits in its pool) drains the topic: records/s from its
own Prometheus counter. Last, latency under load: step records at a fixed offered rate (a share
of the worker's measured rate) for several runs, each with a loss spike every 40 steps on one
rank; the time from the record's creation (``time_ns``, as ``log_step`` stamps it) to the
firing alert on the alerts topic, p50/p99.

    python bench/bench_stream_worker.py                    # about 2 minutes
    python bench/bench_stream_worker.py --records 100000 --latency-seconds 60
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scratch_topics import scratch_topics
from steplens.schema import Record, decode, encode, make_record
from steplens.schema.topics import Topics, ensure_topics

try:
    from steplens.stream_jobs.worker.settings import WorkerSettings
except ImportError:  # an earlier release (``--before``-style runs of its code)
    from steplens.stream_jobs.worker.app import WorkerSettings  # type: ignore[no-redef]

sys.path.insert(0, str(Path(__file__).parent))
from bench_stream_throughput import step_records

BATCH, WITHIN = WorkerSettings.batch, WorkerSettings.within_s  # as the worker takes batches


def null_agent(bootstrap: str, topic: str, n: int) -> None:
    """Child process: count ``n`` records through a Faust agent, print the rate."""
    import faust

    tag = uuid.uuid4().hex[:8]
    app = faust.App(
        f"bench-null-{tag}",
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        datadir=tempfile.mkdtemp(prefix="bench-null-"),
    )
    src = app.topic(topic, key_serializer="raw", value_serializer="raw")
    seen = {"n": 0, "t0": 0.0}

    async def count(stream):
        async for events in stream.take_events(BATCH, within=WITHIN):
            if not seen["t0"]:
                seen["t0"] = time.perf_counter()
            seen["n"] += len(events)
            if seen["n"] >= n:
                rate = seen["n"] / (time.perf_counter() - seen["t0"])
                print(f"NULL_RATE {rate:.1f}", file=sys.__stderr__, flush=True)
                os._exit(0)

    app.agent(src, name="count")(count)

    @app.task
    async def quiet_logs() -> None:  # as the worker does: the root logger off DEBUG
        logging.getLogger().setLevel(logging.WARNING)

    sys.argv = [sys.argv[0], "worker", "-l", "warn"]
    app.main()


def run_null_agent(bootstrap: str, topic: str, n: int) -> float:
    proc = subprocess.run(
        [sys.executable, __file__, "--null-agent", topic, "--records", str(n)],
        env={**os.environ, "STEPLENS_KAFKA_BOOTSTRAP": bootstrap},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    for line in proc.stderr.splitlines():
        if line.startswith("NULL_RATE"):
            return float(line.split()[1])
    raise RuntimeError(f"the null agent did not finish: {proc.stderr[-2000:]}")


def route_stage(bootstrap: str, topics: Topics, n: int) -> tuple[float, float]:
    """The route stage alone over the pre-filled raw topic: records/s and CPU us a record
    (the process's, librdkafka's threads included), from its first batch on."""
    import resource

    from steplens.stream_jobs.engine.signals.registry import SERIES_RANKS
    from steplens.stream_jobs.worker.router import Router
    from steplens.stream_jobs.worker.run_shards import first_ranks
    from steplens.stream_jobs.worker.settings import ensure_worker_topics

    s = WorkerSettings(bootstrap=bootstrap, topics=topics, app_id=f"route-{uuid.uuid4().hex[:8]}")
    ensure_worker_topics(s)
    first = first_ranks(SERIES_RANKS, s.shard_ranks)
    router = Router(s, lambda reason, *_: reason.encode(), first=first)
    router.start()  # its thread routes; this one watches the count
    try:
        deadline = time.monotonic() + 120
        while router.routed == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        t0, n0 = time.perf_counter(), router.routed
        u = resource.getrusage(resource.RUSAGE_SELF)
        c0 = u.ru_utime + u.ru_stime
        while router.routed < n and time.monotonic() < deadline:
            time.sleep(0.01)
        u = resource.getrusage(resource.RUSAGE_SELF)
        done = router.routed - n0
        rate = done / (time.perf_counter() - t0)
        cpu_us = 1e6 * (u.ru_utime + u.ru_stime - c0) / max(done, 1)
    finally:
        router.stop()
    return rate, cpu_us


def plain_consumer(bootstrap: str, topic: str, n: int) -> float:
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"floor-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([topic])
    total, timed, t0 = 0, 0, 0.0
    deadline = time.monotonic() + 120
    while total < n and time.monotonic() < deadline:
        msgs = [m for m in c.consume(1000, 0.5) if not m.error()]
        total += len(msgs)
        if t0:
            timed += len(msgs)
        elif msgs:
            t0 = time.perf_counter()  # the first batch (after the group join) starts the clock
    rate = timed / (time.perf_counter() - t0)
    c.close()
    return rate


def worker_counter(port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("steplens_worker_records_total{")
    )


def start_worker(
    bootstrap: str, topics: Topics, tag: str, port: int, extra: list[str]
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "STEPLENS_KAFKA_BOOTSTRAP": bootstrap,
        "STEPLENS_TOPIC_RAW": topics.raw,
        "STEPLENS_TOPIC_SIGNALS": topics.signals,
        "STEPLENS_TOPIC_ALERTS": topics.alerts,
        "STEPLENS_TOPIC_DEADLETTER": topics.dead_letters,
    }
    cmd = [sys.executable, "-m", "steplens.schema.command", "worker", "--app-id", f"bench-{tag}"]
    cmd += ["--state-dir", tempfile.mkdtemp(prefix="bench-worker-"), "--web-port", str(port)]
    cmd += extra
    log = os.environ.get("BENCH_WORKER_LOG")  # the worker's output, for a failed run
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=out)


def drain_rate(port: int, n: float, since: float = 0.0) -> float:
    """Records/s of the worker from its first record past ``since`` until it has ``n`` (or
    until its counter stops moving for 10 s: then the rate of what it did)."""
    deadline = time.monotonic() + 300
    while worker_counter(port) <= since and time.monotonic() < deadline:
        time.sleep(0.05)
    t0, n0 = time.monotonic(), worker_counter(port)
    last, moved = n0, t0
    while last < n and time.monotonic() < deadline and time.monotonic() - moved < 10:
        time.sleep(0.1)
        now = worker_counter(port)
        if now != last:
            last, moved = now, time.monotonic()
    if last < n:
        print(f"  (the worker stopped at {last - since:,.0f} of {n - since:,.0f} records)")
    return (last - n0) / max(moved - t0, 1e-6)


class AlertTimer:
    """Times spike records to their firing ``spike:loss`` alerts on the alerts topic."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"lat-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "latest",
            }
        )
        self.consumer.subscribe([topic])
        self.consumer.poll(2.0)
        self.sent_at: dict[tuple[str, int], float] = {}
        self.latencies: list[float] = []

    def sent(self, run: str, step: int, t_ns: int) -> None:
        self.sent_at[(run, step)] = t_ns / 1e9

    def collect(self, timeout: float) -> None:
        for m in self.consumer.consume(1000, timeout):
            if m.error():
                continue
            a = decode(m.value())
            if not isinstance(a, Record) or a.kind != "alert" or a.data["state"] != "firing":
                continue
            key = (a.run_id, a.step or 0)
            if a.data["rule"] == "spike:loss" and key in self.sent_at:
                self.latencies.append(time.time() - self.sent_at.pop(key))

    def finish(self, grace_s: float) -> list[float]:
        end = time.monotonic() + grace_s
        while self.sent_at and time.monotonic() < end:
            self.collect(0.2)
        self.consumer.close()
        if self.sent_at:
            print(f"  ({len(self.sent_at)} spikes had no firing alert {grace_s:g} s after the end)")
        return self.latencies


def latency(bootstrap: str, topics: Topics, rate: float, seconds: float, runs: int) -> list[float]:
    """Offer step records at ``rate``/s over ``runs`` runs x 8 ranks; spike one rank's loss
    every 40 steps; return the seconds from each spike's record to its firing alert."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    timer = AlertTimer(bootstrap, topics.alerts)
    rng = random.Random(2)
    names = [f"lat-{uuid.uuid4().hex[:6]}-{i}" for i in range(runs)]
    tick = runs * 8 / rate  # seconds per step of every run
    start = time.monotonic()
    end = start + seconds
    step = 0
    while time.monotonic() < end:
        step += 1
        for j, run in enumerate(names):
            spike = step > 100 and (step + 5 * j) % 40 == 0
            for r in range(8):
                t_ns = time.time_ns()
                loss = 50.0 if spike and r == 0 else 2.0 + rng.gauss(0, 0.01)
                rec = make_record(
                    "step",
                    {"loss": loss, "grad_norm": 1.0 + rng.gauss(0, 0.01), "step_time_s": 0.1},
                    run_id=run,
                    rank=r,
                    step=step,
                    time_ns=t_ns,
                )
                p.produce(topics.raw, encode(rec), key=rec.key)
                if spike and r == 0:
                    timer.sent(run, step, t_ns)
        p.poll(0)
        timer.collect(0.0)
        ahead = start + step * tick - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    p.flush(30)
    return timer.finish(10.0)


def training_series(
    prefix: str,
    runs: int,
    ranks: int,
    steps_per_s: float,
    seconds: float,
    seed: int,
    every: int,
    margin: int,
) -> tuple[list[str], dict[str, Any], dict[int, list[int]], int]:
    """Step metrics of ``runs x ranks`` ranks (rows ``run * ranks + rank``): a falling loss,
    grad norm, step time and throughput, with a loss spike on one rank per run every ``every``
    steps from a quarter of the run (the baselines warm) to ``margin`` steps before its end
    (a spike's alert resolves before the next). Returns (run names, series, step -> spiking
    rows, steps)."""
    import numpy as np

    n_steps = int(seconds * steps_per_s)
    rng = np.random.default_rng(seed)
    names = [f"{prefix}-{uuid.uuid4().hex[:6]}-{i}" for i in range(runs)]
    k = runs * ranks
    base = 2.5 - 0.5 * np.arange(n_steps) / n_steps
    loss = base + rng.normal(0, 0.02, (k, n_steps))
    grad = 1.0 + rng.normal(0, 0.05, (k, n_steps))
    step_time = 1.0 / steps_per_s + rng.normal(0, 0.0005, (k, n_steps))
    tps = 4096 / step_time
    spikes: dict[int, list[int]] = {}
    for j in range(runs):
        for st in range(n_steps // 4 + j * every // runs, n_steps - margin, every):
            row = j * ranks + int(rng.integers(ranks))
            loss[row, st] = 60.0
            spikes.setdefault(st, []).append(row)
    series = {"loss": loss, "grad_norm": grad, "step_time_s": step_time, "tokens_per_s": tps}
    return names, series, spikes, n_steps


def producer_traffic(
    bootstrap: str,
    topics: Topics,
    runs: int,
    ranks: int,
    steps_per_s: float,
    seconds: float,
    window: int = 100,
    sample_every: int = 100,
) -> tuple[list[float], int, int]:
    """What the producer sends for ``runs x ranks`` ranks logging ``steps_per_s`` steps each
    (its defaults: a step_window every ``window`` steps, one step in ``sample_every`` raw, a
    guard-flagged spike raw at once). Returns (spike -> firing alert latencies, messages sent,
    steps represented).
    """
    import numpy as np
    from confluent_kafka import Producer

    names, series, spikes, n_steps = training_series(
        "traffic", runs, ranks, steps_per_s, seconds, seed=3, every=3 * window, margin=window
    )
    k = runs * ranks

    def stats(v: np.ndarray) -> dict[str, float]:
        return {
            "count": len(v),
            "mean": float(v.mean()),
            "min": float(v.min()),
            "max": float(v.max()),
            "last": float(v[-1]),
            "nonfinite": 0,
        }

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    timer = AlertTimer(bootstrap, topics.alerts)
    sent = 0

    def send(kind: str, row: int, step: int, data: dict[str, object]) -> None:
        nonlocal sent
        rec = make_record(
            kind,
            data,
            run_id=names[row // ranks],
            rank=row % ranks,
            step=step,
            time_ns=time.time_ns(),
        )
        p.produce(topics.raw, encode(rec), key=rec.key)
        sent += 1

    for st in paced(n_steps, steps_per_s, p, timer):
        for row in spikes.get(st, ()):  # the guard sends a spike at once
            timer.sent(names[row // ranks], st, time.time_ns())
            send("step", row, st, {m: float(v[row, st]) for m, v in series.items()})
        if st % sample_every == 0:
            for row in range(k):
                send("step", row, st, {m: float(v[row, st]) for m, v in series.items()})
        if st % window == window - 1:
            lo = st - window + 1
            for row in range(k):
                metrics = {m: stats(v[row, lo : st + 1]) for m, v in series.items()}
                data = {
                    "step_first": lo,
                    "step_last": st,
                    "count": window,
                    "duration_s": window / steps_per_s,
                    "metrics": metrics,
                }
                send("step_window", row, st, data)
    p.flush(30)
    return timer.finish(15.0), sent, n_steps * k


def paced(n_steps: int, steps_per_s: float, p: Any, timer: AlertTimer) -> Iterator[int]:
    """Steps 0 .. n_steps - 1 at ``steps_per_s``: after each step's sends, serve the producer
    and collect alerts, then wait for the next step's time (no wait once behind)."""
    start = time.monotonic()
    for st in range(n_steps):
        yield st
        p.poll(0)
        timer.collect(0.0)
        ahead = start + (st + 1) / steps_per_s - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)


def full_resolution_traffic(
    bootstrap: str,
    topics: Topics,
    runs: int,
    ranks: int,
    steps_per_s: float,
    seconds: float,
    batch_steps: int = 100,
    batch_s: float = 1.0,
    on_start: Callable[[], None] | None = None,
    on_sent: Callable[[], None] | None = None,
) -> tuple[list[float], int, int, float]:
    """Every step of ``runs x ranks`` ranks, sent as the producer's full-resolution mode sends
    them: a step_batch per rank every ``batch_steps`` steps or ``batch_s`` seconds, and at once
    after a guard-flagged spike. The records are built before the clock starts (the load
    generator shares the machine); a spike's latency runs from its send. ``on_start`` is called
    once the records are built, before the first send, and ``on_sent`` once the last message
    is sent, before the wait for the last alerts. Returns (spike ->
    firing alert latencies, messages sent, steps sent, seconds the sending took)."""
    from confluent_kafka import Producer

    names, series, spikes, n_steps = training_series(
        "full", runs, ranks, steps_per_s, seconds, seed=4, every=300, margin=100
    )
    k = runs * ranks
    cols = list(series.items())
    flush_every = max(1, min(batch_steps, round(batch_s * steps_per_s)))
    # at each step, the messages due then: (key, value, spike run and step or None)
    due: list[list[tuple[bytes, bytes, tuple[str, int] | None]]] = [[] for _ in range(n_steps)]
    for row in range(k):
        run, rank = names[row // ranks], row % ranks
        entries: list[dict[str, object]] = []
        lengths = flush_every - row % flush_every  # ranks' batches do not all end together
        for st in range(n_steps):
            e: dict[str, object] = {"step": st, "time_ns": 0}
            for name, v in cols:
                e[name] = float(v[row, st])
            entries.append(e)
            spike = row in spikes.get(st, ())
            if spike or len(entries) >= lengths or st == n_steps - 1:
                data = {"records": entries}
                rec = make_record("step_batch", data, run_id=run, rank=rank, step=st)
                due[st].append((rec.key, encode(rec), (run, st) if spike else None))
                entries, lengths = [], flush_every
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4"})
    timer = AlertTimer(bootstrap, topics.alerts)
    sent = 0
    if on_start is not None:
        on_start()
    t0 = time.monotonic()
    for st in paced(n_steps, steps_per_s, p, timer):
        for key, value, spiked in due[st]:
            if spiked is not None:
                timer.sent(spiked[0], spiked[1], time.time_ns())
            p.produce(topics.raw, value, key=key)
            sent += 1
    sending_s = time.monotonic() - t0
    if on_sent is not None:
        on_sent()
    p.flush(30)
    return timer.finish(15.0), sent, n_steps * k, sending_s


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--latency-seconds", type=float, default=30.0)
    ap.add_argument("--latency-runs", type=int, default=8)
    ap.add_argument("--load", type=float, default=0.5, help="offered rate / measured rate")
    ap.add_argument("--traffic-steps", type=int, default=20_480, help="step records/s offered")
    ap.add_argument("--traffic-ranks", type=int, default=256)
    ap.add_argument("--traffic-seconds", type=float, default=40.0)
    ap.add_argument(
        "--worker-arg", action="append", default=[], help="pass to `steplens worker` (repeat)"
    )
    ap.add_argument("--traffic-only", action="store_true", help="skip the per-record part")
    ap.add_argument("--no-full", action="store_true", help="skip the full-resolution part")
    ap.add_argument("--null-agent", metavar="TOPIC", help=argparse.SUPPRESS)
    args = ap.parse_args()
    boot = os.environ.get("STEPLENS_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    if args.null_agent:
        null_agent(boot, args.null_agent, args.records)
        return
    tag = uuid.uuid4().hex[:8]
    topics = Topics(
        raw=f"bench.{tag}.raw",
        signals=f"bench.{tag}.signals",
        alerts=f"bench.{tag}.alerts",
        dead_letters=f"bench.{tag}.dead",
    )
    ensure_topics(boot, topics)
    n = 0 if args.traffic_only else prefill(boot, topics.raw, args.records)
    floor = ceiling = 0.0
    if n:
        floor = plain_consumer(boot, topics.raw, n)
        ceiling = run_null_agent(boot, topics.raw, n)
        routed, route_cpu_us = route_stage(boot, topics, n)
        print(f"  route stage alone      {routed:>9,.0f} records/s = {routed / ceiling:.2f}x the "
              f"counting agent, {route_cpu_us:.1f} CPU us a record")  # fmt: skip
    port = args.port = 20464 + random.randrange(500)
    proc = start_worker(boot, topics, tag, port, args.worker_arg)
    args.worker_pid = proc.pid
    try:
        if n:
            per_record(boot, topics, args, port, n, floor, ceiling)
            wait_idle(port)  # a backlog left by the first part would delay the second
        else:
            wait_ready(port, boot, topics)
        traffic(boot, topics, args)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def prefill(boot: str, topic: str, records: int) -> int:
    from confluent_kafka import Producer

    p = Producer(
        {"bootstrap.servers": boot, "linger.ms": 20, "queue.buffering.max.messages": 1_000_000}
    )
    wire = step_records(records, runs=8, ranks=8, seed=1)
    for w in wire:
        p.produce(topic, w, key=decode(w).key)  # type: ignore[union-attr]
        p.poll(0)
    p.flush(60)
    return len(wire)


def wait_ready(port: int, boot: str, topics: Topics) -> None:
    """Until the worker has consumed a first record (it joined the group and got partitions)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": boot})
    rec = make_record("step", {"loss": 1.0}, run_id=f"ready-{uuid.uuid4().hex[:6]}", rank=0, step=0)
    deadline = time.monotonic() + 120
    while worker_counter(port) == 0 and time.monotonic() < deadline:
        p.produce(topics.raw, encode(rec), key=rec.key)
        p.flush(5)
        time.sleep(0.5)


def wait_idle(port: int, quiet_s: float = 2.0, limit_s: float = 180.0) -> None:
    """Until the worker's record counter has not moved for ``quiet_s``."""
    deadline = time.monotonic() + limit_s
    last, since = worker_counter(port), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.25)
        now = worker_counter(port)
        if now != last:
            last, since = now, time.monotonic()


def per_record(
    boot: str,
    topics: Topics,
    args: argparse.Namespace,
    port: int,
    n: int,
    floor: float,
    ceiling: float,
) -> None:
    rate = drain_rate(port, n)
    print(f"worker: {n} step records (5 metrics each), 8 runs x 8 ranks, every signal on")
    print(f"  plain consumer         {floor:>9,.0f} records/s (broker floor)")
    print(f"  Faust agent, counting  {ceiling:>9,.0f} records/s (Faust's own per-record cost)")
    print(
        f"  steplens worker        {rate:>9,.0f} records/s = {rate / ceiling:.2f}x the counting "
        f"agent; target 20,000 -> {rate / 20000:.2f}x"
    )
    offered = args.load * rate
    lat = latency(boot, topics, offered, args.latency_seconds, args.latency_runs)
    report(lat, f"  log_step -> alert at {offered:,.0f} records/s ({args.load:.0%} of that rate):")


def traffic(boot: str, topics: Topics, args: argparse.Namespace) -> None:
    runs, ranks = 8, args.traffic_ranks // 8
    per_s = args.traffic_steps / (runs * ranks)
    secs = args.traffic_seconds
    lat, sent, steps = producer_traffic(boot, topics, runs, ranks, per_s, secs)
    print(
        f"producer traffic: {runs} runs x {ranks} ranks x {per_s:g} steps/s = "
        f"{steps / secs:,.0f} step records/s for {secs:g} s, sent as the producer does by "
        f"default (a window every 100 steps, 1 % raw, guard spikes raw at once): "
        f"{sent / secs:,.0f} messages/s"
    )
    report(lat, "  log_step -> alert:")
    if args.no_full:
        return
    port = args.port
    wait_idle(port)
    before = worker_counter(port)
    t0 = time.monotonic()
    # the cores while the steps were sent: not while the generator built them (the worker
    # idles then), nor the wait after
    shares: list[CpuShares] = []

    def mark() -> None:
        shares.append(CpuShares.now(args.worker_pid))

    lat, sent, steps, sending_s = full_resolution_traffic(
        boot, topics, runs, ranks, per_s, secs, on_start=mark, on_sent=mark
    )
    alerted_s = time.monotonic() - t0  # sending, then the wait for the spikes' alerts
    caught_up = wait_caught_up(port, before + steps)
    took = time.monotonic() - t0
    cpu = shares[1].since(shares[0])
    print(
        f"full resolution: the same {steps / secs:,.0f} step records/s, every step sent and "
        f"scored (a step_batch per rank every 100 steps or 1 s, spikes at once): "
        f"{sent / secs:,.0f} messages/s"
    )
    print(
        f"  worker scored {worker_counter(port) - before:,.0f} of {steps:,} steps, the last "
        f"{'within' if caught_up else 'NOT within'} {took - alerted_s:.1f} s of the last spike's "
        f"alert (or of the wait for it)"
    )
    report(lat, "  log_step -> alert:")
    print(
        f"  cores busy while sending (of {os.cpu_count()}): the worker's event loop "
        f"{cpu['loop']:.2f}, the rest of it (fit pool, client threads) {cpu['pool']:.2f}, "
        f"everything else (Kafka, the load generator) {cpu['other']:.2f}; sending took "
        f"{sending_s:.1f} s for {secs:g} s of steps"
    )
    wait_idle(port)
    before = worker_counter(port)
    start = CpuShares.now(args.worker_pid)
    n = prefill_batched(boot, topics.raw, args.records * 5, 100)
    rate = drain_rate(port, before + n, since=before)
    spent = CpuShares.now(args.worker_pid)
    cpu_s = (spent.loop - start.loop) + (spent.pool - start.pool)
    drained = worker_counter(port) - before
    print(
        f"  a backlog of {n:,} step records in step_batches of 100: drained at {rate:,.0f} step "
        f"records/s; target 20,000 -> {rate / 20000:.2f}x; the worker's CPU "
        f"{cpu_s / max(drained, 1) * 1e5:.2f} s per 100k steps (loop "
        f"{(spent.loop - start.loop) / max(drained, 1) * 1e5:.2f} s; a busy machine slows the "
        f"rate more than this)"
    )


class CpuShares:
    """CPU time of the worker (its main thread and the rest of its process tree) and of the
    whole machine, from /proc, to tell where the cores went during a run."""

    def __init__(self, t: float, loop: float, pool: float, machine: float) -> None:
        self.t, self.loop, self.pool, self.machine = t, loop, pool, machine

    @staticmethod
    def _ticks(path: str) -> float:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @classmethod
    def now(cls, pid: int) -> CpuShares:
        loop = cls._ticks(f"/proc/{pid}/task/{pid}/stat")
        total = cls._ticks(f"/proc/{pid}/stat")
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for child in children:
            with contextlib.suppress(OSError):
                total += cls._ticks(f"/proc/{child}/stat")
        cpu = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = (sum(cpu) - cpu[3] - cpu[4]) / os.sysconf("SC_CLK_TCK")
        return cls(time.monotonic(), loop, total - loop, busy)

    def since(self, start: CpuShares) -> dict[str, float]:
        dt = max(self.t - start.t, 1e-9)
        loop = (self.loop - start.loop) / dt
        pool = (self.pool - start.pool) / dt
        machine = (self.machine - start.machine) / dt
        return {"loop": loop, "pool": pool, "other": max(0.0, machine - loop - pool)}


def prefill_batched(boot: str, topic: str, records: int, batch: int) -> int:
    """``records`` step records (5 metrics, 8 runs x 8 ranks) in step_batches of ``batch``,
    built first, then sent as fast as the producer goes."""
    from confluent_kafka import Producer

    open_: dict[tuple[str, int], list[dict[str, object]]] = {}
    tag = uuid.uuid4().hex[:6]
    wire: list[tuple[bytes, bytes]] = []

    def build(run: str, rank: int, entries: list[dict[str, object]]) -> None:
        last = entries[-1]["step"]
        assert isinstance(last, int)
        rec = make_record(
            "step_batch", {"records": entries}, run_id=f"{run}-{tag}", rank=rank, step=last
        )
        wire.append((rec.key, encode(rec)))

    n = 0
    for w in step_records(records, runs=8, ranks=8, seed=1):
        rec = decode(w)
        assert isinstance(rec, Record)
        entries = open_.setdefault((rec.run_id, rec.rank), [])
        entries.append({"step": rec.step, "time_ns": rec.time_ns, **rec.data})
        n += 1
        if len(entries) >= batch:
            build(rec.run_id, rec.rank, entries)
            open_[(rec.run_id, rec.rank)] = []
    for (run, rank), entries in open_.items():
        if entries:
            build(run, rank, entries)
    p = Producer({"bootstrap.servers": boot, "linger.ms": 20})
    for key, value in wire:
        p.produce(topic, value, key=key)
        p.poll(0)
    p.flush(60)
    return n


def wait_caught_up(port: int, target: float, limit_s: float = 60.0) -> bool:
    """Until the worker's record counter reaches ``target``."""
    deadline = time.monotonic() + limit_s
    while worker_counter(port) < target:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def report(lat: list[float], head: str) -> None:
    if not lat:
        print(f"{head} no alert arrived")
        return
    print(
        f"{head} p50 {statistics.median(lat):.3f} s, p99 {pct(lat, 0.99):.3f} s, "
        f"max {max(lat):.3f} s over {len(lat)} spikes (target p99 <= 2 s)"
    )


if __name__ == "__main__":
    with scratch_topics(os.environ.get("STEPLENS_KAFKA_BOOTSTRAP", "127.0.0.1:19092")):
        main()
