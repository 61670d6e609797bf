"""The MLflow tracking server (UI + REST API): the live view of a run, which `steplens mlflow`
fills with its curves, parameters, incidents and advice as the records arrive.

Installed once per version into a virtual environment of its own in the cache (its
dependencies conflict with the project's); one uvicorn worker on 127.0.0.1; runs and metrics in
a SQLite database and artifacts in a folder, both under the stack's state folder; no job
runner (its consumer processes would cost about 600 MB for features the live view does not
use); no telemetry.
"""

from __future__ import annotations

import os
import resource
import urllib.error
import urllib.request
from typing import Final

from steplens.schema.settings import env_value
from steplens.stack.config import MLFLOW_VERSION
from steplens.stack.install import ensure_mlflow, mlflow_venv
from steplens.stack.services.base import Progress, Service

DEFAULT_MEMORY_MB: Final = 1024  # each of its two processes holds about 300 MB of data


def memory_ceiling_bytes() -> int:
    """STEPLENS_MLFLOW_MEMORY_MB (default 1024), in bytes: the data segment of each process."""
    return env_value("STEPLENS_MLFLOW_MEMORY_MB", _at_least_512, DEFAULT_MEMORY_MB) << 20


def _at_least_512(raw: str) -> int:
    value = int(raw)
    if value < 512:
        raise ValueError("the MLflow server needs at least 512 MB")
    return value


class Mlflow(Service):
    name = "mlflow"
    version = f"mlflow {MLFLOW_VERSION}"
    port_names = ("mlflow",)
    start_timeout_s = 240.0  # 50 s on 2 busy cores, mostly imports

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.port()}"

    @property
    def address(self) -> str:
        return self.url  # what a person opens

    def install(self, progress: Progress) -> None:
        ensure_mlflow(self.cfg, progress)

    def prepare(self, progress: Progress) -> None:
        self.private_dir("artifacts")

    def argv(self) -> list[str]:
        return [
            str(mlflow_venv(self.cfg) / "bin" / "python"),
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.dir / 'mlflow.db'}",
            "--artifacts-destination",
            str(self.dir / "artifacts"),
            "--host",
            self.cfg.host,
            "--port",
            str(self.port()),
            "--workers",
            "1",
            *os.environ.get("STEPLENS_MLFLOW_OPTS", "").split(),
        ]

    def process_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }

    def memory_limits(self) -> dict[int, int]:
        """The server and its uvicorn worker (which inherits the limit) each stop at the
        ceiling, not the machine."""
        return {resource.RLIMIT_DATA: memory_ceiling_bytes()}

    def probe(self) -> str | None:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                return None if resp.status == 200 else f"/health answered {resp.status}"
        except urllib.error.HTTPError as exc:
            return f"/health answered {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            return f"no answer from {self.url} ({exc})"

    def env(self) -> dict[str, str]:
        return {"MLFLOW_TRACKING_URI": self.url}
