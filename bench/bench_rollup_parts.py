"""What a rollup run spends on each measurement of a wide run.

Reads a hot bucket that ``bench_scale_ranks.py --keep-buckets`` left (its name is in the
bench's output) and rolls up its last closed minute, then its last five, as the sink's loop
does (``rollup.roll``, one query a measurement, into the bucket's own ``-rollup`` bucket):
prints the text-field scan and each measurement's seconds, largest first, and the points
written. Rewriting a minute rewrites the same points, so it can be run again and again on the
same bucket, before and after a change (the same data, the same machine, minutes apart).

    python bench/bench_scale_ranks.py --ranks 1024 --steps 240 --keep-buckets
    python bench/bench_rollup_parts.py --bucket bench-scale1024-<tag>
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from datetime import timedelta

from steplens.schema.flux_literals import flux_string
from steplens.sinks.influx import make_client
from steplens.sinks.rollup import ensure_buckets, measurements, roll
from steplens.sinks.settings import InfluxSettings
from steplens.sinks.text_fields import TextFields


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bucket", required=True, help="a kept hot bucket of the scale bench")
    ap.add_argument("--minutes", type=int, nargs="+", default=[1, 5])
    a = ap.parse_args()
    s = InfluxSettings.from_env()
    s = replace(s, bucket=a.bucket, rollup_bucket=f"{a.bucket}-rollup", timeout_ms=600_000)
    with make_client(s, timeout_ms=600_000) as client:
        ensure_buckets(client, s)
        q = client.query_api()
        fields = TextFields()
        t = time.monotonic()
        fields.scan_if_stale(q, s)
        print(f"text-field scan: {time.monotonic() - t:.1f} s, {fields.count()} fields")
        last = f"""from(bucket: {flux_string(a.bucket)}) |> range(start: -30d)
    |> filter(fn: (r) => r._measurement == "step_window")
    |> keep(columns: ["_time"]) |> max(column: "_time")"""
        ends = [r.get_time() for tb in q.query(last, org=s.org) for r in tb.records]
        if not ends:
            print(f"{a.bucket}: no step windows", file=sys.stderr)
            return 1
        end = max(ends).replace(second=0, microsecond=0)  # the data's last closed minute
        for minutes in a.minutes:
            span = (end - timedelta(minutes=minutes), end)
            took: dict[str, float] = {}
            points = 0
            for name in measurements(client, s, *span):
                t = time.monotonic()
                points += roll(client, s, span, [name], skips=fields.flux_dict())
                took[name] = time.monotonic() - t
            parts = sorted(took.items(), key=lambda kv: -kv[1])
            print(
                f"{minutes} min: {sum(took.values()):.1f} s, {points} points; "
                + ", ".join(f"{k} {v:.1f}" for k, v in parts),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
