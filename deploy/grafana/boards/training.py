"""The training board: loss, lr and its events, throughput, gradients and clipping, per-layer
norms, step time, evaluation scores, input lengths, the stacks of a stalled rank, signals; the
loss's volatility and the train-validation gap, label balance, duplicated and repeated samples,
and which checks each rank runs."""

from __future__ import annotations

from typing import Any

from .flux import Read, latest, names, per_interval, stitched
from .layout import COLD, INFLUX, board, panel, right_axis, threshold_line

RANK = ("rank",)
LAYER = ("layer",)
# length bins (len_lt_<upper edge>) the panel names; every bin is read (a pattern)
LENGTH_BINS = ("len_lt_16", "len_lt_32")
STACKS_LIMIT = 100
# the stream jobs' defaults (DataConfig.duplicate_rate, VolatilityConfig.threshold)
DUPLICATE_RATE = 0.05
VOLATILITY = 0.10
CHECK_ROW = ("rank", "check", "on", "state", "needs", "why", "enable")


def signal_values(where: str, keep: tuple[str, ...] = ()) -> Read:
    """The ``value`` of the stream jobs' signals that match ``where``."""
    return Read("signal", ("value",), where=where, keep=keep)


def checks_table() -> str:
    """Each rank's checks, newest report of each: on (1) or off (0), and the words (the hot
    bucket only: the rollups keep ``on`` alone)."""
    read = Read("check", ("on", "state", "needs", "why", "enable"), rolled_fields=("on",))
    pivot = (
        'pivot(rowKey: ["_time", "rank", "check"], columnKey: ["_field"], valueColumn: "_value")'
    )
    return stitched(
        read,
        "last",
        reduce_hot=["last()"],
        reduce_rolled=["last()"],
        shape_hot=[pivot],
        shape_rolled=["toInt()", pivot],
        after=[
            'group(columns: ["rank", "check"])',
            'sort(columns: ["_time"], desc: true)',
            "limit(n: 1)",
            "group()",
            f"keep(columns: {names(CHECK_ROW)})",
            'sort(columns: ["on", "check", "rank"])',
        ],
    )


def step(*fields: str) -> Read:
    return Read("step", fields, keep=RANK)


def clipping_rate() -> list[str]:
    """The share of steps clipped: a window's mean of ``clipped`` (every step of the window
    that carried it), and in full resolution the steps' own flags (booleans, which the
    rollups do not keep: the last hour only)."""
    name = 'map(fn: (r) => ({r with _field: "clipped_rate"}))'
    windows = per_interval(
        Read("step_window", ("mean",), where='r.metric == "clipped"', keep=RANK),
        "mean",
        after=[name],
    )
    read = Read("step", ("clipped",), keep=RANK)
    flags = stitched(
        read,
        "mean",
        reduce_hot=["toFloat()", "aggregateWindow(every: every, fn: mean, createEmpty: false)"],
        after=['sort(columns: ["_time"])', name],
    )
    return [windows, flags]


def stacks_log() -> str:
    """The newest stacks records (text in the hot bucket only; before, when and how long: a
    rolled-up last_step is a float, and one column cannot be both)."""
    read = Read("stacks", ("stalled_s", "last_step", "text"), rolled_fields=("stalled_s",))
    pivot = 'pivot(rowKey: ["_time", "rank", "host"], columnKey: ["_field"], valueColumn: "_value")'
    columns = '["_time", "rank", "host", "stalled_s", "last_step", "text"]'
    return stitched(
        read,
        "last",
        shape_hot=[pivot],
        shape_rolled=[pivot],
        after=[
            "group()",
            f"keep(columns: {columns})",
            'sort(columns: ["_time"], desc: true)',
            f"limit(n: {STACKS_LIMIT})",
        ],
    )


def lr_events() -> dict[str, Any]:
    """A mark at each lr event the worker found (warm-up ended, a decay and the declared
    milestone it matches): its words in the hot bucket, "lr event" before."""
    read = Read("signal", ("detail",), where='r.name == "lr_event"', rolled_fields=("value",))
    columns = 'keep(columns: ["_time", "_value"])'
    query = stitched(
        read,
        "last",
        shape_hot=['map(fn: (r) => ({r with _value: "lr: " + r._value}))', columns],
        shape_rolled=['map(fn: (r) => ({_time: r._time, _value: "lr event"}))', columns],
        after=["group()"],
    )
    return {
        "name": "lr events",
        "datasource": INFLUX,
        "enable": True,
        "iconColor": "purple",
        "target": {"query": query},
    }


