"""A run's detector state as plain data (msgpack), with a format version: never pickled.

A value is ``MAGIC``, a format byte, then msgpack. Containers and the state dataclasses are
written as tagged maps (``$c`` class, ``$d`` dict, ``$s`` set, ``$q`` deque, ``$t`` tuple,
``$a`` numpy array as dtype, shape and bytes); only the classes of ``CLASSES`` (every registry
entry's state, and the rules') are built back, each from the fields it has now (a field added
by a later release takes its default; one it no longer has is dropped). A value of another
format, or none of ours (the pickles of earlier releases), is refused with a warning: that
run starts afresh and its baselines learn again.

The table holds a run as a head (the detector without its series, with the list of its ranks)
under the run id and each rank's series as a value of its own (``rank_key``): one value for a
whole run grew with its ranks past what Kafka takes in one message.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
import numpy as np

from steplens.stream_jobs.engine.calibration import CalibrationState
from steplens.stream_jobs.engine.config import DetectorConfig
from steplens.stream_jobs.engine.core import Run
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.incidents import Incident, IncidentsState, Member
from steplens.stream_jobs.engine.policy import JudgeState
from steplens.stream_jobs.engine.rules import Firing, RulesState
from steplens.stream_jobs.engine.signals.arima_fit import ArimaParams
from steplens.stream_jobs.engine.signals.registry import ENTRIES
from steplens.stream_jobs.engine.signals.sketches import Bloom, Distinct

log = logging.getLogger("steplens.stream_jobs")

MAGIC = b"SLst"
FORMAT = 1  # raise it when a change cannot be read by the rule above; keep reading the old
CLASSES: dict[str, type] = {
    c.__name__: c
    for c in (
        *(e.state for e in ENTRIES),
        ArimaParams,
        Bloom,
        Distinct,
        JudgeState,
        CalibrationState,
        RulesState,
        IncidentsState,
        Incident,
        Member,
        Firing,
        Run,
    )
}


RANK_SEP = "\x1f"  # in a rank's table key only (a run id is printable)


def rank_key(run: str, rank: int) -> str:
    """The table key of one rank's series of ``run``."""
    return f"{run}{RANK_SEP}rank:{rank}"


def _plain(x: Any) -> Any:
    if x is None or isinstance(x, (bool, int, float, str, bytes)):
        return x
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {"$d": [[_plain(k), _plain(v)] for k, v in x.items()]}
    if isinstance(x, np.ndarray):
        a = np.ascontiguousarray(x)
        return {"$a": [a.dtype.str, list(a.shape), a.tobytes()]}
    if isinstance(x, deque):
        return {"$q": [x.maxlen, [_plain(v) for v in x]]}
    if isinstance(x, (set, frozenset)):
        return {"$s": [_plain(v) for v in x]}
    if isinstance(x, tuple):
        return {"$t": [_plain(v) for v in x]}
    if isinstance(x, np.generic):
        return x.item()
    name = type(x).__name__
    if dataclasses.is_dataclass(x) and CLASSES.get(name) is type(x):
        fields = {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init}
        return {"$c": name, "f": fields}
    raise TypeError(f"not part of a detector's state: {type(x).__name__}")


def _built(x: Any) -> Any:
    if isinstance(x, list):
        return [_built(v) for v in x]
    if not isinstance(x, dict):
        return x
    if "$d" in x:
        return {_key(_built(k)): _built(v) for k, v in x["$d"]}
    if "$a" in x:
        dtype, shape, raw = x["$a"]
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
    if "$q" in x:
        maxlen, items = x["$q"]
        return deque((_built(v) for v in items), maxlen=maxlen)
    if "$s" in x:
        return {_key(_built(v)) for v in x["$s"]}
    if "$t" in x:
        return tuple(_built(v) for v in x["$t"])
    if "$c" in x:
        cls = CLASSES.get(x["$c"])
        if cls is None:
            raise ValueError(f"unknown state class {x['$c']!r}")
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        return cls(**{k: _built(v) for k, v in x["f"].items() if k in names})
    raise ValueError("unknown tag in a stored state")


def _key(k: Any) -> Any:
    return tuple(_key(v) for v in k) if isinstance(k, list) else k


def pack(value: Any) -> bytes:
    return MAGIC + bytes([FORMAT]) + msgpack.packb(_plain(value), use_bin_type=True)


def unpack(blob: bytes) -> Any:
    """The value of ``pack``; ``ValueError`` for a value of another format or none of ours."""
    if not blob.startswith(MAGIC) or len(blob) <= len(MAGIC):
        raise ValueError("not a steplens state (an older release's format?)")
    if blob[len(MAGIC)] != FORMAT:
        raise ValueError(f"state format {blob[len(MAGIC)]}, this release reads {FORMAT}")
    return _built(msgpack.unpackb(blob[len(MAGIC) + 1 :], raw=False, strict_map_key=False))


_HEAD = (
    "run_id",
    "run_states",
    "rules",
    "incidents",
    "run",
    "schedule",
    "records",
    "offsets",
    "raw_seen",
    "baseline",  # which ranks' signals still say their baselines came from history
)


def dump_state(det: RunDetector, ranks: Iterable[int]) -> tuple[bytes, dict[int, bytes]]:
    """A run's state as table values: its head, and the series of ``ranks`` (those that
    changed), each a value of its own."""
    head = {k: getattr(det, k) for k in _HEAD}
    head["ranks"] = sorted(det.series)
    parts = {r: pack(det.series[r]) for r in ranks if r in det.series}
    return pack(head), parts


def load_state(
    blob: bytes, rank_blob: Callable[[int], bytes | None], cfg: DetectorConfig | None = None
) -> RunDetector | None:
    """Rebuild a run's detector from its head and its ranks' values (``rank_blob(rank)``);
    None, with a warning, for a head this release cannot read (the run starts afresh). A rank
    whose series is missing or unreadable starts afresh."""
    try:
        head = unpack(blob)
        det = RunDetector(head["run_id"], cfg or DetectorConfig(), fit_inline=False)
        for k in _HEAD[1:]:
            if k in head:
                setattr(det, k, head[k] if k != "run_states" else {**det.run_states, **head[k]})
    except Exception as exc:
        log.warning("a stored run state cannot be restored (%s); the run starts afresh", exc)
        return None
    for rank in head.get("ranks", []):
        part = rank_blob(rank)
        try:
            det.series[rank] = unpack(part) if part else _missing()
        except Exception as exc:
            log.warning("rank %s of run %s starts afresh: %s", rank, det.run_id, exc)
            continue
        # a state that reads the lr schedule, stored before it did (format 1's training
        # state): the run's, as when the run declares one
        for states in det.series[rank].values():
            for st in states.values():
                if getattr(st, "schedule", False) is None:
                    st.schedule = det.schedule
    return det


def _missing() -> Any:
    raise ValueError("no stored series")
