"""Faust's ``processing_guarantee="exactly_once"`` against its default, on the worker's shape.

The worker reads raw records keyed by run and rank (spread over the raw partitions) and forwards
them keyed by run to its by-run topic, so that one agent judges a run's ranks together. This
bench runs that hop alone in a Faust app of two agents, ``hop`` (source -> middle, re-keyed)
and ``count`` (middle), under each guarantee, against the real Kafka:

  * ``rekeyed``: the worker's hop (source key ``run:rank``, middle key ``run``);
  * ``same key``: a hop that keeps the source's key (each middle partition is fed from the
    source partition of the same number, the co-partitioning Faust's transactions assume).

For each it prints how many of the records sent reached ``count`` within the wait, their
latency from the send (p50/p99), the source offsets the group committed and the middle
messages a ``read_committed`` reader sees against all those written. One source of records
(``--runs`` runs of ``--ranks`` ranks at ``--rate`` records/s for ``--seconds``), the same for
every case, in one run.

    python bench/bench_faust_exactly_once.py               # about 4 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from scratch_topics import scratch_topics

PARTITIONS = 8


def child(args: argparse.Namespace) -> None:
    """A Faust app: ``hop`` forwards each source record to the middle topic, ``count`` writes
    each one it sees (its send time and its arrival) to ``args.seen`` as a JSON line."""
    import logging

    import faust

    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.bootstrap}",
        store="memory://",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        datadir=tempfile.mkdtemp(prefix="bench-eos-"),
        processing_guarantee=args.guarantee,
    )
    src = app.topic(args.source, key_serializer="raw", value_serializer="raw")
    mid = app.topic(args.middle, key_serializer="raw", value_serializer="raw")
    out = Path(args.seen).open("a", buffering=1)  # noqa: SIM115 (open for the app's life)

    async def hop(stream):  # type: ignore[no-untyped-def]
        async for event in stream.events():
            key = event.key
            if args.rekey:
                key = key.split(b":", 1)[0]  # run:rank -> run, as the worker's route agent
            await mid.send(key=key, value=event.value)

    async def count(stream):  # type: ignore[no-untyped-def]
        async for value in stream:
            out.write(json.dumps([json.loads(value)["t"], time.time()]) + "\n")

    app.agent(src, name="hop")(hop)
    app.agent(mid, name="count")(count)

    @app.task
    async def quiet_logs() -> None:
        logging.getLogger().setLevel(logging.WARNING)

    sys.argv = [sys.argv[0], "worker", "-l", "warn"]
    app.main()


def one_case(boot: str, guarantee: str, rekey: bool, args: argparse.Namespace) -> dict:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from steplens.schema.topics import TopicSpec, create_missing

    tag = uuid.uuid4().hex[:8]
    source, middle, app_id = f"eos.{tag}.source", f"eos.{tag}.middle", f"eos-{tag}"
    create_missing(boot, [TopicSpec(source, PARTITIONS, {}), TopicSpec(middle, PARTITIONS, {})])
    seen = Path(tempfile.mkdtemp(prefix="bench-eos-")) / "seen.jsonl"
    seen.touch()
    cmd = [sys.executable, __file__, "--child", "--app-id", app_id, "--guarantee", guarantee]
    cmd += ["--source", source, "--middle", middle, "--seen", str(seen), "--bootstrap", boot]
    cmd += ["--rekey"] if rekey else []
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    p = Producer({"bootstrap.servers": boot, "linger.ms": 5})
    try:
        # until the app has joined its group: a first record comes through
        ready_deadline = time.monotonic() + 90
        while not seen.read_text() and time.monotonic() < ready_deadline:
            p.produce(source, json.dumps({"t": time.time()}).encode(), key=b"ready:0")
            p.flush(5)
            time.sleep(1.0)
        ready = len(seen.read_text().splitlines())
        sent = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            for run in range(args.runs):
                for rank in range(args.ranks):
                    key = f"run{run}:{rank}".encode()
                    p.produce(source, json.dumps({"t": time.time()}).encode(), key=key)
                    sent += 1
            p.poll(0)
            time.sleep(args.runs * args.ranks / args.rate)
        p.flush(30)
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            if len(seen.read_text().splitlines()) - ready >= sent:
                break
            time.sleep(0.5)
        lines = seen.read_text().splitlines()[ready:]
        lat = sorted(b - a for a, b in (json.loads(x) for x in lines))
        admin = AdminClient({"bootstrap.servers": boot})
        from confluent_kafka import ConsumerGroupTopicPartitions

        futs = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(app_id)])
        committed = sum(
            tp.offset
            for f in futs.values()
            for tp in f.result().topic_partitions
            if tp.topic == source and tp.offset > 0
        )
        visible = {
            iso: count_topic(boot, middle, iso) for iso in ("read_uncommitted", "read_committed")
        }
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    fenced = b"ProducerFenced" in err
    if os.environ.get("BENCH_EOS_LOG"):
        Path(os.environ["BENCH_EOS_LOG"]).write_bytes(err)
    return {
        "guarantee": guarantee,
        "hop": "rekeyed" if rekey else "same key",
        "sent": sent,
        "reached": len(lat),
        "p50": lat[len(lat) // 2] if lat else None,
        "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
        "committed": committed,
        "middle_written": visible["read_uncommitted"],
        "middle_committed": visible["read_committed"],
        "fenced": fenced,
    }


def count_topic(boot: str, topic: str, isolation: str, quiet_s: float = 3.0) -> int:
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": f"bench-eos-count-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    c.subscribe([topic])
    n, last = 0, time.monotonic()
    deadline = last + 30
    while time.monotonic() - last < quiet_s and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            n, last = n + 1, time.monotonic()
    c.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rate", type=float, default=200.0, help="records/s sent")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--wait", type=float, default=75.0, help="seconds to wait for the last")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("--app-id", "--guarantee", "--source", "--middle", "--seen", "--bootstrap"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    ap.add_argument("--rekey", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    boot = os.environ.get("STEPLENS_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    print(
        f"{args.runs} runs x {args.ranks} ranks, {args.rate:g} records/s for {args.seconds:g} s "
        f"through hop -> count, waiting up to {args.wait:g} s for the last"
    )
    rows = []
    with scratch_topics(boot):
        for rekey in (True, False):
            for guarantee in ("at_least_once", "exactly_once"):
                r = one_case(boot, guarantee, rekey, args)
                rows.append(r)
                lat = (
                    f"p50 {r['p50']:.2f} s, p99 {r['p99']:.2f} s"
                    if r["reached"]
                    else "no record arrived"
                )
                print(
                    f"  {r['hop']:<8} {guarantee:<14} reached {r['reached']:>5} of {r['sent']}, "
                    f"{lat}; source offsets committed {r['committed']}; middle messages "
                    f"{r['middle_committed']} committed of {r['middle_written']} written"
                    f"{'; the producer was fenced' if r['fenced'] else ''}"
                )
    for hop in ("rekeyed", "same key"):
        a, e = (r for r in rows if r["hop"] == hop)
        if a["reached"] and e["reached"] and a["p99"]:
            print(
                f"  {hop}: exactly_once reached {e['reached'] / a['reached']:.2f}x the records, "
                f"p99 {e['p99'] / a['p99']:.2f}x at_least_once's"
            )
        else:
            print(
                f"  {hop}: exactly_once reached {e['reached']} records, "
                f"at_least_once {a['reached']}"
            )


if __name__ == "__main__":
    main()
