"""Evaluation metrics and alerts mirrored into MLflow's local file store."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

pytest.importorskip("mlflow")

from mlflow.exceptions import MlflowException

from steplens.schema import encode, make_record
from steplens.sinks.mlflow_mirror import RUN_TAG, MlflowMirror, run_mirror


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def _eval(run_id, step, loss, accuracy, seq=0):
    return make_record(
        "eval",
        {"split": "val", "loss": loss, "perplexity": 2.718281828**loss, "accuracy": accuracy},
        run_id=run_id,
        step=step,
        seq=seq,
        time_ns=1_700_000_000_000_000_000 + step * 1_000_000_000,
    )


def _alert(run_id, step, state, severity="critical"):
    return make_record(
        "alert",
        {
            "rule": "spike:loss",
            "severity": severity,
            "state": state,
            "scope": "run",
            "hint": "loss spike: inspect the batch",
            "fingerprint": "fp01",
            "started_step": 100,
        },
        run_id=run_id,
        rank=-1,
        step=step,
        time_ns=1_700_000_000_000_000_000 + step * 1_000_000_000,
    )


def test_evals_and_alerts_land_in_one_mlflow_run_per_steplens_run(tracking_uri):
    mirror = MlflowMirror(tracking_uri, experiment="t")
    used = mirror.handle(
        [
            _eval("r1", 10, 3.0, 0.2),
            _eval("r1", 20, 2.5, 0.4),
            _eval("r2", 10, 4.0, 0.1),
            _alert("r1", 101, "firing"),
            _alert("r1", 115, "resolved"),
        ]
    )
    assert used == 5
    c = mirror.client
    runs = {r.data.tags[RUN_TAG]: r for r in c.search_runs([mirror.experiment_id])}
    assert set(runs) == {"r1", "r2"}
    r1 = runs["r1"].info.run_id
    loss = [(m.step, m.value) for m in c.get_metric_history(r1, "val/loss")]
    assert sorted(loss) == [(10, 3.0), (20, 2.5)]
    acc = [(m.step, m.value) for m in c.get_metric_history(runs["r2"].info.run_id, "val/accuracy")]
    assert acc == [(10, 0.1)]
    alert = sorted((m.step, m.value) for m in c.get_metric_history(r1, "alert/spike:loss"))
    assert alert == [(101, 3.0), (115, 0.0)]
    tag = c.get_run(r1).data.tags["steplens.alert.fp01"]
    assert tag.startswith("critical resolved run step 115")


def test_a_second_mirror_reuses_the_existing_run(tracking_uri):
    MlflowMirror(tracking_uri, "t").handle([_eval("same", 1, 3.0, 0.1)])
    second = MlflowMirror(tracking_uri, "t")
    second.handle([_eval("same", 2, 2.0, 0.2)])
    runs = second.client.search_runs([second.experiment_id])
    assert len(runs) == 1
    assert len(second.client.get_metric_history(runs[0].info.run_id, "val/loss")) == 2


@pytest.mark.stack
def test_mirror_consumes_evals_and_alerts_from_kafka(stack_env, tracking_uri):
    from confluent_kafka import Producer

    from steplens.schema.topics import Topics, ensure_topics

    tag = uuid.uuid4().hex[:8]
    topics = Topics(
        raw=f"e2e-{tag}.raw",
        signals=f"e2e-{tag}.sig",
        alerts=f"e2e-{tag}.alerts",
        dead_letters=f"e2e-{tag}.dl",
        advice=f"e2e-{tag}.advice",
    )
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    ensure_topics(bootstrap, topics)
    run_id = f"mlflow-{tag}"
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i, step in enumerate(range(0, 50, 10)):
        rec = _eval(run_id, step, 3.0 - 0.1 * i, 0.1 * i, seq=i)
        producer.produce(topics.raw, encode(rec), key=rec.key)
    sample = make_record("step", {"loss": 1.0}, run_id=run_id, step=3)
    producer.produce(topics.raw, encode(sample), key=sample.key)
    alert = _alert(run_id, 30, "firing", "warning")
    producer.produce(topics.alerts, encode(alert), key=alert.key)
    window = _window(run_id, 49, 0.2, 0.45)
    producer.produce(topics.raw, encode(window), key=window.key)
    spike = _signal(run_id, 31, 4.0, 2.5, "warning")
    producer.produce(topics.signals, encode(spike), key=spike.key)
    advice = make_record(
        "advice", {"action": "lower_lr", "fingerprint": "fp01", "lr_factor": 0.5}, run_id=run_id
    )
    producer.produce(topics.advice, encode(advice), key=run_id.encode())
    assert producer.flush(15) == 0

    mirror = MlflowMirror(tracking_uri, "kafka")
    stop = threading.Event()
    used: list[int] = []
    worker = threading.Thread(
        target=lambda: used.append(
            run_mirror(
                mirror,
                bootstrap,
                [topics.raw, topics.signals, topics.alerts, topics.advice],
                group=f"g-{tag}",
                stop=stop,
                max_s=60,
            )
        )
    )
    worker.start()
    deadline = time.monotonic() + 60
    history: list = []
    while time.monotonic() < deadline:
        runs = mirror.client.search_runs([mirror.experiment_id])
        if runs:
            try:  # the file store can list a run the mirror is still creating
                history = mirror.client.get_metric_history(runs[0].info.run_id, "val/loss")
                alerts = mirror.client.get_metric_history(runs[0].info.run_id, "alert/spike:loss")
            except MlflowException:
                time.sleep(0.5)
                continue
            peak = runs[0].data.tags.get("steplens.summary.loss_spike_peak", "")
            state = runs[0].data.tags.get("steplens.summary.state", "")
            if (
                len(history) == 5
                and alerts
                and peak.startswith("step 31")
                and '"advice":1' in state
            ):
                break
        time.sleep(0.5)
    stop.set()
    worker.join(timeout=30)
    assert sorted((m.step, round(m.value, 6)) for m in history) == [
        (0, 3.0),
        (10, 2.9),
        (20, 2.8),
        (30, 2.7),
        (40, 2.6),
    ]
    assert [(m.step, m.value) for m in alerts] == [(30, 2.0)]
    assert used == [8]  # the evaluations, the step, the window, the alert
    metrics, tags = _summary_of(mirror, run_id)  # written when the mirror stopped
    assert metrics["summary/clip_rate"] == pytest.approx(0.2)
    assert metrics["summary/mfu_mean"] == pytest.approx(0.45)
    assert metrics["summary/loss_spike_peak_rise"] == pytest.approx(0.6)
    assert metrics["summary/incidents"] == 1.0
    assert metrics["summary/advice"] == 1.0
    assert tags["steplens.summary.loss_spike_peak"].startswith("step 31: loss 4")


# --------------------------------------------------------------------------- the run summary


def _window(run_id, step_last, clipped_share, mfu, count=100, rank=0):
    metrics = {
        "loss": {"count": count, "mean": 2.0, "min": 1.9, "max": 2.1, "last": 2.0, "nonfinite": 0},
        "clipped": {
            "count": count,
            "mean": clipped_share,
            "min": 0.0,
            "max": 1.0,
            "last": 0.0,
            "nonfinite": 0,
        },
        "mfu": {"count": count, "mean": mfu, "min": mfu, "max": mfu, "last": mfu, "nonfinite": 0},
    }
    data = {
        "step_first": step_last - count + 1,
        "step_last": step_last,
        "count": count,
        "metrics": metrics,
    }
    return make_record(
        "step_window",
        data,
        run_id=run_id,
        rank=rank,
        step=step_last,
        time_ns=1_700_000_000_000_000_000 + step_last * 1_000_000,
    )


def _step(run_id, step, clipped, mfu):
    return make_record(
        "step",
        {"loss": 2.0, "clipped": clipped, "mfu": mfu, "reason": "sample"},
        run_id=run_id,
        step=step,
    )


def _signal(run_id, step, value, expected, severity=None):
    data = {
        "name": "spike",
        "metric": "loss",
        "value": value,
        "expected": expected,
        "score": 0.99 if severity else 0.1,
    }
    if severity:
        data["detail"] = {"severity": severity}
    return make_record("signal", data, run_id=run_id, rank=-1, step=step)


def _incident(run_id, fp, step, state, severity, rules=("spike:loss",)):
    members = [{"rule": r, "scope": "run", "severity": severity} for r in rules]
    data = {
        "rule": rules[0],
        "severity": severity,
        "state": state,
        "scope": "incident",
        "hint": "loss spike: inspect the batch",
        "fingerprint": fp,
        "started_step": 100,
        "evidence": {"topic": "training", "members": members},
    }
    return make_record(
        "alert",
        data,
        run_id=run_id,
        rank=-1,
        step=step,
        time_ns=1_700_000_000_000_000_000 + step * 1_000_000,
    )


def _summary_of(mirror, run_id):
    run = mirror.client.get_run(mirror.mlflow_run(run_id))
    return run.data.metrics, run.data.tags


def test_the_run_summary_lands_as_metrics_and_tags(tracking_uri):
    run = "sum-1"
    records = [
        _window(run, 99, 0.25, 0.40),
        _window(run, 199, 0.75, 0.50),
        _window(run, 199, 0.75, 0.50, rank=1),
        _step(run, 150, True, 0.9),  # a raw sample of a windowed step: not counted again
        _signal(run, 120, 3.1, 2.0, "warning"),  # +55 %
        _signal(run, 160, 5.0, 2.0, "critical"),  # +150 %: the peak
        _signal(run, 170, 9.0, 2.0),  # quiet: not a spike
        _incident(run, "inc-a", 120, "firing", "warning", ("spike:loss",)),
        _incident(run, "inc-a", 160, "firing", "critical", ("spike:loss", "spike:grad_norm")),
        _incident(run, "inc-a", 180, "resolved", "critical", ("spike:loss", "spike:grad_norm")),
        _incident(run, "inc-b", 190, "firing", "warning", ("hang",)),
    ]
    mirror = MlflowMirror(tracking_uri, "t")
    # drawn: rank 0's windows and step, the alerts (rank 1's window and the signals are counted)
    assert mirror.handle(records) == 7
    mirror.flush_summaries(force=True)
    metrics, tags = _summary_of(mirror, run)
    assert metrics["summary/clip_rate"] == pytest.approx((25 + 75 + 75) / 300)
    assert metrics["summary/mfu_mean"] == pytest.approx((40 + 50 + 50) / 300)
    assert metrics["summary/loss_spike_peak_rise"] == pytest.approx(1.5)
    assert (metrics["summary/incidents"], metrics["summary/incidents_critical"]) == (2.0, 1.0)
    assert metrics["summary/incidents_open"] == 1.0
    assert tags["steplens.summary.loss_spike_peak"] == (
        "step 160: loss 5 over a baseline of 2 (+150.0 %)"
    )
    history = mirror.client.get_metric_history(mirror.mlflow_run(run), "summary/clip_rate")
    assert [m.step for m in history] == [199]  # at the run's last step
    assert tags["steplens.alert.inc-a"] == (
        "critical resolved incident step 180: loss spike: inspect the batch "
        "[rules: spike:loss, spike:grad_norm]"
    )


def test_advice_and_answers_land_as_a_tag_and_counts(tracking_uri):
    run = "adv-1"
    opened = _incident(run, "inc-a", 120, "firing", "critical")
    rewind = {"action": "rewind", "rank": -1, "step": 120, "checkpoint": "/ck/100"}
    rewind |= {"checkpoint_step": 100, "skip_batches": 220, "answers": []}
    skip = {"action": "skip_samples", "rank": -1, "step": 120, "n_samples": 4, "answers": []}
    advised = make_record(
        "alert",
        {**opened.data, "evidence": {**opened.data["evidence"], "remedies": [skip, rewind]}},
        run_id=run,
        rank=-1,
        step=120,
        time_ns=opened.time_ns,
    )
    acted = {"outcome": "acted", "n": 1, "ranks": [0], "details": ["reloaded /ck/100"]}
    answered = make_record(
        "alert",
        {
            **advised.data,
            "evidence": {
                **advised.data["evidence"],
                "remedies": [skip, {**rewind, "answers": [acted]}],
            },
        },
        run_id=run,
        rank=-1,
        step=125,
        time_ns=opened.time_ns + 1,
    )
    advice = [
        make_record("advice", {"action": a["action"], "fingerprint": "inc-a"}, run_id=run, step=120)
        for a in (skip, rewind)
    ]
    answer = make_record(
        "acted",
        {"action": "rewind", "fingerprint": "inc-a", "outcome": "acted"},
        run_id=run,
        rank=0,
        step=125,
    )
    mirror = MlflowMirror(tracking_uri, "t")
    mirror.handle([advised, *advice, answered, answer])
    mirror.flush_summaries(force=True)
    metrics, tags = _summary_of(mirror, run)
    assert tags["steplens.advice.inc-a"] == (
        "skip 4 samples, to every rank at step 120 -> no answer yet\n"
        "rewind to /ck/100 (step 100), skip 220 batches, to every rank at step 120 -> "
        "acted: rank 0 (reloaded /ck/100)"
    )
    assert (metrics["summary/advice"], metrics["summary/answers_acted"]) == (2.0, 1.0)


def test_a_full_resolution_run_counts_every_step(tracking_uri):
    run = "sum-full"
    entries = [
        {"step": s, "time_ns": s, "loss": 2.0, "clipped": s % 4 == 0, "mfu": 0.3} for s in range(8)
    ]
    batch = make_record("step_batch", {"records": entries}, run_id=run, step=7)
    mirror = MlflowMirror(tracking_uri, "t")
    mirror.handle([batch, _step(run, 8, False, 0.6)])
    mirror.flush_summaries(force=True)
    metrics, tags = _summary_of(mirror, run)
    assert metrics["summary/clip_rate"] == pytest.approx(2 / 9)
    assert metrics["summary/mfu_mean"] == pytest.approx((8 * 0.3 + 0.6) / 9)
    assert metrics["summary/loss_spike_peak_rise"] == 0.0
    assert tags["steplens.summary.loss_spike_peak"] == "no loss spike"


def test_a_restarted_mirror_goes_on_and_counts_nothing_twice(tracking_uri):
    """The state tag holds the counts and the offsets they cover: a second mirror (a restart)
    that reads the last batch again (its commit was lost) and then new records adds only the
    new ones."""
    run = "sum-restart"
    first = [_window(run, 99, 0.5, 0.4), _incident(run, "i1", 50, "firing", "warning")]
    where = [("raw", 3, 10), ("alerts", 0, 5)]
    MlflowMirror(tracking_uri, "t", summary_interval_s=3600).handle(first, where)
    again = MlflowMirror(tracking_uri, "t", summary_interval_s=3600)
    again.handle(first, where)  # replayed
    again.handle(
        [_window(run, 199, 0.0, 0.6), _incident(run, "i2", 150, "firing", "critical")],
        [("raw", 3, 11), ("alerts", 0, 6)],
    )
    again.flush_summaries()  # the first write of this process goes out at once
    metrics, _ = _summary_of(again, run)
    assert metrics["summary/clip_rate"] == pytest.approx(0.25)
    assert metrics["summary/mfu_mean"] == pytest.approx(0.5)
    assert (metrics["summary/incidents"], metrics["summary/incidents_open"]) == (2.0, 2.0)
    again.handle([_window(run, 299, 1.0, 0.6)], [("raw", 3, 12)])
    again.flush_summaries()  # within the interval: not yet
    history = again.client.get_metric_history(again.mlflow_run(run), "summary/clip_rate")
    assert len(history) == 1
    again.flush_summaries(force=True)  # the mirror's stop
    metrics, _ = _summary_of(again, run)
    assert metrics["summary/clip_rate"] == pytest.approx(0.5)


def test_a_record_mlflow_refuses_is_rejected_alone(tracking_uri):
    """A request MLflow refuses is halved until the refused record is found: it goes to the
    dead-letter topic with MLflow's reason, the others are mirrored; other runs are skipped."""
    from steplens.sinks.kafka_io import Consumed

    records = [_eval("refuse", i, 2.0, 0.5, seq=i) for i in range(4)]
    # a key MLflow refuses ("val//loss" is not a normal path); the mirror makes a key's
    # characters valid, not its shape
    records[2] = make_record("eval", {"split": "val/", "loss": 1.0}, run_id="refuse", step=2)
    records.append(_eval("other", 9, 2.0, 0.5))
    batch = [Consumed("raw", 0, i, b"k", b"v", rec) for i, rec in enumerate(records)]
    mirror = MlflowMirror(tracking_uri, "t", only_run="refuse")
    result = mirror.export(batch)
    assert [r.index for r in result.rejected] == [2] and "val//loss" in result.rejected[0].reason
    assert (result.accepted, result.skipped, result.retryable) == (3, 1, False)
    history = mirror.client.get_metric_history(mirror.mlflow_run("refuse"), "val/loss")
    assert sorted(m.step for m in history) == [0, 1, 3]


