"""The `steplens` command and the local stack of real services (Kafka, InfluxDB 2, S3).

Module-level functions act on the default stack (``$STEPLENS_HOME``, default ports);
``Stack(home=..., ports=...)`` is a private instance with its own state and ports.
"""

from __future__ import annotations

from collections.abc import Iterable

from steplens.stack.errors import StackError
from steplens.stack.install import Progress
from steplens.stack.stack import ServiceStatus, Stack

__all__ = ["ServiceStatus", "Stack", "StackError", "down", "env", "status", "up"]


def up(services: Iterable[str] | None = None, progress: Progress = print) -> dict[str, str]:
    """Start the default stack's missing services, wait for health; returns the env dict."""
    return Stack(progress=progress).up(services)


def down() -> list[str]:
    """Stop the services the default stack started; returns their names."""
    return Stack().down()


def status() -> list[ServiceStatus]:
    return Stack().status()


def env() -> dict[str, str]:
    return Stack().env()
