"""Reading the demo's printed scorecard."""

from __future__ import annotations

import re


def scorecard(output: str) -> dict[str, str]:
    """Incident kind -> CAUGHT / MISSED, from the demo's printed scorecard."""
    pattern = r"^(CAUGHT|MISSED)\s+(\w+) \("
    return {kind: mark for mark, kind in re.findall(pattern, output, re.M)}
