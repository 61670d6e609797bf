"""How far ahead of the clock a record may be stamped: one bound for every consumer. The worker
does not score a record past it and the sinks do not store it; each sends it to the dead-letter
topic with ``future_reason`` and counts it (a clock far ahead would otherwise put signals and
points ahead of every query's "now")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from steplens.schema.settings import PositiveInt, about, resolve


@dataclass(frozen=True)
class TimeBounds:
    ENV_PREFIX: ClassVar[str] = "STEPLENS_"

    max_future_skew_s: Annotated[
        PositiveInt,
        about(
            "a record stamped later than now + this is not scored by the worker nor stored by "
            "InfluxDB and S3 (a dead letter)",
            env="STEPLENS_MAX_FUTURE_SKEW_S",
        ),
    ] = 300

    @classmethod
    def from_env(cls) -> TimeBounds:
        return resolve(cls)

    def newest_ns(self, now_ns: int) -> float:
        return now_ns + self.max_future_skew_s * 1e9

    def future_reason(self, time_ns: int, now_ns: int) -> str:
        ahead = (time_ns - now_ns) / 1e9
        return (
            f"time is {ahead:.0f} s in the future (more than the {self.max_future_skew_s} s "
            "clock skew allowed)"
        )
