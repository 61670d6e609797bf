"""Apache Kafka 4.x in KRaft mode, one node acting as broker and controller."""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import time
import uuid

from steplens.stack.config import KAFKA_VERSION
from steplens.stack.errors import StackError
from steplens.stack.install import KAFKA_ARTIFACTS, ensure_jars, kafka_libs, require_tool
from steplens.stack.private_files import UMASK, open_private, private_dir, write_private
from steplens.stack.services.base import Progress, Service

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = warn
logger.request.name = kafka.request.logger
logger.request.level = warn
"""


def kafka_uuid() -> str:
    """A cluster id in Kafka's form: 16 random bytes, URL-safe base64, unpadded, not '-' first."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class Kafka(Service):
    name = "kafka"
    version = KAFKA_VERSION
    port_names = ("kafka", "kafka_controller")

    def install(self, progress: Progress) -> None:
        require_tool("java", "install Java 17 (apt-get install openjdk-17-jre-headless)")
        ensure_jars(self.cfg, "kafka", kafka_libs(self.cfg), KAFKA_ARTIFACTS, progress)

    @property
    def properties(self) -> str:
        host, port, ctrl = self.cfg.host, self.port(), self.port("kafka_controller")
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{host}:{ctrl}",
            "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{ctrl}",
            "advertised.listeners": f"PLAINTEXT://{host}:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.dir / "data"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "log.retention.hours": "168",
        }
        return "".join(f"{k}={v}\n" for k, v in settings.items())

    def _java(self) -> list[str]:
        return [
            "java",
            "-Xms128m",
            # the JVM's memory ceilings: heap, direct buffers, class metadata; past one it exits
            "-Xmx512m",
            "-XX:MaxDirectMemorySize=256m",
            "-XX:MaxMetaspaceSize=256m",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            # C1 only: about half the start time on 2 busy cores, ample speed for a local stack.
            "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile=file:{self.dir}/log4j2.properties",
            f"-Dkafka.logs.dir={self.dir}/",
            *os.environ.get("STEPLENS_KAFKA_JAVA_OPTS", "").split(),  # later flags win
            "-cp",
            f"{kafka_libs(self.cfg)}/*",
        ]

    def prepare(self, progress: Progress) -> None:
        self.private_dir("data")
        write_private(self.dir / "server.properties", self.properties)
        write_private(self.dir / "log4j2.properties", LOG4J2)
        if (self.dir / "data" / "meta.properties").exists():
            return
        progress("[kafka] formatting the KRaft storage")
        # A cluster id is chosen once; the storage keeps it (formatting is skipped later).
        log = self.cfg.log_path(self.name)
        private_dir(log.parent)
        argv = [*self._java(), "kafka.tools.StorageTool", "format", "-t", kafka_uuid()]
        argv += ["-c", str(self.dir / "server.properties"), "--ignore-formatted"]
        with open_private(log, "ab") as out, contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, timeout=120, check=False, umask=UMASK
            )
        if not (self.dir / "data" / "meta.properties").exists():
            raise StackError(f"kafka: formatting the storage failed; see {log}")

    def argv(self) -> list[str]:
        return [*self._java(), "kafka.Kafka", str(self.dir / "server.properties")]

    def probe(self) -> str | None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        from steplens.schema.kafka_config import admin_config

        admin = AdminClient(admin_config(self.address, extra={"log_level": 0}))
        try:
            meta = admin.list_topics(timeout=2)
        except KafkaException as exc:
            return f"no metadata from {self.address} ({exc.args[0].str() if exc.args else exc})"
        if not meta.brokers:
            return "no broker registered yet"
        return None

    def configure(self, progress: Progress) -> None:
        from confluent_kafka import KafkaException

        from steplens.schema.topics import Topics, ensure_topics

        deadline = time.monotonic() + 60
        while True:
            try:
                created = ensure_topics(self.address, Topics.from_env(), timeout_s=10)
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        if created:
            progress(f"[kafka] created topics: {', '.join(sorted(created))}")

    def env(self) -> dict[str, str]:
        return {"STEPLENS_KAFKA_BOOTSTRAP": self.address}
