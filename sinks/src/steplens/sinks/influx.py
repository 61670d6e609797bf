"""InfluxDB hot sink: records to points, synchronous writes (so durability is known).

A write either succeeds (the batch is durable), fails (connection errors, 429, 5xx, anything
but a refusal: the batch is reported retryable, and the loop exports it again), or is refused
for good (400/413/422): the batch is then split in halves until the refused records are
isolated, so one bad record cannot hold back the rest. Rewriting a record rewrites the same
point (time and tags come from the record), so every retry is safe. Points are built in chunks
and each chunk is written on one writer thread while the next is built; an export returns
after all its writes. A run's per-rank telemetry is written for the ranks its budget admits
(``rank_budget``: a first few and the ranks that stand out); S3 keeps the rest.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Final

from influxdb_client import InfluxDBClient, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.rest import ApiException

from steplens import schema
from steplens.schema import Record
from steplens.schema.flux_literals import flux_string
from steplens.schema.time_bounds import TimeBounds
from steplens.sinks import metrics
from steplens.sinks.contract import ExportResult, Rejection
from steplens.sinks.name_limits import NameBudget, NameLimits, refusal_reason
from steplens.sinks.points import UnwritableRecord, record_builders
from steplens.sinks.rank_budget import RankBudget, RankLimits
from steplens.sinks.settings import InfluxSettings
from steplens.sinks.text_fields import TextFields

log = logging.getLogger("steplens.sinks")

PERMANENT_STATUS: Final = frozenset({400, 413, 422})
RETENTION_MARGIN_S: Final = 60  # records this close to the retention edge are still written


def make_client(s: InfluxSettings, timeout_ms: int | None = None) -> InfluxDBClient:
    """An https URL's certificate is always verified: against ``ca_cert`` when given.
    ``timeout_ms``: of each request (default ``s.timeout_ms``)."""
    return InfluxDBClient(
        url=s.url,
        token=s.token,
        org=s.org,
        timeout=s.timeout_ms if timeout_ms is None else timeout_ms,
        ssl_ca_cert=s.ca_cert,
    )


def refused(exc: BaseException) -> bool:
    """A refusal of the data itself; any other failure makes the batch retryable."""
    return isinstance(exc, ApiException) and exc.status in PERMANENT_STATUS


def _reason(exc: ApiException) -> str:
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else exc.body
    return f"HTTP {exc.status}: {body or exc.reason}"[:1000]


def _reason_of(rec: Record, step: Record, reason: str) -> str:
    """A step of a batch is named in the batch's reason."""
    return reason if step is rec else f"step {step.step}: {reason}"


def split_by_time(
    steps: list[Record], oldest_ns: float, newest_ns: float
) -> tuple[list[Record], int, list[Record]]:
    """(steps to write, how many are older than ``oldest_ns``, those later than ``newest_ns``).

    A step past the hot window is left to S3; one from further in the future than the clock
    skew allows is refused, since it would sit in the hot bucket, ahead of every query's
    "now", until its time comes."""
    kept = [r for r in steps if oldest_ns <= r.time_ns <= newest_ns]
    future = [r for r in steps if r.time_ns > newest_ns]
    return kept, len(steps) - len(kept) - len(future), future


class _Refused(Exception):
    pass


