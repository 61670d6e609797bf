"""Fixtures of the sinks' tests."""

from __future__ import annotations

import pytest
from sinks_helpers import unique

from steplens.schema.topics import Topics, ensure_topics


@pytest.fixture
def topics(stack_env: dict[str, str]) -> Topics:
    t = Topics(
        raw=unique("raw"),
        signals=unique("signals"),
        alerts=unique("alerts"),
        dead_letters=unique("dl"),
        advice=unique("advice"),
        raw_partitions=4,
        other_partitions=1,
    )
    ensure_topics(stack_env["STEPLENS_KAFKA_BOOTSTRAP"], t)
    return t
