"""The Monitor's calls beside log_step: log_eval(), log_batch(), watch(), probe_comm(),
timed(), and the hardware sampler's hand-over.

A mixin of ``Monitor`` (it uses the Monitor's config, counters and fast-path switch); kept apart
so each file stays one screenful of concerns.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from steplens.producer import values as V
from steplens.producer.items import BatchItem, CommItem, EvalItem, HwItem, MetaItem
from steplens.producer.loader_batches import token_fields

log = logging.getLogger("steplens")
_EVAL_FIELDS = ("loss", "perplexity", "accuracy", "f1", "bleu", "rouge")


class Instruments:
    config: Any
    identity: Any  # Identity
    _watchers: list[Any]
    _watch_pending: dict[str, Any] | None
    _comm: Any
    _comm_timers: list[Any]  # DdpCommTimer of each DDP model watched
    _data_ns: int | None
    _loader_batch: tuple[Any, Any, Any] | None  # a timed batch's token fields, for its step
    _loader_batches: int  # batches timed() has handed over
    counts: Any  # CallerCounts
    _hw: Any
    pid: int
    _accepting: bool
    _remedies: Any  # Remedies, made on first use
    _advice: Any  # deques of the advice that arrived: for the loop, and for log_step
    _auto: Any

    def _put(self, item: Any) -> None:
        raise NotImplementedError  # pragma: no cover - the Monitor's

    def _update_plain_path(self) -> None:  # pragma: no cover - the Monitor's
        raise NotImplementedError

    def _start_hw(self) -> None:
        """The host-wide sampler on local rank 0; on the others, one for the PyTorch
        allocator's figures where torch is installed."""
        import importlib.util

        from steplens.producer.hardware import HardwareSampler

        host_wide = self.identity.local_rank == 0
        if not host_wide and importlib.util.find_spec("torch") is None:
            return
        self._hw = HardwareSampler(
            self._enqueue_hw,
            self.config.hw_interval_s,
            self.config.hw_slow_every,
            host_wide=host_wide,
            allocator_every_s=self.config.hw_allocator_every_s,
        )
        self._hw.start()

    def _enqueue_hw(self, data: dict[str, Any]) -> None:
        if self._accepting and self.pid == os.getpid():
            self._put(HwItem(time.monotonic_ns(), data))

    def _enqueue_comm(self, step: int | None, data: dict[str, Any], pending: Any) -> None:
        if self._accepting:
            self._put(CommItem(step, time.monotonic_ns(), data, pending))

    def log_eval(  # noqa: PLR0917 - the documented signature
        self,
        step: int,
        split: str = "val",
        loss: Any = None,
        perplexity: Any = None,
        accuracy: Any = None,
        f1: Any = None,
        bleu: Any = None,
        rouge: Any = None,
        *,
        predictions: Iterable[Any] | None = None,
        references: Iterable[Any] | None = None,
        **extra: Any,
    ) -> None:
        """Evaluation metrics of one split at one step. With ``predictions`` and
        ``references`` (one text each per example), BLEU and ROUGE-L are computed from them in
        the producer's worker thread (the ``text`` extra: sacrebleu, rouge-score)."""
        try:
            if not self._accepting:
                self.counts.refused += 1
                return
            named = (loss, perplexity, accuracy, f1, bleu, rouge)
            names = [*_EVAL_FIELDS, *extra]
            vals = V.capture([*named, *extra.values()])
            metrics = dict(zip(names, vals, strict=True))
            texts = None
            if predictions is not None or references is not None:
                texts = (list(predictions or ()), list(references or ()))
            self._put(EvalItem(step, time.monotonic_ns(), split, metrics, len(named), texts))
        except Exception:
            self.counts.caller += 1

    def log_batch(
        self,
        step: int,
        input_ids: Any,
        attention_mask: Any = None,
        labels: Any = None,
        max_len: int | None = None,
        *,
        sample_ids: Any = None,
        epoch: int | None = None,
        task: str | None = None,
        ignore_index: int = -100,
    ) -> None:
        """Data quality of one batch: lengths, over-length count, labels, sample hashes.

        ``labels``: one per sample (classification: counts per class) or per token (a
        language model, or ``task="lm"``: the share of labels other than ``ignore_index``).
        ``sample_ids``: the caller's ids of the samples (a list or a tensor), sent with the
        hashes; ``epoch``: the data's epoch (a sample seen again in a new epoch is no repeat).
        """
        try:
            if not self._accepting:
                self.counts.refused += 1
                return
            ids, mask, lab, sids = V.capture([input_ids, attention_mask, labels, sample_ids])
            if sids is not None and not hasattr(sids, "detach") and not hasattr(sids, "shape"):
                sids = list(sids)  # the caller may reuse its list
            item = (step, time.monotonic_ns(), ids, mask, lab, max_len, sids, epoch, task)
            self._put(BatchItem(*item, ignore_index))
        except Exception:
            self.counts.caller += 1

    def watch(
        self,
        model: Any,
        optimizer: Any,
        scheduler: Any = None,
        every: int = 100,
        max_grad_norm: float | None = None,
    ) -> None:
        """Every ``every`` optimizer steps: pre-clip gradient norm, clipping, parameter norm,
        per-layer gradient and parameter norms, update ratio and the learning rate the step
        used (a step logged without ``lr`` gets it), computed on the device.

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
                    layer_depth=self.config.layer_depth,
                )
            )
            self._update_plain_path()
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
        if torch is None or not every or any(t.model is model for t in self._comm_timers):
            return
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return
        from steplens.producer.ddp_comm import DdpCommTimer

        timer = DdpCommTimer(self._enqueue_comm, every)
        try:
            timer.attach(model)
        except Exception as exc:  # DDP takes one hook: the model has its own
            log.info(
                "steplens: the DDP all-reduce is not timed (%s); sl.probe_comm(every=100) "
                "times a small all_reduce instead",
                exc,
            )
            return
        self._comm_timers.append(timer)

    def _watch_result(self, result: dict[str, Any]) -> None:
        self._watch_pending = result

    def _watch_between(self, values: dict[str, Any]) -> None:
        """Host numbers of a step between watched ones, for the next ``log_step``: merged into
        a watched step's result not yet logged (the latest lr wins)."""
        if self._watch_pending is None:
            self._watch_pending = values
        else:
            self._watch_pending.update(values)

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
            self.counts.caller += 1
            log.warning("steplens: probe_comm() disabled: %s", exc)

    def timed(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Wrap a DataLoader so the time spent waiting for each batch becomes data_time_s,
        and one batch in ``batch_every`` that holds token ids goes to the data-quality checks
        with the next step logged (``loader_batches``)."""
        it = iter(iterable)
        self._data_ns = 0
        self._update_plain_path()
        every = self.config.batch_every
        while True:
            t0 = time.monotonic_ns()
            try:
                item = next(it)
            except StopIteration:
                return
            if self._data_ns is not None:
                self._data_ns += time.monotonic_ns() - t0
            if every:
                self._loader_batches += 1
                if self._loader_batches % every == 0:
                    self._take_loader_batch(item)
            yield item

    def _take_loader_batch(self, batch: Any) -> None:
        try:
            got = token_fields(batch)
            if got is None:
                self._loader_batch = None
            else:
                ids, mask, labels = V.capture(list(got))  # no host sync; CPU tensors detached
                self._loader_batch = (ids, mask, labels)
        except Exception:
            self.counts.caller += 1

    def _loader_batch_item(self, step: int, t_ns: int) -> BatchItem | None:
        """The data-quality item of the batch timed() handed over before ``step``."""
        got, self._loader_batch = self._loader_batch, None
        if got is None:
            return None
        info = self.config.model_info or {}
        max_len = info.get("seq_len", info.get("max_len"))
        return BatchItem(step, t_ns, *got, max_len if isinstance(max_len, int) else None)

    # ------------------------------------------------------------------ remedies
    @property
    def remedies(self) -> Any:
        """The remedies this run opted into (``init(remedies=[...])``): ``remedies.Remedies``."""
        if self._remedies is None:
            from steplens.producer.remedies import Remedies

            self._remedies = Remedies(self, getattr(self.config, "remedies", None) or ())
        return self._remedies

    def skipping(self, iterable: Iterable[Any], ids: Any = None) -> Any:
        """Wrap a DataLoader, sampler or dataset so the samples a remedy names are skipped
        for the rest of the run, and a rewind's batches after it (``skipping.Skipping``).
        Plain iteration when something goes wrong here."""
        try:
            return self.remedies.skipping(iterable, ids)
        except Exception:
            self.counts.caller += 1
            return iterable

    def act(self, step: int, **targets: Any) -> int:
        """Carry out the advice that arrived, at the end of ``step``; the step the model is at
        after it (a rewind's checkpoint step, else ``step``). ``targets``: ``model``,
        ``optimizer``, ``scheduler`` (default: the watched ones), ``load(path)``. Advice for
        every rank that changes the model waits for its ``at_step``; no collective, so a
        rank may call this at any steps (a late one is counted)."""
        try:
            r = self._remedies
            if r is None:
                r = self.remedies
            if not (self._advice or self._auto or r.busy() or "advice" in targets):
                return step  # the common case: nothing arrived, nothing under way
            return int(r.act(step, **targets))
        except Exception:
            self.counts.caller += 1
            return step

    def watched(self) -> tuple[Any, Any, Any]:
        """(model, optimizer, scheduler) of the first ``watch()`` (Nones without one)."""
        for w in self._watchers:
            return w.model, w.optimizer, w.scheduler
        return None, None, None

    def scale_declared_lr(self, from_step: int, factor: float) -> None:
        """The lr was multiplied by ``factor`` from ``from_step`` on (a remedy): send the
        declared schedule again with the factor in it (``lr_scale``), so the schedule check
        follows the new level and the change is an lr event. Nothing without a schedule."""
        if not self.config.lr_schedule:
            return
        from steplens.producer.lower_lr import scaled_schedule

        self._declare(scaled_schedule(self.config.lr_schedule, from_step, factor))

    def declare_schedule(self, schedule: dict[str, Any]) -> bool:
        """Declare the lr schedule after ``init`` (a trainer integration reads it from the
        trainer's arguments): ``run_meta`` again with it. A schedule declared at ``init`` is
        kept; True when this one was sent."""
        if self.config.lr_schedule:
            return False
        self._declare(dict(schedule))
        if self.identity.rank == 0:
            log.info("steplens checks: lr schedule on, declared after init: %s", schedule)
        return True

    def _declare(self, schedule: dict[str, Any]) -> None:
        import dataclasses

        from steplens.producer import checks

        self.config = dataclasses.replace(self.config, lr_schedule=schedule)
        meta = self.config.run_meta(self.identity)
        meta["checks"] = checks.design_checks(self.config, self.identity)
        self._put(MetaItem(time.monotonic_ns(), meta))
