"""What the caller's side of a Monitor counts, and the counters as the health record shows them.

Plain ints bumped from the caller's thread (the GIL makes ``+=`` safe enough for counters);
the worker reads them when it writes a ``health`` record.
"""

from __future__ import annotations

from typing import Any


class CallerCounts:
    def __init__(self) -> None:
        self.queue_full = 0  # items pushed out of the full queue (drop-oldest)
        self.caller = 0  # exceptions caught in a call
        self.refused = 0  # calls after shutdown
        self.errors: dict[str, int] = {}  # set by steplens.producer.init (calls before it)

    def health(self, hw: Any) -> tuple[dict[str, int], dict[str, int]]:
        """(dropped, errors) of the caller's side (and of the hardware sampler ``hw``)."""
        dropped = {"queue_full": self.queue_full} if self.queue_full else {}
        errors = dict(self.errors)
        if self.caller:
            errors["caller"] = self.caller
        if self.refused:
            errors["not_running"] = errors.get("not_running", 0) + self.refused
        if hw is not None and (hw.errors or hw.gpu.errors or hw.allocator.errors):
            errors["hw"] = hw.errors + hw.gpu.errors + hw.allocator.errors
        return dropped, errors
