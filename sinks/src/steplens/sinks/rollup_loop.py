"""The influx sink's rollups: one run 5 s after every minute, on a thread of its own.

One thread makes every run, so a sink's runs never overlap: a run that takes longer than a
minute delays the next, which starts from the coverage mark and so skips nothing. A run covers
at most ``CHUNK_MIN`` minutes; while coverage is further behind than ``CATCH_UP_LAG_S`` (a
fresh bucket, a sink back from an outage) the next run follows at once, for up to
``CATCH_UP_S`` each minute. A run that fails (a query past its timeout on a loaded store) is
made again over half the minutes, down to one, and without the lookback (``next_chunk``):
otherwise the next run would reach back over the same minutes and more, and on a store too
slow for one chunk the rollups stopped for good. Each run that succeeds doubles the chunk
again up to ``CHUNK_MIN``, and at ``CHUNK_MIN`` the lookback is back. Of several
sinks writing to the same buckets one makes the runs: it holds a lease, a point in the rollup
bucket it renews at each run; the others wait while it is younger than ``LEASE_S`` (two
sinks that find it stale at once may both run once: runs are idempotent). Each run's
duration and outcome are exported, and the coverage lag (now minus the end of the range the
last successful run covered) after each.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone

from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from prometheus_client import Counter, Gauge, Histogram

from steplens.schema.store_layout import LEASE, LEASE_FIELD, last_mark
from steplens.sinks.rollup import CHUNK_MIN, covered_until, run_once
from steplens.sinks.settings import InfluxSettings
from steplens.sinks.text_fields import TextFields

log = logging.getLogger("steplens.sinks")

RUN_SECONDS = Histogram(
    "steplens_sink_rollup_run_seconds",
    "Duration of one rollup run",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
)
RUNS = Counter(
    "steplens_sink_rollup_runs",
    "Rollup runs, by result: ok, failed, standby (another sink holds the lease)",
    ["result"],
)
LAG = Gauge(
    "steplens_sink_rollup_coverage_lag_seconds",
    "Seconds from the end of the range the last successful rollup run covered to now",
)
TEXT_FIELDS = Gauge("steplens_sink_rollup_text_fields", "Fields the rollups leave out: not numbers")
CHUNK = Gauge(
    "steplens_sink_rollup_chunk_minutes",
    f"Minutes the next rollup run covers at most ({CHUNK_MIN}; fewer after runs that failed)",
)
OFFSET_S = 5.0  # into each minute: its points have arrived
LEASE_S = 150.0  # a lease not renewed for this long is taken over
CATCH_UP_LAG_S = 120.0  # coverage further behind than this: one more run at once ...
CATCH_UP_S = 40.0  # ... while the runs of one minute took less than this
SHORT_LOOKBACK_MIN = 1  # the lookback of runs after one that failed: the last closed minute


def next_chunk(chunk_min: int, ok: bool) -> int:
    """The chunk of the run after one of ``chunk_min`` minutes that succeeded (``ok``) or
    failed: doubled up to ``CHUNK_MIN``, or halved down to one minute."""
    return min(CHUNK_MIN, chunk_min * 2) if ok else max(1, chunk_min // 2)


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
        self.chunk_min = CHUNK_MIN  # the next run's (``next_chunk``)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steplens-rollup", daemon=True)

    def start(self) -> RollupLoop:
        self._thread.start()
        return self

    def run_now(self) -> bool:
        """One run (more at once while catching up), if this sink holds the lease; True if it
        ran and the last run succeeded."""
        try:
            mine = take_lease(self.client, self.settings, self.owner)
        except Exception as exc:
            log.warning("steplens rollup lease not read: %s", exc)
            mine = True  # the store is unwell: the run will say so
        if not mine:
            RUNS.labels("standby").inc()
            return False
        began = time.monotonic()
        ok = self._one_run()
        lag = self._lag()
        # behind by more than a run covers (a fresh bucket, an outage): go on at once
        while ok and lag is not None and lag > CATCH_UP_LAG_S:
            if time.monotonic() - began > CATCH_UP_S:
                break
            ok = self._one_run()
            lag = self._lag()
        return ok

    def _one_run(self) -> bool:
        t0 = time.monotonic()
        full = self.chunk_min >= CHUNK_MIN
        lookback = self.lookback_min if full else SHORT_LOOKBACK_MIN
        try:
            run_once(
                self.client,
                self.settings,
                self.fields,
                lookback_min=lookback,
                chunk_min=self.chunk_min,
            )
            ok = True
        except Exception as exc:
            log.warning("steplens rollup run of %d minutes at most failed: %s", self.chunk_min, exc)
            ok = False
        self.chunk_min = next_chunk(self.chunk_min, ok)
        RUN_SECONDS.observe(time.monotonic() - t0)
        RUNS.labels("ok" if ok else "failed").inc()
        TEXT_FIELDS.set(self.fields.count())
        CHUNK.set(self.chunk_min)
        return ok

    def _lag(self) -> float | None:
        try:
            lag = covered_lag_s(self.client, self.settings)
        except Exception:
            return None
        if lag is not None:
            LAG.set(lag)
        return lag

    def _run(self) -> None:
        while not self._stop.wait(until_next(time.time())):
            self.run_now()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)


def covered_lag_s(client: InfluxDBClient, s: InfluxSettings) -> float | None:
    """Seconds from the end of the range the last successful run covered to now."""
    mark = covered_until(client, s)
    if mark is None:
        return None
    return max(0.0, datetime.now(timezone.utc).timestamp() - mark.timestamp())


def take_lease(client: InfluxDBClient, s: InfluxSettings, owner: str) -> bool:
    """True when ``owner`` holds the rollup lease (renewed now), False while another sink
    holds one younger than ``LEASE_S``."""
    flux = last_mark(s.rollup_bucket, LEASE, LEASE_FIELD, int(LEASE_S) + 60)
    now = datetime.now(timezone.utc)
    for table in client.query_api().query(flux, org=s.org):
        for r in table.records:
            at = r.get_time()
            fresh = isinstance(at, datetime) and (now - at).total_seconds() < LEASE_S
            if fresh and r.get_value() != owner:
                return False
    point = Point(LEASE).field(LEASE_FIELD, owner).time(now, WritePrecision.NS)
    client.write_api(write_options=SYNCHRONOUS).write(s.rollup_bucket, s.org, point)
    return True


def until_next(now_s: float) -> float:
    """Seconds until ``OFFSET_S`` past the next minute (or this one's, if still ahead)."""
    into = now_s % 60.0
    return (OFFSET_S - into) if into < OFFSET_S else (60.0 - into + OFFSET_S)
