"""Topic sets of their own and the variables that name them to every part."""

from __future__ import annotations

import pytest

from steplens.schema.topics import Topics


def test_a_prefixed_set_read_back_from_its_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = Topics.prefixed("t.abc", raw_partitions=2, other_partitions=1)
    assert set(mine.all()) == {
        f"t.abc.{n}" for n in ("raw", "signals", "alerts", "deadletter", "advice")
    }
    assert mine.all()["t.abc.raw"] == 2 and mine.all()["t.abc.advice"] == 1
    for name, value in mine.env().items():
        monkeypatch.setenv(name, value)
    back = Topics.from_env()
    assert (back.raw, back.signals, back.alerts, back.dead_letters, back.advice) == (
        mine.raw,
        mine.signals,
        mine.alerts,
        mine.dead_letters,
        mine.advice,
    )
