"""Wire schema v1: every kind round-trips; every class of malformed input gets a clear error;
the values the declared types accept decode to the same record by ``decode`` and ``validate``."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
from collections.abc import Iterator
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steplens import schema
from steplens.schema import DecodeError, Record, SchemaError, decode, encode, kinds

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
any_float = st.floats(allow_nan=True, allow_infinity=True)
finite = st.floats(allow_nan=False, allow_infinity=False)
i64 = st.integers(min_value=-(1 << 62), max_value=1 << 62)
nat = st.integers(min_value=0, max_value=1 << 62)
# In free-form objects the strings "NaN"/"Infinity"/"-Infinity" read back as floats (documented).
free_names = names.filter(lambda s: s not in ("NaN", "Infinity", "-Infinity"))
scalar = st.one_of(st.none(), st.booleans(), i64, any_float, free_names)
metric_names = names.filter(schema.valid_name)


def step_entries() -> st.SearchStrategy[list[dict[str, Any]]]:
    """A step_batch's entries: a step payload each, with its own step and time."""
    return st.lists(payloads(schema.STEP_ENTRY), min_size=1, max_size=4)


# Values of each type the payloads are declared with; a type missing here fails the tests.
VALUES: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (kinds.Num, any_float),
    (kinds.FNum, finite),
    (kinds.Factor, st.floats(min_value=0.0, max_value=1.0, exclude_min=True)),
    (kinds.Int, i64),
    (kinds.Count, nat),
    (kinds.Str, names),
    (bool, st.booleans()),
    (kinds.Metrics, st.dictionaries(metric_names, any_float, max_size=5)),
    (dict[kinds.MetricName, Any], st.dictionaries(metric_names, scalar, max_size=5)),
    (kinds.Counters, st.dictionaries(names, i64, max_size=5)),
    (kinds.StrList, st.lists(names, max_size=5)),
    (kinds.NumList, st.lists(any_float, max_size=5)),
    (kinds.IntList, st.lists(i64, max_size=5)),
    (kinds.FlatObjs, st.lists(st.dictionaries(names, scalar, max_size=4), max_size=3)),
    (
        kinds.Obj,
        st.dictionaries(names, st.one_of(scalar, st.lists(scalar, max_size=3)), max_size=4),
    ),
]


def value_for(declared: Any) -> st.SearchStrategy[Any]:
    """Values of a declared field type (``X | None``: values of X)."""
    args = get_args(declared)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        declared = rest[0] if len(rest) == 1 else rest[0] | rest[1]
    if get_origin(declared) is Literal:
        return st.sampled_from(get_args(declared))
    if get_origin(declared) is Annotated and get_args(declared)[0] == list[schema.STEP_ENTRY]:
        return step_entries()
    for typ, values in VALUES:
        if declared == typ:
            return values
    raise AssertionError(f"no values for the declared type {declared}")


@st.composite
def payloads(draw: st.DrawFn, struct: type[msgspec.Struct]) -> dict[str, Any]:
    """A payload of ``struct``: its required fields and some of the others."""
    data: dict[str, Any] = {}
    for f in msgspec.structs.fields(struct):
        if f.required or draw(st.booleans()):
            data[f.name] = draw(value_for(f.type))
    return data


@st.composite
def records(draw: st.DrawFn, kind: str | None = None) -> Record:
    kind = kind or draw(st.sampled_from(sorted(schema.KINDS)))
    data = draw(payloads(schema.KINDS[kind]))
    return Record(
        kind=kind,
        run_id=draw(names),
        rank=draw(st.integers(min_value=-1, max_value=4096)),
        local_rank=draw(st.integers(min_value=0, max_value=64)),
        host=draw(names),
        pid=draw(nat),
        seq=draw(nat),
        time_ns=draw(nat),
        data=data,
        step=draw(st.one_of(st.none(), nat)),
    )


def same(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN, recursively."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return (bool(a == b) and type(a) is type(b)) or (
        isinstance(a, (int, float)) and isinstance(b, float) and float(a) == b
    )


@pytest.mark.parametrize("kind", sorted(schema.KINDS))
def test_every_kind_round_trips(kind: str) -> None:
    @settings(max_examples=60, deadline=None)
    @given(records(kind))
    def check(rec: Record) -> None:
        out = decode(encode(rec))
        assert isinstance(out, Record), out
        assert out.kind == rec.kind and out.run_id == rec.run_id and out.seq == rec.seq
        assert out.rank == rec.rank and out.step == rec.step and out.time_ns == rec.time_ns
        assert same(rec.data, out.data), (rec.data, out.data)

    check()


