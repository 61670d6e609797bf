"""What the stack needs to know to install, start, probe and configure one service."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from steplens.stack.config import StackConfig
from steplens.stack.private_files import private_dir
from steplens.stack.secret_store import Secrets

Progress = Callable[[str], None]


class Service(ABC):
    name: str
    version: str
    port_names: tuple[str, ...]
    start_timeout_s: float = 120.0

    def __init__(self, cfg: StackConfig, secrets: Secrets) -> None:
        self.cfg = cfg
        self.secrets = secrets

    @property
    def dir(self) -> Path:
        return self.cfg.service_dir(self.name)

    def private_dir(self, *parts: str) -> Path:
        """A folder of this service's (0700, as is the service's own), created if missing."""
        private_dir(self.dir)
        return private_dir(self.dir.joinpath(*parts))

    @property
    def marker(self) -> str:
        """A string found in the command line of this service's process (and no other's)."""
        return f"{self.dir}/"

    def port(self, which: str | None = None) -> int:
        return int(self.cfg.ports[which or self.port_names[0]])

    @property
    def address(self) -> str:
        return f"{self.cfg.host}:{self.port()}"

    @abstractmethod
    def install(self, progress: Progress) -> None:
        """Make the binaries available in the cache (download or build once per version)."""

    @abstractmethod
    def prepare(self, progress: Progress) -> None:
        """Write configuration and initialise storage under ``self.dir`` (idempotent)."""

    @abstractmethod
    def argv(self) -> list[str]:
        """The command that runs the service in the foreground."""

    def process_env(self) -> dict[str, str] | None:
        return None

    def memory_limits(self) -> dict[int, int]:
        """``resource.RLIMIT_*`` -> bytes, set on the process at start (none by default)."""
        return {}

    @abstractmethod
    def probe(self) -> str | None:
        """None when healthy, else a short reason (never containing a secret)."""

    def configure(self, progress: Progress) -> None:  # noqa: B027 - optional hook
        """Runs once the service is healthy: topics, org/buckets, the S3 bucket."""

    @abstractmethod
    def env(self) -> dict[str, str]:
        """The client settings (``STEPLENS_*``) for this service."""
