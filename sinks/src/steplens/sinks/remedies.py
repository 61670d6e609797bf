"""Advice and the ranks' answers in words, the same in the report, MLflow and Alertmanager
(pure).

``describe`` says what a piece of advice asks (an ``advice`` record's data, a row of the
stores' ``advice`` points, or an entry of an incident's ``remedies`` evidence);
``answers_text`` what the ranks answered, grouped by outcome (``grouped``: the form the worker
keeps in the evidence), at most ``MAX_RANKS`` ranks named and ``MAX_DETAILS`` distinct details
each (the other ranks counted), so a thousand ranks answering make one line; ``traces`` where
the ranks' ``profile`` traces are (``s3://bucket/key``, or a path on the rank's host).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from steplens.schema.kinds import ADVICE_OUTCOMES

MAX_RANKS: Final = 8  # ranks named per outcome
MAX_DETAILS: Final = 2  # distinct details quoted per outcome
DETAIL_CHARS: Final = 120
MAX_TRACES: Final = 8  # traces linked per piece of advice
_TRACE = re.compile(r"^trace (\S+): \d+ steps")  # a profile's acted detail (producer)


def present(value: Any) -> Any:
    """``value``, or None for what the stores use for missing (NaN, an empty string)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return None
    return value


def _count(value: Any) -> int | None:
    """A list's length (a JSON list as text too), or None."""
    value = present(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return len(value) if isinstance(value, (list, tuple)) else None


def _num(value: Any) -> str:
    value = present(value)
    return "?" if value is None else f"{float(value):g}"


def who(rank: Any) -> str:
    rank = present(rank)
    return "every rank" if rank is None or int(rank) < 0 else f"rank {int(rank)}"


def describe(advice: Mapping[str, Any]) -> str:
    """``"rewind to ckpt-100 (step 100), skip 300 batches at step 180 (cost: 80 steps lost, 100
    batches skipped)"``; a suggestion the stream jobs held back says so and why; the action
    alone when it is none of the known ones."""
    text = _what(advice)
    at = present(advice.get("at_step"))
    if at is not None:
        text += f" at step {int(at)}"
    lost, skipped = present(advice.get("steps_lost")), present(advice.get("batches_skipped"))
    if lost or skipped:
        text += f" (cost: {int(lost or 0)} steps lost, {int(skipped or 0)} batches skipped)"
    held = present(advice.get("held"))
    if held is not None:
        text += f"; suggested, not sent ({str(held).replace('_', ' ')}): a person decides"
    return text


def _what(advice: Mapping[str, Any]) -> str:
    action = str(advice.get("action"))
    if action == "skip_samples":
        counts = (
            present(advice.get("n_sample_ids")),  # InfluxDB's points (their lists may be cut)
            _count(advice.get("sample_ids")),
            present(advice.get("n_sample_hashes")),
            _count(advice.get("sample_hashes")),
            present(advice.get("n_samples")),  # an incident's evidence
        )
        n = next((c for c in counts if c is not None), None)
        return f"skip {'?' if n is None else int(n)} samples"
    if action == "rewind":
        where = present(advice.get("checkpoint")) or "a checkpoint"
        text = f"rewind to {where} (step {_num(advice.get('checkpoint_step'))})"
        skip = present(advice.get("skip_batches"))
        return text + (f", skip {int(skip)} batches" if skip is not None else "")
    if action == "lower_lr":
        return f"lower the lr x{_num(advice.get('lr_factor'))}"
    if action == "profile":
        return f"profile {_num(advice.get('duration_s'))} s"
    return action


def grouped(answers: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Answers (``acted`` records: rank, outcome, detail) grouped by outcome, as the worker
    keeps them in an incident's evidence: ``outcome``, ``n`` ranks, ``ranks`` (the first
    ``MAX_RANKS``), ``details`` (the first ``MAX_DETAILS`` distinct)."""
    by: dict[str, dict[str, Any]] = {}
    for a in answers:
        outcome = str(a.get("outcome"))
        g = by.setdefault(outcome, {"outcome": outcome, "n": 0, "ranks": [], "details": []})
        g["n"] += 1
        rank = present(a.get("rank"))
        if rank is not None and len(g["ranks"]) < MAX_RANKS:
            g["ranks"].append(int(rank))
        detail = present(a.get("detail"))
        room = len(g["details"]) < MAX_DETAILS
        if detail is not None and room and str(detail) not in g["details"]:
            g["details"].append(str(detail))
    return list(by.values())


def answers_text(groups: Iterable[Mapping[str, Any]]) -> str:
    """``"acted: ranks 0, 1 (reloaded ckpt-100); declined: rank 2 (no checkpoint)"`` from
    ``grouped`` answers, or ``"no answer yet"``."""
    by = {str(g.get("outcome")): g for g in groups}
    if not by:
        return "no answer yet"
    order = [*ADVICE_OUTCOMES, *sorted(set(by) - set(ADVICE_OUTCOMES))]
    parts = []
    for outcome in (o for o in order if o in by):
        g = by[outcome]
        ranks = sorted(int(r) for r in g.get("ranks") or ())
        n = int(g.get("n") or len(ranks))
        named = ", ".join(str(r) for r in ranks[:MAX_RANKS])
        more = f" and {n - len(ranks[:MAX_RANKS])} more" if n > len(ranks[:MAX_RANKS]) else ""
        text = f"{outcome}: rank{'s' if n > 1 else ''} {named}{more}"
        details = [_cut(str(d)) for d in g.get("details") or ()][:MAX_DETAILS]
        if details:
            text += f" ({'; '.join(details)})"
        parts.append(text)
    return "; ".join(parts)


def trace_uri(detail: Any) -> str | None:
    """Where the trace an ``acted`` detail names is (``trace s3://b/k: 20 steps, 1.2 s``)."""
    found = _TRACE.match(str(present(detail) or ""))
    return found.group(1) if found else None


def traces(answers: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The traces the ranks took (``acted`` answers to ``profile``): ``rank``, ``uri``; at
    most ``MAX_TRACES``, by rank."""
    out = []
    for a in answers:
        uri = trace_uri(a.get("detail")) if str(a.get("outcome")) == "acted" else None
        if uri is not None:
            rank = present(a.get("rank"))
            out.append({"rank": None if rank is None else int(rank), "uri": uri})
    out.sort(key=lambda t: -1 if t["rank"] is None else t["rank"])
    return out[:MAX_TRACES]


def _cut(detail: str) -> str:
    """A detail cut to ``DETAIL_CHARS``, a trace's address kept whole."""
    uri = trace_uri(detail)
    return detail[: max(DETAIL_CHARS, len(f"trace {uri}") if uri else 0)]


def advice_line(advice: Mapping[str, Any], groups: Iterable[Mapping[str, Any]]) -> str:
    """One piece of advice and its ``grouped`` answers: ``"rewind ..., to every rank at step
    160 -> acted: ranks 0, 1"``."""
    step = present(advice.get("step"))
    at = f" at step {int(step)}" if step is not None else ""
    return f"{describe(advice)}, to {who(advice.get('rank'))}{at} -> {answers_text(groups)}"


def advice_text(evidence: Mapping[str, Any]) -> str:
    """An incident's evidence ``remedies`` (the advice given and its grouped answers), one
    ``advice_line`` each; empty without advice."""
    given = evidence.get("remedies")
    return "\n".join(
        advice_line(r, r.get("answers") or ()) for r in given or () if isinstance(r, Mapping)
    )
