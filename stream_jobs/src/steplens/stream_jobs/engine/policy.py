"""The alert policy: which signals are breaches, and how severe, from rarity, magnitude and
persistence.

A detector writes a continuous signal: the value it judged, what it expected, and a raw score
that ``calibration`` turns into the rarity of that score on the series (the anomaly score). A
signal is a breach only when it is both rare and large enough to matter, or lasts:

* ``rarity``: the anomaly score at or above which a value is rare (0.9999 by default: about once
  in 10,000 values of that series); ``None``: rarity is not asked (an anchor alone decides, as
  for a non-finite value or GPU memory over 90 %);
* ``magnitude``: how far the value is from what was expected, in the rule's own unit, with the
  design's anchors: ``warning`` at or above one (with rarity), ``critical`` at or above the
  other, whatever the rarity (a gradient norm 10x its robust baseline is critical even on a
  series where that happened before; loss volatility over 10 % warns; ...);
* ``persist``: rare and large for this many values in a row before it warns (a forecast that
  is missed once is a blip, three times a change of regime), unless its magnitude is at or
  above ``at_once`` (a loss 8 % up for one step is a hard batch, 10 % up a spike); after the
  first, a value goes on with the run when it is rare and at least ``held`` large (None: the
  warning's magnitude; a loss still 2 % up after an 8 % jump has not come back);
  ``critical_persist``: before a warning becomes critical (0: never by persistence alone).

A small deviation that neither persists nor is large stays a signal: it is stored and plotted,
it never alerts on its own. Before a series has values enough to know its noise (its
calibration's warm-up) only the cold anchors apply: a loss 15 % above its median so far, a
gradient norm 5x. ``band``: a value must also lie outside the detector's own band to warn (its
own score at least ``band``), cold or warm, so a series whose steps wander 7 % is not paged for
a rare 12 % up (before the detector has a band, the anchors alone). One that is
fairly rare (``note_rarity``) and of some size (``note``) is a *note* (severity info): it
feeds the correlations (a loss jump with a gradient jump in the same steps) and never alerts
alone; so is every breach of a policy that does not
alert (``alerts`` False: an ARIMA excursion of the loss is evidence, not an alert).

``judge_signals`` applies a policy to a detector's signals of one series: their raw scores
become calibrated anomaly scores (``calibration``), then severities. Until a series has values
enough for its calibration, its signals keep the detector's own score (0.5 at the detector's
threshold). Where a policy has a ``band``, a value's score keeps it (``banded``): under
``band`` inside the detector's band, at or over it outside, each in proportion to its rarity;
the rarity of a value well inside the band says how often the series wobbles that much, not
that it is anomalous.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numba
import numpy as np

from steplens.stream_jobs.engine.calibration import CalibrationConfig, CalibrationState, calibrate
from steplens.stream_jobs.engine.core import NO_STEP, Signals

_jit = numba.njit(cache=True, error_model="numpy")

# severity codes (as ``core.SEVERITIES``)
NONE, INFO, WARN, CRIT = 0, 1, 2, 3

# how the magnitude of a value is measured against what was expected
RATIO, RISE, DEVIATION, VALUE = 0, 1, 2, 3
MEASURES = {"ratio": RATIO, "rise": RISE, "deviation": DEVIATION, "value": VALUE}


@dataclass(frozen=True)
class Policy:
    """When a rule's signals breach (see the module)."""

    rarity: float | None = 0.9999
    # "ratio": value / expected; "rise": (value - expected) / |expected|; "deviation":
    # |value - expected| / |expected|; "value": the value itself
    measure: str = "value"
    warning: float = -math.inf  # magnitude at or above which a rare value warns
    critical: float = math.inf  # ... is critical
    persist: int = 1
    at_once: float = math.inf  # magnitude that warns without persisting
    held: float | None = None  # magnitude that goes on with a run (None: ``warning``)
    critical_persist: int = 0
    alerts: bool = True  # False: its breaches are notes (they feed the correlations)
    note: float | None = None  # magnitude of a note (None: no notes)
    note_rarity: float = 0.999
    # while the series' calibration warms up (its first values: its own noise is not known
    # yet) only magnitudes this large warn, and this large are critical
    cold_warning: float = math.inf
    cold_critical: float = math.inf
    # rarity in steps: a value logged on a regular interval of ``w`` steps (a mean over the
    # Trainer's ``logging_steps``) stands for ``w`` steps (``calibration``), up to ``max_span``
    per_step: bool = False
    max_span: int = 1000
    # the detector's own score (0.5 at the edge of its band) a value needs besides its rarity
    # to warn, cold or warm (None: rarity and magnitude alone): on a noisy series a rare value
    # a few percent up is still inside the noise
    band: float | None = None


@dataclass
class JudgeState:
    """One series' calibration and how many of its values in a row were rare and large."""

    cal: CalibrationState = field(default_factory=CalibrationState)
    run: int = 0
    last_step: int = -1  # the step of its last value (``Policy.per_step``; -1: none)
    last_gap: int = 0  # steps between its last two values


def judge_signals(state: JudgeState, cal: CalibrationConfig, policy: Policy, sigs: Signals) -> None:
    """Calibrate ``sigs``' scores on their series and set their severities (in place)."""
    s = sigs.score
    with np.errstate(divide="ignore"):
        raw = np.where(s >= 1.0, np.inf, s / (1.0 - s))  # back to the measure (NaN: none)
    weights = _spans(state, sigs.step, policy.max_span) if policy.per_step else None
    anomaly = calibrate(state.cal, cal, raw, weights)
    # no anomaly score yet (the series' first values): the detector's own score stands
    cold = np.isnan(anomaly)
    sigs.score = np.where(cold, s, anomaly)
    sigs.severity = judge(policy, state, sigs.value, sigs.expected, sigs.score, cold=cold, own=s)
    if policy.band is not None:
        sigs.score = banded(sigs.score, s, cold, policy.band)


