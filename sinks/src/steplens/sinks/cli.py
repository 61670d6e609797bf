"""`steplens sink influx|s3`: run a sink until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from dataclasses import replace

from confluent_kafka import Consumer

from steplens.schema.log_limit import kafka_logger
from steplens.schema.topics import Topics, ensure_topics
from steplens.sinks import metrics, redact
from steplens.sinks.kafka_io import DeadLetters, consumer_config
from steplens.sinks.retry import RetryPolicy
from steplens.sinks.settings import DEFAULT_DEDUPE_WINDOW

DEFAULT_PORTS = {"influx": 9465, "s3": 9466}


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Run a steplens sink.")
    p.add_argument("which", choices=["influx", "s3"], help="influx: hot store; s3: cold Parquet")
    p.add_argument("--bootstrap", help="Kafka bootstrap (default: STEPLENS_KAFKA_BOOTSTRAP)")
    p.add_argument("--group", help="consumer group (default: steplens-sink-<which>)")
    p.add_argument(
        "--topics",
        help="comma-separated topics (default: raw,signals,alerts from STEPLENS_TOPIC_*)",
    )
    p.add_argument("--dead-letter-topic", help="default: STEPLENS_TOPIC_DEADLETTER")
    p.add_argument("--batch-size", type=int, default=5000)
    p.add_argument("--metrics-port", type=int, help="Prometheus port on 127.0.0.1 (0: off)")
    p.add_argument("--bucket", help="InfluxDB hot bucket or S3 bucket")
    p.add_argument("--prefix", help="S3 key prefix (default: STEPLENS_S3_PREFIX or 'cold')")
    p.add_argument("--max-bytes", type=int, default=64 << 20, help="S3: roll at this size")
    p.add_argument("--max-age-s", type=float, default=60.0, help="S3: roll at this age")
    p.add_argument(
        "--dedupe-window",
        type=int,
        default=DEFAULT_DEDUPE_WINDOW,
        help="S3: a record sent twice is stored once when its copies are at most this many "
        "records apart in a partition (memory: about 60 bytes a record; 0: off)",
    )
    p.add_argument("--hot-retention-s", type=int, help="InfluxDB: hot window (default 3600)")
    p.add_argument(
        "--max-names-per-run",
        type=int,
        help="InfluxDB: distinct metric names a run may use per measurement (default 1000, "
        "STEPLENS_INFLUX_MAX_NAMES_PER_RUN)",
    )
    p.add_argument(
        "--max-names-per-measurement",
        type=int,
        help="InfluxDB: distinct metric names per measurement in the hot bucket (default "
        "5000, STEPLENS_INFLUX_MAX_NAMES_PER_MEASUREMENT)",
    )
    p.add_argument("--no-setup", action="store_true", help="do not create buckets or tasks")
    p.add_argument("--deadline-s", type=float, default=30.0, help="retry deadline per write")
    p.add_argument(
        "-X",
        dest="kafka_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka consumer setting (repeatable), e.g. -X session.timeout.ms=6000",
    )
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str], prog: str = "steplens sink") -> int:
    args = _parser(prog).parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    redactor = redact.install()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    topics = Topics.from_env()
    names = args.topics.split(",") if args.topics else [topics.raw, topics.signals, topics.alerts]
    dl_topic = args.dead_letter_topic or topics.dead_letters
    ensure_topics(args.bootstrap, topics)
    policy = RetryPolicy(deadline_s=args.deadline_s)
    group = args.group or f"steplens-sink-{args.which}"
    extra = dict(opt.split("=", 1) for opt in args.kafka_options)
    consumer = Consumer(
        consumer_config(group, args.bootstrap, logger=kafka_logger("sink"), **extra)
    )
    dead = DeadLetters(dl_topic, group, args.bootstrap, logger=kafka_logger("sink"))
    port = DEFAULT_PORTS[args.which] if args.metrics_port is None else args.metrics_port
    metrics.serve(port)
    try:
        if args.which == "influx":
            return _run_influx(args, names, consumer, dead, stop=stop, policy=policy)
        return _run_s3(args, names, consumer, dead, stop=stop, policy=policy, redactor=redactor)
    finally:
        consumer.close()
        dead.flush(5)


def _run_influx(
    args: argparse.Namespace,
    names: list[str],
    consumer: Consumer,
    dead: DeadLetters,
    *,
    stop: threading.Event,
    policy: RetryPolicy,
) -> int:
    from steplens.sinks.influx import InfluxSink, make_client
    from steplens.sinks.loop import SinkLoop
    from steplens.sinks.rollup import ensure_buckets, ensure_rollup_task
    from steplens.sinks.settings import InfluxSettings

    settings = InfluxSettings.from_env()
    if args.bucket:
        settings = replace(settings, bucket=args.bucket)
    if args.hot_retention_s is not None:
        settings = replace(settings, hot_retention_s=args.hot_retention_s)
    if args.max_names_per_run is not None:
        settings = replace(settings, max_names_per_run=args.max_names_per_run)
    if args.max_names_per_measurement is not None:
        settings = replace(settings, max_names_per_measurement=args.max_names_per_measurement)
    client = make_client(settings)
    if not args.no_setup:
        ensure_buckets(client, settings)
        ensure_rollup_task(client, settings)
    sink = InfluxSink(client, settings, policy=policy, stop=stop)
    consumer.subscribe(names)
    try:
        SinkLoop(consumer, sink, dead, stop=stop, batch_size=args.batch_size).run()
    finally:
        sink.shutdown()
        client.close()
    return 0


def _run_s3(
    args: argparse.Namespace,
    names: list[str],
    consumer: Consumer,
    dead: DeadLetters,
    *,
    stop: threading.Event,
    policy: RetryPolicy,
    redactor: redact.Redactor,
) -> int:
    from steplens.sinks.chunks import Chunker
    from steplens.sinks.roller_loop import RollerLoop
    from steplens.sinks.s3 import S3Roller, credential_values, ensure_bucket, make_s3_client
    from steplens.sinks.settings import S3Settings

    settings = S3Settings.from_env()
    if args.bucket:
        settings = replace(settings, bucket=args.bucket)
    if args.prefix is not None:
        settings = replace(settings, prefix=args.prefix)
    redactor.add(credential_values(settings))  # from a profile, say: not in the environment
    client = make_s3_client(settings)
    if not args.no_setup:
        ensure_bucket(client, settings.bucket)
    roller = S3Roller(client, settings, policy=policy, stop=stop)
    chunker = Chunker(
        roller.marker,
        max_bytes=args.max_bytes,
        max_age_s=args.max_age_s,
        dedupe_window=args.dedupe_window,
    )
    loop = RollerLoop(
        consumer, roller, dead, chunker=chunker, stop=stop, batch_size=args.batch_size
    )
    consumer.subscribe(names, on_revoke=loop.on_revoke)
    loop.run()
    loop.drain()
    return 0
