"""s3proxy with its filesystem-nio2 backend: an S3 API that keeps objects as files."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from steplens.stack.config import S3_BUCKET, S3PROXY_VERSION
from steplens.stack.install import S3PROXY_ARTIFACTS, ensure_jars, require_tool, s3proxy_libs
from steplens.stack.private_files import write_private
from steplens.stack.services.base import Progress, Service

REGION = "us-east-1"
# an upload in progress: the backend writes ``<key>-<uuid>``, sets the object's ETag as this
# extended attribute, then renames the file to ``<key>``
UPLOAD_FILE = re.compile(r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
ETAG_XATTR = "user.content-md5"
LOGBACK = """\
<configuration>
  <appender name="out" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>[%d{ISO8601}] %level %msg \\(%logger{20}\\)%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="out"/></root>
</configuration>
"""


class S3(Service):
    name = "s3"
    version = f"s3proxy {S3PROXY_VERSION}"
    port_names = ("s3",)

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}"

    def install(self, progress: Progress) -> None:
        require_tool("java", "install Java 17 (apt-get install openjdk-17-jre-headless)")
        ensure_jars(self.cfg, "s3", s3proxy_libs(self.cfg), S3PROXY_ARTIFACTS, progress)

    def prepare(self, progress: Progress) -> None:
        data = self.private_dir("data")
        dropped = drop_interrupted_uploads(data)
        if dropped:
            progress(f"[s3] removed {dropped} upload(s) a stopped server left unfinished")
        props = {
            "s3proxy.endpoint": self.endpoint,
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.secrets.s3_access_key,
            "s3proxy.credential": self.secrets.s3_secret_key,
            "jclouds.provider": "filesystem-nio2",
            "jclouds.identity": "local",  # unused by the filesystem backend, but required
            "jclouds.credential": "local",
            "jclouds.filesystem.basedir": str(self.dir / "data"),
            "jclouds.regions": REGION,
            # Recent SDKs send checksum headers (x-amz-checksum-*) that s3proxy would refuse.
            "s3proxy.ignore-unknown-headers": "true",
        }
        write_private(self.dir / "logback.xml", LOGBACK)
        write_private(  # holds the secret key
            self.dir / "s3proxy.properties", "".join(f"{k}={v}\n" for k, v in props.items())
        )

    def argv(self) -> list[str]:
        return [
            "java",
            "-Xms64m",
            # the JVM's memory ceilings: heap, direct buffers, class metadata; past one it exits
            "-Xmx256m",
            "-XX:MaxDirectMemorySize=128m",
            "-XX:MaxMetaspaceSize=128m",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            # C1 only: about half the start time on 2 busy cores, ample speed for a local stack.
            "-XX:TieredStopAtLevel=1",
            f"-Dlogback.configurationFile={self.dir}/logback.xml",
            *os.environ.get("STEPLENS_S3_JAVA_OPTS", "").split(),  # later flags win
            "-cp",
            f"{s3proxy_libs(self.cfg)}/*",
            "org.gaul.s3proxy.Main",
            "--properties",
            str(self.dir / "s3proxy.properties"),
        ]

    def client(self, timeout_s: float = 5.0) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.secrets.s3_access_key,
            aws_secret_access_key=self.secrets.s3_secret_key,
            region_name=REGION,
            config=Config(
                s3={"addressing_style": "path"},
                connect_timeout=timeout_s,
                read_timeout=timeout_s,
                retries={"max_attempts": 1},
            ),
        )

    def probe(self) -> str | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client(timeout_s=2).list_buckets()
        except ClientError as exc:
            return f"ListBuckets failed: {exc.response.get('Error', {}).get('Code', '?')}"
        except BotoCoreError as exc:
            return f"no answer from {self.endpoint} ({type(exc).__name__})"
        return None

    def configure(self, progress: Progress) -> None:
        client = self.client()
        names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
        if S3_BUCKET not in names:
            client.create_bucket(Bucket=S3_BUCKET)
            progress(f"[s3] created bucket {S3_BUCKET}")

    def env(self) -> dict[str, str]:
        return {
            "STEPLENS_S3_ENDPOINT": self.endpoint,
            "STEPLENS_S3_BUCKET": S3_BUCKET,
            "AWS_ACCESS_KEY_ID": self.secrets.s3_access_key,
            "AWS_SECRET_ACCESS_KEY": self.secrets.s3_secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }


def drop_interrupted_uploads(data: Path) -> int:
    """Remove the upload files a server stopped mid-upload left behind (``UPLOAD_FILE`` names
    without the ETag attribute); returns how many. s3proxy 2.6 lists a folder by reading that
    attribute of every file in it, so one such file made every listing under its prefix fail
    with HTTP 500 until it was removed (gaul/s3proxy#963; later releases list it as an
    object instead). Nothing else removes them: the server itself never looks again."""
    dropped = 0
    for path in data.rglob("*-*"):
        if not UPLOAD_FILE.search(path.name) or not path.is_file():
            continue
        try:
            if ETAG_XATTR in os.listxattr(path):
                continue
            path.unlink()
        except OSError:
            continue
        dropped += 1
    return dropped
