"""Every signal in one table: what it reads, its settings, its state, its update, its hints.

Adding a signal is a module under ``signals/`` and an entry here. ``DetectorConfig``
(``config.py``), the rules' hints and the detector's routing all come from this table.

* ``Series``: a detector of one metric's series, ``update(state, cfg, metric, col) ->
  Signals | None`` over a run of the metric's finite values (``core.Column``); one state per
  rank and metric. A step record is a run of one value, a step batch a run of many.
* ``Records``: a detector of records of its own kinds, ``on_record(state, cfg, rec, run) ->
  list[Signals]``; one state per run.
* ``Evidence``: a rank's memory of recent inputs (a record kind's data, or step fields) that
  the evidence of a breach names (``stream_jobs.evidence``): ``keep(state, cfg, step, data)``,
  and ``names(state, cfg, rule, step, detail) -> {key: ...} | None`` for a breach of ``rule``
  at ``step`` on that rank (``detail``: the signal's, or the firing alert's evidence); one
  state per rank.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from steplens.stream_jobs.engine.policy import Policy
from steplens.stream_jobs.engine.signals import (
    arima,
    clipping,
    data_quality,
    evals,
    gpu_errors,
    layers,
    lengths,
    lr_events,
    lr_schedule,
    ranks,
    samples,
    spike,
    stacks,
    thresholds,
    training,
    vanishing,
    volatility,
)

# step fields that are flags (bool), scored as 1.0 or 0.0
FLAGS = frozenset({"clipped"})
# metrics checked for non-finite values only, even by the generic (offline) detectors
NONFINITE_ONLY = frozenset(
    {"lr", "param_norm", "update_ratio", "step_time_s", "tokens_per_s", "mfu", *FLAGS}
)
# step fields that are not series to score on their own
NOT_SERIES = frozenset(
    {
        "tokens",
        "group_lrs",
        "reason",
        "scalars",
        "data_time_s",
        "layer_grad_norms",
        "layer_param_norms",
    }
)
# signals that are records for the board, not judgements (an lr decay, a window's length
# histogram): every one is published, none alerts
EVENTS = frozenset({"lr_event", lengths.NAME})


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


@dataclass(frozen=True)
class Evidence:
    key: str  # its settings' attribute, its state's name, and the evidence's key
    config: Callable[[], Any]
    state: type
    keep: Callable[..., None]
    names: Callable[..., dict[str, Any] | None]
    rules: frozenset[str]  # the rules (name:metric) whose breaches it names
    kinds: frozenset[str] = frozenset()  # the record kinds it keeps
    fields: frozenset[str] = frozenset()  # the step fields it keeps
    hints: dict[str, str] = field(default_factory=dict)


SPIKE_HINTS = {
    "spike:loss": "loss spike: inspect the batch at this step (corrupted or out-of-distribution "
    "data; its samples are in the evidence), then the lr",
    "spike:grad_norm": "gradient-norm spike: check clipping, the lr and the batch at this step "
    "(its samples and the layers that moved are in the evidence)",
    "spike:grad_norm_preclip": "pre-clip gradient-norm spike: check the lr and the batch at "
    "this step (its samples and the layers that moved are in the evidence)",
    "spike": "value far above its recent robust baseline",
}
GRAD_NORMS = frozenset({"grad_norm", "grad_norm_preclip"})

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
        GRAD_NORMS,
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
        frozenset({"loss", *GRAD_NORMS, "step_time_s", "tokens_per_s"}),
        generic_except=frozenset({"lr", *FLAGS}),
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
        "lr_events",
        lr_events.LrEventConfig,
        lr_events.LrEventState,
        lr_events.update,
        frozenset({"lr"}),
    ),
    Series(
        "training",
        training.TrainingConfig,
        training.TrainingState,
        training.update,
        frozenset({"update_ratio", "param_norm"}),
        hints={
            "training:update_ratio": "fewer than 5 % of the parameters moved by more than 1e-3 "
            "of their size: the lr decayed to nothing or is too low, the optimizer state is "
            "broken (a reset, a huge epsilon) or the parameters are frozen",
            "training:param_norm": "parameter norm unstable: lower the lr, check weight decay "
            "(the layers that moved are in the evidence)",
        },
    ),
    Series(
        "clipping",
        clipping.ClipConfig,
        clipping.ClipState,
        clipping.update,
        FLAGS,
        hints={
            "clipping": "the gradient is clipped on most steps: every update is the clip's; "
            "the lr is too high or the data is wrong (check the batches, then lower the lr)"
        },
    ),
    Series(
        "vanishing",
        vanishing.VanishConfig,
        vanishing.VanishState,
        vanishing.update,
        GRAD_NORMS,
        hints={
            "vanishing": "the gradient norm collapsed toward zero: vanishing gradients (fp16 "
            "underflow or a stuck loss scale, a detached or frozen graph, saturated "
            "activations); the layers that moved are in the evidence"
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
        "lengths",
        lengths.LengthConfig,
        lengths.LengthState,
        lengths.on_record,
        frozenset({"batch"}),
    ),
    Records(
        "gpu_errors",
        gpu_errors.GpuErrorConfig,
        gpu_errors.GpuErrorState,
        gpu_errors.on_record,
        frozenset({"hw"}),
        gpu_errors.HINTS,
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
        frozenset({"hw", "health", "stacks"}),
        {
            "straggler": "one rank is consistently slower: check its GPU, host and data loading",
            "hang": "no progress while records still arrive: a hang (collective or data "
            "loader); the stuck rank's stacks are in the evidence when it sent them",
        },
    ),
)

EVIDENCE: tuple[Evidence, ...] = (
    Evidence(
        "samples",
        samples.SamplesConfig,
        samples.SamplesState,
        samples.keep,
        samples.names,
        samples.RULES,
        kinds=frozenset({"batch"}),
    ),
    Evidence(
        "layers",
        layers.LayersConfig,
        layers.LayersState,
        layers.keep,
        layers.names,
        frozenset(layers.RULES),
        fields=frozenset(layers.FIELDS),
    ),
    Evidence(
        "stacks",
        stacks.StacksConfig,
        stacks.StacksState,
        stacks.keep,
        stacks.names,
        stacks.RULES,
        kinds=frozenset({"stacks"}),
    ),
)

ENTRIES: tuple[Series | Records | Evidence, ...] = (*SERIES, *RECORDS, *EVIDENCE)
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
