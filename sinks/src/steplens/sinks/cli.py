"""`steplens sink influx|s3`: run a sink until SIGINT/SIGTERM.

Its options are generated from the declarations in ``steplens.sinks.settings`` (the sink's
own, and InfluxDB's or S3's): a flag given wins over the variable, which wins over the default.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from confluent_kafka import Consumer

from steplens.schema.settings import add_options, given, resolve
from steplens.schema.topics import Topics, ensure_topics
from steplens.sinks import metrics, redact
from steplens.sinks.kafka_io import DeadLetters, consumer_config
from steplens.sinks.retry import RetryPolicy
from steplens.sinks.settings import InfluxSettings, RollSettings, S3Settings, SinkSettings


def _parser(prog: str) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    add_options(common, SinkSettings)
    common.add_argument(
        "-X",
        dest="kafka_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka consumer setting (repeatable), e.g. -X session.timeout.ms=6000",
    )
    p = argparse.ArgumentParser(prog=prog, description="Run a steplens sink.")
    sub = p.add_subparsers(dest="which", required=True, metavar="{influx,s3}")
    influx = sub.add_parser("influx", parents=[common], help="hot store (InfluxDB)")
    add_options(influx, InfluxSettings)
    s3 = sub.add_parser("s3", parents=[common], help="cold store (Parquet on S3)")
    add_options(s3, S3Settings)
    add_options(s3, RollSettings)
    return p


def main(argv: list[str], prog: str = "steplens sink") -> int:
    args = _parser(prog).parse_args(argv)
    s = resolve(SinkSettings, given(SinkSettings, args))
    logging.basicConfig(level=s.log_level, format="%(asctime)s %(name)s %(message)s")
    redactor = redact.install()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    topics = Topics.from_env()
    names = s.topics.split(",") if s.topics else [topics.raw, topics.signals, topics.alerts]
    dl_topic = s.dead_letter_topic or topics.dead_letters
    ensure_topics(s.bootstrap, topics)
    policy = RetryPolicy(deadline_s=s.deadline_s)
    group = s.group or f"steplens-sink-{args.which}"
    extra = dict(opt.split("=", 1) for opt in args.kafka_options)
    consumer = Consumer(consumer_config(group, s.bootstrap, **extra))
    dead = DeadLetters(dl_topic, group, s.bootstrap)
    metrics.serve(s.port(args.which))
    try:
        if args.which == "influx":
            return _run_influx(args, s, names, consumer, dead, stop=stop, policy=policy)
        return _run_s3(args, s, names, consumer, dead, stop=stop, policy=policy, redactor=redactor)
    finally:
        consumer.close()
        dead.flush(5)


def _run_influx(
    args: argparse.Namespace,
    s: SinkSettings,
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

    settings = resolve(InfluxSettings, given(InfluxSettings, args))
    client = make_client(settings)
    if s.setup:
        ensure_buckets(client, settings)
        ensure_rollup_task(client, settings)
    sink = InfluxSink(client, settings, policy=policy, stop=stop)
    consumer.subscribe(names)
    try:
        SinkLoop(consumer, sink, dead, stop=stop, batch_size=s.batch_size).run()
    finally:
        sink.shutdown()
        client.close()
    return 0


def _run_s3(
    args: argparse.Namespace,
    s: SinkSettings,
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

    settings = resolve(S3Settings, given(S3Settings, args))
    roll = resolve(RollSettings, given(RollSettings, args))
    redactor.add(credential_values(settings))  # from a profile, say: not in the environment
    client = make_s3_client(settings)
    if s.setup:
        ensure_bucket(client, settings.bucket)
    roller = S3Roller(client, settings, policy=policy, stop=stop)
    chunker = Chunker(
        roller.marker,
        max_bytes=roll.max_bytes,
        max_age_s=roll.max_age_s,
        dedupe_window=roll.dedupe_window,
    )
    loop = RollerLoop(consumer, roller, dead, chunker=chunker, stop=stop, batch_size=s.batch_size)
    consumer.subscribe(names, on_revoke=loop.on_revoke)
    loop.run()
    loop.drain()
    return 0
