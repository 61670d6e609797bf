"""Producer configuration, declared once: each setting's type, constraint, default and help.

Resolution (``steplens.schema.settings``): keyword first, then ``STEPLENS_<NAME>``, then the
default; a bad keyword raises ``ValueError`` at ``init``, a bad variable logs a warning and
the default is used. Settings are resolved once, at ``init``; the hot path reads plain
attributes of the frozen result.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from typing import Annotated, Any, Literal

from msgspec import Meta

from steplens.producer.identity import Identity
from steplens.schema import MAX_BATCH_ENTRIES
from steplens.schema.kinds import AdviceAction
from steplens.schema.settings import (
    DEFAULT_KAFKA_BOOTSTRAP,
    NonEmptyStr,
    NonNegativeFloat,
    NonNegativeInt,
    Port,
    PositiveFloat,
    PositiveInt,
    about,
    kafka_security_config,
    resolve,
)
from steplens.schema.topics import Topics


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.access(os.path.dirname(base) or "/", os.W_OK):
        base = tempfile.gettempdir()
    return os.path.join(base, "steplens")


def _default_spool_dir() -> str:
    return os.path.join(_cache_dir(), "spool")


def _default_advice_relay_dir() -> str:
    return os.path.join(_cache_dir(), "advice")


def _default_topic() -> str:
    return Topics.from_env().raw


def _default_advice_topic() -> str:
    return Topics.from_env().advice


Share = Annotated[float, Meta(ge=0, le=1)]
BatchSize = Annotated[int, Meta(ge=1, le=MAX_BATCH_ENTRIES)]
JsonObject = dict[str, Any]
Remedies = list[AdviceAction]
ExitSignals = list[Literal["SIGTERM", "SIGINT", "SIGHUP"]]


@dataclass(frozen=True)
class ProducerConfig:
    """Every producer setting, resolved. Build with ``ProducerConfig.resolve(**keywords)``."""

    kafka_bootstrap: Annotated[NonEmptyStr, about("Kafka bootstrap servers")] = (
        DEFAULT_KAFKA_BOOTSTRAP
    )
    topic: Annotated[
        NonEmptyStr,
        about(
            "topic of every record",
            env_doc="`STEPLENS_TOPIC`, then `STEPLENS_TOPIC_RAW`",
            default_doc="`steplens.raw`",
        ),
    ] = field(default_factory=_default_topic)
    sample_rate: Annotated[
        Share,
        about("share of steps sent raw (one step in N, the same steps on every rank)"),
    ] = 0.01
    window_steps: Annotated[PositiveInt, about("a `step_window` aggregate every N steps ...")] = 100
    window_s: Annotated[PositiveFloat, about("... or every T seconds, whichever comes first")] = (
        10.0
    )
    full_resolution: Annotated[
        bool,
        about(
            "send every step instead (windows and raw samples off): a `step_batch` record "
            "per rank ..."
        ),
    ] = False
    batch_steps: Annotated[BatchSize, about("... every N steps ...")] = 100
    batch_s: Annotated[
        PositiveFloat,
        about("... or every T seconds, and at once after a guard-flagged step"),
    ] = 1.0
    guard_sigma: Annotated[
        PositiveFloat,
        about("a value this many deviations from its running mean is sent raw"),
    ] = 6.0
    guard_warmup: Annotated[PositiveInt, about("values of a metric before the guard judges it")] = (
        20
    )
    batch_every: Annotated[
        NonNegativeInt,
        about(
            "`timed()`: one batch in N that holds token ids (`input_ids`) goes to the "
            "data-quality checks (lengths, duplicates, labels), as with `log_batch`, hashed "
            "in the worker thread; 0: none"
        ),
    ] = 1
    max_metric_names: Annotated[
        PositiveInt,
        about(
            "distinct metric names a rank sends per run; further names are dropped and "
            "counted (`health.dropped.name_cap`)"
        ),
    ] = 4096
    max_scalars: Annotated[
        PositiveInt,
        about(
            "metric names in one step record; the rest are dropped and counted "
            "(`health.dropped.scalars_cap`)"
        ),
    ] = 1024
    hw_interval_s: Annotated[
        NonNegativeFloat,
        about(
            "hardware sampler period (NVML and host: local rank 0; each rank's PyTorch "
            "allocator); 0 turns it off"
        ),
    ] = 1.0
    hw_report_every_s: Annotated[
        NonNegativeFloat,
        about(
            "a node's hardware sample (local rank 0) is sent every N s, and at once when it "
            "holds news against the last one sent (an ECC or XID count, a throttle reason, "
            "the allocator's retries or OOMs; a temperature, utilisation, memory, network or "
            "disk latency level past its band), then its next 3 samples; and every sample "
            "while the steps have paused (3 median step intervals, at least 2 s: a hang is "
            "judged by the samples); 0: every sample"
        ),
    ] = 5.0
    hw_allocator_every_s: Annotated[
        NonNegativeFloat,
        about(
            "a rank's own PyTorch allocator figures (ranks other than a node's local rank 0, "
            "whose node sample carries them): sent every N s, and at once when the allocator "
            "retried or raised an out-of-memory error, and at most every 5 s while its "
            "high-water mark rises by 0.1 % of what it can reach or its reserved memory moves "
            "by 2 %; 0: every sample"
        ),
    ] = 30.0
    hw_slow_every: Annotated[
        PositiveInt,
        about("PCIe throughput and energy every N samples (slow NVML calls)"),
    ] = 10
    comm_every: Annotated[
        NonNegativeInt,
        about(
            "`watch` on a DistributedDataParallel model: its gradient all-reduce is timed at "
            "one optimizer step in N (a DDP communication hook running the default "
            "all-reduce; no host sync) and sent as a `comm` record; 0: off"
        ),
    ] = 100
    exporter_port: Annotated[
        Port,
        about(
            "the node exporter's port on local rank 0 (we use 9467): the newest hardware "
            "sample for Prometheus; 0: off"
        ),
    ] = 0
    exporter_host: Annotated[
        NonEmptyStr,
        about("the address it binds: `0.0.0.0` where Prometheus scrapes the nodes from elsewhere"),
    ] = "127.0.0.1"
    health_interval_s: Annotated[
        PositiveFloat,
        about(
            "the producer reads its own health every N s (what it dropped, spooled and sent; "
            "its process's memory and its host's)"
        ),
    ] = 5.0
    health_report_every_s: Annotated[
        NonNegativeFloat,
        about(
            "the `health` record is sent every N s, and at once when it holds news against "
            "the last one sent (a dropped or error count, the spool; the process's resident "
            "memory moved by 0.5 % of its host's, the host's available memory by 2 %), then "
            "its next 3 readings, and at shutdown; 0: every reading"
        ),
    ] = 30.0
    spool_dir: Annotated[
        NonEmptyStr,
        about(
            "disk spool while Kafka is unreachable",
            default_doc="`$XDG_CACHE_HOME/steplens/spool` (`~/.cache/...`)",
        ),
    ] = field(default_factory=_default_spool_dir)
    spool_max_bytes: Annotated[
        PositiveInt,
        about("spool bound; the oldest segment is dropped and counted beyond it"),
    ] = 256 << 20
    queue_max: Annotated[PositiveInt, about("in-memory queue bound (drop-oldest, counted)")] = 65536
    flush_interval_s: Annotated[PositiveFloat, about("worker wake-up period")] = 0.05
    delivery_timeout_s: Annotated[
        PositiveFloat, about("a record not acknowledged by then goes to the spool")
    ] = 10.0
    shutdown_timeout_s: Annotated[
        NonNegativeFloat, about("deadline of `shutdown()`, of the exit hook and of an exit signal")
    ] = 5.0
    exit_signals: Annotated[
        ExitSignals,
        about(
            "signals after which the last window, samples and queue are sent (within "
            "`shutdown_timeout_s`) before the signal's own action: a default action (SIGTERM "
            "ends the process) happens then, a handler already set runs then; an ignored "
            "signal stays ignored (env: JSON list); `[]`: no handler",
            default_doc='`["SIGTERM", "SIGINT"]`',
        ),
    ] = field(default_factory=lambda: ["SIGTERM", "SIGINT"])
    flops_per_token: Annotated[
        PositiveFloat | None, about("with `peak_flops` and `tokens`: MFU")
    ] = None
    peak_flops: Annotated[PositiveFloat | None, about("per device")] = None
    # An element counts as updated when |change| > update_threshold * |value|: a relative
    # change, since Adam moves every weight by about lr and an absolute 0 says nothing.
    update_threshold: Annotated[
        NonNegativeFloat,
        about(
            "`watch`: an element counts as updated when its change exceeds this share of its "
            "magnitude (with Adam the ratio is a few % at lr 1e-5 and 0 at lr 0)"
        ),
    ] = 1e-3
    update_sample: Annotated[
        PositiveInt,
        about("`watch`: parameter elements sampled for the update ratio"),
    ] = 4096
    max_layers: Annotated[
        PositiveInt,
        about(
            "`watch`: layers whose norms one record carries (the most changed when a model "
            "has more)"
        ),
    ] = 32
    layer_depth: Annotated[
        NonNegativeInt,
        about(
            "`watch`: 0 groups parameters up to their block index, N by the first N parts "
            "of their module's name"
        ),
    ] = 0
    hang_dump_after_s: Annotated[
        NonNegativeFloat | None,
        about(
            "seconds without `log_step` before the stacks of every thread are sent; none: "
            "the larger of 60 s and 20 median step intervals; 0: never"
        ),
    ] = None
    lr_schedule: Annotated[
        JsonObject | None, about("declared schedule, sent in `run_meta` (env: JSON)")
    ] = None
    model_info: Annotated[
        JsonObject | None, about("model facts, sent in `run_meta` (env: JSON)")
    ] = None
    remedies: Annotated[
        Remedies,
        about(
            "what the stream jobs may advise this run's ranks to do: `profile` (on by "
            "default, carried out at `log_step`), `skip_samples`, `rewind`, `lower_lr` (read "
            "with `sl.advice()`/`sl.act()`); a list replaces the default (env: JSON list); "
            "an empty list (`[]`): no advice, no consumer",
            default_doc='`["profile"]`',
        ),
    ] = field(default_factory=lambda: ["profile"])
    profile: Annotated[
        bool,
        about(
            "the `profile` remedy: a short `torch.profiler` trace of a slow rank, at most "
            "once per incident; false drops it from `remedies`"
        ),
    ] = True
    s3_bucket: Annotated[
        str | None,
        about("bucket the `profile` remedy uploads its traces to (with boto3); none: kept local"),
    ] = None
    s3_prefix: Annotated[
        str, about("key prefix of the traces: `<prefix>/traces/run_id=<run>/`")
    ] = "cold"
    s3_endpoint: Annotated[str | None, about("S3 endpoint of the traces (none: AWS)")] = None
    advice_topic: Annotated[
        NonEmptyStr,
        about(
            "topic the advice comes on",
            env_doc="`STEPLENS_ADVICE_TOPIC`, then `STEPLENS_TOPIC_ADVICE`",
            default_doc="`steplens.advice`",
        ),
    ] = field(default_factory=_default_advice_topic)
    advice_queue_max: Annotated[
        PositiveInt, about("advice waiting for `sl.advice()` (drop-oldest, counted)")
    ] = 64
    advice_burst: Annotated[
        PositiveInt,
        about(
            "pieces of advice a rank lets through at once (advice for every rank and for this "
            "rank counted apart) ..."
        ),
    ] = 4
    advice_refill_s: Annotated[
        NonNegativeFloat,
        about("... and one more every this many seconds; the rest is refused; 0: no limit"),
    ] = 60.0
    advice_per_node: Annotated[
        bool,
        about(
            "one advice reader per node: local rank 0 reads the advice topic and relays the "
            "run's advice to the node's other ranks through a file (`advice_relay_dir`); "
            "false: every rank opens its own consumer"
        ),
    ] = True
    advice_relay_dir: Annotated[
        NonEmptyStr,
        about(
            "folder of the node's advice relay (a file per run and host, private to the user)",
            default_doc="`$XDG_CACHE_HOME/steplens/advice` (`~/.cache/...`)",
        ),
    ] = field(default_factory=_default_advice_relay_dir)
    lr_floor: Annotated[
        Share,
        about(
            "`lower_lr`: the lr is never lowered below this share of the declared schedule's "
            "lr at that step (the product of all lowerings stays at least this; without a "
            "declared schedule, a share of the lr before the first); 0: no floor"
        ),
    ] = 0.1
    max_skip_batches: Annotated[
        NonNegativeInt,
        about("`rewind`: a rewind that asks to skip more batches is refused"),
    ] = 500
    max_rewinds_per_hour: Annotated[
        NonNegativeInt,
        about("`rewind`: rewinds carried out within an hour (by the advice's time); more: refused"),
    ] = 2
    kafka_config: Annotated[
        JsonObject,
        about(
            "librdkafka settings (SASL/SSL pass through; the keyword wins)",
            env="",
            env_doc="`STEPLENS_KAFKA_SECURITY_PROTOCOL`, `STEPLENS_KAFKA_SASL_*`, "
            "`STEPLENS_KAFKA_SSL_*`",
            default_doc="none",
        ),
    ] = field(default_factory=dict, repr=False)

    @classmethod
    def resolve(cls, **kw: Any) -> ProducerConfig:
        """Resolve keywords (``None`` = not given). Unknown or invalid keywords raise ValueError."""
        extra = kw.get("kafka_config") or {}
        if not isinstance(extra, dict):
            raise ValueError("steplens: kafka_config must be a dict")  # noqa: TRY004
        got = resolve(cls, {**kw, "kafka_config": {**kafka_security_config(), **extra}})
        if not got.profile and "profile" in got.remedies:
            got = replace(got, remedies=[r for r in got.remedies if r != "profile"])
        return got

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
        if self.remedies:
            data["remedies"] = list(self.remedies)
        return data


__all__ = ["ProducerConfig"]
