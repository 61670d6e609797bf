"""Every signal in one table: what it reads, its settings, its state, its update; and what
comes from the table: ``DetectorConfig`` (every detector's settings in one object), the
detector's routing (``route``) and the compiled loops' warm-up (``warm_up``).

Adding a signal is a module under ``signals/``, an entry here and its rules' hints
(``engine/hints.py``).

* ``Series``: a detector of one metric's series, ``update(state, cfg, metric, col) ->
  Signals | None`` over a run of the metric's finite values (``core.Column``); one state per
  rank and metric. A step record is a run of one value, a step batch a run of many.
* ``Records``: a detector of records of its own kinds, ``on_record(state, cfg, rec, run) ->
  list[Signals]``; one state per run.
* ``Evidence``: a rank's memory of recent inputs that the evidence of a breach names; its
  entries are ``evidence.EVIDENCE`` (``engine/evidence.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from steplens.schema.followed_ranks import FOLLOWED_RANKS
from steplens.stream_jobs.engine.advice import AdviceConfig
from steplens.stream_jobs.engine.calibration import CalibrationConfig
from steplens.stream_jobs.engine.columns import FLAGS
from steplens.stream_jobs.engine.evidence import EVIDENCE, Evidence
from steplens.stream_jobs.engine.incidents import IncidentsConfig
from steplens.stream_jobs.engine.policy import Policy
from steplens.stream_jobs.engine.rules import RulesConfig
from steplens.stream_jobs.engine.signals import (
    arima,
    clipping,
    data_quality,
    dynamic_baseline,
    evals,
    gpu_errors,
    gpu_memory,
    host_memory,
    lengths,
    lr_events,
    lr_schedule,
    ranks,
    sketches,
    spike,
    thresholds,
    training,
    vanishing,
    volatility,
)

# metrics checked for non-finite values only, even by the generic (offline) detectors
NONFINITE_ONLY = frozenset(
    {"lr", "param_norm", "update_ratio", "step_time_s", "tokens_per_s", "mfu", *FLAGS}
)


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


GRAD_NORMS = frozenset({"grad_norm", "grad_norm_preclip"})
# ranks of a run whose own metrics keep series, by default: the wire contract's followed ranks
# (a rank past them sends a finite spike in its window only), as many as the hot store keeps a
# run's per-rank series for (the InfluxDB sink's ``RankLimits.per_run``). A step window
# through the series costs about 0.3 ms, against about 0.1 ms past them; all followed ranks
# sit in a wide run's first shard, so more of them make that shard's worker the slowest
# (bench/RESULTS.md)
SERIES_RANKS = FOLLOWED_RANKS

SERIES: tuple[Series, ...] = (
    Series(
        "spike",
        spike.SpikeConfig,
        spike.SpikeState,
        spike.update,
        frozenset({"loss"}),
        group="spike",
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
    ),
    Series(
        "arima",
        arima.ArimaConfig,
        arima.ArimaState,
        arima.update,
        frozenset({"loss", *GRAD_NORMS, "step_time_s", "tokens_per_s"}),
        generic_except=frozenset({"lr", *FLAGS}),
        enabled="arima_enabled",
    ),
    Series(
        "lr",
        lr_schedule.LrConfig,
        lr_schedule.LrState,
        lr_schedule.update,
        frozenset({"lr"}),
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
    ),
    Series(
        "clipping",
        clipping.ClipConfig,
        clipping.ClipState,
        clipping.update,
        FLAGS,
    ),
    Series(
        "vanishing",
        vanishing.VanishConfig,
        vanishing.VanishState,
        vanishing.update,
        GRAD_NORMS,
    ),
)

RECORDS: tuple[Records, ...] = (
    Records(
        "thresholds",
        thresholds.ThresholdConfig,
        thresholds.ThresholdState,
        thresholds.on_record,
        frozenset({"hw", "comm"}),
    ),
    Records(
        "gpu_memory",
        gpu_memory.GpuMemoryConfig,
        gpu_memory.GpuMemoryState,
        gpu_memory.on_record,
        frozenset({"hw"}),
    ),
    # every rank's health record: its process's memory against its host's
    Records(
        "host_memory",
        host_memory.HostMemoryConfig,
        host_memory.HostMemoryState,
        host_memory.on_record,
        frozenset({"health"}),
    ),
    Records(
        "data",
        data_quality.DataConfig,
        data_quality.DataState,
        data_quality.on_record,
        frozenset({"batch"}),
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
    ),
    Records(
        "evals",
        evals.EvalConfig,
        evals.EvalState,
        evals.on_record,
        frozenset({"eval"}),
    ),
    # hw records' GPUs, disks and network against their 7-day bands (steps: ``on_steps``)
    Records(
        "baseline",
        dynamic_baseline.DynamicConfig,
        dynamic_baseline.DynamicState,
        dynamic_baseline.on_record,
        frozenset({"hw"}),
    ),
    # hw and health records advance the run's clock; step times feed it in the step path
    Records(
        "ranks",
        ranks.RanksConfig,
        ranks.RanksState,
        ranks.on_record,
        frozenset({"hw", "health", "stacks"}),
    ),
)

ENTRIES: tuple[Series | Records | Evidence, ...] = (*SERIES, *RECORDS, *EVIDENCE)


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


class DetectorConfig:
    """``cfg.spike``, ``cfg.ranks.hang_after_s``, ...: each registry entry's settings under its
    key (a statistical detector's alert policy is its ``policy``); ``arima_enabled`` (and any
    other entry's ``enabled`` flag) turns a detector on or off; ``rules``; ``calibration``,
    how raw scores become anomaly scores; ``advice``, what incidents advise the ranks
    (``engine.advice``); ``train_loss_alpha``, the EMA weight of the training loss (for the
    train/validation gap); ``series_ranks``. Keyword arguments replace any of them."""

    def __init__(self, **given: Any) -> None:
        self.rules: RulesConfig = given.pop("rules", None) or RulesConfig()
        self.train_loss_alpha: float = given.pop("train_loss_alpha", 0.1)
        # ranks whose own metrics keep series (ARIMA, spikes, volatility, ...): ranks 0 to
        # N-1; the others' are checked for non-finite values and judged against the other
        # ranks (``rank_signals``), their rows counted (``Run.unfollowed``)
        self.series_ranks: int = given.pop("series_ranks", SERIES_RANKS)
        self.calibration: CalibrationConfig = given.pop("calibration", None) or CalibrationConfig()
        self.incidents: IncidentsConfig = given.pop("incidents", None) or IncidentsConfig()
        self.advice: AdviceConfig = given.pop("advice", None) or AdviceConfig()
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

    def metrics(self) -> list[str]:
        """The step fields the enabled series detectors learn from."""
        return sorted({m for e in SERIES if self.enabled(e.enabled) for m in e.metrics})


def warm_up() -> None:
    """Compile the detectors' loops (``kernels``), or load them from the cache, before the
    first batch needs them."""
    for mod in (spike, arima, volatility, lr_schedule, ranks, clipping, vanishing, sketches):
        mod.warm_up_kernel()
