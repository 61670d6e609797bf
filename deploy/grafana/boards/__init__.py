"""The steplens Grafana boards on InfluxDB, written from one description.

    cd deploy/grafana && python -m boards   # rewrites dashboards/{training,hardware,alerts}.json

Every panel's query comes from ``flux.py`` (the hot bucket for the last hour, the 1-minute
rollups before that), so the boards work from 5 minutes to 30 days. Each panel lists the
fields it plots in ``steplensFields``; ``tests/e2e/test_dashboards.py`` runs every query
against the real InfluxDB, asks for those fields, and checks the files match this package.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .alerts import alerts
from .hardware import hardware
from .training import training

OUT = Path(__file__).parents[1] / "dashboards"
BOARDS: dict[str, Callable[[], dict[str, Any]]] = {
    "training": training,
    "hardware": hardware,
    "alerts": alerts,
}


def render(make: Callable[[], dict[str, Any]]) -> str:
    return json.dumps(make(), indent=2, ensure_ascii=False) + "\n"


def write_all(out: Path = OUT) -> list[Path]:
    paths = []
    for name, make in BOARDS.items():
        path = out / f"{name}.json"
        path.write_text(render(make))
        paths.append(path)
    return paths
