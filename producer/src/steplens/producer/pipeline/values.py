"""Turning what the caller hands over (numbers, 0-dim tensors, CUDA tensors) into floats.

The caller's thread only *captures*: a CUDA tensor is copied to pinned host memory with
``non_blocking=True`` and one CUDA event is recorded after the copies; a CPU tensor is detached.
The worker *resolves* once the event has completed, so the caller never waits on the device.
"""

from __future__ import annotations

import math
import sys
from typing import Any

PLAIN: frozenset[type] = frozenset({float, int, bool, type(None)})


class DeviceCopy:
    """A device value on its way to the host: ready when ``event`` has completed."""

    __slots__ = ("event", "host")

    def __init__(self, host: Any, event: Any) -> None:
        self.host = host
        self.event = event

    def ready(self) -> bool:
        return bool(self.event.query())


class BadValue(ValueError):
    """A value that is not a number (counted, never raised into the caller)."""


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def capture(values: list[Any]) -> list[Any]:
    """Capture in place the non-plain values of ``values`` (caller's thread, no host sync)."""
    torch = sys.modules.get("torch")
    event_needed = False
    for i, v in enumerate(values):
        if type(v) in PLAIN or torch is None or not isinstance(v, torch.Tensor):
            continue
        t = v.detach()
        if t.is_cuda:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
            values[i] = DeviceCopy(host, None)
            event_needed = True
        else:
            values[i] = t
    if event_needed:
        assert torch is not None
        event = torch.cuda.Event()
        event.record()
        for v in values:
            if isinstance(v, DeviceCopy) and v.event is None:
                v.event = event
    return values


def ready(value: Any) -> bool:
    return not isinstance(value, DeviceCopy) or value.ready()


def host_value(value: Any) -> Any:
    """The host-side object behind a captured value (a CPU tensor for a device copy)."""
    return value.host if isinstance(value, DeviceCopy) else value


def to_float(value: Any) -> float:
    """A float from a number, numpy scalar or one-element tensor; raises BadValue otherwise."""
    value = host_value(value)
    if type(value) is float:
        return value
    if isinstance(value, (int, float)):  # bool and int
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if _is_tensor(value):
        if value.numel() != 1:
            raise BadValue(f"tensor with {value.numel()} elements is not a scalar")
        return float(value.item())
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise BadValue(f"{type(value).__name__} is not a number")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadValue(str(exc)) from None


def to_int(value: Any) -> int:
    """An int in the 64-bit range from an integral number or tensor; raises BadValue otherwise."""
    value = host_value(value)
    if type(value) is int:
        out = value
    elif _is_tensor(value) and value.numel() == 1:
        out = value.item()
    elif isinstance(value, (bool, str, bytes)):
        raise BadValue(f"{type(value).__name__} is not an integer")
    elif hasattr(value, "__index__"):
        out = value.__index__()
    else:
        f = to_float(value)
        if not math.isfinite(f) or f != int(f):
            raise BadValue(f"{value!r} is not an integer")
        out = int(f)
    if not isinstance(out, int) or isinstance(out, bool):  # e.g. a float tensor's item()
        f = to_float(out)
        if not math.isfinite(f) or f != int(f):
            raise BadValue(f"{value!r} is not an integer")
        out = int(f)
    if abs(out) >= 1 << 63:
        raise BadValue("integer out of the 64-bit range")
    return out
