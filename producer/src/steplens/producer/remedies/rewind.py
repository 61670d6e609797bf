"""Reloading a checkpoint the run reported, for a rewind.

What a checkpoint path holds decides how it is read, unless the caller gives its own ``load``:

- a file ``torch.save`` wrote: a dict with ``model`` (or ``state_dict``, Lightning's) and
  optionally ``optimizer`` (``optimizer_states``: Lightning's list) and ``scheduler``
  (``lr_schedulers``), or a bare model ``state_dict``;
- a Hugging Face Trainer checkpoint folder (``checkpoint-N``): the model's weights
  (``model.safetensors`` or ``pytorch_model.bin``, sharded ones through ``transformers``'s
  loader), ``optimizer.pt`` and ``scheduler.pt``.

Files are read onto the CPU (``map_location="cpu"``) and loaded into the live objects, which
copy them to their devices. ``weights_only=True`` where torch has it: a checkpoint is data.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from steplens.producer.remedies.lower_lr import unwrap_optimizer

_MODEL_FILES = ("model.safetensors", "pytorch_model.bin")


def _torch_load(path: str) -> Any:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except TypeError:  # a torch without weights_only
        return torch.load(path, map_location="cpu")


def _first(state: dict[str, Any], *names: str) -> Any:
    for n in names:
        if n in state:
            v = state[n]
            return v[0] if isinstance(v, list) and v else v
    return None


def _load_folder(path: str, model: Any) -> dict[str, Any]:
    """A Trainer checkpoint folder as ``{"model": ..., "optimizer": ..., "scheduler": ...}``;
    sharded weights are loaded into ``model`` here (``"model"`` then stays absent)."""
    out: dict[str, Any] = {}
    weights = [f for f in _MODEL_FILES if os.path.exists(os.path.join(path, f))]
    if weights and weights[0].endswith(".safetensors"):
        from safetensors.torch import load_file

        out["model"] = load_file(os.path.join(path, weights[0]), device="cpu")
    elif weights:
        out["model"] = _torch_load(os.path.join(path, weights[0]))
    else:  # sharded, with an index
        from transformers.modeling_utils import load_sharded_checkpoint

        load_sharded_checkpoint(model, path)
        out["sharded"] = True
    for name in ("optimizer", "scheduler"):
        f = os.path.join(path, f"{name}.pt")
        if os.path.exists(f):
            out[name] = _torch_load(f)
    return out


def _load_weights(model: Any, weights: dict[str, Any]) -> None:
    """``model.load_state_dict(weights)``, where a weight missing from the file is allowed
    only when it shares its storage with one that is there (tied weights, which a
    ``safetensors`` file keeps once)."""
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected:
        raise ValueError(f"unexpected weights in the checkpoint: {unexpected[:5]}")
    if missing:
        params = model.state_dict(keep_vars=True)
        loaded = {params[k].data_ptr() for k in weights if k in params}
        untied = [k for k in missing if params[k].data_ptr() not in loaded]
        if untied:
            raise ValueError(f"weights missing from the checkpoint: {untied[:5]}")


def reload(
    path: str,
    model: Any,
    optimizer: Any = None,
    scheduler: Any = None,
    load: Callable[[str], Any] | None = None,
) -> str:
    """Load the checkpoint at ``path`` into the live objects; returns what was restored.
    ``load(path)`` replaces all of it when given. Raises when the checkpoint cannot be read."""
    if load is not None:
        load(path)
        return "restored by the run's load()"
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    state = _load_folder(path, model) if os.path.isdir(path) else _torch_load(path)
    restored = []
    if isinstance(state, dict) and not any(
        k in state for k in ("model", "state_dict", "optimizer", "optimizer_states")
    ):
        state = {"model": state}  # a bare state_dict
    weights = _first(state, "model", "state_dict")
    if weights is not None and model is not None:
        _load_weights(model, weights)
        restored.append("model")
    elif state.get("sharded"):
        restored.append("model")  # loaded by _load_folder
    opt_state = _first(state, "optimizer", "optimizer_states")
    if opt_state is not None and optimizer is not None:
        unwrap_optimizer(optimizer).load_state_dict(opt_state)
        restored.append("optimizer")
    sched_state = _first(state, "scheduler", "lr_schedulers")
    if sched_state is not None and scheduler is not None:
        scheduler.load_state_dict(sched_state)
        restored.append("scheduler")
    if not restored:
        raise ValueError(f"{path}: nothing to restore")
    return "restored " + ", ".join(restored)
