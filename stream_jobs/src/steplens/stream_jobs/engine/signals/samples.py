"""The batch behind a spike: each rank's recent ``batch`` records (their sample hashes, the
user's sample ids, lengths), so a loss or gradient spike on a rank names the samples of that
step on that rank in its evidence.

Bounded: the last ``steps`` steps per rank, at most ``max_samples`` hashes and ids of each (the
batch's sample count says how many there were); a step's several batch records (gradient
accumulation) are one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

RULES = frozenset(
    f"{name}:{metric}"
    for name in ("spike", "nonfinite")
    for metric in ("loss", "grad_norm", "grad_norm_preclip")
)
# the batch's lengths (its histogram too) and epoch, as sent
_LENGTHS = (
    "length_mean",
    "length_max",
    "max_len",
    "over_length",
    "length_edges",
    "length_counts",
    "epoch",
)


@dataclass
class SamplesConfig:
    steps: int = 64  # steps kept per rank
    max_samples: int = 32  # hashes and ids kept per step
    max_id_chars: int = 128


@dataclass
class SamplesState:
    # oldest first: {"step", "n_samples", "hashes", "ids", and the lengths when sent}
    batches: deque[dict[str, Any]] = field(default_factory=deque)


def keep(state: SamplesState, cfg: SamplesConfig, step: int | None, data: dict[str, Any]) -> None:
    """One ``batch`` record's samples."""
    if step is None:
        return
    batches = state.batches
    last = _find(state, step)
    if last is None:
        last = {"step": step, "n_samples": 0, "hashes": [], "ids": []}
        batches.append(last)
        while len(batches) > cfg.steps:
            batches.popleft()
    last["n_samples"] += int(data.get("n_samples") or 0)
    cap = cfg.max_samples
    for name, src in (("hashes", "sample_hashes"), ("ids", "sample_ids")):
        room = cap - len(last[name])
        got = data.get(src)
        if room > 0 and got:
            last[name] += [str(v)[: cfg.max_id_chars] for v in got[:room]]
    for name in _LENGTHS:
        if data.get(name) is not None:
            last[name] = data[name]


def _find(state: SamplesState, step: int) -> dict[str, Any] | None:
    for b in reversed(state.batches):
        if b["step"] == step:
            return b
    return None


def names(
    state: SamplesState, cfg: SamplesConfig, rule: str, step: int | None, detail: dict[str, Any]
) -> dict[str, Any] | None:
    """``{"samples": ...}``: the batch of ``step`` on this rank, or None when not kept."""
    if rule not in RULES or step is None:
        return None
    got = _find(state, step)
    if got is None:
        return None
    out = {k: v for k, v in got.items() if k not in ("hashes", "ids") or v}
    return {"samples": out}
