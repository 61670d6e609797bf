"""Each detector's one columnar ``update`` against its per-value reference
(``tests/stream_jobs/reference``): the same signals and state for any series, split into
batches anywhere (one value at a time included); and ``RunDetector`` split-invariant: any
batching of the same steps (step records, step batches, columns) gives the same signals,
alerts and state."""

from __future__ import annotations

import copy
import itertools
import math
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import arima_ref, lr_ref, spike_ref, volatility_ref

from steplens.stream_jobs.engine.columns import entry_columns
from steplens.stream_jobs.engine.core import Column, flatten, row_views
from steplens.stream_jobs.engine.detector import RunDetector
from steplens.stream_jobs.engine.signals import arima, lr_schedule, spike, volatility
from steplens.stream_jobs.engine.signals.registry import DetectorConfig


def col(xs, lo: int, hi: int, rank: int = -1, **kw) -> Column:
    """Values ``xs[lo:hi]`` at steps ``lo..hi-1``, as a detector's column."""
    steps = np.arange(lo, hi, dtype=np.int64)
    return Column(np.array(xs[lo:hi], dtype=float), steps, steps - lo, rank, **kw)


def row_signals(batch, n):
    return [row_views(batch, i) for i in range(n)]


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def series(draw: st.DrawFn, min_size: int = 0, max_size: int = 300) -> list[float]:
    """Series of the shapes the detectors meet: noise around a level, drifts, steps, ties,
    near-zero values and spikes."""
    n = draw(st.integers(min_size, max_size))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    shape = draw(st.sampled_from(["noise", "walk", "ties", "tiny", "drawn"]))
    if shape == "drawn":
        return draw(st.lists(finite, min_size=n, max_size=n))
    level = draw(st.sampled_from([0.0, 1e-9, 1.0, 3.5, -2.0, 1e5]))
    out, x = [], level
    for _ in range(n):
        if shape == "noise":
            x = level + rng.gauss(0, abs(level) * 0.01 + 1e-3)
        elif shape == "walk":
            x += rng.gauss(0.001, 0.05)
        elif shape == "ties":
            x = float(rng.choice([1, 1, 1, 2, 3]))
        else:
            x = rng.gauss(0, 1e-9)
        if rng.random() < 0.03:
            x *= rng.choice([10.0, 100.0, -5.0, 0.0])
        out.append(x)
    return out


def cuts(draw: st.DrawFn, n: int) -> list[int]:
    """Batch boundaries over ``n`` values."""
    points = draw(st.lists(st.integers(0, max(n, 0)), max_size=4))
    return sorted({0, n, *points})


def spike_configs() -> st.SearchStrategy[spike.SpikeConfig]:
    return st.builds(
        spike.SpikeConfig,
        window=st.sampled_from([4, 5, 8, 64]),
        warmup=st.sampled_from([2, 4, 16]),
        rescale_every=st.sampled_from([1, 3, 16]),
        direction=st.sampled_from(["up", "both"]),
        trend_tolerant=st.booleans(),
    )


@settings(max_examples=150, deadline=None)
@given(spike_configs(), series(), st.data())
def test_spike_equals_the_reference(cfg, xs, data):
    one, many = spike_ref.SpikeState(), spike.SpikeState()
    want = [spike_ref.update(one, cfg, "m", x, i, 3)[1][0] for i, x in enumerate(xs)]
    got = []
    bounds = cuts(data.draw, len(xs))
    for lo, hi in itertools.pairwise(bounds):
        got += spike.update(many, cfg, "m", col(xs, lo, hi, 3)).views()
    assert repr(got) == repr(want)  # nan == nan as text
    assert list(many.values) == list(one.values)
    assert list(many.ordered) == list(one.ordered)
    assert list(many.diffs) == list(one.diffs)
    assert (many.scale, many.since_rescale) == (one.scale, one.since_rescale)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([4, 10, 50]), series(), st.data())
def test_volatility_equals_the_reference(window, xs, data):
    cfg = volatility.VolatilityConfig(window=window)
    one, many = volatility_ref.VolatilityState(), volatility.VolatilityState()
    want = [volatility_ref.update(one, cfg, "loss", x, i)[1][0] for i, x in enumerate(xs)]
    got = []
    bounds = cuts(data.draw, len(xs))
    for lo, hi in itertools.pairwise(bounds):
        got += volatility.update(many, cfg, "loss", col(xs, lo, hi)).views()
    assert repr(got) == repr(want)  # nan == nan as text
    assert (list(many.values), list(many.diffs)) == (list(one.values), list(one.diffs))
    assert list(many.sums) == [one.sum_v, one.sum_d, one.sum_d2]


