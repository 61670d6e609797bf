"""A loss logged as the mean of its logging interval (the Hugging Face Trainer's
``logging_steps``): a corrupted batch that raises one logged mean by 25 % pages, the jitter of
the means does not."""

from __future__ import annotations

import numpy as np

from steplens.stream_jobs.engine.detector import RunDetector


def logged_losses(every: int, points: int, seed: int) -> tuple[list[int], list[float]]:
    """Means of ``every`` steps of a falling loss with batch noise (std 0.15 per step)."""
    rng = np.random.default_rng(seed)
    steps = np.arange(every * points)
    per_step = 1.5 + 2.5 * np.exp(-steps / 3000) + rng.normal(0, 0.15, len(steps))
    means = per_step.reshape(points, every).mean(axis=1)
    return [int(s) for s in steps[every - 1 :: every]], means.tolist()


def opened(steps: list[int], losses: list[float]) -> list[tuple[str, int | None]]:
    det = RunDetector("r")
    out = []
    for step, x in zip(steps, losses, strict=True):
        got = det.evaluate(det.process_columns(0, [step], [step], {"loss": [x]}), 1, [step])
        out += [(a.rule, a.started_step) for a in got if a.state == "firing"]
    return out


def test_a_corrupted_batch_in_a_mean_of_ten_steps_pages_and_the_jitter_does_not():
    for seed in range(3):
        steps, losses = logged_losses(10, 150, seed)
        assert opened(steps, losses) == []  # healthy: the means' jitter pages nothing
        losses[80] *= 1.25  # the corrupted batch's interval
        got = opened(steps, losses)
        assert [r for r, _ in got] == ["spike:loss"], got
        assert got[0][1] == steps[80]
