"""The lr an optimizer step ran at, as the trainer callbacks send it.

The trainers step their scheduler before the callback sees the step, so the lr the callback
reads is the next step's: the scheduler's ``get_last_lr()``, PyTorch's convention, which the
schedule check allows for (a step's lr may be its neighbour's). When the step itself ran at
another lr than its scheduler had set (something changed the optimizer's lr outside the
scheduler, as a bug would), the lr sent is scaled by the same factor: a hook before each
optimizer step (``register_step_pre_hook``) compares the two, host numbers only. Without a
scheduler the optimizer's own lr is sent.
"""

from __future__ import annotations

from typing import Any

from steplens.producer.remedies.lower_lr import unwrap_optimizer


def scheduled_lr(scheduler: Any) -> float | None:
    """The first group's lr a scheduler holds now (a host number), or None."""
    try:
        last = scheduler.get_last_lr() if scheduler is not None else None
        return float(last[0]) if last else None
    except Exception:  # a scheduler that has not stepped yet, or none of torch's
        return None


class StepLr:
    def __init__(self) -> None:
        self.ratio = 1.0  # the lr the last step ran at over the one its scheduler had set
        self._optimizer: Any = None
        self._scheduler: Any = None
        self._handle: Any = None

    def attach(self, optimizer: Any, scheduler: Any) -> None:
        self._optimizer = unwrap_optimizer(optimizer)
        self._scheduler = scheduler
        try:
            self._handle = self._optimizer.register_step_pre_hook(self._before_step)
        except Exception:  # an optimizer without hooks: the scheduler's lr alone
            self._handle = None

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _before_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        try:  # never into the training loop
            used = optimizer.param_groups[0].get("lr")
            planned = scheduled_lr(self._scheduler)
            ok = isinstance(used, (int, float)) and planned
            self.ratio = float(used) / planned if ok else 1.0  # type: ignore[operator]
        except Exception:
            self.ratio = 1.0

    def lr(self) -> float | None:
        """The lr to send for the step just ended (after its scheduler's step)."""
        planned = scheduled_lr(self._scheduler)
        if planned is not None:
            return planned * self.ratio
        try:
            lr = self._optimizer.param_groups[0].get("lr")
        except Exception:
            return None
        return float(lr) if isinstance(lr, (int, float)) else None
