"""Latency of the run's own gradient all-reduce: a DistributedDataParallel communication hook
that runs DDP's default all-reduce (``default_hooks.allreduce_hook``: the same sum and mean)
and, at one optimizer step in ``every``, marks when each gradient bucket was handed over and
when its all-reduce completed.

Nothing waits: on CUDA the marks are CUDA events, the first recorded on the compute stream
when the bucket is ready, the second in the all-reduce future's callback, whose stream waits
for the collective; the producer's worker reads them once they completed (``pending``). On CPU
(gloo) the marks are host clock readings, the second taken in the callback gloo runs when the
collective is done. A bucket's time is from the later of its hand-over and the previous
bucket's completion (the collectives run one after the other) to its completion; the record
(``op`` "ddp_all_reduce") carries the median over the step's buckets (the first bucket also
absorbs the ranks' skew, which the straggler check judges) and the median bucket size.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

OP = "ddp_all_reduce"


def comm_offset(every: int, phase: float) -> int:
    """The steps a rank's timed all-reduce is shifted by: its phase of ``every``
    (``Identity.phase``: a wide run's ranks send their records at different steps)."""
    return round(phase * every)


def timed(step: int, every: int, offset: int = 0) -> bool:
    """Whether a rank's ``step``-th all-reduce (from 1) is timed: one in ``every``, shifted by
    ``offset`` (``comm_offset``)."""
    return (step + offset) % every == 0


def bucket_times(starts: list[float], ends: list[float]) -> list[float]:
    """Each bucket's own all-reduce time from its hand-over and completion marks (in launch
    order, one clock): from the later of its hand-over and the previous completion."""
    out = []
    for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
        begin = s if i == 0 else max(s, ends[i - 1])
        out.append(max(0.0, e - begin))
    return out


class _Step:
    """The marks of one timed step's buckets, in launch order."""

    def __init__(self, on_cuda: bool) -> None:
        self.on_cuda = on_cuda
        self.starts: list[Any] = []
        self.ends: list[Any] = []
        self.sizes: list[int] = []
        self.done = 0
        self.last_launched = False

    def ready(self) -> bool:
        return all(bool(e.query()) for e in self.ends)

    def resolve(self, data: dict[str, Any]) -> dict[str, Any]:
        """The record's data once every end event completed (CUDA)."""
        first = self.starts[0]
        starts = [float(first.elapsed_time(s)) for s in self.starts]
        ends = [float(first.elapsed_time(e)) for e in self.ends]
        return {**data, "latency_ms": statistics.median(bucket_times(starts, ends))}


def _unannotated(hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """DDP refuses a hook whose annotations are not its own types (``from __future__ import
    annotations`` makes ours strings): the same hook, unannotated."""

    def ddp_comm_timing_hook(state, bucket):  # type: ignore[no-untyped-def]
        return hook(state, bucket)

    return ddp_comm_timing_hook


class DdpCommTimer:
    """``attach(model)`` registers the hook on a DDP model; ``emit(step, data, pending)``
    receives each timed step's record (``pending``: CUDA events the worker resolves)."""

    def __init__(
        self, emit: Callable[[Any, dict[str, Any], Any], None], every: int, phase: float = 0.0
    ) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self._torch = torch
        self._allreduce = default_hooks.allreduce_hook
        self._emit = emit
        self.every = max(1, int(every))
        self.offset = comm_offset(self.every, phase)  # once: the hook runs in the caller's step
        self.backend = str(dist.get_backend())
        self.model: Any = None
        self.steps = 0  # steps whose gradients were all-reduced
        self.errors = 0
        self._open: _Step | None = None
        self._lock = threading.Lock()  # completions may come from gloo's threads

    def attach(self, model: Any) -> None:
        """Register the hook (DDP takes one: a model with a hook of its own raises)."""
        model.register_comm_hook(getattr(model, "process_group", None), _unannotated(self.hook))
        self.model = model

    def _mark(self, on_cuda: bool) -> Any:
        if on_cuda:
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter() * 1e3

    def hook(self, state: Any, bucket: Any) -> Any:
        step, index = None, -1
        try:
            if bucket.index() == 0:
                self.steps += 1
                due = timed(self.steps, self.every, self.offset)
                self._open = _Step(bucket.buffer().is_cuda) if due else None
            step = self._open
            if step is not None:
                buf = bucket.buffer()
                index = len(step.starts)
                step.starts.append(self._mark(step.on_cuda))
                step.ends.append(None)
                step.sizes.append(buf.numel() * buf.element_size())
                step.last_launched = bool(bucket.is_last())
        except Exception:
            self.errors += 1
            step = None
        fut = self._allreduce(state, bucket)
        if step is None:
            return fut
        return fut.then(lambda f: self._completed(f, step, index))

    def _completed(self, fut: Any, step: _Step, index: int) -> Any:
        try:
            mark = self._mark(step.on_cuda)
            with self._lock:
                step.ends[index] = mark
                step.done += 1
                complete = step.last_launched and step.done == len(step.starts)
            if complete:
                self._send(step)
        except Exception:
            self.errors += 1
        return fut.value()

    def _send(self, step: _Step) -> None:
        data: dict[str, Any] = {
            "op": OP,
            "bytes": int(statistics.median(step.sizes)),
            "backend": self.backend,
        }
        if step.on_cuda:
            self._emit(None, data, step)
            return
        data["latency_ms"] = statistics.median(bucket_times(step.starts, step.ends))
        self._emit(None, data, None)
