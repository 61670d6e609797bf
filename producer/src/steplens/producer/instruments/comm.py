"""probe_comm(): a timed tiny all_reduce and a ring send/recv between ranks.

On GPU (NCCL) the probe is timed with CUDA events and resolved by the worker once the events
completed (no host sync); on CPU (gloo) the collectives are synchronous and timed on the host.
Runs in the caller's thread at the steps it is due, so every rank must reach the same steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class _EventTiming:
    """Elapsed time between two CUDA events, read once the end event completed."""

    def __init__(self, start: Any, end: Any) -> None:
        self.start, self.end = start, end

    def ready(self) -> bool:
        return bool(self.end.query())

    def resolve(self, data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "latency_ms": float(self.start.elapsed_time(self.end))}


class CommProbe:
    def __init__(self, emit: Callable[[int, dict[str, Any], Any], None], every: int) -> None:
        self.every = every
        self._emit = emit
        self.usable = False
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            return
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        self._torch, self._dist = torch, dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.backend = str(dist.get_backend())
        on_gpu = self.backend == "nccl" and torch.cuda.is_available()
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        )
        self._buf = torch.zeros(1, device=self.device)
        self._recv = torch.zeros(1, device=self.device)
        self.usable = True

    def maybe_run(self, step: int) -> None:
        if step % self.every == 0:
            self.run(step)

    def run(self, step: int) -> None:
        dist = self._dist
        nxt, prv = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        ring = [
            dist.P2POp(dist.isend, self._buf, nxt),
            dist.P2POp(dist.irecv, self._recv, prv),
        ]
        common = {"bytes": self._buf.element_size(), "backend": self.backend}
        if self.device.type == "cuda":
            ev = self._torch.cuda.Event
            e0, e1, e2 = ev(enable_timing=True), ev(enable_timing=True), ev(enable_timing=True)
            e0.record()
            dist.all_reduce(self._buf)
            e1.record()
            for req in dist.batch_isend_irecv(ring):
                req.wait()  # on NCCL this orders the stream, it does not block the host
            e2.record()
            self._emit(step, {"op": "all_reduce", **common}, _EventTiming(e0, e1))
            self._emit(step, {"op": "send_recv", "peer": prv, **common}, _EventTiming(e1, e2))
            return
        t0 = time.perf_counter()
        dist.all_reduce(self._buf)
        t1 = time.perf_counter()
        for req in dist.batch_isend_irecv(ring):
            req.wait()
        t2 = time.perf_counter()
        self._emit(step, {"op": "all_reduce", "latency_ms": (t1 - t0) * 1e3, **common}, None)
        self._emit(
            step, {"op": "send_recv", "peer": prv, "latency_ms": (t2 - t1) * 1e3, **common}, None
        )
