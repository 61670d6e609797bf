"""The codec of wire schema v1: msgspec types built once from the tables in ``schema``.

``decode`` parses and validates in one pass in C (msgspec): unknown fields, types, integer
ranges, lengths and the allowed values of ``v``, ``kind``, an alert's severity and state are all
checked there, and an error names the field path and the reason. It never raises. ``encode``
writes the same bytes as the producers of v1 did (orjson's layout: compact, UTF-8 unescaped,
non-finite floats as their names, Python's float spelling); ``validate`` checks a record given
as a dict (``make_record``). ``wire_value`` and ``restore`` map non-finite floats to their
names and back, for any consumer that writes or reads wire values itself.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Final, Literal, Union

import msgspec
from msgspec import Meta

from steplens.schema.metric_names import check_names
from steplens.schema.tables import (
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
    MAX_RECORD_BYTES,
    MAX_STR_LEN,
    NUM,
    NUM_LIST,
    NUM_MAP,
    OBJ,
    OBJ_LIST,
    SCHEMA_VERSION,
    SEVERITIES,
    STEP_ENTRIES,
    STEP_ENTRY,
    STR,
    STR_LIST,
    DecodeError,
    Field,
    Record,
    SchemaError,
)

NAN_NAMES: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_I64_MAX: Final = (1 << 63) - 1
_F64_MAX: Final = 1.7976931348623157e308

# ----------------------------------------------------------------------------- msgspec types
_Int = Annotated[int, Meta(ge=-_I64_MAX, le=_I64_MAX)]
_Str = Annotated[str, Meta(max_length=MAX_STR_LEN)]
_Num = float | Literal["NaN", "Infinity", "-Infinity"]
_FNum = Annotated[float, Meta(ge=-_F64_MAX, le=_F64_MAX)]  # NaN fails both bounds


def _list(item: Any) -> Any:
    return Annotated[list[item], Meta(max_length=MAX_LIST_LEN)]


_SCALAR_TYPES: Final[dict[str, Any]] = {
    NUM: _Num,
    FNUM: _FNum,
    INT: _Int,
    STR: _Str,
    BOOL: bool,
    NUM_MAP: dict[_Str, _Num],
    INT_MAP: dict[_Str, _Int],
    STR_LIST: _list(_Str),
    NUM_LIST: _list(_Num),
    INT_LIST: _list(_Int),
    OBJ_LIST: _list(dict[str, str | int | float | bool | None]),
    OBJ: dict[str, Any],
}


def _type_of(spec: Field) -> Any:
    if spec.type == STEP_ENTRIES:
        entries = list[_ENTRY]  # type: ignore[valid-type]
        return Annotated[entries, Meta(min_length=1, max_length=MAX_BATCH_ENTRIES)]
    if spec.low is None:
        return _SCALAR_TYPES[spec.type]
    if spec.type == STR:
        return Annotated[str, Meta(min_length=spec.low, max_length=MAX_STR_LEN)]
    return Annotated[int, Meta(ge=spec.low, le=_I64_MAX)]


def _struct(name: str, fields: dict[str, Field], exact: dict[str, Any] | None = None) -> Any:
    """A Struct of a table: required fields, and optional ones where null means absent.
    ``exact``: types that replace the table's (an enumeration of allowed values)."""
    exact = exact or {}
    members: list[Any] = [
        (n, exact.get(n, _type_of(s))) if s.required else (n, _type_of(s) | None, None)
        for n, s in fields.items()
    ]
    return msgspec.defstruct(
        name, members, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
    )


_ENTRY = _struct("StepEntry", STEP_ENTRY)
# the few required fields whose values are an enumeration
_EXACT: Final[dict[str, dict[str, Any]]] = {
    "alert": {"severity": Literal[SEVERITIES], "state": Literal[ALERT_STATES]}
}