def test_non_finite_values_survive_the_wire() -> None:
    rec = schema.make_record(
        "step",
        {"loss": math.nan, "grad_norm": math.inf, "scalars": {"x": -math.inf}},
        run_id="r",
        step=3,
    )
    wire = encode(rec)
    assert b"NaN" in wire and b"Infinity" in wire
    json.loads(wire)  # strict JSON, no bare NaN tokens
    out = decode(wire)
    assert isinstance(out, Record)
    assert math.isnan(out.data["loss"]) and out.data["grad_norm"] == math.inf
    assert out.data["scalars"]["x"] == -math.inf


def test_key_is_run_and_rank() -> None:
    assert schema.record_key("run-1", 3) == b"run-1:3"


def good() -> dict[str, Any]:
    return json.loads(encode(schema.make_record("step", {"loss": 1.0}, run_id="r", step=1)))


def mutated(**changes: Any) -> bytes:
    d = good()
    for path, value in changes.items():
        target = d
        *parents, last = path.split("__")
        for p in parents:
            target = target[p]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value
    return json.dumps(d).encode()


_DELETE = object()


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        (b"", "", "empty"),
        (None, "", "empty"),
        (b"\xff\xfe", "", "not valid JSON"),
        (b"{not json", "", "not valid JSON"),
        (b"[1, 2]", "", "expected `object`, got `array`"),
        (mutated(v=2), "v", "unsupported schema version"),
        (mutated(v=_DELETE), "v", "missing required field"),
        (mutated(run_id=_DELETE), "run_id", "missing required field"),
        (mutated(rank="0"), "rank", "expected `int`, got `str`"),
        (mutated(rank=-2), "rank", "expected `int` >= -1"),
        (mutated(seq=True), "seq", "expected `int`, got `bool`"),
        (mutated(kind="nope"), "kind", "unknown kind"),
        (mutated(extra=1), "extra", "unknown field"),
        (mutated(data__loss="high"), "data.loss", "expected a number"),
        (mutated(data__lossy=1.0), "data.lossy", "unknown field"),
        (mutated(data__scalars={"a": "x"}), "data.scalars.a", "expected a number"),
        (mutated(data__clipped=1), "data.clipped", "expected `bool | null`, got `int`"),
        (mutated(time_ns=1 << 63), "time_ns", "<= 9223372036854775807"),
        (mutated(data__scalars={"a": 1.0, "b": True}), "data.scalars.b", "got `bool`"),
        (mutated(data__scalars={"k" * 4097: 1.0}), "data.scalars", "bad metric name"),
        (mutated(data={}, kind="hw", data__gpus=[{"a": [1]}]), "data.gpus[0].a", "got `array`"),
        (mutated(data=[1]), "data", "expected `object`, got `array`"),
        (mutated(run_id=""), "run_id", "length >= 1"),
        (mutated(host="h" * 4097), "host", "length <= 4096"),
    ],
)
def test_malformed_input_gets_a_clear_error(raw: bytes | None, path: str, words: str) -> None:
    out = decode(raw)
    assert isinstance(out, DecodeError)
    assert out.path == path
    assert words in out.reason


def test_non_finite_rejected_where_not_allowed() -> None:
    d = good()
    d["kind"] = "hw"
    d["data"] = {"cpu_percent": "NaN"}
    out = decode(json.dumps(d).encode())
    assert isinstance(out, DecodeError) and out.path == "data.cpu_percent"
    assert "non-finite" in out.reason


def test_alert_severity_and_state_are_checked() -> None:
    base = {
        "rule": "spike",
        "severity": "warning",
        "state": "firing",
        "scope": "run",
        "hint": "h",
        "fingerprint": "f",
    }
    ok = schema.make_record("alert", base, run_id="r", rank=schema.RUN_RANK)
    assert ok.rank == -1
    with pytest.raises(SchemaError, match="severity"):
        schema.make_record("alert", {**base, "severity": "panic"}, run_id="r")
    with pytest.raises(SchemaError, match="state"):
        schema.make_record("alert", {**base, "state": "maybe"}, run_id="r")


def test_oversize_records_are_refused_both_ways() -> None:
    big = {"sample_hashes": ["a" * 4000] * 300, "n_samples": 300}
    with pytest.raises(SchemaError, match="over the"):
        encode(schema.Record("batch", "r", 0, 0, "h", 1, 1, 1, big))
    out = decode(b"{" + b" " * schema.MAX_RECORD_BYTES + b"}")
    assert isinstance(out, DecodeError) and "over the" in out.reason


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_decode_never_raises_on_garbage(raw: bytes) -> None:
    out = decode(raw)
    assert isinstance(out, (Record, DecodeError))


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        scalar | any_float,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(names, children),
        max_leaves=20,
    )
)
def test_decode_never_raises_on_arbitrary_json(obj: Any) -> None:
    try:
        raw = json.dumps(obj).encode()
    except ValueError:
        return
    assert isinstance(decode(raw), (Record, DecodeError))


