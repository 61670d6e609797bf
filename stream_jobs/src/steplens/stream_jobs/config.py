"""Every detector's settings in one place, with the defaults of the design."""

from __future__ import annotations

from dataclasses import dataclass, field

from steplens.stream_jobs.rules import RulesConfig
from steplens.stream_jobs.signals.arima import ArimaConfig
from steplens.stream_jobs.signals.data_quality import DataConfig
from steplens.stream_jobs.signals.evals import EvalConfig
from steplens.stream_jobs.signals.lr_schedule import LrConfig
from steplens.stream_jobs.signals.ranks import RanksConfig
from steplens.stream_jobs.signals.spike import SpikeConfig
from steplens.stream_jobs.signals.thresholds import ThresholdConfig
from steplens.stream_jobs.signals.training import TrainingConfig
from steplens.stream_jobs.signals.volatility import VolatilityConfig

SPIKE_METRICS = ("loss", "grad_norm", "grad_norm_preclip")  # upward spikes matter
GRAD_METRICS = ("grad_norm", "grad_norm_preclip")
ARIMA_METRICS = ("loss", "grad_norm", "step_time_s", "tokens_per_s")
VOLATILITY_METRICS = ("loss",)
NONFINITE_METRICS = ("lr", "param_norm", "update_ratio", "step_time_s", "tokens_per_s", "mfu")
# step fields that are not series to score on their own
NOT_SERIES = frozenset({"tokens", "clipped", "group_lrs", "reason", "scalars", "data_time_s"})


@dataclass
class DetectorConfig:
    spike: SpikeConfig = field(default_factory=SpikeConfig)
    # gradient norms: heavy-tailed around a level; a warning needs 1.5x the baseline as well
    grad_spike: SpikeConfig = field(
        default_factory=lambda: SpikeConfig(min_rel_change=0.5, trend_tolerant=False)
    )
    generic_spike: SpikeConfig = field(default_factory=lambda: SpikeConfig(direction="both"))
    volatility: VolatilityConfig = field(default_factory=VolatilityConfig)
    arima: ArimaConfig = field(default_factory=ArimaConfig)
    arima_enabled: bool = True
    thresholds: ThresholdConfig = field(default_factory=ThresholdConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    evals: EvalConfig = field(default_factory=EvalConfig)
    lr: LrConfig = field(default_factory=LrConfig)
    ranks: RanksConfig = field(default_factory=RanksConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rules: RulesConfig = field(default_factory=RulesConfig)
    train_loss_alpha: float = 0.1  # EMA of the training loss, for the train/validation gap