def banded(anomaly: np.ndarray, own: np.ndarray, cold: np.ndarray, band: float) -> np.ndarray:
    """Scores that keep a policy's band: a value inside the detector's band (its own score
    under ``band``) is not anomalous however rare on its series, and scores its rarity times
    its own score (under ``band``: a +2 % wobble below a +25 % jump); one outside scores
    ``band`` plus the rest in proportion to its rarity; a cold one (no rarity yet) its own."""
    with np.errstate(invalid="ignore"):
        warm = np.where(own < band, anomaly * own, band + (1.0 - band) * anomaly)
    return np.where(cold, own, warm)


def _spans(state: JudgeState, steps: np.ndarray, most: int) -> np.ndarray:
    """The steps each value stands for: on a regular logging interval (the same number of
    steps since the last value as between the two before), that interval, at most ``most``;
    else 1 (a raw step sampled between windows, a step the producer's guard sent at once, the
    first values, one without a step or whose step went back)."""
    out = np.ones(len(steps))
    last, gap = state.last_step, state.last_gap
    for i, s in enumerate(steps.tolist()):
        if s == NO_STEP:
            continue
        now = s - last if last >= 0 and s > last else 0
        if now > 1 and now == gap:
            out[i] = min(now, most)
        last, gap = s, now
    state.last_step, state.last_gap = last, gap
    return out


def judge(
    policy: Policy,
    state: JudgeState,
    value: np.ndarray,
    expected: np.ndarray,
    anomaly: np.ndarray,
    *,
    cold: np.ndarray | None = None,
    own: np.ndarray | None = None,
) -> np.ndarray:
    """Severity codes of one series' consecutive signals (``state.run`` is updated); those
    ``cold`` (before the series' calibration is warm) are judged by the cold anchors. ``own``:
    the detector's own scores (``Policy.band``; None: the anomaly scores)."""
    sev, state.run = _judge(
        np.asarray(value, dtype=float),
        np.asarray(expected, dtype=float),
        np.asarray(anomaly, dtype=float),
        -1.0 if policy.rarity is None else float(policy.rarity),
        MEASURES[policy.measure],
        float(policy.warning),
        float(policy.critical),
        int(policy.persist),
        float(policy.at_once),
        float(policy.warning if policy.held is None else policy.held),
        int(policy.critical_persist),
        bool(policy.alerts),
        math.inf if policy.note is None else float(policy.note),
        float(policy.note_rarity),
        float(policy.cold_warning),
        float(policy.cold_critical),
        np.zeros(len(value), np.bool_) if cold is None else cold,
        np.asarray(anomaly if own is None else own, dtype=float),
        -math.inf if policy.band is None else float(policy.band),
        int(state.run),
    )
    return sev


@_jit
def magnitude(measure: int, value: float, expected: float) -> float:
    """``value`` against ``expected`` in the measure's unit; NaN (never large) where the
    measure means nothing: no expected value, a ratio or a rise over a level at or below 0, a
    deviation relative to an expected 0."""
    if measure == VALUE:
        return value
    if not math.isfinite(expected):
        return math.nan
    if measure == RATIO:
        return value / expected if expected > 0.0 else math.nan
    if measure == RISE:
        return (value - expected) / expected if expected > 0.0 else math.nan
    scale = abs(expected)
    return abs(value - expected) / scale if scale > 0.0 else math.nan


@_jit
def _judge(  # noqa: PLR0917
    value: np.ndarray,
    expected: np.ndarray,
    anomaly: np.ndarray,
    rarity: float,
    measure: int,
    warning: float,
    critical: float,
    persist: int,
    at_once: float,
    held: float,
    critical_persist: int,
    alerts: bool,
    note: float,
    note_rarity: float,
    cold_warning: float,
    cold_critical: float,
    cold: np.ndarray,
    own: np.ndarray,
    band: float,
    run: int,
) -> tuple[np.ndarray, int]:
    n = len(value)
    sev = np.zeros(n, np.int8)
    for i in range(n):
        m = magnitude(measure, value[i], expected[i])
        a = anomaly[i]
        if m >= critical and critical < math.inf:  # an anchor, however common such values are
            run += 1
            sev[i] = CRIT if alerts else INFO
            continue
        if cold[i] and rarity >= 0.0:  # rarity is asked, and not known yet
            if m >= cold_critical:
                sev[i] = CRIT
            elif m >= cold_warning and not own[i] < band:  # NaN: no band yet
                sev[i] = WARN
            if not alerts and sev[i] > INFO:
                sev[i] = INFO
            continue
        # a run goes on with a rare value at least ``held`` large (NaN is never large)
        bar = held if run > 0 else warning
        if not ((rarity < 0.0 or a >= rarity) and m >= bar and not own[i] < band):
            run = 0
            if m >= note and a >= note_rarity:
                sev[i] = INFO
            continue
        run += 1
        if m >= critical or (critical_persist > 0 and run >= critical_persist):
            sev[i] = CRIT
        elif run >= persist or m >= at_once:
            sev[i] = WARN
        elif m >= note and a >= note_rarity:
            sev[i] = INFO
        if not alerts and sev[i] > INFO:
            sev[i] = INFO
    return sev, run


def warm_up() -> None:
    """Compile the kernels, or load them from the cache."""
    one = np.ones(2)
    judge(Policy(), JudgeState(), one, one, one)
    judge_signals(
        JudgeState(),
        CalibrationConfig(warmup=1),
        Policy(),
        Signals.of("w", "m", [0, 1], None, one, 0.5),
    )
