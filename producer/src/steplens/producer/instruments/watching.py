"""watch(): the Watchers of the models watched, the timers of their DDP all-reduce, and the
watched step's figures waiting for the next ``log_step``.

A part of the Monitor: it gets the settings, the caller's counters and where a timed
all-reduce goes; the Monitor takes the waiting figures (``take``) when a step is logged.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from steplens.producer.caller_counts import CallerCounts
from steplens.producer.config import ProducerConfig

log = logging.getLogger("steplens")

EmitComm = Callable[[Any, dict[str, Any], Any], None]  # (step, data, pending)


class Watching:
    def __init__(
        self, config: ProducerConfig, counts: CallerCounts, emit_comm: EmitComm, phase: float = 0.0
    ) -> None:
        self.config = config
        self.phase = phase  # the rank's (``Identity.phase``): when its all-reduce is timed
        self.counts = counts
        self.emit_comm = emit_comm
        self.watchers: list[Any] = []  # a Watcher per watch() call
        self.comm_timers: list[Any] = []  # a DdpCommTimer per DDP model watched
        self.pending: dict[str, Any] | None = None  # for the next log_step

    def watch(
        self,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        every: int,
        max_grad_norm: float | None,
    ) -> None:
        """A Watcher on ``model``'s optimizer, and its DDP all-reduce timed; each counted and
        logged when it cannot be (never raises)."""
        try:
            from steplens.producer.instruments.watcher import Watcher

            config = self.config
            self.watchers.append(
                Watcher(
                    self,
                    model,
                    optimizer,
                    scheduler,
                    every=max(1, int(every)),
                    update_threshold=config.update_threshold,
                    sample_size=config.update_sample,
                    max_grad_norm=max_grad_norm,
                    layer_depth=config.layer_depth,
                )
            )
        except Exception as exc:
            self.counts.caller += 1
            log.warning("steplens: watch() disabled: %s", exc)
        try:
            self._time_collectives(model)
        except Exception as exc:
            self.counts.caller += 1
            log.warning("steplens: the DDP all-reduce is not timed: %s", exc)

    def _time_collectives(self, model: Any) -> None:
        """A DistributedDataParallel model's gradient all-reduce, timed at one step in
        ``comm_every`` (``ddp_comm.py``); a model with a communication hook of its own is left
        as it is (``probe_comm`` measures the interconnect instead)."""
        torch = sys.modules.get("torch")
        every = self.config.comm_every
        if torch is None or not every or any(t.model is model for t in self.comm_timers):
            return
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return
        from steplens.producer.instruments.ddp_comm import DdpCommTimer

        timer = DdpCommTimer(self.emit_comm, every, self.phase)
        try:
            timer.attach(model)
        except Exception as exc:  # DDP takes one hook: the model has its own
            log.info(
                "steplens: the DDP all-reduce is not timed (%s); sl.probe_comm(every=100) "
                "times a small all_reduce instead",
                exc,
            )
            return
        self.comm_timers.append(timer)

    # ------------------------------------------------------------------ a Watcher's results
    def result(self, values: dict[str, Any]) -> None:
        """A watched step's figures (still on the device), for the next ``log_step``."""
        self.pending = values

    def between(self, values: dict[str, Any]) -> None:
        """Host numbers of a step between watched ones, for the next ``log_step``: merged into
        a watched step's result not yet logged (the latest lr wins)."""
        if self.pending is None:
            self.pending = values
        else:
            self.pending.update(values)

    def failed(self) -> None:
        """A Watcher's hook raised (caught there: never into the training loop)."""
        self.counts.caller += 1

    # ------------------------------------------------------------------ the Monitor's side
    def take(self) -> dict[str, Any] | None:
        """The figures waiting for the step being logged (None: none)."""
        pending, self.pending = self.pending, None
        return pending

    def watched(self) -> tuple[Any, Any, Any]:
        """(model, optimizer, scheduler) of the first ``watch()`` (Nones without one)."""
        for w in self.watchers:
            return w.model, w.optimizer, w.scheduler
        return None, None, None

    def remove(self) -> None:
        """Take every Watcher's hooks off."""
        for w in self.watchers:
            w.remove()
