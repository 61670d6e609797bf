"""`steplens sink influx|s3|webhook|alertmanager`: run an output until SIGINT/SIGTERM.

Every output runs behind the one consumer loop (``loop.py``), which retries and commits
offsets only after a durable export. Its options are generated from the declarations in
``steplens.sinks.settings`` (the process's own, and the output's): a flag given wins over the
variable, which wins over the default.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from confluent_kafka import Consumer

from steplens.schema.kafka_config import consumer_config
from steplens.schema.settings import add_options, given, resolve
from steplens.schema.time_bounds import TimeBounds
from steplens.schema.topics import Topics, ensure_topics
from steplens.sinks import metrics, redact
from steplens.sinks.kafka_io import DeadLetters
from steplens.sinks.settings import (
    AlertmanagerSettings,
    InfluxSettings,
    RollSettings,
    S3Settings,
    SinkSettings,
    WebhookSettings,
)

NOTIFIERS: dict[str, type[WebhookSettings | AlertmanagerSettings]] = {
    "webhook": WebhookSettings,
    "alertmanager": AlertmanagerSettings,
}


def _parser(prog: str) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    add_options(common, SinkSettings)
    add_options(common, TimeBounds)
    common.add_argument(
        "-X",
        dest="kafka_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka consumer setting (repeatable), e.g. -X session.timeout.ms=6000",
    )
    p = argparse.ArgumentParser(prog=prog, description="Run a steplens output.")
    sub = p.add_subparsers(dest="which", required=True, metavar="{influx,s3,webhook,alertmanager}")
    influx = sub.add_parser("influx", parents=[common], help="hot store (InfluxDB)")
    add_options(influx, InfluxSettings)
    s3 = sub.add_parser("s3", parents=[common], help="cold store (Parquet on S3)")
    add_options(s3, S3Settings)
    add_options(s3, RollSettings)
    hook = sub.add_parser("webhook", parents=[common], help="POST each alert transition")
    add_options(hook, WebhookSettings)
    am = sub.add_parser("alertmanager", parents=[common], help="incidents into Alertmanager")
    add_options(am, AlertmanagerSettings)
    return p


def main(argv: list[str], prog: str = "steplens sink") -> int:
    args = _parser(prog).parse_args(argv)
    s = resolve(SinkSettings, given(SinkSettings, args))
    logging.basicConfig(level=s.log_level, format="%(asctime)s %(name)s %(message)s")
    url = None
    if args.which in NOTIFIERS:
        cls = NOTIFIERS[args.which]
        url = resolve(cls, given(cls, args)).url
        if not url:
            print(f"{prog} {args.which}: no --url", file=sys.stderr)
            return 2
    redactor = redact.install()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    topics = Topics.from_env()
    default = [topics.alerts] if url else [topics.raw, topics.signals, topics.alerts, topics.advice]
    names = s.topics.split(",") if s.topics else default
    dl_topic = s.dead_letter_topic or topics.dead_letters
    ensure_topics(s.bootstrap, topics)
    group = s.group or f"steplens-sink-{args.which}"
    extra = dict(opt.split("=", 1) for opt in args.kafka_options)
    consumer = Consumer(consumer_config(group, s.bootstrap, extra=extra))
    dead = DeadLetters(dl_topic, group, s.bootstrap)
    metrics.serve(s.port(args.which))
    if args.which in ("influx", "s3"):
        _yield_cpu(s.nice)
    try:
        if args.which == "influx":
            return _run_influx(args, s, names, consumer, dead, stop=stop)
        if args.which == "s3":
            return _run_s3(args, s, names, consumer, dead, stop=stop, redactor=redactor)
        assert url is not None
        return _run_notifier(args.which, s, names, consumer, dead, url=url, stop=stop)
    finally:
        consumer.close()
        dead.flush(5)


def _yield_cpu(nice: int) -> None:
    """A store's writes can wait seconds; an alert should not (``--nice``)."""
    if not nice:
        return
    try:
        os.nice(nice)
    except OSError as exc:
        logging.getLogger("steplens.sinks").warning("niceness not raised: %s", exc)


def _run_influx(
    args: argparse.Namespace,
    s: SinkSettings,
    names: list[str],
    consumer: Consumer,
    dead: DeadLetters,
    *,
    stop: threading.Event,
) -> int:
    from steplens.sinks.influx import InfluxSink, make_client
    from steplens.sinks.loop import SinkLoop
    from steplens.sinks.rollup import ensure_buckets, remove_rollup_task
    from steplens.sinks.rollup_loop import RollupLoop
    from steplens.sinks.text_fields import TextFields

    settings = resolve(InfluxSettings, given(InfluxSettings, args))
    client = make_client(settings)
    if s.setup:
        ensure_buckets(client, settings)
        remove_rollup_task(client, settings)
    fields = TextFields()
    bounds = resolve(TimeBounds, given(TimeBounds, args))
    sink = InfluxSink(client, settings, bounds=bounds, text_fields=fields)
    rollups = rollup_client = None
    if settings.rollups:  # a client of its own: a run's query may take most of a minute
        rollup_client = make_client(settings, settings.rollup_timeout_ms)
        rollups = RollupLoop(rollup_client, settings, fields).start()
    consumer.subscribe(names)
    try:
        SinkLoop(consumer, sink, dead, stop=stop, batch_size=s.batch_size).run()
    finally:
        if rollups is not None:
            rollups.stop()
        sink.shutdown()
        client.close()
        if rollup_client is not None:
            rollup_client.close()
    return 0


def _run_s3(
    args: argparse.Namespace,
    s: SinkSettings,
    names: list[str],
    consumer: Consumer,
    dead: DeadLetters,
    *,
    stop: threading.Event,
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
    roller = S3Roller(client, settings)
    chunker = Chunker(
        roller.marker,
        max_bytes=roll.max_bytes,
        max_age_s=roll.max_age_s,
        buffer_bytes=roll.buffer_bytes,
        dedupe_window=roll.dedupe_window,
        bounds=resolve(TimeBounds, given(TimeBounds, args)),
    )
    loop = RollerLoop(consumer, roller, dead, chunker=chunker, stop=stop, batch_size=s.batch_size)
    consumer.subscribe(names, on_revoke=loop.on_revoke)
    loop.run()
    loop.drain()
    return 0


def _run_notifier(
    which: str,
    s: SinkSettings,
    names: list[str],
    consumer: Consumer,
    dead: DeadLetters,
    *,
    url: str,
    stop: threading.Event,
) -> int:
    from steplens.sinks.alertmanager import AlertmanagerOutput
    from steplens.sinks.loop import SinkLoop
    from steplens.sinks.webhook import WebhookOutput

    output: WebhookOutput | AlertmanagerOutput = (
        WebhookOutput(url) if which == "webhook" else AlertmanagerOutput(url)
    )
    consumer.subscribe(names)
    try:
        SinkLoop(consumer, output, dead, stop=stop, batch_size=s.batch_size).run()
    finally:
        output.shutdown()
    return 0
