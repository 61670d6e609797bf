"""Every signal in one table: what it reads, its settings, its state, its update, its hints.

Adding a signal is a module under ``signals/`` and an entry here. ``DetectorConfig``
(``config.py``), the rules' hints and the detector's routing all come from this table.

* ``Series``: a detector of one metric's series, ``update(state, cfg, metric, col) ->
  Signals | None`` over a run of the metric's finite values (``core.Column``); one state per
  rank and metric. A step record is a run of one value, a step batch a run of many.
* ``Records``: a detector of records of its own kinds, ``on_record(state, cfg, rec, run) ->
  list[Signals]``; one state per run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from steplens.stream_jobs.policy import Policy
from steplens.stream_jobs.signals import (
    arima,
    data_quality,
    evals,
    lr_schedule,
    ranks,
    spike,
    thresholds,
    training,
    volatility,
)

# metrics checked for non-finite values only, even by the generic (offline) detectors
NONFINITE_ONLY = frozenset(
    {"lr", "param_norm", "update_ratio", "step_time_s", "tokens_per_s", "mfu"}
)
# step fields that are not series to score on their own
NOT_SERIES = frozenset({"tokens", "clipped", "group_lrs", "reason", "scalars", "data_time_s"})


@dataclass(frozen=True)
class Series:
    key: str  # its settings' attribute of ``DetectorConfig``, and its states' name
    config: Callable[[], Any]
    state: type
    update: Callable[..., Any]
    metrics: frozenset[str] = frozenset()  # the step fields it scores
    # ``steplens detect`` (generic): also every other numeric column but these
    generic_except: frozenset[str] | None = None
    group: str = ""  # of one group's entries only the first that reads a metric scores it
    enabled: str | None = None  # the ``DetectorConfig`` flag that turns it on
    hints: dict[str, str] = field(default_factory=dict)

    def reads(self, metric: str, generic: bool) -> bool:
        if metric in self.metrics:
            return True
        return generic and self.generic_except is not None and metric not in self.generic_except


@dataclass(frozen=True)
class Records:
    key: str
    config: Callable[[], Any]
    state: type
    on_record: Callable[..., Any]
    kinds: frozenset[str]
    hints: dict[str, str] = field(default_factory=dict)


SPIKE_HINTS = {
    "spike:loss": "loss spike: inspect the batch at this step (corrupted or out-of-distribution "
    "data), then the lr",
    "spike:grad_norm": "gradient-norm spike: check clipping, the lr and the batch at this step",
    "spike": "value far above its recent robust baseline",
}

SERIES: tuple[Series, ...] = (
    Series(
        "spike",
        spike.SpikeConfig,
        spike.SpikeState,
        spike.update,
        frozenset({"loss"}),
        group="spike",
        hints=SPIKE_HINTS,
    ),
    # gradient norms: heavy-tailed around a level; rarer than 1 in 1,000 and 3x the baseline
    # warns, 10x (the design's anchor) is critical, a rare doubling is a note; before the
    # series knows its noise (early training, where norms move fast), 5x warns
    Series(
        "grad_spike",
        lambda: spike.SpikeConfig(
            trend_tolerant=False,
            policy=Policy(
                rarity=0.999,
                measure="ratio",
                warning=3.0,
                critical=10.0,
                note=2.0,
                cold_warning=5.0,
                cold_critical=10.0,
            ),
        ),
        spike.SpikeState,
        spike.update,
        frozenset({"grad_norm", "grad_norm_preclip"}),
        group="spike",
    ),
    Series(
        "generic_spike",
        # a column of an offline CSV: rarity alone (its unit means nothing to us)
        lambda: spike.SpikeConfig(direction="both", policy=Policy()),
        spike.SpikeState,
        spike.update,
        generic_except=NONFINITE_ONLY,
        group="spike",
    ),
    Series(
        "volatility",
        volatility.VolatilityConfig,
        volatility.VolatilityState,
        volatility.update,
        frozenset({"loss"}),
        hints={"volatility": "loss is noisy: lower the lr or raise the batch size / warmup"},
    ),
    Series(
        "arima",
        arima.ArimaConfig,
        arima.ArimaState,
        arima.update,
        frozenset({"loss", "grad_norm", "step_time_s", "tokens_per_s"}),
        generic_except=frozenset({"lr"}),
        enabled="arima_enabled",
        hints={
            "arima": "the series left its forecast interval for several steps: a change in regime"
        },
    ),
    Series(
        "lr",
        lr_schedule.LrConfig,
        lr_schedule.LrState,
        lr_schedule.update,
        frozenset({"lr"}),
        hints={
            "lr_schedule": "the lr does not follow the declared schedule: check the scheduler "
            "(stepping, resume, milestones)"
        },
    ),
    Series(
        "training",
        training.TrainingConfig,
        training.TrainingState,
        training.update,
        frozenset({"update_ratio", "param_norm"}),
        hints={
            "training:update_ratio": "parameter updates collapsed: lr or optimizer state",
            "training:param_norm": "parameter norm unstable: lower the lr, check weight decay",
        },
    ),
)

RECORDS: tuple[Records, ...] = (
    Records(
        "thresholds",
        thresholds.ThresholdConfig,
        thresholds.ThresholdState,
        thresholds.on_record,
        frozenset({"hw", "comm"}),
        thresholds.HINTS,
    ),
    Records(
        "data",
        data_quality.DataConfig,
        data_quality.DataState,
        data_quality.on_record,
        frozenset({"batch"}),
        data_quality.HINTS,
    ),
    Records(
        "evals",
        evals.EvalConfig,
        evals.EvalState,
        evals.on_record,
        frozenset({"eval"}),
        evals.HINTS,
    ),
    # hw and health records advance the run's clock; step times feed it in the step path
    Records(
        "ranks",
        ranks.RanksConfig,
        ranks.RanksState,
        ranks.on_record,
        frozenset({"hw", "health"}),
        {
            "straggler": "one rank is consistently slower: check its GPU, host and data loading",
            "hang": "no progress while records still arrive: a hang (collective or data "
            "loader); dump the stacks of the stuck rank",
        },
    ),
)

ENTRIES: tuple[Series | Records, ...] = (*SERIES, *RECORDS)
HINTS: dict[str, str] = {k: v for e in ENTRIES for k, v in e.hints.items()}


@functools.cache
def route(metric: str, generic: bool) -> tuple[Series, ...]:
    """The series detectors that score ``metric``, in order (``generic``: an offline CSV)."""
    out: list[Series] = []
    groups: set[str] = set()
    for e in SERIES:
        if e.reads(metric, generic) and not (e.group and e.group in groups):
            out.append(e)
            if e.group:
                groups.add(e.group)
    return tuple(out)
