"""``steplens.schema.settings``: one declaration gives the keyword checks, the environment
reading, the command line options and the docs' table."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from typing import Annotated, ClassVar

import pytest
from msgspec import Meta

from steplens.producer.config import ProducerConfig
from steplens.schema.settings import (
    PositiveFloat,
    PositiveInt,
    about,
    add_options,
    given,
    markdown_table,
    nested,
    resolve,
)


@dataclass(frozen=True)
class Inner:
    days: Annotated[PositiveFloat, about("how far back")] = 7.0
    enabled: Annotated[bool, about("warm starts", flag="--no-history")] = True


@dataclass(frozen=True)
class Example:
    ENV_PREFIX: ClassVar[str] = "STEPLENS_EX_"

    share: Annotated[Annotated[float, Meta(ge=0, le=1)], about("a share")] = 0.5
    peak: Annotated[PositiveFloat | None, about("optional peak")] = None
    count: Annotated[PositiveInt, about("a count", aliases=["--n"])] = 3
    schedule: Annotated[dict[str, int] | None, about("a JSON object")] = None
    url: Annotated[str, about("an address", env="STEPLENS_OTHER_URL")] = "x"
    inner: Annotated[Inner, nested()] = field(default_factory=Inner)
    plain: int = 1  # not a setting


def test_keyword_then_environment_then_default(monkeypatch) -> None:
    assert resolve(Example) == Example()
    monkeypatch.setenv("STEPLENS_EX_SHARE", "0.25")
    monkeypatch.setenv("STEPLENS_EX_SCHEDULE", '{"a": 1}')
    monkeypatch.setenv("STEPLENS_OTHER_URL", "y")
    monkeypatch.setenv("STEPLENS_EX_INNER_DAYS", "2")
    monkeypatch.setenv("STEPLENS_EX_INNER_ENABLED", "off")
    s = resolve(Example, {"count": 9, "peak": None}, plain=4)
    assert s == Example(0.25, None, 9, {"a": 1}, "y", Inner(2.0, False), 4)
    assert resolve(Example, {"share": 1, "inner_days": 3}).share == 1.0
    assert resolve(Example, {"inner_days": 3}).inner.days == 3.0


@pytest.mark.parametrize(
    "bad",
    [
        {"share": 1.5},
        {"share": float("nan")},
        {"peak": float("inf")},
        {"peak": 0},
        {"count": True},
        {"count": 2.5},
        {"schedule": [1]},
        {"inner_days": -1},
        {"nope": 1},
    ],
)
def test_a_bad_keyword_raises(bad) -> None:
    with pytest.raises(ValueError, match="steplens: "):
        resolve(Example, bad)


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("STEPLENS_EX_SHARE", "lots"),
        ("STEPLENS_EX_SHARE", "2"),
        ("STEPLENS_EX_PEAK", "inf"),
        ("STEPLENS_EX_COUNT", "0"),
        ("STEPLENS_EX_SCHEDULE", "[1]"),
        ("STEPLENS_EX_INNER_ENABLED", "maybe"),
    ],
)
def test_a_bad_variable_warns_once_and_keeps_the_default(monkeypatch, caplog, var, raw) -> None:
    monkeypatch.setenv(var, raw)
    with caplog.at_level(logging.WARNING, logger="steplens"):
        assert resolve(Example) == Example()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1
    assert var in said[0]


def test_options_come_from_the_declaration_and_a_flag_wins(monkeypatch) -> None:
    monkeypatch.setenv("STEPLENS_EX_COUNT", "5")
    monkeypatch.setenv("STEPLENS_EX_SHARE", "0.1")
    ap = argparse.ArgumentParser()
    add_options(ap, Example)
    args = ap.parse_args(["--n", "7", "--no-history", "--inner-days", "1.5"])
    assert given(Example, args) == {"count": 7, "inner_enabled": False, "inner_days": 1.5}
    s = resolve(Example, given(Example, args))
    assert (s.count, s.share, s.inner) == (7, 0.1, Inner(1.5, False))
    text = ap.format_help()
    assert "(default: 3; env STEPLENS_EX_COUNT)" in text
    assert "env STEPLENS_OTHER_URL" in text
    with pytest.raises(SystemExit):
        ap.parse_args(["--share", "3"])


def test_the_table_states_each_setting_once() -> None:
    table = markdown_table(Example)
    rows = table.splitlines()[2:]
    assert len(rows) == 7
    assert rows[2] == "| `count` | `--count`, `--n` | `STEPLENS_EX_COUNT` | `3` | ≥ 1 | a count |"
    assert "| `peak` | `--peak` | `STEPLENS_EX_PEAK` | `none` | > 0 | optional peak |" in rows


def test_producer_settings_keep_their_names_and_variables(monkeypatch) -> None:
    monkeypatch.setenv("STEPLENS_FLUSH_INTERVAL_S", "0.5")
    monkeypatch.setenv("STEPLENS_LR_SCHEDULE", '{"kind": "cosine"}')
    monkeypatch.setenv("STEPLENS_FULL_RESOLUTION", "yes")
    monkeypatch.setenv("STEPLENS_TOPIC_RAW", "other.raw")
    c = ProducerConfig.resolve(batch_steps=4096, hang_dump_after_s=0)
    assert (c.flush_interval_s, c.full_resolution, c.topic) == (0.5, True, "other.raw")
    assert c.lr_schedule == {"kind": "cosine"}
    assert (c.batch_steps, c.hang_dump_after_s) == (4096, 0.0)
    monkeypatch.setenv("STEPLENS_TOPIC", "mine")
    assert ProducerConfig.resolve().topic == "mine"
    for bad in ({"batch_steps": 4097}, {"exporter_port": 70000}, {"topic": ""}):
        with pytest.raises(ValueError):
            ProducerConfig.resolve(**bad)
