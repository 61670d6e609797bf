"""Which failures are retried and which are refusals of the data: pure, no server."""

from __future__ import annotations

import botocore.exceptions
import pytest
import urllib3
from influxdb_client.rest import ApiException

from steplens.sinks import influx, s3


@pytest.mark.parametrize(
    ("exc", "retry"),
    [
        (ApiException(status=429), True),
        (ApiException(status=500), True),
        (ApiException(status=503), True),
        (ApiException(status=401), True),  # configuration: wait for the operator, drop nothing
        (ApiException(status=404), True),
        (ApiException(status=400), False),
        (ApiException(status=413), False),
        (ApiException(status=422), False),
        (ConnectionRefusedError(), True),
        (urllib3.exceptions.ReadTimeoutError(None, "/", "timed out"), True),
        (ValueError("bug"), False),
    ],
)
def test_influx_transient(exc: BaseException, retry: bool) -> None:
    assert influx.transient(exc) is retry


def test_s3_errors_are_all_retried() -> None:
    err = botocore.exceptions.ClientError({"Error": {"Code": "SlowDown"}}, "PutObject")
    assert s3.transient(err)
    assert s3.transient(botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"))
    assert not s3.transient(ValueError("bug"))
