from steplens.stream_jobs.core import Signal
from steplens.stream_jobs.rules import RulesConfig, RulesState, evaluate, fingerprint


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


def test_loss_grad_correlation_is_one_alert_for_a_long_incident_with_steps():
    # a long lr blow-up: the loss keeps breaching on and off, the gradient norm only at the
    # start and again much later; hardware samples (no step) arrive in between
    batches = []
    for i in range(60, 320):
        sigs = [sig(i, "warning" if 100 <= i <= 250 and i % 15 == 10 else None, "arima", "loss")]
        sigs.append(sig(i, "critical" if i in (105, 200) else None, "spike", "grad_norm"))
        batches.append(sigs)
        if i % 7 == 0:
            batches.append([sig(None, None, "threshold", "gpu_util", scope="host")])
    _, alerts = run(batches)
    corr = [a for a in alerts if a.rule == "correlation:loss_grad"]
    assert [(a.state, a.step, a.started_step) for a in corr] == [
        ("firing", 105, 100),
        ("resolved", 280, 100),
    ]
