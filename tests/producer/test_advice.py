"""Advice to the ranks: the inbox's filter and queue (pure), and the Monitor's calls
(``advice()``, ``acted()``, ``checkpoint()``) on the in-memory transport."""

from __future__ import annotations

import threading
import time
from typing import Any

import msgspec
import pytest
from tests.waiting import wait_until

import steplens.producer as sl
from steplens.producer.remedies.advice_inbox import Advice, AdviceDesk, AdviceInbox, Message
from steplens.schema import RUN_RANK, decode, encode, make_record
from steplens.schema.kinds import Advice as AdvicePayload

ALL = frozenset({"skip_samples", "rewind", "lower_lr", "profile"})


def advice_bytes(run_id: str, rank: int = RUN_RANK, step: int = 120, **data: Any) -> bytes:
    data.setdefault("action", "skip_samples")
    data.setdefault("fingerprint", "fp-1")
    rec = make_record("advice", data, run_id=run_id, rank=rank, step=step, time_ns=time.time_ns())
    return encode(rec)


def unchecked_advice(run_id: str, **data: Any) -> bytes:
    """Advice bytes as a hostile producer could write them (no validation)."""
    rec = make_record("advice", {"action": "profile", "fingerprint": "x"}, run_id=run_id)
    return msgspec.json.encode({**rec.to_dict(), "data": {**rec.data, **data}})


def msg(value: bytes | None, key: bytes | None = b"run-a", offset: int = 0) -> Message:
    return (key, value, 0, offset)


class Inbox:
    def __init__(
        self,
        rank: int = 0,
        remedies: frozenset[str] = ALL,
        queue_max: int = 8,
        seen_max: int = 4096,
        burst: int = 4,
    ):
        self.dead: list[tuple[str, Message]] = []
        self.refused: list[tuple[Advice, str]] = []
        self.inbox = AdviceInbox(
            "run-a",
            rank,
            remedies,
            queue_max=queue_max,
            seen_max=seen_max,
            dead_letter=lambda reason, m: self.dead.append((reason, m)),
            refused=lambda a, why: self.refused.append((a, why)),
            burst=burst,
        )


def test_advice_for_this_run_is_queued_with_its_payload():
    box = Inbox()
    got = box.inbox.offer(msg(advice_bytes("run-a", sample_ids=["s7", "s9"], onset_step=118)))
    assert got is not None
    assert list(box.inbox.queue) == [got]
    assert (got.action, got.fingerprint, got.step, got.rank) == ("skip_samples", "fp-1", 120, -1)
    assert isinstance(got.data, AdvicePayload)
    assert got.sample_ids == ["s7", "s9"]  # the payload's fields read as attributes
    assert got.onset_step == 118
    assert got.checkpoint is None
    with pytest.raises(AttributeError):
        _ = got.no_such_field


def test_another_runs_advice_is_refused_and_counted_undecoded():
    box = Inbox()
    assert box.inbox.offer(msg(b"not even a record", key=b"run-b")) is None
    assert box.inbox.offer(msg(advice_bytes("run-b"), key=b"run-b")) is None
    assert box.inbox.counts == {"other_run": 2}
    assert not box.inbox.queue and not box.dead


def test_advice_without_a_key_is_refused_even_for_this_run():
    box = Inbox()
    assert box.inbox.offer(msg(advice_bytes("run-a"), key=None)) is None
    assert box.inbox.offer(msg(advice_bytes("run-b"), key=None)) is None
    assert box.inbox.counts == {"no_key": 2}
    assert not box.inbox.queue and not box.dead


