"""A run's summary for MLflow's business view: the peak loss spike, the clipping rate, the MFU
and the incidents, accumulated from the records the mirror reads (pure; no MLflow here).

- steps: ``step_window`` aggregates when the run sends them (its raw ``step`` records are then
  only samples of the same steps), else its ``step`` and ``step_batch`` records; the clipping
  rate is the share of steps whose gradient was clipped among those that say, the MFU the mean
  over the steps that carry one;
- the peak loss spike: the largest rise over its baseline of a loss spike the worker reported
  (``spike`` signals on ``loss`` with a severity, ``(value - expected) / |expected|``);
- incidents: how many opened (and how many reached critical), how many are open;
- advice: how many pieces the stream jobs gave (the advice topic), and the ranks' answers by
  outcome (``acted`` records).

The state travels as JSON (``dumps``/``loads``, kept in a run tag) with the last offset
counted per topic and partition, so a mirror that restarts, or reads a batch again after a
crash between its write and its commit, counts no record twice.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from steplens.schema import Record
from steplens.schema.kinds import ADVICE_OUTCOMES

# open incidents remembered per run (past it, counted in open_overflow): the state must fit in
# an MLflow tag (8,000 characters)
MAX_OPEN = 100


@dataclass
class Steps:
    steps: int = 0  # steps that said whether they were clipped
    clipped: float = 0.0
    mfu_steps: int = 0
    mfu_sum: float = 0.0

    def add(self, clipped: Any, mfu: Any, n: int = 1) -> None:
        """``n`` steps whose clipped share and mean MFU are ``clipped`` and ``mfu``."""
        if isinstance(clipped, bool):  # a step record's flag
            clipped = float(clipped)
        if _finite(clipped):
            self.steps += n
            self.clipped += float(clipped) * n
        if _finite(mfu):
            self.mfu_steps += n
            self.mfu_sum += float(mfu) * n


@dataclass
class RunSummary:
    windows: Steps = field(default_factory=Steps)
    raw: Steps = field(default_factory=Steps)
    last_step: int = -1
    spike: dict[str, float] = field(default_factory=dict)  # rise, step, value, expected
    incidents: int = 0
    incidents_critical: int = 0
    open: list[str] = field(default_factory=list)  # fingerprints of firing incidents
    open_overflow: int = 0
    critical: list[str] = field(default_factory=list)  # open ones already counted critical
    advice: int = 0
    answers: dict[str, int] = field(default_factory=dict)  # outcome -> acted records
    offsets: dict[str, int] = field(default_factory=dict)  # "topic:partition" -> offset

    def add(self, rec: Record, position: tuple[str, int, int] | None = None) -> bool:
        """Count ``rec`` (read at ``position``: topic, partition, offset) unless it was
        counted before; returns whether it was new."""
        if position is not None:
            topic, partition, offset = position
            key = f"{topic}:{partition}"
            if offset <= self.offsets.get(key, -1):
                return False
            self.offsets[key] = offset
        if rec.step is not None and rec.step > self.last_step:
            self.last_step = rec.step
        kind, d = rec.kind, rec.data
        if kind == "step_window":
            metrics = d.get("metrics") or {}
            clip, mfu = metrics.get("clipped") or {}, metrics.get("mfu") or {}
            self.windows.add(clip.get("mean"), None, int(clip.get("count") or 0))
            self.windows.add(None, mfu.get("mean"), int(mfu.get("count") or 0))
            self.last_step = max(self.last_step, int(d.get("step_last", -1)))
        elif kind == "step":
            self.raw.add(d.get("clipped"), d.get("mfu"))
        elif kind == "step_batch":
            for entry in d.get("records") or []:
                self.raw.add(entry.get("clipped"), entry.get("mfu"))
                self.last_step = max(self.last_step, int(entry.get("step", -1)))
        elif kind == "signal":
            self._spike(rec)
        elif kind == "alert":
            self._incident(d)
        elif kind == "advice":
            self.advice += 1
        elif kind == "acted" and d.get("outcome") in ADVICE_OUTCOMES:
            self.answers[d["outcome"]] = self.answers.get(d["outcome"], 0) + 1
        return True

    def _spike(self, rec: Record) -> None:
        d = rec.data
        if d.get("name") != "spike" or d.get("metric") != "loss":
            return
        if not (d.get("detail") or {}).get("severity"):
            return  # a quiet signal, no spike
        value, expected = d.get("value"), d.get("expected")
        if not (_finite(value) and _finite(expected)) or expected == 0:
            return
        value, expected = float(value), float(expected)  # type: ignore[arg-type]
        rise = (value - expected) / abs(expected)
        if rise > self.spike.get("rise", -math.inf):
            step = float(rec.step) if rec.step is not None else -1.0
            self.spike = {"rise": rise, "step": step, "value": value, "expected": expected}

    def _incident(self, d: dict[str, Any]) -> None:
        fp = str(d.get("fingerprint", ""))
        if d.get("state") == "resolved":
            if fp in self.open:
                self.open.remove(fp)
            if fp in self.critical:
                self.critical.remove(fp)
            return
        if fp not in self.open:
            self.incidents += 1
            self.open.append(fp)
            if len(self.open) > MAX_OPEN:
                self.open.pop(0)
                self.open_overflow += 1
        if d.get("severity") == "critical" and fp not in self.critical:
            self.incidents_critical += 1
            self.critical.append(fp)
            if len(self.critical) > MAX_OPEN:
                self.critical.pop(0)

    @property
    def steps(self) -> Steps:
        return self.windows if self.windows.steps or self.windows.mfu_steps else self.raw

    def metrics(self) -> dict[str, float]:
        """MLflow metrics ``summary/...`` (those the records so far can say)."""
        s = self.steps
        out = {
            "summary/loss_spike_peak_rise": self.spike.get("rise", 0.0),
            "summary/incidents": float(self.incidents),
            "summary/incidents_critical": float(self.incidents_critical),
            "summary/incidents_open": float(len(self.open)),
            "summary/advice": float(self.advice),
            **{f"summary/answers_{k}": float(v) for k, v in self.answers.items()},
        }
        if s.steps:
            out["summary/clip_rate"] = s.clipped / s.steps
        if s.mfu_steps:
            out["summary/mfu_mean"] = s.mfu_sum / s.mfu_steps
        return out

    def peak_text(self) -> str:
        if not self.spike:
            return "no loss spike"
        p = self.spike
        return (
            f"step {int(p['step'])}: loss {p['value']:.6g} over a baseline of "
            f"{p['expected']:.6g} ({100 * p['rise']:+.1f} %)"
        )

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> RunSummary:
        raw = json.loads(text)
        return cls(
            **{
                **raw,
                "windows": Steps(**raw.get("windows", {})),
                "raw": Steps(**raw.get("raw", {})),
            }
        )


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
