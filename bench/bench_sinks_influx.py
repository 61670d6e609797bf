"""InfluxDB sink throughput and latency against the real stack (`steplens stack up`).

1. Points/s through the sink (Kafka -> decode -> points -> InfluxDB -> commit) against
   influxdb-client writing the same points directly (same batches, same run): ratio.
   The same steps as step_batch messages of --batch-steps steps through the sink: steps/s
   against one message per step (same rounds).
2. Record -> queryable latency: one record at a time on the raw topic while the sink runs,
   polled with a Flux query until visible; p50/p99.
--records / --samples make it longer (default about 30-60 s on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sinks"))

from confluent_kafka import Consumer, Producer
from influx_helpers import count_points
from influxdb_client import WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from sinks_helpers import step_batch, step_records

from scratch_topics import scratch_topics
from steplens.schema import Record, encode
from steplens.schema.flux_literals import flux_string
from steplens.schema.kafka_config import consumer_config
from steplens.schema.topics import Topics, ensure_topics
from steplens.sinks.influx import InfluxSink, make_client
from steplens.sinks.kafka_io import DeadLetters, poll_batch
from steplens.sinks.loop import SinkLoop
from steplens.sinks.points import record_points
from steplens.sinks.settings import InfluxSettings


def batches_of(recs: list[Record], per: int) -> list[Record]:
    """The steps of each rank, ``per`` consecutive ones to a step_batch."""
    out = []
    for rank in sorted({r.rank for r in recs}):
        mine = [r for r in recs if r.rank == rank]
        out += [step_batch(mine[i : i + per]) for i in range(0, len(mine), per)]
    return out


def direct(s: InfluxSettings, records: list, batch: int) -> float:
    """influxdb-client alone: build the same points, write synchronously in the same batches."""
    with make_client(s) as client:
        api = client.write_api(write_options=SYNCHRONOUS)
        t0 = time.perf_counter()
        for i in range(0, len(records), batch):
            points = [p for r in records[i : i + batch] for p in record_points(r)]
            api.write(bucket=s.bucket, org=s.org, record=points, write_precision=WritePrecision.NS)
        return time.perf_counter() - t0


def through_sink(
    s: InfluxSettings, bootstrap: str, records: list, batch: int
) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) to consume, write and commit ``records``."""
    topics = Topics(
        raw=f"bench-raw-{uuid.uuid4().hex[:8]}", dead_letters="bench-dl", raw_partitions=4
    )
    ensure_topics(bootstrap, topics)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for r in records:
        p.produce(topics.raw, encode(r), key=r.key)
        p.poll(0)
    p.flush(60)
    stop = threading.Event()
    group = f"bench-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(consumer_config(group, bootstrap))
    consumer.subscribe([topics.raw])
    with make_client(s) as client:
        sink = InfluxSink(client, s)
        loop = SinkLoop(
            consumer,
            sink,
            DeadLetters(topics.dead_letters, group, bootstrap),
            stop=stop,
            batch_size=batch,
        )
        # wait for the partition assignment before timing
        while not consumer.assignment():
            consumer.poll(0.1)
        t0, c0 = time.perf_counter(), time.process_time()
        deadline = time.monotonic() + 600
        while loop.stats.accepted < len(records) and time.monotonic() < deadline:
            batch_items = poll_batch(consumer, batch, 0.2)
            if batch_items:
                loop.handle(batch_items)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    consumer.close()
    return elapsed, cpu


