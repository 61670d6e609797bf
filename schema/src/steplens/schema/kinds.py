"""Wire schema v1: every record kind steplens sends, declared as msgspec Structs.

A record is a JSON object (UTF-8), one per Kafka message:

    {"v": 1, "kind": "step", "run_id": "r1", "rank": 0, "local_rank": 0, "host": "n1",
     "pid": 123, "seq": 42, "time_ns": 1700000000000000000, "step": 100, "data": {...}}

The envelope is the same for every kind (``Envelope``); ``kind`` names the record's kind and
``data`` holds that kind's payload (``KINDS``: kind -> payload Struct). ``WireRecord`` is the
tagged union on ``kind`` that the codec decodes: one envelope Struct per kind, each with its
payload type for ``data``. The constraints (integer ranges, string and list lengths, allowed
values) are declared on the fields; msgspec checks them while it parses.

Payload fields are optional unless declared without a default; a null reads as absent. Unknown
fields are rejected so typos surface early; free-form values belong in the map fields
("scalars", "extra", "config"). Numbers declared ``Num`` may be non-finite: NaN and the
infinities travel as the strings "NaN", "Infinity", "-Infinity" (a NaN loss is a fact to
report, not an encoding error); ``FNum`` must be finite. Inside free-form values (``Obj``,
``FlatObjs``) those three strings always read back as floats.

Metric names (the keys of ``scalars``, ``extra``, layer norms and a window's ``metrics``) are
``MetricName``: 1 to ``MAX_NAME_LEN`` characters, declared here, and no control characters
(``NAME_PATTERN``), checked after parsing (``metric_names``) because a regex per key inside the
parser costs an entry's decode several times over. Steps are >= 0.

``step_batch`` carries many complete step records of one rank in one message (a consumer pays a
fixed cost per message): ``data = {"records": [entry, ...]}``, each entry a ``step`` payload
after its own ``step`` and ``time_ns`` (``StepEntry``); the envelope's ``step`` and ``time_ns``
are the last entry's. The kind was added within version 1: a decoder without it dead-letters
such a record with "unknown kind". So were ``advice`` (stream jobs -> ranks, on the advice
topic), ``acted`` (a rank's answer to it) and ``checkpoint`` (a checkpoint a run saved).

The Structs' field order is the order of a decoded record's ``data``, and so of its re-encoded
bytes: it is part of the wire contract.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, get_args

import msgspec
from msgspec import Meta

SCHEMA_VERSION: Final = 1
MAX_RECORD_BYTES: Final = 1 << 20  # 1 MiB; Kafka's default message.max.bytes is about the same
MAX_STR_LEN: Final = 4096
MAX_LIST_LEN: Final = 65536
MAX_BATCH_ENTRIES: Final = 4096  # entries of one step_batch record
MAX_NAME_LEN: Final = 256  # a metric name: 1..256 characters, no control characters
# a valid metric name (re.search; \Z, not $, which also matches before a final newline)
NAME_PATTERN: Final = r"^[^\x00-\x1f\x7f-\x9f]*\Z"
RUN_RANK: Final = -1  # rank of records about the whole run (stream-job outputs)
NAN_NAMES: Final = ("NaN", "Infinity", "-Infinity")  # non-finite floats on the wire
_I64_MAX: Final = (1 << 63) - 1
_F64_MAX: Final = 1.7976931348623157e308

Severity = Literal["info", "warning", "critical"]
AlertState = Literal["firing", "resolved"]
# what the stream jobs may advise a run's ranks to do (each remedy opt-in, named at init)
AdviceAction = Literal["skip_samples", "rewind", "lower_lr", "profile"]
# what a rank did with a piece of advice
AdviceOutcome = Literal["acted", "declined", "failed", "refused"]
SEVERITIES: Final = get_args(Severity)
ALERT_STATES: Final = get_args(AlertState)
ADVICE_ACTIONS: Final = get_args(AdviceAction)
ADVICE_OUTCOMES: Final = get_args(AdviceOutcome)
# the bits of a GPU's ``throttle_reasons`` (NVML's clocks-event reasons), lowest first
THROTTLE_REASONS: Final = (
    "idle",
    "application clocks",
    "SW power cap",
    "HW slowdown",
    "sync boost",
    "SW thermal",
    "HW thermal",
    "HW power brake",
    "display clocks",
)

# ----------------------------------------------------------------------------- field types
Int = Annotated[int, Meta(ge=-_I64_MAX, le=_I64_MAX)]
Count = Annotated[int, Meta(ge=0, le=_I64_MAX)]  # counts, steps, sequence numbers, pids
Str = Annotated[str, Meta(max_length=MAX_STR_LEN)]
Num = float | Literal["NaN", "Infinity", "-Infinity"]  # a float that may be non-finite
FNum = Annotated[float, Meta(ge=-_F64_MAX, le=_F64_MAX)]  # a finite float (NaN fails both)
Factor = Annotated[float, Meta(gt=0.0, le=1.0)]  # a multiplier that only lowers
MetricName = Annotated[str, Meta(min_length=1, max_length=MAX_NAME_LEN)]
Metrics = dict[MetricName, Num]  # free-form scalar metrics by name
Counters = dict[Str, Int]
Obj = dict[str, Any]  # any JSON object (free-form facts)
# flat objects with scalar values (a GPU, a disk, a thread)
FlatObjs = Annotated[
    list[dict[str, str | int | float | bool | None]], Meta(max_length=MAX_LIST_LEN)
]
StrList = Annotated[list[Str], Meta(max_length=MAX_LIST_LEN)]
NumList = Annotated[list[Num], Meta(max_length=MAX_LIST_LEN)]
IntList = Annotated[list[Int], Meta(max_length=MAX_LIST_LEN)]


class Payload(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The ``data`` of a record: required fields first in the wire order, absent ones None."""


