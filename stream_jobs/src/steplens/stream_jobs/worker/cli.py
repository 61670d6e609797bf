"""`steplens worker`: run a Faust worker that turns raw telemetry into signals and alerts."""

from __future__ import annotations

import argparse
import os
import tempfile

# one BLAS thread per process: ARIMA fits must not fight the event loop for the cores
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def default_state_dir() -> str:
    home = os.environ.get("STEPLENS_HOME") or os.path.join(tempfile.gettempdir(), "steplens")
    return os.path.join(home, "worker-state")


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def main(argv: list[str], prog: str = "steplens worker") -> int:
    from steplens.stream_jobs.worker.run_limits import LimitSettings

    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", help="Kafka bootstrap (default: STEPLENS_KAFKA_BOOTSTRAP)")
    ap.add_argument("--app-id", default="steplens-worker", help="consumer group and table prefix")
    ap.add_argument(
        "--web-port", type=int, default=9464, help="Prometheus metrics port on 127.0.0.1 (0: off)"
    )
    ap.add_argument(
        "--faust-web-port",
        type=int,
        default=0,
        help="Faust's own web server port on 127.0.0.1 (0: off)",
    )
    ap.add_argument("--state-dir", default=None, help="Faust data directory")
    ap.add_argument("--batch", type=int, default=1000, help="raw records per routing batch")
    ap.add_argument(
        "--fetch-wait-ms",
        type=int,
        default=100,
        help="longest a fetch waits at the broker for new records (Faust's consumer: 1,500)",
    )
    ap.add_argument(
        "--within",
        type=float,
        default=0.2,
        help="seconds to wait for a routing batch (fewer, larger by-run messages: less per-message "
        "work for the worker, this much more latency)",
    )
    ap.add_argument(
        "--signal-every",
        type=int,
        default=50,
        help="publish a quiet signal per rank and rule every N steps (0: breaches only)",
    )
    ap.add_argument(
        "--signal-interval",
        type=float,
        default=15.0,
        help="... and at most once in this many seconds (0: no time limit)",
    )
    ap.add_argument(
        "--checkpoint-s",
        type=float,
        default=5.0,
        help="write a run's state to the table at most this often; a run's messages since "
        "then are acknowledged only by its next checkpoint (after a crash they are scored again)",
    )
    ap.add_argument("--no-arima", action="store_true", help="disable the ARIMA baselines")
    ap.add_argument("--fit-workers", type=int, default=1, help="processes for ARIMA fits")
    ap.add_argument(
        "--hang-after",
        type=float,
        default=60.0,
        help="seconds without progress before a hang alert",
    )
    ap.add_argument("--webhook-url", default=None, help="POST every alert transition here")
    ap.add_argument(
        "--alertmanager-url",
        default=os.environ.get("STEPLENS_ALERTMANAGER_URL") or None,
        help="post incidents to this Alertmanager, e.g. http://127.0.0.1:19094 (default: "
        "STEPLENS_ALERTMANAGER_URL, which `steplens stack env` sets while the stack's "
        "Alertmanager runs; '' for none)",
    )
    ap.add_argument(
        "--no-history",
        action="store_true",
        help="start runs the worker has no state of cold, instead of from their stored history",
    )
    ap.add_argument(
        "--history-days",
        type=float,
        default=7.0,
        help="how far back a run's history (and its baseline run's) is read for a warm start",
    )
    ap.add_argument(
        "--history-max-points",
        type=int,
        default=4096,
        help="history rows per rank replayed into the detectors at most (the newest)",
    )
    ap.add_argument(
        "--history-timeout",
        type=float,
        default=30.0,
        help="seconds a run waits for its history before it starts cold",
    )
    ap.add_argument(
        "--max-runs",
        type=_positive_int,
        default=LimitSettings.max_runs,
        help="runs this worker keeps at most; a further run is not scored (counted)",
    )
    ap.add_argument(
        "--max-ranks",
        type=_positive_int,
        default=LimitSettings.max_ranks,
        help="ranks of one run scored at most; a further rank's records are dead letters",
    )
    ap.add_argument(
        "--run-idle-hours",
        type=float,
        default=LimitSettings.idle_s / 3600,
        help="a run with nothing scored this long leaves the worker's state (it warms from "
        "its history if it comes back)",
    )
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)

    from faust import Worker as FaustWorker

    from steplens.schema.settings import kafka_bootstrap
    from steplens.schema.topics import Topics
    from steplens.stream_jobs.engine.history import HistorySettings
    from steplens.stream_jobs.engine.signals.registry import DetectorConfig
    from steplens.stream_jobs.worker.app import Worker
    from steplens.stream_jobs.worker.metrics import WorkerMetrics
    from steplens.stream_jobs.worker.settings import WorkerSettings, ensure_worker_topics

    det = DetectorConfig(arima_enabled=not args.no_arima)
    det.ranks.hang_after_s = args.hang_after
    settings = WorkerSettings(
        bootstrap=kafka_bootstrap(args.bootstrap),
        topics=Topics.from_env(),
        app_id=args.app_id,
        state_dir=args.state_dir or default_state_dir(),
        faust_web_port=args.faust_web_port,
        batch=args.batch,
        within_s=args.within,
        fetch_wait_ms=args.fetch_wait_ms,
        signal_every=args.signal_every,
        signal_interval_s=args.signal_interval,
        checkpoint_s=args.checkpoint_s,
        fit_workers=args.fit_workers,
        detector=det,
        webhook_url=args.webhook_url,
        alertmanager_url=args.alertmanager_url or None,
        history=HistorySettings(
            enabled=not args.no_history,
            days=args.history_days,
            max_points=max(1, args.history_max_points),
            timeout_s=args.history_timeout,
        ),
        limits=LimitSettings(args.max_runs, args.max_ranks, max(1.0, args.run_idle_hours * 3600)),
        log_level=args.log_level,
    )
    os.makedirs(settings.state_dir, exist_ok=True)
    ensure_worker_topics(settings)
    metrics = WorkerMetrics()
    worker = Worker(settings, metrics)
    if args.web_port:
        metrics.serve(args.web_port)
    FaustWorker(worker.app, loglevel=args.log_level.upper()).execute_from_commandline()
    return 0
