"""The report's data functions on small built inputs: incidents, checks, label balance, the
train-validation gap, the bandwidth verdict; and what the figures draw of them."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("matplotlib")

from report_data import ADVICE, synthetic_run

from steplens.sinks.report_bandwidth import INPUT, PARALLEL, bandwidth_verdict, verdict_text
from steplens.sinks.report_data import checks_by_name, checks_of, missing_steps
from steplens.sinks.report_incidents import incidents, run_incidents
from steplens.sinks.report_quality import label_balance, train_val_gap


def test_one_row_per_incident_from_its_records():
    data = synthetic_run()
    assert len(data.alerts) == 6
    found = run_incidents(data).set_index("fingerprint")
    assert list(found.index) == ["a", "b", "c"]  # by the step they opened at
    a, b, c = (found.loc[k] for k in "abc")
    assert (a.opened_step, a.severity, a.state, a.resolved_step) == (
        151,
        "critical",
        "resolved",
        170,
    )
    assert (a.duration_steps, a.duration_s, a.records) == (19, 10.0, 3)
    assert a.rule == "correlation:loss_grad" and a.members == ["spike:loss", "x:y"]
    assert a.hint == "check the learning rate" and a.advice == []
    # still open: it lasts until the run's last stored step so far
    assert (b.state, b.duration_steps, b.severity) == ("open", 299 - 201, "warning")
    assert math.isnan(b.resolved_step)
    assert c.advice == [ADVICE]


def test_records_without_fingerprint_or_evidence():
    """Older records: grouped by rule and scope; members from the summary, else the rule."""
    alerts = pd.DataFrame(
        [
            {
                "step": 5,
                "rule": "spike:loss",
                "scope": "run",
                "state": "firing",
                "severity": "warning",
                "summary": "training incident since step 5: spike:loss, arima:loss",
            },
            {
                "step": 9,
                "rule": "spike:loss",
                "scope": "run",
                "state": "resolved",
                "severity": "warning",
                "summary": "spike:loss resolved at step 9",
            },
            {
                "step": 7,
                "rule": "hang",
                "scope": "rank:1",
                "state": "firing",
                "severity": "critical",
            },
        ]
    )
    found = incidents(alerts, last_step=20).set_index("rule")
    assert len(found) == 2
    assert found.loc["spike:loss", "members"] == ["spike:loss"]  # the newest summary has no list
    assert found.loc["spike:loss", "duration_steps"] == 4
    assert found.loc["hang", "members"] == ["hang"] and found.loc["hang", "duration_steps"] == 13
    first = incidents(alerts.iloc[:1])
    assert first.loc[0, "members"] == ["spike:loss", "arima:loss"]
    assert incidents(pd.DataFrame()).empty


def test_checks_per_rank_and_their_words():
    meta = pd.DataFrame(
        {
            "time_ns": [1, 2, 3],
            "rank": [0, 1, 0],
            "checks": [
                '[{"check": "stragglers", "state": "on"}]',  # rank 0's older report
                '[{"check": "stragglers", "state": "off", "why": "one rank", "enable": "x"}, '
                '{"check": "MFU", "state": "on use", "needs": "tokens="}]',
                '[{"check": "stragglers", "state": "on"}, '
                '{"check": "MFU", "state": "on use", "needs": "tokens="}]',
            ],
        }
    )
    rows = checks_of(meta)
    assert len(rows) == 4  # the newest report of each rank
    table = checks_by_name(rows).set_index("check")
    assert table.loc["stragglers", "state"] == "on on rank 0; off on rank 1"
    assert table.loc["stragglers", "detail"] == "one rank"
    assert table.loc["stragglers", "enable"] == "x"
    assert table.loc["MFU", "state"] == "on use" and table.loc["MFU", "detail"] == "tokens="
    assert checks_of(pd.DataFrame({"rank": [0], "checks": ["not json"]})).empty


def test_label_balance_per_window_and_the_running_ratio():
    batches = pd.DataFrame(
        {
            "step": [0, 1, 2, 3],
            "label_cat": [10, 10, 30, 30],
            "label_counts.dog": [10, 10, 0, 0],  # S3's name of a label
            "label_dog": [np.nan, np.nan, np.nan, np.nan],
        }
    )
    shares, ratio = label_balance(batches, n=2)
    assert list(shares.columns) == ["cat", "dog"]
    assert shares.to_numpy() == pytest.approx(np.array([[0.5, 0.5], [1.0, 0.0]]))
    assert list(ratio) == pytest.approx([1.0, 80 / 20])
    assert label_balance(pd.DataFrame({"step": [1], "n_samples": [4]}))[0].empty


def test_train_validation_gap_against_the_recent_training_loss():
    steps = pd.DataFrame(
        {"rank": [0, 1] * 6, "step": np.repeat(np.arange(0, 60, 10), 2), "loss": [2.0, 2.2] * 6}
    )
    evals = pd.DataFrame({"step": [25, 55, 5], "split": "val", "loss": [2.5, 2.6, np.nan]})
    gap = train_val_gap(steps, evals)
    assert list(gap["step"]) == [25, 55]
    assert list(gap["train_loss"]) == pytest.approx([2.1, 2.1])
    assert list(gap["gap"]) == pytest.approx([0.4, 0.5])
    early = train_val_gap(steps, pd.DataFrame({"step": [-1], "loss": [3.0]}))
    assert early.empty  # before any training loss: no gap


def test_bandwidth_verdict_tells_the_input_pipeline_from_the_parallel_strategy():
    t0 = pd.Timestamp("2026-01-01T00:00:00Z")
    times = t0 + pd.to_timedelta(np.arange(90), unit="s")
    util = np.r_[np.full(30, 95.0), np.full(30, 10.0), np.full(30, 10.0)]
    gpu = pd.DataFrame(
        {"time": times, "host": "n1", "gpu": 0, "util_gpu": util, "mem_bw_util": util / 2}
    )
    flow = np.r_[np.full(30, 5000.0), np.full(30, 10.0), np.full(30, 9000.0)]
    nets = pd.DataFrame(
        {"time": times, "host": "n1", "iface": "ib0", "rx_mb_s": flow, "tx_mb_s": 0.0}
    )
    judged = bandwidth_verdict(gpu, nets, bins=9)
    assert list(judged["verdict"]) == ["busy"] * 3 + [INPUT] * 3 + [PARALLEL] * 3
    assert verdict_text(judged).startswith("GPUs waiting 67 % of the time")
    assert bandwidth_verdict(pd.DataFrame(), nets).empty
    assert verdict_text(bandwidth_verdict(pd.DataFrame(), nets)).startswith("no GPU samples")


def test_signals_are_faint_and_incidents_stand_out():
    import matplotlib.pyplot as plt

    from steplens.sinks.report_figures import FIGURES

    data = synthetic_run()
    loud = pd.DataFrame(
        {
            "step": np.arange(0, 300, 3),
            "name": "grad_spike",
            "metric": "grad_norm_preclip",
            "value": 2.0,
            "score": 0.7,
            "rank": 0,
        }
    )
    data.signals = pd.concat([data.signals, loud], ignore_index=True)
    fig = FIGURES["grad_norm"][1](data)
    ax = fig.axes[0]
    (marks,) = [c for c in ax.collections if "detector signals" in str(c.get_label())]
    assert len(marks.get_offsets()) == 100 and marks.get_alpha() <= 0.4
    spans = [p for p in ax.patches if p.get_alpha() and p.get_alpha() < 0.3]
    assert len(spans) == 1  # the loss-and-gradient incident; not the straggler's
    timeline = FIGURES["alerts"][1](data).axes[0]
    assert [t.get_text() for t in timeline.get_yticklabels()] == [
        "correlation:loss_grad (+1)",
        "straggler",
        "eval_unstable:eval_accuracy",
    ]
    plt.close("all")


def _advice_and_answers() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Advice for incident "a" as the stores return it (NaN where a field is absent; the same
    record twice, from both stores) and the two ranks' answers."""
    advice = pd.DataFrame(
        [
            {
                "time_ns": 2,
                "step": 153,
                "rank": -1,
                "fingerprint": "a",
                "action": "rewind",
                "checkpoint": "ckpt-100",
                "checkpoint_step": 100,
                "skip_batches": 251,
                "lr_factor": np.nan,
            },
            {"time_ns": 1, "step": 152, "rank": -1, "fingerprint": "a", "action": "skip_samples"}
            | {"sample_ids": '["s1", "s2"]', "lr_factor": np.nan},
            {"time_ns": 2, "step": 153, "rank": -1, "fingerprint": "a", "action": "rewind"},
        ]
    )
    acted = pd.DataFrame(
        [
            {"time_ns": 3, "step": 154, "rank": 0, "fingerprint": "a", "action": "rewind"}
            | {"outcome": "failed", "detail": "no such file"},
            {"time_ns": 4, "step": 155, "rank": 0, "fingerprint": "a", "action": "rewind"}
            | {"outcome": "acted", "detail": "reloaded ckpt-100"},  # its latest answer counts
            {"time_ns": 4, "step": 155, "rank": 1, "fingerprint": "a", "action": "rewind"}
            | {"outcome": "declined", "detail": np.nan},
        ]
    )
    return advice, acted


