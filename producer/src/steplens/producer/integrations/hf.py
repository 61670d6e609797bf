"""Hugging Face ``transformers`` integration.

from steplens.producer.integrations.hf import SteplensCallback
trainer = Trainer(..., callbacks=[SteplensCallback(watch_every=50)])
"""

from __future__ import annotations

import os
import time
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from steplens.producer.integrations._common import monitor_for, numeric, split_eval
from steplens.producer.integrations.hf_schedule import trainer_schedule
from steplens.producer.integrations.step_loss import StepLoss
from steplens.producer.integrations.step_lr import StepLr

_STEP_KEYS = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm"}
_SKIP = {
    "epoch",
    "total_flos",
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_loss",
    "step",
}


class SteplensCallback(TrainerCallback):
    """Sends every optimizer step as a step, the Trainer's evaluations as eval records;
    optional watch().

    Every step carries its own loss, read from the model's outputs (``StepLoss``: the mean of
    its micro-batches as the Trainer counts it, kept on the device), whatever
    ``logging_steps`` is: the Trainer logs the mean of that many steps, in which one bad batch
    fades. A model whose output carries no loss (the Trainer computes it: label smoothing, a
    ``compute_loss_func``) sends the Trainer's logged loss at its logging steps instead. A
    logging step adds what the Trainer logged: the gradient norm, which the Trainer takes
    before clipping, as ``grad_norm`` and ``grad_norm_preclip``, with ``clipped`` when it
    exceeds ``args.max_grad_norm``, and any other number.

    The lr is the scheduler's after its step (``StepLr``: scaled where the step ran at another
    lr than its scheduler had set), not the Trainer's logged one: the Trainer numbers its
    steps from 1 and logs the lr step ``g`` used, the schedule's value at index ``g - 1`` (0.0
    at step 1 in a warmup), one step behind the declared schedule's convention (step ``s`` at
    index ``s``). A run that declared no schedule gets the Trainer's own, read from its
    arguments (``trainer_schedule``).

    Every checkpoint the Trainer saves is reported (``checkpoint``). With remedies
    (``init(remedies=[...])``) the advice is carried out after each optimizer step
    (``Monitor.act``, no collective): a rewind reloads a ``checkpoint-N`` folder into the
    model, optimizer and scheduler and, when ``train_dataset`` is a ``skipping()`` dataset,
    skips the next batches' samples; the Trainer's step count goes on (the run keeps its
    length). The loader reads one batch ahead: a rewind for ``at_step`` starts one step
    before, so the reload falls at the end of ``at_step`` on every rank.

    The input pipeline's wait is timed as the Trainer's loop allows: from the end of a step
    (or of its logging, evaluation and saving) to the start of the next, where the Trainer
    fetches the next batches; each step carries it as ``data_time_s``, and as ``step_time_s``
    the time from the end of the last step's work to the end of its own (the last step's log,
    evaluation or save, its wait, its work): its record is sent later, once the Trainer's log
    for it is in, so the time between two sends would hold the next step's wait, not its own."""

    def __init__(self, monitor: Any = None, watch_every: int | None = None, **init_kwargs: Any):
        self._monitor = monitor
        self._watch_every = watch_every
        self._init_kwargs = init_kwargs
        self._idle_since: float | None = None  # end of the last step, or of its log/eval/save
        self._waited: float | None = None  # seconds before this step's start
        self._ended: float | None = None  # the end of the last step's work
        self._losses = StepLoss()
        self._processes = 1  # the Trainer multiplies a token-averaged loss by this
        self._lr = StepLr()
        # the last step and its fields, sent once the Trainer's log for it (if any) is in
        self._pending: tuple[int, dict[str, Any]] | None = None

    def _mark(self) -> None:
        self._idle_since = time.perf_counter()

    def _send_pending(self) -> None:
        pending, self._pending = self._pending, None
        m = self._monitor
        if pending is not None and m is not None:
            step, fields = pending
            m.log_step(step, **fields)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._send_pending()
        if self._idle_since is not None:
            self._waited = time.perf_counter() - self._idle_since
            self._idle_since = None

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        try:
            self._monitor = monitor_for(self._monitor, self._init_kwargs)
            if self._watch_every and model is not None and optimizer is not None:
                limit = getattr(args, "max_grad_norm", None)
                self._monitor.watch(
                    model,
                    optimizer,
                    kwargs.get("lr_scheduler"),
                    every=self._watch_every,
                    max_grad_norm=limit if limit else None,
                )
            schedule = trainer_schedule(args, state.max_steps)
            if schedule is not None:
                self._monitor.declare_schedule(schedule)
            if model is not None:
                self._losses.attach(model)
            if getattr(args, "average_tokens_across_devices", False):
                self._processes = max(1, int(getattr(args, "world_size", 1) or 1))
            if optimizer is not None:
                self._lr.attach(optimizer, kwargs.get("lr_scheduler"))
            self._monitor.remedies.read_ahead = 1  # accelerate's loader reads one batch ahead
            ds: Any = getattr(kwargs.get("train_dataloader"), "dataset", None)
            if hasattr(ds, "items_per_batch"):  # a skipping() dataset of samples
                # an iterable dataset is read by one process for all (accelerate dispatches)
                world = max(1, int(getattr(args, "world_size", 1) or 1))
                per_rank = args.per_device_train_batch_size * args.gradient_accumulation_steps
                ds.items_per_batch = per_rank * world
        except Exception:  # never break training
            self._monitor = None

    def on_step_end(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        m = self._monitor
        if m is not None:
            now, ended = time.perf_counter(), self._ended
            fields = {
                "loss": self._losses.take(self._processes),
                "lr": self._lr.lr(),
                "data_time_s": self._waited,
                "step_time_s": None if ended is None else now - ended,
            }
            self._waited, self._ended = None, now
            self._send_pending()
            self._pending = (state.global_step, {k: v for k, v in fields.items() if v is not None})
            if m.config.remedies:
                scheduler = kwargs.get("lr_scheduler")
                m.act(state.global_step, model=model, optimizer=optimizer, scheduler=scheduler)
        self._mark()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        m = self._monitor
        if m is not None:
            name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            m.checkpoint(state.global_step, os.path.join(args.output_dir, name))
        self._mark()

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        m = self._monitor
        if m is None or not logs or any(k.startswith("eval_") for k in logs):
            return
        values = numeric({k: v for k, v in logs.items() if k not in _SKIP})
        named = {_STEP_KEYS[k]: values.pop(k) for k in list(values) if k in _STEP_KEYS}
        if not named and not values:  # the end-of-training summary
            return
        named.pop("lr", None)  # the scheduler's, taken at the step's end (on_step_end)
        norm = named.get("grad_norm")
        if norm is not None:  # the Trainer's norm is clip_grad_norm_'s: before clipping
            values["grad_norm_preclip"] = norm
            limit = getattr(args, "max_grad_norm", None)
            if limit:
                values["clipped"] = float(norm) > float(limit)
        pending = self._pending
        if pending is not None and pending[0] == state.global_step:
            fields = pending[1]
            if "loss" in fields:  # the step's own loss, not the mean of logging_steps
                named.pop("loss", None)
            fields.update(named)
            fields.update(values)
            self._send_pending()
        else:
            self._send_pending()
            m.log_step(state.global_step, **named, **values)
        self._mark()

    def on_evaluate(
        self,
        args: Any,
        state: Any,
        control: Any,
        metrics: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        m = self._monitor
        if m is None or not metrics:
            return
        named, extra = split_eval(
            {k: v for k, v in metrics.items() if not k.endswith(("_runtime", "_per_second"))},
            "eval_",
        )
        m.log_eval(state.global_step, split="eval", **named, **extra)
        self._mark()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._send_pending()
        self._losses.detach()
        self._lr.detach()
        if self._monitor is not None:
            self._monitor.remedies.close(state.global_step)
            self._monitor.flush(10.0)
