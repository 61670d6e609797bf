"""The route agent: raw messages, in batches, grouped by run and forwarded to the by-run topic.

A run's share of a batch is cut into messages of about ``BY_RUN_MESSAGE_BYTES``; undecodable
keys or non-UTF-8 payloads become dead letters here. The hop puts every rank of a run on one
by-run partition: the producers key raw by run and rank, and a run's detectors judge its ranks
together (stragglers, hangs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson

from steplens.schema import DecodeError, decode
from steplens.stream_jobs.worker import compat
from steplens.stream_jobs.worker.publisher import Publisher
from steplens.stream_jobs.worker.settings import (
    ROUTED_IN_FLIGHT,
    WorkerSettings,
    by_run_chunks,
    run_of_key,
)

log = logging.getLogger("steplens.stream_jobs")


class Router:
    def __init__(
        self, s: WorkerSettings, by_run: Any, out: Publisher, consumer: Callable[[], Any]
    ) -> None:
        self.s = s
        self.by_run = by_run  # the by-run topic
        self.out = out
        self.consumer = consumer  # the app's consumer, once it exists
        # the commit of the last routed batch; each waits for the one before it
        self.routed: asyncio.Future[None] | None = None
        self.routed_pending = 0

    async def route(self, stream: Any) -> None:
        async for events in stream.take_events(self.s.batch, within=self.s.within_s):
            groups: dict[str, list[list[Any]]] = {}
            for ev in events:
                msg = ev.message
                run = await self._run_of(msg)
                if run is not None:
                    groups.setdefault(run[0], []).append([msg.partition, msg.offset, run[1]])
            sent = [
                await self.by_run.send(key=run.encode(), value=orjson.dumps(chunk))
                for run, items in groups.items()
                for chunk in by_run_chunks(items)
            ]
            offsets: dict[Any, int] = {}
            for ev in events:
                msg = ev.message
                offsets[msg.tp] = max(offsets.get(msg.tp, 0), msg.offset + 1)
            self.routed_pending += 1
            self.routed = asyncio.ensure_future(self._commit_after(self.routed, offsets, sent))
            if self.routed_pending >= ROUTED_IN_FLIGHT:
                await self.routed  # and every one before it

    async def _run_of(self, msg: Any) -> tuple[str, str | None] | None:
        """A raw message's run (from its key, else its record) and its text; None (a dead
        letter) when it has none."""
        value = msg.value
        run = run_of_key(msg.key)
        try:
            text = value.decode("utf-8") if value is not None else None
        except UnicodeDecodeError as exc:
            reason = f"not valid UTF-8: {exc}"
            await self.out.dead(reason, value, run, msg.key, msg.partition, msg.offset)
            return None
        if run is None:
            got = decode(text)
            if isinstance(got, DecodeError):
                await self.out.dead(str(got), value, None, msg.key, msg.partition, msg.offset)
                return None
            run = got.run_id
        return run, text

    async def _commit_after(
        self, before: asyncio.Future[None] | None, offsets: dict[Any, int], sent: list[Any]
    ) -> None:
        """Commit the batch's raw partitions once its by-run writes are acknowledged and the
        batches routed before it are committed: the route agent goes on to its next batch
        meanwhile (waiting cost it half its time). A worker killed after forwarding a batch
        leaves a committed position on every raw partition it routed; one killed before the
        acknowledgement, the old position (the batch is routed again, and the detectors skip
        what they already applied). The commit goes straight to the client
        (``compat.commit``)."""
        try:
            if before is not None:
                await before
            for fut in sent:
                await fut  # delivery of the forwarded batch
            await compat.commit(self.consumer(), offsets)
        except Exception:  # a rebalance in between: the batch is routed again, and skipped
            log.debug("commit of routed offsets failed", exc_info=True)
        finally:
            self.routed_pending -= 1
