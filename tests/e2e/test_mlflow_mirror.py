"""Evaluation metrics and alerts mirrored into MLflow's local file store."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

pytest.importorskip("mlflow")

from steplens.producer.schema import encode, make_record
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

    from steplens.producer.topics import Topics, ensure_topics

    tag = uuid.uuid4().hex[:8]
    topics = Topics(
        raw=f"e2e-{tag}.raw",
        signals=f"e2e-{tag}.sig",
        alerts=f"e2e-{tag}.alerts",
        dead_letters=f"e2e-{tag}.dl",
    )
    bootstrap = stack_env["STEPLENS_KAFKA_BOOTSTRAP"]
    ensure_topics(bootstrap, topics)
    run_id = f"mlflow-{tag}"
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i, step in enumerate(range(0, 50, 10)):
        rec = _eval(run_id, step, 3.0 - 0.1 * i, 0.1 * i, seq=i)
        producer.produce(topics.raw, encode(rec), key=rec.key)
    noise = make_record("step", {"loss": 1.0}, run_id=run_id, step=3)  # not mirrored
    producer.produce(topics.raw, encode(noise), key=noise.key)
    alert = _alert(run_id, 30, "firing", "warning")
    producer.produce(topics.alerts, encode(alert), key=alert.key)
    assert producer.flush(15) == 0

    mirror = MlflowMirror(tracking_uri, "kafka")
    stop = threading.Event()
    used: list[int] = []
    worker = threading.Thread(
        target=lambda: used.append(
            run_mirror(
                mirror,
                bootstrap,
                [topics.raw, topics.alerts],
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
            history = mirror.client.get_metric_history(runs[0].info.run_id, "val/loss")
            alerts = mirror.client.get_metric_history(runs[0].info.run_id, "alert/spike:loss")
            if len(history) == 5 and alerts:
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
    assert used == [6]
