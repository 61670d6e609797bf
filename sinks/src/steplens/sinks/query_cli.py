"""`steplens query --run RUN --metric loss [--rank R] [--since ... --until ...] [--csv FILE]`."""

from __future__ import annotations

import argparse
import sys

from steplens.sinks.query import IDENTITY, StoreRefused, query_series


def main(argv: list[str], prog: str = "steplens query") -> int:
    p = argparse.ArgumentParser(
        prog=prog, description="One series stitched from InfluxDB (recent) and S3 (older)."
    )
    p.add_argument("--run", required=True, help="run id")
    p.add_argument("--metric", required=True, help="e.g. loss, lr, grad_norm, or a scalar's name")
    p.add_argument("--kind", default="step", choices=sorted(IDENTITY), help="record kind")
    p.add_argument("--rank", type=int, help="one rank only")
    p.add_argument("--since", help="ISO time, or relative like -2h")
    p.add_argument("--until", help="ISO time, or relative like -5min")
    p.add_argument("--csv", metavar="FILE", help="write CSV here ('-' for stdout)")
    args = p.parse_args(argv)
    try:
        frame = query_series(
            args.run,
            args.metric,
            rank=args.rank,
            since=args.since,
            until=args.until,
            kind=args.kind,
        )
    except StoreRefused as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if args.csv:
        frame.to_csv(sys.stdout if args.csv == "-" else args.csv, index=False)
    else:
        print(frame.to_string(index=False) if len(frame) else "(no points)")
    print(
        f"{len(frame)} points ({(frame['source'] == 'influx').sum() if len(frame) else 0} from "
        f"InfluxDB, {(frame['source'] == 's3').sum() if len(frame) else 0} from S3)",
        file=sys.stderr,
    )
    return 0
