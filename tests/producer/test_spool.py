"""The disk spool: order, bound with drop-oldest counting, torn frames, reopening."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from steplens.producer.delivery.live_or_spool import DOWN, FULL_WAIT_S, Delivery
from steplens.producer.delivery.spool import Spool, iter_frames, send_spool
from steplens.producer.delivery.transport import MemoryTransport, OnResult


def _fill(spool: Spool, n: int, size: int = 100) -> list[bytes]:
    values = [f"{i:08d}".encode() + b"x" * size for i in range(n)]
    for v in values:
        assert spool.append(b"run:0", v)
    return values


def test_replay_in_order_across_segments(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), max_bytes=1 << 20, segment_bytes=1000)
    values = _fill(spool, 50)
    assert len(spool) > 3
    got = []
    while (oldest := spool.oldest()) is not None:
        index, records = oldest
        got += [v for _, v in records]
        spool.remove(index)
    assert got == values
    assert spool.total_bytes == 0 and not list(tmp_path.glob("*.seg"))


def test_bound_drops_oldest_and_counts(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), max_bytes=5000, segment_bytes=1000)
    values = _fill(spool, 200)
    assert spool.total_bytes <= 5000
    assert spool.dropped_records > 0
    kept = []
    while (oldest := spool.oldest()) is not None:
        kept += [v for _, v in oldest[1]]
        spool.remove(oldest[0])
    assert kept == values[-len(kept) :]  # the newest survive, in order
    assert spool.dropped_records + len(kept) == len(values)


def test_appending_while_replaying_goes_to_a_new_segment(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), max_bytes=1 << 20)
    _fill(spool, 3)
    index, records = spool.oldest()  # type: ignore[misc]
    spool.append(b"k", b"later")
    spool.remove(index)
    rest = spool.oldest()
    assert len(records) == 3 and rest is not None and rest[1] == [(b"k", b"later")]


def test_torn_tail_and_reopen(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), max_bytes=1 << 20)
    values = _fill(spool, 5)
    spool.close()
    seg = sorted(tmp_path.glob("*.seg"))[-1]
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00\x01\x00\x00")  # half a frame header, as after a crash
    reopened = Spool(str(tmp_path), max_bytes=1 << 20)
    oldest = reopened.oldest()
    assert oldest is not None and [v for _, v in oldest[1]] == values
    assert reopened.records == 5


def test_oversized_record_is_dropped(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), max_bytes=100)
    assert not spool.append(b"k", b"x" * 200)
    assert spool.dropped_records == 1


def test_frames_are_read_a_block_at_a_time(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), max_bytes=1 << 20)
    values = [bytes([65 + i % 26]) * (1 + 37 * i) for i in range(40)]  # 1 .. 1444 bytes
    for v in values:
        assert spool.append(b"run:0", v)
    spool.close()
    (seg,) = tmp_path.glob("*.seg")
    for block in (1, 7, 64, 1 << 16):  # frames straddle block boundaries in every way
        assert [v for _, v in iter_frames(str(seg), block)] == values
    with open(seg, "r+b") as f:  # a flipped byte in the 11th record ends the segment there
        f.seek(sum(12 + 5 + len(v) for v in values[:10]) + 12 + 5)
        f.write(b"\xff")
    assert [v for _, v in iter_frames(str(seg), 64)] == values[:10]
    assert list(iter_frames(str(tmp_path / "missing.seg"))) == []


def test_lazy_replay_leaves_the_segment_until_removed(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), max_bytes=1 << 20)
    values = _fill(spool, 10)
    found = spool.oldest_lazy()
    assert found is not None
    index, frames = found
    assert next(frames)[1] == values[0]
    spool.append(b"run:0", b"during replay")  # goes to a new segment
    assert [v for _, v in frames] == values[1:]
    spool.remove(index)
    rest = spool.oldest()
    assert rest is not None and rest[1] == [(b"run:0", b"during replay")]


def test_folders_and_files_are_private(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "run" / "rank0-pid1"), max_bytes=1 << 20)
    _fill(spool, 3)
    folder = tmp_path / "run" / "rank0-pid1"
    assert folder.stat().st_mode & 0o777 == 0o700
    (seg,) = folder.glob("*.seg")
    assert seg.stat().st_mode & 0o777 == 0o600


def test_a_later_process_adopts_what_an_ended_one_left(tmp_path: Path) -> None:
    first = Spool(str(tmp_path / "run" / "rank0-pid1"), max_bytes=1 << 20, segment_bytes=500)
    left = _fill(first, 20)
    live = Spool(str(tmp_path / "other" / "rank3-pid2"), max_bytes=1 << 20)
    live_values = _fill(live, 2)  # a process still running: its lock is held
    first.close()  # the first process ends with records left: its lock is released
    later = Spool(str(tmp_path / "run" / "rank0-pid9"), max_bytes=1 << 20, adopt_root=str(tmp_path))
    later.open()
    got = []
    while (oldest := later.oldest()) is not None:
        got += [v for _, v in oldest[1]]
        later.remove(oldest[0])
    assert got == left and later.adopted_records == 20  # in order, once
    assert not (tmp_path / "run" / "rank0-pid1").exists()
    assert [v for _, v in live.oldest()[1]] == live_values  # type: ignore[index]
    again = Spool(str(tmp_path / "x" / "rank0-pid10"), max_bytes=1 << 20, adopt_root=str(tmp_path))
    again.open()
    assert again.adopted_records == 0  # adopted once, never twice


def test_send_spool_sends_by_hand_and_skips_live_folders(tmp_path: Path) -> None:
    ended = Spool(str(tmp_path / "run" / "rank0-pid1"), max_bytes=1 << 20, segment_bytes=300)
    values = _fill(ended, 12)
    ended.close()
    live = Spool(str(tmp_path / "run" / "rank1-pid2"), max_bytes=1 << 20)
    _fill(live, 3)
    tx = MemoryTransport()
    sent, left = send_spool(str(tmp_path), tx, timeout_s=5)
    assert (sent, left) == (12, 3)
    assert [v for _, v in tx.messages] == values
    assert not (tmp_path / "run" / "rank0-pid1").exists()
    tx.available = False  # nothing is deleted when delivery fails
    live.close()
    assert send_spool(str(tmp_path), tx, timeout_s=1) == (0, 3)
    assert list((tmp_path / "run" / "rank1-pid2").glob("*.seg"))


class _Filling(MemoryTransport):
    """Takes ``room`` records, then its local buffer stays full."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def produce(
        self, key: bytes, value: bytes, on_result: OnResult, topic: str | None = None
    ) -> bool:
        if self.room == 0:
            return False
        self.room -= 1
        return super().produce(key, value, on_result, topic)


