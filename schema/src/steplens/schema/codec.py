"""The codec of wire schema v1: one msgspec decoder of the declared record types (``kinds``).

``decode`` parses and validates in one pass in C (msgspec) against ``kinds.WireRecord``, the
tagged union on ``kind``: unknown fields, types, integer ranges, lengths and the allowed values
of ``v``, ``kind``, an alert's severity and state are all checked there, and an error names the
field path and the rule (``codec_errors``). It never raises. ``encode`` writes the same bytes as
the producers of v1 did (orjson's layout: compact, UTF-8 unescaped, non-finite floats as their
names, Python's float spelling); ``validate`` checks a record given as a dict (``make_record``).
``wire_value`` and ``restore`` map non-finite floats to their names and back, for any consumer
that writes or reads wire values itself.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final

import msgspec

from steplens.schema.codec_errors import explain
from steplens.schema.fields import payload_fields, struct_fields
from steplens.schema.kinds import (
    ENVELOPES,
    KINDS,
    MAX_RECORD_BYTES,
    NAN_NAMES,
    SCHEMA_VERSION,
    WireRecord,
)
from steplens.schema.metric_names import check_names
from steplens.schema.record import DecodeError, Record, SchemaError

_NONFINITE: Final = dict(zip(NAN_NAMES, (math.nan, math.inf, -math.inf), strict=True))
_DECODER: Final = msgspec.json.Decoder(WireRecord)
_PARSER: Final = msgspec.json.Decoder()  # untyped: only to explain an error
_ENCODER: Final = msgspec.json.Encoder()
_to_builtins = msgspec.to_builtins
_asdict = msgspec.structs.asdict
_KIND_OF: Final = {t: kind for kind, t in ENVELOPES.items()}
# kinds holding metric names (a step_batch in its entries' maps)
_NAMED_KINDS: Final = frozenset(
    kind
    for kind in KINDS
    if any(f.metric_names or f.entries for f in payload_fields(kind).values())
)
# Kinds of few fields holding large free-form values: their data is taken from the Struct as it
# is (msgspec.to_builtins would copy every container again); the others omit absent fields in C.
_SHALLOW_KINDS: Final = frozenset(
    kind
    for kind in KINDS
    if any(f.free_form for f in payload_fields(kind).values()) and len(payload_fields(kind)) <= 10
)
_new = object.__new__
_setattr = object.__setattr__


def _record(env: Any, data: dict[str, Any]) -> Record:
    rec = _new(Record)
    # Record's attributes in its order, without the frozen dataclass's setattr calls
    _setattr(
        rec,
        "__dict__",
        {
            "kind": _KIND_OF[type(env)],
            "run_id": env.run_id,
            "rank": env.rank,
            "local_rank": env.local_rank,
            "host": env.host,
            "pid": env.pid,
            "seq": env.seq,
            "time_ns": env.time_ns,
            "data": data,
            "step": env.step,
            "v": env.v,
        },
    )
    return rec


# ----------------------------------------------------------------------------- decode
def decode(raw: bytes | bytearray | memoryview | str | None) -> Record | DecodeError:
    """Parse and validate wire bytes. Never raises."""
    try:
        if raw is None:
            return DecodeError("empty message (null value)")
        if type(raw) is not bytes:
            raw = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
        if len(raw) > MAX_RECORD_BYTES:
            return DecodeError(
                f"record is {len(raw)} bytes, over the {MAX_RECORD_BYTES} limit", "", raw[:64]
            )
        try:
            env = _DECODER.decode(raw)
        except msgspec.ValidationError as exc:
            return explain(_PARSER.decode(raw), str(exc), raw[:64])
        except (msgspec.DecodeError, RecursionError) as exc:
            if not raw.strip():
                return DecodeError("empty message", "", raw[:64])
            return DecodeError(f"not valid JSON: {exc}", "", raw[:64])
        kind = _KIND_OF[type(env)]
        if kind in _SHALLOW_KINDS:  # the parsed containers as they are: no copy of them
            data = {k: v for k, v in _asdict(env.data).items() if v is not None}
        else:
            data = _to_builtins(env.data)
        # names to restore: only where the bytes could spell one ("\u" escapes included)
        if b"NaN" in raw or b"Infinity" in raw or b"\\u" in raw:
            data = restore_fields(data, KINDS[kind])
        if kind in _NAMED_KINDS:
            bad = check_names(kind, data, raw[:64])
            if bad is not None:
                return bad
        return _record(env, data)
    except Exception as exc:  # a decoder must not take a consumer down
        return DecodeError(f"internal decoder error: {type(exc).__name__}: {exc}")


def validate(obj: Any) -> Record | DecodeError:
    """Validate an already-parsed envelope dict (wire form, or Python floats). Never raises."""
    try:
        try:
            env = msgspec.convert(obj, WireRecord)
        except msgspec.ValidationError as exc:
            return explain(obj, str(exc), b"")
        kind = _KIND_OF[type(env)]
        data = restore_fields(_to_builtins(env.data), KINDS[kind])
        bad = check_names(kind, data, b"")
        return bad if bad is not None else _record(env, data)
    except Exception as exc:
        return DecodeError(f"internal decoder error: {type(exc).__name__}: {exc}")


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


def unbatch(rec: Record) -> list[Record]:
    """The ``step`` records a ``step_batch`` stands for, in order; any other record: ``[rec]``.

    Each has the batch's envelope, the entry's ``step`` and ``time_ns``, and the rest of the
    entry as ``data`` (as decoding that step record sent alone would give).
    """
    if rec.kind != "step_batch":
        return [rec]
    base = {"kind": "step", "run_id": rec.run_id, "rank": rec.rank}
    base.update(local_rank=rec.local_rank, host=rec.host, pid=rec.pid, seq=rec.seq)
    v = rec.v
    out = []
    for entry in rec.data["records"]:
        data = entry.copy()
        step = data.pop("step")
        time_ns = data.pop("time_ns")
        step_rec = _new(Record)
        _setattr(
            step_rec, "__dict__", {**base, "time_ns": time_ns, "data": data, "step": step, "v": v}
        )
        out.append(step_rec)
    return out


# ----------------------------------------------------------------------------- non-finite
def restore(value: Any) -> Any:
    """The non-finite names turned back into floats, recursively (free-form values)."""
    if isinstance(value, str):
        return _NONFINITE.get(value, value)
    if isinstance(value, dict):
        return {k: restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [restore(v) for v in value]
    return value


def _restore_in_place(value: Any) -> None:
    """``restore`` on containers the codec just made (nobody else holds them)."""
    items = value.items() if type(value) is dict else enumerate(value)
    for k, x in items:
        t = type(x)
        if t is str:
            f = _NONFINITE.get(x)
            if f is not None:
                value[k] = f  # an existing key or index: the container keeps its size
        elif t is dict or t is list:
            _restore_in_place(x)


def restore_fields(data: dict[str, Any], payload: type[msgspec.Struct]) -> dict[str, Any]:
    """``data`` (fresh from the codec, checked against the Struct ``payload``) with the names in
    its number and free-form fields turned back into floats, in place; strings stay strings."""
    shapes = struct_fields(payload)
    for name, value in data.items():
        shape = shapes[name]
        if shape.python is float:
            if type(value) is str:
                data[name] = _NONFINITE[value]
        elif shape.free_form:
            _restore_in_place(value)
        elif shape.entries is not None:
            for entry in value:
                restore_fields(entry, shape.entries)
    return data


def wire_value(value: Any) -> Any:
    """Non-finite floats replaced by their names, recursively (lists and dicts)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if value in (math.inf, -math.inf):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {k: wire_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [wire_value(v) for v in value]
    return value


# ----------------------------------------------------------------------------- encode
# msgspec writes a float of 1e16 or more as "1e16" where v1's producers wrote Python's "1e+16";
# a number token with such an exponent (rare) is rewritten from the values themselves.
_BARE_EXPONENT: Final = re.compile(rb"[:,\[]-?[0-9.]+e[0-9]")


def _v1_floats(value: Any) -> Any:
    """``wire_value``, with large floats as raw JSON in Python's spelling."""
    if isinstance(value, float):
        if math.isnan(value) or value in (math.inf, -math.inf):
            return wire_value(value)
        return msgspec.Raw(repr(value).encode()) if abs(value) >= 1e16 else value
    if isinstance(value, dict):
        return {k: _v1_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_v1_floats(v) for v in value]
    return value


def _wire_json(value: Any) -> bytes:
    """``value`` as compact JSON the way the wire writes it (``wire_value``'s names for
    non-finite floats, large floats in Python's spelling): msgspec's encoding, made again
    from converted values only when it wrote a null or such a float."""
    out = _ENCODER.encode(value)
    # a non-finite float is written as null: without any null, none was there
    if b"null" in out or _BARE_EXPONENT.search(out) is not None:
        out = _ENCODER.encode(_v1_floats(value))
    return out


def wire_json(value: Any) -> str:
    """A decoded payload value (a list or a map) as the wire's JSON text. Raises
    ``SchemaError`` for a value JSON cannot hold."""
    try:
        return _wire_json(value).decode()
    except (TypeError, msgspec.EncodeError, ValueError) as exc:
        raise SchemaError(f"not JSON-serialisable: {exc}") from None


def encode(record: Any) -> bytes:
    """Serialise a record (a ``Record`` or an envelope dict). Raises ``SchemaError``."""
    d = record.to_dict() if isinstance(record, Record) else dict(record)
    d.setdefault("v", SCHEMA_VERSION)
    try:
        out = _wire_json(d)
    except (TypeError, msgspec.EncodeError, ValueError) as exc:
        raise SchemaError(f"not JSON-serialisable: {exc}") from None
    if len(out) > MAX_RECORD_BYTES:
        raise SchemaError(f"record is {len(out)} bytes, over the {MAX_RECORD_BYTES} limit")
    return out