SCHEDULES = [
    None,
    {"kind": "cosine", "peak_lr": 3e-4, "min_lr": 3e-5, "warmup_steps": 20, "total_steps": 300},
    {"kind": "step", "peak_lr": 1e-3, "warmup_steps": 0, "milestones": [100, 200], "gamma": 0.1},
]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(SCHEDULES), st.integers(0, 2**32 - 1), st.data())
def test_lr_equals_the_reference(schedule, seed, data):
    """Learning rates that follow the schedule, then deviate (jumps, a wrong decay, and in
    some series a non-finite value): the same signals, details (where a deviation started)
    and state."""
    rng = random.Random(seed)
    odd = [5.0, 0.1, math.inf, math.nan] if data.draw(st.booleans()) else [5.0, 0.1]
    steps_ = list(range(300))
    follow = lr_schedule.expected_lr(schedule, 0) if schedule else 1e-4
    xs = []
    for i in steps_:
        want = lr_schedule.expected_lr(schedule, i) if schedule else follow * (1 + i / 100)
        x = (want or 0.0) * (1 + rng.gauss(0, 0.02))
        if rng.random() < 0.05:
            x *= rng.choice(odd)
        xs.append(x)
    cfg = lr_schedule.LrConfig(step_offset=data.draw(st.sampled_from([1, 0, 3])))
    one, many = lr_ref.LrState(schedule), lr_schedule.LrState(schedule)
    want = [lr_ref.update(one, cfg, x, i, 2)[1][0] for i, x in zip(steps_, xs, strict=True)]
    got = []
    for lo, hi in itertools.pairwise(cuts(data.draw, len(xs))):
        got += lr_schedule.update(many, cfg, "lr", col(xs, lo, hi, 2)).views()
    assert [repr(g) for g in got] == [repr(w) for w in want]  # nan == nan as text
    assert any(w.detail for w in want)  # deviations were met
    assert (list(many.recent), many.deviating_since) == (list(one.recent), one.deviating_since)


def _fake_fit(history, order: tuple[int, int, int]) -> arima.ArimaParams | None:
    """A model from the history without statsmodels: the same for both, and sometimes none
    (a failed fit)."""
    h = list(history)
    if len(h) % 5 == 0:
        return None
    p, _, q = order
    spread = (max(h) - min(h)) or 1.0
    return arima.ArimaParams([0.3] * p, [-0.2] * q, (h[-1] - h[0]) / len(h), spread / 10)


def _arima_state(state) -> tuple:
    return (
        list(state.history),
        list(state.diffs),
        list(state.errors),
        state.last,
        state.mean,
        state.var,
        state.seen,
        state.next_fit,
        state.wants_fit,
        state.params,
        state.failed_fits,
        state.outside,
    )


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([(1, 1, 1), (2, 1, 1), (1, 0, 1), (2, 1, 2), (0, 1, 3)]),
    st.booleans(),
    st.booleans(),
    series(max_size=400),
    st.data(),
)
def test_arima_equals_the_reference(order, inline, failing, xs, data):
    """Fits applied as soon as asked (``steplens detect``) or where a batch ends (the pool's
    come back between messages), or failing every time: the same signals and state after
    every batch."""
    window = data.draw(st.sampled_from([256, 30]))
    cfg = arima.ArimaConfig(
        order=order, first_fit=20, refit_every=60, consecutive=2, fit_window=window, retry_after=5
    )

    def model(history):
        return None if failing else _fake_fit(history, order)

    one, many = arima_ref.ArimaState(), arima.ArimaState()
    bounds = cuts(data.draw, len(xs))
    want, after = [], []
    for lo, hi in itertools.pairwise(bounds):
        for i in range(lo, hi):
            want += arima_ref.update(one, cfg, "m", xs[i], i, 1)[1]
            if inline and one.wants_fit:
                arima_ref.apply_fit(one, cfg, model(one.history))
        if one.wants_fit:
            arima_ref.apply_fit(one, cfg, model(one.history))
        after.append(_arima_state(one))

    got = []
    for k, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        column = col(xs, lo, hi, 1, fitter=model if inline else None)
        got += arima.update(many, cfg, "m", column).views()
        assert column.asked == (not inline and many.wants_fit)
        if many.wants_fit:
            arima.apply_fit(many, cfg, model(many.history))
        assert _arima_state(many) == after[k]
    assert repr(got) == repr(want)  # nan == nan as text


