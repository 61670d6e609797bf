"""The ARIMA fits of a run's series (rank -> detector -> metric -> state): the inputs of those
asked for (``pending``, for the worker's process pool), their results applied (``apply``), and
what a restored run asks for again (``resume``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from steplens.stream_jobs.engine.signals import arima

FitKey = tuple[int, str]  # (rank, metric)
Series = dict[int, dict[str, dict[str, Any]]]  # rank -> detector -> metric -> state


def states(series: Series) -> Iterator[tuple[FitKey, arima.ArimaState]]:
    for rank, s in series.items():
        for metric, st in s.get("arima", {}).items():
            yield (rank, metric), st


def pending(
    series: Series, wanted: set[FitKey], cfg: arima.ArimaConfig
) -> list[tuple[FitKey, Any]]:
    """The inputs of the ``wanted`` fits (then none is wanted)."""
    out = [(key, arima.fit_input(series[key[0]]["arima"][key[1]], cfg)) for key in wanted]
    wanted.clear()
    return out


def apply(
    series: Series, key: FitKey, params: arima.ArimaParams | None, cfg: arima.ArimaConfig
) -> bool:
    """Apply a fit's result to its series, if the run still has it."""
    st = series.get(key[0], {}).get("arima", {}).get(key[1])
    if st is None:
        return False
    arima.apply_fit(st, cfg, params)
    return True


def resume(series: Series, cfg: arima.ArimaConfig) -> None:
    """After a restore: fits in flight died with the old worker; a series that has the history
    for a first fit but no model asks for one at its next value (a warm start)."""
    for _, st in states(series):
        st.wants_fit = False
        if st.params is None and len(st.history) >= cfg.first_fit:
            st.next_fit = st.seen
