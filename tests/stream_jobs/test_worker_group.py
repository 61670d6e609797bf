"""Two workers of one app id, one SIGKILLed mid-training: its runs move to the other without a
doubled, lost or invented incident, and alert again within seconds. Against the real Kafka.

The scenario (``bench/scale_out.py``) is the scale-out bench's, scaled to about a minute."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.stack, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scale_out.py"
# the session timeout (6 s), the alert (2-4 s), and up to 4 s more where the survivor's table
# recovery stalls and is started over (``recovery_watch``, about one takeover in eight)
TAKEOVER_S = 16.0


def scale_out_module():
    spec = importlib.util.spec_from_file_location("scale_out", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scale_out"] = module  # its dataclasses resolve their module
    spec.loader.exec_module(module)
    return module


def test_a_killed_workers_runs_move_without_doubled_or_false_incidents(kafka, tmp_path):
    so = scale_out_module()
    t = kafka.topics
    env = {
        **os.environ,
        **kafka.env,
        "STEPLENS_TOPIC_RAW": t.raw,
        "STEPLENS_TOPIC_SIGNALS": t.signals,
        "STEPLENS_TOPIC_ALERTS": t.alerts,
        "STEPLENS_TOPIC_DEADLETTER": t.dead_letters,
        "STEPLENS_TOPIC_ADVICE": t.advice,
    }
    # 4 runs x 2 ranks at 30 steps/s, a spike every 150 steps; one worker killed about 40 s in,
    # just before a spike (the takeover is measured to its alert)
    plan = so.Plan(rate=30.0, steps=1500, kills=(1190,))
    v = so.scale_out(env, t.raw, t.alerts, tmp_path, plan, ("--no-history",))
    print(v.line())
    assert (v.lost, v.doubled, v.false) == (0, 0, 0), (v.line(), v.details)
    assert v.takeover_s and max(v.takeover_s) < TAKEOVER_S, v.line()
