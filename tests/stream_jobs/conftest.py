"""Fixtures for the worker's integration tests: unique topics, worker processes, consumers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from steplens.schema import Record, decode, encode
from steplens.schema.topics import Topics, ensure_topics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Kafka:
    def __init__(self, env: dict[str, str], topics: Topics) -> None:
        from confluent_kafka import Producer

        self.env = env
        self.bootstrap = env["STEPLENS_KAFKA_BOOTSTRAP"]
        self.topics = topics
        self.producer = Producer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )

    def send(self, records: list[Record | bytes], key: bytes | None = None) -> None:
        for r in records:
            if isinstance(r, Record):
                self.producer.produce(self.topics.raw, encode(r), key=r.key)
            else:
                self.producer.produce(self.topics.raw, r, key=key)
            self.producer.poll(0)
        assert self.producer.flush(30) == 0

    def collect(
        self,
        topic: str,
        until: Callable[[list[Any]], bool],
        timeout_s: float = 60.0,
        raw: bool = False,
    ) -> list[Any]:
        """Read ``topic`` from the start until ``until(records)`` holds or the time is up.

        ``raw``: collect ``(key, value)`` bytes instead of decoded records.
        """
        from confluent_kafka import Consumer

        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"t-{uuid.uuid4()}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        c.subscribe([topic])
        got: list[Record] = []
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline and not until(got):
                msg = c.poll(0.5)
                if msg is None or msg.error():
                    continue
                if raw:
                    got.append((msg.key(), msg.value()))
                    continue
                rec = decode(msg.value())
                assert isinstance(rec, Record), rec
                got.append(rec)
        finally:
            c.close()
        return got


@pytest.fixture
def kafka(stack_env: dict[str, str]) -> Kafka:
    tag = uuid.uuid4().hex[:8]
    topics = Topics.prefixed(f"t.{tag}")
    ensure_topics(stack_env["STEPLENS_KAFKA_BOOTSTRAP"], topics)
    return Kafka(stack_env, topics)


class WorkerProc:
    def __init__(self, kafka: Kafka, state: Path, app_id: str, *extra: str) -> None:
        self.kafka = kafka
        self.app_id = app_id
        self.web_port = free_port()
        self.args = [
            sys.executable,
            "-m",
            "steplens.schema.command",
            "worker",
            "--app-id",
            app_id,
            "--state-dir",
            str(state),
            "--web-port",
            str(self.web_port),
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = state / f"worker-{self.web_port}.log"

    def start(self) -> WorkerProc:
        t = self.kafka.topics
        env = {
            **os.environ,
            **self.kafka.env,
            "STEPLENS_TOPIC_RAW": t.raw,
            "STEPLENS_TOPIC_SIGNALS": t.signals,
            "STEPLENS_TOPIC_ALERTS": t.alerts,
            "STEPLENS_TOPIC_DEADLETTER": t.dead_letters,
            "STEPLENS_TOPIC_ADVICE": t.advice,
        }
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.args,
            env=env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def wait_metrics(self, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            try:
                return self.metrics()
            except OSError:
                time.sleep(0.2)
        raise AssertionError("worker metrics endpoint did not come up")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def workers(kafka: Kafka, tmp_path: Path) -> Iterator[Callable[..., WorkerProc]]:
    made: list[WorkerProc] = []
    app_id = f"sj-{uuid.uuid4().hex[:8]}"

    def make(*extra: str, state: str = "w0") -> WorkerProc:
        w = WorkerProc(kafka, tmp_path / state, app_id, *extra)
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop()
