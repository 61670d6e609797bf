"""Generated secrets (InfluxDB token and password, S3 keys) in one file readable only by us."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from steplens.stack.private_files import private_dir


@dataclass(frozen=True)
class Secrets:
    influx_token: str
    influx_password: str
    s3_access_key: str
    s3_secret_key: str

    def __repr__(self) -> str:  # never show values, even in a traceback
        return "Secrets(<hidden>)"


def _generate() -> Secrets:
    return Secrets(
        influx_token=secrets.token_urlsafe(48),
        influx_password=secrets.token_urlsafe(24),
        s3_access_key="steplens" + secrets.token_hex(6),
        s3_secret_key=secrets.token_urlsafe(30),
    )


def load_or_create(path: Path) -> Secrets:
    """Read the secrets file, or create it atomically with mode 600."""
    if path.exists():
        data = json.loads(path.read_text())
        return Secrets(**{k: data[k] for k in Secrets.__dataclass_fields__})
    private_dir(path.parent)
    fresh = _generate()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(fresh), fh)
    os.replace(tmp, path)
    return fresh
