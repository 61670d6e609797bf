"""Secrets out of the sinks' logs, whatever the log level.

botocore logs every request at DEBUG with its Authorization header, whose ``Credential=``
names the S3 access key id; influxdb-client in debug mode logs ``Authorization: Token ...``.
A filter on the root logger's handlers replaces the known secret values, and what follows
``Credential=`` or ``Token``, by ``<redacted>`` in every record that reaches them, other
libraries' records and tracebacks included.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from typing import Final

REDACTED: Final = "<redacted>"
SECRET_VARIABLES: Final = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "STEPLENS_INFLUX_TOKEN",
)
_PATTERNS: Final = (
    re.compile(r"(Credential=)[^/\s,'\"]+"),
    re.compile(r"(Token\s+)[^\s,'\"]+"),
)


class Redactor(logging.Filter):
    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        super().__init__()
        self._secrets: list[str] = []
        self.add(secrets)

    def add(self, secrets: Iterable[str | None]) -> None:
        """More values to hide (shorter than 4 characters: not worth hiding, too common)."""
        known = set(self._secrets) | {s for s in secrets if s and len(s) >= 4}
        self._secrets = sorted(known, key=len, reverse=True)  # a longer value hides first

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        for pattern in _PATTERNS:
            text = pattern.sub(rf"\g<1>{REDACTED}", text)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = self.scrub(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.scrub(record.exc_text)
        return True


def secrets_from_env() -> list[str | None]:
    return [os.environ.get(name) for name in SECRET_VARIABLES]


def install(secrets: Iterable[str | None] = ()) -> Redactor:
    """Put a redactor on every handler of the root logger (call after ``basicConfig``)."""
    redactor = Redactor([*secrets_from_env(), *secrets])
    for handler in logging.getLogger().handlers:
        handler.addFilter(redactor)
    return redactor
