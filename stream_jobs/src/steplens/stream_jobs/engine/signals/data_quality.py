"""Data quality from ``batch`` records: over-length share, label balance, the supervised share
of language-model batches, and duplicated samples (by their content hashes), all ranks of a
run together.

Duplicates come in two kinds with different causes:

* ``duplicate_rate``: the same sample on two ranks (or twice in one batch) in the same step,
  over the last ``duplicate_window`` batch records: a sharding bug (every rank reads the same
  shard, a sampler without the rank's seed). A step's hashes are kept for the last
  ``step_keep`` steps (ranks send a step's batches at slightly different times), at most
  ``max_step_keys`` of them: past that, a fixed share of the hash space is kept (the same
  samples on every rank, so a duplicate is kept or dropped with its first sighting);
* ``repeat_rate`` and ``repeat_share``: samples seen before in the same epoch, over the last
  ``duplicate_window`` batch records (a Bloom filter of the recent samples) and over the whole
  epoch (a HyperLogLog distinct count: 1 - distinct / seen): a corpus with duplicates, or a
  loader that repeats itself. A new epoch, which the record says (``epoch``), starts both
  afresh; a record of an earlier epoch (a rank still finishing it) is not counted. Without an
  epoch a repeat may be a new epoch: the rates are reported, never warned about.

Labels are judged for balance only on class labels (``label_counts``); a language-model batch
reports its share of supervised tokens (``supervised_share``), a signal without a verdict.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steplens.schema import Record
from steplens.stream_jobs.engine.core import WARNING, Run, Signals, one, score_of
from steplens.stream_jobs.engine.signals.sketches import Bloom, Distinct, keys


@dataclass
class DataConfig:
    over_length_share: float = 0.05
    label_imbalance: float = 100.0  # most frequent / least frequent label
    label_min_total: int = 100  # labels counted before imbalance is judged
    max_labels: int = 1024  # class labels followed (bounded); others are counted, not judged
    duplicate_rate: float = 0.05  # cross-rank duplicates and repeats: above this warns
    duplicate_window: int = 20  # batch records over which the rates are measured
    step_keep: int = 4  # steps whose hashes are kept (ranks a few steps apart)
    max_step_keys: int = 4096  # hashes kept per step
    repeat_min_samples: int = 1000  # samples of the epoch before its share is judged


@dataclass
class DataState:
    labels: dict[str, int] = field(default_factory=dict)
    labels_dropped: int = 0  # counts of labels past ``max_labels``
    # step -> its kept hash keys (sorted); the keys kept have their top ``keep_shift`` bits 0
    # (format 1 kept sets of hashes as ``by_step``: dropped on restore, the next steps refill)
    step_keys: dict[int, np.ndarray] = field(default_factory=dict)
    keep_shift: int = 0
    recent: deque[tuple[int, int]] = field(default_factory=deque)  # (duplicates, samples)
    epoch: int | None = None
    bloom: Bloom = field(default_factory=Bloom)
    distinct: Distinct = field(default_factory=Distinct)
    seen: int = 0  # samples counted in the epoch
    repeats: deque[tuple[int, int]] = field(default_factory=deque)  # (repeats, samples)


def _rate(  # noqa: PLR0917
    metric: str,
    value: float,
    limit: float,
    step: int | None,
    rank: int,
    judged: bool,
    detail: dict[str, Any] | None = None,
) -> Signals:
    return one(
        "data",
        metric,
        step,
        value,
        score_of(value / limit) if judged else 0.0,
        rank=rank,
        severity=WARNING if judged and value > limit else None,
        expected=limit,
        detail=detail,
    )


def update(
    state: DataState, cfg: DataConfig, data: dict[str, Any], step: int | None, rank: int
) -> tuple[DataState, list[Signals]]:
    out: list[Signals] = []
    n = int(data.get("n_samples") or 0)
    over = data.get("over_length")
    if n > 0 and isinstance(over, int):
        share = over / n
        out.append(_rate("over_length_share", share, cfg.over_length_share, step, rank, True))
    lm = data.get("supervised_share")
    if isinstance(lm, (int, float)):
        out.append(one("data", "supervised_share", step, float(lm), 0.0, rank=rank))
    elif data.get("label_counts"):
        out += _labels(state, cfg, data["label_counts"], step, rank)
    hashes = data.get("sample_hashes")
    if hashes:
        ks = keys(hashes)
        uniq = np.unique(ks)
        sampled, in_step = _same_step(state, cfg, uniq, len(ks) - len(uniq), step, rank, out)
        _repeats(state, cfg, uniq, len(ks), sampled, in_step, data.get("epoch"), step, rank, out)
    return state, out


def _labels(
    state: DataState, cfg: DataConfig, counts: dict[str, int], step: int | None, rank: int
) -> list[Signals]:
    labels = state.labels
    for k, v in counts.items():
        if k in labels or len(labels) < cfg.max_labels:
            labels[k] = labels.get(k, 0) + v
        else:
            state.labels_dropped += v
    values = list(labels.values())
    if len(values) < 2 or sum(values) < cfg.label_min_total:
        return []
    low = min(values)
    ratio = max(values) / low if low > 0 else float("inf")
    return [_rate("label_imbalance", ratio, cfg.label_imbalance, step, rank, True)]


def _same_step(  # noqa: PLR0917
    state: DataState,
    cfg: DataConfig,
    uniq: np.ndarray,
    twice: int,
    step: int | None,
    rank: int,
    out: list[Signals],
) -> tuple[np.ndarray, np.ndarray]:
    """Samples of this batch already in its step (another rank's, or ``twice`` in it): the
    ``duplicate_rate`` signal; returns which of the batch's distinct keys were checked (all,
    unless the step's keys are sampled) and which of those were in the step."""
    step_keys = state.step_keys
    now = step if step is not None else max(step_keys, default=0)
    for old in [s for s in step_keys if s <= now - cfg.step_keep]:
        del step_keys[old]
    sampled = np.ones(len(uniq), np.bool_)
    if state.keep_shift:
        sampled = (uniq >> np.uint64(64 - state.keep_shift)) == 0
    kept = uniq[sampled]
    mine = step_keys.get(now, np.empty(0, np.uint64))  # sorted and distinct, as ``kept``
    in_step = np.isin(kept, mine, assume_unique=True)
    kept = np.union1d(mine, kept)
    while len(kept) > cfg.max_step_keys and state.keep_shift < 63:  # half the key space
        state.keep_shift += 1
        top = np.uint64(64 - state.keep_shift)
        kept = kept[(kept >> top) == 0]
        for s, v in step_keys.items():
            step_keys[s] = v[(v >> top) == 0]
    step_keys[now] = kept
    checked = int(sampled.sum())  # all of them unless the step's keys are sampled
    twice = twice * checked // max(len(uniq), 1)  # as many of those as were checked
    rate = _window_rate(state.recent, twice + int(in_step.sum()), checked + twice, cfg)
    out.append(_rate("duplicate_rate", rate, cfg.duplicate_rate, step, rank, True))
    return sampled, in_step


def _window_rate(window: deque[tuple[int, int]], hits: int, n: int, cfg: DataConfig) -> float:
    """``hits`` of ``n`` appended to the last ``duplicate_window`` batches: their hit rate."""
    window.append((hits, n))
    if len(window) > cfg.duplicate_window:
        window.popleft()
    total = sum(b for _, b in window)
    return sum(a for a, _ in window) / total if total else 0.0


def _repeats(  # noqa: PLR0917
    state: DataState,
    cfg: DataConfig,
    uniq: np.ndarray,
    n: int,
    sampled: np.ndarray,
    in_step: np.ndarray,
    epoch: Any,
    step: int | None,
    rank: int,
    out: list[Signals],
) -> None:
    """Samples seen before in this epoch at an earlier step (a duplicate within the step is
    the sharding's, not a repeat): over the last batch records, and over the epoch. Of the
    ``n`` samples, ``uniq`` are distinct; ``in_step``: which of the ``sampled`` ones were in
    the step already (when the step's keys are sampled, their share stands for all). The
    epoch's share counts each distinct sample once per step."""
    known = isinstance(epoch, int) and not isinstance(epoch, bool)
    if known:
        if state.epoch is not None and epoch < state.epoch:
            return  # a rank still in the last epoch
        if epoch != state.epoch:
            state.epoch, state.seen = epoch, 0
            state.bloom, state.distinct, state.repeats = Bloom(), Distinct(), deque()
    seen = state.bloom.seen_then_add(uniq)
    same, dups = int((seen[sampled] & in_step).sum()), int(in_step.sum())
    if len(in_step) < len(uniq):  # sampled: the checked share stands for all
        same = round(same * len(uniq) / max(len(in_step), 1))
        dups = round(dups * len(uniq) / max(len(in_step), 1))
    again = max(int(seen.sum()) - same, 0)
    state.distinct.add(uniq)
    state.seen += max(len(uniq) - dups, 0)  # what the distinct count counts, less the step's
    rate = _window_rate(state.repeats, again, n, cfg)
    distinct = min(state.distinct.count(), float(state.seen))
    share = 1.0 - distinct / state.seen if state.seen else 0.0
    detail = {"epoch": state.epoch if known else None, "samples": state.seen}
    limit = cfg.duplicate_rate
    out.append(_rate("repeat_rate", rate, limit, step, rank, known, detail))
    judged = known and state.seen >= cfg.repeat_min_samples
    more = {**detail, "distinct": round(distinct)}
    out.append(_rate("repeat_share", share, limit, step, rank, judged, more))


def on_record(state: DataState, cfg: DataConfig, rec: Record, run: Run) -> list[Signals]:
    return update(state, cfg, rec.data, rec.step, rec.rank)[1]
