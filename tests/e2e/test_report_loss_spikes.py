"""The loss figure tells hard batches (notes) from the spikes that opened an incident."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd
from report_data import synthetic_run

from steplens.sinks.report_figures import FIGURES


def test_loss_figure_marks_hard_batches_faintly_and_incident_spikes_clearly():
    data = synthetic_run()
    spikes = pd.DataFrame(
        {
            "step": [90, 120, 151],
            "name": "spike",
            "metric": "loss",
            "value": [2.3, 2.25, 5.0],
            "expected": [2.1, 2.08, 2.05],
            "lower": 1.9,
            "upper": 2.2,
            "score": [0.9993, 0.9995, 0.99999],
            "rank": 0,
        }
    )
    quiet = spikes.assign(step=[60, 61, 62], score=0.3, value=2.1)  # not breaches
    data.signals = pd.concat([data.signals, spikes, quiet], ignore_index=True)
    fig = FIGURES["loss"][1](data)
    marks = {c.get_label(): c for c in fig.axes[0].collections}
    hard = marks["hard batch (info, 2)"]
    assert sorted(hard.get_offsets()[:, 0]) == [90, 120]
    assert hard.get_alpha() == 0.5
    paged = marks["loss spike (incident)"]  # the incident of the synthetic run starts at 151
    assert list(paged.get_offsets()[:, 0]) == [151]
    assert paged.get_alpha() is None or paged.get_alpha() == 1
