"""From a spike's ``log_step`` to the advice in the rank's ``sl.advice()``, on a real broker and
worker: shared by ``bench_advice_latency.py`` and the stack test
``tests/stream_jobs/test_advice_round_trip.py``.

* ``topics_env``: scratch topics (raw, signals, alerts, dead letters, advice) and the
  environment a worker needs to use them;
* ``Rank``: a training loop as one rank of a run (a ``Monitor`` with the Kafka transport):
  each step a ``log_batch`` with sample ids, then ``log_step``, at ``rate`` steps per second;
  a loss spike at the given steps, the wall time of each spike's ``log_step`` kept; after each
  step ``advice()`` is read (as a loop does at a step boundary), each piece with the time the
  loop saw it.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steplens.producer.monitor import Monitor
from steplens.schema.topics import Topics, ensure_topics


def scratch_topics(bootstrap: str) -> Topics:
    tag = uuid.uuid4().hex[:8]
    topics = Topics(
        raw=f"t.{tag}.raw",
        signals=f"t.{tag}.signals",
        alerts=f"t.{tag}.alerts",
        dead_letters=f"t.{tag}.dead",
        advice=f"t.{tag}.advice",
    )
    ensure_topics(bootstrap, topics)
    return topics


def topics_env(topics: Topics) -> dict[str, str]:
    return {
        "STEPLENS_TOPIC_RAW": topics.raw,
        "STEPLENS_TOPIC_SIGNALS": topics.signals,
        "STEPLENS_TOPIC_ALERTS": topics.alerts,
        "STEPLENS_TOPIC_DEADLETTER": topics.dead_letters,
        "STEPLENS_TOPIC_ADVICE": topics.advice,
    }


def loss_at(step: int, spike: bool) -> float:
    loss = 3.0 / (1 + step / 500) + 0.01 * math.sin(step * 1.7)
    return loss * 20 if spike else loss


@dataclass
class Seen:
    advice: Any  # steplens.producer.remedies.advice_inbox.Advice
    loop_ns: int  # wall time the loop read it


@dataclass
class Rank:
    run_id: str
    bootstrap: str
    topics: Topics
    spool: Path
    remedies: list[str]
    steps: int
    spikes: frozenset[int] = frozenset()
    rate: float = 50.0  # steps per second
    full_resolution: bool = False
    checkpoints: dict[int, str] = field(default_factory=dict)  # step -> path, reported then
    spike_ns: dict[int, int] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    monitor: Monitor | None = None
    linger_s: float = 0.0  # steps go on this long after the last one, still reading advice

    def monitor_config(self) -> dict[str, Any]:
        return {
            "kafka_bootstrap": self.bootstrap,
            "topic": self.topics.raw,
            "advice_topic": self.topics.advice,
            "remedies": self.remedies,
            "full_resolution": self.full_resolution,
            "hw_interval_s": 0,
            "hang_dump_after_s": 0,
            "spool_dir": str(self.spool),
        }

    def run(self) -> None:
        m = self.monitor = Monitor(self.run_id, rank=0, world_size=1, **self.monitor_config())
        period = 1.0 / self.rate
        t0 = time.monotonic()
        step = 0
        while step < self.steps or time.monotonic() - t0 < self.steps * period + self.linger_s:
            ids = [f"{self.run_id}-{step}-{k}" for k in range(4)]
            tokens = [[step, k, 7, 11] for k in range(4)]  # no sample repeats another
            m.log_batch(step, tokens, sample_ids=ids)
            spike = step in self.spikes
            if spike:
                self.spike_ns[step] = time.time_ns()
            m.log_step(step, loss=loss_at(step, spike), grad_norm=1.0, tokens=4096)
            if step in self.checkpoints:
                m.checkpoint(step, self.checkpoints[step])
            for a in m.advice():
                self.seen.append(Seen(a, time.time_ns()))
            step += 1
            wait = t0 + step * period - time.monotonic()
            if wait > 0:
                time.sleep(wait)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name=f"rank-{self.run_id}", daemon=True)
        t.start()
        return t

    def latencies_s(self) -> dict[int, float]:
        """Per spike advised (``skip_samples`` naming its batch's samples): from its
        ``log_step`` to the loop reading the advice."""
        out: dict[int, float] = {}
        for s in self.seen:
            if s.advice.action != "skip_samples":
                continue
            for sample in s.advice.sample_ids or ():
                step = int(sample.rsplit("-", 2)[1])
                if step in self.spike_ns and step not in out:
                    out[step] = (s.loop_ns - self.spike_ns[step]) / 1e9
        return out


def quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile, nearest rank (p99 of a few samples is their largest)."""
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]
