"""The worker's settings, its topics and the by-run messages between its two agents.

``WorkerSettings`` and ``DetectorOptions`` are declared once (``steplens.schema.settings``):
``steplens worker``'s options, the ``STEPLENS_WORKER_*`` variables and the settings table of
docs/architecture.md all come from them. A flag given wins over the variable, which wins over
the default.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from msgspec import Meta

from steplens.schema.settings import (
    DEFAULT_KAFKA_BOOTSTRAP,
    NonEmptyStr,
    NonNegativeFloat,
    NonNegativeInt,
    Port,
    PositiveFloat,
    PositiveInt,
    about,
    nested,
)
from steplens.schema.time_bounds import TimeBounds
from steplens.schema.topics import Topics

FETCH_WAIT_MS = 100  # longest a fetch waits at the broker for new records (compat.set_fetch_wait)


@dataclass(frozen=True)
class HistorySettings:
    """Warm starts from history (``steplens worker --history-*``)."""

    enabled: Annotated[
        bool,
        about(
            "start a run the worker has no state of from its stored history (--no-history: cold)",
            flag="--no-history",
        ),
    ] = True
    days: Annotated[
        PositiveFloat,
        about("how far back a run's history (and its baseline run's) is read for a warm start"),
    ] = 7.0
    # the detectors' windows are shorter than the rows kept
    max_points: Annotated[
        PositiveInt,
        about("history rows per rank replayed into the detectors at most (the newest)"),
    ] = 4096
    timeout_s: Annotated[
        NonNegativeFloat,
        about(
            "seconds a run waits for its history before it starts cold",
            aliases=["--history-timeout"],
        ),
    ] = 30.0
    hold_bytes: Annotated[
        PositiveInt,
        about("bytes of messages held for runs being loaded, all runs together"),
    ] = 64 << 20


@dataclass(frozen=True)
class LimitSettings:
    """``steplens worker --max-runs --max-ranks --run-idle-s``."""

    max_runs: Annotated[
        PositiveInt,
        about("runs this worker keeps at most; a further run is not scored (counted)"),
    ] = 5000
    max_ranks: Annotated[
        PositiveInt,
        about(
            "ranks of one run scored at most; a further rank's records are dead letters; a "
            "run's GPUs, baseline series and remembered quiet signals are capped from it"
        ),
    ] = 16384
    idle_s: Annotated[
        PositiveFloat,
        about(
            "a run with nothing scored this long leaves the worker's state (it warms from its "
            "history if it comes back)",
            name="run_idle_s",
        ),
    ] = 72 * 3600.0


@dataclass(frozen=True)
class AdviceOptions:
    """What incidents advise a run's ranks, for the remedies it opted into (``engine.advice``;
    ``steplens worker --advice-*``)."""

    lr_factor: Annotated[
        Annotated[float, Meta(gt=0, le=1)],
        about("`lower_lr`: the factor a recurring loss and gradient correlation lowers the lr by"),
    ] = 0.5
    lower_lr_repeats: Annotated[
        PositiveInt,
        about("`lower_lr`: ... on the correlation's Nth incident within `lower_lr_window` steps"),
    ] = 2
    lower_lr_window: Annotated[PositiveInt, about("`lower_lr`: ... steps")] = 2000
    rewind_confirm_steps: Annotated[
        PositiveInt,
        about(
            "`rewind`, `lower_lr`: steps after a loss incident's onset its damage is judged at: "
            "still off the loss's pre-incident trend, it stays (a remedy); back on it, a blip "
            "(none). A non-finite loss or gradient, or a diverging loss, is judged at once"
        ),
    ] = 20
    trend_steps: Annotated[
        PositiveInt,
        about("... the trend: the median of this many finite losses before the onset"),
    ] = 50
    trend_tolerance: Annotated[
        NonNegativeFloat,
        about("... off it: above it by more than this share of it (or 3 MADs, if more)"),
    ] = 0.05
    rewind_max_back: Annotated[
        PositiveInt,
        about(
            "`rewind`: to the latest checkpoint before the onset at most this many steps back "
            "(PaLM: about 100); none: not sent, the incident says so and a person decides"
        ),
    ] = 200
    rewind_skip_margin: Annotated[
        NonNegativeInt,
        about(
            "`rewind`: batches skipped after the reload (the loader is not rewound: the steps "
            "undone, from the checkpoint to the rewind, are already batches not trained on) ..."
        ),
    ] = 100
    rewind_max_skip: Annotated[
        PositiveInt,
        about("... so that at most this many batches are not trained on in all (PaLM: 200-500)"),
    ] = 500
    remedy_budget: Annotated[
        Annotated[float, Meta(ge=0, le=1)],
        about(
            "share of a run's steps (its lr schedule's `total_steps`, else its last step) "
            "remedies may undo; past it and past `remedy_budget_floor` a remedy is not sent, "
            "the incident says what was suggested and a person decides"
        ),
    ] = 0.05
    remedy_budget_floor: Annotated[
        NonNegativeInt, about("... steps remedies may undo in any run")
    ] = 200
    lead_s: Annotated[
        NonNegativeFloat,
        about(
            "`rewind`, `lower_lr`: every rank carries it out at the end of the same step, this "
            "many seconds of the run's steps (plus its window, in windowed mode, and 2) past "
            "its last reported step: more than the advice's latency (p99 0.3 s locally)"
        ),
    ] = 5.0
    max_lead_steps: Annotated[
        Annotated[int, Meta(ge=2)],
        about("... at most this many steps past it (this many while the run's pace is unknown)"),
    ] = 200
    profile_s: Annotated[
        PositiveFloat, about("`profile`: seconds a straggler or idle GPU is profiled")
    ] = 30.0
    burst: Annotated[
        PositiveInt, about("pieces of advice a run may get at once (storm limit) ...")
    ] = 4
    refill_s: Annotated[
        NonNegativeFloat,
        about("... and one more every this many seconds; the rest is counted, not sent"),
    ] = 300.0


@dataclass(frozen=True)
class DetectorOptions:
    """The detector settings ``steplens worker`` takes; the rest keep the engine's defaults
    (``app.detector_config``). Declared apart from the engine: parsing options loads no
    detector."""

    ENV_PREFIX: ClassVar[str] = "STEPLENS_WORKER_"

    arima_enabled: Annotated[
        bool, about("the ARIMA baselines (--no-arima: off)", flag="--no-arima")
    ] = True
    baseline_refit_s: Annotated[
        PositiveFloat,
        about(
            "seconds between refits of a series' 7-day baseline (hardware per GPU, disk and "
            "network interface; step time and tokens/s per followed rank), in the fit pool"
        ),
    ] = 3600.0
    series_ranks: Annotated[
        NonNegativeInt | None,
        about(
            "a run's ranks 0 to N-1 keep series of their own metrics (ARIMA, spikes, "
            "volatility, 7-day baselines); the others' metrics are checked for non-finite "
            "values and their step times judged against the other ranks (a step window "
            "through the series costs about 0.3 ms, past them about 0.1 ms); ranks from 256 "
            "on send a finite spike in their window only (`followed_ranks`), so a spike of a "
            "rank past 256 followed here is seen when its window ends",
            default_doc="the engine's (`registry.SERIES_RANKS`, 256)",
        ),
    ] = None
    hang_after_s: Annotated[
        PositiveFloat | None,
        about(
            "seconds without progress before a hang alert",
            aliases=["--hang-after"],
            default_doc="the engine's (`RanksConfig.hang_after_s`, 60)",
        ),
    ] = None
    advice: Annotated[AdviceOptions, nested()] = field(default_factory=AdviceOptions)


def default_state_dir() -> str:
    home = os.environ.get("STEPLENS_HOME") or os.path.join(tempfile.gettempdir(), "steplens")
    return os.path.join(home, "worker-state")


@dataclass
class WorkerSettings:
    ENV_PREFIX: ClassVar[str] = "STEPLENS_WORKER_"

    bootstrap: Annotated[
        NonEmptyStr, about("Kafka bootstrap servers", env="STEPLENS_KAFKA_BOOTSTRAP")
    ] = DEFAULT_KAFKA_BOOTSTRAP
    topics: Topics = field(default_factory=Topics.from_env)
    app_id: Annotated[NonEmptyStr, about("consumer group and table prefix")] = "steplens-worker"
    state_dir: Annotated[
        NonEmptyStr,
        about("Faust data directory", default_doc="`$STEPLENS_HOME/worker-state`"),
    ] = field(default_factory=default_state_dir)
    web_port: Annotated[Port, about("Prometheus metrics port on 127.0.0.1 (0: off)")] = 9464
    faust_web_port: Annotated[Port, about("Faust's own web server port on 127.0.0.1 (0: off)")] = 0
    batch: Annotated[PositiveInt, about("raw records per routing batch")] = 1000
    within_s: Annotated[
        NonNegativeFloat,
        about(
            "seconds to wait for a routing batch (fewer, larger by-run messages: less "
            "per-message work for the worker, this much more latency)",
            aliases=["--within"],
        ),
    ] = 0.2
    fetch_wait_ms: Annotated[
        NonNegativeInt,
        about("longest a fetch waits at the broker for new records (Faust's consumer: 1,500)"),
    ] = FETCH_WAIT_MS
    by_run_partitions: Annotated[
        PositiveInt, about("partitions of the internal by-run topic (when it is created)")
    ] = 8
    shard_ranks: Annotated[
        NonNegativeInt,
        about(
            "a wide run's ranks are scored in shards, each on a by-run partition of its own "
            "(the workers share them): shard 0 holds the followed ranks (`series_ranks`, in "
            "whole nodes, at most N) and makes the run-wide checks, each later shard N ranks "
            "(by default a run of `max_ranks` fills the 8 by-run partitions: (16,384 - 256) / "
            "7); a straggler is judged against its shard; a multiple of a node's ranks; 0: a "
            "run is never split"
        ),
    ] = 2304
    signal_every: Annotated[
        NonNegativeInt,
        about("publish a quiet signal per rank and rule every N steps (0: breaches only)"),
    ] = 50
    signal_interval_s: Annotated[
        NonNegativeFloat,
        about(
            "... and at most once in this many seconds (0: no time limit)",
            aliases=["--signal-interval"],
        ),
    ] = 15.0
    signal_ranks: Annotated[
        NonNegativeInt,
        about(
            "a run wider than this many ranks has each rank's quiet signals spread out (the "
            "two limits times width / N): it sends about as many as a run of N ranks "
            "(0: no spreading)"
        ),
    ] = 256
    checkpoint_s: Annotated[
        NonNegativeFloat,
        about(
            "write a run's state to the table at most this often; a run's messages since then "
            "are acknowledged only by its next checkpoint (after a crash they are scored again)"
        ),
    ] = 5.0
    fit_workers: Annotated[
        NonNegativeInt, about("processes for ARIMA fits and the 7-day baselines' (0: neither)")
    ] = 1
    max_pending_fits: Annotated[
        PositiveInt,
        about("ARIMA fits queued or running at most; past it a fit is skipped (asked again)"),
    ] = 4096
    fit_batch: Annotated[PositiveInt, about("ARIMA fits per pool job at most")] = 64
    detector: Annotated[DetectorOptions, nested("")] = field(default_factory=DetectorOptions)
    history: Annotated[HistorySettings, nested()] = field(default_factory=HistorySettings)
    limits: Annotated[LimitSettings, nested("")] = field(default_factory=LimitSettings)
    time_bounds: Annotated[TimeBounds, nested("")] = field(default_factory=TimeBounds)
    session_timeout_s: Annotated[
        PositiveFloat,
        about(
            "seconds after which a SIGKILLed worker's partitions move to the others: its runs "
            "alert again on them 2-4 s later, 4 s more where the table recovery stalls and is "
            "started over (heartbeats every sixth of it); a worker whose "
            "loop is busy this long is taken for dead; the broker's floor is its "
            "group.min.session.timeout.ms (6 s by default)"
        ),
    ] = 6.0
    log_level: Annotated[NonEmptyStr, about("log level of the worker")] = "warning"


def ensure_worker_topics(s: WorkerSettings, timeout_s: float = 30.0) -> None:
    """Create the steplens topics and the internal by-run topic if they do not exist."""
    from steplens.schema.topics import TopicSpec, create_missing, ensure_topics

    ensure_topics(s.bootstrap, s.topics, timeout_s)
    config = {"retention.ms": str(24 * 3600 * 1000), "max.message.bytes": str(BY_RUN_MAX_BYTES)}
    create_missing(
        s.bootstrap, [TopicSpec(f"{s.app_id}-by-run", s.by_run_partitions, config)], timeout_s
    )


# A by-run message carries raw messages of one run as JSON strings; a batch of a backlog can
# hold megabytes of one run (step batches), more than Kafka takes in one message (1 MiB by
# default), so a run's share of a batch is cut into messages of about this many text bytes.
BY_RUN_MESSAGE_BYTES = 256 << 10
# one raw message alone (up to schema.MAX_RECORD_BYTES) must fit, escaped as a JSON string
BY_RUN_MAX_BYTES = 4 << 20


# a record batch stays under the 1 MiB Kafka takes by default per message (signals, changelog)
PRODUCER_BATCH_BYTES = 512 << 10
# table writes (checkpoint values, tens of KB each) that may wait to be sent before Faust holds
# back consumption
PRODUCER_BUFFER_MESSAGES = 1024


def by_run_chunks(items: list[list[Any]], budget: int = BY_RUN_MESSAGE_BYTES) -> list[list[Any]]:
    """``items`` ([partition, offset, text]) in order, cut where the texts pass ``budget``
    bytes (an item larger than that goes alone)."""
    out: list[list[Any]] = []
    chunk: list[Any] = []
    size = 0
    for item in items:
        n = len(item[2]) + 32
        if chunk and size + n > budget:
            out.append(chunk)
            chunk, size = [], 0
        chunk.append(item)
        size += n
    if chunk:
        out.append(chunk)
    return out


def run_of_key(key: bytes | None) -> tuple[str, int] | None:
    """A raw key's run and rank (``run_id:rank``); None when it is not one."""
    if not key:
        return None
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    run, sep, rank = text.rpartition(":")
    if not (sep and run and rank.lstrip("-").isdigit()):
        return None
    return run, int(rank)
