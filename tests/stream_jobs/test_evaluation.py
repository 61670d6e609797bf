"""Event-level scoring: hand-checked cases and properties against a brute-force count."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from event_scoring import average_precision, events_of, onsets_of, score


def test_events_and_onsets_of_runs():
    labels = [0, 1, 1, 0, 0, 1, 0, 1]
    assert events_of(labels) == [(1, 2), (5, 5), (7, 7)]
    assert onsets_of(labels) == [1, 5, 7]
    assert events_of([]) == [] and onsets_of([1, 1]) == [0]


def test_score_counts_events_onsets_and_delays():
    q = score([(10, 20), (50, 50)], [5, 12, 15, 52, 80], tolerance=2)
    assert (q.events, q.detected, q.onsets, q.true_onsets) == (2, 2, 5, 3)
    assert q.delays == (2, 2)
    assert math.isclose(q.precision, 3 / 5) and q.recall == 1.0
    assert math.isclose(q.f1, 2 * 0.6 / 1.6)
    late = score([(50, 50)], [53], tolerance=2)
    assert (late.detected, late.true_onsets) == (0, 0) and late.f1 == 0.0


@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 20)), max_size=12),
    st.lists(st.integers(0, 240), max_size=30),
    st.integers(0, 5),
)
def test_score_equals_brute_force(raw, onsets, tol):
    events = sorted({(s, s + n) for s, n in raw})
    q = score(events, onsets, tol)
    inside = [t for t in onsets if any(s <= t <= e + tol for s, e in events)]
    detected = [ev for ev in events if any(ev[0] <= t <= ev[1] + tol for t in onsets)]
    assert q.onsets == len(onsets)
    assert q.true_onsets == len(inside)
    assert q.detected == len(detected)
    assert sorted(q.delays) == sorted(
        min(t for t in onsets if s <= t <= e + tol) - s for s, e in detected
    )


def test_average_precision():
    assert average_precision([0.9, 0.8, 0.1, 0.05], [1, 1, 0, 0]) == 1.0
    assert math.isclose(average_precision([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]), (1 / 3 + 2 / 4) / 2)
    # no ranking at all (a constant score): the share of positive rows
    assert math.isclose(average_precision([0.0] * 10, [1, 0, 0, 0, 0, 1, 0, 0, 0, 0]), 0.2)
    assert math.isnan(average_precision([1.0], [0]))