# --------------------------------------------------------------------------- the live view


def test_the_live_view_gets_curves_params_and_the_incident_table(tracking_uri):
    """Steps, hardware and data quality as curves, run_meta as params (a changed value as a
    tag: MLflow keeps a param's first), the incidents as the run's description."""
    run = "live-1"
    steps = [
        make_record("step", {"loss": 3.0 - 0.1 * s, "lr": 1e-3}, run_id=run, step=s)
        for s in range(5)
    ]
    hw = make_record(
        "hw",
        {
            "mem_total_bytes": 8 << 30,
            "mem_available_bytes": 6 << 30,
            "gpus": [{"index": 0, "util_gpu": 88.0}],
        },
        run_id=run,
        host="n1",
    )
    meta = {"world_size": 2, "lr_schedule": {"kind": "cosine", "peak_lr": 1e-3}}
    first = make_record("run_meta", meta, run_id=run)
    changed = make_record("run_meta", {**meta, "world_size": 4}, run_id=run)
    mirror = MlflowMirror(tracking_uri, "t")
    mirror.handle([first, *steps, hw, _incident(run, "inc-a", 3, "firing", "critical")])
    mirror.handle([changed, _incident(run, "inc-b", 4, "firing", "warning", ("hang",))])
    c, mlflow_id = mirror.client, mirror.mlflow_run(run)
    loss = sorted(
        (m.step, round(m.value, 6)) for m in c.get_metric_history(mlflow_id, "train/loss")
    )
    assert loss == [(0, 3.0), (1, 2.9), (2, 2.8), (3, 2.7), (4, 2.6)]
    (util,) = c.get_metric_history(mlflow_id, "hw/n1/gpu0/util")
    assert (util.step, util.value) == (4, 88.0)  # at the run's last step
    data = c.get_run(mlflow_id).data
    assert data.params["world_size"] == "2" and data.params["lr_schedule.kind"] == "cosine"
    assert data.tags["steplens.param.world_size"] == "4"
    note = data.tags["mlflow.note.content"]
    assert note.startswith("**steplens: 2 incidents, 2 open**")
    assert note.index("step 4: loss spike") < note.index("step 3: loss spike")  # newest first
    hang = _incident(run, "inc-h", 0, "firing", "critical", ("hang:progress",))
    mirror.handle([make_record("alert", hang.data, run_id=run, rank=-1, step=None)])
    tags = c.get_run(mlflow_id).data.tags  # an incident without a step (a hang) says none
    assert tags["steplens.alert.inc-h"].startswith("critical firing incident: loss spike")
    restarted = MlflowMirror(tracking_uri, "t")  # the table is rebuilt from the run's tags
    restarted.handle([_incident(run, "inc-a", 9, "resolved", "critical")])
    note = c.get_run(mlflow_id).data.tags["mlflow.note.content"]
    assert note.startswith("**steplens: 3 incidents, 2 open**")
    assert "| critical resolved incident step 9: loss spike" in note


def test_metric_keys_past_the_cap_are_counted_not_written(tracking_uri, monkeypatch):
    from steplens.sinks import mlflow_mirror

    monkeypatch.setattr(mlflow_mirror, "MAX_KEYS_PER_RUN", 3)
    scalars = {f"m{i}": float(i) for i in range(5)}
    steps = [
        make_record("step", {"loss": 2.0, "scalars": scalars}, run_id="cap", step=s)
        for s in range(2)
    ]
    mirror = MlflowMirror(tracking_uri, "t")
    mirror.handle(steps)
    drawn = mirror.client.get_run(mirror.mlflow_run("cap")).data.metrics
    assert set(drawn) == {"train/loss", "train/m0", "train/m1"}  # the first 3 keys seen
    assert mirror.points_dropped_total == 2 * 3  # m2, m3, m4 of both steps
