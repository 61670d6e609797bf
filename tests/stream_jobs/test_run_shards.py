"""A wide run's ranks in shards: keys, the ranks each holds, and the partitions they go to."""

from __future__ import annotations

from steplens.schema import RUN_RANK
from steplens.stream_jobs.engine.run_keys import run_of, shard_key, split_key
from steplens.stream_jobs.engine.signals.registry import SERIES_RANKS
from steplens.stream_jobs.worker.run_shards import (
    first_ranks,
    partition_of,
    placement,
    shard_of_rank,
    shard_ranks_of,
)

FIRST = first_ranks(SERIES_RANKS, 2048)  # shard 0: the followed ranks


def test_shard_0_holds_the_followed_ranks_in_whole_nodes() -> None:
    assert FIRST == 256
    assert first_ranks(100, 2048) == 104  # up to the node's end
    assert first_ranks(5000, 2048) == 2048  # at most a shard
    assert first_ranks(SERIES_RANKS, 2) == 2
    assert first_ranks(0, 2048) == 2048  # none followed: as wide as the others


def test_a_run_no_wider_than_shard_0_keeps_its_own_key() -> None:
    for rank in (RUN_RANK, 0, 7, FIRST - 1):
        assert shard_of_rank(rank, 2048, 16384, FIRST) == 0
    assert shard_key("run-a", 0) == "run-a"
    assert split_key("run-a") == ("run-a", 0)
    assert partition_of("run-a", 0, 8) is None  # its key's own partition, as before


def test_ranks_go_to_their_shard_and_back_to_their_run() -> None:
    ranks = (255, 256, 2303, 2304, 16383)
    assert [shard_of_rank(r, 2048, 16384, FIRST) for r in ranks] == [0, 1, 1, 2, 8]
    assert shard_of_rank(5000, 0, 16384, 0) == 0  # 0: runs are never split
    for run in ("run-a", "a:b:c", "x" * 200):
        for shard in (0, 1, 7):
            key = shard_key(run, shard)
            assert split_key(key) == (run, shard)
            assert run_of(key) == run
    assert shard_key("run-a", 1) != "run-a1"


def test_a_rank_past_the_cap_makes_no_new_shard() -> None:
    """A producer naming ranks at random is held to the shards a run of ``max_ranks`` has."""
    shards = {shard_of_rank(r, 2048, 16384, FIRST) for r in range(0, 10**6, 997)}
    assert shards == set(range(9))
    assert shard_of_rank(2**31 - 1, 2048, 16384, FIRST) == 8
    last = shard_ranks_of(shard_key("r", 8), 2048, FIRST)
    assert last is not None and 16383 in last


def test_each_shard_reads_its_own_ranks() -> None:
    first = shard_ranks_of("r", 2048, FIRST)
    second = shard_ranks_of(shard_key("r", 1), 2048, FIRST)
    assert first is not None and second is not None
    assert RUN_RANK in first and 0 in first and 255 in first and 256 not in first
    assert 256 in second and 2303 in second and 255 not in second and RUN_RANK not in second
    for rank in range(RUN_RANK, 16384, 61):  # each rank read by the shard it is routed to
        shard = shard_of_rank(rank, 2048, 16384, FIRST)
        assert rank in (shard_ranks_of(shard_key("r", shard), 2048, FIRST) or ())
    assert shard_ranks_of("r", 0, 0) is None  # not split: every rank


def test_a_runs_shards_reach_as_many_workers_as_they_can_however_faust_deals() -> None:
    """Workers that join one after the other hold blocks of the by-run partitions, workers that
    join together every n-th one: a run's first 2, 4 and 8 shards reach 2, 4 and 8 workers
    under both deals, for every partition a run can have."""
    for partitions in (8, 16, 32):
        for base in range(partitions):
            parts = placement(base, partitions)
            assert parts[0] == base and sorted(parts) == list(range(partitions))
            for workers in (2, 4, 8):
                if workers > partitions:
                    continue
                first = parts[:workers]
                assert len({p // (partitions // workers) for p in first}) == workers, first
                assert len({p % workers for p in first}) == workers, first
    run = "run-a"
    others = [partition_of(run, k, 8) for k in range(1, 16)]
    (base,) = set(range(8)) - set(others)  # shard 0's own partition: no other shard's
    assert others == [*placement(base, 8)[1:], *placement(base, 8)[1:], placement(base, 8)[1]]
    assert partition_of(run, 3, 1) == 0  # one partition: every shard on it
