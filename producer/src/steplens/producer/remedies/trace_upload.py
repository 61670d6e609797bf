"""Where a finished ``rank_profile`` trace goes: an S3 object when boto3 is importable and a
bucket is set (``s3_bucket``, ``s3_prefix``, ``s3_endpoint``: the ``STEPLENS_S3_*`` settings
the sinks read; credentials from boto3's own chain), else the local file stays where it is.

Runs in the trace's own thread, never in the training loop's; boto3 is imported only here.
"""

from __future__ import annotations

import re
from typing import Any

UPLOAD_TIMEOUT_S = 30.0


def trace_key(prefix: str, run_id: str, rank: int, fingerprint: str) -> str:
    """``<prefix>/traces/run_id=<run>/<fingerprint>-rank<k>.json.gz``."""
    safe = re.sub(r"[^A-Za-z0-9_.=-]", "_", f"{fingerprint}-rank{rank}")[:200]
    run = re.sub(r"[^A-Za-z0-9_.=-]", "_", run_id)[:128]
    head = prefix.strip("/")
    return (f"{head}/" if head else "") + f"traces/run_id={run}/{safe}.json.gz"


def store(path: str, config: Any, run_id: str, rank: int, fingerprint: str) -> str:
    """Where the trace at ``path`` can be read: ``s3://bucket/key`` once uploaded, else
    ``path`` (no bucket set, or no boto3). An upload that fails raises."""
    bucket = getattr(config, "s3_bucket", None)
    if not bucket:
        return path
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        return path
    key = trace_key(getattr(config, "s3_prefix", "") or "", run_id, rank, fingerprint)
    client = boto3.client(
        "s3",
        endpoint_url=getattr(config, "s3_endpoint", None) or None,
        config=Config(  # as the sinks' client: path-style, checksums only where required
            s3={"addressing_style": "path"},
            connect_timeout=5,
            read_timeout=UPLOAD_TIMEOUT_S,
            retries={"max_attempts": 3, "mode": "standard"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
    client.upload_file(
        path,
        bucket,
        key,
        ExtraArgs={"ContentType": "application/json", "ContentEncoding": "gzip"},
    )
    return f"s3://{bucket}/{key}"