# ----------------------------------------------------------------- decode == validate
# The two ways in, bytes (``decode``) and a parsed object (``validate``), must give the same verdict
# and, when they accept, the same record: same types, NaN restored, same key order.


def canon(x: Any) -> Any:
    """Type-strict, order-strict, NaN-aware form of a decode result (errors: the verdict)."""
    if type(x) is float:
        return ("float", "nan" if math.isnan(x) else repr(x))
    if isinstance(x, dict):
        return (type(x).__name__, [(canon(k), canon(v)) for k, v in x.items()])
    if isinstance(x, list):
        return ("list", [canon(v) for v in x])
    if isinstance(x, Record):
        return ("Record", list(vars(x)), [canon(getattr(x, f)) for f in vars(x)])
    if isinstance(x, DecodeError):
        return ("DecodeError", x.path, x.reason)
    return (type(x).__name__, x)


def both_ways(raw: bytes) -> tuple[Any, Any]:
    """(decode, validate) results of ``raw``; for an error, decode's must have a reason."""
    out = decode(raw)
    if isinstance(out, DecodeError):
        assert out.reason and "internal" not in out.reason, out
    try:
        parsed = json.loads(raw)
    except RecursionError:
        return canon(out), canon(out)
    with deep():
        return canon(out), canon(schema.validate(parsed))


@contextlib.contextmanager
def deep() -> Iterator[None]:
    """Room for canon and == on deep records (a few frames a level)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


JUNK: list[Any] = [
    True, False, None, 0, -1, 1.5, -0.0, "x", "", "NaN", "Infinity", "-Infinity", "nan", [], {},
    [1], [1.0, "NaN", 2], ["a"], [True], [[1]], [{}], [{"a": [1]}], [{"a": "NaN"}], {"a": 1},
    {"a": "NaN"}, {"a": True}, {"a": {"b": "-Infinity"}}, 1 << 63, -(1 << 63), (1 << 63) - 1,
    "a" * (schema.MAX_STR_LEN + 1), ["a" * (schema.MAX_STR_LEN + 1)], {"k" * 5000: 1.0},
    [1, 1 << 63], {"a": 1 << 63}, "step", "alert",
]  # fmt: skip


def paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        out += [(*prefix, k), *paths(v, (*prefix, k))]
    return out


@st.composite
def wire_inputs(draw: st.DrawFn, kind: str | None = None) -> bytes:
    """A valid record's wire form, often with a few values replaced, removed or added."""
    d = json.loads(encode(draw(records(kind))))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        where = draw(st.sampled_from(paths(d)))
        target = d
        for k in where[:-1]:
            target = target[k]
        op = draw(st.sampled_from(["set", "set", "del", "add"]))
        if op == "set":
            target[where[-1]] = copy.deepcopy(draw(st.sampled_from(JUNK)))
        elif op == "del":
            del target[where[-1]]
        elif isinstance(target, dict):
            target[draw(names)] = copy.deepcopy(draw(st.sampled_from(JUNK)))
    return json.dumps(d).encode()


@settings(max_examples=600, deadline=None)
@given(wire_inputs())
def test_decode_and_validate_agree_on_any_input(raw: bytes) -> None:
    ours, theirs = both_ways(raw)
    assert ours == theirs


@settings(max_examples=200, deadline=None)
@given(records())
def test_validate_gives_the_record_the_wire_gives(rec: Record) -> None:
    out = schema.validate(rec.to_dict())
    assert isinstance(out, Record), out
    with deep():
        assert canon(out) == canon(decode(encode(rec)))


def _hw(data: dict[str, Any], **env: Any) -> bytes:
    base = {"v": 1, "kind": "hw", "run_id": "r", "rank": 0, "local_rank": 0, "host": "h"}
    return json.dumps({**base, "pid": 1, "seq": 1, "time_ns": 1, "data": data, **env}).encode()


def _meta(config: Any) -> bytes:
    return _hw({"world_size": 2, "config": config}, kind="run_meta")


def _nested(depth: int) -> bytes:
    return _meta({"a": 1}).replace(b'{"a": 1}', b'{"a": ' + b"[" * depth + b"]" * depth + b"}")


NAN, INF = math.nan, math.inf
ANY = object()  # accepted, whatever the data