def test_advice_for_another_rank_is_skipped_and_for_this_rank_kept():
    box = Inbox(rank=3)
    assert box.inbox.offer(msg(advice_bytes("run-a", rank=2, fingerprint="a"))) is None
    assert box.inbox.offer(msg(advice_bytes("run-a", rank=3, fingerprint="b"))) is not None
    assert box.inbox.counts == {"other_rank": 1}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff\x00garbage", "advice topic:"),
        (None, "empty message"),
        (
            encode(make_record("checkpoint", {"path": "/x"}, run_id="run-a", step=3)),
            "a 'checkpoint' record, not advice",
        ),
        (unchecked_advice("run-a", action="format_disk"), "action"),
        (unchecked_advice("run-a", lr_factor=4.0, action="lower_lr"), "lr_factor"),
        (unchecked_advice("run-a", sample_ids=["x" * 10_000]), "sample_ids"),
        (advice_bytes("run-b"), "advice for run 'run-b' under key b'run-a'"),
    ],
)
def test_a_broken_or_hostile_message_is_dead_lettered_by_rank_0_only(value, reason):
    box = Inbox(rank=0)
    assert box.inbox.offer(msg(value, offset=41)) is None
    assert box.inbox.counts == {"broken": 1}
    [(why, m)] = box.dead
    assert reason in why
    assert m == (b"run-a", value, 0, 41)
    other = Inbox(rank=1)
    assert other.inbox.offer(msg(value)) is None
    assert other.inbox.counts == {"broken": 1} and not other.dead


def test_a_pair_seen_before_is_ignored_and_what_was_let_through_never_forgotten():
    box = Inbox(seen_max=2)  # refused pairs remembered
    assert box.inbox.offer(msg(advice_bytes("run-a", fingerprint="f1"))) is not None
    assert box.inbox.offer(msg(advice_bytes("run-a", fingerprint="f1"))) is None
    # the same incident, another action: a new piece of advice
    assert (
        box.inbox.offer(msg(advice_bytes("run-a", fingerprint="f1", action="profile"))) is not None
    )
    assert box.inbox.counts == {"duplicate": 1}
    # a flood of refused pairs (past the rate limit) cannot push out what was let through
    for i in range(50):
        box.inbox.offer(msg(advice_bytes("run-a", fingerprint=f"flood-{i}")))
    assert box.inbox.counts["seen_forgotten"] > 0
    assert box.inbox.offer(msg(advice_bytes("run-a", fingerprint="f1"))) is None
    assert box.inbox.counts["duplicate"] == 2


def advice_at(run_id: str, decided_s: float, **data: Any) -> bytes:
    """Advice decided at ``decided_s`` (seconds of the wall clock)."""
    data.setdefault("action", "lower_lr")
    ns = int(decided_s * 1e9)
    return encode(make_record("advice", data, run_id=run_id, rank=RUN_RANK, step=10, time_ns=ns))


def test_the_rate_limit_lets_the_same_advice_through_on_every_rank():
    """4 at once, then one per 60 s of the advice's own time: ranks that receive the same
    messages at different times let the same ones through."""
    t0 = time.time() - 3600
    decided = [t0 + d for d in (0, 1, 2, 3, 4, 5, 70, 71, 200)]
    got = []
    for rank, lag_s in ((0, 0.01), (1, 30.0)):
        box = Inbox(rank=rank, queue_max=64)
        kept = [
            box.inbox.offer(
                msg(advice_at("run-a", d, fingerprint=f"f{i}")), now_ns=int((d + lag_s) * 1e9)
            )
            is not None
            for i, d in enumerate(decided)
        ]
        got.append(kept)
        assert box.inbox.counts == {"rate_limited": 3}
        assert len(box.refused) == 3 and "rate limit" in box.refused[0][1]
    assert got[0] == got[1] == [True] * 4 + [False, False, True, False, True]


