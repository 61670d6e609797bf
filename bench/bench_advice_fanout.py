"""What the advice channel costs the broker as ranks multiply, with one advice consumer per
rank and with one per node (``advice_relay``: local rank 0 reads and relays to the node's
other ranks through a file; the producer's default).

Opens the advice sources of K simulated ranks (8 a node; 256 Kafka consumers a process: one
process holds a few thousand Kafka client threads at most) with the producer's own function
(``advice_source``, as a Monitor does), polls each as a rank's worker thread does
(``take_advice`` every 50 ms), and measures the Kafka broker's CPU seconds per second and TCP
connections while they are open, against the same span with none open, all in one run. Then
one piece of advice is written to the topic and every rank's source must return it: the time
until the last rank has it.

    python bench/bench_advice_fanout.py --ranks 256 --seconds 30
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from typing import Any

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


def cpu_per_s(p: psutil.Process, seconds: float) -> float:
    t = p.cpu_times()
    c0, t0 = t.user + t.system, time.monotonic()
    time.sleep(seconds)
    t = p.cpu_times()
    return (t.user + t.system - c0) / (time.monotonic() - t0)


def ranks_process(
    config: ProducerConfig, run: str, world: int, lo: int, hi: int, out: Any, stop: Any
) -> None:
    """Ranks ``lo..hi-1`` of ``run`` in one process: open their sources, say so, poll each
    every 50 ms until ``stop``, and say when the last of them had the advice keyed for
    ``run`` (wall-clock time)."""
    start_ms = int(time.time() * 1000)
    t0 = time.monotonic()
    sources = [_open(config, Identity(run, r, r % 8, world, f"node-{r // 8:05d}"), start_ms)
               for r in range(lo, hi)]  # fmt: skip
    consumers = sum(s.label != "node relay" for s in sources)
    out.put(("opened", consumers, time.monotonic() - t0))
    waiting = set(range(len(sources)))
    key = run.encode()
    while not stop.is_set():
        for i, src in enumerate(sources):
            if any(m[0] == key for m in src.take_advice(64)):
                waiting.discard(i)
                if not waiting:
                    out.put(("reached", time.time()))
        time.sleep(0.05)
    for src in sources:
        src.close_advice()


def _open(config: ProducerConfig, ident: Identity, start_ms: int) -> Any:
    """A rank's source, opened again after a failure, as a Monitor does (a consumer's first
    metadata request times out at 2 s while thousands start at once)."""
    for _ in range(9):
        try:
            return advice_source(config, ident, start_ms)
        except Exception:
            time.sleep(1.0)
    return advice_source(config, ident, start_ms)


def measure(
    config: ProducerConfig,
    kafka: psutil.Process,
    ranks: int,
    seconds: float,
    per_node: bool,
    processes: int,
) -> dict:
    """The broker while ``ranks`` ranks' sources (over ``processes`` processes: one process
    holds a few hundred Kafka clients at most) are open and polled; then one piece of advice
    and the time until every rank had it."""
    ctx = mp.get_context("spawn")
    run = f"advice-fanout-{uuid.uuid4().hex[:6]}"
    cfg = replace(config, advice_per_node=per_node)
    out, stop = ctx.Queue(), ctx.Event()
    bounds = [ranks * i // processes for i in range(processes + 1)]
    bounds = [8 * round(b / 8) for b in bounds]  # whole nodes to a process
    children = [
        ctx.Process(target=ranks_process, args=(cfg, run, ranks, lo, hi, out, stop))
        for lo, hi in itertools.pairwise(bounds)
    ]
    t0 = time.monotonic()
    for c in children:
        c.start()
    opened = [out.get(timeout=600) for _ in children]
    opened_s = time.monotonic() - t0
    procs = [psutil.Process(c.pid) for c in children]
    own0 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    busy = cpu_per_s(kafka, seconds)
    own = sum(p.cpu_times().user + p.cpu_times().system for p in procs) - own0
    result = {
        "opened_s": opened_s,
        "broker_cpu": busy,
        "own_cpu": own / seconds,
        "threads": sum(p.num_threads() for p in procs),
        "conns": len(kafka.net_connections(kind="tcp")),
        "consumers": sum(n for _, n, _ in opened),
        "reach_s": reach_all_s(cfg, run, out, len(children)),
    }
    stop.set()
    for c in children:
        c.join(60)
    time.sleep(2.0)  # the broker closes their connections
    return result


def reach_all_s(config: ProducerConfig, run: str, out: Any, processes: int) -> float:
    """One message keyed for ``run`` on the advice topic: seconds until every rank had it."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": config.kafka_bootstrap})
    t0 = time.time()
    producer.produce(config.advice_topic, b"advice", key=run.encode())
    producer.flush(10)
    try:
        last = max(out.get(timeout=120)[1] for _ in range(processes))
    except queue.Empty:
        return math.inf
    return last - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument(
        "--processes",
        type=int,
        default=0,
        help="processes the ranks are spread over (default: 256 Kafka consumers a process)",
    )
    ap.add_argument(
        "--modes",
        default="rank,node",
        help="readers to measure: rank (a consumer per rank), node (the default's), or both",
    )
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= {"rank", "node"} or not modes:
        ap.error("--modes: rank, node or rank,node")
    with tempfile.TemporaryDirectory() as relay:
        config = ProducerConfig.resolve(
            kafka_bootstrap=os.environ.get("STEPLENS_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
            advice_relay_dir=relay,
        )
        kafka = broker(config.kafka_bootstrap)
        idle = cpu_per_s(kafka, args.seconds)
        idle_conns = len(kafka.net_connections(kind="tcp"))
        got = {
            mode: measure(
                config,
                kafka,
                args.ranks,
                args.seconds,
                mode == "node",
                args.processes or max(1, math.ceil(args.ranks / (2048 if mode == "node" else 256))),
            )
            for mode in modes
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
    if len(got) < 2:
        return 0
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
