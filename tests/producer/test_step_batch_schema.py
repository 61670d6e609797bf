"""The step_batch kind: many step records of one rank in one message, and ``unbatch``."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_wire_schema import both_ways, canon, records, step_entries, wire_inputs

from steplens import schema
from steplens.schema import DecodeError, Record, SchemaError, decode, encode, kinds, unbatch

ENV: dict[str, Any] = {
    "run_id": "run-b",
    "rank": 5,
    "local_rank": 1,
    "host": "n7",
    "pid": 99,
    "seq": 12,
}


def batch_record(entries: list[dict[str, Any]], **env: Any) -> Record:
    env = {**ENV, **env}
    last = entries[-1]
    return Record("step_batch", data={"records": entries}, time_ns=last["time_ns"],
                  step=last["step"], **env)  # fmt: skip


def alone(entry: dict[str, Any], **env: Any) -> Record:
    """The step record an entry stands for, as it would be sent on its own."""
    data = {k: v for k, v in entry.items() if k not in ("step", "time_ns")}
    return Record("step", data=data, time_ns=entry["time_ns"], step=entry["step"], **{**ENV, **env})


@settings(max_examples=200, deadline=None)
@given(step_entries(), st.integers(min_value=-1, max_value=4096), st.integers(0, 1 << 40))
def test_unbatched_steps_equal_each_step_sent_alone(
    entries: list[dict[str, Any]], rank: int, seq: int
) -> None:
    out = decode(encode(batch_record(entries, rank=rank, seq=seq)))
    assert isinstance(out, Record), out
    assert out.kind == "step_batch" and out.step == entries[-1]["step"]
    expected = [decode(encode(alone(e, rank=rank, seq=seq))) for e in entries]
    assert all(isinstance(r, Record) for r in expected)
    # strict: same types (floats restored), same key order, same envelope
    assert canon(unbatch(out)) == canon(expected)


@settings(max_examples=300, deadline=None)
@given(wire_inputs("step_batch"))
def test_decode_and_validate_agree_on_batches(raw: bytes) -> None:
    ours, theirs = both_ways(raw)
    assert ours == theirs


@settings(max_examples=100, deadline=None)
@given(records("step_batch"))
def test_validate_gives_the_batch_the_wire_gives(rec: Record) -> None:
    out = canon(schema.validate(rec.to_dict()))
    assert out == canon(decode(encode(rec))) and out[0] == "Record"


def test_non_finite_values_in_entries_survive_the_wire() -> None:
    entries = [
        {"step": 1, "time_ns": 10, "loss": math.nan, "scalars": {"z": -math.inf}},
        {"step": 2, "time_ns": 20, "grad_norm": math.inf, "group_lrs": [1, math.nan]},
    ]
    wire = encode(batch_record(entries))
    json.loads(wire)  # strict JSON
    steps = unbatch(decode(wire))  # type: ignore[arg-type]
    assert math.isnan(steps[0].data["loss"]) and steps[0].data["scalars"] == {"z": -math.inf}
    assert steps[1].data["grad_norm"] == math.inf
    lrs = steps[1].data["group_lrs"]
    assert lrs[0] == 1.0 and type(lrs[0]) is float and math.isnan(lrs[1])


def test_unbatch_keeps_the_envelope_and_order() -> None:
    entries = [{"step": s, "time_ns": 1000 + s, "loss": float(s)} for s in (7, 8, 9)]
    rec = decode(encode(batch_record(entries)))
    assert isinstance(rec, Record)
    steps = unbatch(rec)
    assert [(r.kind, r.step, r.time_ns, r.data) for r in steps] == [
        ("step", 7, 1007, {"loss": 7.0}),
        ("step", 8, 1008, {"loss": 8.0}),
        ("step", 9, 1009, {"loss": 9.0}),
    ]
    for r in steps:
        assert (r.run_id, r.rank, r.local_rank, r.host, r.pid, r.seq, r.v) == (
            "run-b", 5, 1, "n7", 99, 12, 1,
        )  # fmt: skip
        assert r.key == rec.key
    steps[0].data["loss"] = -1.0  # the batch's entries are not shared
    assert rec.data["records"][0] == {"step": 7, "time_ns": 1007, "loss": 7.0}


def test_unbatch_passes_other_kinds_through() -> None:
    rec = schema.make_record("step", {"loss": 1.0}, run_id="r", step=1)
    assert unbatch(rec) == [rec] and unbatch(rec)[0] is rec


def batch_wire(records: Any, **data: Any) -> bytes:
    env = {"v": 1, "kind": "step_batch", "time_ns": 1, "step": 1, **ENV}
    return json.dumps({**env, "data": {"records": records, **data}}).encode()


def entry(**fields: Any) -> dict[str, Any]:
    return {"step": 1, "time_ns": 1, "loss": 1.0, **fields}


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        (batch_wire([entry()], extra=1), "data.extra", "unknown field"),
        (batch_wire(None), "data.records", "expected `array`, got `null`"),
        (batch_wire({"a": 1}), "data.records", "expected `array`, got `object`"),
        (batch_wire([]), "data.records", "expected `array` of length >= 1"),
        (batch_wire([entry()] * 4097), "data.records", "of length <= 4096"),
        (batch_wire([entry(), 5]), "data.records[1]", "expected `object`, got `int`"),
        (batch_wire([entry(), entry(step=None)]), "data.records[1].step", "got `null`"),
        (
            batch_wire([{"step": 1, "loss": 1.0}]),
            "data.records[0].time_ns",
            "missing required field",
        ),
        (batch_wire([entry()] * 3 + [entry(lossy=1.0)]), "data.records[3].lossy", "unknown field"),
        (batch_wire([entry(), entry(loss="high")]), "data.records[1].loss", "expected a number"),
        (batch_wire([entry(loss="nan")]), "data.records[0].loss", "expected a number"),
        (batch_wire([entry(scalars={"a": "x"})]), "data.records[0].scalars.a", "expected a num"),
        (batch_wire([entry(group_lrs=[1.0, None])]), "data.records[0].group_lrs[1]", "a number"),
        (batch_wire([entry(clipped=1)]), "data.records[0].clipped", "expected `bool | null`"),
        (batch_wire([entry(reason=3)]), "data.records[0].reason", "expected `str | null`"),
        (batch_wire([entry(step=True)]), "data.records[0].step", "expected `int`, got `bool`"),
        (batch_wire([entry(step=1.0)]), "data.records[0].step", "expected `int`, got `float`"),
        (batch_wire([entry(time_ns=1 << 63)]), "data.records[0].time_ns", "<= 9223372036854775807"),
        (
            batch_wire([entry(tokens=2.5)]),
            "data.records[0].tokens",
            "expected `int | null`, got `float`",
        ),
        (batch_wire([entry(reason="x" * 4097)]), "data.records[0].reason", "length <= 4096"),
    ],
)
def test_malformed_batches_get_a_clear_error(raw: bytes, path: str, words: str) -> None:
    out = decode(raw)
    assert isinstance(out, DecodeError), out
    assert (out.path, words in out.reason) == (path, True), out
    ours, theirs = both_ways(raw)
    assert ours == theirs


def test_null_entry_fields_read_as_absent() -> None:
    out = decode(batch_wire([entry(lr=None, scalars=None)]))
    assert isinstance(out, Record)
    assert unbatch(out)[0].data == {"loss": 1.0}


def test_size_limits() -> None:
    full = [entry(step=i) for i in range(schema.MAX_BATCH_ENTRIES)]
    out = decode(batch_wire(full))
    assert isinstance(out, Record) and len(unbatch(out)) == schema.MAX_BATCH_ENTRIES
    with pytest.raises(SchemaError, match="length <= 4096"):
        schema.make_record("step_batch", {"records": [*full, entry()]}, run_id="r")
    with pytest.raises(SchemaError, match="length >= 1"):
        schema.make_record("step_batch", {"records": []}, run_id="r")
    # within the entry limit but over the byte limit: refused by encode, never truncated
    wide = [entry(step=i, scalars={f"s{k}": 0.5 for k in range(40)}) for i in range(4000)]
    with pytest.raises(SchemaError, match="over the"):
        encode(batch_record(wide))


def test_entries_with_changing_names_decode_as_declared() -> None:
    """Entries with different names in one batch: switching names, converted values and bad
    names in between; an entry's data is in the declared field order, whatever the wire's."""
    a = {"step": 1, "time_ns": 10, "loss": 1.5, "lr": 3e-4}
    b = {"step": 2, "time_ns": 20, "loss": 2, "grad_norm": "NaN", "clipped": True}
    b_read = {"step": 2, "time_ns": 20, "loss": 2.0, "grad_norm": math.nan, "clipped": True}
    cases: list[tuple[list[dict[str, Any]], Any]] = [
        ([a, a, b, b, a], [a, a, b_read, b_read, a]),
        ([a, {**a, "lr": None}, a], [a, {k: v for k, v in a.items() if k != "lr"}, a]),
        ([a, {**a, "nope": 1.0}, a], "data.records[1].nope"),
        ([b, {k: v for k, v in a.items() if k != "time_ns"}], "data.records[1].time_ns"),
        ([a, {**a, "loss": "x"}], "data.records[1].loss"),
        (  # other order on the wire
            [{**b, "step": 3}, {"time_ns": 30, "step": 4, "tokens": 7}],
            [{**b_read, "step": 3}, {"step": 4, "time_ns": 30, "tokens": 7}],
        ),
    ]
    for entries, expected in cases:
        wire = json.loads(encode(batch_record([a])))
        wire["data"]["records"] = entries
        raw = json.dumps(wire).encode()
        out = decode(raw)
        if isinstance(expected, str):
            assert isinstance(out, DecodeError) and out.path == expected, (entries, out)
        else:
            assert isinstance(out, Record), (entries, out)
            assert canon(out.data["records"]) == canon(expected), entries
        ours, theirs = both_ways(raw)
        assert ours == theirs, entries


def test_entries_with_every_set_of_number_fields_decode() -> None:
    fields = msgspec.structs.fields(schema.STEP_ENTRY)
    optional = [f.name for f in fields if not f.required and f.type == kinds.Num | None]
    for mask in range(1, 1 << len(optional)):
        entry = {"step": mask, "time_ns": mask}
        entry.update({n: 0.5 for k, n in enumerate(optional) if mask >> k & 1})
        out = decode(encode(batch_record([entry])))
        assert isinstance(out, Record) and out.data["records"] == [entry]