# ----------------------------------------------------------------------------- payloads
class RunMeta(Payload, kw_only=True):
    """Once per rank at init (and again if it changes)."""

    world_size: Int
    hosts: StrList | None = None
    model: Obj | None = None  # name, n_params, flops_per_token, seq_len, ...
    optimizer: Obj | None = None  # name, betas, weight_decay, ...
    # declared schedule: {"kind": "cosine"|"linear"|"constant"|"step", "peak_lr", "min_lr",
    # "warmup_steps", "total_steps", "milestones": [...], "gamma"}
    lr_schedule: Obj | None = None
    peak_flops: FNum | None = None  # per device, for MFU
    config: Obj | None = None
    # a run whose history the detectors' baselines may start from (a resumed or reference
    # run), and the run's lineage (free-form: parent run, checkpoint, ...)
    baseline_run: Str | None = None
    lineage: Obj | None = None
    # the checks of the design and their state on this rank: [{"check", "state": "on" |
    # "on use" | "off", "needs" (on use), "why" and "enable" (off)}]
    checks: FlatObjs | None = None
    # the remedies this run opted into (``AdviceAction`` names): the stream jobs advise only these
    remedies: StrList | None = None


class Step(Payload, kw_only=True):
    """One training step (raw, sampled or guarded) from one rank."""

    loss: Num | None = None
    lr: Num | None = None
    grad_norm: Num | None = None
    tokens: Int | None = None
    step_time_s: Num | None = None
    data_time_s: Num | None = None
    tokens_per_s: Num | None = None
    mfu: Num | None = None
    # from watch(): pre-clip grad norm, clipping, parameter norm, update ratio, lr per group
    grad_norm_preclip: Num | None = None
    clipped: bool | None = None
    param_norm: Num | None = None
    update_ratio: Num | None = None
    group_lrs: NumList | None = None
    # from watch(), at its interval: per layer (or module group) gradient and parameter norms
    layer_grad_norms: Metrics | None = None
    layer_param_norms: Metrics | None = None
    scalars: Metrics | None = None
    reason: Str | None = None  # why this raw record was sent: "sample" | "guard" | "every"


# One entry of a step_batch: its own step and time, then a step payload. Built from ``Step``
# so the step fields are declared once; a subclass would put them before step and time_ns.
StepEntry: Final = msgspec.defstruct(
    "StepEntry",
    [
        ("step", Count),
        ("time_ns", Int),
        *((f.name, f.type, f.default) for f in msgspec.structs.fields(Step)),
    ],
    bases=(Payload,),
    module=__name__,
)


class StepBatch(Payload, kw_only=True):
    """Every step of a stretch of training on one rank (full resolution), in order."""

    records: Annotated[list[StepEntry], Meta(min_length=1, max_length=MAX_BATCH_ENTRIES)]  # type: ignore[valid-type]


class StepWindow(Payload, kw_only=True):
    """Aggregate of every step metric seen in a window: never hides a spike."""

    step_first: Int
    step_last: Int
    count: Int
    duration_s: FNum | None = None
    # metric -> {"count", "mean", "std", "min", "max", "last", "nonfinite"}
    metrics: dict[MetricName, Any]


class Eval(Payload, kw_only=True):
    split: Str
    loss: Num | None = None
    perplexity: Num | None = None
    accuracy: Num | None = None
    f1: Num | None = None
    bleu: Num | None = None
    rouge: Num | None = None
    extra: Metrics | None = None


