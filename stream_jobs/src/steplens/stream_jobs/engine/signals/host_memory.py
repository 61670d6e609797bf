"""A rank's process memory judged against its host, from the ``health`` record every rank
sends (``rss_bytes``, and its host's available and total memory at the same moment).

``memory:rss_growth``: the process's resident memory drifting toward what the host can still
give it (its resident memory plus the host's available memory, less the share the host keeps
free, ``floor_pct``), judged as a GPU allocator's mark is (``memory_trend``): a leak of host
memory in the training process (batches or tensors kept across steps, a cache or a list that
keeps growing) is seen while there is time to act. A healthy process's flat memory is quiet;
other processes on the host only move the limit."""

from __future__ import annotations

from dataclasses import dataclass, field

from steplens.schema import Record
from steplens.stream_jobs.engine.core import Run, SignalRows, Signals, finite
from steplens.stream_jobs.engine.signals.headroom import HeadroomConfig
from steplens.stream_jobs.engine.signals.memory_trend import growth
from steplens.stream_jobs.engine.state import Samples


@dataclass
class HostMemoryConfig:
    keep_every_s: float = 5.0  # the producer reads its health every 5 s at its defaults
    # the resident memory's drift toward the limit: 120 kept samples (an hour of a steady
    # process's, sent every 30 s; 10 minutes of a growing one's, every 5 s), a verdict after
    # 12, a warning when the limit is 30 minutes away, judged every 10 s at most
    trend: HeadroomConfig = field(
        default_factory=lambda: HeadroomConfig(min_samples=12, judge_every_s=10.0)
    )
    eta_critical_s: float = 300.0  # the time left that is critical
    busy_s: float = 120.0  # the run steps: a step record this recent
    floor_pct: float = 5.0  # of the host's memory, kept free (``host_mem_available_pct``)
    max_ranks: int = 16384  # ranks followed per run (bounded under abuse); the rest counted


@dataclass
class HostMemoryState:
    # rank -> kept samples [time s, resident bytes, limit bytes, run's last step]
    marks: dict[int, Samples] = field(default_factory=dict)
    overflow: int = 0  # samples of ranks past ``max_ranks``


def on_record(
    state: HostMemoryState, cfg: HostMemoryConfig, rec: Record, run: Run
) -> list[Signals]:
    """A ``health`` record: its rank's resident memory against its host's."""
    d = rec.data
    rss, avail, total = d.get("rss_bytes"), d.get("mem_available_bytes"), d.get("mem_total_bytes")
    if not (finite(rss) and finite(avail) and finite(total)) or total <= 0:
        return []
    marks = state.marks.get(rec.rank)
    if marks is None:
        if len(state.marks) >= cfg.max_ranks:
            state.overflow += 1
            return []
        marks = state.marks[rec.rank] = Samples(maxlen=cfg.trend.window)
    limit = float(rss + avail) - total * cfg.floor_pct / 100.0
    busy = bool(run.last_step_ns) and rec.time_ns - run.last_step_ns < cfg.busy_s * 1e9
    scope = f"rank:{rec.rank}"
    t_s = rec.time_ns / 1e9
    out = SignalRows()
    growth(
        out,
        marks,
        cfg,
        "rss_growth",
        scope,
        t_s,
        float(rss),
        limit,
        busy,
        run.last_step,
        rec.step,
        rec.rank,
    )
    return out.signals()