cell = st.one_of(
    finite,
    st.sampled_from([None, math.nan, math.inf, -math.inf, 0.0, 1.0]),
)


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[int], dict[str, list[float | None]]]:
    names = draw(
        st.lists(
            st.sampled_from(
                ["loss", "grad_norm", "lr", "step_time_s", "update_ratio", "param_norm", "q"]
            ),
            min_size=1,
            max_size=5,
            unique=True,
        )
    )
    n = draw(st.integers(0, 250))
    cols: dict[str, list[float | None]] = {}
    for name in names:
        base = draw(series(min_size=n, max_size=n))
        holes = draw(st.lists(st.tuples(st.integers(0, max(n - 1, 0)), cell), max_size=6))
        col: list[float | None] = list(base)
        for i, v in holes:
            if i < n:
                col[i] = v
        cols[name] = col
    steps = sorted(draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n)))
    return steps, cols


@settings(max_examples=80, deadline=None)
@given(tables(), st.data())
def test_columns_equal_rows(table, data):
    """Signals and alerts of ``process_columns`` + ``evaluate_rows`` over chunks equal those of
    the same rows one at a time, with the ARIMA fits of statsmodels."""
    steps, cols = table
    cfg = DetectorConfig()
    cfg.spike = spike.SpikeConfig(window=8, warmup=4, rescale_every=3)
    cfg.generic_spike = spike.SpikeConfig(window=8, warmup=4, direction="both")
    cfg.arima = arima.ArimaConfig(first_fit=24, refit_every=50)
    cfg.volatility = volatility.VolatilityConfig(window=10)
    by_row = RunDetector("r", copy.deepcopy(cfg), generic=True)
    by_col = RunDetector("r", copy.deepcopy(cfg), generic=True)
    want_sigs, want_alerts = [], []
    for i, step in enumerate(steps):
        metrics = {k: [v[i]] for k, v in cols.items() if v[i] is not None}
        batch = by_row.process_columns(0, [step], [step * 1000], metrics)
        want_sigs.append(row_views(batch, 0))
        row_alerts = next(by_row.evaluate_rows(batch, 1))
        for a in row_alerts:
            a.time_ns = step * 1000
        want_alerts.append((row_alerts, bool(by_row.rules.firing)))
    got_sigs, got_alerts = [], []
    bounds = cuts(data.draw, len(steps))
    for lo, hi in itertools.pairwise(bounds):
        part_cols = {k: v[lo:hi] for k, v in cols.items()}
        times = [s * 1000 for s in steps[lo:hi]]
        batch = by_col.process_columns(0, steps[lo:hi], times, part_cols)
        got_sigs += row_signals(batch, hi - lo)
        for i, alerts in enumerate(by_col.evaluate_rows(batch, hi - lo)):
            for a in alerts:
                a.time_ns = times[i]
            got_alerts.append((alerts, bool(by_col.rules.firing)))
    assert repr(got_sigs) == repr(want_sigs)  # nan == nan as text
    assert repr(got_alerts) == repr(want_alerts)
    assert repr(by_col.rules) == repr(by_row.rules)  # evidence may hold a nan
    assert by_col.run.train_loss == by_row.run.train_loss


