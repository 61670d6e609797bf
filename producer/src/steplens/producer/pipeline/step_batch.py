"""Full resolution: every step's payload, gathered into ``step_batch`` records.

A consumer pays a fixed cost per message, so steps travel many to a record. ``StepBatch`` holds
the entries of the batch being filled and says when it is due; ``halves`` splits a batch too
large for one record. Pure: the Monitor's worker thread owns the batch and sends it.
"""

from __future__ import annotations

from typing import Any

Entry = dict[str, Any]


class StepBatch:
    """The steps waiting to leave as one record: at most ``max_steps``, for ``max_s`` seconds."""

    def __init__(self, max_steps: int, max_s: float) -> None:
        self.max_steps = max_steps
        self.max_ns = max_s * 1e9
        self.entries: list[Entry] = []
        self.started_ns = 0  # monotonic time of the first entry

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, step: int, time_ns: int, data: dict[str, Any], now_ns: int) -> None:
        """Append one step: ``data`` is its step payload, ``time_ns`` its wall-clock time."""
        if not self.entries:
            self.started_ns = now_ns
        self.entries.append({"step": step, "time_ns": time_ns, **data})

    def due(self, now_ns: int) -> bool:
        """Full, or its first entry is ``max_s`` old (``now_ns`` on the monotonic clock)."""
        n = len(self.entries)
        return n > 0 and (n >= self.max_steps or now_ns - self.started_ns >= self.max_ns)

    def take(self) -> list[Entry]:
        """The entries, in order, and an empty batch."""
        entries, self.entries = self.entries, []
        return entries


def payload(entries: list[Entry]) -> dict[str, Any]:
    """The ``step_batch`` data; the record's step and time_ns are the last entry's."""
    return {"records": entries}


def halves(entries: list[Entry]) -> tuple[list[Entry], list[Entry]]:
    """Two batches, in order, for a batch too large for one record (needs 2+ entries)."""
    half = len(entries) // 2
    return entries[:half], entries[half:]
