"""A detector's signals as the worker judges them: through ``RunDetector`` (the detector, its
calibrated score and the alert policy), one value per call as step records come, checked to
equal the same values scored as one column."""

from __future__ import annotations

import copy

from steplens.schema import RUN_RANK
from steplens.stream_jobs.engine.core import Signal, flatten
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals.registry import DetectorConfig


def judged(
    values: list[float],
    metric: str,
    name: str,
    cfg: DetectorConfig | None = None,
    generic: bool = False,
) -> list[Signal]:
    """Detector ``name``'s signals of ``values`` (steps 0, 1, ...) of a run-level series."""
    cfg = cfg or DetectorConfig()
    one = RunDetector("r", copy.deepcopy(cfg), generic=generic)
    out: list[Signal] = []
    for i, x in enumerate(values):
        out += flatten(one.process_columns(RUN_RANK, [i], [i], {metric: [x]}))
    whole = RunDetector("r", copy.deepcopy(cfg), generic=generic)
    steps = list(range(len(values)))
    assert repr(flatten(whole.process_columns(RUN_RANK, steps, steps, {metric: values}))) == repr(
        out
    )
    return [s for s in out if s.name == name]


def breaches(sigs: list[Signal]) -> list[int | None]:
    """The steps that warn or are critical (notes, severity info, feed correlations only)."""
    return [s.step for s in sigs if s.severity in ("warning", "critical")]
