"""PyTorch Lightning integration (``lightning`` or ``pytorch_lightning``).

from steplens.producer.integrations.lightning import SteplensCallback
trainer = L.Trainer(..., callbacks=[SteplensCallback(watch_every=50)])
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older distribution name
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]

from steplens.producer.integrations._common import monitor_for, split_eval


class SteplensCallback(Callback):
    """Every training batch: loss (kept on the device) and lr; validation metrics as eval.

    Every ``watch_every`` optimizer steps (default 10; None: never) ``watch()`` adds the
    gradient norm before clipping, clipping (against the Trainer's ``gradient_clip_val`` when
    it clips by norm), the parameter and per-layer norms and the update ratio: Lightning
    clips inside its loop and keeps no norm, so these come from the watcher."""

    def __init__(self, monitor: Any = None, watch_every: int | None = 10, **init_kwargs: Any):
        self._monitor = monitor
        self._watch_every = watch_every
        self._init_kwargs = init_kwargs

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

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        m = self._monitor
        if m is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and hasattr(loss, "detach"):
            loss = loss.detach()
        lr = None
        if trainer.optimizers:
            lr = trainer.optimizers[0].param_groups[0].get("lr")
        m.log_step(trainer.global_step, loss=loss, lr=lr)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        m = self._monitor
        if m is None or trainer.sanity_checking:
            return
        metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        named, extra = split_eval(metrics, "val_")
        m.log_eval(trainer.global_step, split="val", **named, **extra)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self._monitor is not None:
            self._monitor.flush(10.0)
