"""`steplens worker`: run a Faust worker that turns raw telemetry into signals and alerts.

Its options are generated from ``WorkerSettings`` (worker/settings.py):
a flag given wins over its ``STEPLENS_WORKER_*`` variable, which wins over the default.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from steplens.stream_jobs.worker.settings import WorkerSettings

# one BLAS thread per process, set before numpy loads (so the settings import lazily): ARIMA
# fits must not fight the event loop for the cores
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def parser(prog: str = "steplens worker") -> argparse.ArgumentParser:
    from steplens.schema.settings import add_options
    from steplens.stream_jobs.worker.settings import WorkerSettings

    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_options(ap, WorkerSettings)
    # the idle limit's older name, in hours
    ap.add_argument("--run-idle-hours", type=float, help=argparse.SUPPRESS)
    return ap


def settings_from(args: argparse.Namespace) -> WorkerSettings:
    """The worker's settings: the flags in ``args``, then the environment, then the defaults."""
    from steplens.schema.settings import given, resolve
    from steplens.stream_jobs.worker.settings import WorkerSettings

    flags = given(WorkerSettings, args)
    if args.run_idle_hours is not None and "run_idle_s" not in flags:
        flags["run_idle_s"] = args.run_idle_hours * 3600
    return resolve(WorkerSettings, flags)


def main(argv: list[str], prog: str = "steplens worker") -> int:
    args = parser(prog).parse_args(argv)

    from faust import Worker as FaustWorker

    from steplens.stream_jobs.worker.app import Worker
    from steplens.stream_jobs.worker.metrics import WorkerMetrics
    from steplens.stream_jobs.worker.settings import ensure_worker_topics

    settings = settings_from(args)
    # the state is its user's alone: the folder, its missing parents and what Faust writes
    # inside (tables, offsets) are made 0700 and files 0600, whatever the caller's umask
    os.umask(0o077)
    os.makedirs(settings.state_dir, exist_ok=True)
    os.chmod(settings.state_dir, 0o700)
    ensure_worker_topics(settings)
    metrics = WorkerMetrics()
    worker = Worker(settings, metrics)
    if settings.web_port:
        metrics.serve(settings.web_port)
    FaustWorker(worker.app, loglevel=settings.log_level.upper()).execute_from_commandline()
    return 0
