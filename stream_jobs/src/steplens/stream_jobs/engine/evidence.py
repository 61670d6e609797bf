"""The evidence a breach names: each rank's memory of recent inputs (the batch behind a spike,
the layers that moved, a stuck rank's stacks), kept as they come and read when a breach of one
of their rules is judged.

The entries (``EVIDENCE``): ``keep(state, cfg, step, data)`` keeps a record kind's data or
step fields, and ``names(state, cfg, rule, step, detail) -> {key: ...} | None`` names what a
breach of ``rule`` at ``step`` on that rank calls for (``detail``: the signal's, or the firing
alert's evidence); one state per rank, in its series under ``"evidence"``.

A breach is named as it is judged (``annotate``): its signal's detail gains the entry's key,
so the alert and the incident carry it. An input that comes after (a batch record sent after
its step, stacks sent after the hang was confirmed) is kept by ``keep_record``, which says what
it adds to the alerts that fire (for the rules to amend) and names the notes still waiting
for it.

``series`` below is a run's series (rank -> detector -> ...), ``unnamed`` each rank's last
notes waiting for their evidence, ``cfg`` the run's ``DetectorConfig`` (each entry's
settings under its key).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from steplens.schema import Record
from steplens.stream_jobs.engine.core import INFO_SEV, Signals
from steplens.stream_jobs.engine.rules import Amend, Firing
from steplens.stream_jobs.engine.signals import layers, samples, stacks


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

NOTES_UNNAMED = 8  # notes per rank kept waiting for their evidence

# what the entries keep and name
KINDS = frozenset(k for e in EVIDENCE for k in e.kinds)
FIELDS = tuple(sorted({f for e in EVIDENCE for f in e.fields}))
NAMES = frozenset(r.split(":", 1)[0] for e in EVIDENCE for r in e.rules)
RULES = frozenset(r for e in EVIDENCE for r in e.rules)
Inputs = list[tuple[int, int, dict[str, Any]]]  # (row, step, the entry) with evidence fields
Series = dict[int, dict[str, dict[str, Any]]]  # rank -> detector -> metric (or entry) -> state


def _inputs(entries: list[dict[str, Any]]) -> Inputs | None:
    """The step entries that carry evidence fields (None: none, the common case)."""
    a, b = FIELDS
    got = [(i, e) for i, e in enumerate(entries) if a in e or b in e]
    return [(i, e["step"], e) for i, e in got] if got else None


def keep_record(
    series: Series,
    unnamed: dict[int, list[Signals]],
    firing: dict[tuple[str, str], Firing],
    cfg: Any,
    rec: Record,
) -> tuple[list[Amend], list[Signals]]:
    """Keep a record of an evidence kind (``KINDS``); what it adds to the alerts of its rank
    that fire (``firing``, the rules'), and the notes of its rank and step it names, again
    with their evidence (signals, published as they are: never judged again)."""
    out: list[Amend] = []
    named: list[Signals] = []
    for e in EVIDENCE:
        if rec.kind not in e.kinds:
            continue
        ecfg = getattr(cfg, e.key)
        st = _state(series, rec.rank, e, True)
        e.keep(st, ecfg, rec.step, rec.data)
        waiting = unnamed.get(rec.rank, [])
        for note in [n for n in waiting if n.step_at(0) == rec.step and n.rule in e.rules]:
            detail = (note.detail[0] if note.detail else None) or {}
            got = e.names(st, ecfg, note.rule, rec.step, detail)
            if got:
                waiting.remove(note)
                note.detail = [{**detail, **got}]
                named.append(note)
        for key, cur in firing.items():
            ev = cur.evidence
            if key[0] not in e.rules or e.key in ev or ev.get("rank") != rec.rank:
                continue
            got = e.names(st, ecfg, key[0], cur.started_step, ev)
            if got:
                out.append((key, got))
    return out, named


def annotate(
    series: Series,
    unnamed: dict[int, list[Signals]],
    cfg: Any,
    batch: list[Signals],
    *,
    rank: int,
    entries: list[dict[str, Any]] | None,
) -> bool:
    """Keep the evidence fields of the step ``entries`` of ``rank`` (row ``i`` is entry
    ``i``) and name, in row order, what each breach of the batch's signals of an evidence rule
    calls for; whether an input was kept (the rank's series changed)."""
    inputs = _inputs(entries) if entries else None
    todo = list(_breaches(batch))
    if not todo and not inputs:
        return False
    todo.sort(key=lambda t: t[0])
    pending = inputs or []
    kept = False
    i = 0
    for row, sigs, k in todo:
        while i < len(pending) and pending[i][0] <= row:
            kept |= _keep_fields(series, cfg, rank, pending[i][1], pending[i][2])
            i += 1
        _name(series, unnamed, cfg, sigs, k)
    for _, step, data in pending[i:]:
        kept |= _keep_fields(series, cfg, rank, step, data)
    return kept


def _state(series: Series, rank: int, e: Evidence, make: bool) -> Any:
    s = series.get(rank)
    if s is None:
        if not make:
            return None
        s = series[rank] = {}
    states = s.get("evidence")
    if states is None:
        if not make:
            return None
        states = s["evidence"] = {}
    st = states.get(e.key)
    if st is None and make:
        st = states[e.key] = e.state()
    return st


def _keep_fields(series: Series, cfg: Any, rank: int, step: int, data: dict[str, Any]) -> bool:
    kept = False
    for e in EVIDENCE:
        if e.fields and any(f in data for f in e.fields):
            e.keep(_state(series, rank, e, True), getattr(cfg, e.key), step, data)
            kept = True
    return kept


def _name(
    series: Series, unnamed: dict[int, list[Signals]], cfg: Any, sigs: Signals, k: int
) -> None:
    """Signal ``k``'s detail gains what the evidence entries of its rule name."""
    rule, rank = sigs.rule, sigs.rank_at(k)
    detail = (sigs.detail[k] if sigs.detail is not None else None) or {}
    added: dict[str, Any] = {}
    for e in EVIDENCE:
        if rule not in e.rules:
            continue
        st = _state(series, rank, e, False)
        if st is not None:
            got = e.names(st, getattr(cfg, e.key), rule, sigs.step_at(k), detail)
            if got:
                added.update(got)
    if added:
        if sigs.detail is None:
            sigs.detail = [None] * len(sigs)
        sigs.detail[k] = {**detail, **added}
    late = [e for e in EVIDENCE if e.kinds and rule in e.rules and e.key not in added]
    if late and int(sigs.severity[k]) == INFO_SEV:  # a note: named when its record comes
        waiting = unnamed.setdefault(rank, [])
        waiting.append(_row(sigs, k))
        del waiting[:-NOTES_UNNAMED]


def _row(sigs: Signals, k: int) -> Signals:
    """Signal ``k`` of ``sigs`` as signals of one row (row 0)."""
    return Signals.of(
        sigs.name,
        sigs.metric,
        [0],
        [sigs.step_at(k)],
        [float(sigs.value[k])],
        [float(sigs.score[k])],
        sigs.severity[k : k + 1],
        [float(sigs.expected[k])],
        [float(sigs.lower[k])],
        [float(sigs.upper[k])],
        sigs.rank_at(k),
        sigs.scope_at(k),
        [sigs.detail[k] if sigs.detail is not None else None],
    )


def _breaches(batch: list[Signals]) -> Iterator[tuple[int, Signals, int]]:
    for s in batch:
        if s.name in NAMES and s.rule in RULES and s.severity.any():
            for k in np.flatnonzero(s.severity).tolist():
                yield int(s.row[k]), s, k