class Batch(Payload, kw_only=True):
    """Data quality of one batch on one rank."""

    n_samples: Int
    length_edges: IntList | None = None  # histogram bin edges (len = len(counts) + 1)
    length_counts: IntList | None = None
    length_mean: FNum | None = None
    length_max: Int | None = None
    max_len: Int | None = None
    over_length: Int | None = None
    label_counts: Counters | None = None  # class labels of a classification batch
    supervised_share: FNum | None = None  # language-model batch: share of supervised tokens
    sample_hashes: StrList | None = None  # truncated MD5 hex per sample
    sample_ids: StrList | None = None  # the caller's own sample ids, when given
    epoch: Int | None = None  # the data's epoch (a sample seen again in a new one is no repeat)


class Hw(Payload, kw_only=True):
    """Host + all its GPUs, from the per-host sampler (or one rank's allocator figures)."""

    mem_available_bytes: Int | None = None
    mem_total_bytes: Int | None = None
    cpu_percent: FNum | None = None
    disks: FlatObjs | None = None  # [{"device", "read_mb_s", "write_mb_s", "io_latency_ms"}]
    nets: FlatObjs | None = None  # [{"iface", "rx_mb_s", "tx_mb_s"}]
    # [{"index", "uuid", "name", "mem_used_bytes", "mem_total_bytes", "util_gpu", "util_mem",
    #   "power_w", "temp_c", "sm_clock_mhz", "throttle_reasons", "ecc_corrected",
    #   "ecc_uncorrected", "xid_count", "xid_last", "pcie_tx_mb_s", "pcie_rx_mb_s", "energy_j",
    #   "mem_bw_util", "mem_bw_source",
    #   the PyTorch allocator's of the sending process (bytes; the counters cumulative):
    #   "torch_allocated_bytes", "torch_reserved_bytes", "torch_peak_bytes" (allocated's
    #   high-water mark), "torch_alloc_retries", "torch_ooms", "torch_limit_bytes" (reserved +
    #   the device's free memory)}]; a rank other than local rank 0 sends only these, with
    #   "index" and "uuid", in a record without NVML's or the host's fields
    gpus: FlatObjs | None = None
    gpu_status: Str | None = None  # "ok" | "no_nvml" | "no_gpu" | error text


class Stacks(Payload, kw_only=True):
    """The Python stacks of a rank that stopped stepping while its process lives."""

    stalled_s: FNum  # since the last log_step
    last_step: Int | None = None
    threads: FlatObjs  # [{"name", "id", "stack"}], stack as text


class Comm(Payload, kw_only=True):
    """Inter-rank communication: the probe's, or the run's own gradient all-reduce."""

    # "all_reduce" | "send_recv" (the probe); "ddp_all_reduce" (a DDP step's gradient buckets:
    # latency_ms their median all-reduce time, bytes their median size)
    op: Str
    peer: Int | None = None
    latency_ms: Num
    bytes: Int | None = None
    backend: Str | None = None


class Health(Payload, kw_only=True):
    """The producer's own health: what it dropped, spooled and sent, and its memory."""

    dropped: Counters | None = None  # reason -> count since start
    sent: Int | None = None
    spooled: Int | None = None
    spool_bytes: Int | None = None
    replayed: Int | None = None
    errors: Counters | None = None
    queue_len: Int | None = None
    # the sending process's resident memory, and its host's available and total memory at the
    # same moment (a leak in the rank's process, judged against what the host has left)
    rss_bytes: Int | None = None
    mem_available_bytes: Int | None = None
    mem_total_bytes: Int | None = None


class Signal(Payload, kw_only=True):
    """An output of the stream jobs: one detector's reading of one metric."""

    name: Str  # detector, e.g. "volatility", "spike", "arima"
    metric: Str
    value: Num | None = None
    score: FNum | None = None  # 0..1
    expected: Num | None = None
    lower: Num | None = None
    upper: Num | None = None
    detail: Obj | None = None


class Alert(Payload, kw_only=True):
    """An output of the stream jobs: a rule firing or resolving."""

    rule: Str
    severity: Severity
    state: AlertState
    scope: Str  # e.g. "run", "rank:3", "gpu:n1/0"
    hint: Str
    summary: Str | None = None
    fingerprint: Str  # stable per run + rule + scope
    started_step: Int | None = None
    evidence: Obj | None = None


