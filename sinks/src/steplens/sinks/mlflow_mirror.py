"""Mirror evaluation metrics and alerts of steplens runs into MLflow (optional).

A sink-side consumer, never part of the training process: it reads ``eval`` records from the
raw topic and ``alert`` records from the alerts topic and writes them to one MLflow run per
steplens run (found by the tag ``steplens.run_id``, created when missing):

- eval metric ``loss`` of split ``val`` -> MLflow metric ``val/loss`` at the record's step;
- an alert -> metric ``alert/<rule>`` (severity level 1 info, 2 warning, 3 critical; 0 when
  resolved) at its step, and tag ``steplens.alert.<fingerprint>`` with severity, state, scope,
  step and hint, so the MLflow UI lists what fired next to the evaluation results.

Needs ``mlflow`` (or ``mlflow-skinny``) and a tracking URI (``--tracking-uri`` or
``MLFLOW_TRACKING_URI``). Delivery is at least once: offsets are committed after MLflow
accepted a batch; a replayed batch logs the same metric points again.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from steplens.producer.schema import Record, decode

log = logging.getLogger("steplens.sinks.mlflow")

RUN_TAG = "steplens.run_id"
SEVERITY_LEVEL = {"info": 1.0, "warning": 2.0, "critical": 3.0}
EVAL_FIELDS = ("loss", "perplexity", "accuracy", "f1", "bleu", "rouge")
MAX_BATCH = 900  # MLflow accepts at most 1000 metrics and 100 tags per log_batch
MAX_TAGS = 90
MAX_TAG_LEN = 5000


def mlflow_available() -> bool:
    try:
        import mlflow  # noqa: F401
    except ImportError:
        return False
    return True


class MlflowMirror:
    """Writes steplens records into MLflow runs of one experiment."""

    def __init__(self, tracking_uri: str, experiment: str = "steplens") -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (
            found.experiment_id if found is not None else self.client.create_experiment(experiment)
        )
        self._runs: dict[str, str] = {}  # steplens run id -> MLflow run id

    def mlflow_run(self, run_id: str) -> str:
        """The MLflow run of a steplens run: found by tag, else created."""
        cached = self._runs.get(run_id)
        if cached is not None:
            return cached
        escaped = run_id.replace("'", "\\'")
        found = self.client.search_runs(
            [self.experiment_id], f"tags.`{RUN_TAG}` = '{escaped}'", max_results=1
        )
        if found:
            mlflow_id = found[0].info.run_id
        else:
            run = self.client.create_run(
                self.experiment_id, run_name=run_id, tags={RUN_TAG: run_id, "source": "steplens"}
            )
            mlflow_id = run.info.run_id
        self._runs[run_id] = mlflow_id
        return mlflow_id

    def handle(self, records: Iterable[Record]) -> int:
        """Mirror the eval and alert records among ``records``; returns how many were used."""
        from mlflow.entities import Metric, RunTag

        metrics: dict[str, list[Any]] = {}
        tags: dict[str, list[Any]] = {}
        used = 0
        for rec in records:
            ts_ms = rec.time_ns // 1_000_000
            step = rec.step if rec.step is not None else 0
            if rec.kind == "eval":
                split = str(rec.data.get("split", "val"))
                values = {k: rec.data.get(k) for k in EVAL_FIELDS}
                values.update(rec.data.get("extra") or {})
                out = metrics.setdefault(rec.run_id, [])
                for name, value in values.items():
                    if isinstance(value, (int, float)) and math.isfinite(value):
                        out.append(Metric(f"{split}/{name}", float(value), ts_ms, step))
                used += 1
            elif rec.kind == "alert":
                d = rec.data
                level = 0.0 if d["state"] == "resolved" else SEVERITY_LEVEL.get(d["severity"], 1.0)
                metrics.setdefault(rec.run_id, []).append(
                    Metric(f"alert/{d['rule']}", level, ts_ms, step)
                )
                text = (f"{d['severity']} {d['state']} {d['scope']} step {rec.step}: {d['hint']}")[
                    :MAX_TAG_LEN
                ]
                tags.setdefault(rec.run_id, []).append(
                    RunTag(f"steplens.alert.{d['fingerprint']}", text)
                )
                used += 1
        for run_id in set(metrics) | set(tags):
            mlflow_id = self.mlflow_run(run_id)
            m, t = metrics.get(run_id, []), _last_per_key(tags.get(run_id, []))
            for i in range(0, len(m), MAX_BATCH):
                self.client.log_batch(mlflow_id, metrics=m[i : i + MAX_BATCH])
            for i in range(0, len(t), MAX_TAGS):
                self.client.log_batch(mlflow_id, tags=t[i : i + MAX_TAGS])
        return used


def _last_per_key(tags: list[Any]) -> list[Any]:
    """A tag written twice in one batch is rejected by MLflow: keep the latest value."""
    return list({t.key: t for t in tags}.values())


def run_mirror(
    mirror: MlflowMirror,
    bootstrap: str,
    topics: list[str],
    *,
    group: str,
    stop: threading.Event,
    only_run: str | None = None,
    max_s: float | None = None,
) -> int:
    """Consume ``topics`` until ``stop`` is set (or ``max_s`` passed); returns records used."""
    from confluent_kafka import Consumer

    from steplens.producer.settings import kafka_security_config

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **kafka_security_config(),
        }
    )
    consumer.subscribe(topics)
    deadline = time.monotonic() + max_s if max_s is not None else math.inf
    used = 0
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            msgs = consumer.consume(1000, timeout=0.5)
            if not msgs:
                continue
            records = []
            for msg in msgs:
                if msg.error():
                    continue
                rec = decode(msg.value())
                if not isinstance(rec, Record) or rec.kind not in ("eval", "alert"):
                    continue
                if only_run is None or rec.run_id == only_run:
                    records.append(rec)
            if records:
                used += _with_retry(mirror, records, stop)
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return used


def _with_retry(mirror: MlflowMirror, records: list[Record], stop: threading.Event) -> int:
    """MLflow (a tracking server) may be briefly away: bounded retries with backoff."""
    delay = 0.5
    for attempt in range(6):
        try:
            return mirror.handle(records)
        except Exception as exc:
            if attempt == 5:
                raise
            log.warning("mlflow write failed (%s); retrying in %.1f s", exc, delay)
            if stop.wait(delay):
                raise
            delay = min(delay * 2, 10.0)
    return 0  # pragma: no cover - the loop returns or raises


def main(argv: list[str], prog: str = "steplens sink mlflow") -> int:
    p = argparse.ArgumentParser(prog=prog, description="mirror evals and alerts into MLflow")
    p.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI"))
    p.add_argument("--experiment", default=os.environ.get("STEPLENS_MLFLOW_EXPERIMENT", "steplens"))
    p.add_argument("--bootstrap", help="Kafka bootstrap (default: STEPLENS_KAFKA_BOOTSTRAP)")
    p.add_argument("--group", default="steplens-mlflow")
    p.add_argument("--run", help="mirror only this run")
    p.add_argument("--max-s", type=float, help="stop after this many seconds")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not mlflow_available():
        print(
            f"{prog}: mlflow is not installed (pip install 'steplens-sinks[mlflow]')",
            file=sys.stderr,
        )
        return 3
    if not args.tracking_uri:
        print(f"{prog}: no tracking URI (--tracking-uri or MLFLOW_TRACKING_URI)", file=sys.stderr)
        return 2
    from steplens.producer.settings import kafka_bootstrap
    from steplens.producer.topics import Topics

    topics = Topics.from_env()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    mirror = MlflowMirror(args.tracking_uri, args.experiment)
    try:
        used = run_mirror(
            mirror,
            kafka_bootstrap(args.bootstrap),
            [topics.raw, topics.alerts],
            group=args.group,
            stop=stop,
            only_run=args.run,
            max_s=args.max_s,
        )
    except KeyboardInterrupt:
        return 130
    log.info("mirrored %d records into MLflow experiment %r", used, args.experiment)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