def test_a_flood_of_new_fingerprints_is_refused_answered_within_bounds_logged_once(caplog):
    box = Inbox(queue_max=64)
    with caplog.at_level("WARNING", logger="steplens"):
        for i in range(3000):
            box.inbox.offer(msg(advice_bytes("run-a", action="lower_lr", fingerprint=f"x{i}")))
    assert len(box.inbox.queue) == 4  # the burst
    counts = box.inbox.counts
    assert counts["rate_limited"] == 2996
    assert len(box.refused) + counts["refused_unanswered"] == 2996
    assert len(box.refused) < 100  # answered at a bounded rate
    # what was let through is still known after the flood: offered again, a duplicate
    for i in range(4):
        again = msg(advice_bytes("run-a", action="lower_lr", fingerprint=f"x{i}"))
        assert box.inbox.offer(again) is None
    assert box.inbox.counts["duplicate"] == 4
    said = [r for r in caplog.records if "rate_limited" in r.getMessage()]
    assert len(said) == 1


def test_a_remedy_not_opted_into_is_refused_not_queued():
    box = Inbox(remedies=frozenset({"profile"}))
    assert box.inbox.offer(msg(advice_bytes("run-a", action="rewind", checkpoint="c"))) is None
    [(advice, why)] = box.refused
    assert advice.action == "rewind" and "not enabled" in why
    assert box.inbox.counts == {"not_opted_in": 1} and not box.inbox.queue


def test_the_queue_is_bounded_drop_oldest_counted():
    box = Inbox(queue_max=2, burst=8)
    for i in range(5):
        box.inbox.offer(msg(advice_bytes("run-a", fingerprint=f"f{i}")))
    assert [a.fingerprint for a in box.inbox.queue] == ["f3", "f4"]
    assert box.inbox.counts == {"queue_full": 3}
    assert box.inbox.received == 5


# ------------------------------------------------------------------ the Monitor


def test_without_remedies_there_is_no_advice_desk_and_advice_is_empty(memory_monitor):
    m, t = memory_monitor(remedies=[])  # profile, on by default, turned off
    assert m._pipeline.advice is None
    t.advise(advice_bytes(m.run_id), key=m.run_id.encode())
    m.log_step(1, loss=1.0)
    m.flush(5)
    assert m.advice() == ()
    assert "remedies" not in t.records("run_meta")[0].data


def test_advice_reaches_the_loop_and_acted_and_checkpoint_are_sent(memory_monitor):
    m, t = memory_monitor(remedies=["skip_samples", "rewind"])
    m.log_step(5, loss=1.0)
    m.checkpoint(5, "/ckpt/step-5")
    key = m.run_id.encode()
    t.advise(advice_bytes(m.run_id, sample_ids=["s1"]), key=key)
    t.advise(advice_bytes(m.run_id, sample_ids=["s1"]), key=key)  # again: ignored
    t.advise(advice_bytes("someone-else"), key=b"someone-else")
    t.advise(advice_bytes(m.run_id, action="lower_lr", lr_factor=0.5), key=key)  # not opted in
    got: list[Advice] = []
    assert wait_until(lambda: got.extend(m.advice()) or got, timeout_s=5)
    assert [(a.action, a.sample_ids) for a in got] == [("skip_samples", ["s1"])]
    m.acted(got[0], "acted", detail="skipped 1 sample")
    m.flush(5)
    meta = t.records("run_meta")[0]
    assert meta.data["remedies"] == ["skip_samples", "rewind"]
    [ckpt] = t.records("checkpoint")
    assert (ckpt.step, ckpt.data) == (5, {"path": "/ckpt/step-5"})
    acted = {r.data["action"]: r for r in t.records("acted")}
    assert acted["skip_samples"].data == {
        "action": "skip_samples",
        "fingerprint": "fp-1",
        "outcome": "acted",
        "detail": "skipped 1 sample",
    }
    assert acted["skip_samples"].step == 5  # the last step logged
    assert acted["lower_lr"].data["outcome"] == "refused"
    stats = m.stats()
    assert stats["advice"] == {"duplicate": 1, "other_run": 1, "not_opted_in": 1}
    assert stats["advice_received"] == 1