def _envelope(kind: str) -> Any:
    env = {n: s for n, s in ENVELOPE.items() if n not in ("v", "kind", "data")}
    members: list[Any] = [
        ("v", Literal[SCHEMA_VERSION]),
        *[(n, _type_of(s)) for n, s in env.items() if s.required],
        ("data", _struct(f"{kind}_data", KINDS[kind], _EXACT.get(kind))),
        *[(n, _type_of(s) | None, None) for n, s in env.items() if not s.required],
    ]
    return msgspec.defstruct(
        f"{kind}_record",
        members,
        kw_only=True,
        forbid_unknown_fields=True,
        tag_field="kind",
        tag=kind,
    )


_RECORD_TYPES: Final = {kind: _envelope(kind) for kind in KINDS}
_KIND_OF: Final = {t: kind for kind, t in _RECORD_TYPES.items()}
_ANY_RECORD: Final = Union[tuple(_RECORD_TYPES.values())]  # noqa: UP007 - built at run time
_DECODER: Final = msgspec.json.Decoder(_ANY_RECORD)
_PARSER: Final = msgspec.json.Decoder()  # untyped: only to explain an error
_ENCODER: Final = msgspec.json.Encoder()
_to_builtins = msgspec.to_builtins
_asdict = msgspec.structs.asdict
# Kinds of few fields holding large free-form values: their data is taken from the Struct as it
# is (msgspec.to_builtins would copy every container again); the others omit absent fields in C.
# kinds holding metric names (a step_batch in its entries' scalars)
_NAMED_KINDS: Final = frozenset(
    k for k, f in KINDS.items() if k == "step_batch" or any(s.names for s in f.values())
)
_SHALLOW_KINDS: Final = frozenset(
    kind
    for kind, fields in KINDS.items()
    if any(f.type in (OBJ, OBJ_LIST) for f in fields.values()) and len(fields) <= 10
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
            from steplens.schema.codec_errors import explain

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
            env = msgspec.convert(obj, _ANY_RECORD)
        except msgspec.ValidationError as exc:
            from steplens.schema.codec_errors import explain

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
        return NAN_NAMES.get(value, value)
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
            f = NAN_NAMES.get(x)
            if f is not None:
                value[k] = f  # an existing key or index: the container keeps its size
        elif t is dict or t is list:
            _restore_in_place(x)


def restore_fields(data: dict[str, Any], fields: dict[str, Field]) -> dict[str, Any]:
    """``data`` (fresh from the codec, checked against ``fields``) with the names in its number
    and free-form fields turned back into floats, in place; "str" fields keep their strings."""
    for name, value in data.items():
        typ = fields[name].type
        if typ == NUM:
            if type(value) is str:
                data[name] = NAN_NAMES[value]
        elif typ in _FREE_FORM:
            _restore_in_place(value)
        elif typ == STEP_ENTRIES:
            for entry in value:
                restore_fields(entry, STEP_ENTRY)
    return data


# types whose strings may be names (lists and maps of numbers: only names are strings there)
_FREE_FORM: Final = frozenset((NUM_MAP, NUM_LIST, OBJ, OBJ_LIST))


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


def encode(record: Any) -> bytes:
    """Serialise a record (a ``Record`` or an envelope dict). Raises ``SchemaError``."""
    d = record.to_dict() if isinstance(record, Record) else dict(record)
    d.setdefault("v", SCHEMA_VERSION)
    try:
        out = _ENCODER.encode(d)
        # a non-finite float is written as null: without any null, none was there
        if b"null" in out or _BARE_EXPONENT.search(out) is not None:
            out = _ENCODER.encode(_v1_floats(d))
    except (TypeError, msgspec.EncodeError, ValueError) as exc:
        raise SchemaError(f"not JSON-serialisable: {exc}") from None
    if len(out) > MAX_RECORD_BYTES:
        raise SchemaError(f"record is {len(out)} bytes, over the {MAX_RECORD_BYTES} limit")
    return out
