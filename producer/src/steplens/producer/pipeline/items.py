"""What the caller's side hands the worker: one named tuple per call, in a bounded deque.

Values are as the caller gave them or as ``values.capture`` left them (a device copy on its
way to the host); the worker resolves them. ``t_ns`` is the caller's monotonic clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

# The caller's hot path builds a StepItem with tuple.__new__ (one C call, no Python frame):
# the fields must stay in this order.
new_item: Callable[..., Any] = tuple.__new__


class StepItem(NamedTuple):
    step: Any
    t_ns: int
    loss: Any
    lr: Any
    grad_norm: Any
    tokens: Any
    scalars: dict[str, Any] | None
    data_ns: int | None  # time spent in a timed DataLoader since the last step
    watch: dict[str, Any] | None  # a Watcher's result for this step


class EvalItem(NamedTuple):
    step: Any
    t_ns: int
    split: Any
    metrics: dict[str, Any]  # the named metrics, then the extras
    n_named: int  # how many of ``metrics`` are the eval kind's own fields
    texts: tuple[list[Any], list[Any]] | None = None  # (predictions, references) to score


class BatchItem(NamedTuple):
    step: Any
    t_ns: int
    input_ids: Any
    attention_mask: Any
    labels: Any
    max_len: Any
    sample_ids: Any = None
    epoch: Any = None
    task: Any = None
    ignore_index: Any = -100


class HwItem(NamedTuple):
    t_ns: int
    data: dict[str, Any]


class CommItem(NamedTuple):
    step: int | None  # None: the DDP all-reduce's timing, taken outside log_step
    t_ns: int
    data: dict[str, Any]
    pending: Any  # a probe's result still on the device, or None


class MetaItem(NamedTuple):
    t_ns: int
    data: dict[str, Any]


class RecordItem(NamedTuple):
    """A record the caller composed itself (``acted``, ``checkpoint``): sent as it is."""

    kind: str
    step: Any  # None: the last step logged
    t_ns: int
    data: dict[str, Any]


class FlushItem(NamedTuple):
    done: Any  # threading.Event set once handled
    deadline: float  # monotonic
    result: list[bool]
    ending: bool = False  # the process ends: stop once Kafka does not answer (Delivery.flush)


Item = StepItem | EvalItem | BatchItem | HwItem | CommItem | MetaItem | RecordItem | FlushItem
