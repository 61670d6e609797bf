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
Every consumer decodes every message, so plain records take checks compiled once from the
tables (the fast path at the end of this module); anything unusual, and every error, takes the
full checks, with the same results.

``step_batch`` carries many complete step records of one rank in one message (a consumer pays a
fixed cost per message): ``data = {"records": [entry, ...]}``, each entry a ``step`` payload plus
its own ``step`` and ``time_ns``; the envelope's ``step`` and ``time_ns`` are the last entry's.
``unbatch`` turns it back into the ``step`` records it stands for. The kind was added within
version 1: a decoder without it dead-letters such a record with "unknown kind".
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
MAX_BATCH_ENTRIES: Final = 4096  # entries of one step_batch record

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

# One entry of a step_batch: a step payload with its own step and time.
STEP_ENTRY: Final[dict[str, Field]] = {
    "step": _f(INT, True),
    "time_ns": _f(INT, True),
    **KINDS["step"],
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
    out = None
    if _orjson is not None:
        try:
            out = _orjson.dumps(d)
        except TypeError:
            out = None  # the checked path below names the problem
        # orjson writes a non-finite float as null: without any null, none was there
        if out is not None and b"null" in out:
            out = None
    if out is None:
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
        if type(raw) is not bytes:
            if isinstance(raw, str):
                raw = raw.encode("utf-8", "surrogatepass")
            raw = bytes(raw)
        if len(raw) > MAX_RECORD_BYTES:
            return DecodeError(
                f"record is {len(raw)} bytes, over the {MAX_RECORD_BYTES} limit", "", raw[:64]
            )
        try:
            obj = _orjson.loads(raw) if _orjson is not None else json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            if not raw.strip():  # checked once the parse failed: no copy for good input
                return DecodeError("empty message", "", raw[:64])
            return DecodeError(f"not valid JSON: {exc}", "", raw[:64])
        if type(obj) is dict:
            try:
                fast = _validate_fast(obj, raw)
            except Exception:  # unusual values: validate decides
                fast = _BAD
            if fast is not _BAD:
                return fast
        result = validate(obj)
        if isinstance(result, DecodeError):
            return DecodeError(result.reason, result.path, raw[:64])
        return result
    except Exception as exc:  # a decoder must not take a consumer down
        return DecodeError(f"internal decoder error: {type(exc).__name__}: {exc}")


def unbatch(rec: Record) -> list[Record]:
    """The ``step`` records a ``step_batch`` stands for, in order; any other record: ``[rec]``.

    Each has the batch's envelope, the entry's ``step`` and ``time_ns``, and the rest of the
    entry as ``data`` (as decoding that step record sent alone would give).
    """
    if rec.kind != "step_batch":
        return [rec]
    base = {
        "kind": "step",
        "run_id": rec.run_id,
        "rank": rec.rank,
        "local_rank": rec.local_rank,
        "host": rec.host,
        "pid": rec.pid,
        "seq": rec.seq,
    }
    v = rec.v
    out = []
    for entry in rec.data["records"]:
        data = entry.copy()
        step = data.pop("step")
        time_ns = data.pop("time_ns")
        step_rec = _new(Record)
        # Record's attributes in its order, as _validate_fast builds them
        _setattr(
            step_rec, "__dict__", {**base, "time_ns": time_ns, "data": data, "step": step, "v": v}
        )
        out.append(step_rec)
    return out


def validate(obj: Any) -> Record | DecodeError:
    """Validate an already-parsed envelope dict (wire form). Never raises."""
    if type(obj) is dict:
        try:
            fast = _validate_fast(obj, None)
        except Exception:  # unusual values: the full checks below decide
            fast = _BAD
        if fast is not _BAD:
            return fast
    # The full checks: every error (and every unusual but valid value) is decided here.
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
    data = _check_fields(env["data"], spec_fields, "data", f"kind {kind!r}")
    if isinstance(data, DecodeError):
        return data
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


def _check_fields(
    data_in: dict[str, Any], fields: dict[str, Field], path: str, what: str
) -> dict[str, Any] | DecodeError:
    """Check an object against a field table: unknown names rejected, nulls mean absent."""
    unknown = set(data_in) - set(fields)
    if unknown:
        return DecodeError(f"unknown field for {what}", f"{path}.{sorted(unknown)[0]}")
    data: dict[str, Any] = {}
    for name, spec in fields.items():
        if name not in data_in or data_in[name] is None:
            if spec.required:
                return DecodeError(f"missing required field for {what}", f"{path}.{name}")
            continue
        value = _check(data_in[name], spec.type, f"{path}.{name}")
        if isinstance(value, DecodeError):
            return value
        data[name] = value
    return data


def _check_entries(value: Any, path: str) -> list[dict[str, Any]] | DecodeError:
    if not isinstance(value, list):
        return DecodeError(f"expected a list, got {type(value).__name__}", path)
    if not 0 < len(value) <= MAX_BATCH_ENTRIES:
        return DecodeError(f"expected 1 to {MAX_BATCH_ENTRIES} entries, got {len(value)}", path)
    entries = []
    for i, entry in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(entry, dict):
            return DecodeError(f"expected an object, got {type(entry).__name__}", where)
        checked = _check_fields(entry, STEP_ENTRY, where, "a step_batch entry")
        if isinstance(checked, DecodeError):
            return checked
        entries.append(checked)
    return entries


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
    if typ == STEP_ENTRIES:
        return _check_entries(value, path)
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


# --------------------------------------------------------------------------- fast path
# ``validate`` and ``decode`` first try the checks below, compiled once from ENVELOPE and KINDS.
# They accept only plain values (exact JSON types, in range) and give up with ``_BAD`` on
# anything else, so every error and every unusual value goes through the full checks above:
# same results, same reasons and paths. Two tables of container checkers:
# - ``_COPY`` copies containers and restores non-finite names, as the full checks do;
# - ``_OWN`` returns the containers it was given, for ``decode``: they come fresh from the
#   parser (nobody else holds them) and the bytes hold no non-finite name to restore.
# Plain loops over ``type(x) is T`` are the fastest form in CPython here (map(type, ...) is not).

_BAD: Final[Any] = object()  # "not sure": let the full checks decide
_MISS: Final[Any] = object()  # an entry checker for other names
_I64: Final = 1 << 63  # integers must satisfy abs(x) < _I64
_NONFINITE_NAMES: Final = frozenset(_STR_TO_NONFINITE)
# Free-form objects are taken unwalked (``_OWN``) only from shallow records, so a deep one still
# meets the full checks' recursion limit, as before.
_OWN_MAX_BRACKETS: Final = 256
_new = object.__new__
_setattr = object.__setattr__


def _fast_num(v: Any) -> Any:
    t = type(v)
    if t is float:
        return v
    if t is int and -_I64 < v < _I64:
        return float(v)
    if t is str:
        return _STR_TO_NONFINITE.get(v, _BAD)
    return _BAD


def _fast_fnum(v: Any) -> Any:
    t = type(v)
    if t is float:
        return v if v - v == 0.0 else _BAD  # inf - inf and NaN - NaN are NaN
    if t is int and -_I64 < v < _I64:
        return float(v)
    return _BAD


def _own_num_map(v: Any) -> Any:
    if type(v) is not dict:
        return _BAD
    for k, x in v.items():
        if len(k) > MAX_STR_LEN:  # parsed JSON: keys are str
            return _BAD
        if type(x) is not float:  # ints to convert, or something the full checks judge
            out = {k: _fast_num(x) for k, x in v.items()}
            return _BAD if _BAD in out.values() else out
    return v


def _own_int_map(v: Any) -> Any:
    if type(v) is not dict:
        return _BAD
    for k, x in v.items():
        if len(k) > MAX_STR_LEN or type(x) is not int or not -_I64 < x < _I64:
            return _BAD
    return v


def _own_str_list(v: Any) -> Any:
    if type(v) is not list or len(v) > MAX_LIST_LEN:
        return _BAD
    for x in v:
        if type(x) is not str or len(x) > MAX_STR_LEN:
            return _BAD
    return v


def _own_num_list(v: Any) -> Any:
    if type(v) is not list or len(v) > MAX_LIST_LEN:
        return _BAD
    for x in v:
        if type(x) is not float:
            out = [_fast_num(x) for x in v]
            return _BAD if _BAD in out else out
    return v


def _own_int_list(v: Any) -> Any:
    if type(v) is not list or len(v) > MAX_LIST_LEN:
        return _BAD
    for x in v:
        if type(x) is not int or not -_I64 < x < _I64:
            return _BAD
    return v


def _own_flat(v: Any) -> Any:
    if type(v) is not dict:
        return _BAD
    for x in v.values():
        t = type(x)
        if t is str:
            if x in _NONFINITE_NAMES:
                return _copy_flat(v)
        elif t is dict or t is list:  # parser output: no subclasses, no other containers
            return _BAD
    return v


def _own_obj_list(v: Any) -> Any:
    if type(v) is not list or len(v) > MAX_LIST_LEN:
        return _BAD
    for x in v:
        if _own_flat(x) is not x:  # _BAD, or a copy with names restored
            out = [_own_flat(x) for x in v]
            return _BAD if _BAD in out else out
    return v


def _own_obj(v: Any) -> Any:
    return v if type(v) is dict else _BAD  # see _walk_free_form


def _walk_free_form(raw: bytes) -> bool:
    """Whether the free-form objects of a record must be walked (``_COPY``) to restore names."""
    return (
        (b"N" in raw and b"NaN" in raw)  # one-byte searches first: much faster
        or (b"I" in raw and b"Infinity" in raw)
        or b"\\" in raw  # an escape could spell a name: "\\u004eaN"
        or raw.count(b"{") + raw.count(b"[") > _OWN_MAX_BRACKETS
    )


def _copied(own: Any) -> Any:
    """The ``_COPY`` checker of a type whose ``_OWN`` checker only checks (or converts)."""

    def check(v: Any) -> Any:
        out = own(v)
        return out.copy() if out is v else out

    return check


def _copy_flat(v: Any) -> Any:
    if type(v) is not dict:
        return _BAD
    restore = False
    for x in v.values():
        t = type(x)
        if t is str:
            if x in _NONFINITE_NAMES:
                restore = True
        elif t is not float and t is not int and t is not bool and x is not None:
            return _BAD
    if restore:
        return {k: _STR_TO_NONFINITE.get(x, x) if type(x) is str else x for k, x in v.items()}
    return v.copy()


def _copy_obj_list(v: Any) -> Any:
    if type(v) is not list or len(v) > MAX_LIST_LEN:
        return _BAD
    out = [_copy_flat(x) for x in v]
    return _BAD if _BAD in out else out


def _copy_restore(v: Any) -> Any:
    """``_restore`` for exact JSON types; anything else is left to ``_restore`` itself."""
    t = type(v)
    if t is dict:
        for x in v.values():
            tx = type(x)
            if tx is str:
                if x in _NONFINITE_NAMES:
                    break
            elif tx is not float and tx is not int and tx is not bool and x is not None:
                break
        else:
            return v.copy()  # flat and nothing to restore
        return {k: _copy_restore(x) for k, x in v.items()}
    if t is list:
        return [_copy_restore(x) for x in v]
    if t is str:
        return _STR_TO_NONFINITE.get(v, v)
    if t is float or t is int or t is bool or v is None:
        return v
    return _restore(v)


def _copy_obj(v: Any) -> Any:
    return _copy_restore(v) if type(v) is dict else _BAD


def _own_step_entries(v: Any) -> Any:
    return _step_entries(v, _OWN)


def _copy_step_entries(v: Any) -> Any:
    return _step_entries(v, _COPY)


def _step_entries(v: Any, table: dict[str, Any]) -> Any:
    """Each entry through a compiled STEP_ENTRY checker (a new dict per entry): the one for the
    names of the entry before it while they are the same, else the one for its names."""
    if type(v) is not list or not 0 < len(v) <= MAX_BATCH_ENTRIES:
        return _BAD
    check = None
    out: list[dict[str, Any]] = []
    append = out.append
    for x in v:
        if type(x) is not dict:
            return _BAD
        entry = _MISS if check is None else check(x, table)
        if entry is _MISS:
            check = _entry_checker(x)
            entry = check(x, table)
        if entry is _BAD:
            return _BAD
        append(entry)
    return out


# Checkers of the types not tested inline (see _payload_source).
_OWN: Final[dict[str, Any]] = {
    NUM: _fast_num,
    FNUM: _fast_fnum,
    NUM_MAP: _own_num_map,
    INT_MAP: _own_int_map,
    STR_LIST: _own_str_list,
    NUM_LIST: _own_num_list,
    INT_LIST: _own_int_list,
    OBJ_LIST: _own_obj_list,
    OBJ: _own_obj,
    STEP_ENTRIES: _own_step_entries,
}
_COPY: Final[dict[str, Any]] = {
    **{t: _copied(check) for t, check in _OWN.items()},
    NUM: _fast_num,
    FNUM: _fast_fnum,
    OBJ_LIST: _copy_obj_list,
    OBJ: _copy_obj,
    STEP_ENTRIES: _copy_step_entries,
}

# The accept-unchanged test of each scalar type, inline in the generated payload checkers.
_PLAIN_TEST: Final = {
    NUM: "type(x) is float",
    INT: "type(x) is int and -_I64 < x < _I64",
    STR: "type(x) is str and len(x) <= MAX_STR_LEN",
    BOOL: "type(x) is bool",
}


def _check_lines(spec: Field, ind: str) -> list[str]:
    """The checks of one present, non-null value ``x`` (converted in place, or return _BAD)."""
    test = _PLAIN_TEST.get(spec.type)
    if test is None:  # a container, or a finite number
        return [f"{ind}x = table[{spec.type!r}](x)", f"{ind}if x is _BAD:", f"{ind}    return _BAD"]
    if spec.type == NUM:  # an int or a non-finite name is converted
        return [
            f"{ind}if not ({test}):",
            f"{ind}    x = _fast_num(x)",
            f"{ind}    if x is _BAD:",
            f"{ind}        return _BAD",
        ]
    return [f"{ind}if not ({test}):", f"{ind}    return _BAD"]


def _payload_source(kind: str, fields: dict[str, Field]) -> str:
    """Straight-line checker of one kind's payload: no per-field loop, no call for scalars.

    ``check(data_in, table)`` returns the checked data dict in table order, or _BAD: a required
    field missing, a value the fast checks do not accept, an unknown name or a null value.
    """
    lines = [f"def _payload_{kind}(data_in, table):", "    get = data_in.get", "    data = {}"]
    for name, spec in fields.items():
        lines.append(f"    x = get({name!r})")
        if spec.required:
            lines += ["    if x is None:", "        return _BAD"]
            ind = "    "
        else:
            lines.append("    if x is not None:")
            ind = "        "
        lines += _check_lines(spec, ind)
        lines.append(f"{ind}data[{name!r}] = x")
    lines.append("    return data if len(data) == len(data_in) else _BAD")
    return "\n".join(lines) + "\n"


def _entry_source(names: list[str]) -> str:
    """Straight-line checker of the step entries that have exactly ``names`` (table names, the
    required ones among them): each value taken by name, not one ``get`` per table field, and
    checked as ``_payload_step_entry`` checks it. ``_MISS`` for an entry with other names."""
    lines = [
        "def _entry(data_in, table):",
        f"    if len(data_in) != {len(names)}:",
        "        return _MISS",
        "    try:",
        *(f"        v{i} = data_in[{name!r}]" for i, name in enumerate(names)),
        "    except KeyError:",
        "        return _MISS",
    ]
    for i, name in enumerate(names):  # a null value fails each type's check
        lines.append(f"    x = v{i}")
        lines += _check_lines(STEP_ENTRY[name], "    ")
        lines.append(f"    v{i} = x")
    body = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
    lines.append(f"    return {{{body}}}")
    return "\n".join(lines) + "\n"


def _compile(source: str, name: str) -> Any:
    scope: dict[str, Any] = {
        "_BAD": _BAD,
        "_MISS": _MISS,
        "_I64": _I64,
        "MAX_STR_LEN": MAX_STR_LEN,
        "_fast_num": _fast_num,
    }
    exec(source, scope)  # source built from the tables only
    return scope[name]


def _compile_payload(kind: str, fields: dict[str, Field]) -> Any:
    return _compile(_payload_source(kind, fields), f"_payload_{kind}")


# the names of step entries (a producer sends the same few in every entry) -> their checker
_ENTRY_CHECKS: Final[dict[frozenset[str], Any]] = {}
_ENTRY_CHECKS_MAX: Final = 256


def _entry_checker(entry: dict[str, Any]) -> Any:
    """The checker compiled for ``entry``'s names, or the table's checker for names that are
    not table names, lack a required one, or once too many sets of names were seen."""
    names = frozenset(entry)
    check = _ENTRY_CHECKS.get(names)
    if check is not None:
        return check
    known = [name for name in STEP_ENTRY if name in names]
    required = all(name in names for name, spec in STEP_ENTRY.items() if spec.required)
    if len(known) != len(names) or not required or len(_ENTRY_CHECKS) >= _ENTRY_CHECKS_MAX:
        return _check_entry
    check = _ENTRY_CHECKS[names] = _compile(_entry_source(known), "_entry")
    return check


# kind -> its payload checker, compiled once from KINDS
_PAYLOAD_CHECKS: Final = {kind: _compile_payload(kind, fields) for kind, fields in KINDS.items()}
_check_entry: Final = _compile_payload("step_entry", STEP_ENTRY)
_FREE_FORM_KINDS: Final = frozenset(
    k for k, f in KINDS.items() if any(spec.type == OBJ for spec in f.values())
)


def _validate_fast(obj: dict[str, Any], raw: bytes | None) -> Any:
    """A ``Record`` for a plain valid envelope dict, else ``_BAD``. Checks ENVELOPE by hand.

    ``raw``: the bytes ``obj`` was just parsed from (its containers are taken, ``_OWN``), or
    None for a caller's dict (containers are copied, ``_COPY``).
    """
    get = obj.get
    v = get("v")
    kind = get("kind")
    run_id = get("run_id")
    rank = get("rank")
    local_rank = get("local_rank")
    host = get("host")
    pid = get("pid")
    seq = get("seq")
    time_ns = get("time_ns")
    step = get("step")
    data_in = get("data")
    if not (
        # all names known: the 10 required ones are checked below, "step" is optional
        len(obj) == (11 if "step" in obj else 10)
        and type(v) is int
        and v == SCHEMA_VERSION
        and type(kind) is str
        and type(run_id) is str
        and 0 < len(run_id) <= MAX_STR_LEN
        and type(host) is str
        and len(host) <= MAX_STR_LEN
        and type(rank) is int
        and type(local_rank) is int
        and type(pid) is int
        and type(seq) is int
        # all in [0, 2**63) at once: an OR of ints is negative when one is, and >= 2**63 when
        # one is (rank + 1 = 2**63 is valid but left to the full checks)
        and 0 <= (rank - RUN_RANK) | local_rank | pid | seq < _I64
        and type(time_ns) is int
        and -_I64 < time_ns < _I64
        and (step is None or (type(step) is int and -_I64 < step < _I64))
        and type(data_in) is dict
    ):
        return _BAD
    check = _PAYLOAD_CHECKS.get(kind)
    if check is None:
        return _BAD
    if raw is None or (kind in _FREE_FORM_KINDS and _walk_free_form(raw)):
        data = check(data_in, _COPY)
    else:
        data = check(data_in, _OWN)
    if data is _BAD:
        return _BAD
    if kind == "alert" and (
        data["severity"] not in SEVERITIES or data["state"] not in ALERT_STATES
    ):
        return _BAD
    rec = _new(Record)
    # the attributes Record.__init__ would set, in its order, without its frozen setattr calls
    _setattr(
        rec,
        "__dict__",
        {
            "kind": kind,
            "run_id": run_id,
            "rank": rank,
            "local_rank": local_rank,
            "host": host,
            "pid": pid,
            "seq": seq,
            "time_ns": time_ns,
            "data": data,
            "step": step,
            "v": v,
        },
    )
    return rec
