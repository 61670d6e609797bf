"""`steplens query --run RUN --metric loss [--rank R] [--since ... --until ...] [--csv FILE]`,
and `steplens query --run RUN --batch --rank R --step S [--csv FILE]`: the samples (hashes,
ids) and lengths of the batch a rank logged at a step."""

from __future__ import annotations

import argparse
import sys

from steplens.sinks.query import IDENTITY, StoreRefused, query_series


def main(argv: list[str], prog: str = "steplens query") -> int:
    p = argparse.ArgumentParser(
        prog=prog, description="One series stitched from InfluxDB (recent) and S3 (older)."
    )
    p.add_argument("--run", required=True, help="run id")
    p.add_argument("--metric", help="e.g. loss, lr, grad_norm, or a scalar's name")
    p.add_argument("--kind", default="step", choices=sorted(IDENTITY), help="record kind")
    p.add_argument("--rank", type=int, help="one rank only")
    p.add_argument(
        "--batch",
        action="store_true",
        help="the batch of --rank at --step (log_batch): its samples' hashes, ids and lengths",
    )
    p.add_argument("--step", type=int, help="with --batch: the step")
    p.add_argument("--since", help="ISO time, or relative like -2h")
    p.add_argument("--until", help="ISO time, or relative like -5min")
    p.add_argument("--csv", metavar="FILE", help="write CSV here ('-' for stdout)")
    args = p.parse_args(argv)
    if args.batch:
        if args.rank is None or args.step is None:
            p.error("--batch needs --rank and --step")
        return _batch(args, prog)
    if not args.metric:
        p.error("--metric is required (or --batch)")
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


def _batch(args: argparse.Namespace, prog: str) -> int:
    import pandas as pd

    from steplens.sinks.query_data import format_batch, query_batch

    try:
        batch = query_batch(args.run, args.rank, args.step, since=args.since, until=args.until)
    except StoreRefused as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if batch is None:
        print(f"{prog}: no batch of rank {args.rank} at step {args.step}", file=sys.stderr)
        return 1
    if args.csv:
        ids = batch.ids + [""] * (len(batch.hashes) - len(batch.ids))
        n = len(batch.hashes)
        frame = pd.DataFrame({"sample": range(n), "hash": batch.hashes, "id": ids[:n]})
        frame.to_csv(sys.stdout if args.csv == "-" else args.csv, index=False)
    else:
        print(format_batch(batch))
    return 0