def test_each_incident_lists_its_advice_the_answers_and_what_followed():
    data = synthetic_run()
    data.advice, data.acted = _advice_and_answers()
    found = run_incidents(data).set_index("fingerprint")
    a = found.loc["a"]
    assert [r["action"] for r in a.remedies] == ["skip_samples", "rewind"]  # in order given
    skip, rewind = a.remedies
    assert skip["advice"] == "skip 2 samples" and skip["answered"] == "no answer yet"
    assert rewind["advice"] == "rewind to ckpt-100 (step 100), skip 251 batches"
    assert rewind["answered"] == "acted: rank 0 (reloaded ckpt-100); declined: rank 1"
    assert rewind["line"] == (
        "rewind to ckpt-100 (step 100), skip 251 batches, to every rank at step 153 -> "
        "acted: rank 0 (reloaded ckpt-100); declined: rank 1"
    )
    # the loss spiked by 3 over steps 151..155: back on its trend from step 156
    assert a.recovery == "back on trend after 5 steps (step 156)"
    assert found.loc["b"].remedies == [] and found.loc["c"].recovery.startswith("back on")


def test_a_report_after_the_resolution_does_not_lengthen_the_incident():
    data = synthetic_run()
    late = data.alerts[data.alerts["fingerprint"] == "a"].iloc[[-1]].copy()
    late["time_ns"] += 60 * 10**9  # an answer to its advice, a minute after it resolved
    data.alerts = pd.concat([data.alerts, late], ignore_index=True)
    a = run_incidents(data).set_index("fingerprint").loc["a"]
    assert (a.resolved_step, a.duration_steps, a.duration_s, a.records) == (170, 19, 10.0, 4)


