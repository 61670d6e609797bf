"""The influx sink's rollups: one run 5 s after every minute, on a thread of its own.

One thread makes every run, so runs never overlap: a run that takes longer than a minute
delays the next, which starts from the coverage mark and so skips nothing. Each run's
duration and outcome are exported, and the coverage lag (now minus the end of the range the
last successful run covered) after each.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone

from influxdb_client import InfluxDBClient
from prometheus_client import Counter, Gauge, Histogram

from steplens.sinks.rollup import covered_until, run_once
from steplens.sinks.settings import InfluxSettings
from steplens.sinks.text_fields import TextFields

log = logging.getLogger("steplens.sinks")

RUN_SECONDS = Histogram(
    "steplens_sink_rollup_run_seconds",
    "Duration of one rollup run",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
)
RUNS = Counter("steplens_sink_rollup_runs", "Rollup runs, by result (ok, failed)", ["result"])
LAG = Gauge(
    "steplens_sink_rollup_coverage_lag_seconds",
    "Seconds from the end of the range the last successful rollup run covered to now",
)
TEXT_FIELDS = Gauge("steplens_sink_rollup_text_fields", "Fields the rollups leave out: not numbers")
OFFSET_S = 5.0  # into each minute: its points have arrived


class RollupLoop:
    def __init__(
        self,
        client: InfluxDBClient,
        settings: InfluxSettings,
        fields: TextFields,
        lookback_min: int = 5,
    ) -> None:
        self.client = client
        self.settings = settings
        self.fields = fields
        self.lookback_min = lookback_min
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steplens-rollup", daemon=True)

    def start(self) -> RollupLoop:
        self._thread.start()
        return self

    def run_now(self) -> bool:
        """One run; True if it succeeded."""
        t0 = time.monotonic()
        try:
            run_once(self.client, self.settings, self.fields, lookback_min=self.lookback_min)
            ok = True
        except Exception as exc:
            log.warning("steplens rollup run failed: %s", exc)
            ok = False
        RUN_SECONDS.observe(time.monotonic() - t0)
        RUNS.labels("ok" if ok else "failed").inc()
        TEXT_FIELDS.set(self.fields.count())
        try:
            mark = covered_until(self.client, self.settings)
        except Exception:
            mark = None
        if mark is not None:
            LAG.set(max(0.0, datetime.now(timezone.utc).timestamp() - mark.timestamp()))
        return ok

    def _run(self) -> None:
        while not self._stop.wait(_until_next(time.time())):
            self.run_now()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)


def _until_next(now_s: float) -> float:
    """Seconds until ``OFFSET_S`` past the next minute (or this one's, if still ahead)."""
    into = now_s % 60.0
    return (OFFSET_S - into) if into < OFFSET_S else (60.0 - into + OFFSET_S)
