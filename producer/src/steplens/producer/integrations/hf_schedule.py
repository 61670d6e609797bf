"""The lr schedule a Hugging Face Trainer will follow, read from its arguments, as a declared
schedule (``lr_schedule``), for a run that declared none: the schedule check, the update-ratio
floor and the advice bounds then know that a cosine or linear schedule ends at zero.

Only the Trainer's own schedules whose shape the declaration can say: ``constant``,
``constant_with_warmup``, ``linear``, ``cosine`` (half a cycle), ``cosine_with_min_lr`` and
``warmup_stable_decay`` (linear warmup). Any other (restarts, polynomial, inverse square root,
``reduce_lr_on_plateau``, a scheduler passed in) is not declared.
"""

from __future__ import annotations

from typing import Any


def trainer_schedule(args: Any, max_steps: int) -> dict[str, Any] | None:
    """The declared form of the schedule ``args`` (``TrainingArguments``) set up over
    ``max_steps`` optimizer steps, or None."""
    try:
        kind = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
        peak = float(args.learning_rate)
        total = int(max_steps)
        kwargs = dict(getattr(args, "lr_scheduler_kwargs", None) or {})
        warm = int(args.get_warmup_steps(total))
    except Exception:
        return None
    if total <= 0 or peak <= 0:
        return None
    if kind == "constant":
        return {"kind": "constant", "peak_lr": peak}
    if kind == "constant_with_warmup":
        return {"kind": "constant", "peak_lr": peak, "warmup_steps": warm}
    base = {"peak_lr": peak, "warmup_steps": warm, "total_steps": total, "min_lr": 0.0}
    if kind == "linear":
        return {"kind": "linear", **base}
    if kind in ("cosine", "cosine_with_min_lr"):
        if float(kwargs.get("num_cycles", 0.5)) != 0.5:
            return None
        if kind == "cosine_with_min_lr":
            if kwargs.get("min_lr") is not None:
                base["min_lr"] = float(kwargs["min_lr"])
            else:
                base["min_lr"] = peak * float(kwargs.get("min_lr_rate", 0.0))
        return {"kind": "cosine", **base}
    if kind == "warmup_stable_decay":
        return _wsd(kwargs, base, warm, total, peak)
    return None


def _wsd(
    kwargs: dict[str, Any], base: dict[str, Any], warm: int, total: int, peak: float
) -> dict[str, Any] | None:
    decay = kwargs.get("num_decay_steps")
    if decay is None or kwargs.get("warmup_type", "linear") != "linear":
        return None
    if float(kwargs.get("num_cycles", 0.5)) != 0.5:
        return None
    ratio = float(kwargs.get("min_lr_ratio", 0.0))
    if ratio and warm:  # its warmup starts at min_lr_ratio, the declared one at 0
        return None
    stable = kwargs.get("num_stable_steps")
    end = total if stable is None else warm + int(stable) + int(decay)
    return {
        **base,
        "kind": "wsd",
        "total_steps": end,
        "decay_steps": int(decay),
        "decay_type": str(kwargs.get("decay_type", "cosine")),
        "min_lr": peak * ratio,
    }