def latency(s: InfluxSettings, bootstrap: str, samples: int) -> list[float]:
    topics = Topics(
        raw=f"bench-lat-{uuid.uuid4().hex[:8]}", dead_letters="bench-dl", raw_partitions=4
    )
    ensure_topics(bootstrap, topics)
    stop = threading.Event()
    group = f"bench-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(consumer_config(group, bootstrap, extra={"fetch.wait.max.ms": 10}))
    assigned = threading.Event()
    consumer.subscribe([topics.raw], on_assign=lambda _c, _p: assigned.set())
    out = []
    with make_client(s) as client:
        sink = InfluxSink(client, s)
        loop = SinkLoop(
            consumer,
            sink,
            DeadLetters(topics.dead_letters, group, bootstrap),
            stop=stop,
            poll_timeout_s=0.05,
        )
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        query = client.query_api()
        run_id = f"bench-lat-{uuid.uuid4().hex[:8]}"
        assigned.wait(60)  # the group join, before the clock
        for i in range(samples):
            (rec,) = step_records(run_id, 1, ranks=1, t0_ns=time.time_ns())
            rec = replace(rec, seq=i)
            t0 = time.perf_counter()
            producer.produce(topics.raw, encode(rec), key=rec.key)
            producer.flush(5)
            flux = (
                f"from(bucket: {flux_string(s.bucket)}) |> range(start: -5m)"
                f' |> filter(fn: (r) => r.run_id == "{run_id}" and r._field == "seq")'
                f" |> filter(fn: (r) => r._value == {i})"
            )
            while time.perf_counter() - t0 < 10:
                if any(t.records for t in query.query(flux, org=s.org)):
                    break
                time.sleep(0.01)
            out.append(time.perf_counter() - t0)
        stop.set()
        thread.join(10)
    consumer.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=10_000, help="per round and path")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median kept)")
    ap.add_argument("--batch", type=int, default=5000)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--batch-steps", type=int, default=100, help="steps per step_batch")
    args = ap.parse_args()
    s = InfluxSettings.from_env()
    bootstrap = os.environ.get("STEPLENS_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    ratios, direct_rates, sink_rates, cpu_ratios = [], [], [], []
    batched_rates, batched_ratios, batched_cpu = [], [], []
    for _ in range(args.rounds):  # alternate, so load changes on a shared machine hit both
        a = step_records(f"bench-direct-{uuid.uuid4().hex[:8]}", args.records, ranks=8)
        b = step_records(f"bench-sink-{uuid.uuid4().hex[:8]}", args.records, ranks=8)
        c0 = time.process_time()
        r_direct = args.records / direct(s, a, args.batch)
        cpu_direct = time.process_time() - c0
        wall_sink, cpu_sink = through_sink(s, bootstrap, b, args.batch)
        r_sink = args.records / wall_sink
        cpu_ratios.append(cpu_direct / max(1e-9, cpu_sink))
        assert count_points(s, b[0].run_id) == args.records, "the sink lost or duplicated points"
        direct_rates.append(r_direct)
        sink_rates.append(r_sink)
        ratios.append(r_sink / r_direct)
        c = step_records(f"bench-batched-{uuid.uuid4().hex[:8]}", args.records, ranks=8)
        per_poll = max(1, args.batch // args.batch_steps)  # the same steps per export
        wall_batched, cpu_batched = through_sink(
            s, bootstrap, batches_of(c, args.batch_steps), per_poll
        )
        assert count_points(s, c[0].run_id) == args.records, "step_batch points lost or duplicated"
        batched_rates.append(args.records / wall_batched)
        batched_ratios.append(wall_sink / wall_batched)
        batched_cpu.append(cpu_sink / max(1e-9, cpu_batched))
    print(f"direct influxdb-client: {statistics.median(direct_rates):,.0f} points/s (median)")
    print(f"through the sink      : {statistics.median(sink_rates):,.0f} points/s (median)")
    shown = ", ".join(f"{r:.0%}" for r in ratios)
    print(f"sink / direct         : {statistics.median(ratios):.0%} median of [{shown}]")
    print("                        (target >= 80%)")
    shown = ", ".join(f"{r:.0%}" for r in batched_ratios)
    rate = statistics.median(batched_rates)
    print(f"step_batch of {args.batch_steps:<8}: {rate:,.0f} points/s (median)")
    print(f"step_batch / raw      : {statistics.median(batched_ratios):.0%} median of [{shown}]")
    print(f"client CPU per point  : raw / step_batch = {statistics.median(batched_cpu):.0%}")
    print(f"client CPU per point  : direct / sink = {statistics.median(cpu_ratios):.0%} (median;")
    print("                        this process only, steadier than wall time on a busy box)")
    lat = sorted(latency(s, bootstrap, args.samples))
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    p50 = statistics.median(lat)
    print(f"record -> queryable   : p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms")
    print("                        (target p99 <= 1000 ms)")
    return 0


if __name__ == "__main__":
    with scratch_topics(os.environ.get("STEPLENS_KAFKA_BOOTSTRAP", "127.0.0.1:19092")):
        rc = main()
    sys.exit(rc)