def training() -> dict[str, Any]:
    loss_window = 'r.metric == "loss"'
    panels = [
        panel(
            "Loss per rank (max per interval: spikes stay visible)",
            "timeseries",
            [per_interval(step("loss"), "max")],
            ["loss"],
        ),
        panel(
            "Learning rate",
            "timeseries",
            [per_interval(step("lr"), "last")],
            ["lr"],
            description="The lr each step used (log_step's, else watch()'s); the lr events "
            "the stream jobs find (warm-up ended, a decay and the declared milestone it "
            "matches) are marks on every panel.",
        ),
        panel(
            "Throughput (tokens/s, mean over ranks)",
            "timeseries",
            [per_interval(Read("step", ("tokens_per_s",)), "mean", group=["_field"])],
            ["tokens_per_s"],
            unit="short",
        ),
        panel(
            "Gradient norm per rank (max per interval)",
            "timeseries",
            [per_interval(step("grad_norm", "grad_norm_preclip"), "max")],
            ["grad_norm", "grad_norm_preclip"],
        ),
        panel(
            "Step time per rank (max per interval)",
            "timeseries",
            [per_interval(step("step_time_s"), "max")],
            ["step_time_s"],
            unit="s",
        ),
        panel(
            "Live: last step per rank",
            "stat",
            [latest(step("step"))],
            ["step"],
            description="The latest step each rank reported; a rank that stops moving has stalled.",
            w=6,
        ),
        panel("Live: last loss", "stat", [latest(step("loss"))], ["loss"], w=6),
        panel(
            "Evaluation: loss and perplexity",
            "timeseries",
            [per_interval(Read("eval", ("loss", "perplexity"), keep=("split",)), "last")],
            ["loss", "perplexity"],
        ),
        panel(
            "Evaluation: accuracy, F1, ROUGE-L (0-1) and BLEU (0-100)",
            "timeseries",
            [
                per_interval(
                    Read("eval", ("accuracy", "f1", "rouge", "bleu"), keep=("split",)), "last"
                )
            ],
            ["accuracy", "f1", "rouge", "bleu"],
            description="log_eval's scores; BLEU and ROUGE-L computed by the producer from "
            "predictions and references when it has the text extra.",
            overrides=[right_axis({"id": "byRegexp", "options": "bleu.*"})],
        ),
        panel(
            "Loss per rank: ARIMA expectation and band",
            "timeseries",
            [
                per_interval(
                    Read(
                        "signal",
                        ("value", "expected", "lower", "upper"),
                        where='r.name == "arima" and r.metric == "loss"',
                        keep=RANK,
                    ),
                    "last",
                )
            ],
            ["value", "expected", "lower", "upper"],
        ),
        panel(
            "Tokens/s and step time per rank: 7-day baseline band",
            "timeseries",
            [
                per_interval(
                    Read(
                        "signal",
                        ("value", "expected", "lower", "upper"),
                        where='r.name == "baseline" and '
                        '(r.metric == "tokens_per_s" or r.metric == "step_time_s")',
                        keep=(*RANK, "metric"),
                    ),
                    "last",
                )
            ],
            ["value", "expected", "lower", "upper"],
            description="Each minute's mean and the normal range expected of it: a forecast "
            "band from the previous 7 days (a band of the run's own minutes while it has less "
            "than a day), refitted hourly. Ten minutes slower (fewer tokens) than it alert.",
        ),
        panel(
            "Loss of every step, between the sampled ones (step windows: min and max)",
            "timeseries",
            [
                per_interval(Read("step_window", ("max",), where=loss_window, keep=RANK), "max"),
                per_interval(Read("step_window", ("min",), where=loss_window, keep=RANK), "min"),
            ],
            ["max", "min"],
            description="Each rank folds every step into a window (count, mean, min, max, "
            "last); the loss panel shows the sampled and flagged steps, this one the range "
            "of all of them.",
        ),
        panel(
            "Data loading time per rank (max per interval)",
            "timeseries",
            [per_interval(step("data_time_s"), "max")],
            ["data_time_s"],
            description="Time a step waited for its batch: a slow data loader (a straggler) "
            "shows here on its own rank.",
            unit="s",
        ),
        panel(
            "Model FLOPs utilisation (mean over ranks)",
            "timeseries",
            [per_interval(Read("step", ("mfu",)), "mean", group=["_field"])],
            ["mfu"],
            unit="percentunit",
        ),
        panel(
            "Parameter norm and update ratio per rank (max per interval)",
            "timeseries",
            [per_interval(step("param_norm", "update_ratio"), "max")],
            ["param_norm", "update_ratio"],
        ),
        panel(
            "Clipping rate per rank (share of steps clipped, mean per interval)",
            "timeseries",
            clipping_rate(),
            ["clipped_rate"],
            description="Clipping on most steps means the lr or the data is off. Windows: "
            "the share of a window's steps that carried the flag; full resolution: every "
            "step's flag (the last hour).",
            unit="percentunit",
            defaults={"min": 0, "max": 1},
        ),
        panel(
            "Per-layer gradient norm (max per interval and over ranks)",
            "timeseries",
            [
                per_interval(
                    Read("layer", ("grad_norm",), keep=LAYER), "max", group=["_field", "layer"]
                )
            ],
            ["grad_norm", "layer"],
            description="watch()'s per-layer norms: every layer when a model has at most "
            "max_layers (32), else those that changed most at each send.",
        ),
        panel(
            "Per-layer parameter norm (max per interval and over ranks)",
            "timeseries",
            [
                per_interval(
                    Read("layer", ("param_norm",), keep=LAYER), "max", group=["_field", "layer"]
                )
            ],
            ["param_norm", "layer"],
        ),
        panel(
            "Input lengths (samples per batch in each length bin, mean per interval)",
            "timeseries",
            [per_interval(Read("batch", pattern="len_lt_[0-9]+"), "mean", group=["_field"])],
            list(LENGTH_BINS),
            description="One series per bin of the length histogram (len_lt_N: shorter than "
            "N tokens, at least the bin before), over all ranks: a histogram per interval.",
            defaults={"custom": {"drawStyle": "bars", "stacking": {"mode": "percent"}}},
        ),
        panel(
            "Over-length and supervised share per rank (mean per interval)",
            "timeseries",
            [
                per_interval(
                    Read("batch", ("over_length_share", "supervised_share"), keep=RANK), "mean"
                )
            ],
            ["over_length_share", "supervised_share"],
            description="Share of samples longer than max_len; for language-model batches, "
            "share of tokens with a label (log_batch).",
            unit="percentunit",
        ),
        panel(
            "Stalled ranks: the Python stacks they sent",
            "table",
            [stacks_log()],
            ["stalled_s", "last_step", "text"],
            description=f"Newest first, at most {STACKS_LIMIT}: a rank that stopped stepping "
            "while its process lived sends the stacks of every thread (hang_dump_after_s). " + COLD,
            w=24,
            h=10,
            hot_only=["text", "last_step"],
        ),
        panel(
            "Batches: longest row and over-length rows per rank (max per interval)",
            "timeseries",
            [
                per_interval(
                    Read("batch", ("length_max", "over_length", "max_len"), keep=RANK), "max"
                )
            ],
            ["length_max", "over_length", "max_len"],
            description="A corrupted or mis-packed batch shows as rows above the maximum "
            "length (max_len).",
        ),
        *quality_panels(),
    ]
    return board("steplens-training", "steplens: training", panels, [lr_events()])


