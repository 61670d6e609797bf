"""Wire schema v1: the one definition of every record steplens sends.

A record is a JSON object (UTF-8), one per Kafka message:

    {"v": 1, "kind": "step", "run_id": "r1", "rank": 0, "local_rank": 0, "host": "n1",
     "pid": 123, "seq": 42, "time_ns": 1700000000000000000, "step": 100, "data": {...}}

The envelope is the same for every kind; ``data`` holds the kind's fields (see ``KINDS``).
Non-finite floats travel as the strings "NaN", "Infinity", "-Infinity" in fields that allow
them (a NaN loss is a fact to report, not an encoding error). Inside free-form objects
("obj" and "list[obj]" fields) those three strings always read back as floats.

Why JSON: readable by every tool (kafka-console-consumer, DuckDB, jq), no extra dependency in
training environments, and the encode cost is paid in the producer's worker thread, never in
the caller's (see bench/bench_encoding.py for json vs orjson vs msgpack). orjson is used when
installed.

``decode`` never raises: it returns a ``Record`` or a ``DecodeError`` with a clear reason.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

_orjson: Any
try:  # optional accelerator, same bytes on the wire
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

SCHEMA_VERSION: Final = 1
MAX_RECORD_BYTES: Final = 1 << 20  # 1 MiB; Kafka's default message.max.bytes is about the same
MAX_STR_LEN: Final = 4096
MAX_LIST_LEN: Final = 65536

# Field types. "num" is a float that may be non-finite; "fnum" must be finite.
NUM, FNUM, INT, STR, BOOL = "num", "fnum", "int", "str", "bool"
NUM_MAP = "map[str,num]"  # free-form scalar metrics
INT_MAP = "map[str,int]"  # counters
STR_LIST = "list[str]"
NUM_LIST = "list[num]"
INT_LIST = "list[int]"
OBJ_LIST = "list[obj]"  # list of flat objects with scalar values
OBJ = "obj"  # any JSON object (free-form facts)


@dataclass(frozen=True)
class Field:
    type: str
    required: bool = False


def _f(t: str, required: bool = False) -> Field:
    return Field(t, required)


ENVELOPE: Final[dict[str, Field]] = {
    "v": _f(INT, True),
    "kind": _f(STR, True),
    "run_id": _f(STR, True),
    "rank": _f(INT, True),
    "local_rank": _f(INT, True),
    "host": _f(STR, True),
    "pid": _f(INT, True),
    "seq": _f(INT, True),
    "time_ns": _f(INT, True),
    "step": _f(INT),
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
        "scalars": _f(NUM_MAP),
        # why this raw record was sent: "sample" | "guard" | "every"
        "reason": _f(STR),
    },
    # Aggregate of every step metric seen in a window: never hides a spike.
    "step_window": {
        "step_first": _f(INT, True),
        "step_last": _f(INT, True),
        "count": _f(INT, True),
        "duration_s": _f(FNUM),
        # metric -> {"count", "mean", "min", "max", "last", "nonfinite"}
        "metrics": _f(OBJ, True),
    },
    "eval": {
        "split": _f(STR, True),
        "loss": _f(NUM),
        "perplexity": _f(NUM),
        "accuracy": _f(NUM),
        "f1": _f(NUM),
        "bleu": _f(NUM),
        "rouge": _f(NUM),
        "extra": _f(NUM_MAP),
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
        "label_counts": _f(INT_MAP),
        "sample_hashes": _f(STR_LIST),  # truncated MD5 hex per sample
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

RUN_RANK: Final = -1  # rank of records about the whole run (stream-job outputs)
SEVERITIES: Final = ("info", "warning", "critical")
ALERT_STATES: Final = ("firing", "resolved")

_NONFINITE_TO_STR: Final = {math.inf: "Infinity", -math.inf: "-Infinity"}
_STR_TO_NONFINITE: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


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


def record_key(run_id: str, rank: int) -> bytes:
    """Kafka key: all records of one rank of one run land in one partition, in order."""
    return f"{run_id}:{rank}".encode()


# --------------------------------------------------------------------------- encode


def _wire_value(value: Any) -> Any:
    """Replace non-finite floats by their string names, recursively (lists and dicts)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if value in _NONFINITE_TO_STR:
            return _NONFINITE_TO_STR[value]
        return value
    if isinstance(value, dict):
        return {k: _wire_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_wire_value(v) for v in value]
    return value


