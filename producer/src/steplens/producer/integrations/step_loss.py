"""The loss of every optimizer step, read from the model's own outputs, for a trainer that
logs only a mean over several steps (the Hugging Face Trainer's ``logging_steps``): a corrupted
batch raises its step's loss by a quarter, the mean of 50 steps by half a percent.

A forward hook (``torch.nn.Module.register_forward_hook``) keeps each training forward's loss
(the module in training mode; a mapping's ``"loss"`` or a ``.loss`` attribute, one element),
detached, on its device: no host sync. ``take()`` gives the step's loss as the Trainer counts
it and starts the next step: the mean of its micro-batches' losses, or their sum where the
forward was given ``num_items_in_batch`` (each micro-batch's loss is then already its share of
the step's tokens), times the number of processes where the Trainer averages tokens across
them. A trainer that hands each micro-batch's loss to a callback (Lightning) ``add``s it
itself, without the hook. A step keeps at most ``MAX_PARTS`` micro-batches (the rest counted
in ``dropped``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_PARTS = 1024


class StepLoss:
    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.shared = False  # the last forward got num_items_in_batch
        self.dropped = 0
        self._handle: Any = None

    def attach(self, model: Any) -> bool:
        """Hook ``model``'s forward; False where it cannot be hooked."""
        try:
            self._handle = model.register_forward_hook(self._on_forward, with_kwargs=True)
            return True
        except Exception:
            return False

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _on_forward(self, module: Any, _args: Any, kwargs: Any, output: Any) -> None:
        try:  # never into the training loop
            if not module.training:
                return
            is_map = isinstance(output, Mapping)
            loss = output.get("loss") if is_map else getattr(output, "loss", None)
            if loss is None or not hasattr(loss, "detach") or loss.numel() != 1:
                return
            self.add(loss.detach(), shared=kwargs.get("num_items_in_batch") is not None)
        except Exception:
            return

    def add(self, loss: Any, shared: bool) -> None:
        """One micro-batch's loss (detached); ``shared``: already its share of the step (the
        step's loss is then the sum), else the step's is the mean."""
        if len(self.parts) >= MAX_PARTS:
            self.dropped += 1
            return
        self.parts.append(loss)
        self.shared = shared

    def take(self, processes: int = 1) -> Any:
        """The step's loss (a 0-dim tensor on the loss's device), or None when no training
        forward returned one since the last call. ``processes``: the factor the Trainer
        multiplies a token-averaged loss by (``average_tokens_across_devices``)."""
        parts, self.parts = self.parts, []
        if not parts:
            return None
        import torch

        total = parts[0].float() if len(parts) == 1 else torch.stack(parts).float().sum()
        return total * processes if self.shared else total / len(parts)
