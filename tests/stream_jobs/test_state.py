"""A run's state as plain, versioned data: restored by this release and the next, never
unpickled; a state of another format is refused and the run starts afresh.

``data/state_v1.msgpack`` was written by ``python tests/stream_jobs/test_state.py`` with format
1: a later release must still restore it (keep the file; add one per new format). Its ARIMA fits
were computed on another CPU, whose BLAS kernels may round differently: what it scores compares
with the never-stopped detector's within a float tolerance (``close_data``)."""

from __future__ import annotations

import copy
import logging
import math
import pickle
import random
from pathlib import Path
from typing import Any

import msgpack
import pytest

from close_data import assert_close
from steplens.schema import make_record
from steplens.stream_jobs.engine.core import flatten
from steplens.stream_jobs.engine.detector import CODEC, RunDetector
from steplens.stream_jobs.engine.signals import data_quality
from steplens.stream_jobs.engine.state import FORMAT, MAGIC

BLOB = Path(__file__).parent / "data" / "state_v1.msgpack"
CUT = 400  # the stored state holds the records before this one
# detectors added since format 1: a restored state has none of their baselines, which learn
# afresh (compared without them)
NEW_SINCE_V1 = frozenset({"vanishing", "clipping", "lr_event"})


def records() -> list:
    """Two ranks' steps (every step signal, a declared schedule, a loss spike after the cut),
    hardware and evaluation records: every detector's state is in the blob."""
    rng = random.Random(17)
    sched = {"kind": "cosine", "peak_lr": 1e-3, "warmup_steps": 20, "total_steps": 2000}
    out = [make_record("run_meta", {"world_size": 2, "lr_schedule": sched}, run_id="r")]
    for i in range(700):
        for rank in (0, 1):
            loss = 4 * math.exp(-i / 300) + 1 + rng.gauss(0, 0.02)
            data = {
                "loss": 40.0 if i == 520 else loss,
                "grad_norm": 1 + rng.gauss(0, 0.05),
                "lr": 1e-3 * min(1.0, (i + 1) / 20),
                "step_time_s": 0.1 + rng.gauss(0, 0.002) + (0.2 if rank and i > 600 else 0),
                "tokens_per_s": 1e5 + rng.gauss(0, 500),
                # the share of elements updated (format 1 held 1e-3 here, a ratio then; the
                # state it left is not read by the share's detector)
                "update_ratio": 0.6 + rng.gauss(0, 0.01),
                "param_norm": 100 + rng.gauss(0, 0.1),
            }
            out.append(
                make_record("step", data, run_id="r", rank=rank, step=i, time_ns=(i + 1) * 10**8)
            )
        if i % 50 == 0:
            gpu = {"index": 0, "mem_used_bytes": 50 + i // 50, "mem_total_bytes": 100}
            hw = {"gpus": [gpu], "mem_available_bytes": 50, "mem_total_bytes": 100}
            out.append(make_record("hw", hw, run_id="r", rank=0, time_ns=(i + 1) * 10**8))
            ev = {"split": "val", "loss": loss + 0.1}
            out.append(make_record("eval", ev, run_id="r", rank=0, step=i))
    return out


def replay(det: RunDetector, recs: list, skip: frozenset[str] = frozenset()) -> list:
    """Each record's signals (but those of the detectors in ``skip``) and alert transitions,
    copied as they were when it was processed."""
    got = []
    for rec in recs:
        sigs, alerts = det.process(rec)
        got.append(copy.deepcopy(([s for s in flatten(sigs) if s.name not in skip], alerts)))
    return got


def write_blob() -> None:
    det = RunDetector("r")
    replay(det, records()[:CUT])
    head, ranks = det.dump(det.series)
    BLOB.parent.mkdir(exist_ok=True)
    BLOB.write_bytes(msgpack.packb({"head": head, "ranks": ranks}))


def restore(blob: bytes) -> RunDetector | None:
    stored = msgpack.unpackb(blob, strict_map_key=False)
    det = RunDetector.load(stored["head"], lambda r, _s: stored["ranks"].get(r))
    if det is not None:
        det.fit_inline = True  # as the never-stopped one (``steplens detect``'s)
    return det


def test_a_state_of_format_1_restores_and_scores_as_a_never_stopped_detector():
    recs = records()
    never_stopped = RunDetector("r")
    replay(never_stopped, recs[:CUT])
    want = replay(never_stopped, recs[CUT:], NEW_SINCE_V1)
    det = restore(BLOB.read_bytes())
    assert det is not None and det.records == never_stopped.records - (len(recs) - CUT)
    got = replay(det, recs[CUT:], NEW_SINCE_V1)
    assert_close(got, want)
    assert any(a.rule == "spike:loss" for _, alerts in got for a in alerts)  # baselines restored


def test_format_1_states_of_changed_detectors_restore_to_working_ones():
    """The training state of format 1 had no lr schedule: restored, it reads the run's (the
    update share is not judged in the warmup); format 1's data state kept sets of hashes per
    step (``by_step``): dropped, the step keys refill from the next batch."""
    det = restore(BLOB.read_bytes())
    assert det is not None and det.schedule is not None
    got = [st for s in det.series.values() for st in s["training"].values()]
    assert got and all(st.schedule == det.schedule for st in got)
    old = msgpack.unpackb(CODEC.pack(data_quality.DataState())[len(MAGIC) + 1 :])
    old["f"]["by_step"] = msgpack.unpackb(CODEC.pack({5: {"ab" * 8}})[len(MAGIC) + 1 :])
    st = CODEC.unpack(MAGIC + bytes([FORMAT]) + msgpack.packb(old, use_bin_type=True))
    assert isinstance(st, data_quality.DataState) and st.step_keys == {}
    data = {"n_samples": 2, "sample_hashes": ["ab" * 8, "cd" * 8]}
    _, sigs = data_quality.update(st, data_quality.DataConfig(), data, 6, 0)
    assert {s.metric for s in sigs} >= {"duplicate_rate", "repeat_rate"}


def test_dump_and_load_round_trip_every_detector_state():
    recs = records()
    det = RunDetector("r")
    replay(det, recs[:CUT])
    head, ranks = det.dump(det.series)
    back = RunDetector.load(head, lambda r, _s: ranks.get(r))
    assert back is not None
    back.fit_inline = True
    assert_close(replay(back, recs[CUT:]), replay(det, recs[CUT:]), rel=0, abs_=0)  # one CPU
    assert set(back.run_states) == set(det.run_states)


def test_ranks_without_series_are_listed_in_the_head_not_stored_and_restore_admitted():
    """Most ranks of a wide run keep no series (past ``series_ranks``): the head lists them
    and no value is written for them, yet a restored run still holds them (its admitted
    ranks) and scores on as the never-stopped one."""
    from steplens.stream_jobs.engine.signals.registry import DetectorConfig

    rng = random.Random(5)
    recs = [
        make_record(
            "step",
            {"loss": 2 + rng.gauss(0, 0.01), "step_time_s": 1 + rng.gauss(0, 0.01)},
            run_id="w",
            rank=rank,
            step=i,
            time_ns=(i + 1) * 10**9 + rank,
        )
        for i in range(60)
        for rank in range(6)
    ]
    recs[-3] = make_record("step", {"loss": math.nan, "step_time_s": 1.0}, run_id="w",
                           rank=5, step=59, time_ns=60 * 10**9 + 5)  # fmt: skip
    cfg = DetectorConfig(series_ranks=2)
    det = RunDetector("w", cfg)
    replay(det, recs[:200])
    head, ranks = det.dump(det.series)
    assert set(ranks) == {0, 1}  # only the followed ranks have a value
    back = RunDetector.load(head, lambda r, _s: ranks.get(r), cfg)
    assert back is not None and set(back.series) == set(det.series) == set(range(6))
    got = replay(back, recs[200:])
    assert_close(got, replay(det, recs[200:]), rel=0, abs_=0)
    # a rank without series still pages its non-finite loss after the restore
    assert [m["rank"] for _, alerts in got for a in alerts for m in a.evidence["members"]
            if m["rule"] == "nonfinite:loss"] == [5]  # fmt: skip
    _, again = back.dump(back.series)
    assert set(again) == {0, 1}


def test_a_state_of_another_format_or_a_pickle_is_refused_and_the_run_starts_afresh(caplog):
    det = RunDetector("r")
    replay(det, records()[:50])
    head, _ = det.dump(det.series)
    newer = MAGIC + bytes([FORMAT + 1]) + head[len(MAGIC) + 1 :]
    pickled = pickle.dumps((det, []))  # how earlier releases stored a run
    with caplog.at_level(logging.WARNING, logger="steplens.stream_jobs"):
        assert RunDetector.load(newer, lambda r, s: None) is None
        assert RunDetector.load(pickled, lambda r, s: None) is None
    assert sum("starts afresh" in r.message for r in caplog.records) == 2


def test_a_class_outside_the_state_is_neither_written_nor_built():
    class Other:
        pass

    with pytest.raises(TypeError):
        CODEC.pack(Other())
    forged = MAGIC + bytes([FORMAT]) + msgpack.packb({"$c": "RunDetector", "f": {}})
    with pytest.raises(ValueError, match="unknown state class"):
        CODEC.unpack(forged)


def test_every_container_and_numpy_scalar_is_written_in_its_tagged_form():
    """The exact types and their subclasses (numpy's scalars, a bool) take the same form, and
    read back to equal values."""
    from collections import deque

    import numpy as np

    arr = np.arange(3.0)
    value = {
        "a": [1, np.float64(2.5), (3, "x"), True, None],
        (1, 2): deque([1.0, np.int64(4)], maxlen=3),
        "s": {5},
        "arr": arr,
        "n": {"k": np.float32(0.5), "t": (np.int64(7),)},
    }
    raw = msgpack.unpackb(CODEC.pack(value)[len(MAGIC) + 1 :], strict_map_key=False)
    assert raw == {
        "$d": [
            ["a", [1, 2.5, {"$t": [3, "x"]}, True, None]],
            [{"$t": [1, 2]}, {"$q": [3, [1.0, 4]]}],
            ["s", {"$s": [5]}],
            ["arr", {"$a": ["<f8", [3], arr.tobytes()]}],
            ["n", {"$d": [["k", 0.5], ["t", {"$t": [7]}]]}],
        ]
    }
    back = CODEC.unpack(CODEC.pack(value))
    assert back["a"] == [1, 2.5, (3, "x"), True, None] and back[(1, 2)] == deque([1.0, 4])
    assert back[(1, 2)].maxlen == 3 and back["s"] == {5} and (back["arr"] == arr).all()


def test_a_trend_s_samples_are_written_as_one_array_and_read_back_equal():
    """``Samples`` (rows of floats: a GPU's temperature drift, a rank's memory marks) take one
    float64 array, not a map per row; non-finite values, the bound and an empty one survive."""
    import numpy as np

    from steplens.stream_jobs.engine.state import Samples

    rows = Samples([(1.0, 2.5), (2.0, math.nan), (3.0, math.inf)], maxlen=3)
    rows.append((4.0, -1e300))  # past the bound: the oldest goes
    raw = msgpack.unpackb(CODEC.pack(rows)[len(MAGIC) + 1 :])
    want = np.array([(2.0, math.nan), (3.0, math.inf), (4.0, -1e300)])
    assert raw["$r"][:2] == [3, 2] and raw["$r"][2] == want.tobytes()
    back = CODEC.unpack(CODEC.pack(rows))
    assert type(back) is Samples and back.maxlen == 3 and len(back) == 3
    assert back[0] == (2.0, back[0][1]) and math.isnan(back[0][1])
    assert list(back)[1:] == [(3.0, math.inf), (4.0, -1e300)]
    empty = CODEC.unpack(CODEC.pack(Samples(maxlen=5)))
    assert type(empty) is Samples and empty.maxlen == 5 and not empty


if __name__ == "__main__":
    write_blob()


class TornTable(dict):
    """A table whose next write of ``key`` fails: a worker killed between its writes."""

    fail_on: bytes | None = None

    def __setitem__(self, key: bytes, value: bytes) -> None:
        if key == self.fail_on:
            self.fail_on = None
            raise KeyboardInterrupt("killed")
        super().__setitem__(key, value)


def _checkpoint_cut(table: TornTable, recs: list) -> tuple[Any, RunDetector]:
    """A store over ``table`` (and its run's detector) that checkpoints the run after 300 of
    ``recs``, then is killed writing the run's key of its checkpoint at ``CUT``."""
    from steplens.stream_jobs.engine.signals.registry import DetectorConfig
    from steplens.stream_jobs.worker.store import RunStore

    store = RunStore(table, DetectorConfig(), checkpoint_s=0.0)
    det = store.cache["r"] = RunDetector("r", fit_inline=True)
    replay(det, recs[:300])
    store.checkpoint("r")
    replay(det, recs[300:CUT])
    table.fail_on = b"r"
    with pytest.raises(KeyboardInterrupt):
        store.checkpoint("r")
    return store, det


def test_a_checkpoint_cut_before_its_head_restores_the_previous_one_whole():
    """The ranks' values of a checkpoint are written before its head; killed in between, the
    stored run is the previous checkpoint: its series with its offsets, not newer series
    paired with the older head (which would apply the steps since then a second time)."""
    from steplens.stream_jobs.engine.signals.registry import DetectorConfig
    from steplens.stream_jobs.worker.store import RunStore

    recs = records()
    table = TornTable()
    _checkpoint_cut(table, recs)
    again = RunStore(table, DetectorConfig(), checkpoint_s=0.0)
    assert again.ready("r", "event") == ["event"]
    back = again.cache["r"]
    back.fit_inline = True
    reference = RunDetector("r")
    replay(reference, recs[:300])
    assert back.records == reference.records
    assert_close(replay(back, recs[300:CUT]), replay(reference, recs[300:CUT]), rel=0, abs_=0)


def test_a_restore_is_logged_and_counted(caplog):
    """A worker that restores a run from the table says so (a log line naming the run, its
    ranks and records) and counts it; a stored state it cannot read is counted as such, and
    a run the table does not have is neither."""
    from steplens.stream_jobs.engine.signals.registry import DetectorConfig
    from steplens.stream_jobs.worker.store import RunStore

    table: dict[bytes, bytes] = {}
    store = RunStore(table, DetectorConfig(), checkpoint_s=0.0)
    det = store.cache["r"] = RunDetector("r", fit_inline=True)
    replay(det, records()[:300])
    store.checkpoint("r")
    table[b"broken"] = b"not a state"

    counted: list[str] = []
    again = RunStore(table, DetectorConfig(), checkpoint_s=0.0, count_restore=counted.append)
    with caplog.at_level(logging.WARNING, logger="steplens.stream_jobs"):
        assert again.ready("r", "e") == ["e"] and again.ready("new", "e") == ["e"]
    assert counted == ["restored"]
    assert f"run r restored from the runs table: 2 ranks, {det.records} records" in caplog.text
    assert again.ready("broken", "e") == ["e"] and again.cache["broken"].records == 0
    assert counted == ["restored", "unreadable"]


def test_a_head_past_a_message_s_size_is_stored_in_parts_and_restores_whole(monkeypatch):
    """A run's head grows with its GPUs; past the largest table value (a changelog message)
    it is stored in parts, each within the bound. A checkpoint cut after its parts, before
    the run's key, restores the previous head whole; one that completes restores as a
    never-stopped detector; a head that fits again leaves no part; retiring the run clears
    every part."""
    from steplens.stream_jobs.engine.signals.registry import DetectorConfig
    from steplens.stream_jobs.worker import store as store_module
    from steplens.stream_jobs.worker.store import RunStore

    monkeypatch.setattr(store_module, "MAX_VALUE", 512)
    recs = records()
    table = TornTable()
    store, det = _checkpoint_cut(table, recs)  # cut after the second head's parts
    assert len(det.dump([])[0]) > 3 * 512  # the head is in several parts
    assert all(len(v) <= 512 for k, v in table.items() if not k.startswith(b"r\x1frank:"))
    again = RunStore(table, DetectorConfig(), checkpoint_s=0.0)
    assert again.ready("r", "event") == ["event"]
    reference = RunDetector("r")
    replay(reference, recs[:300])
    assert again.cache["r"].records == reference.records

    store.checkpoint("r")  # completes: the newer head, its parts in the other slot
    third = RunStore(table, DetectorConfig(), checkpoint_s=0.0)
    assert third.ready("r", "event") == ["event"]
    back = third.cache["r"]
    back.fit_inline = True
    replay(reference, recs[300:CUT])
    assert back.records == reference.records
    assert_close(replay(back, recs[CUT:]), replay(reference, recs[CUT:]), rel=0, abs_=0)

    monkeypatch.setattr(store_module, "MAX_VALUE", 1 << 20)  # the head fits in one value again
    third.checkpoint("r")
    assert not [k for k in table if k.startswith(b"r\x1fhead:")]
    fourth = RunStore(table, DetectorConfig(), checkpoint_s=0.0)
    assert fourth.ready("r", "e") == ["e"] and fourth.cache["r"].records == back.records > 0

    third._retire("r")
    assert not [k for k in table if k == b"r" or k.startswith(b"r\x1f")]


class SlowTable(dict):
    """A table whose writes take ``write_s`` of ``clock``'s time each."""

    def __init__(self, clock: list[float], write_s: float) -> None:
        super().__init__()
        self.clock, self.write_s = clock, write_s

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.clock[0] += self.write_s
        super().__setitem__(key, value)


def test_a_slow_checkpoint_spaces_its_run_s_next_ones(monkeypatch):
    """A run whose checkpoint took long (a wide run) is checkpointed again no sooner than
    ``CHECKPOINT_SPACING`` times that later, not every ``checkpoint_s``: its checkpoints take
    at most about that share of the worker's time. A quick one keeps ``checkpoint_s``."""
    from types import SimpleNamespace

    from steplens.stream_jobs.engine.signals.registry import DetectorConfig
    from steplens.stream_jobs.worker import store as store_module
    from steplens.stream_jobs.worker.store import CHECKPOINT_SPACING, RunStore

    clock = [1000.0]
    monkeypatch.setattr(store_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    assert CHECKPOINT_SPACING >= 10
    for write_s, due_after in (
        (0.3, 3 * 0.3 * CHECKPOINT_SPACING),
        (0.001, 5.0),
    ):  # 3 writes: 2 ranks, a head
        table = SlowTable(clock, write_s)
        store = RunStore(table, DetectorConfig(), checkpoint_s=5.0)
        det = store.cache["r"] = RunDetector("r", fit_inline=True)
        replay(det, records()[:50])
        assert [run for run, _ in store.hold(0, "r", "first")] == ["r"]  # never saved: now
        store.checkpoint("r")
        assert sorted(table) == sorted([b"r", *(f"r\x1frank:{k}".encode() for k in (0, 1))])
        clock[0] += due_after - 0.01
        assert store.hold(0, "r", "second") == [] and store.quiet_runs() == []
        clock[0] += 0.02
        assert store.quiet_runs() == ["r"]
        assert store.hold(0, "r", "third") == [("r", ["second", "third"])]
