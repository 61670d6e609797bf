"""Follow steplens runs into MLflow, live: their curves, parameters, incidents, advice and
summary (optional). With the stack's MLflow server this is the live view of a run.

A sink-side consumer, never part of the training process: it reads the raw topic (steps,
windows, evaluations, hardware, batches, run_meta, the ranks' answers to advice), the signals
topic, the alerts topic and the advice topic, and writes to one MLflow run per steplens run
(found by the tag ``steplens.run_id``, created when missing):

- the curves (``mlflow_curves.py``): training, windows, evaluations, hardware per host and
  GPU, data quality and ``alert/<rule>`` as metrics at their steps; rank 0's ``run_meta`` as
  parameters (MLflow keeps a parameter's first value: a changed one goes to the tag
  ``steplens.param.<name>``);
- an alert (an incident) -> tag ``steplens.alert.<fingerprint>`` with severity, state, scope,
  step, hint and the incident's member rules; an incident the stream jobs gave advice for also
  tag ``steplens.advice.<fingerprint>``: each piece of advice and the ranks' answers so far,
  one line each (the worker reports the incident again as answers come in); and the run's
  description (``mlflow_board.py``), a table of its incidents and their advice, which the run's
  page shows first;
- the run's summary (``mlflow_summary.py``): metrics ``summary/loss_spike_peak_rise``,
  ``summary/clip_rate``, ``summary/mfu_mean``, ``summary/incidents``,
  ``summary/incidents_critical``, ``summary/incidents_open``, ``summary/advice``,
  ``summary/answers_<outcome>`` at the run's last step, and tag
  ``steplens.summary.loss_spike_peak`` (its step, loss and baseline). The metrics are written
  at most every ``summary_interval_s`` per run and when the mirror stops; the tag
  ``steplens.summary.state`` (the counts and the offsets they hold) with every batch, so a
  restarted mirror goes on from it and counts no record twice.

Needs ``mlflow`` (or ``mlflow-skinny``) and a tracking URI (``--tracking-uri`` or
``MLFLOW_TRACKING_URI``; `steplens stack env` sets it to the stack's server). The mirror is an
output behind the consumer loop (``loop.py``): a batch is what arrived within ``interval_s``
(2 s; at most 1,000 messages), written with a few ``log_batch`` calls, so MLflow sees a bounded
rate of requests; memory is bounded by the batch, ``MAX_POINTS`` points per batch and
``MAX_KEYS_PER_RUN`` metric keys per run (past them points are counted, not written).
Delivery is at least once, offsets are committed after MLflow accepted a batch (a replayed
batch logs the same metric points again, which MLflow stores once); a batch MLflow could not
take now (unreachable, 5xx) is exported again; a request MLflow refuses (4xx) is split until
the refused records are found, and those go to the dead-letter topic, as undecodable records
do.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steplens.schema import Record
from steplens.schema.log_limit import LimitedLog
from steplens.sinks.contract import ExportResult, Rejection
from steplens.sinks.mlflow_board import ADVICE_PREFIX, ALERT_PREFIX, NOTE_TAG, Board
from steplens.sinks.mlflow_curves import Point, params, points
from steplens.sinks.mlflow_summary import RunSummary
from steplens.sinks.remedies import advice_text

if TYPE_CHECKING:  # the Kafka client is imported only when the mirror consumes
    from steplens.sinks.kafka_io import Consumed

log = logging.getLogger("steplens.sinks.mlflow")
limited = LimitedLog(log)  # what repeats every batch: once a minute

RUN_TAG = "steplens.run_id"
MAX_BATCH = 900  # MLflow accepts at most 1000 metrics, 100 params and 100 tags per log_batch
MAX_TAGS = 90
MAX_PARAMS = 90
MAX_PARAMS_PER_RUN = 500
MAX_KEYS_PER_RUN = 1000  # metric keys of one run (hosts and GPUs make keys)
MAX_POINTS = 100_000  # metric points of one batch
INTERVAL_S = 2.0  # the longest a record waits for its batch (one MLflow write per batch)
MAX_TAG_LEN = 5000
MAX_RUNS = 1000  # summaries kept in memory; an older one is read back from its tag if needed
STATE_TAG = "steplens.summary.state"
PEAK_TAG = "steplens.summary.loss_spike_peak"
SUMMARY_KINDS = frozenset(
    ("step", "step_window", "step_batch", "signal", "alert", "advice", "acted")
)
KINDS = SUMMARY_KINDS | {"eval", "hw", "batch", "run_meta"}  # what the mirror reads
Position = tuple[str, int, int]  # topic, partition, offset


@dataclass
class RunView:
    board: Board
    params: dict[str, str]  # what the MLflow run holds
    keys: set[str] = field(default_factory=set)  # metric keys drawn by this mirror


def mlflow_available() -> bool:
    try:
        import mlflow  # noqa: F401
    except ImportError:
        return False
    return True


def refused(exc: BaseException) -> bool:
    """MLflow refused the request itself (a 4xx but 429): sending it again cannot help."""
    from mlflow.exceptions import MlflowException

    if not isinstance(exc, MlflowException):
        return False
    status = exc.get_http_status_code()
    return 400 <= status < 500 and status != 429


class MlflowMirror:
    """Writes steplens records into MLflow runs of one experiment (of ``only_run``, if set)."""

    name = "mlflow"

    def __init__(
        self,
        tracking_uri: str,
        experiment: str = "steplens",
        summary_interval_s: float = 30.0,
        only_run: str | None = None,
    ) -> None:
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (
            found.experiment_id if found is not None else self.client.create_experiment(experiment)
        )
        self._runs: dict[str, str] = {}  # steplens run id -> MLflow run id
        self.summary_interval_s = summary_interval_s
        self._summaries: dict[str, RunSummary] = {}  # the runs seen lately (MAX_RUNS)
        self._changed: set[str] = set()  # runs whose summary metrics are behind their state
        self._unsaved: set[str] = set()  # runs whose state tag is behind their state
        self._written: dict[str, float] = {}  # run -> when its summary metrics were written
        self.only_run = only_run
        self._views: dict[str, RunView] = {}  # the runs seen lately (MAX_RUNS)
        self.mirrored = 0  # records mirrored by ``export``
        self.points_dropped_total = 0
        self._drawn = self._dropped = 0  # points of the batch being written
        self._lock = threading.Lock()  # ``export`` and the summary timer, one at a time

    # ------------------------------------------------------------------ the output
    def export(self, batch: list[Consumed]) -> ExportResult:
        """Mirror the decoded messages of ``batch`` (the kinds it reads, of ``only_run``)."""
        part: list[tuple[int, Record, Position]] = []
        for i, item in enumerate(batch):
            rec = item.decoded
            if not isinstance(rec, Record) or rec.kind not in KINDS:
                continue
            if self.only_run is None or rec.run_id == self.only_run:
                part.append((i, rec, (item.topic, item.partition, item.offset)))
        try:
            with self._lock:
                rejected = self._mirror(part)
                self.flush_summaries()
        except Exception as exc:  # the contract: export never raises
            return ExportResult.retry(f"{type(exc).__name__}: {exc}")
        return ExportResult(
            accepted=len(part) - len(rejected), rejected=rejected, skipped=len(batch) - len(part)
        )

    def _mirror(self, part: list[tuple[int, Record, Position]]) -> list[Rejection]:
        """Write ``part``; on a refusal, halve until the refused records are found. Raises
        when MLflow could not take it now."""
        if not part:
            return []
        try:
            self.mirrored += self.handle([r for _, r, _ in part], [p for _, _, p in part])
            return []
        except Exception as exc:
            if not refused(exc):
                raise
            if len(part) == 1:
                return [Rejection(part[0][0], f"refused by MLflow: {exc}"[:1000])]
        mid = len(part) // 2
        return self._mirror(part[:mid]) + self._mirror(part[mid:])

    def flush_due(self) -> None:
        """The summary metrics that are due (the timer's call, between batches)."""
        with self._lock:
            self.flush_summaries()

    def shutdown(self) -> None:
        """Write every changed summary now: one attempt (the state tag keeps the counts)."""
        try:
            with self._lock:
                self.flush_summaries(force=True)
        except Exception as exc:
            log.warning("mlflow: summaries not written at shutdown: %s", exc)

    def mlflow_run(self, run_id: str) -> str:
        """The MLflow run of a steplens run: found by tag, else created."""
        cached = self._runs.get(run_id)
        if cached is not None:
            return cached
        escaped = run_id.replace("'", "\\'")
        found = self.client.search_runs(
            [self.experiment_id], f"tags.`{RUN_TAG}` = '{escaped}'", max_results=1
        )
        if found:
            mlflow_id = found[0].info.run_id
        else:
            run = self.client.create_run(
                self.experiment_id, run_name=run_id, tags={RUN_TAG: run_id, "source": "steplens"}
            )
            mlflow_id = run.info.run_id
        self._runs[run_id] = mlflow_id
        return mlflow_id

    def page_url(self, run_id: str | None = None) -> str | None:
        """The address of the run's page in the MLflow UI (the run made if missing), or the
        experiment's; None unless the tracking URI is a server's."""
        base = self.tracking_uri.rstrip("/")
        if not base.startswith(("http://", "https://")):
            return None
        page = f"{base}/#/experiments/{self.experiment_id}"
        return f"{page}/runs/{self.mlflow_run(run_id)}" if run_id else page

    def summary(self, run_id: str) -> RunSummary:
        """The run's summary: in memory, else as the MLflow run's state tag left it."""
        found = self._summaries.get(run_id)
        if found is None:
            tags = self.client.get_run(self.mlflow_run(run_id)).data.tags
            state = tags.get(STATE_TAG)
            found = RunSummary.loads(state) if state else RunSummary()
            self._summaries[run_id] = found
            if len(self._summaries) > MAX_RUNS:
                oldest = next(iter(self._summaries))
                if oldest not in self._unsaved:  # else it goes when its state is saved
                    self._write_summary(oldest)
                    del self._summaries[oldest]
                self._written.pop(oldest, None)
        return found

    def view(self, run_id: str) -> RunView:
        """What the mirror keeps of a run besides its summary: read from the MLflow run once."""
        found = self._views.get(run_id)
        if found is None:
            data = self.client.get_run(self.mlflow_run(run_id)).data
            found = RunView(board=Board.from_tags(data.tags), params=dict(data.params))
            self._views[run_id] = found
            if len(self._views) > MAX_RUNS:
                del self._views[next(iter(self._views))]
        return found

    def handle(
        self, records: Iterable[Record], positions: Iterable[Position | None] | None = None
    ) -> int:
        """Mirror ``records`` (read at ``positions``, for the summary's offsets); returns how
        many were mirrored (drawn, counted or described)."""
        from mlflow.entities import Metric, Param, RunTag

        self._drawn = self._dropped = 0
        metrics: dict[str, list[Any]] = {}
        tags: dict[str, list[Any]] = {}
        new_params: dict[str, list[Any]] = {}
        boards: set[str] = set()
        used = 0
        records = list(records)
        where = list(positions) if positions is not None else [None] * len(records)
        for rec, position in zip(records, where, strict=True):
            run_id = rec.run_id
            if rec.kind in SUMMARY_KINDS and self.summary(run_id).add(rec, position):
                self._unsaved.add(run_id)
            drawn = self._keep(run_id, points(rec, max(self.summary(run_id).last_step, 0)))
            metrics.setdefault(run_id, []).extend(Metric(*p) for p in drawn)
            used += bool(drawn) or rec.kind == "run_meta"
            if rec.kind == "run_meta":
                view = self.view(run_id)
                for name, value in params(rec).items():
                    if name not in view.params and len(view.params) < MAX_PARAMS_PER_RUN:
                        new_params.setdefault(run_id, []).append(Param(name, value))
                    elif view.params.get(name, value) != value:  # MLflow keeps a param's first
                        tags.setdefault(run_id, []).append(RunTag(f"steplens.param.{name}", value))
            elif rec.kind == "alert":
                d = rec.data
                at = f" step {rec.step}" if rec.step is not None else ""  # a hang has none
                text = f"{d['severity']} {d['state']} {d['scope']}{at}: {d['hint']}"
                members = (d.get("evidence") or {}).get("members") or []
                rules = [str(m.get("rule")) for m in members if isinstance(m, dict)]
                if rules:
                    text += f" [rules: {', '.join(dict.fromkeys(rules))}]"
                text = text[:MAX_TAG_LEN]
                given = advice_text(d.get("evidence") or {})[:MAX_TAG_LEN]
                out = tags.setdefault(run_id, [])
                out.append(RunTag(f"{ALERT_PREFIX}{d['fingerprint']}", text))
                if given:
                    out.append(RunTag(f"{ADVICE_PREFIX}{d['fingerprint']}", given))
                self.view(run_id).board.update(str(d["fingerprint"]), text, given)
                boards.add(run_id)
        for run_id in boards:
            tags[run_id].append(RunTag(NOTE_TAG, self.view(run_id).board.markdown()))
        saving = set(self._unsaved)  # also what a failed attempt before this one did not save
        for run_id in saving:
            s = self._summaries[run_id]
            tags.setdefault(run_id, []).extend(
                [RunTag(STATE_TAG, s.dumps()), RunTag(PEAK_TAG, s.peak_text())]
            )
            self._changed.add(run_id)
        for run_id in set(metrics) | set(tags) | set(new_params):
            mlflow_id = self.mlflow_run(run_id)
            m, t = metrics.get(run_id, []), _last_per_key(tags.get(run_id, []))
            ps = _last_per_key(new_params.get(run_id, []))
            for i in range(0, len(ps), MAX_PARAMS):
                self.client.log_batch(mlflow_id, params=ps[i : i + MAX_PARAMS])
            self.view(run_id).params.update((p.key, p.value) for p in ps)
            for i in range(0, len(m), MAX_BATCH):
                self.client.log_batch(mlflow_id, metrics=m[i : i + MAX_BATCH])
            for i in range(0, len(t), MAX_TAGS):
                self.client.log_batch(mlflow_id, tags=t[i : i + MAX_TAGS])
        self._unsaved -= saving
        self.points_dropped_total += self._dropped
        if self._dropped:
            limited.warning(
                "mlflow points left out",
                "mlflow: %d points left out (past %d keys per run or %d points per batch; "
                "%d in all)",
                self._dropped,
                MAX_KEYS_PER_RUN,
                MAX_POINTS,
                self.points_dropped_total,
            )
        return used

    def _keep(self, run_id: str, found: list[Point]) -> list[Point]:
        """``found`` within the caps: ``MAX_KEYS_PER_RUN`` keys per run, ``MAX_POINTS`` per
        batch; the rest counted in ``points_dropped_total``."""
        if not found:
            return found
        keys = self.view(run_id).keys
        kept = []
        for p in found:
            if self._drawn >= MAX_POINTS:
                self._dropped += 1
                continue
            if p[0] not in keys:
                if len(keys) >= MAX_KEYS_PER_RUN:
                    self._dropped += 1
                    continue
                keys.add(p[0])
            kept.append(p)
            self._drawn += 1
        return kept

    def flush_summaries(self, force: bool = False) -> None:
        """Write the summary metrics of the runs whose summary changed, at most every
        ``summary_interval_s`` per run (``force``: now)."""
        now = time.time()
        for run_id in list(self._changed):
            if force or now - self._written.get(run_id, 0.0) >= self.summary_interval_s:
                self._write_summary(run_id)

    def _write_summary(self, run_id: str) -> None:
        from mlflow.entities import Metric

        if run_id not in self._changed:
            return
        s, now = self._summaries[run_id], time.time()
        ts_ms, step = int(now * 1000), max(s.last_step, 0)
        batch = [Metric(k, v, ts_ms, step) for k, v in s.metrics().items()]
        self.client.log_batch(self.mlflow_run(run_id), metrics=batch)
        self._written[run_id] = now
        self._changed.discard(run_id)


def _last_per_key(tags: list[Any]) -> list[Any]:
    """A tag written twice in one batch is rejected by MLflow: keep the latest value."""
    return list({t.key: t for t in tags}.values())


def run_mirror(
    mirror: MlflowMirror,
    bootstrap: str,
    topics: list[str],
    *,
    group: str,
    stop: threading.Event,
    dead_letter_topic: str | None = None,
    max_s: float | None = None,
    interval_s: float = INTERVAL_S,
) -> int:
    """Mirror ``topics`` until ``stop`` is set (or ``max_s`` passed), behind the consumer
    loop: a batch is what arrived within ``interval_s`` (at most 1000 messages), so MLflow
    gets one write per batch; the summary metrics that are due are written every second
    between batches, all of them at the end. Returns the records mirrored."""
    from confluent_kafka import Consumer

    from steplens.schema.kafka_config import consumer_config
    from steplens.schema.topics import Topics
    from steplens.sinks.kafka_io import DeadLetters
    from steplens.sinks.loop import MessageLoop
    from steplens.sinks.periodic import Every

    consumer = Consumer(consumer_config(group, bootstrap))
    dead = DeadLetters(dead_letter_topic or Topics.from_env().dead_letters, group, bootstrap)
    consumer.subscribe(topics)
    summaries = Every(1.0, mirror.flush_due, "mlflow-summaries")
    try:
        MessageLoop(
            consumer, mirror, dead, stop=stop, batch_size=1000, poll_timeout_s=interval_s
        ).run(max_s)
    finally:
        summaries.stop()
        mirror.shutdown()
        consumer.close()
        dead.flush(5)
    return mirror.mirrored


def main(argv: list[str], prog: str = "steplens mlflow") -> int:
    p = argparse.ArgumentParser(
        prog=prog,
        description="follow runs into MLflow: their curves, parameters, incidents, advice "
        "and summary",
    )
    p.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI"))
    p.add_argument("--experiment", default=os.environ.get("STEPLENS_MLFLOW_EXPERIMENT", "steplens"))
    p.add_argument("--bootstrap", help="Kafka bootstrap (default: STEPLENS_KAFKA_BOOTSTRAP)")
    p.add_argument("--group", default="steplens-mlflow")
    p.add_argument("--run", help="mirror only this run")
    p.add_argument("--max-s", type=float, help="stop after this many seconds")
    p.add_argument(
        "--interval",
        type=float,
        default=INTERVAL_S,
        help=f"seconds a batch gathers records before one MLflow write (default {INTERVAL_S})",
    )
    p.add_argument(
        "--url-file",
        type=Path,
        help="write the address of the run's page (--run) or the experiment's here once "
        "MLflow answers",
    )
    p.add_argument(
        "--summary-interval",
        type=float,
        default=30.0,
        help="write a run's summary metrics at most this often (seconds; and at the end)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not mlflow_available():
        print(
            f"{prog}: mlflow is not installed (pip install 'steplens-sinks[mlflow]')",
            file=sys.stderr,
        )
        return 3
    if not args.tracking_uri:
        print(f"{prog}: no tracking URI (--tracking-uri or MLFLOW_TRACKING_URI)", file=sys.stderr)
        return 2
    from steplens.schema.settings import kafka_bootstrap
    from steplens.schema.topics import Topics

    topics = Topics.from_env()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    mirror = MlflowMirror(args.tracking_uri, args.experiment, args.summary_interval, args.run)
    url = mirror.page_url(args.run)
    if url:
        log.info("live view: %s", url)
    if args.url_file:
        args.url_file.write_text(f"{url or args.tracking_uri}\n")
    try:
        used = run_mirror(
            mirror,
            kafka_bootstrap(args.bootstrap),
            [topics.raw, topics.signals, topics.alerts, topics.advice],
            group=args.group,
            stop=stop,
            dead_letter_topic=topics.dead_letters,
            max_s=args.max_s,
            interval_s=args.interval,
        )
    except KeyboardInterrupt:
        return 130
    log.info("mirrored %d records into MLflow experiment %r", used, args.experiment)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
