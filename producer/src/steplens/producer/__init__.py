"""steplens producer: training and hardware telemetry from every rank, never in the way.

    import steplens.producer as sl

    sl.init(run_id="llama-7b-run3", flops_per_token=6 * n_params, peak_flops=989e12)
    sl.watch(model, optimizer, scheduler, every=10, max_grad_norm=1.0)
    for step, batch in enumerate(sl.timed(loader)):  # data wait; lengths, duplicates
        loss = model(**batch).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
        sl.log_step(step, loss=loss, grad_norm=grad_norm, tokens=batch["input_ids"].numel())
    sl.shutdown()

With ``init(remedies=["profile", "skip_samples", "rewind", "lower_lr"])`` (``profile`` alone by
default: ``log_step`` records the trace itself) the stream jobs may advise the run's ranks; the
loop reads the advice at a step boundary, without waiting, and says what it did::

    for advice in sl.advice():  # sl.Advice: .action, .fingerprint, .step, the payload
        ...
        sl.acted(advice, "acted", detail="reloaded ckpt-900")
    sl.checkpoint(step, path)  # a checkpoint a rewind may name

Every function here is safe to call before ``init`` or after ``shutdown`` (it does nothing and
counts the call) and never raises into the training loop; only ``init`` raises ``ValueError`` for
an invalid keyword. Settings: keyword first, then ``STEPLENS_<NAME>``, then the default.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from steplens.producer.advice_inbox import Advice
    from steplens.producer.monitor import Monitor
    from steplens.producer.transport import MemoryTransport

__all__ = [
    "Advice",
    "MemoryTransport",
    "Monitor",
    "act",
    "acted",
    "advice",
    "checkpoint",
    "flush",
    "get_monitor",
    "init",
    "log_batch",
    "log_eval",
    "log_step",
    "probe_comm",
    "shutdown",
    "skipping",
    "timed",
    "watch",
]

_monitor: Monitor | None = None
calls_without_monitor = 0  # calls made before init or after shutdown


def __getattr__(name: str) -> Any:  # lazy: `import steplens.producer` stays cheap
    if name == "Monitor":
        from steplens.producer.monitor import Monitor

        return Monitor
    if name == "Advice":
        from steplens.producer.advice_inbox import Advice

        return Advice
    if name == "MemoryTransport":
        from steplens.producer.transport import MemoryTransport

        return MemoryTransport
    raise AttributeError(f"module 'steplens.producer' has no attribute {name!r}")


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
    global _monitor
    m, _monitor = _monitor, None
    if m is None:
        return _missing()
    m.shutdown(timeout_s)
    return None
