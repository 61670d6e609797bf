"""What the advice channel costs the broker as ranks multiply: every rank of a run with a
remedy on opens its own advice consumer (``transport.kafka_advice_source``: every partition
of the advice topic, no group), idle almost always.

Opens K such consumers in one process (the producer's own function, one identity per
simulated rank), polls each as a rank's worker thread does (``take_advice`` every
``flush_interval_s``), and measures the Kafka broker's CPU seconds per second while they are
open against the same span with none open, measured first in the same run.

    python bench/bench_advice_fanout.py --consumers 256 --seconds 30
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

import psutil

from steplens.producer.config import ProducerConfig
from steplens.producer.identity import Identity
from steplens.producer.transport import kafka_advice_source


def broker() -> psutil.Process:
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(c == "kafka.Kafka" for c in cmd):
            return p
    raise SystemExit("no Kafka broker process (kafka.Kafka) found")


def cpu_per_s(p: psutil.Process, seconds: float, poll: list | None = None) -> float:
    t = p.cpu_times()
    c0, t0 = t.user + t.system, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for src in poll or []:
            src.take_advice(64)
        time.sleep(0.05)
    t = p.cpu_times()
    return (t.user + t.system - c0) / (time.monotonic() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--consumers", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    config = ProducerConfig.resolve(
        kafka_bootstrap=os.environ.get("STEPLENS_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    )
    kafka = broker()
    idle = cpu_per_s(kafka, args.seconds)
    run = f"advice-fanout-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    sources = []
    for r in range(args.consumers):
        ident = Identity(run, r, r % 8, args.consumers, f"node-{r // 8:05d}")
        sources.append(kafka_advice_source(config, ident, int(time.time() * 1000)))
    opened_s = time.monotonic() - t0
    me = psutil.Process()
    t = me.cpu_times()
    own0 = t.user + t.system
    busy = cpu_per_s(kafka, args.seconds, sources)
    t = me.cpu_times()
    own = (t.user + t.system - own0) / args.seconds
    threads = me.num_threads()
    conns = len(kafka.net_connections(kind="tcp"))
    for s in sources:
        s.close_advice()
    per = (busy - idle) / args.consumers
    print(f"advice consumers: {args.consumers} (opened in {opened_s:.1f} s)")
    print(f"broker CPU: {idle:.3f} core idle, {busy:.3f} with them open: {busy / idle:.2f}x")
    print(f"per consumer: {per * 1000:.2f} ms of broker CPU per s")
    print(f"their process: {own:.3f} core, {threads} threads; broker TCP connections {conns}")
    print(f"at 16,384 ranks (extrapolated, linear): {per * 16384:.1f} broker cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
