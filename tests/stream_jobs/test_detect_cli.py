import csv
import math
import random

from steplens.stream_jobs.detect_cli import main


def test_detect_scores_every_row_and_flags_the_spike(tmp_path, capsys):
    rng = random.Random(0)
    src = tmp_path / "in.csv"
    with src.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss", "queue_depth"])
        for i in range(400):
            loss = 3 * math.exp(-i / 200) + 0.5 + rng.gauss(0, 0.01)
            depth = 1e-4 * (1 + 0.001 * i) + rng.gauss(0, 1e-6)  # near zero, drifting
            if i == 300:
                loss = 50.0
            w.writerow([i, "nan" if i == 350 else f"{loss:.6f}", f"{depth:.9f}"])
    out = tmp_path / "out.csv"
    assert main([str(src), "--out", str(out)], prog="steplens detect") == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 400
    assert {"anomaly_score", "alert", "spike_loss", "arima_queue_depth"} <= set(rows[0])
    assert all(0.0 <= float(r["anomaly_score"]) <= 1.0 for r in rows)
    flagged = [int(r["step"]) for r in rows if r["alert"] == "1"]
    assert 300 in flagged and 350 in flagged
    assert not [s for s in flagged if s < 300]  # no false alarm on the decay
    printed = capsys.readouterr().out
    assert "spike:loss" in printed and "nonfinite" in printed


def test_detect_reports_a_missing_file(tmp_path, capsys):
    assert main([str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o.csv")]) == 2


def test_read_rows_pads_short_rows_cuts_long_ones_and_skips_blank_lines():
    import io

    from steplens.stream_jobs.detect_cli import read_rows

    text = "step,loss,x\n0,1.0,2\n\n1,1.1\n2,1.2,3,9\n"
    columns, rows = read_rows(io.StringIO(text))
    assert columns == ["step", "loss", "x"]
    assert rows == [["0", "1.0", "2"], ["1", "1.1", ""], ["2", "1.2", "3"]]
    # the same cells csv.DictReader would give
    want = [[r.get(c) or "" for c in columns] for r in csv.DictReader(io.StringIO(text))]
    assert rows == want
