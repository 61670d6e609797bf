"""The ``profile`` remedy's trace stored in the local stack's S3 (s3proxy) and read back."""

from __future__ import annotations

import gzip
import json
import urllib.request
import uuid

import pytest
from tests.producer.test_profile_auto import advise, train
from tests.waiting import wait_until

from steplens.producer.remedies.trace_upload import trace_key
from steplens.sinks.trace_links import presigner

pytest.importorskip("torch")
boto3 = pytest.importorskip("boto3")
pytestmark = [pytest.mark.stack, pytest.mark.slow]


def test_a_trace_is_uploaded_gzipped_and_named_in_the_acted_record(
    stack_env, memory_monitor, tmp_path
):
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    bucket = stack_env["STEPLENS_S3_BUCKET"]
    m, t = memory_monitor(
        s3_bucket=bucket, s3_prefix=prefix, s3_endpoint=stack_env["STEPLENS_S3_ENDPOINT"]
    )
    m.remedies.profile_dir = str(tmp_path)
    advise(m, t, 0, action="profile", fingerprint="slow-rank-7", duration_s=0.2)
    train(m, 400, until=lambda: bool(m.remedies.answers))
    assert wait_until(lambda: m.remedies.answers, timeout_s=30)
    [(_, _, outcome, detail, _)] = m.remedies.answers
    key = trace_key(prefix, m.run_id, 0, "slow-rank-7")
    assert outcome == "acted" and detail.startswith(f"trace s3://{bucket}/{key}: "), detail
    client = boto3.client("s3", endpoint_url=stack_env["STEPLENS_S3_ENDPOINT"])
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        trace = json.loads(gzip.decompress(body))
        assert any("aten::" in e.get("name", "") for e in trace["traceEvents"])
        # the report's link: a presigned URL anyone with it can read
        url = presigner()(f"s3://{bucket}/{key}")
        assert url is not None and "X-Amz-Signature=" in url
        with urllib.request.urlopen(url, timeout=10) as got:
            assert got.read() == body
    finally:
        client.delete_object(Bucket=bucket, Key=key)
    m.flush(5)
    [rec] = t.records("acted")
    assert rec.data["detail"] == detail
