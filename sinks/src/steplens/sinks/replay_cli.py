"""`steplens replay --run RUN [--topic T]`: re-stream cold records into Kafka."""

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
    p.add_argument("--run", required=True)
    p.add_argument("--topic")
    p.add_argument("--kinds", default=",".join(REPLAYED_KINDS), help="comma-separated kinds")
    p.add_argument("--since")
    p.add_argument("--until")
    p.add_argument("--bootstrap")
    add_options(p, S3Settings)
    args = p.parse_args(argv)
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
