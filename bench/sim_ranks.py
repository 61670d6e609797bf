"""Simulated ranks of one large run, sent through the producer's own code.

Each simulated rank is what a ``Monitor`` builds in its worker thread, without the thread:
its ``Identity`` (host ``node-<n>``, 8 ranks a node), a ``Pipeline`` (its ``StepStage``
windows, samples and guards the steps, or batches them at full resolution; its
``emit_health`` sends the health record) and a ``Sender`` (envelope, ``seq``, the schema's
codec). The ranks of one process share one ``Delivery`` (spool) over one Kafka producer
(``transport.kafka_transport``, wrapped to count records and bytes). Hardware samples go
through ``HardwareSampler.sample_once`` with a simulated NVML and host (local rank 0: the
host and its 8 GPUs; every rank: its allocator's figures), and ``comm`` records as
``watch()`` sends a DDP all-reduce's timing (one step in ``comm_every``).

Time is real: step ``k`` of every rank is logged at ``t0 + k * step_s`` (the worker's
hang and idle checks read wall time). Faults (``plan``) start at known steps; their onset
times (the time of the first record that shows each: a throttled GPU's first throttled
sample, not its heating before) are written to ``--plan-out`` by the process that injects
them.

With ``--start-at-ns`` the ranks' records are made first, all of them, through the same code
on a clock that starts at that wall time (in the future), and kept in memory; then step
``k``'s records are handed to the Kafka producer, through a ``Delivery`` as a rank's are, at
``start + k * step_s``. The ranks' own CPU (the producer's code of thousands of processes on
thousands of nodes) then stays off the machine whose stack is measured while it is.

    python bench/sim_ranks.py --ranks 1024 --first 0 --last 1023 --steps 240 --run-id R
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from steplens.producer import checks
from steplens.producer.config import ProducerConfig
from steplens.producer.delivery.live_or_spool import Delivery
from steplens.producer.delivery.spool import Spool
from steplens.producer.delivery.transport import (
    MemoryTransport,
    OnResult,
    Transport,
    kafka_transport,
)
from steplens.producer.identity import Identity
from steplens.producer.instruments.allocator import merge
from steplens.producer.instruments.ddp_comm import comm_offset, timed
from steplens.producer.instruments.hardware import HardwareSampler
from steplens.producer.instruments.report_cadence import allocator_cadence
from steplens.producer.pipeline.items import StepItem
from steplens.producer.pipeline.sender import Sender
from steplens.producer.pipeline.worker import Pipeline

GPUS_PER_NODE = 8
HBM = 80 << 30
HW_THERMAL = (1 << 5) | (1 << 6)  # SW and HW thermal slowdown (schema.THROTTLE_REASONS)


def host_of(rank: int) -> str:
    return f"node-{rank // GPUS_PER_NODE:05d}"


@dataclass
class Fault:
    kind: str
    first_step: int
    last_step: int
    rank: int  # the rank it shows on (hardware faults: the local rank 0 that samples the node)
    host: str
    gpu: int | None = None  # the GPU index on ``host``
    ranks: tuple[int, ...] = ()  # every rank it touches (a node: its 8; run-wide: empty = all)


def plan(world: int, steps: int, seed: int = 7) -> list[Fault]:
    """Six faults over the second half of the run, 30 steps apart or more (beyond the
    incidents' join gap of 20 steps), on ranks, nodes and GPUs spread over the world."""
    rng = random.Random(seed)
    nodes = world // GPUS_PER_NODE
    picks = rng.sample(range(nodes), 4) if nodes >= 4 else [0, 0, 0, 0]

    def at(frac: float) -> int:
        return int(steps * frac)

    straggler = rng.randrange(world)
    nan_rank = rng.randrange(world)
    ecc_node, hot_node, net_node = picks[0], picks[1], picks[2]
    ecc_gpu, hot_gpu = rng.randrange(GPUS_PER_NODE), rng.randrange(GPUS_PER_NODE)
    node_ranks = tuple(range(net_node * GPUS_PER_NODE, (net_node + 1) * GPUS_PER_NODE))
    span = max(30, steps // 6)
    return [
        Fault("straggler", at(0.30), at(0.30) + span, straggler, host_of(straggler), None,
              (straggler,)),
        Fault("gpu_ecc_xid", at(0.40), steps, ecc_node * 8, host_of(ecc_node * 8), ecc_gpu,
              (ecc_node * 8 + ecc_gpu,)),
        Fault("gpu_thermal", at(0.52), steps, hot_node * 8, host_of(hot_node * 8), hot_gpu,
              (hot_node * 8 + hot_gpu,)),
        Fault("node_network", at(0.64), at(0.64) + span, net_node * 8, host_of(net_node * 8),
              None, node_ranks),
        Fault("nonfinite_loss", at(0.76), at(0.76) + 4, nan_rank, host_of(nan_rank), None,
              (nan_rank,)),
        Fault("loss_spike", at(0.88), at(0.88) + 1, 0, "*", None, ()),
    ]  # fmt: skip


class CountingTransport:
    """The producer's Kafka transport, counting what it is handed (records, bytes) by the
    label the simulator sets before each call."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.label = "other"
        self.records: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    def produce(
        self, key: bytes, value: bytes, on_result: OnResult, topic: str | None = None
    ) -> bool:
        ok = self.inner.produce(key, value, on_result, topic)
        if ok:
            label = self.label
            self.records[label] = self.records.get(label, 0) + 1
            self.bytes[label] = self.bytes.get(label, 0) + len(key) + len(value)
        return ok

    def poll(self, timeout_s: float = 0.0) -> None:
        self.inner.poll(timeout_s)

    def flush(self, timeout_s: float) -> int:
        return self.inner.flush(timeout_s)

    def take_down_signal(self) -> bool:
        return self.inner.take_down_signal()

    def reachable(self, timeout_s: float) -> bool:
        return self.inner.reachable(timeout_s)

    def purge_queued(self) -> None:
        self.inner.purge_queued()

    def abandon(self, timeout_s: float) -> None:
        self.inner.abandon(timeout_s)

    def close(self, timeout_s: float) -> None:
        self.inner.close(timeout_s)


class SimGpus:
    """What ``GpuSampler.sample`` reads from NVML on one node, simulated (``status`` ok)."""

    status = "ok"

    def __init__(self, node: int, rng: random.Random) -> None:
        self.node, self.rng = node, rng
        self.temp = [rng.uniform(58, 68) for _ in range(GPUS_PER_NODE)]
        self.ecc = [0] * GPUS_PER_NODE
        self.xid = [0] * GPUS_PER_NODE
        self.xid_last: dict[int, int] = {}
        self.energy = [rng.uniform(1e6, 2e6) for _ in range(GPUS_PER_NODE)]
        self.hot: int | None = None  # the GPU that overheats now

    def sample(self, slow: bool = False) -> list[dict[str, Any]]:
        rng, out = self.rng, []
        for i in range(GPUS_PER_NODE):
            hot = i == self.hot
            target = 92.0 if hot else 64.0
            self.temp[i] += 0.25 * (target - self.temp[i]) + rng.gauss(0, 0.3)
            power = rng.uniform(560, 690) * (0.7 if hot else 1.0)
            self.energy[i] += power
            g: dict[str, Any] = {
                "index": i,
                "uuid": f"GPU-{self.node:05d}-{i}",
                "name": "NVIDIA H100 80GB HBM3",
                "mem_used_bytes": int(71e9 + rng.uniform(0, 1e8)),
                "mem_total_bytes": HBM,
                "util_gpu": float(rng.choice((97, 98, 99, 100))),
                "util_mem": float(rng.randint(35, 45)),
                "mem_bw_util": float(rng.randint(35, 45)),
                "mem_bw_source": "util",
                "power_w": power,
                "temp_c": float(round(self.temp[i])),
                "sm_clock_mhz": 1290.0 if hot and self.temp[i] > 85 else 1980.0,
                "throttle_reasons": HW_THERMAL if hot and self.temp[i] > 85 else 0,
                "ecc_corrected": 0,
                "ecc_uncorrected": self.ecc[i],
                "xid_count": self.xid[i],
            }
            if i in self.xid_last:
                g["xid_last"] = self.xid_last[i]
            if slow:
                g["pcie_tx_mb_s"] = rng.uniform(9000, 12000)
                g["pcie_rx_mb_s"] = rng.uniform(9000, 12000)
                g["energy_j"] = self.energy[i]
            out.append(g)
        return out


class SimHost:
    """What ``HostSampler.sample`` reads from /proc on one node, simulated."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.net_down = False

    def sample(self, now: float) -> dict[str, Any]:
        rng = self.rng
        ib = 0.05 if self.net_down else 1
        return {
            "mem_available_bytes": int(1.6e12 + rng.uniform(0, 1e10)),
            "mem_total_bytes": int(2.0e12),
            "cpu_percent": rng.uniform(20, 35),
            "disks": [
                {"device": "nvme0n1", "read_mb_s": rng.uniform(50, 90),
                 "write_mb_s": rng.uniform(0, 5), "io_latency_ms": rng.uniform(0.1, 0.4)},
            ],
            "nets": [
                {"iface": f"ib{j}", "rx_mb_s": ib * rng.uniform(20000, 24000),
                 "tx_mb_s": ib * rng.uniform(20000, 24000)}
                for j in range(4)
            ],
        }  # fmt: skip


class SimRank:
    """One rank: the producer's per-rank stages, and the rank's own behaviour."""

    def __init__(
        self, ident: Identity, config: ProducerConfig, delivery: Delivery, rng: random.Random
    ) -> None:
        self.ident = ident
        self.sender = Sender(ident, os.getpid(), delivery, time.time_ns() - time.monotonic_ns())
        # the Monitor's pipeline, driven here instead of by its thread (never started)
        self.pipeline = Pipeline(
            config, _NoQueue(), self.sender, threading.Event(), memory=self.process_memory
        )
        self.rng = rng
        self.rss = rng.uniform(40e9, 60e9)  # its process's resident memory
        self.speed = rng.uniform(0.97, 1.03)  # this rank's own pace
        self.offset = rng.gauss(0, 0.01)  # its loss offset (its own data)
        meta = config.run_meta(ident)
        meta["checks"] = checks.design_checks(config, ident)
        self.meta = meta
        self.sampler: HardwareSampler | None = None
        # the other ranks' reports
        self.cadence = allocator_cadence(config.hw_allocator_every_s, ident.phase)
        self.comm_offset = comm_offset(config.comm_every, ident.phase)  # its timed all-reduce
        if ident.local_rank == 0:
            node = ident.rank // GPUS_PER_NODE
            self.sampler = HardwareSampler(
                lambda _d: None,
                config.hw_interval_s,
                config.hw_slow_every,
                gpu=SimGpus(node, rng),  # type: ignore[arg-type]
                host=SimHost(rng),  # type: ignore[arg-type]
                host_wide=True,
                report_every_s=config.hw_report_every_s,
                phase=ident.phase,
            )

    def process_memory(self) -> dict[str, int]:
        """What ``process_memory`` reads from /proc for this rank's process, simulated."""
        rng = self.rng
        return {
            "rss_bytes": int(self.rss + rng.uniform(0, 1e8)),
            "mem_available_bytes": int(1.6e12 + rng.uniform(0, 1e10)),
            "mem_total_bytes": int(2.0e12),
        }


class _NoQueue:
    """The caller's queue a Pipeline expects; the simulator hands it steps directly."""

    def __len__(self) -> int:
        return 0


@dataclass
class Counts:
    records: dict[str, int]
    bytes: dict[str, int]
    steps: int
    seconds: float
    behind_s_max: float  # how late the simulator ran its steps at worst
    delivery_sent: int
    delivery_spooled: int
    made_cpu_s: float = 0.0  # CPU seconds making the records ahead of time (``--start-at-ns``)


class Fleet:
    """Ranks ``first..last`` of a run of ``world``, in this process."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.faults = plan(args.ranks, args.steps, args.seed)
        self.config = ProducerConfig.resolve(
            kafka_bootstrap=args.bootstrap,
            topic=args.topic,
            full_resolution=args.full_resolution,
            **({} if args.comm_every is None else {"comm_every": args.comm_every}),
            spool_dir=tempfile.mkdtemp(prefix="sim-spool-"),
        )
        self.rank0 = Identity(args.run_id, args.first, 0, args.ranks, host_of(args.first))
        self.recorded = args.start_at_ns is not None
        inner: Transport = (
            MemoryTransport()
            if args.bootstrap == "memory" or self.recorded
            else kafka_transport(self.config, self.rank0)
        )
        self.tx = CountingTransport(inner)
        # made ahead: step k's messages (the last entry: those made after the last step)
        self.tape: list[list[tuple[bytes, bytes]]] = []
        spool = Spool(
            os.path.join(self.config.spool_dir, f"ranks{args.first}-{args.last}"),
            self.config.spool_max_bytes,
        )
        self.delivery = Delivery(lambda: self.tx, spool)
        self.ranks: list[SimRank] = []
        for r in range(args.first, args.last + 1):
            ident = Identity(args.run_id, r, r % GPUS_PER_NODE, args.ranks, host_of(r))
            self.ranks.append(SimRank(ident, self.config, self.delivery, random.Random(r)))
        self.onsets: dict[str, int] = {}
        self.onset_steps: dict[str, int] = {}  # each fault's onset step here
        self.late_s: list[float] = []  # how late each step's records were handed over
        self.k = 0  # the step being logged
        self.wall_offset_ns = time.time_ns() - time.monotonic_ns()
        self.t0_ns = time.monotonic_ns()
        if self.recorded:  # the clock starts then
            self.t0_ns = args.start_at_ns - self.wall_offset_ns

    @property
    def simulated(self) -> bool:
        a = self.args
        return self.recorded or not (a.pace_s is None or a.pace_s == a.step_s)

    def now_ns(self) -> int:
        """The ranks' monotonic clock: real, or simulated when paced faster than real time or
        made ahead of time."""
        if not self.simulated:
            return time.monotonic_ns()
        return self.t0_ns + int(self.k * self.args.step_s * 1e9)

    def _active(self, kind: str, step: int) -> Fault | None:
        for f in self.faults:
            if f.kind == kind and f.first_step <= step <= f.last_step:
                return f
        return None

    def _onset(self, fault: Fault) -> None:
        if fault.kind not in self.onsets:
            self.onset_steps[fault.kind] = self.k
            self.onsets[fault.kind] = (
                self.now_ns() + self.wall_offset_ns if self.simulated else time.time_ns()
            )

    def _mine(self, fault: Fault) -> bool:
        return self.args.first <= fault.rank <= self.args.last

    def step(self, k: int) -> None:
        a, tx = self.args, self.tx
        base_loss = 2.2 + 1.2 * math.exp(-k / 400.0)
        spike = self._active("loss_spike", k)
        straggler = self._active("straggler", k)
        net = self._active("node_network", k)
        nan = self._active("nonfinite_loss", k)
        thermal = self._active("gpu_thermal", k)
        now_ns = self.now_ns()
        tx.label = "steps"
        for sr in self.ranks:
            rng, r = sr.rng, sr.ident.rank
            loss = base_loss + sr.offset + rng.gauss(0, 0.015)
            grad = 0.9 + rng.gauss(0, 0.04)
            step_time = a.step_s * sr.speed * (1 + abs(rng.gauss(0, 0.02)))
            if spike is not None:
                loss *= 3.0
                grad *= 6.0
                self._onset(spike) if self._mine(spike) else None
            if straggler is not None and r == straggler.rank:
                step_time *= 1.8
                self._onset(straggler)
            if net is not None and r in net.ranks:
                step_time *= 2.2
                self._onset(net) if r == net.rank else None
            if thermal is not None and r in thermal.ranks:
                step_time *= 1.15  # the throttled GPU's rank is a little slower
            if nan is not None and r == nan.rank:
                loss = math.nan
                self._onset(nan)
            scalars = {"step_time_s": step_time}
            item = StepItem(k, now_ns, loss, 3e-4, grad, 32768, scalars, None, None)
            sr.pipeline.steps.add(item)
        if every := self.config.comm_every:
            tx.label = "comm"
            for sr in self.ranks:
                if not timed(k + 1, every, sr.comm_offset):
                    continue
                slow = net is not None and sr.ident.rank in net.ranks
                lat = (800.0 if slow else 18.0) * (1 + abs(sr.rng.gauss(0, 0.1)))
                data = {"op": "ddp_all_reduce", "latency_ms": lat, "bytes": 25 << 20,
                        "backend": "nccl"}  # fmt: skip
                sr.sender.send("comm", None, now_ns, data)

    def hardware(self, k: int, sample_no: int) -> None:
        """One hardware sample of every rank: the node's on local rank 0, each rank's
        allocator figures (what ``AllocatorReader`` reads) merged in, or alone, each sent when
        due (``report_cadence``)."""
        self.tx.label = "hw"
        ecc = self._active("gpu_ecc_xid", k)
        thermal = self._active("gpu_thermal", k)
        net = self._active("node_network", k)
        now_ns = self.now_ns()
        node_sampler: HardwareSampler | None = None
        for sr in self.ranks:
            lr = sr.ident.local_rank
            own = {
                "index": lr,
                "uuid": f"GPU-{sr.ident.rank // GPUS_PER_NODE:05d}-{lr}",
                "torch_allocated_bytes": int(52e9 + sr.rng.uniform(0, 5e8)),
                "torch_reserved_bytes": int(68e9),
                "torch_peak_bytes": int(66e9),
                "torch_alloc_retries": 0,
                "torch_ooms": 0,
                "torch_limit_bytes": int(77e9),
            }
            if sr.sampler is not None:
                node_sampler = sr.sampler
                gpus: SimGpus = node_sampler.gpu  # type: ignore[assignment]
                host: SimHost = node_sampler.host  # type: ignore[assignment]
                host_name = sr.ident.host
                ecc_here = ecc is not None and ecc.host == host_name and ecc.gpu is not None
                if ecc_here and gpus.xid[ecc.gpu] == 0:  # type: ignore[union-attr]  # once
                    gpus.xid[ecc.gpu], gpus.xid_last[ecc.gpu] = 1, 48  # type: ignore[union-attr]
                    gpus.ecc[ecc.gpu] = 2  # type: ignore[union-attr]  # a double-bit ECC error
                    self._onset(ecc)  # type: ignore[arg-type]
                gpus.hot = (
                    thermal.gpu if thermal is not None and thermal.host == host_name else None
                )
                host.net_down = net is not None and net.host == host_name
                data = node_sampler.sample_once()
                if gpus.hot is not None and any(
                    g.get("throttle_reasons") for g in data["gpus"] if g["index"] == gpus.hot
                ):  # the fault's first record: its first throttled sample, not the heating
                    self._onset(thermal)  # type: ignore[arg-type]
                data["gpus"] = merge(data["gpus"], [own])
                if node_sampler.due(data, now_ns / 1e9):
                    sr.sender.send("hw", None, now_ns, data)
            elif sr.cadence.due(alone := {"gpus": [own]}, now_ns / 1e9):
                sr.sender.send("hw", None, now_ns, alone)

    def health(self) -> None:
        self.tx.label = "health"
        now_ns = self.now_ns()
        for sr in self.ranks:
            sr.pipeline.emit_health(now_ns)

    def run(self) -> Counts:
        a, cfg = self.args, self.config
        self.tx.label = "run_meta"
        now_ns = self.now_ns()
        for sr in self.ranks:
            sr.sender.send("run_meta", None, now_ns, sr.meta)
        t0 = time.monotonic() + 1.0
        hw_every = max(1, round(cfg.hw_interval_s / a.step_s))
        health_every = max(1, round(cfg.health_interval_s / a.step_s))
        samples = 0
        pace = 0.0 if self.recorded else a.step_s if a.pace_s is None else a.pace_s
        for k in range(a.steps):
            self.k = k
            due = t0 + k * pace
            while (wait := due - time.monotonic()) > 0:
                self.delivery.service()
                time.sleep(min(wait, 0.05))
            self.late_s.append(time.monotonic() - due)
            self.step(k)
            if k % hw_every == 0:
                self.hardware(k, samples)
                samples += 1
            if k % health_every == 0:
                self.health()
            self.tx.label = "steps"
            now_ns = self.now_ns()
            for sr in self.ranks:
                sr.pipeline.steps.emit_due(now_ns)
            self.delivery.service()
            self._record()
        self.tx.label = "steps"
        self.k = a.steps
        behind = max(self.late_s, default=0.0)
        now_ns = self.now_ns()
        for sr in self.ranks:
            sr.pipeline.steps.emit_all(now_ns)
        left = self.delivery.close(30.0)
        if left:
            print(f"sim: {left} records not delivered", file=sys.stderr)
        delivery, made_cpu_s = self.delivery, 0.0
        if self.recorded:
            self._record()
            made_s, made_cpu_s = time.monotonic() - t0 + 1.0, time.process_time()
            t0, behind, delivery = self.replay()
            print(
                f"sim: made in {made_s:.0f} s, sent {behind:.1f} s late at worst", file=sys.stderr
            )
        return Counts(
            dict(self.tx.records),
            dict(self.tx.bytes),
            a.steps * len(self.ranks),
            time.monotonic() - t0,
            behind,
            delivery.sent,
            delivery.spooled,
            made_cpu_s,
        )

    def _record(self) -> None:
        """Made ahead: the messages the Delivery handed over since the last call, as the
        next step's."""
        if self.recorded and isinstance(self.tx.inner, MemoryTransport):
            self.tape.append(self.tx.inner.messages)
            self.tx.inner.messages = []

    def replay(self) -> tuple[float, float, Delivery]:
        """The records made ahead of time, step ``k``'s at ``start + k * step_s``, through a
        ``Delivery`` over the Kafka producer: (the monotonic start, how late at worst, it)."""
        a = self.args
        tx = kafka_transport(self.config, self.rank0)
        spool = Spool(
            os.path.join(self.config.spool_dir, f"replay{a.first}-{a.last}"),
            self.config.spool_max_bytes,
        )
        delivery = Delivery(lambda: tx, spool)
        start = (a.start_at_ns - time.time_ns()) / 1e9 + time.monotonic()
        if start < time.monotonic():
            print(f"sim: made {time.monotonic() - start:.1f} s after the start", file=sys.stderr)
        self.late_s = [0.0] * len(self.tape)
        for k, messages in enumerate(self.tape):
            due = start + k * a.step_s
            while (wait := due - time.monotonic()) > 0:
                delivery.service()
                time.sleep(min(wait, 0.05))
            self.late_s[k] = time.monotonic() - due
            for key, value in messages:
                delivery.send(key, value)
            delivery.service()
        left = delivery.close(30.0)
        if left:
            print(f"sim: {left} records not delivered", file=sys.stderr)
        return start, max(self.late_s, default=0.0), delivery


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, required=True, help="world size")
    p.add_argument("--first", type=int, default=0, help="first rank simulated here")
    p.add_argument("--last", type=int, default=None, help="last rank simulated here")
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--step-s", type=float, default=1.0, help="seconds a step takes (1-10)")
    p.add_argument(
        "--pace-s", type=float, default=None, help="real seconds a step takes (default: step-s)"
    )
    p.add_argument("--run-id", required=True)
    p.add_argument("--seed", type=int, default=7, help="the fault plan's")
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("STEPLENS_KAFKA_BOOTSTRAP"),
        help="Kafka; `memory`: a MemoryTransport (bench_rank_state.py)",
    )
    p.add_argument("--topic", default=os.environ.get("STEPLENS_TOPIC_RAW", "steplens.raw"))
    p.add_argument("--full-resolution", action="store_true", help="every step, in batches")
    p.add_argument(
        "--comm-every",
        type=int,
        default=None,
        help="a comm record every N steps (default: the producer's, 100)",
    )
    p.add_argument("--out", default=None, help="counts and fault onsets as JSON")
    p.add_argument(
        "--start-at-ns",
        type=int,
        default=None,
        help="make every record first, on a clock that starts at this wall time (ns, in the "
        "future), then send step k's at start + k * step-s",
    )
    args = p.parse_args(argv)
    if args.last is None:
        args.last = args.ranks - 1
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    fleet = Fleet(args)
    counts = fleet.run()
    sent_late = {kind: fleet.late_s[k] for kind, k in fleet.onset_steps.items()
                 if k < len(fleet.late_s)}  # fmt: skip
    out = {"counts": asdict(counts), "onsets": fleet.onsets, "onsets_sent_late_s": sent_late,
           "faults": [asdict(f) for f in fleet.faults]}  # fmt: skip
    text = json.dumps(out)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
