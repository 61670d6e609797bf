"""One advice reader per node: local rank 0's consumer relays the run's advice to the node's
other ranks through a file (``advice_relay``); each rank's inbox judges what it reads."""

from __future__ import annotations

import os
import time

import pytest

import steplens.producer.remedies.advice_relay as relay
from steplens.producer.config import ProducerConfig
from steplens.producer.remedies.advice_inbox import AdviceDesk, Message
from steplens.producer.remedies.advice_relay import (
    RelayMissing,
    RelayReader,
    RelayWriter,
    relay_folder,
)

RUN = "run-a"


class Source:
    """A consumer's side as the writer sees it: what arrived since the last call."""

    label = "test"

    def __init__(self) -> None:
        self.waiting: list[Message] = []
        self.closed = False

    def take_advice(self, max_n: int) -> list[Message]:
        out, self.waiting = self.waiting[:max_n], self.waiting[max_n:]
        return out

    def close_advice(self) -> None:
        self.closed = True


def m(i: int, key: bytes | None = RUN.encode()) -> Message:
    return (key, f"advice-{i}".encode(), i % 3, 100 + i)


def node(tmp_path) -> tuple:  # type: ignore[no-untyped-def]
    """The run's relay folder, a consumer's side, and local rank 0's writer of node-1."""
    folder = relay_folder(str(tmp_path), RUN)
    assert folder is not None
    src = Source()
    return folder, src, RelayWriter(src, folder, "node-1", RUN)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_the_nodes_other_ranks_read_what_local_rank_0_reads(tmp_path):
    folder = relay_folder(str(tmp_path), RUN)
    assert folder is not None
    src = Source()
    reader = RelayReader(folder, "node-1", now_ms() - 1)
    assert reader.take_advice(10) == []  # no file yet: nothing, and no error
    writer = RelayWriter(src, folder, "node-1", RUN)
    src.waiting = [m(1), m(2, key=b"run-b"), m(3, key=None), m(4)]
    assert writer.take_advice(10) == [m(1), m(2, key=b"run-b"), m(3, key=None), m(4)]
    assert reader.take_advice(10) == [m(1), m(4)]  # the run's own, in order, as read
    assert reader.take_advice(10) == []
    src.waiting = [m(5)]
    writer.take_advice(10)
    assert reader.take_advice(10) == [m(5)]
    other_host = RelayReader(folder, "node-2", now_ms() - 10_000)
    assert other_host.take_advice(10) == []  # another node's ranks read their own node's file
    writer.close_advice()
    assert src.closed


def test_a_reader_keeps_what_was_relayed_from_its_own_start_on(tmp_path):
    folder, src, writer = node(tmp_path)
    src.waiting = [m(1)]
    writer.take_advice(10)
    time.sleep(0.01)
    late = RelayReader(folder, "node-1", now_ms())
    src.waiting = [m(2)]
    writer.take_advice(10)
    assert late.take_advice(10) == [m(2)]


def test_at_most_max_n_at_a_time_and_the_rest_next_time(tmp_path):
    folder, src, writer = node(tmp_path)
    reader = RelayReader(folder, "node-1", now_ms() - 1)
    src.waiting = [m(i) for i in range(10)]
    writer.take_advice(100)
    assert reader.take_advice(4) == [m(i) for i in range(4)]
    assert reader.take_advice(100) == [m(i) for i in range(4, 10)]


def test_a_half_written_frame_waits_for_its_end(tmp_path):
    folder, src, writer = node(tmp_path)
    reader = RelayReader(folder, "node-1", now_ms() - 1)
    src.waiting = [m(1), m(2)]
    writer.take_advice(10)
    path = folder / "node-1" / "0"
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])  # as if the append were still under way
    assert reader.take_advice(10) == [m(1)]
    with path.open("ab") as f:
        f.write(whole[-3:])
    assert reader.take_advice(10) == [m(2)]


def test_generations_roll_over_bounded_and_readers_follow(tmp_path, monkeypatch):
    monkeypatch.setattr(relay, "MAX_FILE_BYTES", 200)
    folder, src, writer = node(tmp_path)
    reader = RelayReader(folder, "node-1", now_ms() - 1)
    got: list[Message] = []
    for i in range(60):
        src.waiting = [m(i)]
        writer.take_advice(10)
        if i % 3 == 0:
            got += reader.take_advice(100)
    got += reader.take_advice(100)
    assert got == [m(i) for i in range(60)]
    files = list((folder / "node-1").iterdir())
    assert len(files) <= 3  # the writer removes the generations two back
    assert sum(f.stat().st_size for f in files) < 3 * (200 + 64)


def test_a_restarted_writer_starts_a_new_generation_and_readers_go_on(tmp_path):
    folder = relay_folder(str(tmp_path), RUN)
    assert folder is not None
    src = Source()
    first = RelayWriter(src, folder, "node-1", RUN)
    reader = RelayReader(folder, "node-1", now_ms() - 1)
    src.waiting = [m(1)]
    first.take_advice(10)
    first.close_advice()
    second = RelayWriter(src, folder, "node-1", RUN)
    src.waiting = [m(2)]
    second.take_advice(10)
    assert reader.take_advice(10) == [m(1), m(2)]
    assert sorted(p.name for p in (folder / "node-1").iterdir()) == ["0", "1"]


