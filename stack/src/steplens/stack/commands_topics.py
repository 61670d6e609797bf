"""`steplens topics create`: the Kafka topics of steplens (names from STEPLENS_TOPIC_*)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from steplens.schema.settings import kafka_bootstrap
from steplens.schema.topics import Topics, ensure_topics


def main(argv: list[str], prog: str = "steplens topics") -> int:
    parser = argparse.ArgumentParser(prog=prog, description="Create the steplens Kafka topics.")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = sub.add_parser("create", help="create the topics that do not exist yet")
    create.add_argument("--bootstrap", help="Kafka bootstrap servers (STEPLENS_KAFKA_BOOTSTRAP)")
    create.add_argument("--raw-partitions", type=int, help="partitions of the raw topic")
    create.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for Kafka")
    args = parser.parse_args(argv)

    from confluent_kafka import KafkaException

    topics = Topics.from_env()
    if args.raw_partitions:
        topics = replace(topics, raw_partitions=args.raw_partitions)
    bootstrap = kafka_bootstrap(args.bootstrap)
    try:
        created = ensure_topics(bootstrap, topics, timeout_s=args.timeout)
    except KafkaException as exc:
        print(
            f"{prog} create: Kafka at {bootstrap} did not answer ({exc}); "
            "is the stack up? (`steplens stack up`)",
            file=sys.stderr,
        )
        return 1
    for name, partitions in topics.all().items():
        print(
            f"{name:<24} {partitions:>3} partitions  {'created' if name in created else 'exists'}"
        )
    return 0
