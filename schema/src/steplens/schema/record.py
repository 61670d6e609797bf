"""What the codec hands consumers: a validated ``Record`` (its ``data`` a dict of Python values),
or a ``DecodeError`` saying why the bytes were refused; ``SchemaError`` when encoding fails."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from steplens.schema.kinds import SCHEMA_VERSION


@dataclass(frozen=True)
class Record:
    """A validated record. ``data`` holds Python floats (NaN/inf restored)."""

    kind: str
    run_id: str
    rank: int
    local_rank: int
    host: str
    pid: int
    seq: int
    time_ns: int
    data: dict[str, Any]
    step: int | None = None
    v: int = SCHEMA_VERSION

    @property
    def key(self) -> bytes:
        return record_key(self.run_id, self.rank)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "v": self.v,
            "kind": self.kind,
            "run_id": self.run_id,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "host": self.host,
            "pid": self.pid,
            "seq": self.seq,
            "time_ns": self.time_ns,
            "data": self.data,
        }
        if self.step is not None:
            d["step"] = self.step
        return d


@dataclass(frozen=True)
class DecodeError:
    """Why a record was rejected. ``path`` names the offending field, if any."""

    reason: str
    path: str = ""
    raw_prefix: bytes = field(default=b"", repr=False)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class SchemaError(ValueError):
    """Raised by ``encode`` when a record cannot be put on the wire."""


def record_key(run_id: str, rank: int) -> bytes:
    """Kafka key: all records of one rank of one run land in one partition, in order."""
    return f"{run_id}:{rank}".encode()