def test_garbage_in_the_file_is_counted_and_skipped_never_raised(tmp_path):
    folder = relay_folder(str(tmp_path), RUN)
    assert folder is not None
    (folder / "node-1").mkdir()
    (folder / "node-1" / "0").write_bytes(b"\xff\xff\xff\xff" + os.urandom(64))
    reader = RelayReader(folder, "node-1", 0)
    assert reader.take_advice(10) == []
    assert reader.broken == 1
    src = Source()
    writer = RelayWriter(src, folder, "node-1", RUN)  # generation 1
    src.waiting = [m(1)]
    writer.take_advice(10)
    assert reader.take_advice(10) == [m(1)]


def test_without_the_nodes_file_the_reader_gives_up_after_its_wait(tmp_path):
    folder = relay_folder(str(tmp_path), RUN)
    assert folder is not None
    clock = [0.0]
    told: list[int] = []
    reader = RelayReader(
        folder, "node-1", 0, wait_s=60.0, on_missing=lambda: told.append(1), clock=lambda: clock[0]
    )
    assert reader.take_advice(10) == []
    clock[0] = 61.0
    with pytest.raises(RelayMissing):
        reader.take_advice(10)
    assert told == [1]


def test_a_failed_source_is_dropped_and_opened_again_after_the_retry(tmp_path):
    folder = relay_folder(str(tmp_path), RUN)
    assert folder is not None
    clock = [0.0]
    made: list[str] = []
    src = Source()

    def make():  # type: ignore[no-untyped-def]
        if not made:
            made.append("relay")
            return RelayReader(folder, "node-1", 0, wait_s=5.0, clock=lambda: clock[0])
        made.append("own")
        return src

    from tests.producer.test_advice import Inbox
    from tests.waiting import wait_until

    box = Inbox()
    desk = AdviceDesk(box.inbox, make, retry_s=10.0)
    desk.poll(0.0)
    assert wait_until(lambda: desk.source is not None, timeout_s=5)
    clock[0] = 6.0
    assert desk.poll(6.0) == 0 and desk.source is None  # given up: dropped, counted
    assert box.inbox.counts.get("source_error") == 1
    desk.poll(10.0)
    assert made == ["relay"]  # not before the retry
    desk.poll(16.5)
    assert wait_until(lambda: desk.source is src, timeout_s=5)
    assert made == ["relay", "own"]


@pytest.mark.parametrize("mode", [0o777, 0o755])
def test_a_folder_others_may_write_or_of_another_mode_turns_the_relay_off(tmp_path, mode):
    base = tmp_path / "advice"
    base.mkdir()
    os.chmod(base, mode)
    got = relay_folder(str(base), RUN)
    assert (got is None) == bool(mode & 0o022)


def test_the_relay_is_on_by_default_under_the_cache_and_can_be_turned_off(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    c = ProducerConfig.resolve()
    assert c.advice_per_node and c.advice_relay_dir == str(tmp_path / "steplens" / "advice")
    monkeypatch.setenv("STEPLENS_ADVICE_PER_NODE", "false")
    assert not ProducerConfig.resolve().advice_per_node


def test_a_reader_far_behind_the_writer_goes_on_at_the_oldest_generation_left(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(relay, "MAX_FILE_BYTES", 100)
    folder, src, writer = node(tmp_path)
    clock = [0.0]
    reader = RelayReader(folder, "node-1", now_ms() - 1, clock=lambda: clock[0])
    src.waiting = [m(0)]
    writer.take_advice(10)
    assert reader.take_advice(10) == [m(0)]  # it holds generation 0 open
    for i in range(1, 40):  # generations 1.. written and removed while it did not read
        src.waiting = [m(i)]
        writer.take_advice(10)
    left = sorted(int(p.name) for p in (folder / "node-1").iterdir())
    assert left[0] > 1  # the next one it would have read is gone
    got = reader.take_advice(100)  # the rest of generation 0; the folder listed a moment ago
    assert got and got[-1] != m(39)
    clock[0] += relay.LIST_EVERY_S
    got += reader.take_advice(100)  # listed again: on at the oldest generation left
    assert got[-1] == m(39) and len(got) < 39


def test_a_writer_removes_the_relays_of_runs_untouched_for_a_week(tmp_path):
    old = relay_folder(str(tmp_path), "old-run")
    recent = relay_folder(str(tmp_path), "recent-run")
    assert old is not None and recent is not None
    for folder in (old, recent):
        RelayWriter(Source(), folder, "node-1", "r").close_advice()
    week_ago = time.time() - relay.STALE_RUN_S - 60
    os.utime(old, (week_ago, week_ago))
    folder = relay_folder(str(tmp_path), RUN)
    assert folder is not None
    RelayWriter(Source(), folder, "node-1", RUN).close_advice()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["recent-run", folder.name])
