"""Records written by the v1 producer (``data/wire_v1.jsonl``) decode to the same records, and
encode again to the same bytes wherever v1's encoder did."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from steplens.schema import Record, decode, encode

FIXTURES = [
    json.loads(line)
    for line in (Path(__file__).parent / "data" / "wire_v1.jsonl").read_text("utf-8").splitlines()
]


def canon(x: Any) -> Any:
    """The fixture file's form (see data/make_wire_v1.py)."""
    if type(x) is float:
        return {"f": "nan" if math.isnan(x) else repr(x)}
    if isinstance(x, dict):
        return {"d": [[k, canon(v)] for k, v in x.items()]}
    if isinstance(x, list):
        return {"l": [canon(v) for v in x]}
    return x


def test_the_fixtures_cover_every_kind_and_the_hard_values() -> None:
    wires = [f["wire"] for f in FIXTURES]
    kinds = {json.loads(w)["kind"] for w in wires}
    assert kinds >= {"run_meta", "step", "step_batch", "step_window", "eval", "batch", "hw"}
    assert kinds >= {"comm", "health", "signal", "alert", "dead_letter"}
    text = "".join(wires)
    for token in ('"NaN"', '"Infinity"', '"-Infinity"', "e+22", "e-7", "日本語", "🙂"):
        assert token in text, token


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: json.loads(f["wire"])["kind"])
def test_v1_bytes_decode_to_the_same_record(fixture: dict[str, Any]) -> None:
    raw = fixture["wire"].encode("utf-8")
    rec = decode(raw)
    assert isinstance(rec, Record), rec
    got = {name: canon(getattr(rec, name)) for name in fixture["decoded"]}
    assert got == fixture["decoded"]
    if fixture["reencodes_same"]:
        assert encode(rec) == raw