@st.composite
def step_entries(draw: st.DrawFn) -> list[dict]:
    """Step records of one rank as a step_batch carries them: the producer's field order, fields
    present or not, a spike or a non-finite value now and then, scalars."""
    n = draw(st.integers(1, 200))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    have = draw(
        st.sets(st.sampled_from(["loss", "lr", "grad_norm", "step_time_s", "data_time_s", "pn"]))
    )
    entries = []
    loss = 4.0
    for i in range(n):
        e: dict = {"step": 10 + i, "time_ns": (10 + i) * 10**8}
        if "loss" in have and rng.random() < 0.95:
            loss *= 0.999
            e["loss"] = loss + rng.gauss(0, 0.01) if rng.random() > 0.02 else loss * 20
        if "lr" in have:
            e["lr"] = 3e-4 if rng.random() > 0.01 else math.nan
        if "grad_norm" in have:
            e["grad_norm"] = abs(rng.gauss(1.0, 0.1)) * (30 if rng.random() < 0.02 else 1)
        e["tokens"] = 4096
        if "step_time_s" in have:
            e["step_time_s"] = 0.1 + abs(rng.gauss(0, 0.01)) * (40 if i > n // 2 else 1)
        if "data_time_s" in have:
            e["data_time_s"] = 0.08 if i > n // 2 else 0.001
        if "pn" in have:
            e["param_norm"] = 100.0 + rng.gauss(0, 1)
            e["update_ratio"] = abs(rng.gauss(0.01, 0.005))
            e["clipped"] = rng.random() < 0.1
        if rng.random() < 0.5:
            e["scalars"] = {"aux_loss": rng.gauss(0.5, 0.01), "loss": 99.0}
        entries.append(e)
    return entries


@settings(max_examples=60, deadline=None)
@given(step_entries(), st.data())
def test_step_batch_entries_equal_step_records(entries, data):
    """A step_batch's entries scored together give each step record's signals and alerts."""
    from steplens.schema import make_record

    cfg = DetectorConfig()
    cfg.arima = arima.ArimaConfig(first_fit=24, refit_every=50)
    one = RunDetector("r", copy.deepcopy(cfg))
    many = RunDetector("r", copy.deepcopy(cfg))
    want_sigs, want_alerts = [], []
    for e in entries:
        fields = {k: v for k, v in e.items() if k not in ("step", "time_ns")}
        rec = make_record("step", fields, run_id="r", rank=1, step=e["step"], time_ns=e["time_ns"])
        sigs, alerts = one.process(rec)
        want_sigs.append(row_views(sigs, 0))
        want_alerts += alerts
    got_sigs, got_alerts = [], []
    bounds = cuts(data.draw, len(entries))
    for lo, hi in itertools.pairwise(bounds):
        batch, alerts = many.process_entries(1, entries[lo:hi])
        got_sigs += row_signals(batch, hi - lo)
        got_alerts += alerts
    # the same signals for every step, and the same alerts (within a step, the batch's column
    # order may differ from a record's field order)
    assert [sorted(map(repr, row)) for row in got_sigs] == [
        sorted(map(repr, row)) for row in want_sigs
    ]
    assert sorted(map(repr, got_alerts)) == sorted(map(repr, want_alerts))
    assert [(a.step, a.time_ns) for a in got_alerts] == [(a.step, a.time_ns) for a in want_alerts]
    assert many.records == one.records
    assert many.ranks == one.ranks


def loss_spike_entries(rng: random.Random, spikes: set[int], n: int) -> list[dict]:
    """``n`` steps of one rank with a loss of 60 at ``spikes`` and noise around 2 elsewhere."""
    return [
        {
            "step": i,
            "time_ns": 10 + i,
            "loss": 60.0 if i in spikes else 2.0 + rng.gauss(0, 0.01),
            "grad_norm": 1.0 + rng.gauss(0, 0.05),
        }
        for i in range(n)
    ]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.data())
def test_quiet_steps_while_alerts_fire_equal_step_records(seed, data):
    """Quiet steps while alerts fire (a GPU-memory alert from a hardware record, loss spikes
    that resolve after the correlation window): batches give the step records' alerts."""
    from steplens.schema import make_record
    from steplens.stream_jobs.engine.rules import RulesConfig

    rng = random.Random(seed)
    cfg = DetectorConfig()
    cfg.rules = RulesConfig(resolve_after=30, correlation_steps=20)
    one, many = RunDetector("r", copy.deepcopy(cfg)), RunDetector("r", copy.deepcopy(cfg))
    gpu = {"index": 0, "mem_used_bytes": 95, "mem_total_bytes": 100}
    hw = make_record("hw", {"gpus": [gpu]}, run_id="r", rank=1, time_ns=1)
    spikes = {start + rng.randrange(40) for start in (100, 200, 300)}  # each resolves
    entries = loss_spike_entries(rng, spikes, 400)
    want = one.process(hw)[1]
    got = many.process(hw)[1]
    for e in entries:
        fields = {k: v for k, v in e.items() if k not in ("step", "time_ns")}
        rec = make_record("step", fields, run_id="r", rank=1, step=e["step"], time_ns=e["time_ns"])
        want += one.process(rec)[1]
    for lo, hi in itertools.pairwise(cuts(data.draw, len(entries))):
        got += many.process_entries(1, entries[lo:hi])[1]
    assert sorted(map(repr, got)) == sorted(map(repr, want))
    assert [(a.step, a.state) for a in got] == [(a.step, a.state) for a in want]
    assert many.rules == one.rules
    assert any(a.state == "resolved" and a.rule == "spike:loss" for a in want)


