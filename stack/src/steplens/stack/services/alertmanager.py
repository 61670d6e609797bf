"""Alertmanager (optional; built once from the Go module proxy): where `steplens sink
alertmanager` posts incidents, so routing, grouping and silences come from it."""

from __future__ import annotations

import os
import resource
import urllib.error
import urllib.request
from pathlib import Path
from typing import Final

from steplens.schema.settings import env_value
from steplens.stack.config import ALERTMANAGER_VERSION
from steplens.stack.errors import StackError
from steplens.stack.install import alertmanager_binary, ensure_alertmanager
from steplens.stack.private_files import write_private
from steplens.stack.services.base import Progress, Service

DEFAULT_MEMORY_MB: Final = 512
# Every alert goes to a receiver that notifies no one: the API, grouping and silences work, and
# a team points STEPLENS_ALERTMANAGER_CONFIG at its own file to route them somewhere.
CONFIG: Final = """\
route:
  receiver: steplens-log-only
  group_by: [run_id, alertname]
  group_wait: 10s
  group_interval: 1m
  repeat_interval: 4h
receivers:
  - name: steplens-log-only
"""


def memory_ceiling_bytes() -> int:
    """STEPLENS_ALERTMANAGER_MEMORY_MB (default 512), in bytes."""
    mb = env_value("STEPLENS_ALERTMANAGER_MEMORY_MB", _at_least_128, DEFAULT_MEMORY_MB)
    return mb << 20


def _at_least_128(raw: str) -> int:
    value = int(raw)
    if value < 128:
        raise ValueError("alertmanager needs at least 128 MB")
    return value


class Alertmanager(Service):
    name = "alertmanager"
    version = ALERTMANAGER_VERSION
    port_names = ("alertmanager",)
    start_timeout_s = 60.0

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def config_file(self) -> Path:
        own = os.environ.get("STEPLENS_ALERTMANAGER_CONFIG")
        return Path(own).expanduser() if own else self.dir / "alertmanager.yml"

    def install(self, progress: Progress) -> None:
        ensure_alertmanager(self.cfg, progress)

    def prepare(self, progress: Progress) -> None:
        self.private_dir("data")
        if "STEPLENS_ALERTMANAGER_CONFIG" not in os.environ:
            write_private(self.dir / "alertmanager.yml", CONFIG)
        elif not self.config_file.is_file():
            raise StackError(
                f"alertmanager: STEPLENS_ALERTMANAGER_CONFIG={self.config_file} is not a file"
            )

    def argv(self) -> list[str]:
        opts = os.environ.get("STEPLENS_ALERTMANAGER_OPTS", "").split()
        # kingpin refuses a repeated flag: the default level only where the options set none
        level = [] if any(o.startswith("--log.level") for o in opts) else ["--log.level=info"]
        return [
            str(alertmanager_binary(self.cfg)),
            f"--config.file={self.config_file}",
            f"--storage.path={self.dir / 'data'}",
            f"--web.listen-address={self.address}",
            f"--web.external-url={self.url}",
            "--cluster.listen-address=",  # one instance: no gossip port on 0.0.0.0:9094
            *level,
            *opts,
        ]

    def process_env(self) -> dict[str, str]:
        # the Go runtime collects harder as the heap nears GOMEMLIMIT, two thirds of the
        # ceiling (Alertmanager's own automatic limit then stays out of the way)
        env = dict(os.environ)
        env["GOMEMLIMIT"] = f"{memory_ceiling_bytes() * 2 // 3 >> 20}MiB"
        return env

    def memory_limits(self) -> dict[int, int]:
        """The data segment cannot pass the ceiling: Alertmanager stops, not the machine."""
        return {resource.RLIMIT_DATA: memory_ceiling_bytes()}

    def probe(self) -> str | None:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                return None if resp.status == 200 else f"/-/ready answered {resp.status}"
        except urllib.error.HTTPError as exc:
            return f"/-/ready answered {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            return f"no answer from {self.url} ({exc})"

    def env(self) -> dict[str, str]:
        return {"STEPLENS_ALERTMANAGER_URL": self.url}
