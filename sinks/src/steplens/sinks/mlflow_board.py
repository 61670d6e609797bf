"""A run's incidents and the advice given for them as one Markdown table: the MLflow run's
description (tag ``mlflow.note.content``), which its page shows above the charts (pure; no
MLflow here).

Each incident is a row of its latest texts, the ones the mirror also keeps in the tags
``steplens.alert.<fingerprint>`` and ``steplens.advice.<fingerprint>``, so a restarted mirror
builds the same table from the run's tags. At most ``MAX_ROWS`` incidents are remembered (the
latest opened); older ones are counted. The text stays under MLflow's tag limit (8,000
characters): rows that do not fit are counted too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

NOTE_TAG = "mlflow.note.content"
ALERT_PREFIX = "steplens.alert."
ADVICE_PREFIX = "steplens.advice."
MAX_ROWS = 50
MAX_NOTE_LEN = 7900


@dataclass
class Board:
    rows: dict[str, list[str]] = field(default_factory=dict)  # fingerprint -> [alert, advice]
    earlier: int = 0  # incidents no longer remembered

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Board:
        board = cls()
        for name, text in tags.items():
            if name.startswith(ALERT_PREFIX):
                fp = name.removeprefix(ALERT_PREFIX)
                board.update(fp, text, tags.get(ADVICE_PREFIX + fp, ""))
        return board

    def update(self, fingerprint: str, alert: str, advice: str | None) -> None:
        row = self.rows.get(fingerprint)
        if row is None:
            self.rows[fingerprint] = row = ["", ""]
            if len(self.rows) > MAX_ROWS:
                del self.rows[next(iter(self.rows))]
                self.earlier += 1
        row[0] = alert
        if advice:
            row[1] = advice

    def markdown(self) -> str:
        """The table, newest incident first, within ``MAX_NOTE_LEN`` characters."""
        firing = sum(1 for alert, _ in self.rows.values() if _state(alert) == "firing")
        head = (
            f"**steplens: {len(self.rows) + self.earlier} incidents, {firing} open**\n\n"
            "| incident | advice and answers |\n|---|---|\n"
        )
        lines = []
        size = len(head)
        left_out = self.earlier
        for alert, advice in reversed(self.rows.values()):
            line = f"| {_cell(alert)} | {_cell(advice) or '-'} |\n"
            if size + len(line) > MAX_NOTE_LEN - 80:
                left_out += 1
                continue
            lines.append(line)
            size += len(line)
        more = f"\n{left_out} earlier incidents not shown.\n" if left_out else ""
        return head + "".join(lines) + more


def _state(alert: str) -> str:
    words = alert.split(" ", 2)
    return words[1] if len(words) > 1 else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "; ").strip()
