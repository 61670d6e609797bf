"""The worker's own health as Prometheus metrics, served on 127.0.0.1 (STEPLENS_METRICS_HOST
chooses another address, e.g. 0.0.0.0 inside a container that Prometheus scrapes)."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.records = Counter("steplens_worker_records", "records consumed", ["kind"], registry=r)
        self.dead_letters = Counter(
            "steplens_worker_dead_letters",
            "records sent to the dead-letter topic",
            ["reason"],
            registry=r,
        )
        self.signals = Counter("steplens_worker_signals", "signals published", registry=r)
        self.alerts = Counter(
            "steplens_worker_alerts",
            "alert transitions published",
            ["state", "severity"],
            registry=r,
        )
        self.advice = Counter(
            "steplens_worker_advice",
            "advice to runs' ranks: sent; held back by the storm limit (held), the run's remedy "
            "budget (held_budget), no checkpoint in reach (held_no_checkpoint) or a step past "
            "the run's end (held_run_ends); invalid",
            ["action", "outcome"],
            registry=r,
        )
        self.lag = Gauge(
            "steplens_worker_consumer_lag", "records behind the raw topic's end", registry=r
        )
        self.rate = Gauge(
            "steplens_worker_records_per_second",
            "records consumed per second (last interval)",
            registry=r,
        )
        self.latency = Histogram(
            "steplens_worker_signal_latency_seconds",
            "record time (producer clock) to its signals and alerts being published",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.assigned = Gauge(
            "steplens_worker_raw_partitions",
            "raw-topic partitions assigned to this worker",
            registry=r,
        )
        self.fits = Counter("steplens_worker_arima_fits", "ARIMA fits", ["outcome"], registry=r)
        self.limited = Counter(
            "steplens_worker_run_limits",
            "what the run limits left out: by-run messages of runs past --max-runs "
            "(refused_messages), records of ranks past --max-ranks (refused_records), idle "
            "runs retired (retired_runs)",
            ["outcome"],
            registry=r,
        )
        self.fit_jobs = Counter(
            "steplens_worker_arima_fit_jobs", "pool jobs the ARIMA fits went in", registry=r
        )
        self.fit_pool_restarts = Counter(
            "steplens_worker_fit_pool_restarts",
            "times the fit pool was started again after one of its processes died",
            registry=r,
        )
        self.recovery_restarts = Counter(
            "steplens_worker_recovery_restarts",
            "table recoveries started over after reading nothing for 3 s (recovery_watch)",
            registry=r,
        )
        self.baselines = Counter(
            "steplens_worker_baseline_loads",
            "7-day baseline jobs: history loaded (loaded) or not (load_failed: in-run "
            "baselines), jobs failed or refused, bands fitted (bands)",
            ["outcome"],
            registry=r,
        )
        self.out_of_time = Counter(
            "steplens_worker_out_of_time",
            "steps (a record of another kind: the record) stamped later than now + "
            "STEPLENS_MAX_FUTURE_SKEW_S: not scored, their record dead-lettered",
            ["reason"],
            registry=r,
        )
        self.restores = Counter(
            "steplens_worker_run_restores",
            "runs restored from the runs table, a checkpoint of a worker before this one "
            "(restored), or whose stored state could not be read and that start afresh "
            "(unreadable)",
            ["outcome"],
            registry=r,
        )
        self.fetch_wait = Gauge(
            "steplens_worker_fetch_wait_seconds",
            "longest the consumer's fetch waits at the broker for new records (as in use)",
            registry=r,
        )

    def count_limited(self, outcome: str, n: int) -> None:
        self.limited.labels(outcome).inc(n)

    def serve(self, port: int, host: str | None = None) -> None:
        host = host or os.environ.get("STEPLENS_METRICS_HOST") or "127.0.0.1"
        start_http_server(port, addr=host, registry=self.registry)


def reason_class(reason: str) -> str:
    """A low-cardinality label for a reason: "data.loss: expected ..." -> "data.loss"."""
    head = reason.split(":", 1)[0].strip()
    return head if len(head) <= 40 and " " not in head else "invalid"
