"""`steplens spool send DIR [--topic T]`: send what producers left in a disk spool to Kafka.

A producer sends its own spool when it can, and the next producer with the same spool folder
sends what an ended one left; this sends a spool by hand (after a job ended in an outage, or
from another machine). Folders of running processes are skipped.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str], prog: str = "steplens spool") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="action", required=True)
    send = sub.add_parser(
        "send",
        help="send the records of a spool (a spool_dir or any folder in it), then delete them",
    )
    send.add_argument("directory", metavar="DIR")
    send.add_argument("--topic", help="default: the raw topic (STEPLENS_TOPIC_RAW)")
    send.add_argument("--bootstrap", help="Kafka bootstrap (default: STEPLENS_KAFKA_BOOTSTRAP)")
    send.add_argument("--timeout-s", type=float, default=30.0, help="wait per segment")
    args = p.parse_args(argv)

    from steplens.producer.delivery.spool import send_spool
    from steplens.producer.delivery.transport import KafkaTransport, kafka_conf
    from steplens.schema.settings import kafka_bootstrap, kafka_security_config
    from steplens.schema.topics import Topics

    topic = args.topic or Topics.from_env().raw
    conf = kafka_conf(
        kafka_bootstrap(args.bootstrap),
        "steplens-spool-send",
        args.timeout_s,
        kafka_security_config(),
    )
    sent, left = send_spool(args.directory, KafkaTransport(topic, conf), args.timeout_s)
    print(f"sent {sent} spooled records to {topic}; {left} left", file=sys.stderr)
    return 0 if left == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
