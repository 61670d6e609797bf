"""Session fixtures shared by every part's tests.

``stack_env``: the shared local stack (started if needed, left running for the next run; CI
stops it); the Kafka topics created during the session are deleted at its end.
``STEPLENS_STACK_SERVICES=kafka,s3`` limits which services it starts.
``private_stack``: a factory of private stacks on free ports in a temporary folder, for tests
that stop and restart services; each is torn down at the end of the test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def stack_env() -> Iterator[dict[str, str]]:
    import steplens.stack
    from scratch_topics import scratch_topics

    raw = os.environ.get("STEPLENS_STACK_SERVICES", "")
    services = [s.strip() for s in raw.split(",") if s.strip()] or None
    try:
        env = steplens.stack.up(services)
    except steplens.stack.StackError as exc:
        pytest.fail(f"the local stack did not start: {exc}", pytrace=False)
    os.environ.update(env)
    if "STEPLENS_KAFKA_BOOTSTRAP" not in env:
        yield env
        return
    with scratch_topics(env["STEPLENS_KAFKA_BOOTSTRAP"]):
        yield env


@pytest.fixture
def private_stack(tmp_path: Path) -> Iterator[Callable[..., object]]:
    from steplens.stack import Stack
    from steplens.stack.process import free_ports

    made: list[Stack] = []

    def make(services: Iterable[str] = ("kafka",), timeout_s: float = 180.0) -> Stack:
        kafka, controller, influx, s3, alertmanager = free_ports(5)
        stack = Stack(
            home=tmp_path / f"stack{len(made)}",
            ports={
                "kafka": kafka,
                "kafka_controller": controller,
                "influxdb": influx,
                "s3": s3,
                "alertmanager": alertmanager,
            },
            progress=lambda _line: None,
        )
        made.append(stack)
        stack.up(list(services), timeout_s=timeout_s)
        return stack

    yield make
    for stack in made:
        stack.down(deadline_s=15)
