"""timed(loader): the time the loop waits for each batch (``data_time_s`` of the next step),
and one batch in ``batch_every`` that holds token ids, for the data-quality checks of the next
step logged (``loader_batches``).

A part of the Monitor: it gets the settings, the caller's counters and a callable to say that
timing began (the Monitor's short path of ``log_step`` then turns off); the Monitor takes the
wait and the batch when a step is logged (``take_wait``, ``batch_item``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from steplens.producer.caller_counts import CallerCounts
from steplens.producer.config import ProducerConfig
from steplens.producer.instruments.loader_batches import token_fields
from steplens.producer.pipeline import values as V
from steplens.producer.pipeline.items import BatchItem


class LoaderTiming:
    def __init__(
        self, config: ProducerConfig, counts: CallerCounts, started: Callable[[], None]
    ) -> None:
        self.config = config
        self.counts = counts
        self.started = started  # called when a timed loader begins
        self.data_ns: int | None = None  # waited since the last step; None: nothing timed
        self.batch: tuple[Any, Any, Any] | None = None  # a timed batch's token fields
        self.batches = 0  # batches handed over

    def timed(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Wrap a DataLoader so the time spent waiting for each batch becomes data_time_s,
        and one batch in ``batch_every`` that holds token ids goes to the data-quality checks
        with the next step logged (``loader_batches``)."""
        it = iter(iterable)
        self.data_ns = 0
        self.started()
        every = self.config.batch_every
        while True:
            t0 = time.monotonic_ns()
            try:
                item = next(it)
            except StopIteration:
                return
            if self.data_ns is not None:
                self.data_ns += time.monotonic_ns() - t0
            if every:
                self.batches += 1
                if self.batches % every == 0:
                    self._take_batch(item)
            yield item

    def _take_batch(self, batch: Any) -> None:
        try:
            got = token_fields(batch)
            if got is None:
                self.batch = None
            else:
                ids, mask, labels = V.capture(list(got))  # no host sync; CPU tensors detached
                self.batch = (ids, mask, labels)
        except Exception:
            self.counts.caller += 1

    def take_wait(self) -> int | None:
        """The time waited for batches since the last step (None: no loader timed)."""
        data_ns = self.data_ns
        if data_ns is not None:
            self.data_ns = 0
        return data_ns

    def batch_item(self, step: int, t_ns: int) -> BatchItem | None:
        """The data-quality item of the batch handed over before ``step``."""
        got, self.batch = self.batch, None
        if got is None:
            return None
        info = self.config.model_info or {}
        max_len = info.get("seq_len", info.get("max_len"))
        return BatchItem(step, t_ns, *got, max_len if isinstance(max_len, int) else None)
