"""A Monitor's parts, made from the settings where the caller gives none.

- delivery (``delivery``): where encoded records go, the transport with its disk spool;
- advice (``remedies.advice_relay``): where the stream jobs' advice comes from, opened by the
  worker;
- the hardware sampler (``instruments.hardware``): host-wide on local rank 0, the PyTorch
  allocator's figures on the other ranks;
- the node exporter (``export``): local rank 0's samples served to Prometheus (opt-in).

A Monitor makes its delivery and advice again in a forked child (``process_parts``); a part
the caller gave serves every process, as a given transport does. The sampler and exporter run
once per host: a forked child has none (``node_parts``).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, cast

from steplens.producer.config import ProducerConfig
from steplens.producer.delivery.live_or_spool import Delivery
from steplens.producer.delivery.spool import Spool
from steplens.producer.delivery.transport import Transport, kafka_transport
from steplens.producer.identity import Identity
from steplens.producer.instruments.hardware import HardwareSampler
from steplens.producer.remedies.advice_inbox import AdviceSource
from steplens.producer.remedies.advice_relay import AdviceOpener


class Exporter(Protocol):
    """What a Monitor asks of the node exporter (``export.node_exporter.NodeExporter``)."""

    def stop(self) -> None: ...

    def forget_in_child(self) -> None: ...


class ProcessParts(NamedTuple):
    """The parts a process of a Monitor makes for itself."""

    delivery: Delivery
    open_advice: Callable[[], AdviceSource] | None  # None: no advice can come


class NodeParts(NamedTuple):
    """The parts that run once per host (the sampler: once per process for the allocator's
    figures on the ranks other than local rank 0)."""

    hardware: HardwareSampler | None
    exporter: Exporter | None


def process_parts(
    config: ProducerConfig,
    identity: Identity,
    pid: int,
    *,
    transport: Transport | None = None,
    delivery: Delivery | None = None,
    advice_source: AdviceSource | Callable[[], AdviceSource] | None = None,
    started_ms: int = 0,
) -> ProcessParts:
    """The given parts, and the others made from the settings: a delivery to ``transport``
    (default: Kafka, connected on the first record) spooling under the run's and process's
    own folder; advice from ``advice_source`` (a source, or what opens one), else from a given
    transport that is a source (a ``MemoryTransport``), else from Kafka (``AdviceOpener``,
    from ``started_ms`` on)."""
    if delivery is None:
        folder = os.path.join(config.spool_dir, _safe_name(identity.run_id))
        spool = Spool(
            os.path.join(folder, f"rank{identity.rank}-pid{pid}"),
            config.spool_max_bytes,
            adopt_root=config.spool_dir,
        )

        def connect() -> Transport:
            return transport if transport is not None else kafka_transport(config, identity)

        delivery = Delivery(connect, spool)
    open_advice: Callable[[], AdviceSource] | None
    if advice_source is not None:
        open_advice = advice_source if callable(advice_source) else _given(advice_source)
    elif transport is None:
        open_advice = AdviceOpener(config, identity, started_ms)
    elif hasattr(transport, "take_advice"):  # a transport that is a source too
        open_advice = _given(cast(AdviceSource, transport))
    else:
        open_advice = None
    return ProcessParts(delivery, open_advice)


def node_parts(
    config: ProducerConfig,
    identity: Identity,
    emit_hw: Callable[[dict[str, Any]], None],
    exporter: Exporter | None = None,
    paused: Callable[[], bool] = lambda: False,
) -> NodeParts:
    """With ``hw_interval_s``: the sampler, started, and on local rank 0 the exporter
    (``exporter_port``; a given one is kept as it is)."""
    if config.hw_interval_s <= 0:
        return NodeParts(None, exporter)
    host_wide = identity.local_rank == 0
    if not host_wide and importlib.util.find_spec("torch") is None:
        return NodeParts(None, exporter)
    sampler = HardwareSampler(
        emit_hw,
        config.hw_interval_s,
        config.hw_slow_every,
        host_wide=host_wide,
        allocator_every_s=config.hw_allocator_every_s,
        report_every_s=config.hw_report_every_s,
        paused=paused,
        phase=identity.phase,
    )
    sampler.start()
    if exporter is None and host_wide and config.exporter_port:
        from steplens.producer.export.node_exporter import start_exporter

        exporter = start_exporter(
            sampler, identity.run_id, identity.host, config.exporter_host, config.exporter_port
        )
    return NodeParts(sampler, exporter)


def _given(source: AdviceSource) -> Callable[[], AdviceSource]:
    return lambda: source


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:100] or "run"
