"""The sink contract: ``export(batch) -> ExportResult`` never raises, ``shutdown()`` stops it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from steplens.producer.schema import Record


@dataclass(frozen=True)
class Rejection:
    index: int  # position in the exported batch
    reason: str


@dataclass
class ExportResult:
    """What happened to a batch.

    ``retryable``: nothing can be assumed durable; export the same batch again later.
    Otherwise every record not in ``rejected`` is durable, and the rejected ones never will be.
    ``skipped`` counts records accepted but deliberately not stored (e.g. older than retention).
    """

    accepted: int = 0
    rejected: list[Rejection] = field(default_factory=list)
    retryable: bool = False
    skipped: int = 0
    error: str = ""

    @classmethod
    def retry(cls, error: str) -> ExportResult:
        return cls(retryable=True, error=error)


class Sink(Protocol):
    name: str

    def export(self, batch: list[Record]) -> ExportResult: ...

    def shutdown(self) -> None: ...
