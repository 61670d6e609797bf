"""Wire schema v1: the one definition of every record steplens sends.

A record is a JSON object (UTF-8), one per Kafka message:

    {"v": 1, "kind": "step", "run_id": "r1", "rank": 0, "local_rank": 0, "host": "n1",
     "pid": 123, "seq": 42, "time_ns": 1700000000000000000, "step": 100, "data": {...}}

The envelope is the same for every kind (``ENVELOPE``); ``data`` holds the kind's fields
(``KINDS``). Metric names (the keys of ``scalars``, ``extra`` and a window's ``metrics``) are
1 to ``MAX_NAME_LEN`` characters without control characters; steps are >= 0. Non-finite
floats travel as the strings "NaN", "Infinity", "-Infinity" in fields that allow them (a NaN
loss is a fact to report, not an encoding error). Inside free-form
objects ("obj" and "list[obj]" fields) those three strings always read back as floats.

This module holds the tables and the record types; ``steplens.schema.codec`` turns them into
one validating codec (``encode``, ``decode``, ``validate``, re-exported here).

``step_batch`` carries many complete step records of one rank in one message (a consumer pays a
fixed cost per message): ``data = {"records": [entry, ...]}``, each entry a ``step`` payload plus
its own ``step`` and ``time_ns``; the envelope's ``step`` and ``time_ns`` are the last entry's.
``unbatch`` turns it back into the ``step`` records it stands for. The kind was added within
version 1: a decoder without it dead-letters such a record with "unknown kind".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

SCHEMA_VERSION: Final = 1
MAX_RECORD_BYTES: Final = 1 << 20  # 1 MiB; Kafka's default message.max.bytes is about the same
MAX_STR_LEN: Final = 4096
MAX_LIST_LEN: Final = 65536
MAX_BATCH_ENTRIES: Final = 4096  # entries of one step_batch record
MAX_NAME_LEN: Final = 256  # a metric name: 1..256 characters, no control characters
# a valid metric name (re.search; \Z, not $, which also matches before a final newline)
NAME_PATTERN: Final = r"^[^\x00-\x1f\x7f-\x9f]*\Z"

# Field types. "num" is a float that may be non-finite; "fnum" must be finite.
NUM, FNUM, INT, STR, BOOL = "num", "fnum", "int", "str", "bool"
NUM_MAP = "map[str,num]"  # free-form scalar metrics
INT_MAP = "map[str,int]"  # counters
STR_LIST = "list[str]"
NUM_LIST = "list[num]"
INT_LIST = "list[int]"
OBJ_LIST = "list[obj]"  # list of flat objects with scalar values
OBJ = "obj"  # any JSON object (free-form facts)
STEP_ENTRIES = "list[step]"  # 1..MAX_BATCH_ENTRIES step entries (STEP_ENTRY)


@dataclass(frozen=True)
class Field:
    """One field of a table. ``low``: the least value of an int (or the least length of a
    string); ``names``: the keys of this map are metric names (see the module's docstring)."""

    type: str
    required: bool = False
    low: int | None = None
    names: bool = False


def _f(t: str, required: bool = False, low: int | None = None, names: bool = False) -> Field:
    return Field(t, required, low, names)


ENVELOPE: Final[dict[str, Field]] = {
    "v": _f(INT, True),
    "kind": _f(STR, True),
    "run_id": _f(STR, True, low=1),
    "rank": _f(INT, True, low=-1),  # RUN_RANK: a record about the whole run
    "local_rank": _f(INT, True, low=0),
    "host": _f(STR, True),
    "pid": _f(INT, True, low=0),
    "seq": _f(INT, True, low=0),
    "time_ns": _f(INT, True),
    "step": _f(INT, low=0),
    "data": _f("payload", True),  # checked per kind below
}

# Per-kind payload fields. Unknown payload fields are rejected so typos surface early;
# free-form values belong in the map fields ("scalars", "extra", "config").
KINDS: Final[dict[str, dict[str, Field]]] = {
    # Once per rank at init (and again if it changes).
    "run_meta": {
        "world_size": _f(INT, True),
        "hosts": _f(STR_LIST),
        "model": _f(OBJ),  # name, n_params, flops_per_token, seq_len, ...
        "optimizer": _f(OBJ),  # name, betas, weight_decay, ...
        # declared schedule: {"kind": "cosine"|"linear"|"constant"|"step", "peak_lr",
        # "min_lr", "warmup_steps", "total_steps", "milestones": [...], "gamma"}
        "lr_schedule": _f(OBJ),
        "peak_flops": _f(FNUM),  # per device, for MFU
        "config": _f(OBJ),
        # a run whose history the detectors' baselines may start from (a resumed or
        # reference run), and the run's lineage (free-form: parent run, checkpoint, ...)
        "baseline_run": _f(STR),
        "lineage": _f(OBJ),
    },
    # One training step (raw, sampled or guarded) from one rank.
    "step": {
        "loss": _f(NUM),
        "lr": _f(NUM),
        "grad_norm": _f(NUM),
        "tokens": _f(INT),
        "step_time_s": _f(NUM),
        "data_time_s": _f(NUM),
        "tokens_per_s": _f(NUM),
        "mfu": _f(NUM),
        # from watch(): pre-clip grad norm, clipping, parameter norm, update ratio, lr per group
        "grad_norm_preclip": _f(NUM),
        "clipped": _f(BOOL),
        "param_norm": _f(NUM),
        "update_ratio": _f(NUM),
        "group_lrs": _f(NUM_LIST),
        # from watch(), at its interval: per layer (or module group) gradient and parameter
        # norms
        "layer_grad_norms": _f(NUM_MAP, names=True),
        "layer_param_norms": _f(NUM_MAP, names=True),
        "scalars": _f(NUM_MAP, names=True),
        # why this raw record was sent: "sample" | "guard" | "every"
        "reason": _f(STR),
    },
    # Every step of a stretch of training on one rank (full resolution), in order.
    "step_batch": {
        "records": _f(STEP_ENTRIES, True),
    },
    # Aggregate of every step metric seen in a window: never hides a spike.
    "step_window": {
        "step_first": _f(INT, True),
        "step_last": _f(INT, True),
        "count": _f(INT, True),
        "duration_s": _f(FNUM),
        # metric -> {"count", "mean", "std", "min", "max", "last", "nonfinite"}
        "metrics": _f(OBJ, True, names=True),
    },
    "eval": {
        "split": _f(STR, True),
        "loss": _f(NUM),
        "perplexity": _f(NUM),
        "accuracy": _f(NUM),
        "f1": _f(NUM),
        "bleu": _f(NUM),
        "rouge": _f(NUM),
        "extra": _f(NUM_MAP, names=True),
    },
    # Data quality of one batch on one rank.
    "batch": {
        "n_samples": _f(INT, True),
        "length_edges": _f(INT_LIST),  # histogram bin edges (len = len(counts) + 1)
        "length_counts": _f(INT_LIST),
        "length_mean": _f(FNUM),
        "length_max": _f(INT),
        "max_len": _f(INT),
        "over_length": _f(INT),
        "label_counts": _f(INT_MAP),  # class labels of a classification batch
        "supervised_share": _f(FNUM),  # language-model batch: share of supervised tokens
        "sample_hashes": _f(STR_LIST),  # truncated MD5 hex per sample
        "sample_ids": _f(STR_LIST),  # the caller's own sample ids, when given
        "epoch": _f(INT),  # the data's epoch (a sample seen again in a new one is no repeat)
    },
    # Host + all its GPUs, from the per-host sampler.
    "hw": {
        "mem_available_bytes": _f(INT),
        "mem_total_bytes": _f(INT),
        "cpu_percent": _f(FNUM),
        # [{"device", "read_mb_s", "write_mb_s", "io_latency_ms"}]
        "disks": _f(OBJ_LIST),
        # [{"iface", "rx_mb_s", "tx_mb_s"}]
        "nets": _f(OBJ_LIST),
        # [{"index", "uuid", "name", "mem_used_bytes", "mem_total_bytes", "util_gpu",
        #   "util_mem", "power_w", "temp_c", "sm_clock_mhz", "throttle_reasons",
        #   "ecc_corrected", "ecc_uncorrected", "xid_count", "xid_last",
        #   "pcie_tx_mb_s", "pcie_rx_mb_s", "energy_j"}]
        "gpus": _f(OBJ_LIST),
        "gpu_status": _f(STR),  # "ok" | "no_nvml" | "no_gpu" | error text
    },
    # The Python stacks of a rank that stopped stepping while its process lives.
    "stacks": {
        "stalled_s": _f(FNUM, True),  # since the last log_step
        "last_step": _f(INT),
        "threads": _f(OBJ_LIST, True),  # [{"name", "id", "stack"}], stack as text
    },
    # Inter-rank communication probe.
    "comm": {
        "op": _f(STR, True),  # "all_reduce" | "send_recv"
        "peer": _f(INT),
        "latency_ms": _f(NUM, True),
        "bytes": _f(INT),
        "backend": _f(STR),
    },
    # The producer's own health: what it dropped, spooled and sent.
    "health": {
        "dropped": _f(INT_MAP),  # reason -> count since start
        "sent": _f(INT),
        "spooled": _f(INT),
        "spool_bytes": _f(INT),
        "replayed": _f(INT),
        "errors": _f(INT_MAP),
        "queue_len": _f(INT),
    },
    # Outputs of the stream jobs.
    "signal": {
        "name": _f(STR, True),  # detector, e.g. "volatility", "spike", "arima"
        "metric": _f(STR, True),
        "value": _f(NUM),
        "score": _f(FNUM),  # 0..1
        "expected": _f(NUM),
        "lower": _f(NUM),
        "upper": _f(NUM),
        "detail": _f(OBJ),
    },
    "alert": {
        "rule": _f(STR, True),
        "severity": _f(STR, True),  # "info" | "warning" | "critical"
        "state": _f(STR, True),  # "firing" | "resolved"
        "scope": _f(STR, True),  # e.g. "run", "rank:3", "gpu:n1/0"
        "hint": _f(STR, True),
        "summary": _f(STR),
        "fingerprint": _f(STR, True),  # stable per run + rule + scope
        "started_step": _f(INT),
        "evidence": _f(OBJ),
    },
    # A record some consumer could not use, with the reason.
    "dead_letter": {
        "reason": _f(STR, True),
        "source_topic": _f(STR),
        "partition": _f(INT),
        "offset": _f(INT),
        "consumer": _f(STR),
        "payload": _f(STR),  # original bytes, decoded as UTF-8 with replacement, truncated
    },
}

# One entry of a step_batch: a step payload with its own step and time.
STEP_ENTRY: Final[dict[str, Field]] = {
    "step": _f(INT, True, low=0),
    "time_ns": _f(INT, True),
    **KINDS["step"],
}

RUN_RANK: Final = -1  # rank of records about the whole run (stream-job outputs)
SEVERITIES: Final = ("info", "warning", "critical")
ALERT_STATES: Final = ("firing", "resolved")
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


@dataclass(frozen=True)
class Record:
    """A validated record. ``data`` holds Python floats (NaN/inf restored)."""

    kind: str
    run_id: str
    rank: int
    local_rank: int
    host: str
    pid: int
    seq: int
    time_ns: int
    data: dict[str, Any]
    step: int | None = None
    v: int = SCHEMA_VERSION

    @property
    def key(self) -> bytes:
        return record_key(self.run_id, self.rank)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "v": self.v,
            "kind": self.kind,
            "run_id": self.run_id,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "host": self.host,
            "pid": self.pid,
            "seq": self.seq,
            "time_ns": self.time_ns,
            "data": self.data,
        }
        if self.step is not None:
            d["step"] = self.step
        return d


@dataclass(frozen=True)
class DecodeError:
    """Why a record was rejected. ``path`` names the offending field, if any."""

    reason: str
    path: str = ""
    raw_prefix: bytes = field(default=b"", repr=False)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class SchemaError(ValueError):
    """Raised by ``encode`` when a record cannot be put on the wire."""


_NAME_RE: Final = re.compile(NAME_PATTERN)


def valid_name(name: object) -> bool:
    """Whether ``name`` may name a metric (the rule every decoder applies)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NAME_LEN
        and _NAME_RE.search(name) is not None
    )


def record_key(run_id: str, rank: int) -> bytes:
    """Kafka key: all records of one rank of one run land in one partition, in order."""
    return f"{run_id}:{rank}".encode()
