"""Helpers for the sinks' tests: unique names, producing records, offsets, reading topics."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, Producer, TopicPartition

from steplens.schema import Record, encode, make_record
from steplens.schema.topics import Topics


def unique(name: str) -> str:
    return f"test-{name}-{uuid.uuid4().hex[:10]}"


def step_records(run_id: str, n: int, ranks: int = 2, t0_ns: int | None = None) -> list[Record]:
    t0 = time.time_ns() - n * 1_000_000 if t0_ns is None else t0_ns
    return [
        make_record(
            "step",
            {"loss": 2.0 + (i % 17) / 10, "lr": 1e-4, "scalars": {"z": float(i)}},
            run_id=run_id,
            rank=i % ranks,
            host=f"h{i % ranks}",
            seq=i // ranks,
            step=i // ranks,
            time_ns=t0 + i * 1_000_000,
        )
        for i in range(n)
    ]


def step_batch(steps: list[Record]) -> Record:
    """The step_batch that stands for ``steps`` (one rank's, in order): their envelope, the
    last one's step and time, one entry per step."""
    last = steps[-1]
    entries = [{"step": r.step, "time_ns": r.time_ns, **r.data} for r in steps]
    return make_record(
        "step_batch",
        {"records": entries},
        run_id=last.run_id,
        rank=last.rank,
        local_rank=last.local_rank,
        host=last.host,
        pid=last.pid,
        seq=last.seq,
        time_ns=last.time_ns,
        step=last.step,
    )


def produce(bootstrap: str, topic: str, items: Iterable[Record | tuple[bytes, bytes]]) -> int:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    n = 0
    for item in items:
        if isinstance(item, Record):
            p.produce(topic, encode(item), key=item.key)
        else:
            p.produce(topic, item[1], key=item[0])
        n += 1
        if n % 5000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    return n


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("probe")})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        c.close()


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: max(tp.offset, 0) for tp in tps}
    finally:
        c.close()


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def read_all(bootstrap: str, topic: str, expect: int, timeout_s: float = 30) -> list[bytes]:
    """Read ``expect`` messages from the start of ``topic`` (or fail after the timeout)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expect and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=0.5):
                if m.error() is None:
                    out.append(m.value())
        # a short grace read: more than expected must be seen, too
        for m in c.consume(1000, timeout=1.0):
            if m.error() is None:
                out.append(m.value())
    finally:
        c.close()
    return out


def sink_process(
    which: str, topics: Topics, group: str, extra: list[str], **popen: object
) -> subprocess.Popen:
    """`steplens sink WHICH` as a process over the raw topic of ``topics``."""
    code = "import sys; from steplens.sinks.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            which,
            "--topics",
            topics.raw,
            "--group",
            group,
            "--dead-letter-topic",
            topics.dead_letters,
            "--metrics-port",
            "0",
            "--batch-size",
            "200",
            "--no-setup",
            "--log-level",
            "WARNING",
            "-X",
            "session.timeout.ms=6000",
            *extra,
        ],
        env={
            **os.environ,
            "STEPLENS_TOPIC_RAW": topics.raw,
            "STEPLENS_TOPIC_SIGNALS": topics.signals,
            "STEPLENS_TOPIC_ALERTS": topics.alerts,
            "STEPLENS_TOPIC_DEADLETTER": topics.dead_letters,
            "STEPLENS_TOPIC_ADVICE": topics.advice,
        },
        **popen,  # type: ignore[arg-type]
    )
