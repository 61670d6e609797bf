"""The schema v1 checks as first written, in plain Python: the reference the codec is held to.

Property tests decode the same bytes with ``steplens.schema.codec`` and with this module and
compare the verdicts and the records. Kept as written for v1 (only the fast path around it was
dropped), plus the two rules added since: metric names (``valid_name``) and steps >= 0. It is
not used by the product.
"""

from __future__ import annotations

import json
import math
from typing import Any

from steplens.schema import (
    ALERT_STATES,
    BOOL,
    ENVELOPE,
    FNUM,
    INT,
    INT_LIST,
    INT_MAP,
    KINDS,
    MAX_BATCH_ENTRIES,
    MAX_LIST_LEN,
    MAX_STR_LEN,
    NUM,
    NUM_LIST,
    NUM_MAP,
    OBJ,
    OBJ_LIST,
    RUN_RANK,
    SCHEMA_VERSION,
    SEVERITIES,
    STEP_ENTRIES,
    STEP_ENTRY,
    STR,
    STR_LIST,
    DecodeError,
    Field,
    Record,
    valid_name,
)

_STR_TO_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _no_constants(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")


def decode(raw: bytes) -> Record | DecodeError:
    """Parse (strict JSON) and check with the reference checks."""
    try:
        obj = json.loads(raw, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return DecodeError(f"not valid JSON: {exc}")
    try:
        return validate(obj)
    except RecursionError:
        return DecodeError("nested too deeply")


def validate(obj: Any) -> Record | DecodeError:
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
    if env.get("step") is not None and env["step"] < 0:
        return DecodeError("must be >= 0", "step")
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
        if spec.names and not all(valid_name(k) for k in value):
            return DecodeError("bad metric name", f"{path}.{name}")
        if name == "step" and value < 0:
            return DecodeError("must be >= 0", f"{path}.{name}")
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
