"""The training board: loss, lr, throughput, gradients, step time, evaluation, signals."""

from __future__ import annotations

from typing import Any

from .flux import Read, latest, per_interval
from .layout import board, panel

RANK = ("rank",)


def step(*fields: str) -> Read:
    return Read("step", fields, keep=RANK)


def training() -> dict[str, Any]:
    loss_window = 'r.metric == "loss"'
    panels = [
        panel(
            "Loss per rank (max per interval: spikes stay visible)",
            "timeseries",
            [per_interval(step("loss"), "max")],
            ["loss"],
        ),
        panel("Learning rate", "timeseries", [per_interval(step("lr"), "last")], ["lr"]),
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
            "Evaluation",
            "timeseries",
            [
                per_interval(
                    Read("eval", ("loss", "perplexity", "accuracy"), keep=("split",)), "last"
                )
            ],
            ["loss", "perplexity", "accuracy"],
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
    ]
    return board("steplens-training", "steplens: training", panels)
