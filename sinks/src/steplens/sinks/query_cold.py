"""The query layer's reads from S3 (the cold store): a run's rows of one kind as DataFrames.

Objects are listed under the run's prefix and filtered by their ``hour=`` partition before any
is read. An S3 answer that refuses the request (credentials, a missing bucket: HTTP 4xx) is a
``refusal``, which the query layer reports instead of skipping the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import botocore.exceptions
import pandas as pd

from steplens.sinks.cold import hour_from_key, hour_of, read_parquet, run_prefix
from steplens.sinks.settings import S3Settings


def refusal(s: S3Settings, exc: BaseException) -> str | None:
    """Why S3 refused a request for good (an HTTP 4xx), or None (unreachable, failing)."""
    if not isinstance(exc, botocore.exceptions.ClientError):
        return None
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    if not 400 <= status < 500 or status == 429:
        return None
    code = exc.response.get("Error", {}).get("Code", "?")
    hint = {
        "InvalidAccessKeyId": "check AWS_ACCESS_KEY_ID",
        "SignatureDoesNotMatch": "check AWS_SECRET_ACCESS_KEY",
        "AccessDenied": "the credentials may not read this bucket",
        "NoSuchBucket": "check STEPLENS_S3_BUCKET",
    }.get(code, "")
    detail = f"S3 at {s.endpoint_url or 'AWS'} answered HTTP {status} {code} (bucket {s.bucket})"
    return f"{detail}: {hint}" if hint else detail


def _hours(since: int | None, until: int | None) -> tuple[str, str]:
    return (
        hour_of(since) if since is not None else "",
        hour_of(until) if until is not None else "~",
    )


def s3_objects(
    s: S3Settings, kind: str, run_id: str, since: int | None, until: int | None
) -> Iterator[tuple[Any, str]]:
    """The run's ``kind`` objects of the hours from ``since`` to ``until`` (ns; None: open),
    each with the client that lists them."""
    from steplens.sinks.s3 import make_s3_client

    client = make_s3_client(s)
    lo, hi = _hours(since, until)
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=s.bucket, Prefix=run_prefix(s.prefix, kind, run_id)
    )
    for page in pages:
        for obj in page.get("Contents", []):
            hour = hour_from_key(obj["Key"]) or ""
            if lo <= hour <= hi:
                yield client, obj["Key"]


def s3_frame(
    s: S3Settings,
    kind: str,
    run_id: str,
    *,
    rank: int | None,
    since: int | None,
    until: int | None,
    columns: list[str] | None,
) -> pd.DataFrame:
    """The run's rows of ``kind`` in the time range (and of one rank)."""
    frames = []
    for client, key in s3_objects(s, kind, run_id, since, until):
        body = client.get_object(Bucket=s.bucket, Key=key)["Body"].read()
        frame = read_parquet(body, columns).to_pandas()
        frames.append(frame)
    if not frames:
        return pd.DataFrame()
    frame = pd.concat(frames, ignore_index=True)
    keep = pd.Series(True, index=frame.index)
    if since is not None:
        keep &= frame["time_ns"] >= since
    if until is not None:
        keep &= frame["time_ns"] <= until
    if rank is not None and "rank" in frame:
        keep &= frame["rank"] == rank
    return frame[keep].reset_index(drop=True)
