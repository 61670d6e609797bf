"""A rank whose steps go back: its training job restarted from a checkpoint.

A job that crashed at step 5,000 and resumed from its checkpoint of step 4,000 sends step
4,000 again, with the loss it had then: higher than at 5,000, which a detector that goes on
would call a spike. The rank restarts instead (``restart``): its baselines become what they
were at the step it resumes at, re-seeded from its stored history up to that step (the worker
reads it, ``history``), or, without one, start afresh (their first values learn and none is
scored, so the jump back to the earlier level never alerts; a real regression after it does,
once the baselines know the new values, and at once past the cold anchors). What the
abandoned steps left behind goes with them.

A step goes back when a record's step (a window's last) is below the last step its rank has
seen; then the rank resumes at the record's first step (a window's first). A restart that
resumes within the window it crashed in is not seen in windowed mode; there the window's mean
is its only trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from steplens.schema import RUN_RANK, Record

if TYPE_CHECKING:
    from steplens.stream_jobs.engine.core import Signals
    from steplens.stream_jobs.engine.detector import RunDetector

Series = dict[str, dict[str, Any]]  # one rank's states: detector -> metric -> state


def resume_step(det: RunDetector, rec: Record, after: int | None = None) -> int | None:
    """The step ``rec``'s rank resumes at when its steps go back below the last step the rank
    has seen (or ``after``, one of its steps not yet scored); None otherwise, and for records
    without steps."""
    kind, data = rec.kind, rec.data
    if kind == "step":
        step = first = rec.step
    elif kind == "step_batch":
        entries = data["records"]
        step = first = entries[0].get("step") if entries else None
    elif kind == "step_window":
        step, first = data.get("step_last", rec.step), data.get("step_first")
    else:
        return None
    if not isinstance(step, int) or rec.rank == RUN_RANK:
        return None
    last = det.ranks.last_step.get(rec.rank)
    if after is not None and (last is None or after > last):
        last = after
    if last is None or step >= last:
        return None
    return first if isinstance(first, int) and first < step else step


def restart(det: RunDetector, rank: int, step: int, series: Series | None = None) -> None:
    """``rank`` resumes at ``step``: its baselines become ``series`` (re-seeded from its
    history up to that step), else start afresh. Dropped with the abandoned steps: straggler
    judgements pending from ``step`` on, the peaks remembered for its next window, the fits
    it asked for, where its baselines came from."""
    state = det.ranks
    state.last_step[rank] = step - 1  # its next steps are progress again
    for at in [at for at in state.pending if at >= step]:
        got = state.pending[at]
        got.pop(rank, None)
        if not got:
            del state.pending[at]
    det.raw_seen.pop(rank, None)
    det.fits_wanted = {k for k in det.fits_wanted if k[0] != rank}
    det.baseline.pop(rank, None)
    if series is None:
        det.series.pop(rank, None)
    else:
        det.series[rank] = series
    det.touched.add(rank)


def check(
    det: RunDetector, rank: int, steps: Sequence[int | None], firsts: Sequence[int] | None
) -> None:
    """Rows of ``rank`` about to be scored: when their steps go back, the rank restarts
    afresh at the first (the worker, which has the stores, re-seeds it before this)."""
    first = steps[0] if steps else None
    if first is None or rank == RUN_RANK:
        return
    last = det.ranks.last_step.get(rank)
    if last is not None and first < last:
        restart(det, rank, int(first if firsts is None else firsts[0]))


def mark(det: RunDetector, rank: int, batch: list[Signals], n: int) -> None:
    """``batch``, the signals of ``n`` rows of ``rank``, say where its baselines came from
    while ``det.baseline`` has it (rank -> [detail, values left]: set by a warm start)."""
    got = det.baseline.get(rank) if det.baseline else None
    if got is None:
        return
    detail = got[0]
    for sigs in batch:
        d = sigs.detail  # one dict shared: the outputs copy it
        if d is None:
            sigs.detail = [detail] * len(sigs)
        else:
            sigs.detail = [detail if x is None else {**x, **detail} for x in d]
    got[1] -= n
    if got[1] <= 0:
        del det.baseline[rank]
