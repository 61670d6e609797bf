from steplens.stream_jobs.engine.core import Signal
from steplens.stream_jobs.engine.rules import RulesConfig, RulesState, evaluate, fingerprint


def sig(step, severity=None, name="spike", metric="loss", scope="run", rank=0):
    return Signal(name, metric, step, 1.0, 0.9 if severity else 0.1, rank, scope, severity)


def run(batches, cfg=None):
    st = RulesState()
    out = []
    for sigs in batches:
        st, alerts = evaluate(st, cfg or RulesConfig(), "run-1", sigs)
        out += alerts
    return st, out


def test_long_incident_is_one_alert_then_resolves():
    batches = [[sig(i, "critical" if 10 <= i < 40 else None)] for i in range(60)]
    _, alerts = run(batches)
    assert [(a.rule, a.state, a.step, a.started_step) for a in alerts] == [
        ("spike:loss", "firing", 10, 10),
        ("spike:loss", "resolved", 49, 10),
    ]
    assert (
        alerts[0].fingerprint == alerts[1].fingerprint == fingerprint("run-1", "spike:loss", "run")
    )
    assert "batch" in alerts[0].hint and alerts[0].evidence["rank"] == 0


def test_scopes_are_deduplicated_separately():
    batches = [
        [
            sig(1, "warning", "straggler", "step_time_s", "rank:1", 1),
            sig(1, "warning", "straggler", "step_time_s", "rank:2", 2),
        ],
        [sig(2, "warning", "straggler", "step_time_s", "rank:1", 1)],
    ]
    _, alerts = run(batches)
    assert sorted(a.scope for a in alerts) == ["rank:1", "rank:2"]


def test_nonfinite_without_clean_signals_resolves_by_step():
    batches = [[sig(5, "critical", "nonfinite")]] + [
        [sig(i, None, "spike", "grad_norm")] for i in range(6, 30)
    ]
    _, alerts = run(batches)
    assert [(a.rule, a.state) for a in alerts] == [
        ("nonfinite:loss", "firing"),
        ("nonfinite:loss", "resolved"),
    ]


def test_a_correlation_a_window_fires_covers_the_windows_span():
    """A window's loss and gradient breaches name the first step they cover (``span_first``);
    the correlation they fire is an aggregate over the same span, so an incident of those
    steps already paged and resolved takes it as evidence instead of paging again (as a
    spike of the window does; incidents.span_of)."""
    window = [sig(999, "warning"), sig(999, "warning", metric="grad_norm")]
    for s in window:
        s.detail = {"span_first": 900}
    _, alerts = run([[sig(i), sig(i, metric="grad_norm")] for i in range(800, 999)] + [window])
    corr = [a for a in alerts if a.rule == "correlation:loss_grad"]
    assert [(a.state, a.evidence.get("span_first")) for a in corr] == [("firing", 900)]
    # of raw steps, a correlation covers no span
    _, alerts = run(
        [[sig(i), sig(i, metric="grad_norm")] for i in range(800, 999)]
        + [[sig(999, "warning"), sig(999, "warning", metric="grad_norm")]]
    )
    corr = [a for a in alerts if a.rule == "correlation:loss_grad"]
    assert [(a.state, a.evidence.get("span_first")) for a in corr] == [("firing", None)]


def test_loss_and_grad_together_fire_the_correlation_with_the_hint():
    batches = [
        [
            sig(i, "critical" if i == 20 else None),
            sig(i, "warning" if i == 21 else None, metric="grad_norm"),
        ]
        for i in range(40)
    ]
    _, alerts = run(batches)
    corr = [a for a in alerts if a.rule == "correlation:loss_grad"]
    assert corr and corr[0].state == "firing" and corr[0].step == 21
    assert "data pipeline first" in corr[0].hint


def test_escalation_keeps_one_alert():
    batches = [[sig(1, "warning")], [sig(2, "critical")]]
    st, alerts = run(batches)
    assert len(alerts) == 1
    assert st.firing[("spike:loss", "run")].severity == "critical"


