"""Producer configuration: keyword first, then ``STEPLENS_<NAME>`` environment, then default."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from steplens.producer.identity import Identity
from steplens.schema import MAX_BATCH_ENTRIES
from steplens.schema.settings import (
    env_value,
    kafka_bootstrap,
    kafka_security_config,
    parse_bool,
    setting,
)
from steplens.schema.topics import Topics


def _positive(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _non_negative(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _rate(x: float) -> bool:
    return _non_negative(x) and x <= 1.0


def _positive_int(x: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _port_or_off(x: int) -> bool:
    return _non_negative_int(x) and x <= 65535


def _batch_size(x: int) -> bool:
    return _positive_int(x) and x <= MAX_BATCH_ENTRIES


def _is_bool(x: bool) -> bool:
    return isinstance(x, bool)


def _optional_positive(x: float | None) -> bool:
    return x is None or _positive(x)


def _optional_non_negative(x: float | None) -> bool:
    return x is None or _non_negative(x)


def _non_negative_int(x: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _dict_or_none(x: Any) -> bool:
    return x is None or isinstance(x, dict)


def _parse_json_dict(raw: str) -> dict[str, Any]:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")  # noqa: TRY004
    return value


def _default_spool_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.access(os.path.dirname(base) or "/", os.W_OK):
        base = tempfile.gettempdir()
    return os.path.join(base, "steplens", "spool")


@dataclass(frozen=True)
class ProducerConfig:
    """Every producer setting, resolved. Build with ``ProducerConfig.resolve(**keywords)``."""

    kafka_bootstrap: str
    topic: str
    sample_rate: float = 0.01  # share of steps sent raw (rounded to one step in N)
    window_steps: int = 100  # a step_window record every N steps ...
    window_s: float = 10.0  # ... or every T seconds, whichever comes first
    # Every step sent, in step_batch records (no step_window, no sampling): a batch leaves at
    # batch_steps steps, batch_s seconds after its first step, or right after a guarded step.
    full_resolution: bool = False
    batch_steps: int = 100  # at most MAX_BATCH_ENTRIES
    batch_s: float = 1.0
    hw_interval_s: float = 1.0  # hardware sampler period; 0 disables it
    hw_slow_every: int = 10  # PCIe throughput and energy: every N samples
    # the node exporter (Prometheus, ``exporter.py``) on local rank 0: 0 is off
    exporter_port: int = 0
    exporter_host: str = "127.0.0.1"
    health_interval_s: float = 5.0
    spool_dir: str = ""
    spool_max_bytes: int = 256 << 20
    queue_max: int = 65536  # caller-side queue bound (drop-oldest)
    flush_interval_s: float = 0.05  # worker wake-up period
    delivery_timeout_s: float = 10.0  # a record not acknowledged by then goes to the spool
    shutdown_timeout_s: float = 5.0
    guard_sigma: float = 6.0  # raw record when |x - mean| > guard_sigma * std ...
    guard_warmup: int = 20  # ... after this many values of the metric
    # distinct metric names a rank sends (per-layer norms of a 100-layer model fit), and names
    # in one step record; the rest are dropped and counted in health (name_cap, scalars_cap)
    max_metric_names: int = 4096
    max_scalars: int = 1024
    flops_per_token: float | None = None
    peak_flops: float | None = None
    # watch(): an element counts as updated when |change| > update_threshold * |value| (a
    # relative change: Adam moves every weight by about lr, so an absolute 0 says nothing)
    update_threshold: float = 1e-3
    update_sample: int = 4096  # watch(): elements sampled for the update ratio
    # watch(): per-layer norms of at most max_layers groups per record (the most changed);
    # a layer is the parameters' name up to its block index, or its first layer_depth parts
    max_layers: int = 32
    layer_depth: int = 0  # 0: up to the block index (model.layers.7), else the owning module
    # seconds without log_step before the stacks of every thread are sent once; None: the
    # larger of 60 s and 20 median step intervals; 0: never
    hang_dump_after_s: float | None = None
    lr_schedule: dict[str, Any] | None = None
    model_info: dict[str, Any] | None = None
    kafka_config: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def resolve(cls, **kw: Any) -> ProducerConfig:
        """Resolve keywords (``None`` = not given). Unknown or invalid keywords raise ValueError."""
        known = set(cls.__dataclass_fields__)
        unknown = set(kw) - known
        if unknown:
            raise ValueError(f"steplens: unknown setting(s) {sorted(unknown)}")
        d = cls.__dataclass_fields__

        def s(name: str, parse: Any, check: Any) -> Any:
            return setting(name, kw.get(name), parse, d[name].default, check)

        kafka_conf = {**kafka_security_config(), **(kw.get("kafka_config") or {})}
        if not isinstance(kw.get("kafka_config") or {}, dict):
            raise ValueError("steplens: kafka_config must be a dict")  # noqa: TRY004
        topic = kw.get("topic")
        if topic is not None and (not isinstance(topic, str) or not topic):
            raise ValueError(f"steplens: invalid topic={topic!r}")
        topic = topic or env_value("STEPLENS_TOPIC", str, "")
        return cls(
            kafka_bootstrap=kafka_bootstrap(kw.get("kafka_bootstrap")),
            topic=topic or Topics.from_env().raw,
            sample_rate=s("sample_rate", float, _rate),
            window_steps=s("window_steps", int, _positive_int),
            window_s=s("window_s", float, _positive),
            full_resolution=s("full_resolution", parse_bool, _is_bool),
            batch_steps=s("batch_steps", int, _batch_size),
            batch_s=s("batch_s", float, _positive),
            hw_interval_s=s("hw_interval_s", float, _non_negative),
            hw_slow_every=s("hw_slow_every", int, _positive_int),
            exporter_port=s("exporter_port", int, _port_or_off),
            exporter_host=s("exporter_host", str, bool),
            health_interval_s=s("health_interval_s", float, _positive),
            spool_dir=setting("spool_dir", kw.get("spool_dir"), str, _default_spool_dir(), bool),
            spool_max_bytes=s("spool_max_bytes", int, _positive_int),
            queue_max=s("queue_max", int, _positive_int),
            flush_interval_s=s("flush_interval_s", float, _positive),
            delivery_timeout_s=s("delivery_timeout_s", float, _positive),
            shutdown_timeout_s=s("shutdown_timeout_s", float, _non_negative),
            guard_sigma=s("guard_sigma", float, _positive),
            guard_warmup=s("guard_warmup", int, _positive_int),
            max_metric_names=s("max_metric_names", int, _positive_int),
            max_scalars=s("max_scalars", int, _positive_int),
            flops_per_token=s("flops_per_token", float, _optional_positive),
            peak_flops=s("peak_flops", float, _optional_positive),
            update_threshold=s("update_threshold", float, _non_negative),
            update_sample=s("update_sample", int, _positive_int),
            max_layers=s("max_layers", int, _positive_int),
            layer_depth=s("layer_depth", int, _non_negative_int),
            hang_dump_after_s=s("hang_dump_after_s", float, _optional_non_negative),
            lr_schedule=s("lr_schedule", _parse_json_dict, _dict_or_none),
            model_info=s("model_info", _parse_json_dict, _dict_or_none),
            kafka_config=kafka_conf,
        )

    def public(self) -> dict[str, Any]:
        """Settings safe to publish in run_meta (no Kafka security settings)."""
        out = asdict(self)
        out.pop("kafka_config")
        for name in ("lr_schedule", "model_info"):
            out.pop(name)
        return out

    def run_meta(self, identity: Identity) -> dict[str, Any]:
        """The run_meta payload of a rank: world, hosts, settings, model, schedule."""
        model = dict(self.model_info or {})
        if self.flops_per_token is not None:
            model.setdefault("flops_per_token", self.flops_per_token)
        data: dict[str, Any] = {
            "world_size": identity.world_size,
            "hosts": [identity.host],
            "config": self.public(),
        }
        if model:
            data["model"] = model
        if self.lr_schedule:
            data["lr_schedule"] = dict(self.lr_schedule)
        if self.peak_flops is not None:
            data["peak_flops"] = float(self.peak_flops)
        return data


def run_id_from_env() -> str | None:
    """STEPLENS_RUN_ID, else torchrun's TORCHELASTIC_RUN_ID (shared by all ranks)."""
    value = env_value("STEPLENS_RUN_ID", str, "")
    if value:
        return value
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return elastic if elastic and elastic != "none" else None


__all__ = ["ProducerConfig", "parse_bool", "run_id_from_env"]
