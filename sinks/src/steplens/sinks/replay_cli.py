"""`steplens replay --run RUN [--topic T]`: re-stream cold records into Kafka.
`steplens replay --spool DIR [--topic T]`: send a producer's disk spool to Kafka."""

from __future__ import annotations

import argparse
import sys

from steplens.schema.settings import add_options, given, resolve
from steplens.sinks.replay import REPLAYED_KINDS, replay
from steplens.sinks.settings import S3Settings

DEFAULT_TOPIC = "steplens.replay"


def main(argv: list[str], prog: str = "steplens replay") -> int:
    p = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Re-stream a run's records from S3 into Kafka, in time order. The default topic is "
            f"{DEFAULT_TOPIC!r}, so the cold store does not archive them twice; point a worker "
            "at it with STEPLENS_TOPIC_RAW, or pass --topic."
        ),
    )
    p.add_argument("--run")
    p.add_argument(
        "--spool",
        metavar="DIR",
        help="send the records a producer left in its spool (a spool_dir or any folder in it) "
        "to the raw topic (or --topic), then delete them; folders of running jobs are skipped",
    )
    p.add_argument("--topic")
    p.add_argument("--kinds", default=",".join(REPLAYED_KINDS), help="comma-separated kinds")
    p.add_argument("--since")
    p.add_argument("--until")
    p.add_argument("--bootstrap")
    add_options(p, S3Settings)
    args = p.parse_args(argv)
    if args.spool is not None:
        return _send_spool(args.spool, args.topic, args.bootstrap)
    if args.run is None:
        p.error("--run or --spool is required")
    args.topic = args.topic or DEFAULT_TOPIC
    s = resolve(S3Settings, given(S3Settings, args))
    n = replay(
        s,
        args.run,
        args.topic,
        bootstrap=args.bootstrap,
        kinds=args.kinds.split(","),
        since=args.since,
        until=args.until,
    )
    print(f"replayed {n} records of run {args.run!r} into {args.topic}", file=sys.stderr)
    return 0


def _send_spool(directory: str, topic: str | None, bootstrap: str | None) -> int:
    from steplens.producer.spool import send_spool
    from steplens.producer.transport import KafkaTransport, kafka_conf
    from steplens.schema.settings import kafka_bootstrap, kafka_security_config
    from steplens.schema.topics import Topics

    topic = topic or Topics.from_env().raw
    conf = kafka_conf(
        kafka_bootstrap(bootstrap), "steplens-replay-spool", 30.0, kafka_security_config()
    )
    sent, left = send_spool(directory, KafkaTransport(topic, conf))
    print(f"sent {sent} spooled records to {topic}; {left} left", file=sys.stderr)
    return 0 if left == 0 else 1
