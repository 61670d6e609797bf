"""The ranks of a run the stream jobs follow one by one, and what the others send at once.

A run's ranks 0 to ``FOLLOWED_RANKS - 1`` keep series of their own metrics in the stream jobs
(spikes, volatility, ARIMA models, 7-day baselines: the worker's ``--series-ranks``). Every
rank's non-finite values are reported, and its step times and data waits are judged against
the other ranks' (``ACROSS_RANKS``); a finite value of another metric of a rank past the
followed ones is judged by nothing of its own.

So a producer past the followed ranks sends a step its spike guard flags at once only for what
is judged from it (``sends_at_once``): a finite spike of another metric stays in its window's
aggregates (their min and max), as every other step of that rank does. In a run of 16,384 ranks
a run-wide loss spike is then 256 raw steps, not 16,384 (bench/RESULTS.md).
"""

from __future__ import annotations

import math

FOLLOWED_RANKS = 256
ACROSS_RANKS = frozenset({"step_time_s", "data_time_s"})  # judged against the other ranks'


def sends_at_once(followed: bool, metric: str, value: float) -> bool:
    """Whether a flagged ``value`` of ``metric`` sends its step at once from a rank that is
    ``followed`` (rank < ``FOLLOWED_RANKS``) or not."""
    return followed or metric in ACROSS_RANKS or not math.isfinite(value)
