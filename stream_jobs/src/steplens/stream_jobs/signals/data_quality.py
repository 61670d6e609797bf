"""Data quality from ``batch`` records: over-length share, label imbalance, and the duplicate
rate of sample hashes across all ranks of a run."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from steplens.producer.schema import Record
from steplens.stream_jobs.core import WARNING, Run, Signals, one, score_of

HINTS = {
    "data:over_length_share": "many samples longer than the maximum length are truncated",
    "data:label_imbalance": "labels are imbalanced worse than 1:100: check sampling and labels",
    "data:duplicate_rate": "duplicated samples across ranks: check sharding and the sampler seed",
}


@dataclass
class DataConfig:
    over_length_share: float = 0.05
    label_imbalance: float = 100.0  # most frequent / least frequent label
    label_min_total: int = 100  # labels counted before imbalance is judged
    duplicate_rate: float = 0.05
    duplicate_steps: int = 1  # a sample seen again within this many steps is a duplicate
    duplicate_window: int = 20  # batches over which the rate is measured


@dataclass
class DataState:
    labels: dict[str, int] = field(default_factory=dict)
    by_step: dict[int, set[str]] = field(default_factory=dict)  # recent steps' hashes
    recent: deque[tuple[int, int]] = field(default_factory=deque)  # (duplicates, samples)


def update(
    state: DataState, cfg: DataConfig, data: dict[str, Any], step: int | None, rank: int
) -> tuple[DataState, list[Signals]]:
    out: list[Signals] = []
    n = int(data.get("n_samples") or 0)
    over = data.get("over_length")
    if n > 0 and isinstance(over, int):
        share = over / n
        out.append(
            one(
                "data",
                "over_length_share",
                step,
                share,
                score_of(share / cfg.over_length_share),
                rank,
                severity=WARNING if share > cfg.over_length_share else None,
                expected=cfg.over_length_share,
            )
        )
    counts = data.get("label_counts")
    if counts:
        for k, v in counts.items():
            state.labels[k] = state.labels.get(k, 0) + v
        values = list(state.labels.values())
        if len(values) >= 2 and sum(values) >= cfg.label_min_total:
            low = min(values)
            ratio = max(values) / low if low > 0 else float("inf")
            out.append(
                one(
                    "data",
                    "label_imbalance",
                    step,
                    ratio,
                    score_of(ratio / cfg.label_imbalance),
                    rank,
                    severity=WARNING if ratio > cfg.label_imbalance else None,
                    expected=cfg.label_imbalance,
                )
            )
    hashes = data.get("sample_hashes")
    if hashes:
        # the same sample on two ranks in one step (or in consecutive steps) means broken
        # sharding; a sample coming back in a later epoch does not count
        now = step if step is not None else max(state.by_step, default=0)
        for old in [s for s in state.by_step if s < now - cfg.duplicate_steps]:
            del state.by_step[old]
        recent = [v for s, v in state.by_step.items() if s >= now - cfg.duplicate_steps]
        mine = state.by_step.setdefault(now, set())
        dup = 0
        for h in hashes:
            if h in mine or any(h in v for v in recent if v is not mine):
                dup += 1
        mine.update(hashes)
        state.recent.append((dup, len(hashes)))
        if len(state.recent) > cfg.duplicate_window:
            state.recent.popleft()
        d = sum(a for a, _ in state.recent)
        total = sum(b for _, b in state.recent)
        rate = d / total if total else 0.0
        out.append(
            one(
                "data",
                "duplicate_rate",
                step,
                rate,
                score_of(rate / cfg.duplicate_rate),
                rank,
                severity=WARNING if rate > cfg.duplicate_rate else None,
                expected=cfg.duplicate_rate,
            )
        )
    return state, out


def on_record(state: DataState, cfg: DataConfig, rec: Record, run: Run) -> list[Signals]:
    return update(state, cfg, rec.data, rec.step, rec.rank)[1]
