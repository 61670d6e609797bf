"""The functions a training loop calls: ``steplens.producer`` re-exports them (``import
steplens.producer as sl``). Each hands the call to the process's Monitor (``init``), or
counts it and does nothing before ``init`` and after ``shutdown``; none raises into the
loop (``init`` alone raises ``ValueError`` for an invalid keyword)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from steplens.producer.monitor import Monitor
    from steplens.producer.remedies.advice_inbox import Advice


_monitor: Monitor | None = None
calls_without_monitor = 0  # calls made before init or after shutdown


def init(run_id: str | None = None, **config: Any) -> Monitor:
    """Start telemetry for this process (replacing a running one) and return its Monitor."""
    global _monitor
    from steplens.producer.monitor import Monitor

    if _monitor is not None:
        _monitor.shutdown()
    _monitor = Monitor(run_id, **config)
    if calls_without_monitor:
        _monitor.errors["not_running"] = calls_without_monitor
    return _monitor


def get_monitor() -> Monitor | None:
    return _monitor


def _missing() -> None:
    global calls_without_monitor
    calls_without_monitor += 1


def log_step(
    step: int,
    loss: Any = None,
    lr: Any = None,
    grad_norm: Any = None,
    tokens: Any = None,
    **scalars: Any,
) -> None:
    """One training step (see ``Monitor.log_step``)."""
    m = _monitor
    if m is None:
        return _missing()
    m.record_step(step, loss, lr, grad_norm, tokens, scalars)  # the scalars dict, not re-packed
    return None


def log_eval(step: int, split: str = "val", **metrics: Any) -> None:
    """One split's evaluation (see ``Monitor.log_eval``: ``predictions``/``references``)."""
    m = _monitor
    if m is None:
        return _missing()
    m.log_eval(step, split, **metrics)
    return None


def log_batch(
    step: int,
    input_ids: Any,
    attention_mask: Any = None,
    labels: Any = None,
    max_len: int | None = None,
    **options: Any,
) -> None:
    """One batch's data quality (see ``Monitor.log_batch``: ``sample_ids``, ``epoch``,
    ``task``, ``ignore_index``)."""
    m = _monitor
    if m is None:
        return _missing()
    m.log_batch(step, input_ids, attention_mask, labels, max_len, **options)
    return None


def watch(
    model: Any,
    optimizer: Any,
    scheduler: Any = None,
    every: int = 100,
    max_grad_norm: float | None = None,
) -> None:
    m = _monitor
    if m is None:
        return _missing()
    m.watch(model, optimizer, scheduler, every, max_grad_norm)
    return None


def skipping(iterable: Iterable[Any], ids: Any = None) -> Any:
    """Wrap a DataLoader, sampler or dataset so the samples a remedy names, and a rewind's
    batches, are skipped (see ``Monitor.skipping``; plain iteration without init)."""
    m = _monitor
    if m is None:
        return iterable
    return m.skipping(iterable, ids)


def act(step: int, **targets: Any) -> int:
    """Carry out the advice that arrived (see ``Monitor.act``); the step the model is at."""
    m = _monitor
    if m is None:
        _missing()
        return step
    return m.act(step, **targets) if targets else m.act(step)  # no empty dict passed on


def probe_comm(every: int = 100) -> None:
    m = _monitor
    if m is None:
        return _missing()
    m.probe_comm(every)
    return None


def timed(iterable: Iterable[Any]) -> Iterator[Any]:
    """Wrap a DataLoader so its waiting time becomes data_time_s (plain iteration without init)."""
    m = _monitor
    if m is None:
        return iter(iterable)
    return m.timed(iterable)


def advice() -> tuple[Advice, ...]:
    """The advice that arrived since the last call (see ``Monitor.advice``); never waits."""
    m = _monitor
    if m is None:
        _missing()
        return ()
    return m.advice()


def acted(advice: Advice, outcome: str, detail: str | None = None, step: int | None = None) -> None:
    """What this rank did with ``advice`` (see ``Monitor.acted``)."""
    m = _monitor
    if m is None:
        return _missing()
    m.acted(advice, outcome, detail, step)
    return None


def checkpoint(step: int, path: Any) -> None:
    """A checkpoint saved at ``path`` (see ``Monitor.checkpoint``)."""
    m = _monitor
    if m is None:
        return _missing()
    m.checkpoint(step, path)
    return None


def flush(timeout_s: float = 10.0) -> bool:
    m = _monitor
    if m is None:
        _missing()
        return False
    return m.flush(timeout_s)


def shutdown(timeout_s: float | None = None) -> None:
    """Send what is left (the last window too) and stop; also done at exit and at an exit
    signal (``exit_signals``), within ``shutdown_timeout_s``."""
    global _monitor
    m, _monitor = _monitor, None
    if m is None:
        return _missing()
    m.shutdown(timeout_s)
    return None