class InfluxSink:
    name = "influx"

    def __init__(
        self,
        client: InfluxDBClient,
        settings: InfluxSettings,
        *,
        write_chunk: int = 1000,
        limits: NameLimits | None = None,
        bounds: TimeBounds | None = None,
        text_fields: TextFields | None = None,
        ranks: RankLimits | None = None,
    ) -> None:
        self.settings = settings
        self.text_fields = text_fields  # told of the fields written that are not numbers
        self.bounds = bounds or TimeBounds.from_env()
        self.limits = limits or NameLimits(
            per_run=settings.max_names_per_run, per_measurement=settings.max_names_per_measurement
        )
        self.names = NameBudget(self.limits, self._stored_names)
        n = settings.max_ranks_per_run
        self.ranks = RankBudget(ranks or RankLimits(per_run=n, standouts=max(1, n // 4)))
        self._query_api = client.query_api()
        self._write_api = client.write_api(write_options=SYNCHRONOUS)
        self.write_chunk = write_chunk
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steplens-influx")

    def export(self, batch: list[Record]) -> ExportResult:
        try:
            return self._export(batch)
        except Exception as exc:  # the contract: export never raises
            log.exception("steplens influx sink: unexpected error")
            return ExportResult.retry(f"{type(exc).__name__}: {exc}")

    def _export(self, batch: list[Record]) -> ExportResult:
        """Build points chunk by chunk; each chunk is written on the writer thread while the
        next one is built. Returns only once every chunk's write has finished.

        A ``step_batch`` is written as its step records: one entry per step (so a refused step
        is isolated like a raw one), and at most one rejection for the batch (its first
        reason); it counts as skipped only when every step is past the hot window."""
        result = ExportResult()
        now_ns = time.time_ns()
        hot_s = self.settings.hot_retention_s
        oldest_ns = now_ns - (hot_s - RETENTION_MARGIN_S) * 1e9 if hot_s > 0 else -math.inf
        newest_ns = self.bounds.newest_ns(now_ns)
        out_of_time: Counter[str] = Counter()
        chunk: list[tuple[int, list[str]]] = []
        pending: list[Future[list[Rejection]]] = []
        rejected: dict[int, str] = {}
        left_out: dict[int, list[tuple[str, str, str]]] = {}
        over_budget = 0
        for i, rec in enumerate(batch):
            if not self.ranks.admits(rec):
                over_budget += 1  # a rank past its run's budget: S3 keeps it
                continue
            steps, past, future = split_by_time(schema.unbatch(rec), oldest_ns, newest_ns)
            out_of_time["past_retention"] += past
            out_of_time["future"] += len(future)
            if future:
                why = self.bounds.future_reason(future[0].time_ns, now_ns)
                rejected.setdefault(i, _reason_of(rec, future[0], why))
            if not steps:
                if past and not future:
                    result.skipped += 1  # past the hot window: S3 keeps it
                continue
            out: list[tuple[str, str, str]] = []
            for step in steps:
                try:
                    chunk.append((i, self._lines(step, out)))
                except UnwritableRecord as exc:
                    rejected.setdefault(i, _reason_of(rec, step, str(exc)))
            if out:
                left_out[i] = out
            if len(chunk) >= self.write_chunk:
                self._submit(pending, chunk)
                chunk = []
        if chunk:
            self._submit(pending, chunk)
        wait(pending)
        for fut in pending:
            failure = fut.exception()
            if failure is not None:
                return ExportResult.retry(f"{type(failure).__name__}: {failure}")
            for refused in fut.result():
                rejected.setdefault(refused.index, refused.reason)
        result.rejected = [Rejection(i, reason) for i, reason in sorted(rejected.items())]
        result.trimmed = [
            Rejection(i, refusal_reason(out, self.limits))
            for i, out in sorted(left_out.items())
            if i not in rejected
        ]
        result.skipped += over_budget
        if over_budget:
            metrics.RANKS_LEFT_OUT.labels(self.name).inc(over_budget)
        for why, n in out_of_time.items():
            if n:
                metrics.OUT_OF_TIME.labels(self.name, why).inc(n)
        counts = Counter((m, why) for out in left_out.values() for m, _, why in out)
        for (measurement, why), n in counts.items():
            metrics.FIELDS_DROPPED.labels(self.name, measurement, why).inc(n)
        result.accepted = len(batch) - len(result.rejected) - result.skipped
        return result

    def _lines(self, step: Record, left_out: list[tuple[str, str, str]]) -> list[str]:
        """The step's lines, without the names over a limit (appended to ``left_out``)."""
        lines = []
        for b in record_builders(step):
            keep, dropped = self.names.admit(b, step.run_id)
            if dropped:
                left_out += [(b.measurement, name, why) for name, why in dropped]
            if keep:
                lines.append(b.line())
                if self.text_fields is not None:
                    self.text_fields.observe((b,))
        return lines

    def _stored_names(self, measurement: str, tag: str | None) -> set[str]:
        """Field keys (or values of ``tag``) of ``measurement`` in the hot bucket now."""
        s = self.settings
        start = f"-{s.hot_retention_s}s" if s.hot_retention_s > 0 else "0"
        args = f"bucket: {flux_string(s.bucket)}, measurement: {flux_string(measurement)}"
        call = (
            f"schema.measurementTagValues({args}, tag: {flux_string(tag)}, start: {start})"
            if tag is not None
            else f"schema.measurementFieldKeys({args}, start: {start})"
        )
        flux = f'import "influxdata/influxdb/schema"\n{call}'
        tables = self._query_api.query(flux, org=s.org)
        return {str(r.get_value()) for t in tables for r in t.records}

    def _submit(
        self, pending: list[Future[list[Rejection]]], chunk: list[tuple[int, list[str]]]
    ) -> None:
        """Queue a chunk's write; at most one more waits behind the one being written, so a
        batch of many step_batch records never holds all its lines at once."""
        if len(pending) >= 2:
            wait(pending[-2:-1])  # one writer thread: earlier writes are done, too
        pending.append(self._writer.submit(self._write_isolating, chunk))

    def _write(self, lines: list[tuple[int, list[str]]]) -> None:
        body = "\n".join(line for _, ls in lines for line in ls)
        if not body:
            return
        try:
            self._write_api.write(
                bucket=self.settings.bucket,
                org=self.settings.org,
                record=body,
                write_precision=WritePrecision.NS,  # type: ignore[arg-type]
            )
        except ApiException as exc:
            if refused(exc):
                raise _Refused(_reason(exc)) from exc
            raise

    def _write_isolating(self, lines: list[tuple[int, list[str]]]) -> list[Rejection]:
        """Write all; on a refusal, halve until the refused records are found."""
        if not lines:
            return []
        try:
            self._write(lines)
            return []
        except _Refused as exc:
            if "outside retention policy" in str(exc) and len(lines) == 1:
                return []  # expired while waiting: nothing to keep in the hot bucket
            if len(lines) == 1:
                return [Rejection(lines[0][0], str(exc))]
        mid = len(lines) // 2
        return self._write_isolating(lines[:mid]) + self._write_isolating(lines[mid:])

    def shutdown(self) -> None:
        self._writer.shutdown(wait=True)
        self._write_api.close()