def test_loss_grad_correlation_holds_while_both_move_and_its_incident_ends_with_it():
    # a long lr blow-up: the loss keeps breaching on and off, the gradient norm only at the
    # start and again much later; hardware samples (no step) arrive in between
    from steplens.stream_jobs.engine.incidents import IncidentsConfig, IncidentsState, update

    batches = []
    for i in range(60, 320):
        sigs = [sig(i, "warning" if 100 <= i <= 250 and i % 15 == 10 else None, "arima", "loss")]
        sigs.append(sig(i, "critical" if i in (105, 200) else None, "spike", "grad_norm"))
        batches.append(sigs)
        if i % 7 == 0:
            batches.append([sig(None, None, "threshold", "gpu_util", scope="host")])
    _, alerts = run(batches)
    corr = [a for a in alerts if a.rule == "correlation:loss_grad"]
    # the correlation holds while both parts moved in the last 20 steps, resolves 10 later
    assert [(a.state, a.step, a.started_step) for a in corr] == [
        ("firing", 105, 100),
        ("resolved", 135, 100),
        ("firing", 200, 190),
        ("resolved", 230, 190),
    ]
    # each gradient jump is an incident that resolves with its correlation: the loss's forecast
    # excursions on and off in between follow the event, they neither hold it open nor page
    state = IncidentsState()
    reports = [r for a in alerts for r in update(state, IncidentsConfig(), [a])]
    training = [r for r in reports if r.evidence["topic"] == "training"]
    assert [(r.state, r.started_step) for r in training if r.state == "resolved"] == [
        ("resolved", 100),
        ("resolved", 200),
    ]
    assert [r.step for r in training if r.state == "resolved"] == [135, 230]
    assert len({r.fingerprint for r in training}) == 2


def grid_of(rng, steps, n_ranks, p_breach):
    """Straggler signals of every rank of each of ``steps`` on one batch row, with breaches
    where ``rng`` puts them, each step's ranks in a shuffled order or not."""
    import numpy as np

    from steplens.stream_jobs.engine.core import Signals

    ranks = rng.sample(range(100), n_ranks)
    shuffled = rng.random() < 0.5
    at, rank, value, breach = [], [], [], []
    for step in steps:
        for k in rng.sample(range(n_ranks), n_ranks) if shuffled else range(n_ranks):
            at.append(step)
            rank.append(ranks[k])
            value.append(rng.uniform(0.5, 3.0))
            breach.append(rng.random() < p_breach)
    v = np.array(value)
    return Signals.of(
        "straggler",
        "step_time_s",
        np.zeros(len(at), dtype=np.int64),
        np.array(at, dtype=np.int64),
        v,
        v / (v + 1.0),
        np.where(breach, 2, 0),
        1.0,
        None,
        1.5,
        np.array(rank, dtype=np.int64),
        [f"rank:{r}" for r in rank],
    )


def test_the_rules_read_of_many_signals_of_a_row_is_the_read_of_every_one():
    """What the rules take of a row's many straggler signals (breaches, the ranks that fire
    or breach, the largest step and the last signal; the firing ranks' alone in a quiet row)
    changes their state and alerts as every signal of it does, with ranks firing before it,
    correlations open or not, and rows with or without breaches."""
    import copy
    import random

    from steplens.stream_jobs.engine.batch_rules import evaluate_batch
    from steplens.stream_jobs.engine.rules import Firing

    rng = random.Random(7)
    resolved = 0
    for _ in range(400):
        start, n_steps, n_ranks = rng.randrange(0, 50), rng.randrange(1, 30), rng.randrange(4, 9)
        steps = range(start, start + n_steps)
        grid = grid_of(rng, steps, n_ranks, rng.choice([0.0, 0.0, 0.02, 0.2]))
        cfg = RulesConfig(resolve_after=rng.choice([1, 2, 5, 20]))
        state = RulesState(latest_step=start - 1)
        for scope in rng.sample(sorted(set(grid.scope)), rng.randrange(0, n_ranks)):
            last = start - rng.randrange(1, 25)
            state.firing[("straggler:step_time_s", scope)] = Firing("warning", last - 3, last)
        if rng.random() < 0.3:
            state.firing[("spike:loss", "run")] = Firing("critical", start - 2, start - 2)
        if rng.random() < 0.3:
            state.recent["spike:loss"] = start - 1
            state.correlating = True
        every, part = copy.deepcopy(state), copy.deepcopy(state)
        _, want = evaluate(every, cfg, "r", grid.views())
        got = next(evaluate_batch(part, cfg, "r", [grid], 1))
        assert (got, part) == (want, every)
        resolved += any(a.state == "resolved" and a.rule.startswith("straggler") for a in want)
    assert resolved > 20  # rows where a rank's quiet signals resolve what fired before


