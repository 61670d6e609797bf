"""Wire records for the worker's outputs: signals, alerts and advice (schema v1)."""

from __future__ import annotations

import os
import socket
import time

import msgspec

from steplens.schema import RUN_RANK, encode
from steplens.schema.kinds import Advice
from steplens.stream_jobs.engine.advice import Advised
from steplens.stream_jobs.engine.core import Alert, Signal

HOST = socket.gethostname()


def _optional(**kw: object) -> dict[str, object]:
    return {k: v for k, v in kw.items() if v is not None}


def _envelope(  # noqa: PLR0917
    kind: str,
    run_id: str,
    rank: int,
    step: int | None,
    data: dict[str, object],
    seq: int,
    time_ns: int = 0,
) -> bytes:
    """Encode a record the worker builds itself (not validated again: the hot path); its time
    is ``time_ns``, or now."""
    return encode(
        {
            "kind": kind,
            "run_id": run_id,
            "rank": rank,
            "local_rank": 0,
            "host": HOST,
            "pid": os.getpid(),
            "seq": seq,
            "time_ns": time_ns or time.time_ns(),
            **_optional(step=step),
            "data": data,
        }
    )


def signal_bytes(run_id: str, sig: Signal, seq: int = 0, time_ns: int = 0) -> bytes:
    """A signal at the time of the record it judged (``time_ns``; 0: now)."""
    data = {
        "name": sig.name,
        "metric": sig.metric,
        "value": float(sig.value),
        "score": min(1.0, max(0.0, float(sig.score))),
        **_optional(expected=sig.expected, lower=sig.lower, upper=sig.upper),
    }
    detail = dict(sig.detail or {})
    if sig.scope != "run":
        detail["scope"] = sig.scope
    if sig.severity:
        detail["severity"] = sig.severity
    if detail:
        data["detail"] = detail
    return _envelope("signal", run_id, sig.rank, sig.step, data, seq, time_ns)


def alert_bytes(a: Alert, seq: int = 0, run_id: str | None = None) -> bytes:
    """An alert transition at the time of the record it fired on (``a.time_ns``): scored
    again after a restart, it is the same point with the same identity (fingerprint, state,
    step), so a store keyed by them overwrites it. ``run_id``: the run it names, where that is
    not ``a.run_id`` (a shard's detector names its run)."""
    rank = a.evidence.get("rank", RUN_RANK)
    data = {
        "rule": a.rule,
        "severity": a.severity,
        "state": a.state,
        "scope": a.scope,
        "hint": a.hint,
        "summary": a.summary[:1000],
        "fingerprint": a.fingerprint,
        "evidence": a.evidence,
        **_optional(started_step=a.started_step),
    }
    run = run_id or a.run_id
    return _envelope(
        "alert", run, rank if isinstance(rank, int) else RUN_RANK, a.step, data, seq, a.time_ns
    )


def advice_bytes(run_id: str, adv: Advised, seq: int = 0) -> bytes:
    """A piece of advice at the time of the incident report it came from; checked against
    the schema first (rare, and read by training processes): ``ValueError`` when it fails."""
    try:
        msgspec.convert(adv.data, Advice)
    except msgspec.ValidationError as exc:
        raise ValueError(f"advice {adv.data.get('action')}: {exc}") from None
    return _envelope("advice", run_id, adv.rank, adv.step, adv.data, seq, adv.time_ns)
