"""Steps in the worker: enrich (values resolved, step time, throughput, MFU, watch() fields),
then window, sample and guard, or, in full resolution, batch every step.

A step the guard flags leaves at once (raw, or its batch sent) when a rank the stream jobs
follow flagged it, or any rank flagged what is judged from every rank (``followed_ranks``); a
finite spike of a rank past the followed ones stays in its window, or waits for its batch.

Pure of threads and I/O: ``StepStage.add`` takes a resolved ``StepItem`` and hands records to
the ``Sender``. Bad values are dropped and counted one by one; the step is kept.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from steplens.producer.config import ProducerConfig
from steplens.producer.instruments.layers import LayerPicker
from steplens.producer.pipeline import values as V
from steplens.producer.pipeline.items import StepItem
from steplens.producer.pipeline.sender import Sender
from steplens.producer.pipeline.step_batch import StepBatch
from steplens.producer.pipeline.window import Guard, Window, is_sampled, sample_period
from steplens.schema import valid_name
from steplens.schema.followed_ranks import FOLLOWED_RANKS, sends_at_once
from steplens.schema.log_limit import LimitedLog

log = logging.getLogger("steplens")

# Step fields a caller may also pass as keyword scalars (a framework callback's pre-clip norm
# and clipping); the caller's value wins over a measured or watched one.
_PROMOTED = frozenset(
    ("step_time_s", "data_time_s", "tokens_per_s", "mfu", "grad_norm_preclip", "clipped")
)
_MAX_STEP = (1 << 63) - 1
_WATCHED = ("grad_norm_preclip", "param_norm", "update_ratio", "lr")
_NOT_SERIES = frozenset(("group_lrs", "layer_grad_norms", "layer_param_norms"))
_BETWEEN = frozenset(("lr", "max_grad_norm"))  # what watch() sends between its due steps


class Counters:
    """Errors of the worker by name (bad values, bad names, exceptions), and the warnings
    about what the caller got wrong: one per reason, later ones only counted (in health)."""

    def __init__(self) -> None:
        self.errors: dict[str, int] = {}
        self.notices = LimitedLog(log, interval_s=math.inf)

    def error(self, name: str) -> None:
        self.errors[name] = self.errors.get(name, 0) + 1

    def notice(self, reason: str, message: str, *args: Any) -> None:
        """Warn about ``reason`` the first time only."""
        self.notices.warning(reason, "steplens: " + message + " (counted in health)", *args)

    def float_or_none(self, v: Any) -> float | None:
        try:
            return V.to_float(v)
        except V.BadValue as exc:
            self.error("bad_value")
            self.notice("bad_value", "a value was dropped: %s", exc)
            return None


class Names:
    """The metric names of this run: valid ones admitted up to ``cap`` distinct names (each
    rank keeps its own count); a name past the cap is dropped and counted, never stored."""

    def __init__(self, cap: int, sender: Sender, counters: Counters) -> None:
        self.cap = cap
        self.known: set[str] = set()
        self.sender = sender
        self.counters = counters

    def admit(self, name: str) -> bool:
        if name in self.known:
            return True
        if not valid_name(name):
            self.counters.error("bad_name")
            self.counters.notice("bad_name", "metric name %r dropped: not a valid name", name)
            return False
        if len(self.known) >= self.cap:
            self.sender.count_drop("name_cap")
            self.counters.notice(
                "name_cap", "metric name %r dropped: %d names already", name, self.cap
            )
            return False
        self.known.add(name)
        return True

    def clean(self, values: dict[str, Any], limit: int) -> dict[str, float]:
        """The values of admitted names as floats (at most ``limit``; the rest counted)."""
        num = self.counters.float_or_none
        admit = self.admit
        known = self.known
        out: dict[str, float] = {}
        for name, v in values.items():
            if len(out) >= limit:  # before admit: a dropped name takes no place among the names
                self.sender.count_drop("scalars_cap")
            elif (name in known or admit(name)) and (f := num(v)) is not None:
                out[name] = f
        return out


class StepStage:
    def __init__(self, config: ProducerConfig, sender: Sender, counters: Counters) -> None:
        self.config = config
        self.sender = sender
        self.counters = counters
        self.window = Window(first_share=1.0 - sender.identity.phase)
        self.batch = (
            StepBatch(config.batch_steps, config.batch_s) if config.full_resolution else None
        )
        self.guard = Guard(config.guard_sigma, config.guard_warmup)
        self.followed = sender.identity.rank < FOLLOWED_RANKS
        self.period = sample_period(config.sample_rate)
        self.last: tuple[int, int] | None = None  # (step, monotonic ns) of the previous step
        self.names = Names(config.max_metric_names, sender, counters)
        self.layers = LayerPicker(config.max_layers)

    # ------------------------------------------------------------------ enrich
    def payload(self, item: StepItem, step: int) -> tuple[dict[str, Any], dict[str, float]]:
        """The step payload and the caller's clean scalars (also in the payload)."""
        num = self.counters.float_or_none
        data: dict[str, Any] = {}
        for name, v in (("loss", item.loss), ("lr", item.lr), ("grad_norm", item.grad_norm)):
            if v is not None and (f := num(v)) is not None:
                data[name] = f
        if item.tokens is not None:
            try:
                data["tokens"] = V.to_int(item.tokens)
            except V.BadValue as exc:
                self.counters.error("bad_value")
                self.counters.notice("bad_value", "a value was dropped: %s", exc)
        clean: dict[str, float] = {}
        if item.scalars:
            clean = self.names.clean(item.scalars, self.config.max_scalars)
            # A step field given by the caller (e.g. its own step_time_s, measured before the
            # collective so stragglers show) wins over the value measured between calls.
            for name in _PROMOTED.intersection(clean):
                data[name] = clean.pop(name)
            if "clipped" in data:
                data["clipped"] = data["clipped"] != 0 and data["clipped"] == data["clipped"]
        t_ns = item.t_ns
        last, self.last = self.last, (step, t_ns)
        step_time = data.get("step_time_s")
        if step_time is None and last is not None and step > last[0] and t_ns > last[1]:
            step_time = (t_ns - last[1]) / 1e9 / (step - last[0])
            data["step_time_s"] = step_time
        if step_time and step_time > 0 and "tokens_per_s" not in data and "tokens" in data:
            tps = data["tokens"] / step_time
            data["tokens_per_s"] = tps
            c = self.config
            if c.flops_per_token and c.peak_flops:
                data["mfu"] = tps * c.flops_per_token / c.peak_flops
        if item.data_ns and "data_time_s" not in data:
            data["data_time_s"] = item.data_ns / 1e9
        if item.watch:
            self._add_watch(data, item.watch)
        return data, clean

    def _add_watch(self, data: dict[str, Any], watch: dict[str, Any]) -> None:
        num = self.counters.float_or_none
        for name in _WATCHED:
            v = watch.get(name)
            if name not in data and v is not None and (f := num(v)) is not None:
                data[name] = f
        clipped = watch.get("clipped")
        limit = watch.get("max_grad_norm")
        pre = data.get("grad_norm", data.get("grad_norm_preclip"))
        if "clipped" in data:
            pass  # the caller's
        elif limit is not None and pre is not None:
            data["clipped"] = pre > limit
        elif clipped is not None and (f := num(clipped)) is not None:
            data["clipped"] = bool(f)
        lrs = watch.get("group_lrs")
        if lrs:
            data["group_lrs"] = [f for v in lrs if (f := num(v)) is not None]
        names = watch.get("layer_names")
        if names:
            self._add_layers(data, watch, names)

    def _add_layers(self, data: dict[str, Any], watch: dict[str, Any], names: Any) -> None:
        """The per-layer norms the record carries (``layers.LayerPicker``)."""
        params = _floats(watch.get("layer_param_norms"), len(names))
        grads = _floats(watch.get("layer_grad_norms"), len(names))
        present = watch.get("layer_grad_present")
        if present is not None:
            keep = set(present)
            grads = [g if i in keep else None for i, g in enumerate(grads)]
        grad_map, param_map = self.layers.pick(names, grads, params)
        admit = self.names.admit
        grad_map = {k: v for k, v in grad_map.items() if admit(k)}
        param_map = {k: v for k, v in param_map.items() if admit(k)}
        if grad_map:
            data["layer_grad_norms"] = grad_map
        if param_map:
            data["layer_param_norms"] = param_map

    # ------------------------------------------------------------------ decide
    def add(self, item: StepItem) -> None:
        step = item.step
        if type(step) is not int or not 0 <= step <= _MAX_STEP:
            try:
                step = V.to_int(step)  # numpy and tensor integers; range checked
            except V.BadValue:
                step = -1
            if step < 0:
                self.sender.count_drop("bad_step")
                self.counters.notice(
                    "bad_step", "log_step(%r, ...) dropped: a step is an integer >= 0", item.step
                )
                return
        data, clean = self.payload(item, step)
        metrics = {k: float(v) for k, v in data.items() if k not in _NOT_SERIES}
        if clean:
            data["scalars"] = clean
            metrics.update(clean)
        t_ns = item.t_ns
        batch = self.batch
        if batch is None:
            self.window.add_step(step, metrics, t_ns)
        check, followed = self.guard.check, self.followed
        flagged = False  # a flag that sends the step at once (every metric is checked)
        for name, x in metrics.items():
            if check(name, x) and sends_at_once(followed, name, x):
                flagged = True
        if flagged:
            data["reason"] = "guard"
        if batch is not None:  # full resolution: every step, in batches
            batch.add(step, t_ns + self.sender.wall_offset_ns, data, t_ns)
            if flagged or batch.due(t_ns):  # a spike leaves at once
                self.emit_batch()
            return
        if not flagged and is_sampled(step, self.period):
            data["reason"] = "sample"
        elif not flagged and item.watch and not item.watch.keys() <= _BETWEEN:
            data["reason"] = "every"  # a watched step
        if "reason" in data:
            self.sender.send("step", step, t_ns, data)
        if self.window.due(t_ns, self.config.window_steps, self.config.window_s):
            self.emit_window(t_ns)

    # ------------------------------------------------------------------ emit
    def emit_window(self, now_ns: int) -> None:
        data = self.window.emit(now_ns)
        if data is not None:
            self.sender.send_window(data, now_ns)

    def emit_batch(self) -> None:
        if self.batch is not None and len(self.batch):
            self.sender.send_batch(self.batch.take())

    def emit_due(self, now_ns: int) -> None:
        """What is due by time alone (a quiet loop still sends its last steps)."""
        if self.batch is not None and self.batch.due(now_ns):
            self.emit_batch()
        if self.window.due(now_ns, self.config.window_steps, self.config.window_s):
            self.emit_window(now_ns)

    def emit_all(self, now_ns: int) -> None:
        self.emit_batch()
        self.emit_window(now_ns)


def _floats(value: Any, n: int) -> list[float | None]:
    """A device vector of ``n`` norms, resolved, as floats (None where there is none)."""
    if value is None:
        return [None] * n
    host = V.host_value(value)
    out = host.tolist() if hasattr(host, "tolist") else list(host)
    if len(out) != n:
        return [None] * n
    return [float(v) for v in out]
