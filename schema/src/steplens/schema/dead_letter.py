"""The one builder of ``dead_letter`` records, for every consumer of the project (worker, sinks).

A dead letter carries the reason, where the record came from (topic, partition, offset, which
consumer) and the original bytes, decoded as UTF-8 with replacement and cut to ``PAYLOAD_LIMIT``
characters; ``replay`` can re-send what fits. The reason is cut to ``REASON_LIMIT``.
"""

from __future__ import annotations

import os
import socket
import time

from steplens.schema.codec import encode, make_record
from steplens.schema.kinds import MAX_STR_LEN, RUN_RANK

PAYLOAD_LIMIT = MAX_STR_LEN
REASON_LIMIT = MAX_STR_LEN
HOST = socket.gethostname()


def dead_letter_bytes(
    reason: str,
    payload: bytes | None,
    *,
    source_topic: str,
    partition: int,
    offset: int,
    consumer: str,
    run_id: str | None = None,
    rank: int = RUN_RANK,
    seq: int = 0,
) -> bytes:
    """The wire bytes of a dead letter for ``payload`` (a record a consumer could not use)."""
    text = (payload or b"").decode("utf-8", "replace")[:PAYLOAD_LIMIT]
    rec = make_record(
        "dead_letter",
        {
            "reason": reason[:REASON_LIMIT],
            "source_topic": source_topic,
            "partition": partition,
            "offset": offset,
            "consumer": consumer,
            "payload": text,
        },
        run_id=run_id or "unknown",
        rank=rank,
        host=HOST,
        pid=os.getpid(),
        seq=seq,
        time_ns=time.time_ns(),
    )
    return encode(rec)
