"""What the advice channel costs the broker as ranks multiply, with one advice consumer per
rank and with one per node (``advice_relay``: local rank 0 reads and relays to the node's
other ranks through a file; the producer's default).

Opens the advice sources of K simulated ranks (8 a node) in one process with the producer's
own function (``advice_source``, as a Monitor does), polls each as a rank's worker thread does
(``take_advice`` every 50 ms), and measures the Kafka broker's CPU seconds per second and TCP
connections while they are open, against the same span with none open, all in one run. Then
one piece of advice is written to the topic and every rank's source must return it: the time
until the last rank has it.

    python bench/bench_advice_fanout.py --ranks 256 --seconds 30
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
import uuid
from dataclasses import replace

import psutil

from steplens.producer.config import ProducerConfig
from steplens.producer.identity import Identity
from steplens.producer.remedies.advice_relay import advice_source


def broker(bootstrap: str) -> psutil.Process:
    """The Kafka broker process (``kafka.Kafka``) listening on ``bootstrap``'s port."""
    port = int(bootstrap.rsplit(":", 1)[1])
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if not any(c == "kafka.Kafka" for c in cmd):
            continue
        with contextlib.suppress(psutil.Error):
            if any(c.laddr.port == port for c in p.net_connections(kind="tcp") if c.laddr):
                return p
    raise SystemExit(f"no Kafka broker process (kafka.Kafka) listening on {bootstrap}")


def cpu_per_s(p: psutil.Process, seconds: float, poll: list | None = None) -> float:
    t = p.cpu_times()
    c0, t0 = t.user + t.system, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for src in poll or []:
            src.take_advice(64)
        time.sleep(0.05)
    t = p.cpu_times()
    return (t.user + t.system - c0) / (time.monotonic() - t0)


def open_sources(config: ProducerConfig, run: str, ranks: int) -> tuple[list, float]:
    t0 = time.monotonic()
    start_ms = int(time.time() * 1000)
    sources = []
    for r in range(ranks):
        ident = Identity(run, r, r % 8, ranks, f"node-{r // 8:05d}")
        sources.append(advice_source(config, ident, start_ms))
    return sources, time.monotonic() - t0


def reach_all_s(config: ProducerConfig, run: str, sources: list, timeout_s: float = 60.0) -> float:
    """One message keyed for ``run`` on the advice topic: seconds until every source had it."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": config.kafka_bootstrap})
    t0 = time.monotonic()
    producer.produce(config.advice_topic, b"advice", key=run.encode())
    producer.flush(10)
    waiting = set(range(len(sources)))
    while waiting and time.monotonic() - t0 < timeout_s:
        for i in list(waiting):
            if any(m[0] == run.encode() for m in sources[i].take_advice(64)):
                waiting.discard(i)
        time.sleep(0.01)
    return math.inf if waiting else time.monotonic() - t0


def measure(
    config: ProducerConfig, kafka: psutil.Process, ranks: int, seconds: float, per_node: bool
) -> dict:
    run = f"advice-fanout-{uuid.uuid4().hex[:6]}"
    cfg = replace(config, advice_per_node=per_node)
    sources, opened_s = open_sources(cfg, run, ranks)
    me = psutil.Process()
    t = me.cpu_times()
    own0 = t.user + t.system
    busy = cpu_per_s(kafka, seconds, sources)
    t = me.cpu_times()
    out = {
        "opened_s": opened_s,
        "broker_cpu": busy,
        "own_cpu": (t.user + t.system - own0) / seconds,
        "threads": me.num_threads(),
        "conns": len(kafka.net_connections(kind="tcp")),
        "consumers": sum(s.label != "node relay" for s in sources),
        "reach_s": reach_all_s(cfg, run, sources),
    }
    for s in sources:
        s.close_advice()
    time.sleep(2.0)  # the broker closes their connections
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as relay:
        config = ProducerConfig.resolve(
            kafka_bootstrap=os.environ.get("STEPLENS_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
            advice_relay_dir=relay,
        )
        kafka = broker(config.kafka_bootstrap)
        idle = cpu_per_s(kafka, args.seconds)
        idle_conns = len(kafka.net_connections(kind="tcp"))
        got = {
            mode: measure(config, kafka, args.ranks, args.seconds, mode == "node")
            for mode in ("rank", "node")
        }
    n = args.ranks
    print(f"{n} ranks, 8 a node; broker idle: {idle:.3f} core, {idle_conns} TCP connections")
    print(
        "| reader | Kafka consumers | broker CPU (core) | over idle per rank | broker TCP "
        "connections | ranks' process CPU | threads | open s | advice reaches all ranks |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, g in got.items():
        per = (g["broker_cpu"] - idle) / n
        cpu, conns = g["broker_cpu"], g["conns"]
        print(
            f"| per {mode} | {g['consumers']} | {cpu:.3f} ({cpu / idle:.2f}x idle) "
            f"| {per * 1000:.3f} ms/s | {conns} (+{conns - idle_conns}) | {g['own_cpu']:.3f} "
            f"| {g['threads']} | {g['opened_s']:.1f} | {g['reach_s']:.2f} s |"
        )
    r, d = got["rank"], got["node"]
    over_r, over_d = r["broker_cpu"] - idle, d["broker_cpu"] - idle
    print(
        f"per node / per rank: broker CPU over idle {over_d / over_r:.2f}x, connections over idle "
        f"{(d['conns'] - idle_conns) / max(1, r['conns'] - idle_conns):.2f}x"
    )
    print(
        f"at 16,384 ranks (linear): per rank {over_r / n * 16384:.1f} broker cores, "
        f"{(r['conns'] - idle_conns) / n * 16384:,.0f} connections; per node "
        f"{over_d / n * 16384:.1f} cores, {(d['conns'] - idle_conns) / n * 16384:,.0f} connections"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
