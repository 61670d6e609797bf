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


def test_an_upload_a_stopped_server_left_unfinished_is_removed_at_start(tmp_path) -> None:
    """The upload file of a server stopped mid-upload (``<key>-<uuid>``, no ETag attribute)
    goes; objects, and an upload file that got its ETag, stay."""
    from steplens.stack.services.s3 import ETAG_XATTR, drop_interrupted_uploads

    folder = tmp_path / "steplens" / "kind=step" / "run_id=r"
    folder.mkdir(parents=True)
    kept = folder / "raw-p0-o0-9.parquet"
    kept.write_bytes(b"object")
    os.setxattr(kept, ETAG_XATTR, b"0" * 16)
    unfinished = folder / f"raw-p0-o10-19.parquet-{uuid.uuid4()}"
    unfinished.write_bytes(b"half an obj")
    tagged = folder / f"raw-p0-o20-29.parquet-{uuid.uuid4()}"
    tagged.write_bytes(b"object")
    os.setxattr(tagged, ETAG_XATTR, b"1" * 16)
    plain = folder / "notes-with-a-dash"
    plain.write_bytes(b"x")
    assert drop_interrupted_uploads(tmp_path) == 1
    assert sorted(p.name for p in folder.iterdir()) == sorted([kept.name, tagged.name, plain.name])


@pytest.mark.slow
def test_listing_works_after_the_server_stopped_mid_upload(private_stack) -> None:
    """s3proxy 2.6 lists a folder by every file's ETag attribute: a file an upload left when
    the server stopped made each listing of its folder fail (HTTP 500) for good."""
    stack = private_stack(["s3"])
    svc = stack.service("s3")
    prefix = f"outage/{uuid.uuid4()}"
    svc.client().put_object(Bucket="steplens", Key=f"{prefix}/a.parquet", Body=b"durable")
    assert stack.stop("s3") is True
    folder = svc.dir / "data" / "steplens" / prefix
    (folder / f"b.parquet-{uuid.uuid4()}").write_bytes(b"half an upload")  # as a kill leaves it
    stack.start("s3")
    listed = svc.client().list_objects_v2(Bucket="steplens", Prefix=prefix)
    assert [o["Key"] for o in listed["Contents"]] == [f"{prefix}/a.parquet"]