def test_a_quiet_record_while_correlating_reads_only_what_fires():
    """``quiet_while_correlating`` (the firing keys' signals, the last step and the largest
    one, after the row's ranks' steps are noted) changes the rules' state and alerts as
    ``evaluate`` of every signal does, for records
    without a breach while correlations are open or breaches recent."""
    import copy
    import random

    from steplens.stream_jobs.engine.rules import Firing, note_rank_steps, quiet_while_correlating

    rng = random.Random(11)
    rules_ = ["spike:loss", "spike:grad_norm", "volatility:loss", "arima:loss", "straggler:x"]
    changed = 0
    for _ in range(600):
        base = rng.randrange(20, 200)
        cfg = RulesConfig(resolve_after=rng.choice([1, 3, 10]), correlation_steps=20)
        state = RulesState(latest_step=base, correlating=True)
        for r in rng.sample(rules_, rng.randrange(0, 4)):
            state.recent[r] = base - rng.randrange(0, 30)
        for r in rng.sample(rules_, rng.randrange(0, 4)):
            last = base - rng.randrange(0, 25)
            scope = rng.choice(["run", "rank:1"])
            state.firing[(r, scope)] = Firing("warning", last - 2, last, rng.randrange(0, 3))
        if rng.random() < 0.3:
            state.firing[("correlation:loss_grad", "run")] = Firing("warning", base - 5, base - 5)
        sigs = []
        for _ in range(rng.randrange(1, 8)):
            name, metric = rng.choice(rules_).split(":")
            step = None if rng.random() < 0.1 else base + rng.randrange(-3, 15)
            sigs.append(sig(step, name=name, metric=metric, scope=rng.choice(["run", "rank:1"])))
        every, part = copy.deepcopy(state), copy.deepcopy(state)
        _, want = evaluate(every, cfg, "r", sigs)
        firing = [s for s in sigs if (s.rule, s.scope) in part.firing]
        steps = [s.step for s in sigs if s.step is not None]
        note_rank_steps(part, [(s.rank, s.step) for s in sigs])  # as the batch's rows do
        got = quiet_while_correlating(
            part, cfg, "r", firing, last=sigs[-1].step, top=max(steps) if steps else None
        )
        assert (got, part) == (want, every)
        changed += bool(want)
    assert changed > 50


def test_a_ranks_alert_is_swept_by_its_own_steps_not_another_ranks_batch_ahead():
    """Rank 1's data wait breaches at steps 100-120 of its batches; rank 0's batches run 40
    steps ahead (they are sent at other times). Rank 1's alert holds while rank 1's steps
    still breach, and resolves 10 of its own quiet steps after its last breach; a straggler (judged
    across ranks, behind both) is never resolved by steps alone until far behind."""
    wait = {"name": "threshold", "metric": "data_wait_share", "scope": "rank:1", "rank": 1}
    strag = {"name": "straggler", "metric": "step_time_s", "scope": "rank:1", "rank": 1}
    batches = []
    for k in range(100, 140):
        other = sig(k + 40, name="spike", metric="loss", scope="run", rank=0)
        mine = sig(k, "warning" if k <= 120 else None, **wait)
        batches.append([other, mine])
    batches.insert(1, [sig(100, "warning", **strag)])
    _, alerts = run(batches)
    got = [(a.rule, a.state, a.step) for a in alerts]
    assert ("threshold:data_wait_share", "resolved", 130) in got
    assert next(g for g in got if g[0] == "threshold:data_wait_share")[1] == "firing"
    assert all(g[0] != "straggler:step_time_s" or g[1] == "firing" for g in got)
    # a rank that stopped sending: swept once the run is ``sweep_lag`` steps past its alert
    _st, alerts = run([[sig(5, "warning", **wait)], [sig(5 + 12 + 200, name="spike", rank=0)]])
    assert [(a.rule, a.state) for a in alerts] == [
        ("threshold:data_wait_share", "firing"),
        ("threshold:data_wait_share", "resolved"),
    ]


def test_a_ranks_alert_is_not_swept_by_its_later_steps_judged_before_its_rows():
    """A straggler judged at rank 1's step 519 (when rank 0's batch arrived) comes before
    rank 1's own rows 506-510 are read: the rows' data wait, breaching at each, fires once
    and holds; none is swept by the later step."""
    strag = {"name": "straggler", "metric": "step_time_s", "scope": "rank:1", "rank": 1}
    wait = {"name": "threshold", "metric": "data_wait_share", "scope": "rank:1", "rank": 1}
    batches = [[sig(519, "warning", **strag), sig(505, name="spike", rank=0)]]  # a row's last
    batches += [[sig(k, "warning", **wait)] for k in range(506, 511)]
    _, alerts = run(batches)
    got = [(a.rule, a.state) for a in alerts if a.rule == "threshold:data_wait_share"]
    assert got == [("threshold:data_wait_share", "firing")]