# (wire bytes, the data it decodes to or ANY, else the path of the refused field)
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            _hw({"gpus": [{"index": 0, "power_w": "NaN"}, {"index": 1, "power_w": 1.0}]}),
            {"gpus": [{"index": 0, "power_w": NAN}, {"index": 1, "power_w": 1.0}]},
        ),
        (
            _hw({"gpus": [{"index": 0, "name": "NaN", "x": None, "ok": True}]}),
            {"gpus": [{"index": 0, "name": NAN, "x": None, "ok": True}]},
        ),
        (_hw({"gpus": [{"index": 0, "nested": ["NaN"]}]}), "data.gpus[0].nested"),
        (_hw({"gpus": [{"index": 0}, "NaN"]}), "data.gpus[1]"),
        (_hw({"cpu_percent": "Infinity"}), "data.cpu_percent"),
        (_hw({"cpu_percent": 50}), {"cpu_percent": 50.0}),
        (_hw({"mem_total_bytes": True}), "data.mem_total_bytes"),
        (_hw({"gpu_status": None, "cpu_percent": 1.0}), {"cpu_percent": 1.0}),
        (_hw({"cpu_percent": 1.0}, step=None), {"cpu_percent": 1.0}),
        (_hw({"cpu_percent": 1.0}, step=True), "step"),
        (_hw({"cpu_percent": 1.0}, rank=(1 << 63) - 1), ANY),
        (_hw({"cpu_percent": 1.0}, rank=-1, pid=(1 << 63) - 1, time_ns=-((1 << 63) - 1)), ANY),
        (_hw({"cpu_percent": 1.0}, time_ns=-(1 << 63)), "time_ns"),
        (_hw({"cpu_percent": 1.0}, seq=-1), "seq"),
        (_hw({"cpu_percent": 1.0}, seq=1 << 63), "seq"),
        (_hw({"cpu_percent": 1.0}, local_rank=-1), "local_rank"),
        (_hw({"cpu_percent": 1.0}, pid=1 << 63), "pid"),
        (_hw({"cpu_percent": 1.0}, rank=-2), "rank"),
        (_hw({"cpu_percent": 1.0}, run_id=""), "run_id"),
        (_hw({"cpu_percent": 1.0}, v=True), "v"),
        (_hw({"cpu_percent": 1.0}, extra=None), "extra"),
        (
            _meta({"a": {"b": ["NaN", 1, {"c": "-Infinity"}]}, "NaN": "Infinity"}),
            {"world_size": 2, "config": {"a": {"b": [NAN, 1, {"c": -INF}]}, "NaN": INF}},
        ),
        (  # a name spelled with an escape
            _meta({"a": "NaN"}).replace(b'"NaN"', b'"\\u004eaN"'),
            {"world_size": 2, "config": {"a": NAN}},
        ),
        (_meta({"a": "x"}), {"world_size": 2, "config": {"a": "x"}}),
        (_nested(100), ANY),
        (_nested(600), ANY),  # deeper than the recursion limit lets Python walk it
        (
            _hw({"label_counts": {"a": 1, "b": 1.0}, "n_samples": 1}, kind="batch"),
            "data.label_counts.b",
        ),
        (
            _hw({"n_samples": 1, "sample_hashes": ["a", 1], "length_edges": [1, 2]}, kind="batch"),
            "data.sample_hashes[1]",
        ),
        (
            _hw(
                {"loss": 1, "scalars": {"a": 1, "b": "NaN"}, "group_lrs": [1, "Infinity"]},
                kind="step",
            ),
            {"loss": 1.0, "group_lrs": [1.0, INF], "scalars": {"a": 1.0, "b": NAN}},
        ),
        (
            _hw({"loss": 1 << 63, "scalars": {"a": 10**30}}, kind="step"),
            {"loss": float(1 << 63), "scalars": {"a": 1e30}},
        ),
    ],
)
def test_edge_inputs_decode_as_declared(raw: bytes, expected: Any) -> None:
    out = decode(raw)
    if isinstance(expected, str):
        assert isinstance(out, DecodeError) and out.path == expected, out
    else:
        assert isinstance(out, Record), out
        with deep():
            assert expected is ANY or canon(out.data) == canon(expected)
    ours, theirs = both_ways(raw)
    with deep():
        assert ours == theirs


def test_names_are_restored() -> None:
    out = decode(_hw({"gpus": [{"index": 0, "power_w": "NaN", "name": "Infinity"}]}))
    assert isinstance(out, Record)
    gpu = out.data["gpus"][0]
    assert math.isnan(gpu["power_w"]) and gpu["name"] == math.inf
    out = decode(_meta({"a": "NaN"}).replace(b'"NaN"', b'"\\u004eaN"'))
    assert isinstance(out, Record) and math.isnan(out.data["config"]["a"])


def test_validate_copies_the_callers_containers() -> None:
    scalars, lrs = {"a": 1.0}, [1.0]
    rec = schema.make_record("step", {"scalars": scalars, "group_lrs": lrs}, run_id="r")
    assert rec.data["scalars"] == scalars and rec.data["scalars"] is not scalars
    assert rec.data["group_lrs"] == lrs and rec.data["group_lrs"] is not lrs
    gpus = [{"index": 0}]
    hw = schema.make_record("hw", {"gpus": gpus}, run_id="r")
    assert hw.data["gpus"] == gpus and hw.data["gpus"][0] is not gpus[0]