def test_the_page_shows_advice_answers_and_recovery(tmp_path):
    from steplens.sinks.report_page import write_report

    data = synthetic_run(n_steps=200)
    data.advice, data.acted = _advice_and_answers()
    page = write_report(data, tmp_path).read_text()
    assert "<b>rewind to ckpt-100 (step 100), skip 251 batches</b> to every rank at step 153" in (
        page
    )
    assert "acted: rank 0 (reloaded ckpt-100); declined: rank 1" in page
    assert "back on trend after 5 steps (step 156)" in page


def _profile_and_answers() -> tuple[pd.DataFrame, pd.DataFrame]:
    """A ``profile`` advice for incident "a" and three ranks' answers: a trace in S3, one kept
    on the rank's host, one declined."""
    uri = "s3://steplens/cold/traces/run_id=synthetic/straggler-" + "f" * 40 + "-rank3.json.gz"
    advice = pd.DataFrame(
        [{"time_ns": 1, "step": 152, "rank": 3, "fingerprint": "a", "action": "profile"}]
    )
    acted = pd.DataFrame(
        [
            {"rank": 3, "outcome": "acted", "detail": f"trace {uri}: 20 steps, 1.4 s"},
            {"rank": 5, "outcome": "acted", "detail": "trace /tmp/p/r5.json.gz: 7 steps, 5.0 s"},
            {"rank": 1, "outcome": "declined", "detail": "a profile is already running"},
        ]
    )
    acted[["time_ns", "step", "fingerprint", "action"]] = [5, 160, "a", "profile"]
    return advice, acted


def test_an_incident_links_the_traces_its_ranks_took(tmp_path):
    from steplens.sinks.report_page import write_report

    data = synthetic_run(n_steps=200)
    data.advice, data.acted = _profile_and_answers()
    [profile] = run_incidents(data).set_index("fingerprint").loc["a"].remedies
    uri = "s3://steplens/cold/traces/run_id=synthetic/straggler-" + "f" * 40 + "-rank3.json.gz"
    assert profile["traces"] == [
        {"rank": 3, "uri": uri},
        {"rank": 5, "uri": "/tmp/p/r5.json.gz"},
    ]
    assert f"(trace {uri}:" in profile["answered"]  # the address is never cut

    def link(uri: str) -> str | None:  # presigned: see the next test
        return "https://s3.example/signed?" + uri[5:] if uri.startswith("s3://") else None

    page = write_report(data, tmp_path, link=link)
    assert f'<a class="trace" href="https://s3.example/signed?{uri[5:]}">trace of rank 3</a>' in (
        page.read_text()
    )
    assert "trace of rank 5: <code>/tmp/p/r5.json.gz</code>" in page.read_text()


def test_a_trace_in_s3_is_linked_by_a_presigned_url():
    from steplens.sinks.settings import S3Settings
    from steplens.sinks.trace_links import EXPIRES_S, no_link, presigner

    settings = S3Settings(
        endpoint_url="http://127.0.0.1:9", access_key_id="AK", secret_access_key="SK"
    )
    url = presigner(settings)("s3://steplens/cold/traces/run_id=r/f-rank0.json.gz")
    assert url is not None
    assert url.startswith("http://127.0.0.1:9/steplens/cold/traces/run_id%3Dr/f-rank0.json.gz?")
    assert "X-Amz-Signature=" in url and f"X-Amz-Expires={EXPIRES_S}" in url
    assert presigner(settings)("/tmp/on-the-rank.json.gz") is None
    assert no_link("s3://b/k") == "s3://b/k" and no_link("/tmp/x") is None


def test_the_wait_for_the_last_step_names_what_is_missing() -> None:
    assert missing_steps({0: 499, 1: 499}, 499, world_size=2) is None
    assert missing_steps({0: 520}, 499, world_size=1) is None  # later steps stored: reached
    assert missing_steps({0: 499, 1: 490}, 499, world_size=3) == (
        "rank 1: steps 491-499 missing; rank 2: nothing stored"
    )
    assert missing_steps({1: 10}, 499, world_size=None) == "rank 1: steps 11-499 missing"
    assert missing_steps({0: 498}, 499, world_size=1) == "rank 0: step 499 missing"
    assert missing_steps({}, 499, world_size=None) == "no step of the run is stored"
