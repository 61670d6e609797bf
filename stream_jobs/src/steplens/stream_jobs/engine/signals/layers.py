"""Per-layer attribution: which layers moved when the global gradient norm or the parameter norm
misbehaves.

``watch`` sends each layer's gradient and parameter norm at its interval (``layer_grad_norms``,
``layer_param_norms``; the layers that changed most when there are many). Each rank keeps, per
layer, its last two norms and the step of the last; a breach of a gradient-norm or
parameter-norm rule names the layers of the latest map by how much their norm changed
(``now / before``, the largest change either way first; a non-finite norm first of all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

FIELDS = {"layer_grad_norms": "grad", "layer_param_norms": "param"}
# rule -> the map its breaches read
RULES = {
    **{
        f"{name}:{metric}": "layer_grad_norms"
        for name in ("spike", "vanishing", "nonfinite")
        for metric in ("grad_norm", "grad_norm_preclip")
    },
    "training:param_norm": "layer_param_norms",
    "nonfinite:param_norm": "layer_param_norms",
}


@dataclass
class LayersConfig:
    max_layers: int = 512  # layers followed per map (bounded under abuse); others are counted
    top: int = 5  # layers named in a breach's evidence
    max_age: int = 1000  # a map older than this many steps before the breach is not named


@dataclass
class LayersState:
    # map field -> layer -> [norm before, norm now, step of now]
    norms: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    latest: dict[str, int] = field(default_factory=dict)  # map field -> step of its last map
    dropped: int = 0  # layers past ``max_layers``


def keep(state: LayersState, cfg: LayersConfig, step: int | None, data: dict[str, Any]) -> None:
    """One step's layer maps (a step entry's fields)."""
    if step is None:
        return
    for name in FIELDS:
        got = data.get(name)
        if not isinstance(got, dict) or not got:
            continue
        norms = state.norms.setdefault(name, {})
        for layer, x in got.items():
            if not isinstance(x, (int, float)) or isinstance(x, bool):
                continue
            seen = norms.get(layer)
            if seen is None:
                if len(norms) >= cfg.max_layers:
                    state.dropped += 1
                    continue
                norms[layer] = [math.nan, float(x), step]
            else:
                seen[0], seen[1], seen[2] = seen[1], float(x), step
        state.latest[name] = step


def names(
    state: LayersState, cfg: LayersConfig, rule: str, step: int | None, detail: dict[str, Any]
) -> dict[str, Any] | None:
    """The layers of the latest map of the rule's kind, by change: ``{"layers": [{layer,
    before, now, ratio}], "layers_step": step}``; None without a recent map."""
    name = RULES.get(rule)
    if name is None or name not in state.latest:
        return None
    latest = state.latest[name]
    if step is not None and not latest <= step <= latest + cfg.max_age:
        return None
    moved = []
    for layer, (before, now, at) in state.norms.get(name, {}).items():
        if at != latest:
            continue
        if not math.isfinite(now):
            order = math.inf
            ratio = math.nan
        elif before > 0 and now > 0:
            ratio = now / before
            order = abs(math.log(ratio))
        else:
            ratio = math.nan if math.isnan(before) else (math.inf if now > 0 else 0.0)
            order = -1.0 if math.isnan(before) else math.inf
        moved.append((order, layer, before, now, ratio))
    if not moved:
        return None
    moved.sort(key=lambda m: (-m[0], m[1]))
    top = [
        {"layer": layer, "before": _num(before), "now": _num(now), "ratio": _num(ratio)}
        for _, layer, before, now, ratio in moved[: cfg.top]
    ]
    return {"layers": top, "layers_step": latest}


def _num(x: float) -> float | None:
    """A norm or ratio for the evidence (None: not known)."""
    return None if math.isnan(x) else round(x, 6) if math.isfinite(x) else x
