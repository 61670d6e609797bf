"""Parquet into the S3 server (`steplens stack up`): MB/s through the roller's write path
(rows -> Parquet -> PUT) against boto3 PUTting the same number of bytes directly (same run).
Then steps/s through decode + roller when the same steps come as step_batch messages of
--batch-steps steps against one message per step (alternating rounds, median ratio).
--records makes it longer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sinks"))

import statistics

from sinks_helpers import step_batch, step_records

from steplens.schema import Record, decode, encode
from steplens.sinks.chunks import Chunker
from steplens.sinks.cold import record_row, rows_to_parquet
from steplens.sinks.kafka_io import Consumed
from steplens.sinks.s3 import S3Roller, ensure_bucket, make_s3_client
from steplens.sinks.settings import S3Settings


def batches_of(recs: list[Record], per: int) -> list[Record]:
    """The steps of each rank, ``per`` consecutive ones to a step_batch."""
    ranks = sorted({r.rank for r in recs})
    out = []
    for rank in ranks:
        mine = [r for r in recs if r.rank == rank]
        out += [step_batch(mine[i : i + per]) for i in range(0, len(mine), per)]
    return out


def roll_seconds(client: object, s: S3Settings, messages: list[bytes], chunk_mb: float) -> float:
    """Decode, buffer and upload ``messages`` as the roller loop does (to a fresh prefix)."""
    s = S3Settings(
        bucket=s.bucket, prefix=f"{s.prefix}/{uuid.uuid4().hex[:6]}", endpoint_url=s.endpoint_url
    )
    roller = S3Roller(client, s)
    buffer = Chunker(roller.marker, max_bytes=int(chunk_mb * 1e6))
    t0 = time.perf_counter()
    chunks = []
    for i, value in enumerate(messages):
        chunks += buffer.add(Consumed("bench.raw", 0, i, None, value, decode(value)))
    for c in chunks + buffer.due(everything=True):
        roller.write(c)
    return time.perf_counter() - t0


def compare_batched(client: object, s: S3Settings, n: int, per: int, chunk_mb: float) -> None:
    ratios, raw_rates, batched_rates = [], [], []
    for _ in range(3):  # alternate, so load changes on a shared machine hit both
        recs = step_records(f"bench-{uuid.uuid4().hex[:6]}", n, ranks=8)
        raw = [encode(r) for r in recs]
        batched = [encode(b) for b in batches_of(recs, per)]
        t_raw = roll_seconds(client, s, raw, chunk_mb)
        t_batched = roll_seconds(client, s, batched, chunk_mb)
        raw_rates.append(n / t_raw)
        batched_rates.append(n / t_batched)
        ratios.append(t_raw / t_batched)
    print(f"step_batch of {per}: {statistics.median(batched_rates):,.0f} steps/s (median)")
    print(f"one step a message: {statistics.median(raw_rates):,.0f} steps/s (median)")
    shown = ", ".join(f"{r:.0%}" for r in ratios)
    print(f"batched / raw     : {statistics.median(ratios):.0%} median of [{shown}]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--chunk-mb", type=float, default=8.0)
    ap.add_argument("--batch-steps", type=int, default=100, help="steps per step_batch")
    args = ap.parse_args()
    s = S3Settings.from_env()
    s = S3Settings(
        bucket=s.bucket, prefix=f"bench-{uuid.uuid4().hex[:8]}", endpoint_url=s.endpoint_url
    )
    client = make_s3_client(s)
    ensure_bucket(client, s.bucket)
    recs = step_records(f"bench-{uuid.uuid4().hex[:6]}", args.records, ranks=8)
    items = [Consumed("bench.raw", 0, i, r.key, encode(r), r) for i, r in enumerate(recs)]
    json_mb = sum(len(i.value) for i in items) / 1e6

    rows_to_parquet("step", [record_row(recs[0], "warm", 0, 0, items[0].value)])  # lazy imports
    roller = S3Roller(client, s)
    buffer = Chunker(roller.marker, max_bytes=int(args.chunk_mb * 1e6))
    t0 = time.perf_counter()
    chunks = [c for it in items for c in buffer.add(it)] + buffer.due(everything=True)
    written = 0
    for c in chunks:
        for key in roller.write(c):
            written += client.head_object(Bucket=s.bucket, Key=key)["ContentLength"]
    t_roller = time.perf_counter() - t0

    blob = os.urandom(max(1, written // max(1, len(chunks))))
    t0 = time.perf_counter()
    for i in range(len(chunks)):
        client.put_object(Bucket=s.bucket, Key=f"{s.prefix}/direct/{i}", Body=blob)
    t_direct = time.perf_counter() - t0

    pq_mb = written / 1e6
    print(f"{args.records:,} records: {json_mb:.1f} MB JSON -> {pq_mb:.1f} MB Parquet")
    print(f"chunks  : {len(chunks)} of {args.chunk_mb} MB input each")
    print(
        f"roller  : {pq_mb / t_roller:.1f} MB/s Parquet, {json_mb / t_roller:.1f} MB/s of records"
    )
    print(f"records : {args.records / t_roller:,.0f} records/s")
    print(f"direct  : {pq_mb / t_direct:.1f} MB/s (boto3 put_object of the same bytes)")
    print(f"roller / direct: {t_direct / t_roller:.0%} (the rest is building rows and Parquet)")
    compare_batched(client, s, args.records // 2, args.batch_steps, args.chunk_mb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
