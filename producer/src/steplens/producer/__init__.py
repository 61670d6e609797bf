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

from typing import TYPE_CHECKING, Any

from steplens.producer import api
from steplens.producer.api import (
    act,
    acted,
    advice,
    checkpoint,
    flush,
    get_monitor,
    init,
    log_batch,
    log_eval,
    log_step,
    probe_comm,
    shutdown,
    skipping,
    timed,
    watch,
)

if TYPE_CHECKING:
    from steplens.producer.delivery.transport import MemoryTransport
    from steplens.producer.monitor import Monitor
    from steplens.producer.remedies.advice_inbox import Advice

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


def __getattr__(name: str) -> Any:  # lazy: `import steplens.producer` stays cheap
    if name == "Monitor":
        from steplens.producer.monitor import Monitor

        return Monitor
    if name == "Advice":
        from steplens.producer.remedies.advice_inbox import Advice

        return Advice
    if name == "MemoryTransport":
        from steplens.producer.delivery.transport import MemoryTransport

        return MemoryTransport
    if name == "calls_without_monitor":  # the facade's count, as it is now
        return api.calls_without_monitor
    raise AttributeError(f"module 'steplens.producer' has no attribute {name!r}")
