"""The state folder is its user's alone: folders 0700, files 0600.

Logs, telemetry and credentials live under ``$STEPLENS_HOME``. Folders and files the stack
writes get these modes explicitly (an existing one is set again), and the processes it starts
run under umask 077, so what Kafka, InfluxDB, the S3 server or a demo run create is private too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Final

UMASK: Final = 0o077


def private_dir(path: Path) -> Path:
    """``path`` as a folder of mode 0700; its missing parents are created 0700 too (``mkdir
    -p`` would make them with the umask's mode)."""
    for missing in [p for p in (path, *path.parents) if not p.exists()][::-1]:
        missing.mkdir(exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


def open_private(path: Path, mode: str = "w") -> IO:
    """``path`` opened with mode 0600: "w"/"wb" from scratch, "a"/"ab" to append."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, mode)


def write_private(path: Path, text: str) -> None:
    with open_private(path) as fh:
        fh.write(text)
