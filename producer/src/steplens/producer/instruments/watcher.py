"""watch(): optimizer-side statistics computed on the device, every N optimizer steps.

- gradient norm before clipping: taken at the end of the backward pass (a callback queued by a
  gradient hook), so it sees the accumulated gradients before any clipping;
- clipping: the gradient of the smallest parameter shrank between the end of the backward pass
  and ``optimizer.step()`` (clipping scales every gradient by the same factor): a few tiny
  reductions instead of a second full gradient norm (reported False when that gradient is 0);
- parameter L2 norm after the update;
- per-layer gradient and parameter norms (``layers``): one norm per parameter tensor, summed
  into its layer on the device; the global norms are the same sums, so the layers cost one
  reduction per tensor, as the global norms alone did;
- update ratio: share of a fixed random sample of parameter elements (bounded memory) whose
  change in this step exceeds ``update_threshold`` times the element's magnitude;
- the learning rate the step used: the first param group's (``group_lrs`` too when the groups
  differ); a scheduler's ``get_last_lr()`` only when the groups hold no ``lr``. The lr is read
  after every optimizer step, not only every ``every``: it is a host number, free to read.
Results stay on the device; they are captured without a host sync and ride on the next
``log_step``.
"""

from __future__ import annotations

from typing import Any, Protocol

from steplens.producer.instruments.layers import LayerGroups
from steplens.producer.pipeline import values as V

_CLIP_TOLERANCE = 1e-6  # relative drop of the norm that counts as clipping


class WatchResults(Protocol):
    """Where a Watcher's figures go (``watching.Watching``)."""

    def result(self, values: dict[str, Any]) -> None:
        """A watched step's figures, still on the device."""

    def between(self, values: dict[str, Any]) -> None:
        """Host numbers of a step between watched ones."""

    def failed(self) -> None:
        """A hook raised; it was caught."""