def test_send_spool_leaves_what_a_full_local_buffer_does_not_take(tmp_path: Path) -> None:
    ended = Spool(str(tmp_path / "run" / "rank0-pid1"), max_bytes=1 << 20)
    values = _fill(ended, 6)
    ended.close()
    tx = _Filling(2)
    t0 = time.monotonic()
    assert send_spool(str(tmp_path), tx, timeout_s=0.3) == (2, 4)
    assert time.monotonic() - t0 < 3.0  # the full buffer is waited for 0.3 s, not for ever
    assert [v for _, v in tx.messages] == values[:2]
    assert list((tmp_path / "run" / "rank0-pid1").glob("*.seg"))  # kept: sent again later


def test_a_record_the_full_buffer_does_not_take_in_time_goes_to_the_spool(tmp_path: Path) -> None:
    tx = _Filling(0)
    delivery = Delivery(lambda: tx, Spool(str(tmp_path), max_bytes=1 << 20), probe_interval_s=60)
    t0 = time.monotonic()
    delivery.send(b"run:0", b"v")
    took = time.monotonic() - t0
    assert FULL_WAIT_S <= took < FULL_WAIT_S + 1.0
    assert delivery.state == DOWN and delivery.spooled == 1 and delivery.in_flight == 0


class _Refusing(MemoryTransport):
    """Refuses the first ``times`` records for now (an unknown topic), then takes them."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.times = times

    def produce(
        self, key: bytes, value: bytes, on_result: OnResult, topic: str | None = None
    ) -> bool:
        if self.times:
            self.times -= 1
            raise ConnectionError("unknown topic")
        return super().produce(key, value, on_result, topic)


def test_a_record_refused_for_now_is_kept_and_sent_once_taken(tmp_path: Path) -> None:
    """Kafka refusing a record at once (an unknown topic) is an outage for that record, not a
    loss: it is spooled, and the replay that meets a refusal again keeps it for the next."""
    tx = _Refusing(2)
    delivery = Delivery(lambda: tx, Spool(str(tmp_path), max_bytes=1 << 20), probe_interval_s=0)
    delivery.send(b"run:0", b"a")
    assert delivery.state == DOWN and delivery.spooled == 1
    delivery.send(b"run:0", b"b")
    assert delivery.flush(5.0) == 0
    assert [v for _, v in tx.messages] == [b"a", b"b"] and tx.times == 0


def test_kafka_says_a_record_it_never_takes_apart_from_one_refused_for_now() -> None:
    """A record past Kafka's message size is refused for good (the caller counts it), not kept
    in the spool, where every replay would meet it again."""
    from steplens.producer.delivery.transport import KafkaTransport, kafka_conf

    tx = KafkaTransport("steplens.raw", kafka_conf("127.0.0.1:9", "too-large", 1.0, {}))
    try:
        with pytest.raises(ValueError, match="never takes"):
            tx.produce(b"run:0", b"x" * (2 << 20), lambda ok, k, v: None)
    finally:
        tx.abandon(0.1)