def test_a_straggler_is_found_when_every_rank_sends_its_steps_in_batches():
    """Each rank's batch arrives before the others' batches of the same steps: its steps wait
    for them instead of being judged alone."""
    det = RunDetector("r")
    det.ranks.world_size = 4
    alerts = []
    judged = 0
    for b in range(6):
        for rank in range(4):
            entries = [
                {
                    "step": s,
                    "time_ns": s * 10**8,
                    "step_time_s": 0.1 * (2.0 if rank == 2 and s >= 100 else 1.0),
                    "loss": 2.0,
                }
                for s in range(b * 50, b * 50 + 50)
            ]
            batch, got = det.process_entries(rank, entries)
            alerts += got
            judged += sum(s.name == "straggler" for s in flatten(batch))
    firing = {
        m["scope"]
        for a in alerts
        if a.state == "firing"
        for m in a.evidence["members"]
        if m["rule"] == "straggler:step_time_s"
    }
    assert firing == {"rank:2"}
    assert judged >= 4 * 250  # every rank's time of nearly every step judged with the others


def test_a_batch_cut_short_does_not_split_the_steps_of_the_ranks_behind_it():
    """Ranks flush batches of 40 steps at staggered steps, and rank 3 flushes early at steps
    where its loss spikes (as the producer does at a guard spike): its short batches are then
    ahead of ranks still filling a whole one. Every step is still judged once, with all six
    ranks, against the median of all six, as when every rank's time of a step comes before
    the next step."""
    n_ranks, n_steps, width = 6, 400, 40
    rng = random.Random(7)
    times = [[0.1 + rng.gauss(0, 0.002) for _ in range(n_steps)] for _ in range(n_ranks)]
    cut_at = {130, 131, 250}
    batches: list[tuple[int, int, list[dict]]] = []  # (step sent at, rank, entries)
    for rank in range(n_ranks):
        entries: list[dict] = []
        length = width - rank * 6  # the ranks' batches do not end together
        for s in range(n_steps):
            e = {"step": s, "time_ns": s * 10**8, "step_time_s": times[rank][s], "loss": 2.0}
            entries.append(e)
            if (rank == 3 and s in cut_at) or len(entries) >= length or s == n_steps - 1:
                batches.append((s, rank, entries))
                entries, length = [], width
    batches.sort(key=lambda b: b[0])  # in the order they are sent

    def stragglers(batch: list) -> list:
        return [(g.step, g.rank, g.expected) for g in flatten(batch) if g.name == "straggler"]

    det = RunDetector("r")
    det.ranks.world_size = n_ranks
    got = []
    for _, rank, entries in batches:
        parts, _ = det.process_entries(rank, entries)
        got += stragglers(parts)
    ref = RunDetector("r")
    ref.ranks.world_size = n_ranks
    want = []
    for s in range(n_steps):  # all ranks' time of a step before the next step
        for rank in range(n_ranks):
            e = {"step": s, "time_ns": s * 10**8, "step_time_s": times[rank][s], "loss": 2.0}
            parts, _ = ref.process_entries(rank, [e])
            want += stragglers(parts)
    assert sorted(got) == sorted(want)
    per_step: dict[int, int] = {}
    for step, _, _ in got:
        per_step[step] = per_step.get(step, 0) + 1
    assert per_step == dict.fromkeys(range(n_steps), n_ranks)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 40), st.data())