def test_a_hostile_message_goes_to_the_dead_letter_topic(memory_monitor, monkeypatch):
    monkeypatch.setenv("STEPLENS_TOPIC_DEADLETTER", "dl-test")
    m, t = memory_monitor(remedies=["profile"], rank=0)
    m.log_step(1, loss=1.0)
    t.advise(b"\x00\x01 not msgpack", key=m.run_id.encode())
    assert wait_until(lambda: t.aside, timeout_s=5)
    [(topic, key, value)] = t.aside
    assert (topic, key) == ("dl-test", m.run_id.encode())
    rec = decode(value)  # the dead letter is a record of the schema
    assert rec.kind == "dead_letter" and rec.data["source_topic"] == "steplens.advice"
    assert "not valid JSON" in rec.data["reason"]


def test_bad_calls_never_raise_and_are_counted(memory_monitor):
    m, t = memory_monitor(remedies=["profile"])
    m.log_step(1, loss=1.0)
    m.acted(object(), "acted")  # not advice
    m.checkpoint(2, object())  # not a path
    advice = Inbox().inbox.offer(msg(advice_bytes("run-a", action="profile")))
    assert advice is not None
    m.acted(advice, "exploded")  # not an outcome
    m.checkpoint(-3, "/x")  # not a step
    m.flush(5)
    assert m.counts.caller == 2
    assert not t.records("acted") and not t.records("checkpoint")
    assert m.dropped.get("bad_acted") == 1 and m.dropped.get("bad_checkpoint") == 1


def test_init_validates_the_remedies():
    with pytest.raises(ValueError, match="remedies"):
        sl.init("r", remedies=["format_disk"], transport=sl.MemoryTransport(), hw_interval_s=0)
    sl.shutdown()


def test_the_module_functions_do_nothing_before_init():
    assert sl.get_monitor() is None
    before = sl.calls_without_monitor
    assert sl.advice() == ()
    sl.checkpoint(1, "/x")
    assert sl.calls_without_monitor == before + 2


def test_the_desk_opens_its_source_aside_and_retries_after_a_failure():
    box = Inbox()
    release = threading.Event()
    source = sl.MemoryTransport()
    attempts: list[float] = []

    def make() -> sl.MemoryTransport:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise ConnectionError("no broker")
        release.wait(60)  # Kafka slow to answer, until the test releases it
        return source

    desk = AdviceDesk(box.inbox, make, retry_s=10.0)
    assert desk.poll(100.0) == 0
    assert wait_until(lambda: box.inbox.counts.get("source_error") == 1, timeout_s=5)
    assert "no broker" in (desk.last_error or "")
    assert desk.poll(105.0) == 0 and len(attempts) == 1  # not again before retry_s
    assert desk.poll(111.0) == 0  # opening again, in its own thread: no wait here
    assert wait_until(lambda: len(attempts) == 2, timeout_s=5)
    assert desk.source is None  # the poll returned while the opening still waits
    release.set()
    assert wait_until(lambda: desk.source is not None, timeout_s=5)
    source.advise(advice_bytes("run-a"), key=b"run-a")
    assert desk.poll(112.0) == 1 and len(box.inbox.queue) == 1
    desk.close()
    assert desk.source is None


def test_past_the_cap_of_pairs_let_through_advice_is_refused_not_forgotten(monkeypatch):
    import steplens.producer.remedies.advice_inbox as inbox_module

    monkeypatch.setattr(inbox_module, "MAX_LET_THROUGH", 3)
    box = Inbox(burst=10)
    kept = [box.inbox.offer(msg(advice_bytes("run-a", fingerprint=f"f{i}"))) for i in range(5)]
    assert [k is not None for k in kept] == [True, True, True, False, False]
    assert box.inbox.counts == {"let_through_full": 2}
    assert "no more this run" in box.refused[0][1]
    assert box.inbox.offer(msg(advice_bytes("run-a", fingerprint="f0"))) is None  # remembered
    assert box.inbox.counts["duplicate"] == 1