def _dumps(obj: Any) -> bytes:
    if _orjson is not None:
        try:
            return _orjson.dumps(obj)
        except TypeError as exc:
            raise SchemaError(f"not JSON-serialisable: {exc}") from None
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"not JSON-serialisable: {exc}") from None


def encode(record: Mapping[str, Any] | Record) -> bytes:
    """Serialise a record (a ``Record`` or an envelope dict). Raises ``SchemaError``."""
    d = record.to_dict() if isinstance(record, Record) else dict(record)
    d.setdefault("v", SCHEMA_VERSION)
    out = _dumps(_wire_value(d))
    if len(out) > MAX_RECORD_BYTES:
        raise SchemaError(f"record is {len(out)} bytes, over the {MAX_RECORD_BYTES} limit")
    return out


def make_record(
    kind: str,
    data: dict[str, Any],
    *,
    run_id: str,
    rank: int = 0,
    local_rank: int = 0,
    host: str = "localhost",
    pid: int = 0,
    seq: int = 0,
    time_ns: int = 0,
    step: int | None = None,
) -> Record:
    """Build and validate a record; raises ``SchemaError`` when it would not decode."""
    rec = Record(kind, run_id, rank, local_rank, host, pid, seq, time_ns, data, step)
    checked = validate(rec.to_dict())
    if isinstance(checked, DecodeError):
        raise SchemaError(str(checked))
    return checked


# --------------------------------------------------------------------------- decode


def decode(raw: bytes | bytearray | memoryview | str | None) -> Record | DecodeError:
    """Parse and validate wire bytes. Never raises."""
    try:
        if raw is None:
            return DecodeError("empty message (null value)")
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogatepass")
        raw = bytes(raw)
        prefix = raw[:64]
        if len(raw) > MAX_RECORD_BYTES:
            return DecodeError(
                f"record is {len(raw)} bytes, over the {MAX_RECORD_BYTES} limit", "", prefix
            )
        if not raw.strip():
            return DecodeError("empty message", "", prefix)
        try:
            obj = _orjson.loads(raw) if _orjson is not None else json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return DecodeError(f"not valid JSON: {exc}", "", prefix)
        result = validate(obj)
        if isinstance(result, DecodeError):
            return DecodeError(result.reason, result.path, prefix)
        return result
    except Exception as exc:  # a decoder must not take a consumer down
        return DecodeError(f"internal decoder error: {type(exc).__name__}: {exc}")


def validate(obj: Any) -> Record | DecodeError:
    """Validate an already-parsed envelope dict (wire form). Never raises."""
    if not isinstance(obj, dict):
        return DecodeError(f"expected a JSON object, got {type(obj).__name__}")
    version = obj.get("v")
    if version != SCHEMA_VERSION:
        return DecodeError(
            f"unsupported schema version {version!r} (this decoder reads {SCHEMA_VERSION})", "v"
        )
    unknown = set(obj) - set(ENVELOPE)
    if unknown:
        return DecodeError(f"unknown envelope field(s) {sorted(unknown)}", sorted(unknown)[0])
    env: dict[str, Any] = {}
    for name, spec in ENVELOPE.items():
        if name not in obj or obj[name] is None:
            if spec.required:
                return DecodeError("missing required field", name)
            continue
        value = _check(obj[name], spec.type, name)
        if isinstance(value, DecodeError):
            return value
        env[name] = value
    kind = env["kind"]
    spec_fields = KINDS.get(kind)
    if spec_fields is None:
        return DecodeError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})", "kind")
    for name in ("local_rank", "seq", "pid"):
        if env[name] < 0:
            return DecodeError("must be >= 0", name)
    if env["rank"] < RUN_RANK:
        return DecodeError(f"must be >= {RUN_RANK} ({RUN_RANK}: the whole run)", "rank")
    if not env["run_id"]:
        return DecodeError("must not be empty", "run_id")
    data_in = env["data"]
    unknown = set(data_in) - set(spec_fields)
    if unknown:
        name = sorted(unknown)[0]
        return DecodeError(f"unknown field for kind {kind!r}", f"data.{name}")
    data: dict[str, Any] = {}
    for name, spec in spec_fields.items():
        if name not in data_in or data_in[name] is None:
            if spec.required:
                return DecodeError(f"missing required field for kind {kind!r}", f"data.{name}")
            continue
        value = _check(data_in[name], spec.type, f"data.{name}")
        if isinstance(value, DecodeError):
            return value
        data[name] = value
    if kind == "alert":
        if data["severity"] not in SEVERITIES:
            return DecodeError(f"severity must be one of {SEVERITIES}", "data.severity")
        if data["state"] not in ALERT_STATES:
            return DecodeError(f"state must be one of {ALERT_STATES}", "data.state")
    return Record(
        kind=kind,
        run_id=env["run_id"],
        rank=env["rank"],
        local_rank=env["local_rank"],
        host=env["host"],
        pid=env["pid"],
        seq=env["seq"],
        time_ns=env["time_ns"],
        data=data,
        step=env.get("step"),
        v=env["v"],
    )