def test_alerts_resolved_in_quiet_batches_equal_step_records(seed, resolve_after, data):
    """Loss spikes whose alerts (spike, volatility) resolve in batches without a breach, while
    nothing correlates: each resolves at the same step as from the step records, and the
    rules' state after every batch is the same."""
    from steplens.schema import make_record
    from steplens.stream_jobs.engine.rules import RulesConfig

    rng = random.Random(seed)
    cfg = DetectorConfig()
    cfg.rules = RulesConfig(resolve_after=resolve_after, correlation_steps=1)
    one, many = RunDetector("r", copy.deepcopy(cfg)), RunDetector("r", copy.deepcopy(cfg))
    spikes = {100 + 60 * k + rng.randrange(20) for k in range(5)}
    entries = loss_spike_entries(rng, spikes, 450)
    bounds = sorted({0, len(entries), *data.draw(st.lists(st.integers(0, 450), max_size=40))})
    want: list = []
    got: list = []
    for lo, hi in itertools.pairwise(bounds):
        for e in entries[lo:hi]:
            fields = {k: v for k, v in e.items() if k not in ("step", "time_ns")}
            rec = make_record(
                "step", fields, run_id="r", rank=1, step=e["step"], time_ns=e["time_ns"]
            )
            want += one.process(rec)[1]
        got += many.process_entries(1, entries[lo:hi])[1]
        assert many.rules == one.rules
    assert [(a.rule, a.scope, a.step, a.state) for a in got] == [
        (a.rule, a.scope, a.step, a.state) for a in want
    ]
    # every spike fires (a spike that comes while the last one's volatility still fires joins
    # its incident), and the incidents resolve
    started = {m["started_step"] for a in want for m in a.evidence["members"]}
    assert spikes <= started
    assert sum(a.state == "resolved" for a in want) >= 1


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(4, 8),
    st.integers(12, 60),
    st.sampled_from([2, 5, 20]),
)
def test_stragglers_of_batches_equal_the_reference_and_rules_read_them_in_part(
    seed, n_ranks, batch, resolve_after
):
    """Many ranks' step_batches, in a new order each time, with a rank straggling on and off
    and loss spikes (alerts that fire, resolve and correlate): each straggler signal is its
    step's judgement (the rank's time against the median of the step's, typical over its last
    ``straggler_steps``), and the rules, which read a row's many straggler signals only in part,
    give the alerts and state of the rules fed every signal of every row."""
    import statistics
    from collections import deque

    from steplens.stream_jobs.engine import rules
    from steplens.stream_jobs.engine.rules import RulesConfig

    rng = random.Random(seed)
    cfg = DetectorConfig(arima_enabled=False)
    cfg.rules = RulesConfig(resolve_after=resolve_after)
    det = RunDetector("r", copy.deepcopy(cfg))
    det.ranks.world_size = n_ranks
    ref_rules = rules.RulesState()
    slow, period, shift = rng.randrange(n_ranks), rng.randrange(30, 90), rng.randrange(90)
    times: dict[int, dict[int, float]] = {}
    recent: dict[int, deque] = {}
    judged, alerts = 0, []
    for b in range(480 // batch):
        for rank in rng.sample(range(n_ranks), n_ranks):
            entries = []
            for s in range(b * batch, (b + 1) * batch):
                t = 0.1 + rng.random() * 0.01
                if rank == slow and (s + shift) // period % 2 == 1:
                    t *= 3
                times.setdefault(s, {})[rank] = t
                loss = 2.0 - s * 1e-3 + rng.gauss(0, 0.01)
                if rng.random() < 0.01:
                    loss *= 10
                entries.append(
                    {
                        "step": s,
                        "time_ns": s * 10**8,
                        "step_time_s": t,
                        "loss": loss,
                        "grad_norm": abs(1.0 + rng.gauss(0, 0.05)),
                    }
                )
            sigs = det.process_columns(
                rank,
                [e["step"] for e in entries],
                [e["time_ns"] for e in entries],
                entry_columns(entries),
                behind=batch - 1,
            )
            got = [a for row in det.evaluate_rows(sigs, len(entries)) for a in row]
            want = []
            for i in range(len(entries)):
                want += rules.evaluate(ref_rules, cfg.rules, "r", row_views(sigs, i))[1]
            assert [(a.rule, a.scope, a.step, a.state) for a in got] == [
                (a.rule, a.scope, a.step, a.state) for a in want
            ]
            assert det.rules == ref_rules
            for g in flatten(sigs):
                if g.name != "straggler":
                    continue
                judged += 1
                med = statistics.median(times[g.step].values())
                assert len(times[g.step]) == n_ranks
                d = recent.setdefault(g.rank, deque(maxlen=cfg.ranks.straggler_steps))
                d.append(times[g.step][g.rank] / med)
                assert (g.expected, g.value) == (med, statistics.median(d))
                slow_now = len(d) == d.maxlen and g.value > cfg.ranks.straggler_factor
                assert (g.severity is not None) == slow_now
            alerts += got
    assert judged > 0
    straggled = [a.state for a in alerts if a.rule == "straggler:step_time_s"]
    assert "firing" in straggled and "resolved" in straggled
