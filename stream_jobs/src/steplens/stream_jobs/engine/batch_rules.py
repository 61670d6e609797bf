"""The rules over a batch's signals, row after row, reading only what each row needs.

A batch's signals are a list of ``Signals``; row ``i``'s signals, in order, are each one's
signals of that row in turn (``core.row_views``). ``evaluate_batch`` gives each row the alert
transitions ``rules.evaluate`` gives it: a row with no breach while nothing fires or correlates
only moves the latest step on, and its signals are never built as rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from steplens.stream_jobs.engine import rules
from steplens.stream_jobs.engine.core import NO_STEP, Alert, Signal, Signals, last_steps
from steplens.stream_jobs.engine.rules import Amend, RulesConfig, RulesState


def judge(
    state: RulesState,
    cfg: RulesConfig,
    run_id: str,
    batch: list[Signals],
    n: int,
    *,
    amends: Sequence[Amend] = (),
) -> tuple[list[Alert], list[list[Alert]]]:
    """The rules' stage of a record: the evidence that came for alerts that fire added to them
    (``amends``; their ``firing`` transitions again), then each of the ``n`` rows' alert
    transitions."""
    amended = []
    for key, extra in amends:
        got = rules.amend(state, run_id, key, extra)
        if got is not None:  # it still fires
            amended.append(got)
    if not batch:
        return amended, [[] for _ in range(n)]
    return amended, list(evaluate_batch(state, cfg, run_id, batch, n))


def evaluate_batch(
    state: RulesState, cfg: RulesConfig, run_id: str, batch: list[Signals], n: int
) -> Iterator[list[Alert]]:
    """Yields each of the ``n`` rows' alert transitions (``state`` is the rules' state after
    that row when it is yielded)."""
    if not batch:
        yield from ([] for _ in range(n))
        return
    last = last_steps(batch, n)
    if not (state.firing or state.correlating or any(s.any_breach() for s in batch)):
        # every row is quiet: each moves the latest step on, to its last signal's step
        known = last[last != NO_STEP]
        if len(known):
            rules.quiet(state, int(known.max()))
        for _ in range(n):
            yield []
        return
    full = np.zeros(n, np.bool_)  # rows with a breach: their signals are built
    for s in batch:
        full[s.row[s.breach()]] = True
    full_rows: list[bool] = full.tolist()
    last_rows: list[int] = last.tolist()
    # each Signals' first signal of every row, and its length: row i is starts[i]:starts[i + 1]
    if n == 1:  # a record's own batch: every signal is on its one row
        starts = [[0, len(s)] for s in batch]
    else:
        starts = [np.searchsorted(s.row, np.arange(n + 1)).tolist() for s in batch]
    for i in range(n):
        row_last = None if last_rows[i] == NO_STEP else last_rows[i]
        if not (full_rows[i] or state.firing or state.correlating):
            rules.quiet(state, row_last)
            yield []
            continue
        ranges = [range(b[i], b[i + 1]) for b in starts]
        _note_rank_steps(state, batch, ranges)  # as ``rules.evaluate`` reads every signal
        if full_rows[i]:
            yield rules.evaluate(state, cfg, run_id, _acted_on(batch, ranges, state))[1]
        elif state.correlating:  # a quiet row: resolutions, then the correlations
            if not any(ranges):
                yield []  # a row without signals changes nothing
                continue
            tops = [int(s.step[r].max()) for s, r in zip(batch, ranges, strict=True) if r]
            top = max(tops)
            yield rules.quiet_while_correlating(
                state,
                cfg,
                run_id,
                _firing(batch, ranges, state),
                last=row_last,
                top=None if top == NO_STEP else top,
            )
        else:  # a quiet row only counts towards resolving what fires
            yield rules.quiet_while_firing(
                state, cfg, run_id, _firing(batch, ranges, state), row_last
            )


def _note_rank_steps(state: RulesState, batch: list[Signals], ranges: list[range]) -> None:
    """Each rank's latest step from a row's signals (``ranges``: each Signals' signals of the
    row), noted once (``rules.note_rank_steps``)."""
    latest: dict[int, int] = {}
    for s, got in zip(batch, ranges, strict=True):
        if not got:
            continue
        steps = s.step[got.start : got.stop]
        if isinstance(s.rank, np.ndarray):
            ranks = s.rank[got.start : got.stop]
            ok = (steps != NO_STEP) & (ranks >= 0)
            for rank, step in zip(ranks[ok].tolist(), steps[ok].tolist(), strict=True):
                if step > latest.get(rank, -1):
                    latest[rank] = step
        elif s.rank >= 0:
            top = int(steps.max())
            if top != NO_STEP and top > latest.get(s.rank, -1):
                latest[s.rank] = top
    rules.note_rank_steps(state, latest.items())


def _firing(batch: list[Signals], ranges: list[range], state: RulesState) -> list[Signal]:
    """A row's signals (``ranges``) of firing rules and scopes, in order: all that
    ``rules.evaluate`` reads of a row without a breach."""
    firing = state.firing
    out: list[Signal] = []
    for s, got in zip(batch, ranges, strict=True):
        if not got:
            continue
        rule = s.rule
        if isinstance(s.scope, str):
            if (rule, s.scope) in firing:
                out += s.views(got)
        else:
            out += s.views(k for k in got if (rule, s.scope[k]) in firing)
    return out


def _acted_on(batch: list[Signals], ranges: list[range], state: RulesState) -> list[Signal]:
    """A row's signals (``ranges``) that ``rules.evaluate`` acts on, in order. Of a
    ``Signals`` with many signals in the row (stragglers: every rank of every step judged), the
    breaches, the quiet signals of scopes that fire or breach in the row (a quiet one may
    resolve them), the one of the largest step (correlations are judged at it) and the row's
    last signal (its step is the row's); every signal of the others."""
    firing = state.firing
    out: list[Signal] = []
    nonempty = [k for k, got in enumerate(ranges) if got]
    for k in nonempty:
        s = batch[k]
        got = ranges[k]
        if len(got) == 1 or isinstance(s.scope, str):
            out += s.views(got)
            continue
        rule = s.rule
        ks = np.arange(got.start, got.stop)
        breach = s.severity[ks] != 0
        hot = {s.scope[j] for j in ks[breach].tolist()}
        keep = {j for j in ks.tolist() if s.scope[j] in hot or (rule, s.scope[j]) in firing}
        keep.add(int(ks[np.argmax(s.step[ks])]))
        if k == nonempty[-1]:
            keep.add(got.stop - 1)
        out += s.views(sorted(keep))
    return out
