"""The report's page in a real browser: headless Chromium loads it, and the DOM it builds has
one row per incident, a working link to each incident's evidence, the checks, and every figure.

Skipped where no Chromium is installed (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from report_data import synthetic_run

from steplens.sinks.report_figures import FIGURES
from steplens.sinks.report_incidents import run_incidents
from steplens.sinks.report_page import write_report

BROWSER = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium to render the page")


class Dom(HTMLParser):
    """Elements as (tag, attributes, text inside), in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self._open: list[int] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}, []))
        if tag not in {"img", "br", "meta", "link", "input"}:
            self._open.append(len(self.elements) - 1)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self.elements[self._open.pop()][0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for i in self._open:
            self.elements[i][2].append(data)

    def find(self, tag: str, cls: str | None = None) -> list[tuple[dict[str, str], str]]:
        return [
            (attrs, "".join(text))
            for t, attrs, text in self.elements
            if t == tag and (cls is None or cls in attrs.get("class", "").split())
        ]


def rendered(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None
    return subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",  # root in a container
            "--disable-gpu",
            f"--user-data-dir={profile}",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_the_browser_shows_one_row_per_incident_and_opens_its_evidence(tmp_path):
    data = synthetic_run()
    index = write_report(data, tmp_path / "report")
    url = index.resolve().as_uri()
    dom = Dom()
    dom.feed(rendered(f"{url}#incident-3", tmp_path / "profile", "--dump-dom").stdout)

    rows = dom.find("tr", "incident")
    assert len(data.alerts) == 6 and len(rows) == len(run_incidents(data)) == 3
    first = rows[0][1]
    assert "correlation:loss_grad" in first and "critical" in first
    assert "resolved at step 170" in first and "19 steps, 10 s" in first
    assert "open" in rows[1][1] and "evaluate every 62 steps" in rows[2][1]
    links = [a["href"] for a, text in dom.find("a") if text == "evidence"]
    assert links == ["#incident-1", "#incident-2", "#incident-3"]
    details = {a["id"]: a for a, _ in dom.find("details") if "id" in a}
    assert set(details) == {"incident-1", "incident-2", "incident-3"}
    assert "open" in details["incident-3"] and "open" not in details["incident-1"]

    checks = dom.find("tr", "check")
    assert len(checks) == 2
    (off,) = dom.find("tr", "state-off")
    assert "sl.probe_comm(every=100)" in off[1]
    (said,) = [text for _, text in dom.find("li") if "turn it on" in text]
    assert "inter-rank communication latency" in said and "sl.probe_comm(every=100)" in said
    images = [a["src"] for a, _ in dom.find("img")]
    assert images == [f"{name}.png" for name in FIGURES]
    assert all((index.parent / src).stat().st_size > 5_000 for src in images)


def test_the_browser_draws_the_page(tmp_path):
    """A screenshot of the top of the page: the incident table's severities in colour."""
    import numpy as np
    from PIL import Image

    index = write_report(synthetic_run(), tmp_path / "report")
    shot = tmp_path / "page.png"
    rendered(
        index.resolve().as_uri(),
        tmp_path / "profile",
        f"--screenshot={shot}",
        "--window-size=1200,900",
        "--hide-scrollbars",
    )
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 900)
    r, g, b = np.asarray(image, dtype=np.int32).transpose(2, 0, 1)
    assert ((r > 150) & (g < 60) & (b < 80)).sum() > 50  # "critical" in #b2182b
