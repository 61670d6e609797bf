"""Per-layer norms for ``watch()``: which parameters make a layer, and which layers a record
carries. Pure (no torch): the norms themselves are computed on the device by the watcher.

A layer is a group of parameters named alike. By default it is the parameter's name up to its
first numeric part, the block index of a stack of layers (``model.layers.7.mlp.up.weight`` ->
``model.layers.7``), else its owning module (``model.embed_tokens.weight`` ->
``model.embed_tokens``); with ``depth`` > 0 it is the first ``depth`` parts of the owning
module's name. A model with more than ``MAX_GROUPS`` such groups is grouped coarser (fewer
parts) until it has at most that many: the names a run stores stay bounded.

A record carries every layer when there are at most ``max_layers``, else the ``max_layers``
layers whose norms changed most, relative to the values last sent for them (a layer never
sent comes first; a non-finite norm is always among them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from steplens.schema import MAX_NAME_LEN

MAX_GROUPS = 512


def layer_of(name: str, depth: int = 0) -> str:
    """The layer a parameter named ``name`` belongs to (see the module's docstring)."""
    parts = name.split(".")
    module = parts[:-1] or parts  # a parameter of the root module is its own layer
    if depth > 0:
        return ".".join(module[:depth])[:MAX_NAME_LEN]
    for i, part in enumerate(module):
        if part.isdigit():
            return ".".join(module[: i + 1])[:MAX_NAME_LEN]
    return ".".join(module)[:MAX_NAME_LEN]


class LayerGroups:
    """The layers of a list of parameter names: ``names`` (in first-seen order) and, per
    parameter, the index of its layer (``index``)."""

    def __init__(self, param_names: Sequence[str], depth: int = 0) -> None:
        groups = [layer_of(n, depth) for n in param_names]
        deepest = max((g.count(".") + 1 for g in groups), default=1)
        while len(set(groups)) > MAX_GROUPS and deepest > 1:
            deepest -= 1
            groups = [".".join(g.split(".")[:deepest]) for g in groups]
        self.names: tuple[str, ...] = tuple(dict.fromkeys(groups))
        position = {g: i for i, g in enumerate(self.names)}
        self.index: list[int] = [position[g] for g in groups]


def _change(new: float, old: float | None) -> float:
    if old is None or not math.isfinite(new):
        return math.inf
    if not math.isfinite(old):
        return math.inf
    return abs(new - old) / max(abs(old), 1e-30)


class LayerPicker:
    """Which layers a record carries; remembers what it sent (``max_layers`` per record)."""

    def __init__(self, max_layers: int) -> None:
        self.max_layers = max_layers
        self.sent: dict[str, tuple[float | None, float | None]] = {}

    def pick(
        self, names: Sequence[str], grads: Sequence[float | None], params: Sequence[float | None]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """(grad norms, parameter norms) by layer name; ``None`` where a layer has none."""
        order = list(range(len(names)))
        if len(order) > self.max_layers:
            sent = self.sent

            def score(i: int) -> float:
                old_g, old_p = sent.get(names[i], (None, None))
                g, p = grads[i], params[i]
                a = _change(g, old_g) if g is not None else 0.0
                b = _change(p, old_p) if p is not None else 0.0
                return max(a, b)

            order = sorted(order, key=score, reverse=True)[: self.max_layers]
            order.sort()
        out_g: dict[str, float] = {}
        out_p: dict[str, float] = {}
        for i in order:
            name, g, p = names[i], grads[i], params[i]
            if g is not None:
                out_g[name] = g
            if p is not None:
                out_p[name] = p
            old_g, old_p = self.sent.get(name, (None, None))
            self.sent[name] = (g if g is not None else old_g, p if p is not None else old_p)
        return out_g, out_p