class Advice(Payload, kw_only=True):
    """An output of the stream jobs: what a run's ranks should do about an incident.

    Sent on the advice topic, keyed by run; the envelope's ``rank`` is the rank it is for
    (``RUN_RANK``: every rank) and its ``step`` the step it was decided at. ``fingerprint`` and
    ``action`` identify it: a rank acts on each pair once.
    """

    action: AdviceAction
    fingerprint: Str  # the incident's
    rule: Str | None = None  # the incident's lead rule
    reason: Str | None = None  # the incident's hint, for the rank's log
    onset_step: Count | None = None  # the incident's first step
    sample_ids: StrList | None = None  # skip_samples: the caller's sample ids
    sample_hashes: StrList | None = None  # skip_samples: hashes, where no ids were given
    checkpoint: Str | None = None  # rewind: the checkpoint to reload (as the run reported it)
    checkpoint_step: Count | None = None
    skip_batches: Count | None = None  # rewind: batches to skip after reloading
    lr_factor: Factor | None = None  # lower_lr: multiply the lr by it
    duration_s: FNum | None = None  # profile: how long to record
    # rewind, lower_lr (shared by every rank): the step at whose end every rank carries it out,
    # ahead of the run's last reported step, so the ranks agree without a collective
    at_step: Count | None = None
    steps_lost: Count | None = None  # its cost: steps of training undone (a rewind's)
    batches_skipped: Count | None = None  # ... and batches the run will not train on
    evidence: Str | None = None  # what it was judged on (the loss against its trend, ...)


class Acted(Payload, kw_only=True):
    """A rank's answer to a piece of advice: what it did, at which step."""

    action: AdviceAction
    fingerprint: Str
    outcome: AdviceOutcome
    detail: Str | None = None  # what was done (the checkpoint reloaded, the new lr) or why not


class Checkpoint(Payload, kw_only=True):
    """A checkpoint the run saved (``step`` in the envelope), which a rewind may name."""

    path: Str


class DeadLetter(Payload, kw_only=True):
    """A record some consumer could not use, with the reason."""

    reason: Str
    source_topic: Str | None = None
    partition: Int | None = None
    offset: Int | None = None
    consumer: Str | None = None
    payload: Str | None = None  # original bytes, decoded as UTF-8 with replacement, truncated


# ----------------------------------------------------------------------------- envelopes
class Envelope(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="kind"):
    """The fields every record has, in the order v1's producers write them (the decoder finds
    fields fastest in that order); each kind's envelope adds its tag and its ``data`` type."""

    v: Literal[1]
    run_id: Annotated[str, Meta(min_length=1, max_length=MAX_STR_LEN)]
    rank: Annotated[int, Meta(ge=RUN_RANK, le=_I64_MAX)]  # RUN_RANK: about the whole run
    local_rank: Count
    host: Str
    pid: Count
    seq: Count
    time_ns: Int
    data: Payload  # each kind's envelope narrows it to its payload; the position stays here
    step: Count | None = None


class RunMetaRecord(Envelope, tag="run_meta", kw_only=True):
    data: RunMeta


class StepRecord(Envelope, tag="step", kw_only=True):
    data: Step


class StepBatchRecord(Envelope, tag="step_batch", kw_only=True):
    data: StepBatch


class StepWindowRecord(Envelope, tag="step_window", kw_only=True):
    data: StepWindow


class EvalRecord(Envelope, tag="eval", kw_only=True):
    data: Eval


class BatchRecord(Envelope, tag="batch", kw_only=True):
    data: Batch


class HwRecord(Envelope, tag="hw", kw_only=True):
    data: Hw


class StacksRecord(Envelope, tag="stacks", kw_only=True):
    data: Stacks


class CommRecord(Envelope, tag="comm", kw_only=True):
    data: Comm


class HealthRecord(Envelope, tag="health", kw_only=True):
    data: Health


class SignalRecord(Envelope, tag="signal", kw_only=True):
    data: Signal


class AlertRecord(Envelope, tag="alert", kw_only=True):
    data: Alert


class DeadLetterRecord(Envelope, tag="dead_letter", kw_only=True):
    data: DeadLetter


class AdviceRecord(Envelope, tag="advice", kw_only=True):
    data: Advice


class ActedRecord(Envelope, tag="acted", kw_only=True):
    data: Acted


class CheckpointRecord(Envelope, tag="checkpoint", kw_only=True):
    data: Checkpoint


WireRecord = (
    RunMetaRecord
    | StepRecord
    | StepBatchRecord
    | StepWindowRecord
    | EvalRecord
    | BatchRecord
    | HwRecord
    | StacksRecord
    | CommRecord
    | HealthRecord
    | SignalRecord
    | AlertRecord
    | DeadLetterRecord
    | AdviceRecord
    | ActedRecord
    | CheckpointRecord
)
ENVELOPES: Final[dict[str, type[Envelope]]] = {
    t.__struct_config__.tag: t for t in get_args(WireRecord)
}
# kind -> payload Struct, in the order of the union
KINDS: Final[dict[str, type[Payload]]] = {
    kind: {f.name: f.type for f in msgspec.structs.fields(t)}["data"]
    for kind, t in ENVELOPES.items()
}
