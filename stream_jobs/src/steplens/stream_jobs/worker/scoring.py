"""By-run messages scored into their runs' detectors; the outputs go to the ``Publisher``.

A message is a list of ``[raw partition, offset, record text]``: records its run's state
already applied (by offset) are skipped, consecutive ``step`` records of one rank are scored as
one batch, and a record the detectors refuse or fail on becomes a dead letter, as does one
stamped later than ``TimeBounds`` allows (the steps of a ``step_batch`` in time are scored, as
the sinks store them). With history
(``reseed``), a rank whose steps go back is re-seeded from it first (``RunDetector.restart``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from steplens.schema import DecodeError, Record, decode
from steplens.schema.log_limit import LimitedLog
from steplens.schema.time_bounds import TimeBounds
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.worker.metrics import WorkerMetrics
from steplens.stream_jobs.worker.publisher import Publisher
from steplens.stream_jobs.worker.run_limits import RunLimits, rank_admitted

log = logging.getLogger("steplens.stream_jobs")

Item = tuple[int, int, str, Record]  # raw partition, offset, text, record
# (detector, rank, step it resumes at, time history ends at) -> re-seeded now (else a load began)
Reseed = Callable[[RunDetector, int, int, int], bool]


class Scorer:
    def __init__(
        self,
        limits: RunLimits,
        reseed: Reseed | None,
        out: Publisher,
        metrics: WorkerMetrics,
        bounds: TimeBounds | None = None,
    ) -> None:
        self.limits = limits
        self.bounds = bounds or TimeBounds()
        self.reseed = reseed  # None: no history, the detector restarts a rank itself
        self.out = out
        self.metrics = metrics
        self.consumed = 0  # records scored
        self._log = LimitedLog(log)  # a failure that repeats per record: once a minute

    async def score(self, det: RunDetector, run: str, event: Any) -> bool:
        """One by-run message's records into ``det``; False when a rank's steps went back
        and its re-seed from history began (the message is scored again once it is done,
        the records before the restart skipped by their offsets)."""
        seen = det.offsets
        max_ranks = self.limits.s.max_ranks
        reseed = self.reseed
        steps: list[Item] = []  # consecutive steps of one rank
        now_ns = time.time_ns()
        for partition, offset, text in orjson.loads(event.value):
            if offset <= seen.get(partition, -1):
                continue  # replayed after a restart: already in this state
            rec = decode(text)
            if reseed is not None and not isinstance(rec, DecodeError):
                last = steps[-1][3] if steps else None
                after = last.step if last is not None and last.rank == rec.rank else None
                back = det.resume_step(rec, after)
                if back is not None:
                    await self._steps(det, run, steps)
                    steps = []
                    if not reseed(det, rec.rank, back, rec.time_ns):
                        return False
            seen[partition] = offset
            if isinstance(rec, DecodeError):
                await self.out.dead(str(rec), text.encode(), run, None, partition, offset)
                continue
            kept, late = self._in_time(rec, now_ns)
            if late is not None:
                await self.out.dead(late, text.encode(), run, None, partition, offset)
            if kept is None:
                continue
            rec = kept
            pending = steps[-1][3].rank if steps else None
            if not rank_admitted(det.series, rec.rank, max_ranks, pending):
                await self._steps(det, run, steps)
                steps = []
                self.limits.count("refused_records", 1)
                reason = f"rank {rec.rank}: run {run} has its {max_ranks} ranks (--max-ranks)"
                await self.out.dead(reason, text.encode(), run, None, partition, offset)
                continue
            if rec.kind == "step" and (not steps or steps[-1][3].rank == rec.rank):
                steps.append((partition, offset, text, rec))
                continue
            await self._steps(det, run, steps)
            steps = []
            if rec.kind == "step":
                steps.append((partition, offset, text, rec))
            else:
                await self._one(det, run, partition, offset, text, rec)
        await self._steps(det, run, steps)
        return True

    def _in_time(self, rec: Record, now_ns: int) -> tuple[Record | None, str | None]:
        """``rec`` as far as it is in time (None: not at all), and the reason its record is a
        dead letter (None: all of it is in time); the steps left out are counted."""
        bounds = self.bounds
        newest = bounds.newest_ns(now_ns)
        if rec.kind != "step_batch":
            if rec.time_ns <= newest:
                return rec, None
            self.metrics.out_of_time.labels("future").inc()
            return None, bounds.future_reason(rec.time_ns, now_ns)
        entries = rec.data["records"]
        kept = [e for e in entries if e["time_ns"] <= newest]
        if len(kept) == len(entries):
            return rec, None
        self.metrics.out_of_time.labels("future").inc(len(entries) - len(kept))
        first = next(e for e in entries if e["time_ns"] > newest)
        reason = f"step {first['step']}: {bounds.future_reason(first['time_ns'], now_ns)}"
        if not kept:
            return None, reason
        data = {**rec.data, "records": kept}
        return dataclasses.replace(rec, data=data, step=kept[-1]["step"]), reason

    async def _steps(self, det: RunDetector, run: str, steps: list[Item]) -> None:
        """Consecutive ``step`` records of one rank, scored as one batch (a record is a batch
        of one row: the same signals and alerts, without a detector call per record and
        metric); one at a time if the batch fails, so only the bad record is dead-lettered."""
        if len(steps) == 1:
            await self._one(det, run, *steps[0])
        if len(steps) <= 1:
            return
        recs = [rec for _, _, _, rec in steps]
        try:
            batch, alerts = det.process_steps(recs)
        except Exception:  # find the record that fails, as one by one
            log.debug("a batch of step records failed; scoring them one by one", exc_info=True)
            for item in steps:
                await self._one(det, run, *item)
            return
        self.consumed += len(recs)
        self.metrics.records.labels("step").inc(len(recs))
        await self._publish(det, run, batch, alerts, [rec.time_ns for rec in recs])

    async def _one(  # noqa: PLR0917
        self, det: RunDetector, run: str, partition: int, offset: int, text: str, rec: Record
    ) -> None:
        """One record; one that the detectors refuse or fail on becomes a dead letter."""
        try:
            n = len(rec.data["records"]) if rec.kind == "step_batch" else 1
            batch, alerts = det.process(rec)
        except ValueError as exc:  # a record the detectors refuse, with the reason
            await self.out.dead(str(exc), text.encode(), run, None, partition, offset)
            return
        except Exception as exc:  # one record must not stop every run's detection
            self._log.exception(
                type(exc).__name__, "record not processed (run %s, offset %s)", run, offset
            )
            reason = f"processing: {type(exc).__name__}: {exc}"
            await self.out.dead(reason, text.encode(), run, None, partition, offset)
            return
        self.consumed += n
        self.metrics.records.labels("step" if rec.kind == "step_batch" else rec.kind).inc(n)
        times = (
            [e["time_ns"] for e in rec.data["records"]]
            if rec.kind == "step_batch"
            else [rec.time_ns]
        )
        await self._publish(det, run, batch, alerts, times)

    async def _publish(
        self, det: RunDetector, run: str, batch: list[Any], alerts: list[Any], times: list[int]
    ) -> None:
        """The signals and alerts of a record, then the advice its incident reports call for
        and, while an incident waits for its judgement, the advice the record's steps decide
        (only for a run that opted in), decided first so that the reports carry it."""
        given: list[Any] = []
        held: list[Any] = []
        if det.advice.remedies and (alerts or det.advice.pending):
            given, held, alerts = det.advise(alerts, max(times, default=0), time.time_ns())
        await self.out.publish(run, batch, alerts, times, det.width)
        if given or held:
            await self.out.advise(run, given, held)
