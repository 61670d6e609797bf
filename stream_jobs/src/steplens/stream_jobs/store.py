"""The worker's runs: loaded from the table, checkpointed to it, their messages acknowledged.

A by-run message is acknowledged only once a checkpoint of its run holds it, so a worker killed
between checkpoints leaves those messages to be scored again, not lost (a run's ``offsets``
skip what its stored state already applied). Checkpoints go to the table (changelog-backed: a
restarted or newly joined worker resumes the run); a run's head and each changed rank's series
are values of their own (``state``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping
from typing import Any

from steplens.stream_jobs.config import DetectorConfig
from steplens.stream_jobs.detector import RunDetector
from steplens.stream_jobs.signals.arima_fit import ArimaParams
from steplens.stream_jobs.state import dump_state, load_state, rank_key

log = logging.getLogger("steplens.stream_jobs")


class RunStore:
    def __init__(
        self, table: MutableMapping[bytes, Any], cfg: DetectorConfig, checkpoint_s: float
    ) -> None:
        self.table = table
        self.cfg = cfg
        self.checkpoint_s = checkpoint_s
        self.cache: dict[str, RunDetector] = {}
        self.saved_at: dict[str, float] = {}
        # by-run partition -> run -> its messages scored since its last checkpoint
        self.held: dict[int, dict[str, list[Any]]] = {}

    def get(self, run: str) -> RunDetector:
        """``run``'s detector: cached, else restored from the table, else new."""
        det = self.cache.get(run)
        if det is None:
            blob = self.table.get(run.encode())
            if blob:
                det = load_state(
                    blob, lambda r: self.table.get(rank_key(run, r).encode()), self.cfg
                )
            if det is None:
                det = RunDetector(run, self.cfg, fit_inline=False)
            else:
                det.touched.update(det.series)
                det.resume_fits()
            self.cache[run] = det
        return det

    def hold(self, partition: int, run: str, event: Any) -> list[tuple[str, list[Any]]]:
        """Hold ``event`` (a message of ``run`` on by-run ``partition``) until a checkpoint;
        returns the runs of that partition that are due one, each with its held messages (to
        be checkpointed now: table writes go to the changelog partition of the message being
        processed, theirs too)."""
        held = self.held.setdefault(partition, {})
        held.setdefault(run, []).append(event)
        now = time.monotonic()
        due = [r for r in held if now - self.saved_at.get(r, 0.0) >= self.checkpoint_s]
        return [(r, held.pop(r)) for r in due]

    def checkpoint(self, run: str) -> None:
        """Write ``run``'s changed state to the table (each changed rank before the head that
        lists it)."""
        det = self.cache[run]
        head, ranks = dump_state(det, det.take_touched())
        for rank, blob in ranks.items():
            self.table[rank_key(run, rank).encode()] = blob
        self.table[run.encode()] = head
        self.saved_at[run] = time.monotonic()

    def quiet_runs(self) -> list[str]:
        """Runs holding messages past ``checkpoint_s`` (a run that went quiet: its next
        checkpoint needs a message of its partition)."""
        now = time.monotonic()
        return [
            run
            for held in self.held.values()
            for run in held
            if now - self.saved_at.get(run, 0.0) >= self.checkpoint_s
        ]

    def revoked(self) -> None:
        """Another worker may own these runs now: reload them from the table when they come
        back; the held messages are not acknowledged (their new owner scores them again)."""
        self.cache.clear()
        self.saved_at.clear()
        self.held.clear()

    def fitted(self, run: str, key: tuple[int, str], params: ArimaParams | None) -> None:
        det = self.cache.get(run)
        if det is not None:
            det.apply_fit(key, params)
