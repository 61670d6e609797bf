import csv
import math
import random

from steplens.stream_jobs.offline.cli import main


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
    with out.open() as f:
        rows = list(csv.DictReader(f))
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

    from steplens.stream_jobs.offline.cli import read_rows

    text = "step,loss,x\n0,1.0,2\n\n1,1.1\n2,1.2,3,9\n"
    columns, rows = read_rows(io.StringIO(text))
    assert columns == ["step", "loss", "x"]
    assert rows == [["0", "1.0", "2"], ["1", "1.1", ""], ["2", "1.2", "3"]]
    # the same cells csv.DictReader would give
    want = [[r.get(c) or "" for c in columns] for r in csv.DictReader(io.StringIO(text))]
    assert rows == want


def test_write_rows_writes_what_csv_writer_writes():
    """Plain rows are joined by hand; any field csv.writer would quote takes its path."""
    import io

    from steplens.stream_jobs.offline.cli import ABSENT, write_rows

    columns = ["step", "note", "x"]
    rows = [
        ["0", "plain", "1.5"],
        ["1", "a,b", "2"],
        ["2", 'say "hi"', ""],
        ["3", "two\nlines", "x"],
        ["4", "", " sp "],
        ["5", "cr\r", "3"],
    ]
    # per row: anomaly_score, alert, then the signal columns known by then (absent or missing)
    results = [
        [0.25, 0.0, 0.125],
        [1.0, 1.0, ABSENT, 0.5],
        [0.0, 0.0],
        [0.33335, 1.0, 0.0, 0.99999],
        [0.5, 0.0, 0.5, ABSENT],
        [0.1, 0.0, 0.2, 0.3],
    ]
    signals = ["spike_x", "arima_x"]
    got = io.StringIO(newline="")
    write_rows(got, columns, signals, rows, results)
    want = io.StringIO(newline="")
    w = csv.writer(want)
    w.writerow([*columns, "anomaly_score", "alert", *signals])
    for row, res in zip(rows, results, strict=True):
        full = res + [ABSENT] * (4 - len(res))
        scores = [f"{v:.4f}" if v != ABSENT else f"{0.0:.4f}" for v in full[2:]]
        w.writerow([*row, f"{full[0]:.4f}", int(full[1]), *scores])
    assert got.getvalue() == want.getvalue()
    back = list(csv.reader(io.StringIO(got.getvalue())))
    assert back[2][1] == "a,b" and back[4][1] == "two\nlines" and back[2][5] == "0.0000"


def test_detect_keeps_quoted_and_repeated_columns(tmp_path):
    src = tmp_path / "in.csv"
    with src.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "note", "loss", "loss"])
        for i in range(120):
            w.writerow([i, "a,b" if i % 3 else 'q"', 9.0, 2.0 + 0.01 * (i % 5)])
    out = tmp_path / "out.csv"
    assert main([str(src), "--out", str(out), "--quiet", "--no-arima"]) == 0
    rows = list(csv.reader(out.open(newline="")))
    assert rows[0][:6] == ["step", "note", "loss", "loss", "anomaly_score", "alert"]
    assert rows[2][:4] == ["1", "a,b", "2.01", "2.01"]  # a repeated name: its last column
    assert rows[1][1] == 'q"' and len({len(r) for r in rows}) == 1
