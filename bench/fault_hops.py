"""Where a fault's alert latency went, read back from the topics after a scale run.

For each fault found, the first record its rank sent at or after the onset (of the kinds that
show that fault) is looked up on the raw topic, then the by-run message that carried it (the
worker's route stage), and set against the alert's arrival:

* ``sent_s``: onset to the raw message's timestamp (the ranks' producer: batching, delivery);
* ``routed_s``: raw to by-run timestamp (the route stage's batch, flush and commit);
* ``scored_s``: by-run timestamp to the alert's arrival (the detect agent's queue, the scoring
  and the alert's own send).

Timestamps are the producers' create times, so hops are comparable on one machine only.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from steplens.schema import Record, decode

HARDWARE = ("gpu_ecc_xid", "gpu_thermal")
BEFORE_S = 5.0  # looked up from this long before the onset
AFTER_S = 60.0  # and this long after it


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"scale-hops-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )


def _scan(c: Consumer, topic: str, from_ms: int, until_ms: int) -> Any:
    """Every message of ``topic`` stamped from ``from_ms`` until ``until_ms``."""
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    starts = c.offsets_for_times([TopicPartition(topic, p, from_ms) for p in parts], timeout=10)
    for tp in starts:
        if tp.offset < 0:
            continue
        _, high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
        c.assign([tp])
        pos = tp.offset
        while pos < high:
            batch = c.consume(num_messages=2000, timeout=2.0)
            if not batch:
                break
            for m in batch:
                if m.error() is not None:
                    continue
                pos = m.offset() + 1
                if m.timestamp()[1] > until_ms:
                    pos = high
                    break
                yield m


def _shows(fault: dict[str, Any], rec: Record) -> bool:
    if fault["kind"] in HARDWARE:
        return rec.kind == "hw"
    return rec.kind in ("step", "step_window") and (rec.step or 0) >= fault["first_step"]


def hops(
    bootstrap: str,
    raw_topic: str,
    by_run_topic: str,
    run_id: str,
    faults: list[dict[str, Any]],
    onsets_ns: dict[str, int],
    found: dict[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Each found fault's hops (see the module); a fault whose record was not found is left
    out."""
    c = _consumer(bootstrap)
    out: dict[str, dict[str, Any]] = {}
    try:
        for fault in faults:
            kind = fault["kind"]
            onset = onsets_ns.get(kind)
            if onset is None or kind not in found:
                continue
            key = f"{run_id}:{fault['rank']}".encode()
            lo, hi = int(onset / 1e6 - BEFORE_S * 1e3), int(onset / 1e6 + AFTER_S * 1e3)
            first = None
            for m in _scan(c, raw_topic, lo, hi):
                if m.key() != key:
                    continue
                rec = decode(m.value())
                if isinstance(rec, Record) and rec.time_ns >= onset - 1e9 and _shows(fault, rec):
                    first = (m.partition(), m.offset(), m.timestamp()[1], rec)
                    break
            if first is None:
                continue
            part, offset, raw_ms, rec = first
            by_run_ms = None
            for m in _scan(c, by_run_topic, raw_ms - 1000, hi):
                items = orjson.loads(m.value()) if m.value() else []
                if any(it[0] == part and it[1] == offset for it in items):
                    by_run_ms = m.timestamp()[1]
                    break
            alert_s = found[kind]["latency_s"]
            row: dict[str, Any] = {
                "record": f"{rec.kind} rank {rec.rank} step {rec.step}",
                "sent_s": raw_ms / 1e3 - onset / 1e9,
            }
            if by_run_ms is not None:
                row["routed_s"] = (by_run_ms - raw_ms) / 1e3
                row["scored_s"] = alert_s - (by_run_ms / 1e3 - onset / 1e9)
            out[kind] = row
    finally:
        c.close()
    return out
