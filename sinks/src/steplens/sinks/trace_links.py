"""Links to the ranks' ``profile`` traces on the report: an ``s3://`` address becomes a
presigned HTTPS URL (the sinks' ``STEPLENS_S3_*`` endpoint and credentials), valid
``EXPIRES_S``; without credentials, the address itself. A path on a rank's host is no link.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

EXPIRES_S = 7 * 24 * 3600  # the longest a SigV4 presigned URL lives

Link = Callable[[str], "str | None"]


def no_link(uri: str) -> str | None:
    """The address as it is for ``s3://``; None for a local path."""
    return uri if uri.startswith("s3://") else None


def presigner(settings: Any = None) -> Link:
    """A ``Link`` that presigns ``s3://bucket/key`` with the sinks' S3 settings (made on the
    first call); the address itself when presigning fails."""
    client: list[Any] = []

    def link(uri: str) -> str | None:
        if not uri.startswith("s3://"):
            return None
        bucket, _, key = uri[len("s3://") :].partition("/")
        try:
            if not client:
                from steplens.sinks.s3 import make_s3_client
                from steplens.sinks.settings import S3Settings

                client.append(make_s3_client(settings or S3Settings.from_env(), "s3v4"))
            return str(
                client[0].generate_presigned_url(
                    "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=EXPIRES_S
                )
            )
        except Exception:
            return uri

    return link
