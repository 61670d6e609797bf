"""A run's checkpoint packing (``state.Codec.pack``) against another release's codec, on the
same state: the series of N simulated ranks (``sim_ranks.py``, the producer's own code) after
``--steps`` steps, scored by one ``RunDetector``, and its head. Checks that both codecs write
the same bytes, then prints each one's best time over ``--repeats`` and the ratio.

``--against REV``: the git revision whose ``engine/state.py`` is the baseline (loaded from
git into a module of its own, given this release's state classes).

    python bench/bench_state_codec.py --ranks 256 --steps 60 --against 3c82131
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_rank_state import fleet_records  # noqa: E402
from steplens.stream_jobs.engine import detector  # noqa: E402

STATE = "stream_jobs/src/steplens/stream_jobs/engine/state.py"


def codec_at(rev: str) -> Any:
    """``Codec`` of ``rev``'s state module, for this release's state classes."""
    text = subprocess.run(
        ["git", "show", f"{rev}:{STATE}"],
        cwd=HERE.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("state_baseline", f.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Codec(detector.CODEC.classes.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--against", required=True, help="git revision of the baseline codec")
    a = ap.parse_args()
    records = fleet_records(a.ranks, a.steps)
    det = detector.RunDetector(records[0].run_id)
    for rec in records:
        det.process(rec)
    head, ranks = det.dump(det.series)  # what a checkpoint writes, read back
    values = [detector.CODEC.unpack(blob) for blob in (*ranks.values(), head)]
    codecs = {"baseline": codec_at(a.against), "this": detector.CODEC}
    packed = {name: [c.pack(v) for v in values] for name, c in codecs.items()}
    same = packed["baseline"] == packed["this"]
    best: dict[str, float] = {}
    for _ in range(a.repeats):
        for name, c in codecs.items():
            t = time.perf_counter()
            for v in values:
                c.pack(v)
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t)
    size = sum(map(len, packed["this"]))
    print(
        f"{len(values)} values, {size / 1e6:.2f} MB, same bytes: {same}; baseline "
        f"{best['baseline'] * 1e3:.1f} ms, this {best['this'] * 1e3:.1f} ms, "
        f"ratio {best['this'] / best['baseline']:.2f}"
    )


if __name__ == "__main__":
    main()
