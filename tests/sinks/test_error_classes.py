"""Which failures are refusals of the data (dead letters) and which make a batch retryable:
pure, no server."""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import pytest
import urllib3
from influxdb_client.rest import ApiException

from steplens.sinks import influx
from steplens.sinks.chunks import Chunk
from steplens.sinks.s3 import S3Roller
from steplens.sinks.settings import S3Settings


@pytest.mark.parametrize(
    ("exc", "refused"),
    [
        (ApiException(status=429), False),
        (ApiException(status=500), False),
        (ApiException(status=503), False),
        (ApiException(status=401), False),  # configuration: wait for the operator, drop nothing
        (ApiException(status=404), False),
        (ApiException(status=400), True),
        (ApiException(status=413), True),
        (ApiException(status=422), True),
        (ConnectionRefusedError(), False),
        (urllib3.exceptions.ReadTimeoutError(None, "/", "timed out"), False),
        (ValueError("bug"), False),
    ],
)
def test_influx_refusals(exc: BaseException, refused: bool) -> None:
    assert influx.refused(exc) is refused


class FailingS3:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.calls = 0

    def put_object(self, **_: Any) -> None:
        self.calls += 1
        raise self.exc


@pytest.mark.parametrize(
    "exc",
    [
        botocore.exceptions.ClientError({"Error": {"Code": "SlowDown"}}, "PutObject"),
        botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"),
        ValueError("bug"),
    ],
)
def test_every_s3_failure_makes_the_chunk_retryable_after_one_attempt(exc: Exception) -> None:
    client = FailingS3(exc)
    chunk = Chunk("raw", 0, 10)
    chunk.groups[("step", "run", "2024-01-01T00")] = []  # type: ignore[index]
    chunk.records = 1
    result = S3Roller(client, S3Settings(bucket="b")).export(chunk)
    assert result.retryable and client.calls == 1 and type(exc).__name__ in result.error


def test_a_full_influx_query_queue_is_busy_not_a_refusal() -> None:
    """InfluxDB answers HTTP 400 "queue length exceeded" when its query queue is full: the
    query layer skips or retries it, as a 429; another 400 is a refusal with its reason."""
    from steplens.sinks.query_hot import refusal
    from steplens.sinks.settings import InfluxSettings

    s = InfluxSettings(url="http://127.0.0.1:1", token="t", org="o", bucket="b")
    busy = ApiException(status=400)
    busy.body = b'{"code":"invalid","message":"queue length exceeded"}'
    assert refusal(s, busy) is None
    bad = ApiException(status=400)
    bad.body = b'{"code":"invalid","message":"compilation failed"}'
    assert "compilation failed" in (refusal(s, bad) or "")
