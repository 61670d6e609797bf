"""The output contract: ``export(batch) -> ExportResult`` never raises, ``shutdown()`` stops it.

Every output follows it: the InfluxDB sink, the webhook and Alertmanager notifiers export
lists of decoded records, the MLflow mirror decoded messages (with their offsets), the S3
roller a rolled chunk. An export makes one attempt; ``steplens.sinks.loop.ConsumerLoop`` drives
every output: it exports a batch again (pausing the consumer and backing off) while the result
is retryable, dead-letters what the result refuses, and only then commits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypeVar


@dataclass(frozen=True)
class Rejection:
    index: int  # position in the exported batch
    reason: str


@dataclass
class ExportResult:
    """What happened to a batch.

    ``retryable``: nothing can be assumed durable; export the same batch again later.
    Otherwise every record not in ``rejected`` is durable, and the rejected ones never will be.
    ``trimmed``: records stored without some of their fields; each reason says which were left
    out and why (they go to the dead-letter topic, whole, with that reason).
    ``skipped`` counts records accepted but deliberately not stored (e.g. older than retention).
    """

    accepted: int = 0
    rejected: list[Rejection] = field(default_factory=list)
    trimmed: list[Rejection] = field(default_factory=list)
    retryable: bool = False
    skipped: int = 0
    error: str = ""

    @classmethod
    def retry(cls, error: str) -> ExportResult:
        return cls(retryable=True, error=error)


B_contra = TypeVar("B_contra", contravariant=True)


class Output(Protocol[B_contra]):
    name: str

    def export(self, batch: B_contra) -> ExportResult: ...

    def shutdown(self) -> None: ...
