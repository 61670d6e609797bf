"""PyTorch Lightning integration (``lightning`` or ``pytorch_lightning``).

from steplens.producer.integrations.lightning import SteplensCallback
trainer = L.Trainer(..., callbacks=[SteplensCallback(watch_every=50)])
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older distribution name
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]

from steplens.producer.integrations._common import monitor_for, split_eval
from steplens.producer.integrations.step_loss import StepLoss
from steplens.producer.integrations.step_lr import StepLr


class SteplensCallback(Callback):
    """Every optimizer step: its loss (kept on the device; with ``accumulate_grad_batches``
    the sum of its micro-batches' losses, each of which Lightning divides by their number),
    its lr (``StepLr``: the scheduler's after its step, scaled where the step ran at another
    lr than its scheduler had set) and the time its batches waited for the loader
    (``data_time_s``: from the end of one training batch to the start of the next);
    validation metrics as eval.

    Every ``watch_every`` optimizer steps (default 10; None: never) ``watch()`` adds the
    gradient norm before clipping, clipping (against the Trainer's ``gradient_clip_val`` when
    it clips by norm), the parameter and per-layer norms and the update ratio: Lightning
    clips inside its loop and keeps no norm, so these come from the watcher.

    Every checkpoint a ``ModelCheckpoint`` saves is reported (``checkpoint``), at the step it
    was saved at. With remedies (``init(remedies=[...])``) the advice is carried out after each
    training batch (``Monitor.act``, no collective): a rewind reloads a Lightning checkpoint
    into the module, the first optimizer and scheduler and skips the next batches of a
    ``skipping()`` loader; the Trainer's step count goes on. Where the fit loop reads a batch
    ahead (a loader without a length) a rewind for ``at_step`` starts one step before, so the
    reload falls at the end of ``at_step`` on every rank."""

    def __init__(self, monitor: Any = None, watch_every: int | None = 10, **init_kwargs: Any):
        self._monitor = monitor
        self._watch_every = watch_every
        self._init_kwargs = init_kwargs
        self._saving_at: int | None = None  # the step of a checkpoint being saved
        self._reported: set[str] = set()
        self._losses = StepLoss()
        self._lr = StepLr()
        self._sent_step: int | None = None  # the optimizer step sent last
        self._batch_end: float | None = None  # when the last training batch ended
        self._waited: float | None = None  # seconds the step's batches waited for the loader

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            self._monitor = monitor_for(self._monitor, self._init_kwargs)
            if self._watch_every and trainer.optimizers:
                limit = trainer.gradient_clip_val
                by_norm = trainer.gradient_clip_algorithm in (None, "norm")
                schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
                self._monitor.watch(
                    pl_module,
                    trainer.optimizers[0],
                    schedulers[0] if schedulers else None,
                    every=self._watch_every,
                    max_grad_norm=float(limit) if limit and by_norm else None,
                )
        except Exception:  # never break training
            self._monitor = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._sent_step = trainer.global_step  # a resumed run's first step is the next one
        if self._monitor is not None and trainer.optimizers:
            schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
            self._lr.attach(trainer.optimizers[0], schedulers[0] if schedulers else None)

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._batch_end is not None:
            waited = time.perf_counter() - self._batch_end
            self._waited = waited if self._waited is None else self._waited + waited
            self._batch_end = None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        m = self._monitor
        if m is None:
            return
        try:  # the fit loop reads one batch ahead of a loader without a length
            m.remedies.read_ahead = 0 if math.isfinite(trainer.num_training_batches) else 1
        except Exception:  # never break training
            m.remedies.read_ahead = 1

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        m = self._monitor
        if m is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and hasattr(loss, "detach"):
            self._losses.add(loss.detach(), shared=True)
        self._batch_end = time.perf_counter()
        if self._sent_step is not None and trainer.global_step == self._sent_step:
            return  # a micro-batch of a step still accumulating
        self._sent_step = trainer.global_step
        lr = self._lr.lr()
        timed = {} if self._waited is None else {"data_time_s": self._waited}
        self._waited = None
        m.log_step(trainer.global_step, loss=self._losses.take(), lr=lr, **timed)
        self._report_checkpoints(m, trainer)
        if m.config.remedies:
            schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
            m.act(
                trainer.global_step,
                model=pl_module,
                optimizer=trainer.optimizers[0] if trainer.optimizers else None,
                scheduler=schedulers[0] if schedulers else None,
            )

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        self._saving_at = trainer.global_step  # the path is known once it is written

    def _report_checkpoints(self, m: Any, trainer: Any) -> None:
        """Report the checkpoints written since the last call (ModelCheckpoint's paths)."""
        if self._saving_at is None:
            return
        try:
            for cb in trainer.checkpoint_callbacks:
                paths = [*getattr(cb, "best_k_models", {})]
                paths += [getattr(cb, "best_model_path", ""), getattr(cb, "last_model_path", "")]
                for path in paths:
                    if path and path not in self._reported and os.path.exists(path):
                        self._reported.add(path)
                        m.checkpoint(self._saving_at, path)
        finally:
            self._saving_at = None

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        m = self._monitor
        if m is None or trainer.sanity_checking:
            return
        metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        named, extra = split_eval(metrics, "val_")
        m.log_eval(trainer.global_step, split="val", **named, **extra)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._lr.detach()
        if self._monitor is not None:
            self._report_checkpoints(self._monitor, trainer)
            self._monitor.remedies.close(trainer.global_step)
            self._monitor.flush(10.0)
