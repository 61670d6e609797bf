"""The consumer loop, the one place an output's work is retried: a retryable batch is exported
again with the consumer paused and nothing committed; what an output refuses and what does not
decode become dead letters before the commit. A fake consumer: no Kafka."""

from __future__ import annotations

import threading
from typing import Any

from notify_helpers import alert_record, member

from steplens.schema import encode
from steplens.sinks.loop import SinkLoop
from steplens.sinks.notify import Answer
from steplens.sinks.retry import RetryPolicy
from steplens.sinks.webhook import WebhookOutput


class Message:
    def __init__(self, offset: int, value: bytes) -> None:
        self._offset, self._value = offset, value

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "alerts"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"run:-1"

    def value(self) -> bytes:
        return self._value


class Consumer:
    def __init__(self, messages: list[Message]) -> None:
        self.batches = [messages]
        self.log: list[Any] = []

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        return self.batches.pop(0) if self.batches else []

    def assignment(self) -> list[str]:
        return ["alerts-0"]

    def pause(self, parts: list[str]) -> None:
        self.log.append(("pause", parts))

    def resume(self, parts: list[str]) -> None:
        self.log.append(("resume", parts))

    def poll(self, timeout: float) -> None:
        return None

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.log.append(("commit", [(tp.topic, tp.partition, tp.offset) for tp in offsets]))


class DeadLetters:
    def __init__(self) -> None:
        self.sent: list[tuple[int, str]] = []

    def send(self, item: Any, reason: str) -> None:
        self.sent.append((item.offset, reason))

    def flush(self) -> bool:
        return True


def test_a_retryable_batch_is_exported_again_and_committed_once_durable() -> None:
    answers = [Answer(False, retry=True, reason="HTTP 503"), Answer(True),
               Answer(False, reason="HTTP 400: bad"), Answer(True)]  # fmt: skip
    posted: list[str] = []

    def post(url: str, body: Any, headers: dict[str, str]) -> Answer:
        answer = answers.pop(0)
        posted.append(f"{body['fingerprint']}:{answer.ok}")
        return answer

    alerts = [
        alert_record(
            "r",
            f"fp{i}",
            "spike:loss",
            "critical",
            "firing",
            i,
            [member("spike:loss", "critical", i, i, True)],
            started=i,
        )
        for i in range(3)
    ]
    messages = [Message(i, encode(a)) for i, a in enumerate(alerts)]
    messages.insert(1, Message(3, b"\x00not a record"))
    consumer, dead, stop = Consumer(messages), DeadLetters(), threading.Event()
    loop = SinkLoop(
        consumer,  # type: ignore[arg-type]
        WebhookOutput("http://hook", post=post),
        dead,  # type: ignore[arg-type]
        stop=stop,
        backoff=RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.01),
    )
    stats = loop.run(max_seconds=0.5)
    assert posted == ["fp0:False", "fp0:True", "fp1:False", "fp2:True"]
    assert consumer.log == [("pause", ["alerts-0"]), ("resume", ["alerts-0"]),
                            ("commit", [("alerts", 0, 4)])]  # fmt: skip
    assert [offset for offset, _ in dead.sent] == [3, 1]
    assert dead.sent[0][1].startswith("undecodable") and "HTTP 400: bad" in dead.sent[1][1]
    assert (stats.accepted, stats.dead_letters, stats.commits) == (2, 2, 1)


def test_shutdown_during_an_outage_commits_nothing() -> None:
    stop = threading.Event()

    def post(url: str, body: Any, headers: dict[str, str]) -> Answer:
        stop.set()
        return Answer(False, retry=True, reason="unreachable")

    rec = alert_record("r", "fp", "spike:loss", "critical", "firing", 1, [])
    consumer = Consumer([Message(0, encode(rec))])
    loop = SinkLoop(
        consumer,  # type: ignore[arg-type]
        WebhookOutput("http://hook", post=post),
        DeadLetters(),  # type: ignore[arg-type]
        stop=stop,
    )
    stats = loop.run(max_seconds=5)
    assert stats.commits == 0 and not any(entry[0] == "commit" for entry in consumer.log)
