"""What a breach's evidence names besides its own numbers: the batch behind a spike, the layers
that moved, a stuck rank's stacks (the registry's ``Evidence`` entries, each a rank's memory of
recent inputs).

A breach is named as it is judged: its signal's detail gains the entry's key (so the alert
and the incident carry it). An input that comes after the alert fired (a batch record sent
after its step, stacks sent after the hang was confirmed) is added to the firing alert's
evidence (``amend``) and its incident reports it again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from steplens.schema import Record
from steplens.stream_jobs.engine import rules
from steplens.stream_jobs.engine.core import Alert, Signals
from steplens.stream_jobs.engine.signals.registry import EVIDENCE, Evidence

if TYPE_CHECKING:
    from steplens.stream_jobs.engine.detector import RunDetector

KINDS = frozenset(k for e in EVIDENCE for k in e.kinds)
FIELDS = tuple(sorted({f for e in EVIDENCE for f in e.fields}))
NAMES = frozenset(r.split(":", 1)[0] for e in EVIDENCE for r in e.rules)
RULES = frozenset(r for e in EVIDENCE for r in e.rules)

Inputs = list[tuple[int, int, dict[str, Any]]]  # (row, step, the entry) with evidence fields


def _state(det: RunDetector, rank: int, e: Evidence, make: bool) -> Any:
    s = det.series.get(rank)
    if s is None:
        if not make:
            return None
        s = det.series[rank] = {}
    states = s.get("evidence")
    if states is None:
        if not make:
            return None
        states = s["evidence"] = {}
    st = states.get(e.key)
    if st is None and make:
        st = states[e.key] = e.state()
    return st


def keep_record(det: RunDetector, rec: Record) -> list[Alert]:
    """Keep a record of an evidence kind; the firing alerts of its rank it completes, amended
    (rule-level transitions, for the incidents)."""
    out: list[Alert] = []
    for e in EVIDENCE:
        if rec.kind not in e.kinds:
            continue
        cfg = getattr(det.cfg, e.key)
        st = _state(det, rec.rank, e, True)
        e.keep(st, cfg, rec.step, rec.data)
        det.touched.add(rec.rank)
        for key, cur in list(det.rules.firing.items()):
            ev = cur.evidence
            if key[0] not in e.rules or e.key in ev or ev.get("rank") != rec.rank:
                continue
            got = e.names(st, cfg, key[0], cur.started_step, ev)
            if got:
                amended = amend(det.rules, det.run_id, key, got)
                if amended is not None:
                    out.append(amended)
    return out


def amend(
    state: rules.RulesState, run_id: str, key: tuple[str, str], extra: dict[str, Any]
) -> Alert | None:
    """Evidence that came after the alert of ``key`` fired: added to it; its ``firing``
    transition again, with the evidence now known, for its incident to report (None: it no
    longer fires)."""
    cur = state.firing.get(key)
    if cur is None:
        return None
    cur.evidence.update(extra)
    rule, scope = key
    return Alert(
        rule,
        cur.severity,
        "firing",
        scope,
        rules.hint_for(rule),
        rules.fingerprint(run_id, rule, scope),
        run_id,
        cur.last_step,
        cur.started_step,
        f"{rule}: evidence added ({', '.join(extra)})",
        dict(cur.evidence),
    )


def entry_inputs(entries: list[dict[str, Any]]) -> Inputs | None:
    """The step entries that carry evidence fields (None: none, the common case)."""
    a, b = FIELDS
    got = [(i, e) for i, e in enumerate(entries) if a in e or b in e]
    return [(i, e["step"], e) for i, e in got] if got else None


def annotate(det: RunDetector, batch: list[Signals], rank: int, inputs: Inputs | None) -> None:
    """Keep the step entries' evidence fields (``inputs``, of ``rank``) and name, in row order,
    what each breach of the batch's signals of an evidence rule calls for."""
    todo = list(_breaches(batch))
    if not todo and not inputs:
        return
    todo.sort(key=lambda t: t[0])
    pending = inputs or []
    i = 0
    for row, sigs, k in todo:
        while i < len(pending) and pending[i][0] <= row:
            _keep_fields(det, rank, pending[i][1], pending[i][2])
            i += 1
        _name(det, sigs, k)
    for _, step, data in pending[i:]:
        _keep_fields(det, rank, step, data)


def _breaches(batch: list[Signals]) -> Iterator[tuple[int, Signals, int]]:
    for s in batch:
        if s.name in NAMES and s.rule in RULES and s.severity.any():
            for k in np.flatnonzero(s.severity).tolist():
                yield int(s.row[k]), s, k


def _keep_fields(det: RunDetector, rank: int, step: int, data: dict[str, Any]) -> None:
    for e in EVIDENCE:
        if e.fields and any(f in data for f in e.fields):
            e.keep(_state(det, rank, e, True), getattr(det.cfg, e.key), step, data)
            det.touched.add(rank)


def _name(det: RunDetector, sigs: Signals, k: int) -> None:
    """Signal ``k``'s detail gains what the evidence entries of its rule name."""
    rule, rank = sigs.rule, sigs.rank_at(k)
    detail = (sigs.detail[k] if sigs.detail is not None else None) or {}
    added: dict[str, Any] = {}
    for e in EVIDENCE:
        if rule not in e.rules:
            continue
        st = _state(det, rank, e, False)
        if st is not None:
            got = e.names(st, getattr(det.cfg, e.key), rule, sigs.step_at(k), detail)
            if got:
                added.update(got)
    if added:
        if sigs.detail is None:
            sigs.detail = [None] * len(sigs)
        sigs.detail[k] = {**detail, **added}