def quality_panels() -> list[dict[str, Any]]:
    """The loss's volatility and the train-validation gap, label balance, duplicated and
    repeated samples, and the checks each rank runs."""
    rates = " or ".join(
        f'r.metric == "{m}"' for m in ("duplicate_rate", "repeat_rate", "repeat_share")
    )
    return [
        panel(
            "Loss volatility (relative noise, worst rank per interval)",
            "timeseries",
            [
                per_interval(
                    signal_values('r.name == "volatility" and r.metric == "loss"'),
                    "max",
                    group=["_field"],
                )
            ],
            ["value"],
            description="The standard deviation of the loss's recent changes over its mean "
            f"(the stream jobs' volatility signal); they warn above {VOLATILITY:g} (dashed). "
            "0 until a rank's window is full.",
            unit="percentunit",
            defaults=threshold_line(VOLATILITY),
        ),
        panel(
            "Train-validation gap (validation loss - training loss)",
            "timeseries",
            [
                per_interval(
                    signal_values('r.name == "generalization_gap"', keep=("scope",)), "last"
                )
            ],
            ["value"],
            description="At each evaluation, its loss minus the training loss (an average of "
            "the recent steps): a gap that keeps widening is overfitting (the stream jobs "
            "note it as generalization_gap).",
        ),
        panel(
            "Label balance (labels per batch, share per interval)",
            "timeseries",
            [per_interval(Read("batch", pattern="label_.+"), "mean", group=["_field"])],
            ["label_cat", "label_dog"],
            description="A classifier's batches: one series per class label (log_batch's "
            "label_<name> counts, mean per interval over all ranks), stacked to 100 %. The "
            "stream jobs warn when the most frequent label outnumbers the least 100:1.",
            defaults={"custom": {"drawStyle": "bars", "stacking": {"mode": "percent"}}},
        ),
        panel(
            "Duplicated and repeated samples (worst rank per interval)",
            "timeseries",
            [
                per_interval(
                    signal_values(f'r.name == "data" and ({rates})', keep=("metric",)),
                    "max",
                    group=["_field", "metric"],
                )
            ],
            ["value", "metric"],
            description="duplicate_rate: samples that another rank (or the same batch) also "
            "had in the same step (a sharding bug); repeat_rate: samples seen before in the "
            "epoch, over the recent batches; repeat_share: over the whole epoch. The stream "
            f"jobs warn above {DUPLICATE_RATE:.0%} (dashed).",
            unit="percentunit",
            defaults=threshold_line(DUPLICATE_RATE),
        ),
        panel(
            "Checks each rank runs",
            "table",
            [checks_table()],
            ["check", "on", "state", "why", "enable"],
            description="What the producer said at init (run_meta): on, on use (once the call "
            "in needs is made) or off, with why and the one line that turns it on. Off "
            "first. Before the hot window only on (1) / off (0). " + COLD,
            w=24,
            h=10,
            hot_only=["state", "why", "enable"],
        ),
    ]
