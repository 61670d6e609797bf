"""A short ``torch.profiler`` trace of this rank, as evidence for a slow-rank incident.

Started at a step boundary, stopped at the first boundary after ``duration_s`` (at most
``MAX_DURATION_S``) or ``MAX_STEPS`` steps, whichever comes first. Stopping waits for the
device's queued work (the profiler's own synchronisation): the one pause this remedy costs.
Writing the gzipped Chrome trace (open it in Perfetto or ``chrome://tracing``) and storing it
(``trace_upload``) happen in a thread of their own (``finish``).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

MAX_DURATION_S = 30.0
DEFAULT_DURATION_S = 5.0
MAX_STEPS = 20  # steps recorded at most: a trace of a few MB


class RankProfile:
    """One running trace (``start``), stopped by ``maybe_stop`` at a later step boundary and
    written by ``finish``."""

    def __init__(self, path: str, duration_s: float | None, step: int) -> None:
        import torch

        wanted = DEFAULT_DURATION_S if duration_s is None else float(duration_s)
        self.duration_s = min(MAX_DURATION_S, max(0.0, wanted))
        self.path = path
        self.first_step = step
        self.steps = 0
        self.elapsed_s = 0.0
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof: Any = torch.profiler.profile(activities=activities)
        self._prof.start()
        self._t0 = time.monotonic()

    def maybe_stop(self, step: int | None, force: bool = False) -> bool:
        """At a step boundary: stop once the bounds are reached (``step`` None: the last one
        seen); whether it stopped."""
        if step is not None:
            self.steps = max(0, step - self.first_step)
        self.elapsed_s = time.monotonic() - self._t0
        if not (force or self.elapsed_s >= self.duration_s or self.steps >= MAX_STEPS):
            return False
        self._prof.stop()
        return True

    def finish(self) -> str:
        """Write the stopped trace to ``path`` (gzipped); what it holds, in words."""
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._prof.export_chrome_trace(self.path)
        self._prof = None  # the recorded events: freed
        return f"{self.steps} steps, {self.elapsed_s:.1f} s"

    @staticmethod
    def trace_path(folder: str, run_id: str, rank: int, fingerprint: str) -> str:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{run_id}-rank{rank}-{fingerprint}")[:150]
        return os.path.join(folder, f"{name}.trace.json.gz")
