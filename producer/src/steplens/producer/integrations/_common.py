"""What both integrations share: picking the Monitor and splitting logged metrics."""

from __future__ import annotations

import numbers
from typing import Any

import steplens.producer as sl

EVAL_FIELDS = ("loss", "perplexity", "accuracy", "f1", "bleu", "rouge")


def monitor_for(monitor: Any, init_kwargs: dict[str, Any]) -> Any:
    """The given Monitor, else the running one, else a new one from ``init_kwargs``."""
    if monitor is not None:
        return monitor
    return sl.get_monitor() or sl.init(**init_kwargs)


def numeric(items: dict[str, Any]) -> dict[str, Any]:
    """Numbers and one-element tensors only (other logged values are ignored)."""
    out: dict[str, Any] = {}
    for k, v in items.items():
        if isinstance(v, numbers.Number) and not isinstance(v, bool):
            out[k] = v
        elif hasattr(v, "numel") and v.numel() == 1:
            out[k] = v.detach()
    return out


def split_eval(metrics: dict[str, Any], prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``eval_loss`` -> loss=..., other ``eval_*`` numbers -> extras."""
    named: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in numeric(metrics).items():
        name = k[len(prefix) :] if k.startswith(prefix) else k
        (named if name in EVAL_FIELDS else extra)[name] = v
    return named, extra
