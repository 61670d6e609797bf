"""Every detector's settings in one object, one attribute per registry entry (its config
dataclass, with the defaults of the design), plus the rules' and the run's own."""

from __future__ import annotations

from typing import Any

from steplens.stream_jobs.engine.calibration import CalibrationConfig
from steplens.stream_jobs.engine.incidents import IncidentsConfig
from steplens.stream_jobs.engine.rules import RulesConfig
from steplens.stream_jobs.engine.signals.registry import ENTRIES, SERIES


class DetectorConfig:
    """``cfg.spike``, ``cfg.ranks.hang_after_s``, ...: each registry entry's settings under its
    key (a statistical detector's alert policy is its ``policy``); ``arima_enabled`` (and any
    other entry's ``enabled`` flag) turns a detector on or off; ``rules``; ``calibration``,
    how raw scores become anomaly scores; ``train_loss_alpha``, the EMA weight of the training
    loss (for the train/validation gap). Keyword arguments replace any of them."""

    def __init__(self, **given: Any) -> None:
        self.rules: RulesConfig = given.pop("rules", None) or RulesConfig()
        self.train_loss_alpha: float = given.pop("train_loss_alpha", 0.1)
        self.calibration: CalibrationConfig = given.pop("calibration", None) or CalibrationConfig()
        self.incidents: IncidentsConfig = given.pop("incidents", None) or IncidentsConfig()
        for e in ENTRIES:
            setattr(self, e.key, given.pop(e.key, None) or e.config())
        for e in SERIES:
            if e.enabled:
                setattr(self, e.enabled, bool(given.pop(e.enabled, True)))
        if given:
            raise TypeError(f"DetectorConfig: unknown settings {sorted(given)}")

    def __getattr__(self, name: str) -> Any:  # the entries' settings, for type checkers
        raise AttributeError(name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DetectorConfig) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable settings

    def __repr__(self) -> str:
        return f"DetectorConfig({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    def enabled(self, flag: str | None) -> bool:
        return flag is None or bool(getattr(self, flag))
