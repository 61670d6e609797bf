"""A wide run's ranks split into shards, each scored as a run of its own, so that one run's
detectors can spread over several workers.

Shard 0 holds the run's followed ranks (``first_ranks``: the ranks that keep series of their
own metrics, in whole nodes) and the run's own records: it makes the run-wide checks (a loss
spike on every rank, a hang of every rank), and kept this small its queue stays short however
wide the run is. The ranks after it go in shards of ``shard_ranks``.

The route stage gives a record of rank ``r`` the by-run key of its shard (``run_keys``): the
run id itself for shard 0 (a run no wider than that is keyed as it always was), else the run
id, ``SEP`` and the shard's number. Every part of the worker keys its state by that key (the
table, the checkpoints, the history loads, the incidents' ids); the outputs (signals, alerts,
advice, dead letters) name the run itself (``run_of``). Shard 0 stays on the run's own by-run
partition (its key's murmur2 partition, as Faust's and librdkafka's producers give it) and
shares it with no other shard of its run; the others are placed by ``placement`` so that the
group's workers share them whichever way Faust deals the partitions out. Measured: two workers
that joined one after the other got blocks (0-3 and 4-7), two that joined together got every
other partition (so shards on partitions 1 and 5 both went to one worker); each next shard
takes the partition that keeps the run's shards apart under both deals for 2, 4, 8, ...
workers as far as it can.
"""

from __future__ import annotations

import functools

from aiokafka.partitioner import DefaultPartitioner

from steplens.schema import RUN_RANK
from steplens.stream_jobs.engine import run_keys

_PARTITIONER = DefaultPartitioner()


NODE_RANKS = 8  # shard 0 ends on a whole node of this many ranks


def first_ranks(followed: int, shard_ranks: int) -> int:
    """The ranks in a run's shard 0: its ``followed`` ranks (the detectors' resolved
    ``series_ranks``) rounded up to whole nodes, at most ``shard_ranks`` (all of them when no
    rank is followed)."""
    if followed <= 0:
        return shard_ranks
    return min(shard_ranks, -(-followed // NODE_RANKS) * NODE_RANKS)


def shard_of_rank(rank: int, shard_ranks: int, max_ranks: int, first: int) -> int:
    """The shard of ``rank`` (0 when runs are not split, and for the run's own records):
    shard 0 holds the ranks below ``first`` (``first_ranks``), each later one
    ``shard_ranks``. A rank past ``max_ranks`` goes to the run's last shard, whose own
    ``max_ranks`` bound it: a producer naming ranks at random makes no more shards than a run
    of ``max_ranks`` has."""
    if shard_ranks <= 0 or rank < first:
        return 0
    last = 1 + max(0, (max_ranks - first - 1) // shard_ranks)
    return min(1 + (rank - first) // shard_ranks, last)


def shard_ranks_of(key: str, shard_ranks: int, first: int) -> range | None:
    """The ranks a by-run key's shard holds; None: every rank (runs are not split)."""
    if shard_ranks <= 0:
        return None
    shard = run_keys.shard(key)
    if shard == 0:
        return range(RUN_RANK, first)  # with the run's own records
    start = first + (shard - 1) * shard_ranks
    return range(start, start + shard_ranks)


def _apart(parts: list[int], partitions: int) -> tuple[int, ...]:
    """How far ``parts`` are spread: for each worker count 2, 4, ... up to ``partitions``,
    the distinct workers they reach when each worker holds a block, and when partitions are
    dealt in turn."""
    out: list[int] = []
    workers = 2
    while workers <= partitions:
        block = partitions // workers
        out.append(len({p // block for p in parts}))
        out.append(len({p % workers for p in parts}))
        workers *= 2
    return tuple(out)


@functools.lru_cache(maxsize=64)
def placement(base: int, partitions: int) -> tuple[int, ...]:
    """The by-run partitions of a run's shards 0, 1, ... (``partitions`` of them; shard ``k``
    past that takes ``k % partitions``'s), the run's own partition ``base`` first: each next
    one the unused partition that reaches the most workers under both deals, the nearest
    after ``base`` on a tie. Depends on ``base`` and ``partitions`` alone, so every worker's
    route stage places a shard alike."""
    parts = [base]
    left = [p for p in range(partitions) if p != base]
    while left:
        best = max(
            left, key=lambda c: (_apart([*parts, c], partitions), -((c - base) % partitions))
        )
        parts.append(best)
        left.remove(best)
    return tuple(parts)


def partition_of(run: str, shard: int, partitions: int) -> int | None:
    """The by-run partition of a run's shard; None for shard 0 (its key's own partition,
    which the run's other shards leave to it while there are other partitions)."""
    if shard == 0 or partitions <= 0:
        return None
    everyone = list(range(partitions))
    base = _PARTITIONER(run.encode(), everyone, everyone)
    if partitions == 1:
        return base
    return placement(base, partitions)[1 + (shard - 1) % (partitions - 1)]