def _num(value: Any, path: str, finite: bool) -> float | DecodeError:
    if isinstance(value, bool):
        return DecodeError("expected a number, got a boolean", path)
    if isinstance(value, (int, float)):
        f = float(value)
    elif isinstance(value, str) and value in _STR_TO_NONFINITE:
        f = _STR_TO_NONFINITE[value]
    else:
        return DecodeError(f"expected a number, got {type(value).__name__}", path)
    if finite and not math.isfinite(f):
        return DecodeError("non-finite value not allowed here", path)
    return f


def _check(value: Any, typ: str, path: str) -> Any:
    """Return the Python value for a wire value of type ``typ``, or a DecodeError."""
    if typ in (NUM, FNUM):
        return _num(value, path, typ == FNUM)
    if typ == INT:
        if isinstance(value, bool) or not isinstance(value, int):
            return DecodeError(f"expected an integer, got {type(value).__name__}", path)
        if abs(value) >= 1 << 63:
            return DecodeError("integer out of the 64-bit range", path)
        return value
    if typ == STR:
        if not isinstance(value, str):
            return DecodeError(f"expected a string, got {type(value).__name__}", path)
        if len(value) > MAX_STR_LEN:
            return DecodeError(f"string longer than {MAX_STR_LEN} characters", path)
        return value
    if typ == BOOL:
        if not isinstance(value, bool):
            return DecodeError(f"expected a boolean, got {type(value).__name__}", path)
        return value
    if typ in (NUM_MAP, INT_MAP):
        if not isinstance(value, dict):
            return DecodeError(f"expected an object, got {type(value).__name__}", path)
        out: dict[str, Any] = {}
        inner = NUM if typ == NUM_MAP else INT
        for k, v in value.items():
            if len(k) > MAX_STR_LEN:
                return DecodeError("key too long", path)
            checked = _check(v, inner, f"{path}.{k}")
            if isinstance(checked, DecodeError):
                return checked
            out[k] = checked
        return out
    if typ in (STR_LIST, NUM_LIST, INT_LIST, OBJ_LIST):
        if not isinstance(value, list):
            return DecodeError(f"expected a list, got {type(value).__name__}", path)
        if len(value) > MAX_LIST_LEN:
            return DecodeError(f"list longer than {MAX_LIST_LEN}", path)
        inner = {STR_LIST: STR, NUM_LIST: NUM, INT_LIST: INT, OBJ_LIST: "flat"}[typ]
        items = []
        for i, v in enumerate(value):
            checked = _check(v, inner, f"{path}[{i}]")
            if isinstance(checked, DecodeError):
                return checked
            items.append(checked)
        return items
    if typ == "flat":
        if not isinstance(value, dict):
            return DecodeError(f"expected an object, got {type(value).__name__}", path)
        flat: dict[str, Any] = {}
        for k, v in value.items():
            if isinstance(v, (dict, list)):
                return DecodeError("nested values not allowed here", f"{path}.{k}")
            flat[k] = _STR_TO_NONFINITE.get(v, v) if isinstance(v, str) else v
        return flat
    if typ == "payload":
        if not isinstance(value, dict):
            return DecodeError(f"expected an object, got {type(value).__name__}", path)
        return value
    if typ == OBJ:
        if not isinstance(value, dict):
            return DecodeError(f"expected an object, got {type(value).__name__}", path)
        return _restore(value)
    return DecodeError(f"schema has no type {typ!r}", path)  # pragma: no cover


def _restore(value: Any) -> Any:
    """Turn the non-finite string names back into floats inside free-form objects."""
    if isinstance(value, str):
        return _STR_TO_NONFINITE.get(value, value)
    if isinstance(value, dict):
        return {k: _restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value
