"""S3 of the local stack: put, list and get with boto3 as users do; data survives a restart."""

from __future__ import annotations

import os
import uuid

import boto3
import pytest

from steplens.stack import Stack, StackError
from steplens.stack.process import cmdline, free_ports

pytestmark = pytest.mark.stack


def _client_from_env():
    # Keys and region come from the stack's env; the endpoint is given as the sinks give it.
    return boto3.client("s3", endpoint_url=os.environ["STEPLENS_S3_ENDPOINT"])


def test_object_round_trip(stack_env: dict[str, str]) -> None:
    s3 = _client_from_env()
    bucket = stack_env["STEPLENS_S3_BUCKET"]
    key = f"tests/{uuid.uuid4()}/part-0.parquet"
    body = uuid.uuid4().bytes * 1000
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=key.rsplit("/", 1)[0])
    assert [(o["Key"], o["Size"]) for o in listed["Contents"]] == [(key, len(body))]
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body


def test_multipart_upload(stack_env: dict[str, str], tmp_path) -> None:
    s3 = _client_from_env()
    bucket = stack_env["STEPLENS_S3_BUCKET"]
    src = tmp_path / "big.bin"
    src.write_bytes(uuid.uuid4().bytes * (12 << 16))  # 12 MiB: above boto3's 8 MiB threshold
    key = f"tests/{uuid.uuid4()}/big.bin"
    s3.upload_file(str(src), bucket, key)
    dst = tmp_path / "back.bin"
    s3.download_file(bucket, key, str(dst))
    assert dst.read_bytes() == src.read_bytes()


@pytest.mark.slow
def test_restart_pause_and_kill_keep_objects(private_stack) -> None:
    stack = private_stack(["s3"])
    svc = stack.service("s3")
    key = f"keep/{uuid.uuid4()}"
    svc.client().put_object(Bucket="steplens", Key=key, Body=b"durable")
    assert stack.stop("s3") is True
    assert stack.pid("s3") is None
    stack.start("s3")
    assert svc.client().get_object(Bucket="steplens", Key=key)["Body"].read() == b"durable"

    # The same home asked for other ports while running: a clear refusal, nothing restarted.
    other = Stack(home=stack.home, ports={"s3": free_ports(1)[0]})
    with pytest.raises(StackError, match="stack down"):
        other.up(["s3"])
    assert other.pid("s3") == stack.pid("s3") is not None

    stack.pause("s3")
    assert svc.probe() is not None  # frozen: connections hang until the client times out
    stack.resume("s3")
    assert svc.probe() is None

    pid = stack.pid("s3")
    assert stack.kill("s3") is True
    assert pid is not None and cmdline(pid) == ""
    stack.start("s3")
    assert svc.client().get_object(Bucket="steplens", Key=key)["Body"].read() == b"durable"
