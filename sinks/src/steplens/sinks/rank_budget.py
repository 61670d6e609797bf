"""A run's per-rank series in InfluxDB, bounded: the ranks that stand out and a first few.

Each rank of a run adds about 45 series to the hot bucket (its steps, windows, health,
allocator, comm; its node's GPUs, disks and ports on local rank 0), and the rollups roll each
one up every minute: at 1,024 ranks one minute of a run's `gpu` points took 46 s to roll up
and its `step_window` points passed InfluxDB's query memory limit (``bench/RESULTS.md``). So a
run's per-rank telemetry (``PER_RANK_KINDS``) goes to InfluxDB for rank 0 and at most
``per_run`` ranks, first come, and for up to ``standouts`` more that an alert of the run has
named since (its incident's members' ranks: a straggler, the rank that reports a GPU with
errors, a rank whose loss went non-finite; a signal names none: a run-wide spike scores on
every rank). The worker's signals of a rank and its run_meta (with its design checks) are
budgeted with its telemetry. The other ranks' records are left to S3, which keeps every
record, and counted. Run-wide records and signals, alerts and everything else are always
written.

A run's ranks are this process's memory of its last ``tracked_runs`` runs: after a restart a
run may admit ``per_run`` ranks again (first come after the restart).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from steplens.schema import Record

# per-rank series: what a rank sends every step, window or sample, the worker's signals of it
# (about 8 a rank at 1,024 ranks), and its run_meta (a point and one per design check, about
# 26 a rank: 26,624 of a 1,024-rank run's 31,682 series before it was budgeted)
PER_RANK_KINDS = frozenset(
    {"step", "step_batch", "step_window", "hw", "health", "comm", "batch", "stacks", "signal",
     "run_meta"}
)  # fmt: skip


@dataclass(frozen=True)
class RankLimits:
    per_run: int = 256  # ranks of a run whose telemetry is written, first come
    standouts: int = 64  # further ranks admitted once an alert names them
    tracked_runs: int = 4096  # runs remembered

    def __post_init__(self) -> None:
        if min(self.per_run, self.tracked_runs) < 1 or self.standouts < 0:
            raise ValueError(f"invalid rank limits {self}")


@dataclass
class _Run:
    first: set[int] = field(default_factory=set)  # ranks admitted first come
    standouts: set[int] = field(default_factory=set)  # ranks admitted once named


class RankBudget:
    def __init__(self, limits: RankLimits) -> None:
        self.limits = limits
        self._runs: OrderedDict[str, _Run] = OrderedDict()

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run()
            while len(self._runs) > self.limits.tracked_runs:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(run_id)
        return run

    def admits(self, rec: Record) -> bool:
        """Whether ``rec`` goes to InfluxDB; an alert of a rank admits the rank."""
        if rec.kind == "alert":
            run = self._run(rec.run_id)
            for rank in named_ranks(rec):
                if rank not in run.first and len(run.standouts) < self.limits.standouts:
                    run.standouts.add(rank)
            return True
        rank = rec.rank
        if rank < 0 or rec.kind not in PER_RANK_KINDS:
            return True
        run = self._run(rec.run_id)
        if rank == 0 or rank in run.first or rank in run.standouts:  # rank 0: the run's own
            return True
        if len(run.first) < self.limits.per_run:
            run.first.add(rank)
            return True
        return False


def named_ranks(rec: Record) -> list[int]:
    """The ranks an alert names: its incident's members' (a member's ``rank``, or its scope
    ``rank:N``), else its own."""
    evidence = rec.data.get("evidence") or {}
    members = evidence.get("members") if isinstance(evidence, dict) else None
    out = []
    for m in members if isinstance(members, list) else [{"rank": rec.rank, **rec.data}]:
        if not isinstance(m, dict):
            continue
        rank, scope = m.get("rank"), str(m.get("scope", ""))
        if not isinstance(rank, int) and scope.startswith("rank:") and scope[5:].isdigit():
            rank = int(scope[5:])
        if isinstance(rank, int) and rank >= 0:
            out.append(rank)
    return out
