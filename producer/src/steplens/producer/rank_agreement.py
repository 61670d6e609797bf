"""Ranks agreeing on when to carry out advice that changes the shared model (rewind, lr).

Data-parallel replicas stay identical only if every rank reloads a checkpoint or lowers its lr
at the same step; advice reaches the ranks at different times. At each ``act`` every rank
gives how many such pieces it holds (they arrive in the same order on every rank: one
partition, keyed by run), and all carry out the smallest count: one all-reduce of one integer,
on the CPU (a gloo group of its own when the default group is not gloo, so no device
synchronisation). Every rank must therefore call ``act`` at the same steps, as every rank
calls ``log_step`` with ``probe_comm``.

Without ``torch.distributed`` initialised (or with one rank) the count is the rank's own.
"""

from __future__ import annotations

import sys
from typing import Any


class RankAgreement:
    def __init__(self) -> None:
        self._group: Any = None
        self._ready = False
        self.errors = 0

    def _dist(self) -> Any:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        return dist

    def smallest(self, count: int) -> int:
        """The smallest ``count`` over the ranks (this rank's own without a group)."""
        dist = self._dist()
        if dist is None:
            return count
        import torch

        try:
            if not self._ready:  # every rank reaches its first act together: a collective
                if dist.get_backend() != "gloo":
                    self._group = dist.new_group(backend="gloo")
                self._ready = True
            t = torch.tensor([count], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._group)
            return int(t[0])
        except Exception:
            self.errors += 1
            return 0  # act on nothing shared rather than alone
