"""Prometheus metrics of the sinks (served on 127.0.0.1 by ``steplens sink``; STEPLENS_METRICS_HOST
chooses another address, e.g. 0.0.0.0 inside a container that Prometheus scrapes)."""

from __future__ import annotations

import os

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECORDS = Counter(
    "steplens_sink_records",
    "Records handled by an output, by outcome: accepted, skipped (accepted, deliberately not "
    "written: past the hot window, not an output's kind, a notification posted already), "
    "dead_letter (not stored), trimmed (stored without some fields, dead-lettered too)",
    ["sink", "outcome"],
)
RETRIES = Counter(
    "steplens_sink_retries",
    "Attempts again after a retryable result: a batch exported, dead letters sent",
    ["sink"],
)
COMMITS = Counter("steplens_sink_commits", "Offset commits, by result", ["sink", "result"])
EXPORT_SECONDS = Histogram(
    "steplens_sink_export_seconds", "Time to make one batch durable", ["sink"]
)
LAST_COMMIT = Gauge(
    "steplens_sink_last_commit_timestamp_seconds", "Wall time of the last commit", ["sink"]
)
S3_OBJECTS = Counter("steplens_s3_objects", "Parquet objects uploaded")
S3_BYTES = Counter("steplens_s3_bytes", "Parquet bytes uploaded")
S3_DUPLICATES = Counter(
    "steplens_s3_duplicate_rows", "Rows left out of S3: the same record was already rolled"
)
NOTIFICATIONS = Counter(
    "steplens_sink_notifications",
    "Alert posts of a notifier, by outcome: sent, refused (dead-lettered), repeated (a "
    "transition posted already), superseded (a later state of the same alert in the batch), "
    "evicted (firing alerts past the ones kept for resends), resent, resend_failed",
    ["sink", "outcome"],
)
FIELDS_DROPPED = Counter(
    "steplens_sink_fields_dropped",
    "Field values left out of InfluxDB: their name was over a name limit",
    ["sink", "measurement", "limit"],
)

RANKS_LEFT_OUT = Counter(
    "steplens_sink_ranks_left_out",
    "Records of ranks past their run's budget of per-rank series (InfluxDB: "
    "--max-ranks-per-run; S3 keeps them), by sink",
    ["sink"],
)
OUT_OF_TIME = Counter(
    "steplens_sink_out_of_time",
    "Steps not stored for their time, by sink and reason: future (later than the allowed "
    "clock skew; dead-lettered), past_retention (InfluxDB: older than the hot window; S3 keeps "
    "them)",
    ["sink", "reason"],
)


def serve(port: int) -> None:
    """Expose /metrics on ``port`` (0 disables) of STEPLENS_METRICS_HOST, else 127.0.0.1."""
    if port:
        start_http_server(port, addr=os.environ.get("STEPLENS_METRICS_HOST") or "127.0.0.1")
