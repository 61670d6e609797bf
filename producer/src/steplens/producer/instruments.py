"""What the Monitor offers beside the per-step calls: watch(), probe_comm(), timed().

A mixin of ``Monitor`` (it uses the Monitor's config, counters and fast-path switch); kept apart
so each file stays one screenful of concerns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

log = logging.getLogger("steplens")


class Instruments:
    config: Any
    _watchers: list[Any]
    _watch_pending: dict[str, Any] | None
    _comm: Any
    _data_ns: int | None
    _caller_errors: int

    def _update_plain_path(self) -> None:  # pragma: no cover - the Monitor's
        raise NotImplementedError

    def _enqueue_comm(
        self, step: int, data: dict[str, Any], pending: Any
    ) -> None:  # pragma: no cover
        raise NotImplementedError

    def watch(
        self,
        model: Any,
        optimizer: Any,
        scheduler: Any = None,
        every: int = 100,
        max_grad_norm: float | None = None,
    ) -> None:
        """Every ``every`` optimizer steps: pre-clip gradient norm, clipping, parameter norm,
        update ratio and the learning rate of every param group, computed on the device.

        ``max_grad_norm``: the clipping threshold the loop uses. With it, a step is clipped when
        its pre-clip norm (the ``grad_norm`` given to log_step, else the one measured at the end
        of backward) exceeds it; without it, clipping is inferred from a uniform shrink of the
        gradients before ``optimizer.step()``, which gradient averaging done by hand between
        backward and step can imitate."""
        try:
            from steplens.producer.watcher import Watcher

            self._watchers.append(
                Watcher(
                    self,
                    model,
                    optimizer,
                    scheduler,
                    every=max(1, int(every)),
                    update_threshold=self.config.update_threshold,
                    sample_size=self.config.update_sample,
                    max_grad_norm=max_grad_norm,
                )
            )
            self._update_plain_path()
        except Exception as exc:
            self._caller_errors += 1
            log.warning("steplens: watch() disabled: %s", exc)

    def _watch_result(self, result: dict[str, Any]) -> None:
        self._watch_pending = result

    def probe_comm(self, every: int = 100) -> None:
        """Every ``every`` steps (checked in log_step): a tiny timed all_reduce and a ring
        send/recv. Every rank must call log_step at the same steps."""
        try:
            if self._comm is not None and self._comm.every == every:
                return
            from steplens.producer.comm import CommProbe

            probe = CommProbe(self._enqueue_comm, max(1, int(every)))
            self._comm = probe if probe.usable else None
            self._update_plain_path()
        except Exception as exc:
            self._caller_errors += 1
            log.warning("steplens: probe_comm() disabled: %s", exc)

    def timed(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Wrap a DataLoader so the time spent waiting for each batch becomes data_time_s."""
        it = iter(iterable)
        self._data_ns = 0
        self._update_plain_path()
        while True:
            t0 = time.monotonic_ns()
            try:
                item = next(it)
            except StopIteration:
                return
            if self._data_ns is not None:
                self._data_ns += time.monotonic_ns() - t0
            yield item