class Watcher:
    def __init__(  # noqa: PLR0917
        self,
        results: WatchResults,
        model: Any,
        optimizer: Any,
        scheduler: Any = None,
        every: int = 100,
        update_threshold: float = 1e-3,
        sample_size: int = 4096,
        max_grad_norm: float | None = None,
        layer_depth: int = 0,
    ) -> None:
        import torch

        self._torch = torch
        self.results = results
        # wrappers (accelerate's AcceleratedOptimizer, ...) keep the real one in .optimizer
        for _ in range(4):
            inner = getattr(optimizer, "optimizer", None)
            if inner is None or hasattr(optimizer, "_optimizer_step_pre_hooks"):
                break
            optimizer = inner
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.every = every
        self.update_threshold = update_threshold
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the model has no trainable parameters")
        self.params = [p for _, p in named]
        self.layers = LayerGroups([n for n, _ in named], layer_depth)
        device = self.params[0].device
        self._layer_index = torch.tensor(self.layers.index, device=device)
        self._zero = torch.zeros((), dtype=torch.float32, device=device)
        self._one_device = all(p.device == device for p in self.params)
        self.steps = 0
        self._preclip: Any = None  # (per-layer grad norms, total) at the end of backward
        self._queued = False
        self._before: Any = None
        self._postclip: Any = None  # the same at step time, only when no end-of-backward ran
        self._clipped: Any = None
        self._probe = min(self.params, key=lambda p: p.numel())  # clipping shows on it too
        self._probe_before: Any = None
        self._index = self._sample_index(sample_size)
        self._handles = [
            optimizer.register_step_pre_hook(self._before_step),
            optimizer.register_step_post_hook(self._after_step),
        ]
        # the first parameters get their gradients last in the backward pass
        if hasattr(self.params[0], "register_post_accumulate_grad_hook"):
            self._handles.append(self.params[0].register_post_accumulate_grad_hook(self._on_grad))

    def _sample_index(self, sample_size: int) -> list[Any]:
        """Per parameter, random flat indices; in all about ``sample_size`` elements."""
        torch = self._torch
        total = sum(p.numel() for p in self.params)
        gen = torch.Generator().manual_seed(0)
        out = []
        for p in self.params:
            k = min(p.numel(), max(1, round(sample_size * p.numel() / total)))
            idx = torch.randperm(p.numel(), generator=gen)[:k] if k < p.numel() else torch.arange(k)
            out.append(idx.to(p.device))
        return out

    @property
    def due(self) -> bool:
        return self.steps % self.every == 0

    def _norms(self, tensors: list[Any]) -> tuple[Any, Any, tuple[int, ...] | None] | None:
        """(per-layer L2 norms, total L2 norm, the layers that have a tensor or None for all)
        of one tensor or None per parameter, on the device; None when all are None."""
        torch = self._torch
        present = [t for t in tensors if t is not None]
        if not present:
            return None
        foreach = getattr(getattr(torch, "foreach", None), "norm", None)
        if foreach is not None:
            norms = list(foreach(present, ord=2, dtype=torch.float32))
        else:  # torch before torch.foreach: one reduction per tensor
            norms = [torch.linalg.vector_norm(t, dtype=torch.float32) for t in present]
        device = self._zero.device
        if len(norms) < len(tensors) or not self._one_device:
            found = iter(norms)
            norms = []
            for t in tensors:
                n = next(found) if t is not None else self._zero
                norms.append(n if n.device == device else n.to(device, non_blocking=True))
        squares = torch.stack(norms).square_()
        layers = torch.zeros(len(self.layers.names), dtype=torch.float32, device=device)
        layers.index_add_(0, self._layer_index, squares).sqrt_()
        which = None
        if len(present) < len(tensors):
            index = self.layers.index
            which = tuple(sorted({index[i] for i, t in enumerate(tensors) if t is not None}))
        return layers, squares.sum().sqrt(), which

    def _grad_norms(self) -> Any:
        return self._norms([None if p.grad is None else p.grad.detach() for p in self.params])

    def _gather(self) -> Any:
        torch = self._torch
        with torch.no_grad():
            # index_select: about twice as fast as advanced indexing on the CPU
            return torch.cat(
                [
                    p.detach().reshape(-1).index_select(0, idx)
                    for p, idx in zip(self.params, self._index, strict=True)
                ]
            ).float()

    # ----------------------------------------------------------------- hooks
    def _on_grad(self, _param: Any) -> None:
        if not self.due or self._queued:
            return
        try:
            engine = self._torch.autograd.Variable._execution_engine
            engine.queue_callback(self._end_of_backward)
            self._queued = True
        except Exception:
            self._preclip = None

    def _probe_size(self) -> Any:
        grad = self._probe.grad
        return None if grad is None else grad.detach().abs().sum()

    def _end_of_backward(self) -> None:
        self._queued = False
        try:
            with self._torch.no_grad():
                self._preclip = self._grad_norms()
                self._probe_before = self._probe_size()
        except Exception:
            self.results.failed()  # never into the training loop

    def _before_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if not self.due:
            return
        try:
            with self._torch.no_grad():
                if self._preclip is None:  # no end-of-backward hook ran: the norms now
                    self._postclip = self._grad_norms()
                elif self._probe_before is not None:
                    after = self._probe_size()
                    if after is not None:
                        self._clipped = after < self._probe_before * (1 - _CLIP_TOLERANCE)
                self._before = self._gather()
        except Exception:
            self.results.failed()  # never into the training loop

    def _after_step(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        try:
            if self.due:
                self._publish()
            else:
                self._step_lr()
        except Exception:
            self.results.failed()  # never into the training loop
        finally:
            self.steps += 1
            self._preclip = self._postclip = self._before = None
            self._probe_before = self._clipped = None

    def _lrs(self) -> tuple[Any, list[Any]]:
        """The step's lr, and every group's when they differ (or cannot be compared on the
        host without a sync: tensors)."""
        lrs = [g.get("lr") for g in self.optimizer.param_groups]
        lrs = [v for v in lrs if v is not None]
        if not lrs:
            if self.scheduler is not None and hasattr(self.scheduler, "get_last_lr"):
                last = self.scheduler.get_last_lr()
                return (last[0] if last else None), []
            return None, []
        plain = all(type(v) in V.PLAIN for v in lrs)
        if plain and all(v == lrs[0] for v in lrs):
            return lrs[0], []
        return lrs[0], lrs

    def _step_lr(self) -> None:
        """Between due steps, host numbers alone (no device work): the lr, so the schedule
        check sees every step's lr and not one in ``every``, and ``max_grad_norm``, so a step
        logged with its ``grad_norm`` says whether it was clipped."""
        lr, _ = self._lrs()
        between: dict[str, Any] = {}
        if lr is not None and type(lr) in V.PLAIN:  # a tensor lr: only on due steps
            between["lr"] = lr
        if self.max_grad_norm is not None:
            between["max_grad_norm"] = self.max_grad_norm
        if between:
            self.results.between(between)

    def _publish(self) -> None:
        torch = self._torch
        with torch.no_grad():
            grads = self._preclip if self._preclip is not None else self._postclip
            ratio = None
            if self._before is not None:
                change = (self._gather() - self._before).abs()
                moved = change > self._before.abs() * self.update_threshold
                ratio = moved.float().mean()
            params = self._norms([p.detach() for p in self.params])
        layer_params, param_norm, _ = params if params is not None else (None, None, None)
        layer_grads, pre, present = grads if grads is not None else (None, None, None)
        lr, lrs = self._lrs()
        # one capture: one event for every device copy of this step
        vals = V.capture(
            [pre, self._clipped, param_norm, ratio, layer_grads, layer_params, lr, *lrs]
        )
        self.results.result(
            {
                "grad_norm_preclip": vals[0],
                "clipped": vals[1],
                "param_norm": vals[2],
                "update_ratio": vals[3],
                "lr": vals[6],
                "group_lrs": vals[7:],
                "max_grad_norm": self.max_grad_norm,
                "layer_names": self.layers.names,
                "layer_grad_norms": vals[4],
                "layer_grad_present": present,
                "layer_param_norms": vals[5],
            }
        )

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
